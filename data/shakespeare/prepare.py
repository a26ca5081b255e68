"""
Tiny Shakespeare in a published model's tokens, for training from scratch or fine-tuning (train.py --init_from=):
    python data/shakespeare/prepare.py [--input=PATH]              # GPT-2's BPE (tiktoken) -> data/shakespeare
    python data/shakespeare/prepare.py --tokenizer=bert-base-uncased  # -> data/shakespeare_bert-base-uncased
    python data/shakespeare/prepare.py --tokenizer=t5-small           # -> data/shakespeare_t5-small
GPT-2's ids are followed by the project's special tokens (from 50257 on). BERT's WordPiece and T5's SentencePiece
(the transformers tokenizer of that name or save_pretrained folder) keep *their* special ids, written to meta.pkl
under the project's names (pretrained.dataset_meta), so the model's pre-training masks and sentinels mean what
they meant. Offline, tiktoken needs its files cached: TIKTOKEN_CACHE_DIR=<a folder holding them>.
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import prepare_common  # noqa: E402


def prepare(input_path="", dataset_dir=HERE, tokenizer="gpt2"):
    if tokenizer == "gpt2":
        from infra.dataset import tiktoken_encoding
        text = prepare_common.read_text(input_path, dataset_dir)  # first: a wrong --input is named as such
        encoding = tiktoken_encoding("gpt2")
        encode, meta = encoding.encode_ordinary, {"tokenizer": "gpt2", "num_ordinary": encoding.n_vocab}
    else:
        from infra.pretrained import dataset_meta, read_tokenizer  # transformers, only here
        family, hf = read_tokenizer(tokenizer)  # before reading the text: a bad name costs nothing
        meta = dataset_meta(tokenizer, family, hf)
        text = prepare_common.read_text(input_path, HERE)  # the download is cached once, in data/shakespeare
        encode = lambda part: hf.encode(part, add_special_tokens=False)  # noqa: E731  (text only, no [CLS] or </s>)
    ids = prepare_common.encode_with_progress(text, encode)
    prepare_common.write_dataset(dataset_dir, ids, meta)


def dataset_dir_for(tokenizer):
    """data/shakespeare for GPT-2; data/shakespeare_<name> beside it for another tokenizer (a folder: its name)."""
    if tokenizer == "gpt2":
        return HERE
    name = os.path.basename(os.path.normpath(os.path.expanduser(tokenizer)))  # google-bert/bert-base-uncased too
    return os.path.join(os.path.dirname(HERE), f"shakespeare_{name}")


def main():
    args = prepare_common.parse_args(sys.argv[1:], tokenizer="gpt2")
    if not args["tokenizer"].strip():
        raise prepare_common.UserError("--tokenizer is empty: gpt2 (the default), or a published BERT or T5 name or "
                                       "folder (bert-base-uncased, t5-small)")
    folder = dataset_dir_for(args["tokenizer"])
    created = not os.path.exists(folder)
    os.makedirs(folder, exist_ok=True)
    try:
        prepare(args["input"], folder, args["tokenizer"])
    except BaseException:
        if created and not os.listdir(folder):  # nothing half-made left behind
            os.rmdir(folder)
        raise
    if args["tokenizer"] != "gpt2":
        print(f"train on it with --dataset={os.path.basename(folder)}")


if __name__ == "__main__":
    prepare_common.run_main(main)
