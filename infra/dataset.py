"""
Reading a prepared dataset: a folder with train.bin / val.bin (uint16 token ids) and meta.pkl, written by
data/<name>/prepare.py (which runs on first use). Training reads random windows of block_size + 1 tokens, as
nanoGPT does; every objective makes its batch from such windows (objectives.py).
"""
import hashlib
import os
import pickle
import subprocess
import sys

import numpy as np
import torch

from infra.configurator import UserError

DATA_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data")  # the repository's data/
META_KEYS = ("tokenizer", "vocab_size", "num_ordinary", "specials", "num_sentinels")  # what prepare_common writes


def load_dataset(name, block_size, prepare_if_missing):
    """name: a folder of data/ (prepared on first use) or a path to any folder with train.bin, val.bin, meta.pkl.
    Returns ({"train": path, "val": path}, meta); every problem is a UserError that says how to fix it."""
    if name.strip(" ./") == "":  # "", ".", "./": data/ itself is no dataset
        raise UserError(f"--dataset={name!r} names no dataset: choose a folder of data/ (shakespeare_char) or a path")
    folder = name if os.sep in name else os.path.join(DATA_DIR, name)
    if not os.path.isdir(folder):
        known = sorted(d for d in os.listdir(DATA_DIR) if os.path.isfile(os.path.join(DATA_DIR, d, "prepare.py")))
        raise UserError(f"unknown --dataset={name}: choose one of {', '.join(known)} (folders of data/), or make a "
                        f"published model's with python data/shakespeare/prepare.py --tokenizer=<its name>")
    meta_path = os.path.join(folder, "meta.pkl")
    prepare_script = os.path.join(folder, "prepare.py")
    if not os.path.exists(meta_path) and prepare_if_missing and os.path.exists(prepare_script):
        print(f"dataset {name} is not prepared yet: running data/{name}/prepare.py", flush=True)
        result = subprocess.run([sys.executable, prepare_script], capture_output=True, text=True)
        if result.returncode != 0:  # pass its one-line error on as ours
            message = (result.stderr.strip().splitlines() or ["failed"])[-1].split("error: ", 1)[-1]
            raise UserError(message)
        print(result.stdout.strip())
    if not os.path.exists(meta_path):
        raise UserError(f"{meta_path} is missing: prepare the dataset first (python data/<name>/prepare.py)")
    try:
        with open(meta_path, "rb") as f:
            meta = pickle.load(f)
    except Exception as e:
        raise UserError(f"{meta_path} is unreadable ({type(e).__name__}): prepare the dataset again") from None
    missing = [k for k in META_KEYS if not isinstance(meta, dict) or k not in meta]
    if missing:
        raise UserError(f"{meta_path} is not a meta.pkl of this project (no {', '.join(missing)}): prepare the "
                        f"dataset again (python data/<name>/prepare.py)")
    splits = {}
    for split in ("train", "val"):
        path = os.path.join(folder, f"{split}.bin")
        if not os.path.exists(path):
            raise UserError(f"{path} is missing: prepare the dataset again (python data/<name>/prepare.py)")
        size = os.path.getsize(path)
        expected = meta.get(f"{split}_tokens")
        if size % 2 or (expected is not None and size // 2 != expected):
            raise UserError(f"{path} is truncated: {size} bytes where meta.pkl promises {expected} uint16 tokens; "
                            f"prepare the dataset again (python data/<name>/prepare.py)")
        if size // 2 < block_size + 2:
            raise UserError(f"{path} holds {size // 2} tokens, too few for --block_size={block_size}: "
                            f"use a smaller block_size or more text")
        largest = int(np.memmap(path, dtype=np.uint16, mode="r").max())
        if largest >= meta["vocab_size"]:
            raise UserError(f"{path} holds token id {largest} but meta.pkl's vocab_size is {meta['vocab_size']}: "
                            f"prepare the dataset again (python data/<name>/prepare.py)")
        splits[split] = path
        PREPARED[os.path.abspath(path)] = file_identity(path)
    return splits, meta


PREPARED = {}  # absolute path -> (size, modification time) when load_dataset read it: get_windows notices a change


def written_here(path):
    """This process wrote `path` anew (an experiment making its own dataset): not a change under a run."""
    PREPARED.pop(os.path.abspath(path), None)


def file_identity(path):
    status = os.stat(path)
    return status.st_size, status.st_mtime_ns


def fingerprint(splits):
    """The content of a prepared dataset, {split: path of its .bin} as load_dataset returns: a run reused in place of
    training must have read the same tokens, not only a folder of the same name."""
    digest = hashlib.sha1()
    for split in sorted(splits):
        with open(splits[split], "rb") as f:
            digest.update(f.read())
    return digest.hexdigest()


def get_windows(path, batch_size, block_size, rng):
    """batch_size random windows of block_size + 1 tokens: (B, T+1) int64. A fresh memmap each call, as nanoGPT
    (a memmap kept open grows the process's memory as pages are touched)."""
    identity = file_identity(path)
    if PREPARED.get(os.path.abspath(path), identity) != identity:  # prepared again, or copied over, mid-run
        raise UserError(f"{path} changed while this run was reading it (was the dataset prepared again?): its "
                        f"windows would mix two texts; start the run again (with --init_from=resume if it saved a checkpoint)")
    data = np.memmap(path, dtype=np.uint16, mode="r")
    starts = rng.integers(0, len(data) - block_size - 1, size=batch_size)
    return torch.from_numpy(np.stack([data[i:i + block_size + 1].astype(np.int64) for i in starts]))


def tiktoken_encoding(name="gpt2"):
    """tiktoken's BPE by name (data/shakespeare/prepare.py, sample.py, pretrained.py), or one line saying why not."""
    import tiktoken
    try:
        return tiktoken.get_encoding(name)
    except Exception as e:
        raise UserError(f"tiktoken could not load the {name} encoding ({type(e).__name__}); offline, set "
                        f"TIKTOKEN_CACHE_DIR to a folder holding its files") from None


class Tokenizer:
    """The dataset's own tokenizer, from its meta.pkl: characters (stoi / itos) or a tiktoken BPE by name."""
    def __init__(self, meta):
        self.meta = meta
        self.names = {i: name for name, i in meta["specials"].items()}
        if meta["tokenizer"] == "char":
            self.stoi, self.itos = meta["stoi"], meta["itos"]
        else:
            self.encoding = tiktoken_encoding(meta["tokenizer"])

    def encode(self, text):
        if self.meta["tokenizer"] != "char":
            return self.encoding.encode_ordinary(text)
        unknown = sorted(set(c for c in text if c not in self.stoi))
        if unknown:
            raise UserError(f"the prompt has characters outside the vocabulary: {''.join(unknown)!r}; "
                            f"use only characters of the training text")
        return [self.stoi[c] for c in text]

    def decode(self, ids):
        out, ordinary = [], []
        for i in ids:
            if i in self.names:
                out.append(self._decode_ordinary(ordinary) + self.names[i])
                ordinary = []
            else:
                ordinary.append(i)
        return "".join(out) + self._decode_ordinary(ordinary)

    def _decode_ordinary(self, ids):
        if not ids:
            return ""
        return "".join(self.itos[i] for i in ids) if self.meta["tokenizer"] == "char" else self.encoding.decode(ids)
