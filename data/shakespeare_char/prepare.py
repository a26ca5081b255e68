"""
Character-level Tiny Shakespeare: every distinct character is a token, then the special tokens.
    python data/shakespeare_char/prepare.py                      # downloads the text
    python data/shakespeare_char/prepare.py --input=PATH         # uses a local copy
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import prepare_common  # noqa: E402


def prepare(input_path="", dataset_dir=os.path.dirname(os.path.abspath(__file__))):
    text = prepare_common.read_text(input_path, dataset_dir)
    chars = sorted(set(text))
    stoi = {c: i for i, c in enumerate(chars)}
    meta = {"tokenizer": "char", "num_ordinary": len(chars), "stoi": stoi, "itos": chars}
    ids = prepare_common.encode_with_progress(text, lambda part: [stoi[c] for c in part])
    prepare_common.write_dataset(dataset_dir, ids, meta)


if __name__ == "__main__":
    prepare_common.run_main(lambda: prepare(prepare_common.parse_args(sys.argv[1:])["input"]))
