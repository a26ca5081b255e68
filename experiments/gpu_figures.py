"""
Question: what do the figures that need a GPU say? Everything this project measured so far ran on 2 CPU cores;
this one command runs the pending list on one CUDA GPU, in about 10 minutes, and writes it under results/gpu/.

    python experiments/gpu_figures.py                 # on a machine with CUDA: ~10 minutes
                                                      # -> results/gpu/<gpu>/{summary.md, *.log, bench-cuda.*}
    python experiments/gpu_figures.py --dry_run=True  # every step at tiny size on the CPU (the test suite runs it)

The steps, each a command of the project with its own log and a time limit, in this order (a step that fails or
runs out of time is recorded as such, the others still run):

    tests       python -m pytest -q                            the suite, on the GPU machine
    bench       python bench.py                                bf16, compiled rows, FlexAttention, decoding at
                                                               batch 1/8/32 against the HBM floor
    train-bert  python train.py --arch=bert --max_iters=300    the README's default, its MFU in the log
    train-gpt   python train.py --arch=gpt --max_iters=300
    reversal    python experiments/reversal.py --scale=gpu-short   the structural experiments at GPU size, one seed
    planning    python experiments/planning.py --scale=gpu-short   and a quarter of the budget: a first look

The dataset must be prepared (the training steps read data/shakespeare_char; offline, prepare it with --input).
Without CUDA it refuses in one line (the dry run is the CPU's way to check that every step still runs).
"""
import json
import os
import re
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # python experiments/gpu_figures.py
import infra.quiet_interrupts  # noqa: E402,F401  (before torch: a Ctrl-C while it loads ends quietly)

import torch  # noqa: E402

from infra.configurator import UserError, apply_overrides, run_main  # noqa: E402
from infra.progress import check_writable, format_duration, write_atomically  # noqa: E402
from infra.timing import machine_name  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULTS = dict(dry_run=False, out_dir="", dataset="shakespeare_char", steps="all")
TRAIN = ["--max_iters=300", "--eval_interval=150", "--eval_iters=20", "--log_interval=20", "--overwrite=True"]
# name: (command, minutes allowed on the GPU, the same at tiny size on the CPU for --dry_run)
STEPS = {
    "tests": ([sys.executable, "-m", "pytest", "-q", "-x"], 5,
              [sys.executable, "-m", "pytest", "-q", "tests/test_masks.py"]),
    "bench": ([sys.executable, "bench.py"], 3, [sys.executable, "bench.py", "--quick", "--device=cpu", "--compile=False",
                                                "--sections=ceilings,decoding"]),
    "train-bert": ([sys.executable, "train.py", "--arch=bert", *TRAIN], 2,
                   [sys.executable, "train.py", "--arch=bert", "--device=cpu", "--preset=cpu-tiny", "--max_iters=4",
                    "--eval_interval=2", "--eval_iters=2", "--batch_size=4", "--overwrite=True"]),
    "train-gpt": ([sys.executable, "train.py", "--arch=gpt", *TRAIN], 2,
                  [sys.executable, "train.py", "--arch=gpt", "--device=cpu", "--preset=cpu-tiny", "--max_iters=4",
                   "--eval_interval=2", "--eval_iters=2", "--batch_size=4", "--overwrite=True"]),
    "reversal": ([sys.executable, "experiments/reversal.py", "--scale=gpu-short"], 2,
                 [sys.executable, "experiments/reversal.py", "--quick", "--device=cpu"]),
    "planning": ([sys.executable, "experiments/planning.py", "--scale=gpu-short"], 2,
                 [sys.executable, "experiments/planning.py", "--quick", "--device=cpu"]),
}


def slug(text):
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def run_step(name, command, minutes, folder, extra):
    """One step with its log; returns its record (status, seconds, the log's last lines)."""
    log = os.path.join(folder, f"{name}.log")
    started = time.perf_counter()
    with open(log, "w") as f:
        try:
            status = subprocess.run(command + extra, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT,
                                    timeout=60 * minutes).returncode
        except subprocess.TimeoutExpired:
            status = "out of time"
    with open(log) as f:
        tail = f.read().strip().splitlines()[-3:]
    return {"status": status, "seconds": time.perf_counter() - started, "log": log, "tail": tail}


def main():
    config = apply_overrides(DEFAULTS, sys.argv[1:])
    names = list(STEPS) if config["steps"] == "all" else [x.strip() for x in config["steps"].split(",")]
    if not any(names):
        raise UserError(f"--steps is empty: name some of {', '.join(STEPS)}, or all")
    unknown = [n for n in names if n not in STEPS]
    if unknown:
        raise UserError(f"unknown --steps {', '.join(unknown)}: choose from {', '.join(STEPS)} or all")
    if not config["dry_run"] and not torch.cuda.is_available():
        raise UserError("no CUDA GPU here: this command is for a machine with one (--dry_run=True runs every step "
                        "at tiny size on the CPU)")
    device = "cpu" if config["dry_run"] else "cuda"
    machine = machine_name(device)
    folder = config["out_dir"] or os.path.join(ROOT, "results", "gpu" if not config["dry_run"] else "gpu-dry-run",
                                               slug(machine))
    check_writable([os.path.join(folder, "summary.md")])
    os.makedirs(folder, exist_ok=True)  # the steps' logs go there from the first step on
    out = {"machine": machine, "torch": torch.__version__, "dry_run": config["dry_run"], "steps": {}}
    t0 = time.perf_counter()
    try:
        for number, name in enumerate(names):
            command, minutes, dry = STEPS[name]
            extra = []
            if name == "bench":  # the bench files beside the logs
                extra = [f"--out={os.path.join(folder, f'bench-{device}.json')}"]
            elif name.startswith("train"):
                extra = [f"--out_dir={os.path.join(folder, 'out-' + name)}", f"--dataset={config['dataset']}"]
            elif name in ("reversal", "planning"):
                extra = [f"--out_dir={folder}"]
            print(f"[gpu figures] step {number + 1}/{len(names)}: {name}, "
                  f"{format_duration(time.perf_counter() - t0)} so far", flush=True)
            out["steps"][name] = run_step(name, dry if config["dry_run"] else command, minutes, folder, extra)
            print(f"  {name}: {out['steps'][name]['status']} in {format_duration(out['steps'][name]['seconds'])}",
                  flush=True)
    except KeyboardInterrupt:
        out["interrupted"] = True
        print("interrupted: the steps finished so far are written", flush=True)
    out["seconds"] = time.perf_counter() - t0
    lines = [f"GPU figures on {machine}, torch {torch.__version__}" + (" (dry run: tiny sizes on the CPU)"
                                                                      if config["dry_run"] else ""),
             f"{format_duration(out['seconds'])} in all.", "", "| step | status | time | last line of its log |",
             "|---|---|---|---|"]
    for name, step in out["steps"].items():
        lines.append(f"| {name} | {step['status']} | {format_duration(step['seconds'])} | "
                     f"{(step['tail'] or [''])[-1][:160]} |")
    write_atomically(os.path.join(folder, "summary.json"), json.dumps(out, indent=1),
                     os.path.join(folder, "summary.md"), "\n".join(lines) + "\n")
    print("\n".join(lines) + f"\n\nwrote {os.path.join(folder, 'summary.md')}")
    if out.get("interrupted"):
        sys.exit(130)  # a stop, after writing what finished (docs/reliability.md)
    if any(step["status"] != 0 for step in out["steps"].values()):
        sys.exit(1)


if __name__ == "__main__":
    run_main(main, interrupted="the steps finished so far are written")
