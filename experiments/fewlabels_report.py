"""
How experiments/fewlabels.py's cells are read (claim B2): each (label count, start, reader) at the rate kept for it
(recipe.py: the best mean tuning accuracy over seeds), the effect control (a pretrained reader beats its twin from
scratch and the n-gram rule by more than the spread), and the table and plot written from the cells. Nothing here
trains or measures: a result file can be rewritten from its JSON.
"""
from experiments.recipe import kept_rates, kept_values, rate_grid, rate_kept
from experiments.study_report import backbones_line, mean_std, plus_minus
from infra.configurator import QUICK_NOTE
from infra.plots import pyplot, save

READERS = [("gpt", "last"), ("bert", "mean"), ("prefixlm", "mean")]  # (study model, how its vector is read): the
# causal reader's only position that has read the whole line, the masked encoder, the bidirectional prefix
STARTS = ("pretrained", "from scratch")


def label_counts(data):
    return sorted(data["settings"]["labels"])


def controls(data):
    """Per label count and reader: does the pretrained reader win, its mean - std above both its twin's mean + std
    (from scratch, the same labels) and the n-gram rule on those labels? The effect control: some reader wins at
    some label count."""
    out = {}
    for n in label_counts(data):
        rule = data["rules"][str(n)]["n-gram logistic regression"]
        for model, how in READERS:
            reader = f"{model} ({how})"
            pre, scratch = (kept_values(data, f"{n} {start}", reader, "accuracy") for start in STARTS)
            if not (pre and scratch):
                continue
            (p, p_std), (f, f_std) = mean_std(pre), mean_std(scratch)
            margin = p - (p_std or 0.0)
            out[f"{n}, {reader}"] = {"pretrained": p, "from scratch": f, "n-gram rule": rule,
                                     "pretrained wins": bool(margin > f + (f_std or 0.0) and margin > rule)}
    out["effect control passed"] = any(v["pretrained wins"] for v in out.values())
    return out


def report(data):
    s, scale, c = data["settings"], data["scale"], data["controls"]
    pct = lambda v: plus_minus(v, 1, percent=True)  # noqa: E731
    sizes = data["task sizes"]
    lines = [QUICK_NOTE, ""] if scale == "quick" else []
    lines += [f"Few labels, pretrained against from scratch (claim B2), scale `{scale}`: the study's equal-FLOPs "
              f"checkpoints (experiments/study.py's scale `{s['study_scale']}`), one pretraining run per seed "
              f"({', '.join(map(str, data['seeds']))}), each with a fresh two-class head; beside each, its twin: the "
              f"same architecture and size from fresh weights, trained on the same labels by the same recipe (from "
              f"fresh weights bert's and prefixlm's readers are one network: with the whole line as its prefix, "
              f"prefixlm's mask is bert's, so their twins' rows agree to the digit; pretraining alone tells them "
              f"apart). Mean +- std over seeds, in %. The task: is a {s['line']}-character line as written, or does "
              f"one whole word in it hold two neighbouring letters swapped (into no word of the training text)? "
              f"Half of each. N labelled training lines (N = {', '.join(map(str, label_counts(data)))}; the "
              f"smaller set is the start of the larger), {sizes['tune']} labelled tuning lines beyond them (the same "
              f"for every reader and twin: the rate and the stopping step are chosen on them), {sizes['eval']} "
              f"evaluation lines from the validation split. Each cell trains until its tuning accuracy stops "
              f"improving ({s['patience']} "
              f"checks in a row without a better one, a check every {s['check_every']} steps, at most "
              f"{s['max_steps']} steps of batch {s['batch_size']}, the schedule decaying over them; the weights of "
              f"the best check kept), at each rate of the grid {', '.join(f'{r:g}' for r in s['rates'])} (warmup "
              f"over the first {100 * s['warmup']:.0f}%, the head at {s['head_learning_rate']:g}, a rate past an "
              f"edge kept tried once); the rate kept is the one of best mean tuning accuracy over seeds. On "
              f"{data['machine']}, {data['seconds'] / 60:.1f} min."
              + "".join(f" {note}" for note in data.get("notes", [])), "", backbones_line(data), "",
              "Examples (label 1: misspelt): " + "; ".join(f"{line!r} {label}" for line, label in data["examples"]),
              "", "| labels | reader | pretrained | by seed | rate kept | steps run | from scratch | by seed | "
              "rate kept | steps run |", "|---|---|---|---|---|---|---|---|---|---|"]
    for n in label_counts(data):
        for model, how in READERS:
            reader = f"{model} ({how})"
            row = [str(n), reader]
            for start in STARTS:
                part = f"{n} {start}"
                accuracy = kept_values(data, part, reader, "accuracy")
                row += [pct(accuracy), ", ".join(f"{100 * v:.1f}%" for v in accuracy),
                        rate_kept(data["cells"], part, reader),
                        plus_minus(kept_values(data, part, reader, "steps run"), 0)]
            lines.append("| " + " | ".join(row) + " |")
        for model, surprise in data["surprise"].items():
            surprise = surprise[str(n)]
            lines.append(f"| {n} | {model}'s own surprise, no fine-tuning (below) | {pct(surprise)} | "
                         f"{', '.join(f'{100 * v:.1f}%' for v in surprise)} | - | - | - | - | - | - |")
        for rule, v in data["rules"][str(n)].items():
            lines.append(f"| {n} | (rule) {rule} | {100 * v:.1f}% | - | - | - | - | - | - | - |")
    lines.append(f"| - | (rule told the task, no label) a word the training text never spells so | "
                 f"{100 * data['rules']['told']:.1f}% | - | - | - | - | - | - | - |")
    lines.append("")
    for key, row in c.items():
        if key != "effect control passed":
            n, reader = key.split(", ", 1)
            word = "the pretrained reader wins" if row["pretrained wins"] else "no win by more than the spread"
            lines.append(f"- {n} labels, {reader}: {word} (pretrained {100 * row['pretrained']:.1f}%, from scratch "
                         f"{100 * row['from scratch']:.1f}%, n-gram rule {100 * row['n-gram rule']:.1f}%).")
    lines += ["", "A model's own surprise: the highest loss of the pretrained model's own predictions of the line's "
              "characters (gpt: each next character; bert: each character masked in turn), a threshold on it "
              "fitted on the N labels: one number learnt, no fine-tuning. It reads every position's prediction "
              "where a fine-tuned head reads one pooled vector: what pretraining taught of spelling, beside what "
              "a head on the pooled state draws from it."]
    winners = [key for key, row in c.items() if key != "effect control passed" and row["pretrained wins"]]
    lines += ["", (f"**Effect control: passed** ({'; '.join(winners)}): a pretrained reader beats its twin from "
                   f"scratch and the n-gram rule by more than the spread." if c["effect control passed"] else
                   f"**Effect control: not passed: no pretrained reader beats its twin from scratch and the n-gram "
                   f"rule by more than the spread, at {', '.join(map(str, label_counts(data)))} labels and up to "
                   f"{s['max_steps']} steps** (not reproduced at these label counts)."), ""]
    lines += ["## The rate grid: every rate's mean tuning accuracy", ""]
    lines += rate_grid(data["cells"], "labels and start")
    return "\n".join(lines)


def plot(data, path):
    """Left: evaluation accuracy against the label count, each reader pretrained (solid) and from scratch (dashed),
    mean +- std at the rate kept, the n-gram rule beside. Right: the largest label count's tuning accuracy at every
    check against the training FLOPs spent (one line per seed)."""
    plt = pyplot()
    if plt is None:
        return
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.5))
    counts, kept = label_counts(data), kept_rates(data["cells"])
    for k, (model, how) in enumerate(READERS):
        reader = f"{model} ({how})"
        for start, style in zip(STARTS, ("-", "--")):
            stats = [mean_std(kept_values(data, f"{n} {start}", reader, "accuracy")) for n in counts]
            shown = [(n, m, d or 0.0) for n, (m, d) in zip(counts, stats) if m is not None]
            if shown:
                left.errorbar([x[0] for x in shown], [100 * x[1] for x in shown], [100 * x[2] for x in shown],
                              fmt=style, color=f"C{k}", marker="o", capsize=3, label=f"{reader}, {start}")
            part = f"{counts[-1]} {start}"
            cells = [cell for cell in data["cells"] if (cell["part"], cell["reader"]) == (part, reader)
                     and cell["learning rate"] == kept.get((part, reader))]
            for j, cell in enumerate(cells):
                right.plot([x[2] for x in cell["checks"]], [100 * x[1] for x in cell["checks"]], style,
                           color=f"C{k}", marker="o", markersize=3, label=f"{reader}, {start}" if j == 0 else None)
    left.plot(counts, [100 * data["rules"][str(n)]["n-gram logistic regression"] for n in counts], ":",
              color="grey", marker="s", label="n-gram rule")
    for ax in (left, right):
        ax.axhline(50, color="black", linestyle=":", linewidth=0.8, label="chance")
        ax.legend(fontsize=7)
    left.set_xscale("log")
    left.set_xlabel("labelled training lines")
    left.set_ylabel("evaluation accuracy (%)")
    left.set_title("is a word misspelt? pretrained (solid) against from scratch (dashed)")
    right.set_xscale("log")
    right.set_xlabel("training FLOPs spent (fine-tuning)")
    right.set_ylabel("tuning accuracy (%)")
    right.set_title(f"{counts[-1]} labels: tuning accuracy at every check")
    fig.tight_layout()
    save(fig, path, dpi=110)
