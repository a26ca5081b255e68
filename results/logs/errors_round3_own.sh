#!/usr/bin/env bash
# Round 3, the cases of our own: the experiment scripts added in this round (reversal, planning, tagging,
# gpu_figures, the equal-FLOPs harness) and the exercises' checks, at their edges. Each command and the last line
# it prints on stderr, with its exit status; appended to results/logs/errors.txt.
# Run from the repository root after `python data/shakespeare_char/prepare.py` (or --input=... offline):
#   bash results/logs/errors_round3_own.sh [scratch folder]
set -u
R=${1:-/tmp/r3own}
rm -rf "$R" && mkdir -p "$R" && touch "$R/a-file"
run() { echo "\$ $*"; timeout 300 "$@" >"$R/stdout" 2>"$R/err"; status=$?; echo "  -> exit $status: $(tail -1 "$R/err" | cut -c1-300)$(grep -q Traceback "$R/err" && echo ' [TRACEBACK]')"; }
stop() {  # stop SIGNAL SECONDS COMMAND...: the command, signalled after SECONDS
  echo "\$ ${*:3}   (kill -$1 after $2 s)"; "${@:3}" >"$R/stdout" 2>"$R/err" & p=$!; sleep "$2"; kill "-$1" $p; wait $p
  echo "  -> exit $?: $(tail -1 "$R/err" | cut -c1-300)$(grep -q Traceback "$R/err" && echo ' [TRACEBACK]')"
}
echo "## the exercises' checks"
run python exercises/check.py
run python exercises/check.py 0
run python exercises/check.py 13
run python exercises/check.py abc
run python exercises/check.py 3 3
run python exercises/check.py -- -1
run python exercises/check.py 1.0
run python exercises/check.py " 3"
run python exercises/check.py --help
echo "\$ python exercises/check.py 1 2 > /dev/full"; python exercises/check.py 1 2 >/dev/full 2>"$R/err"; echo "  -> exit $?: $(tail -1 "$R/err")"
echo "\$ python exercises/check.py 1 2 3 | head -0   (stderr)"; python exercises/check.py 1 2 3 2>"$R/err" | head -0; echo "  -> exit ${PIPESTATUS[0]}: $(tail -1 "$R/err")"
stop INT 1 python exercises/check.py 5
echo "## reversal.py and planning.py"
for script in reversal planning; do
  run python experiments/$script.py --scale=tpu
  run python experiments/$script.py --quick --seed=-1
  run python experiments/$script.py --quick --seed=abc
  run python experiments/$script.py --quick --device=cuda
  run python experiments/$script.py --quick --out_dir=
  run python experiments/$script.py --quick --reuse=maybe
  run python experiments/$script.py --quick --out_dir="$R/a-file/x"
  run python experiments/$script.py --quick extra
  stop TERM 9 python experiments/$script.py --quick --out_dir="$R/$script"
done
run python experiments/reversal.py --quick --out_dir="$R/reversal" --reuse=True
echo "  (stdout) $(grep -c '^reused' "$R/stdout") runs reused"
echo "## tagging.py"
run python experiments/tagging.py --quick --study_dir="$R/a-file"
run python experiments/tagging.py --quick --study_dir=
run python experiments/tagging.py --quick --out_dir="$R/a-file/x"
run python experiments/tagging.py --scale=quick
echo "## gpu_figures.py"
run python experiments/gpu_figures.py
run python experiments/gpu_figures.py --steps=nothing --dry_run=True
run python experiments/gpu_figures.py --dry_run=yes
echo "## the helpers and the harness"
run python experiments/structural.py
run python experiments/equal_compute.py
run python experiments/study.py --quick --dataset="$R/none"
run python experiments/study.py --quick --dataset="$R/a-file"
