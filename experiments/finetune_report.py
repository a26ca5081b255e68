"""
How experiments/finetune.py --study's cells are read (claims B2, X1, F3, E3): the readers and modes compared, each
task's metric and spelling rule, each reader's score at the rate kept for it (experiments/recipe.py), each row's
positive control, and the table and plot written from the cells. Nothing here trains or measures, so a result file
can be rewritten from its JSON (experiments/redraw.py).
"""
import math

import numpy as np

from experiments import recipe
from experiments.study_report import backbones_line, mean_std
from experiments.tasks import CANDIDATES, TASKS
from infra.configurator import QUICK_NOTE
from infra.plots import pyplot, save

MODES = ("probe", "full")
READERS = [("gpt", "last"), ("gpt", "mean"), ("bert", "mean"), ("prefixlm", "mean"), ("t5", "mean"),
           ("diffusion", "mean")]  # (study model, pooling)

METRIC = {"speaker": "balanced accuracy", "tampered": "accuracy", "retrieval": "recall@1"}  # the table's (and
# the tuning score's)
SECOND_METRIC = {"speaker": "accuracy", "retrieval": "mrr"}  # shown too
RULE = {"speaker": "character n-gram logistic regression", "tampered": "character n-gram logistic regression",
        "retrieval": "character n-gram cosine"}  # the spelling rule a positive control must beat


def sampling_error(p, examples, class_counts=None):
    """95% half-width of a score p measured on `examples` evaluation examples: binomial for an accuracy; for a
    balanced accuracy (the mean of per-class recalls, classes with examples only) each class's recall varies with
    its own count, so a small class weighs as much as a large one: 1.96 sqrt(sum_c p(1-p)/n_c) / C."""
    if class_counts:
        counts = [n for n in class_counts if n > 0]
        return 1.96 * math.sqrt(sum(p * (1 - p) / n for n in counts)) / len(counts)
    return 1.96 * math.sqrt(p * (1 - p) / examples)


def study_controls(data):
    """Each (task, mode)'s positive control: its best reader at least recipe.CONTROL_MARGIN above the spelling
    rule, else that row gives no verdict."""
    out = {}
    for part in dict.fromkeys(c["part"] for c in data["cells"]):
        task = part.split()[0]
        scores = {reader: v for name, pooling in READERS
                  if (v := recipe.kept_values(data, part, reader := f"{name} ({pooling})", METRIC[task]))}
        out[part] = recipe.control_outcome(scores, data["baselines"][task][RULE[task]][METRIC[task]])
    return out


def study_report(data, scale):
    s = data["settings"]
    readers = [f"{name} ({pooling})" for name, pooling in READERS]
    grid = lambda key: ", ".join(f"{r:g}" for r in s[key])  # noqa: E731
    tuned = ", ".join(f"{task} {e['tune']}" for task, e in data["examples"].items())
    shared = ", ".join(f"{task} {100 * e['tuning items sharing a line with training']:.0f}%"
                       for task, e in data["examples"].items())
    lines = [QUICK_NOTE, ""] if scale == "quick" else []
    lines += [f"Fine-tuning the study's equal-FLOPs checkpoints (scale `{scale}`; claims B2, X1, F3, E3), {s['seeds']} "
              f"seeds (mean +- std in %): each seed is its own pretraining run (study.py's run of that seed, at the "
              f"learning rate its sweep chose) and sets the head's initialisation and the order of training "
              f"examples, so the std includes pretraining; not the choice of evaluation examples (see the sampling "
              f"error below). One recipe for every reader (experiments/recipe.py): AdamW, the rates rising over the "
              f"first {100 * s['warmup']:.0f}% of the steps, then linear to 0. full: {s['steps']} steps of batch "
              f"{s['batch_size']}, the backbone at each rate of {grid('rates')} (a fresh head at "
              f"{s['head_learning_rate']:g}); probe: {s['probe_steps']} head-only steps on frozen features, the head "
              f"at each rate of {grid('probe_rates')}; a reader whose best rate is at the grid's edge is also tried "
              f"one rate past it. The rate kept for a reader is the one of best mean score over seeds on tuning items "
              f"held out of the training examples ({tuned}; never an evaluation example; held-out examples, not "
              f"held-out text: the share of them holding a line also in a training example is {shared}); the last "
              f"section gives every rate's. Per step a classifier reads {s['batch_size']} examples; the retrieval bi-encoder reads "
              f"{s['batch_size']} lines and their {s['batch_size']} next lines and scores {s['batch_size'] ** 2} "
              f"(line, next line) pairs (in-batch negatives). Inputs of at most {s['max_chars']} characters; t5 "
              f"reads with its encoder (half its layers); retrieval's frozen row: the pooled states, untrained. On "
              f"{data['machine']}; {data['seconds'] / 60:.1f} min in all (pretraining included when it happened). "
              f"Positive control of a row: its best reader's mean - std at least {100 * recipe.CONTROL_MARGIN:.0f} "
              f"points above the spelling rule (character n-grams), else the row gives no verdict."
              + "".join(f" {note}" for note in data.get("notes", [])), "",
              backbones_line(dict(data, checkpoints=s["checkpoints"])), "",
              "| task (metric) | mode | " + " | ".join(readers) + " |", "|---|---|" + "---|" * len(readers)]
    for task in TASKS:
        for metric in [METRIC[task]] + ([SECOND_METRIC[task]] if task in SECOND_METRIC else []):
            for mode in (["frozen"] if task == "retrieval" else []) + list(MODES):
                row = []
                for reader in readers:
                    if mode == "frozen":
                        values = [f[metric] for f in data["frozen"] if f["reader"] == reader]
                    else:
                        values = recipe.kept_values(data, f"{task} {mode}", reader, metric)
                    row.append(format_metric(values) if values else "-")
                lines.append(f"| {task} ({metric}) | {mode} | " + " | ".join(row) + " |")
        for mode in MODES:
            lines.append(f"| {task}: rate kept | {mode} | " + " | ".join(
                recipe.rate_kept(data["cells"], f"{task} {mode}", reader) for reader in readers) + " |")
    lines += ["", "Positive controls (the table's metric, at the rates kept):", ""]
    for part, c in data.get("controls", {}).items():
        spread = "(one seed)" if c["std"] is None else f"+- {100 * c['std']:.1f}"
        lines.append(f"- {part}: " + ("passed" if c["passed"] else "FAILED (no verdict from this row)") +
                     f": best {c['best']} {100 * c['mean']:.1f}% {spread} against the spelling rule's "
                     f"{100 * c['rule']:.1f}%")
    lines += ["", "Baselines under the same scoring (no model), and the evaluation set's own sampling error (95% "
                  "half-width of the table's metric: at the majority-class score, or at chance for retrieval):", ""]
    for task, rules in data["baselines"].items():
        examples = data["examples"][task]
        p = rules["majority class"][METRIC[task]] if "majority class" in rules else 1 / CANDIDATES
        half_width = sampling_error(p, examples["eval"], examples.get("eval_class_counts")
                                    if METRIC[task] == "balanced accuracy" else None)
        balance = ", ".join(f"{name} {count}" for name, count in zip(examples["classes"],
                                                                     examples.get("eval_class_counts", [])))
        lines.append(f"- {task} ({examples['train']} training / {examples['tune']} tuning / {examples['eval']} "
                     f"evaluation examples"
                     + (f", {len(examples['classes'])} classes; evaluation: {balance}" if examples["classes"] else "")
                     + "): " +
                     "; ".join(f"{rule} " + ", ".join(f"{k} {100 * v:.1f}%" for k, v in scores.items())
                               for rule, scores in rules.items()) + f"; sampling error +-{100 * half_width:.1f} points")
    lines += ["", "Every rate tried: mean tuning score over seeds (the rate is chosen on it), then the evaluation "
                  "score in brackets, the table's metric, in %:", "",
              "| task, mode | reader | rates tried | rate kept |", "|---|---|---|---|"]
    for part in dict.fromkeys(c["part"] for c in data["cells"]):
        for reader in readers:
            by_rate = {}
            for c in data["cells"]:
                if (c["part"], c["reader"]) == (part, reader):
                    by_rate.setdefault(c["learning rate"], []).append((c["tuning"], c[METRIC[part.split()[0]]]))
            if by_rate:
                lines.append(f"| {part} | {reader} | " + ", ".join(
                    f"{rate:g}: {100 * np.mean([t for t, _ in v]):.1f} ({100 * np.mean([e for _, e in v]):.1f})"
                    for rate, v in sorted(by_rate.items())) + f" | {recipe.rate_kept(data['cells'], part, reader)} |")
    return "\n".join(lines)


def study_plot(data, path):
    plt = pyplot()
    if plt is None:
        return
    readers = [f"{name} ({pooling})" for name, pooling in READERS]
    fig, axes = plt.subplots(1, len(TASKS), figsize=(15, 4.5))
    for axis, task in zip(axes, TASKS):
        metric = METRIC[task]
        for offset, mode in zip((-0.2, 0.2), MODES):
            values = [recipe.kept_values(data, f"{task} {mode}", r, metric) for r in readers]
            means = [100 * np.mean(v) if v else 0 for v in values]
            errors = [100 * np.std(v, ddof=1) if len(v) > 1 else 0 for v in values]
            axis.bar(np.arange(len(readers)) + offset, means, 0.4, yerr=errors, label=f"{mode} (rate kept)",
                     capsize=3)
        for number, (rule, scores) in enumerate(data["baselines"].get(task, {}).items()):
            axis.axhline(100 * scores[metric], linestyle=(":", "--")[number % 2], color="grey", label=rule)
        axis.set_xticks(np.arange(len(readers)), readers, rotation=35, ha="right", fontsize=8)
        axis.set_title(f"{task} ({metric}, %)")
        axis.legend(fontsize=7)
    fig.tight_layout()
    save(fig, path, dpi=120)


def format_metric(values):
    mean, std = mean_std(values)
    return f"{100 * mean:.1f}" + ("" if std is None else f" +- {100 * std:.1f}")
