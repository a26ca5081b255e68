"""
Question: does each committed plot show the run its table shows? Every plot redrawn from the JSON beside it, by
the function its own command draws it with (infra/plots.py stamps each PNG with its JSON's digest;
tests/test_house.py checks every committed plot against its JSON). Needs matplotlib.

    python experiments/redraw.py          # every results/**/<name>.png with its .json: 0.2 minutes on 2 cores
    python experiments/redraw.py results/study/study-cpu.png      # some
"""
import glob
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # python experiments/redraw.py
import infra.quiet_interrupts  # noqa: E402,F401  (before torch: a Ctrl-C while it loads ends quietly)

from infra.configurator import UserError, run_main
from infra.plots import pyplot


def draw_epochs(data, path):
    from experiments import epochs
    s = dict(epochs.SCALES[data["settings"]["scale"]], **data["settings"])
    table, best, _ = epochs.summarise(data["runs"], s)
    epochs.plot(table, best, data, path)


def drawer(name):
    """How the command that wrote results/**/<name>.json draws its plot: the name's first word says which."""
    kind = name.split("-")[0]
    if kind == "bench":
        from infra.speed_diagnostics import plot
    elif kind == "study":
        from experiments.study_report import plot
    elif kind == "finetune":
        from experiments.finetune_report import study_plot as plot
    elif kind == "epochs":
        return draw_epochs
    elif kind == "encoders":
        from experiments.encoders_report import plot
    elif kind == "rerankers":
        from experiments.rerankers_report import plot
    elif kind == "adaptation":
        from experiments.adaptation_report import plot
    elif kind == "fewlabels":
        from experiments.fewlabels_report import plot
    elif kind == "masks":
        from experiments.attention import plot_masks as plot
    elif kind in ("plateau", "multiplier", "attention", "incontext", "curves"):
        plot = __import__(f"experiments.{kind}", fromlist=["plot"]).plot
    else:
        raise UserError(f"{name}.png: no command of this project draws a plot of that name")
    return plot


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main():
    if any(arg in ("-h", "--help") for arg in sys.argv[1:]):
        print(__doc__.strip())
        return
    paths = sys.argv[1:] or sorted(glob.glob(os.path.join(ROOT, "results", "**", "*.png"), recursive=True))
    if pyplot() is None:
        raise UserError("redrawing plots needs matplotlib: pip install matplotlib")
    for path in paths:
        source = os.path.splitext(path)[0] + ".json"
        if not path.endswith(".png") or not os.path.exists(source):
            raise UserError(f"{path}: give a .png with its .json beside it")
        draw = drawer(os.path.basename(os.path.splitext(path)[0]))
        try:
            with open(source) as f:
                data = json.load(f)
            draw(data, path)
        except (OSError, ValueError, KeyError, TypeError, IndexError) as e:
            raise UserError(f"{source} cannot be drawn ({type(e).__name__}: {e}): it is damaged or from an older "
                            f"version; rerun the command that wrote it") from None
        print(f"redrew {os.path.relpath(path)} from {os.path.relpath(source)}", flush=True)


if __name__ == "__main__":
    run_main(main)
