#!/bin/bash
set -euo pipefail
# Training step time, this project's train.py against nanoGPT's, same shape, same machine, interleaved.
# nanoGPT lives in a scratch folder outside this repository (its code is never committed here):
#   git clone https://github.com/karpathy/nanoGPT /tmp/nanogpt
#   (cd /tmp/nanogpt && python data/shakespeare_char/prepare.py)
# and this repository's data: python data/shakespeare_char/prepare.py
# Run from the repository root: bash results/logs/nanogpt_compare.sh [/tmp/nanogpt] > results/logs/nanogpt_compare.txt
# Prints the median ms/iteration of iterations 8 and later of every run (the first ones include compilation).
NANOGPT="${1:-/tmp/nanogpt}"
LOGS=$(mktemp -d)
trap 'rm -rf "$LOGS"' EXIT  # also on Ctrl-C: the runs' logs are scratch
COMMON="--device=cpu --batch_size=8 --block_size=256 --dropout=0.0 --max_iters=30 --log_interval=1 --eval_interval=1000 --eval_iters=2 --gradient_accumulation_steps=1 --lr_decay_iters=30 --warmup_iters=5"
for round in 1 2; do
  for compile in False True; do
    echo "round $round/2, compile=$compile: ours, then nanoGPT (~30 s each, +20 s to compile)" >&2
    python train.py --arch=gpt --dataset=shakespeare_char --n_layer=6 --n_head=6 --n_embd=384 --bias=False \
      --out_dir=$LOGS/ours --overwrite=True --compile=$compile $COMMON > $LOGS/ours-$compile-$round.log 2>&1
    (cd "$NANOGPT" && python train.py config/train_shakespeare_char.py --dtype=float32 --compile=$compile \
      --out_dir=$LOGS/nano --always_save_checkpoint=False $COMMON) > $LOGS/nano-$compile-$round.log 2>&1
  done
done
grep -m1 "model name" /proc/cpuinfo
python - "$LOGS" <<'PY'
import glob, os, re, statistics, sys
medians = {}
for path in sorted(glob.glob(os.path.join(sys.argv[1], "*-*-*.log"))):
    found = re.findall(r"iter (\d+): loss [\d.]+, (?:time )?([\d.]+) ?ms", open(path).read())
    steady = [float(ms) for i, ms in found if int(i) >= 8]
    name = os.path.basename(path)[:-4]
    medians[name] = statistics.median(steady)
    print(f"{name}: median {medians[name]:.1f} ms/iter over {len(steady)} iterations; first {found[0][1]} ms")
for compile in ("False", "True"):
    ratios = [medians[f"nano-{compile}-{r}"] / medians[f"ours-{compile}-{r}"] for r in (1, 2)]
    print(f"compile={compile}: nanoGPT / ours ms per iteration = " + ", ".join(f"{x:.3f}" for x in ratios))
PY
