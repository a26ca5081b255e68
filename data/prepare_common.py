"""
Shared by data/*/prepare.py: get the text (download, or --input for a local copy), split 90/10, write
train.bin / val.bin (uint16 token ids) and meta.pkl. Writes are atomic: a failed run leaves nothing half-written.

The special tokens every objective needs are defined here, once, and recorded in meta.pkl; the rest of the code
reads them from there.
"""
import os
import pickle
import sys
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo root
import infra.quiet_interrupts  # noqa: E402,F401  (before numpy and torch: a Ctrl-C while they load ends quietly)

import numpy as np  # noqa: E402

from infra.configurator import UserError, apply_overrides, read_text_file, run_main  # noqa: E402,F401
from infra.dataset import written_here  # noqa: E402

TINY_SHAKESPEARE_URL = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
NUM_SENTINELS = 100  # as T5 (extra_ids=100)
# [PAD] also starts t5's decoder; [NLU]/[NLG]/[S2S] are UL2's mode tokens for its R/X/S denoisers
SPECIAL_TOKENS = ["[PAD]", "[EOS]", "[MASK]", "[NLU]", "[NLG]", "[S2S]"] + [f"<S{i}>" for i in range(NUM_SENTINELS)]


def parse_args(argv, **defaults):
    return apply_overrides({"input": "", **defaults}, argv)


def read_text(input_path, dataset_dir):
    if input_path:  # missing, a folder, a pipe, not UTF-8: each said as such
        return read_text_file(input_path, "--input", "point it at a copy of Tiny Shakespeare's input.txt")
    cached = os.path.join(dataset_dir, "input.txt")
    if not os.path.exists(cached):
        try:
            with urllib.request.urlopen(TINY_SHAKESPEARE_URL, timeout=30) as response:
                text = response.read().decode("utf-8")
        except OSError as e:
            raise UserError(f"could not download Tiny Shakespeare ({e.__class__.__name__}); offline, run "
                            f"python {os.path.relpath(dataset_dir)}/prepare.py --input=/path/to/input.txt") from None
        with open(cached + ".tmp", "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(cached + ".tmp", cached)
    with open(cached, encoding="utf-8") as f:
        return f.read()


def encode_with_progress(text, encode, chunk=1_000_000):
    """encode(text) chunk by chunk, with a progress line every ~10 s for a big text. A chunk ends just before a
    newline that follows a non-space character: GPT-2's pre-tokenizer never joins across such a cut (a run of
    newlines stays whole in the next chunk), so the ids equal those of encode(text) (tests/test_errors.py)."""
    from infra.progress import Progress
    progress = Progress("encoding, characters", len(text))
    ids, start = [], 0
    while start < len(text):
        end = min(len(text), start + chunk)
        while end < len(text) and not (text[end] == "\n" and not text[end - 1].isspace()):
            end += 1
        ids.extend(encode(text[start:end]))
        start = end
        progress.update(start)
    return ids


def special_token_ids(num_ordinary):
    return {name: num_ordinary + i for i, name in enumerate(SPECIAL_TOKENS)}


def unchanged(dataset_dir, parts, meta):
    """Whether dataset_dir already holds exactly these token files (name, bytes) and this meta."""
    try:
        for name, data in list(parts) + [("meta.pkl", pickle.dumps(meta))]:
            if os.path.getsize(os.path.join(dataset_dir, name)) != len(data):
                return False
            with open(os.path.join(dataset_dir, name), "rb") as f:
                if f.read() != data:
                    return False
    except OSError:
        return False
    return True


def write_files(dataset_dir, parts, meta):
    """train.bin, val.bin and meta.pkl, whole or not at all."""
    names = ("train.bin", "val.bin", "meta.pkl")
    try:
        for name, part in parts:
            part.tofile(os.path.join(dataset_dir, name + ".tmp"))
        with open(os.path.join(dataset_dir, "meta.pkl.tmp"), "wb") as f:
            pickle.dump(meta, f)
    except BaseException as e:  # a full disk, a read-only folder, Ctrl-C or SIGTERM: nothing half-written left
        for name in names:
            if os.path.exists(os.path.join(dataset_dir, name + ".tmp")):
                os.remove(os.path.join(dataset_dir, name + ".tmp"))
        if isinstance(e, OSError):
            raise UserError(f"cannot write the dataset into {dataset_dir} ({e.strerror or e}): nothing written; free "
                            f"space or choose a writable folder") from None
        raise
    for name in names:  # meta last: its presence means "prepared"
        os.replace(os.path.join(dataset_dir, name + ".tmp"), os.path.join(dataset_dir, name))
        written_here(os.path.join(dataset_dir, name))


def write_dataset(dataset_dir, ids, meta, train_tokens=None):
    """ids: all token ids of the text; the first train_tokens of them (default 90%) train, the rest val. meta gets
    our special tokens added after the text tokens, unless it brings its own (a published tokenizer's:
    pretrained.dataset_meta)."""
    if len(ids) < 100:
        raise UserError(f"the text has only {len(ids)} tokens: too little to split into train and val")
    if "specials" not in meta:
        meta = dict(meta, specials=special_token_ids(meta["num_ordinary"]), num_sentinels=NUM_SENTINELS,
                    vocab_size=meta["num_ordinary"] + len(SPECIAL_TOKENS))
    if meta["vocab_size"] > 2 ** 16:  # train.bin / val.bin store uint16 ids
        raise UserError(f"the vocabulary ({meta['num_ordinary']:,} distinct tokens + {len(SPECIAL_TOKENS)} special) "
                        f"does not fit uint16 storage (at most {2 ** 16 - len(SPECIAL_TOKENS):,} distinct tokens): "
                        f"use a text with fewer distinct characters, or a BPE dataset")
    ids = np.asarray(ids, dtype=np.uint16)
    n = int(0.9 * len(ids)) if train_tokens is None else train_tokens
    meta.update(train_tokens=n, val_tokens=len(ids) - n)  # lets train.py spot a truncated .bin
    parts = (("train.bin", ids[:n]), ("val.bin", ids[n:]))
    if not unchanged(dataset_dir, ((name, part.tobytes()) for name, part in parts), meta):
        write_files(dataset_dir, parts, meta)  # the same again is left as it is: a run reading it goes on
    vocabulary = f"{meta['tokenizer']}'s" if "tokenizer_family" in meta else \
        f"{meta['num_ordinary']} text + {meta['vocab_size'] - meta['num_ordinary']} special: [PAD] [EOS] [MASK], " \
        f"UL2's 3 mode tokens, {NUM_SENTINELS} span sentinels <S0>..<S{NUM_SENTINELS - 1}>"
    print(f"{dataset_dir}: {n:,} train and {len(ids) - n:,} val tokens, vocabulary {meta['vocab_size']} ({vocabulary})")
