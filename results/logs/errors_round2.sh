#!/usr/bin/env bash
# The round-2 hostile cases: each command and the one line it prints (appended to results/logs/errors.txt).
# Run from the repository root after `python data/shakespeare_char/prepare.py` (or --input=... offline).
T="--n_layer=1 --n_head=1 --n_embd=16 --block_size=16 --max_iters=2 --eval_iters=1 --eval_interval=2 --quiet=True"
rm -rf /tmp/r2 && mkdir -p /tmp/r2/dir.json
python train.py $T --out_dir=/tmp/r2/ok >/dev/null 2>&1
printf 'learning_rate = float("nan")\n' > /tmp/r2/nan.py
run() { echo "\$ $*"; "$@" >/dev/null 2>/tmp/r2/err; echo "  -> exit $?: $(tail -1 /tmp/r2/err)"; }
run python train.py /tmp/r2/nan.py $T --out_dir=/tmp/r2/e
run python train.py $T --seed=18446744073709551616 --out_dir=/tmp/r2/e
run python train.py $T --arch=t5 --ul2_mixture="(1e999,0,0)" --out_dir=/tmp/r2/e
run python train.py $T --dtype=float16 --device=cpu --out_dir=/tmp/r2/e
run python train.py --n_layer=1 --n_head=1 --n_embd=262144 --block_size=16 --out_dir=/tmp/r2/e
run python train.py $T --arch=bert --objective=diffusion --init_from=resume --out_dir=/tmp/r2/ok
run python train.py /tmp/r2 $T
run python experiments/study.py --quick --seed=18446744073709551616
run python sample.py --out_dir=/tmp/r2/ok --temperature=1e999
run python sample.py --out_dir=/tmp/r2/ok --max_new_tokens=10000000000
run python sample.py --out_dir=/tmp/r2/ok --num_samples=100000000
run python sample.py --out_dir=/tmp/r2/ok --steps=8
run python sample.py --out_dir=/tmp/r2/ok --start=FILE:/dev/zero
run python sample.py --out_dir=/tmp/r2/ok --start=FILE:/tmp
run python sample.py --out_dir=/tmp/r2/ok --checkpoint=log.jsonl
run python sample.py --out_dir=/tmp/r2/ok --checkpoint=/tmp
run python bench.py --out=/tmp/r2/dir.json
run python bench.py --out=r.md
python - <<'PY'
import torch, sys; sys.path.insert(0, ".")
s = torch.load("/tmp/r2/ok/ckpt.pt", weights_only=False); s["model_config"]["n_experts"] = 8
import os; os.makedirs("/tmp/r2/bad", exist_ok=True); torch.save(s, "/tmp/r2/bad/ckpt.pt")
PY
run python sample.py --out_dir=/tmp/r2/bad
python -c "print(''.join(chr(c) for c in range(0x4E00, 0x4E00 + 70000) if not 0xD800 <= c < 0xE000))" > /tmp/r2/many.txt
run python data/shakespeare_char/prepare.py --input=/tmp/r2/many.txt
