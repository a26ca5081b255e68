"""
Tiny Shakespeare with GPT-2's byte-pair encoding (tiktoken), then the special tokens after GPT-2's 50257.
    python data/shakespeare/prepare.py [--input=PATH]
Offline, tiktoken needs its files cached: TIKTOKEN_CACHE_DIR=../shared/data/tiktoken (see README).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import prepare_common  # noqa: E402


def prepare(input_path="", dataset_dir=os.path.dirname(os.path.abspath(__file__))):
    import tiktoken
    text = prepare_common.read_text(input_path, dataset_dir)
    try:
        encoding = tiktoken.get_encoding("gpt2")
    except Exception as e:
        raise prepare_common.UserError(f"tiktoken could not load the gpt2 encoding ({e.__class__.__name__}); "
                                       "offline, set TIKTOKEN_CACHE_DIR to a folder holding its files") from None
    ids = prepare_common.encode_with_progress(text, encoding.encode_ordinary)
    meta = {"tokenizer": "gpt2", "num_ordinary": encoding.n_vocab}
    prepare_common.write_dataset(dataset_dir, ids, meta)


if __name__ == "__main__":
    prepare_common.run_main(lambda: prepare(prepare_common.parse_args(sys.argv[1:])["input"]))
