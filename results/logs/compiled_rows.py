"""The compiled decoding step against the eager one (prepacked weights): by the number of rows, and what its compile
costs a generation longer than the context. A gpt of 4c's shape (6 x 384, context 256; a 65-token vocabulary),
greedy tokens from a 16-token prompt through sample.generate, each run in a process of its own:

- twice with an empty kernel cache (a new TORCHINDUCTOR_CACHE_DIR): the first call of a 600-token generation of one
  row, compiled, against the same generation again (its compile: past the context the window slides, and the
  context's last position has a graph of its own, which bench.py's 4c never reaches), then eager and compiled
  generations of 120 tokens at 1, 8, 16 and 32 rows interleaved in three rounds (a noisy machine slows both alike),
  the graph for more than one row first compiled at 8 rows in one process, at 32 in the other: does the size it was
  first compiled (and its kernels tuned) at decide its speed?
- once more with the first process's kernel cache kept: the 600-token generation's compile in a later process.

decode_layout.COMPILED_MAX_ROWS is lifted here, so that the compiled rows run the compiled step at every size.

    PYTHONPATH=. python results/logs/compiled_rows.py > results/logs/compiled_rows.txt
"""
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile

import torch

from infra.configurator import Failure, run_main
from infra.progress import Progress
from infra.timing import machine_name, time_once

ROWS = (1, 8, 16, 32)
LONG = 600  # tokens of the long generation: past the 256-token context twice


def child(first_rows):
    """One process: the long generation's compile, then (first_rows > 0) the rows, as JSON on stdout."""
    import sample
    from infra import decode_layout
    from model import ModelConfig, Transformer
    decode_layout.COMPILED_MAX_ROWS = None  # the compiled step at every size (see the docstring)
    torch.manual_seed(0)
    model = Transformer(ModelConfig(arch="gpt", vocab_size=65, block_size=256, n_layer=6, n_head=6,
                                    n_embd=384)).eval()
    prompt = torch.randint(0, 65, (1, 16))

    def seconds(rows, compiled, new):
        return time_once(lambda: sample.generate(model, prompt.expand(rows, -1), new, sample.GREEDY, compiled=compiled),
                         "cpu")

    first_call, again = seconds(1, True, LONG), seconds(1, True, LONG)
    out = {"long_compile_s": first_call - again, "long_compiled_s": again, "long_eager_s": seconds(1, False, LONG)}
    if first_rows:
        out["first_rows_call_s"] = seconds(first_rows, True, 3)  # compiles the graph for more than one row
        rates = {}
        for _ in range(3):
            for rows in ROWS:
                for compiled in (False, True):
                    rates.setdefault(f"{rows} {compiled}", []).append(120 * rows / seconds(rows, compiled, 120))
        out["rates"] = rates
    print(json.dumps(out))


def run_child(first_rows, cache_dir):
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache_dir,
               PYTHONPATH=os.pathsep.join(filter(None, (root, os.environ.get("PYTHONPATH")))))
    result = subprocess.run([sys.executable, os.path.abspath(__file__), f"--child={first_rows}"], env=env,
                            capture_output=True, text=True)
    if result.returncode:
        raise Failure("a measuring process failed: " + (result.stderr.strip().splitlines() or ["no output"])[-1])
    return json.loads(result.stdout.strip().splitlines()[-1])


def main():
    log = lambda *a, **k: print(*a, file=sys.stderr, **k)  # noqa: E731
    progress = Progress("processes", 3, log=log)  # ~6 min on two cores
    folders = [tempfile.mkdtemp(prefix="kernels-") for _ in range(2)]
    try:
        runs = {}
        for done, (name, first_rows, folder) in enumerate((("8", 8, folders[0]), ("32", 32, folders[1]),
                                                           ("warm", 0, folders[0]))):
            runs[name] = run_child(first_rows, folder)
            progress.update(done + 1)
    finally:
        for folder in folders:
            shutil.rmtree(folder, ignore_errors=True)
    print(f"{machine_name('cpu')}, torch {torch.__version__}, Python {platform.python_version()}")
    print(f"\n{LONG} greedy tokens of one row, past the context (first call less the same generation again; then "
          "the same generation compiled and eager)")
    for name, what in (("8", "empty kernel cache, first process"), ("32", "empty kernel cache, second process"),
                       ("warm", "the first process's kernel cache kept")):
        r = runs[name]
        saved = (r["long_eager_s"] - r["long_compiled_s"]) / LONG
        print(f"{what}: compile {r['long_compile_s']:.1f} s; {r['long_compiled_s']:.2f} s compiled, "
              f"{r['long_eager_s']:.2f} s eager: {1e3 * saved:.2f} ms saved a token; compile repaid after "
              + (f"{r['long_compile_s'] / saved:,.0f} tokens" if saved > 0 else "never"))
    for name in ("8", "32"):
        rates = runs[name]["rates"]
        print(f"\nthe graph for more than one row compiled first at {name} rows (that call: "
              f"{runs[name]['first_rows_call_s']:.1f} s)")
        print("rows | eager tokens/s | compiled tokens/s | compiled / eager, of medians | per round")
        for rows in ROWS:
            eager, compiled = rates[f"{rows} False"], rates[f"{rows} True"]
            print(f"{rows} | {statistics.median(eager):.0f} | {statistics.median(compiled):.0f} | "
                  f"{statistics.median(compiled) / statistics.median(eager):.2f}x | "
                  + ", ".join(f"{c / e:.2f}" for e, c in zip(eager, compiled)))


if __name__ == "__main__":
    if len(sys.argv) == 2 and sys.argv[1].startswith("--child="):
        child(int(sys.argv[1].split("=")[1]))
    else:
        run_main(main, interrupted="nothing written")  # Ctrl-C: one line, status 130
