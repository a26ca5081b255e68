#!/usr/bin/env bash
# The round-3 hostile cases: every script, at its edges. Each command and the last line it prints on stderr (or
# stdout where it says so), with its exit status; appended to results/logs/errors.txt.
# Run from the repository root after `python data/shakespeare_char/prepare.py` (or --input=... offline):
#   bash results/logs/errors_round3.sh [scratch folder] [a copy of Tiny Shakespeare's input.txt]
# Everything it prepares or writes goes into the scratch folder; the repository's data/ is only read.
set -u
R=${1:-/tmp/r3}
INPUT=${2:-data/shakespeare_char/input.txt}
T="--n_layer=1 --n_head=1 --n_embd=16 --block_size=16 --max_iters=2 --eval_iters=1 --eval_interval=2 --quiet=True"
rm -rf "$R" && mkdir -p "$R/out.md" "$R/data/shakespeare_char"
cp data/prepare_common.py "$R/data/" && cp data/shakespeare_char/prepare.py "$R/data/shakespeare_char/"
ln -s "$PWD/infra" "$R/infra"  # a copy of the char prepare script writing into $R/data/shakespeare_char
PREP="$R/data/shakespeare_char/prepare.py"
python train.py $T --out_dir="$R/ok" >/dev/null 2>&1
run() { echo "\$ $*"; timeout 120 "$@" >"$R/stdout" 2>"$R/err"; status=$?; echo "  -> exit $status: $(tail -1 "$R/err" | cut -c1-300)"; }
damage() {  # damage NAME PYTHON: a copy of the trained checkpoint, changed by PYTHON (the checkpoint is `s`)
  mkdir -p "$R/$1" && python - "$R/ok/ckpt.pt" "$R/$1/ckpt.pt" <<PY
import sys, torch; s = torch.load(sys.argv[1], weights_only=False)
$2
torch.save(s, sys.argv[2])
PY
}
echo "## class 1: every script checks its arguments as train.py does"
run python sample.py --out_dir="$R/ok" --seed=18446744073709551616
run python sample.py --out_dir="$R/ok" --seed=-1
run python sample.py --out_dir="$R/ok" --device=cpu:1
run python experiments/finetune.py --init_from="$R/ok" --device=cpu:1
run python experiments/finetune.py --init_from="$R/ok/ckpt.pt" --probe_steps=2
echo "## class 2: damaged checkpoints"
damage nostoi 's["meta"].pop("stoi")'
run python sample.py --out_dir="$R/nostoi"
damage shortitos 's["meta"]["itos"] = s["meta"]["itos"][:5]'
run python sample.py --out_dir="$R/shortitos"
damage nan 'next(iter(s["model"].values())).fill_(float("nan"))'
run python sample.py --out_dir="$R/nan"
damage bestloss 's["best_val_loss"] = "low"'
run python train.py $T --out_dir="$R/bestloss" --init_from=resume --max_iters=4
damage noarch 's["config"].pop("arch")'
run python train.py $T --out_dir="$R/noarch" --init_from=resume --max_iters=4
echo "## class 3: hangs"
mkdir -p "$R/fifo" && mkfifo "$R/fifo/ckpt.pt"
run python train.py $T --out_dir="$R/fifo" --init_from=resume
run python sample.py --out_dir="$R/fifo"
echo "## class 4: outputs that fail late or half-way"
run python bench.py --quick --sections=ceilings --out="$R/out.json"
touch "$R/a-file"  # a folder path through a file: unwritable, even for root (who ignores read-only modes)
run python experiments/epochs.py --quick --out_dir="$R/a-file/x"
run python experiments/incontext.py --quick --out_dir="$R/a-file/x"
run python experiments/reversal.py --quick --out_dir="$R/a-file/x"
echo "\$ (ulimit -f 1; python data/shakespeare_char/prepare.py --input=...)   (a file-size limit: a full disk)"
(ulimit -f 1; python "$PREP" --input="$INPUT" >/dev/null 2>"$R/err"); echo "  -> exit $?: $(tail -1 "$R/err")"; echo "  left behind: $(ls "$R/data/shakespeare_char" | grep -c tmp) .tmp file(s)"
echo "\$ python data/shakespeare_char/prepare.py ... & kill -TERM while it writes"
python "$PREP" --input="$INPUT" >/dev/null 2>"$R/err" & p=$!; for i in $(seq 200); do sleep 0.05; ls "$R/data/shakespeare_char" | grep -q tmp && break; done; kill -TERM $p; wait $p; echo "  -> exit $?: $(tail -1 "$R/err")"; echo "  left behind: $(ls "$R/data/shakespeare_char" | grep -c tmp) .tmp file(s)"
echo "\$ python masks.py | head -1   (stderr)"; python masks.py 2>"$R/err" | head -1 >/dev/null; echo "  -> exit ${PIPESTATUS[0]}: $(tail -1 "$R/err")"
echo "\$ python train.py ... --quiet=False | head -3   (stderr)"; python train.py $T --out_dir="$R/pipe" --quiet=False --overwrite=True 2>"$R/err" | head -3 >/dev/null; echo "  -> exit ${PIPESTATUS[0]}: $(tail -1 "$R/err")"
echo "\$ python masks.py > /dev/full"; python masks.py >/dev/full 2>"$R/err"; echo "  -> exit $?: $(tail -1 "$R/err")"
echo "\$ PYTHONIOENCODING=ascii python sample.py --start=caf   (a vocabulary with é)"
for i in $(seq 400); do echo "café crème brûlée"; done > "$R/accents.txt"
python "$PREP" --input="$R/accents.txt" >/dev/null 2>&1 && python train.py $T --dataset="$R/data/shakespeare_char" --out_dir="$R/accents-run" >/dev/null 2>&1
PYTHONIOENCODING=ascii python sample.py --out_dir="$R/accents-run" --start=caf --max_new_tokens=20 --num_samples=1 >"$R/stdout" 2>"$R/err"; echo "  -> exit $?: $(tail -1 "$R/err") (stdout: $(head -1 "$R/stdout"))"
echo "## class 5: stops outside the training loop"
echo "\$ python train.py ... & kill -INT within a second (while torch loads)"
python train.py $T --out_dir="$R/early" >/dev/null 2>"$R/err" & p=$!; sleep 0.4; kill -INT $p; wait $p; echo "  -> exit $?: $(tail -1 "$R/err")$(grep -c Traceback "$R/err") traceback(s)"
echo "\$ python experiments/study.py --quick ... & kill -TERM after the first runs"
python experiments/study.py --quick --out_dir="$R/study" >"$R/stdout" 2>"$R/err" & p=$!; for i in $(seq 120); do sleep 0.5; grep -q "trained gpt" "$R/stdout" && break; done; kill -TERM $p; wait $p; echo "  -> exit $?: $(tail -1 "$R/err")"
echo "## class 6: misleading messages"
run python "$PREP" --input="$R"
run python "$PREP" --input="$R/fifo/ckpt.pt"
run python train.py $T --dataset= --out_dir="$R/e"
run python train.py $T --dataset=. --out_dir="$R/e"
run python bench.py --sections=,ceilings
echo "## class 7: edges"
printf 'import sys\nsys.exit(0)\n' > "$R/exits.py"
run python train.py "$R/exits.py" $T --out_dir="$R/e"
run python train.py $T --max_iters=0 --out_dir="$R/zero" --quiet=False
echo "  (stdout) $(tail -1 "$R/stdout" | cut -c1-200)"
run python train.py $T --compile=True --out_dir="$R/e" --device=cpu   # (PATH without a C++ compiler: below)
echo "\$ PATH=<python only> python train.py ... --compile=True"; mkdir -p "$R/bin" && ln -sf "$(python -c 'import sys; print(sys.executable)')" "$R/bin/python"
PATH="$R/bin" python train.py $T --compile=True --out_dir="$R/e" --device=cpu >/dev/null 2>"$R/err"; echo "  -> exit $?: $(tail -1 "$R/err")"
echo "\$ python train.py ... while the dataset is prepared again"
python "$PREP" --input="$INPUT" >/dev/null 2>&1
timeout 300 python train.py $T --dataset="$R/data/shakespeare_char" --max_iters=100000 --eval_interval=100000 --out_dir="$R/changing-run" >/dev/null 2>"$R/err" & p=$!; sleep 8; python "$PREP" --input="$R/accents.txt" >/dev/null 2>&1; wait $p; echo "  -> exit $?: $(tail -1 "$R/err")"
