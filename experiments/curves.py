"""
Question: how did my runs learn, side by side? Each run folder's validation loss against iterations and against
training FLOPs, read from the log.jsonl train.py writes there (one line per evaluation).

    python experiments/curves.py out-cpu-gpt out-cpu-bert   # -> curves.png and curves.json here, in seconds
    python experiments/curves.py out-cpu-gpt out-cpu-bert --out=mine.png      # (0 minutes: it reads the logs)

results/logs/curves-cpu-recipe.png is the README's picture: the CPU recipe's gpt and bert, drawn by this command.

Each line is labelled with its architecture, its objective and what its loss averages over. The losses of
different objectives are not the same quantity (claim C4): gpt's is the cross-entropy of every next character,
a density of the text; bert's covers only the ~15% of characters it masked, each predicted from both sides, so it
is no density and a lower value does not mean a better model of the text. The grey line is what character
frequencies alone give on the validation text: where a causal model that learned nothing from context sits. An
MLM's context-free level is about a tenth lower (a tenth of its targets are shown unchanged in the input, and a
model can copy them), which is where bert's long plateau sits (results/study/plateau-cpu.md). It is drawn for
character-level datasets. Without matplotlib the same numbers print as a table (and curves.json is written).
"""
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # python experiments/curves.py
import infra.quiet_interrupts  # noqa: E402,F401  (before torch: a Ctrl-C while it loads ends quietly)

from infra.configurator import UserError, run_main
from infra.plots import pyplot, save

WHAT_IS_AVERAGED = {  # objective -> what its validation loss averages over (the label's units)
    "clm": "nats per character, every next character",
    "prefix_lm": "nats per character of the continuation",
    "mlm": "nats at the 15% masked characters: no density (C4)",
    "diffusion": "nats at the masked characters, weighted: a bound, not a density",
    "span_corruption": "nats per target token of the corrupted spans",
    "ul2": "nats per target token, three denoisers mixed",
}


def read_run(folder):
    """One run folder -> {folder, arch, objective, units, points: [(iteration, flops, val_loss)]}. The evaluation
    lines of its log.jsonl; the arch and objective from its ckpt.pt when there is one (else unknown)."""
    log = os.path.join(folder, "log.jsonl")
    if not os.path.isdir(folder):
        raise UserError(f"{folder} is not a folder: give the out_dir of a train.py run (e.g. out-cpu-gpt)")
    if not os.path.isfile(log):
        raise UserError(f"{folder} has no log.jsonl: give the out_dir of a train.py run (it writes one at the first "
                        f"evaluation)")
    points = []
    with open(log) as f:
        for number, line in enumerate(f, 1):
            try:
                record = json.loads(line)
                if "val_loss" in record:
                    points.append((int(record["iter"]), float(record.get("flops", math.nan)),
                                   float(record["val_loss"])))
            except (ValueError, KeyError, TypeError):
                raise UserError(f"{log}: line {number} is not an evaluation record train.py writes (damaged?); "
                                f"rerun the training or remove the line") from None
    if not points:
        raise UserError(f"{log} holds no evaluation yet: let the run reach its first evaluation (eval_interval)")
    arch, objective, dataset = run_settings(folder)
    units = WHAT_IS_AVERAGED.get(objective, "nats")
    return {"folder": folder.rstrip("/"), "arch": arch, "objective": objective, "dataset": dataset, "units": units,
            "points": points}


def run_settings(folder):
    """(arch, objective, dataset) of a run from its checkpoint's config; (None, None, None) without one."""
    path = os.path.join(folder, "ckpt.pt")
    if not os.path.isfile(path):
        return None, None, None
    from infra.checkpoint import load_checkpoint  # torch: only where a checkpoint is read
    config = load_checkpoint(path)["config"]
    return config.get("arch"), config.get("objective"), config.get("dataset")


def plateau_nats(dataset):
    """Character frequencies' cross-entropy on the validation text (nats/char) for a character-level dataset, else
    None (the frequencies of BPE tokens are no plateau these runs show)."""
    if dataset is None:
        return None
    from infra.dataset import load_dataset
    from objectives import Specials
    from experiments.metrics import character_frequency_nats
    try:
        splits, meta = load_dataset(dataset, 1, prepare_if_missing=False)
    except UserError:
        return None  # the data moved since the run: the curves without their reference line
    if meta.get("tokenizer") != "char":
        return None
    return character_frequency_nats(splits["train"], splits["val"], Specials.from_meta(meta).num_ordinary)


def label(run):
    name = f"{run['arch']}, {run['objective']}" if run["arch"] else "arch unknown (no ckpt.pt)"
    return f"{run['folder']}: {name} ({run['units']})"


def table(data):
    lines = []
    for run in data["runs"]:
        lines += [label(run), "  iteration   TFLOPs   val loss"]
        lines += [f"  {it:>9}   {flops / 1e12:6.3f}   {loss:8.4f}" for it, flops, loss in run["points"]]
    if data["plateau_nats"] is not None:
        lines.append(f"character frequencies alone: {data['plateau_nats']:.4f} nats/char on the validation text")
    return "\n".join(lines)


def plot(data, path):
    """Validation loss against iterations (left) and against training FLOPs (right), one line per run."""
    plt = pyplot()
    if plt is None:
        return False
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    markers = "osD^v<>"
    for k, run in enumerate(data["runs"]):
        iters, flops, losses = zip(*run["points"])
        for axis, x in zip(axes, (iters, [f / 1e12 for f in flops])):
            axis.plot(x, losses, marker=markers[k % len(markers)], markersize=4, label=label(run))
    for axis, xlabel in zip(axes, ("iteration", "training TFLOPs")):
        if data["plateau_nats"] is not None:
            axis.axhline(data["plateau_nats"], color="grey", linestyle=":",
                         label="character frequencies alone (an MLM's context-free level: about 0.9 x)")
        axis.set_xlabel(xlabel)
    axes[0].set_ylabel("validation loss (nats; see each label)")
    axes[0].legend(fontsize=7)
    fig.suptitle("Validation loss of each run. Losses of different objectives are different quantities (claim C4)",
                 fontsize=9)
    fig.tight_layout()
    save(fig, path, dpi=110)
    return True


def main():
    args = sys.argv[1:]
    if any(a in ("-h", "--help") for a in args):
        print(__doc__.strip())
        return
    out = "curves.png"
    for a in [a for a in args if a.startswith("--")]:
        if not a.startswith("--out=") or not a.endswith(".png"):
            raise UserError(f"unknown option {a}: the only option is --out=<file>.png")
        out = a.split("=", 1)[1]
    folders = [a for a in args if not a.startswith("--")]
    if not folders:
        raise UserError("give one or more run folders: python experiments/curves.py out-cpu-gpt out-cpu-bert")
    runs = [read_run(folder) for folder in folders]  # every folder checked before anything is written
    datasets = {run["dataset"] for run in runs} - {None}
    data = {"runs": runs, "plateau_nats": plateau_nats(datasets.pop()) if len(datasets) == 1 else None}
    print(table(data))
    source = os.path.splitext(out)[0] + ".json"
    with open(source + ".partial", "w") as f:
        json.dump(data, f, indent=1)
    os.replace(source + ".partial", source)
    drawn = plot(data, out)
    print(f"wrote {out} and {source}" if drawn else f"wrote {source} (no matplotlib: pip install matplotlib for the "
                                                    f"plot)", flush=True)


if __name__ == "__main__":
    run_main(main)
