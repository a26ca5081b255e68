"""
How experiments/encoders.py's cells are read (claims E3, X1, F3, B2): the readers compared in each part, each part's
positive control, and the table and plot written from the cells (the rate kept for each reader, chosen over seeds on
the tuning items, is experiments/recipe.py's). Nothing here trains or measures: every function reads the
cells (and the rules) of a run, so a result file can be rewritten from its JSON.
"""
import numpy as np

from experiments.recipe import CONTROL_MARGIN, control_outcome, kept_rates, kept_values, rate_grid, rate_kept
from experiments.study_report import backbones_line, plus_minus
from infra.configurator import QUICK_NOTE
from infra.plots import pyplot, save

PROBE_READERS = [("gpt", "mean"), ("gpt", "echo"), ("bert", "mean"), ("prefixlm", "mean"), ("t5", "mean"),
                 ("diffusion", "mean")]  # (study model, how its vector is read)
BI_READERS = [("gpt", "mean"), ("gpt", "last"), ("gpt", "echo"), ("bert", "mean"), ("prefixlm", "mean"),
              ("t5", "mean"), ("diffusion", "mean")]
FLAG_FIRST_READERS = [("gpt", "mean"), ("gpt", "last"), ("bert", "mean")]  # the mechanism's control
JUDGE_READERS = [("gpt", "last"), ("bert", "mean"), ("prefixlm", "mean")]  # each trained to early stopping: the
# causal reader, the masked encoder, and the causal objective with a bidirectional mask
PARTS = {"probe": PROBE_READERS, "retrieval": BI_READERS, "flag-first": FLAG_FIRST_READERS, "judge": JUDGE_READERS}


# ----------------------------------------------------------------------------- scores at the rate kept, the controls

def controls(data):
    """Each part's positive control, from the cells and the rules."""
    out = {}
    for part, metric, rule in (("retrieval", "recall@1", data["rules"]["retrieval"]["n-gram cosine"]["recall@1"]),
                               ("judge", "accuracy", data["rules"]["judge"]["n-gram logistic regression"])):
        scores = {f"{name} ({how})": kept_values(data, part, f"{name} ({how})", metric) for name, how in PARTS[part]}
        scores = {reader: v for reader, v in scores.items() if v}
        if scores:
            out[part] = control_outcome(scores, rule)
    return out


# ----------------------------------------------------------------------------- the report

def recipe_text(data, s):
    """The fine-tuning recipe, the same for every reader, in words."""
    steps = f"{s['steps']} steps" + (" (the judgement: until validation stops improving, section 3)" if
                                      "judge" in data["parts"] else "")
    return (f"Fine-tuning, the same for every reader: {steps} of AdamW, batch {s['batch_size']}, the "
            f"backbone at each rate of the grid {', '.join(f'{r:g}' for r in s['rates'])} (a fresh head at "
            f"{s['head_learning_rate']:g}), warmup over the first {100 * s['warmup']:.0f}% of the steps, then "
            f"linear to 0 (a reader whose best rate is at the grid's edge is also tried at {s['grown'][0]:g} or "
            f"{s['grown'][1]:g}); the rate kept for a reader is the one of best mean score over seeds on tuning "
            f"items held out of the training ones ({s['tune_lines']} lines, {s['tune_queries']} candidate sets, "
            f"{s['judge_tune']} agreement examples; never an evaluation item): section 4 gives every rate's score.")


def control_line(data, part):
    c = data["controls"].get(part)
    if c is None:
        return "Positive control: not run."
    word = "passed" if c["passed"] else "FAILED (no verdict from this part)"
    spread = "(one seed)" if c["std"] is None else f"+- {100 * c['std']:.1f}"
    return (f"Positive control: {word}: best {c['best']} {100 * c['mean']:.1f}% {spread} against the spelling "
            f"rule's {100 * c['rule']:.1f}%.")


def judge_section(data, s):
    """Section 3: the judgement, each reader trained to early stopping, the compute it spent beside its score."""
    pct = lambda v: plus_minus(v, 1, percent=True)  # noqa: E731
    lines = ["## 3. A whole-input judgement: do the two lines agree?", "",
             f"{data['task sizes']['judge train']} training and {data['task sizes']['judge eval']} evaluation "
             f"examples of two {s['judge_line']}-character lines, half agreeing; accuracy. Each reader trains until "
             f"its accuracy on the {s['judge_tune']} tuning items stops improving ({s['patience']} checks in a row "
             f"under its best, one every {s['check_every']} steps; at most {s['judge_steps']} steps, the schedule "
             f"decaying over them), then keeps the weights of its best check: the compute each spent is its own, "
             f"found by validation (steps and training FLOPs: mean +- std over seeds, at the rate kept).",
             "", "| reader | accuracy | by seed | rate kept | steps run | best step | training TFLOP |",
             "|---|---|---|---|---|---|---|"]
    for name, how in JUDGE_READERS:
        reader = f"{name} ({how})"
        spent = [plus_minus([scale * v for v in kept_values(data, "judge", reader, key)], digits)
                 for key, scale, digits in (("steps run", 1, 0), ("best step", 1, 0), ("flops", 1e-12, 2))]
        accuracy = kept_values(data, "judge", reader, "accuracy")
        lines.append(f"| {reader} | {pct(accuracy)} | {', '.join(f'{100 * v:.1f}%' for v in accuracy)} | "
                     f"{rate_kept(data['cells'], 'judge', reader)} | " + " | ".join(spent) + " |")
    for rule, v in data["rules"]["judge"].items():
        lines.append(f"| (rule) {rule} | {100 * v:.1f}% | - | - | - | - | - |")
    return lines + ["", control_line(data, "judge"), ""]


def report(data, s, scale):
    pct = lambda v: plus_minus(v, 1, percent=True)  # noqa: E731
    lines = [QUICK_NOTE, ""] if scale == "quick" else []
    lines += [f"Where encoders still win (claims E3, X1, F3, B2), scale `{scale}`: the study's equal-FLOPs "
              f"checkpoints (experiments/study.py's scale `{s['study_scale']}`), one pretraining run per seed "
              f"({', '.join(map(str, data['seeds']))}); mean +- std over seeds, in %. " + recipe_text(data, s) +
              f" Training examples from the training split, evaluation ones from the validation split. On "
              f"{data['machine']}, {data['seconds'] / 60:.1f} min. Positive control of a part: its best reader's "
              f"mean - std at least {100 * CONTROL_MARGIN:.0f} points above the spelling rule."
              + "".join(f" {note}" for note in data.get("notes", []))
              + ("" if data["parts"] == list(PARTS) else f" Parts run: {', '.join(data['parts'])}.")
              + (f" Every fine-tuning run at {data['steps_multiple']} x the scale's steps." if
                 data["steps_multiple"] > 1 else ""), "",
              backbones_line(data), ""]

    r = data["rules"]
    lines += ["## 1. The structural fact (an illustration: true by construction)", "",
              f"{data['task sizes']['probe eval']} evaluation "
              f"windows of {2 * s['half']} characters: {data['task sizes']['probe eval'] // 2} first halves, each "
              f"followed once by a second half with a capital letter and once by one without. Pooled: the mean of "
              f"the first half's final states (echo: of the second copy's first half). Probe: a linear head on "
              f"those frozen vectors, {s['probe_steps']} steps, balanced accuracy.", "",
              "| reader | first-half vectors equal to the bit (pairs) | median max abs difference | probe |",
              "|---|---|---|---|"]
    for name, how in PROBE_READERS:
        reader = f"{name} ({how})"
        cells = [c for c in data["cells"] if (c["part"], c["reader"]) == ("probe", reader)]
        if cells:
            lines.append(f"| {reader} | {cells[0]['equal pairs']} of {cells[0]['pairs']} | "
                         f"{cells[0]['median difference']:.2g} | {pct([c['balanced accuracy'] for c in cells])} |")
    for rule, v in r["probe"].items():
        lines.append(f"| (rule) {rule} | - | - | {100 * v:.1f}% |")
    lines += ["", "## 2. Bi-encoder retrieval: the flag, read last, decides", "",
              f"{data['task sizes']['eval lines']} queries, each ranked among all {data['task sizes']['eval lines']} "
              f"evaluation documents (two lines of {s['line']} characters and the flag); hard negative first: how "
              f"often the document whose *other* line is the query ranks first; hits@1: among {s['candidates']} "
              f"candidates (the right document, its hard negative, {s['candidates'] - 2} others, for "
              f"{s['rerank_queries']} queries). Flag first: the same documents with the flag as their first line.", "",
              "| reader | recall@1 | MRR | hard negative first | hits@1 of " + str(s["candidates"])
              + " | rate kept | recall@1, flag first | its rate kept |", "|---|---|---|---|---|---|---|---|"]
    for name, how in BI_READERS:
        reader = f"{name} ({how})"
        lines.append(f"| {reader} | " + " | ".join(pct(kept_values(data, "retrieval", reader, m)) for m in
                                                   ("recall@1", "mrr", "hard negative first", "hits@1"))
                     + f" | {rate_kept(data['cells'], 'retrieval', reader)} | "
                       f"{pct(kept_values(data, 'flag-first', reader, 'recall@1'))} | "
                       f"{rate_kept(data['cells'], 'flag-first', reader)} |")
    for rule, v in r["retrieval"].items():
        lines.append(f"| (rule) {rule} | {100 * v['recall@1']:.1f}% | {100 * v['mrr']:.1f}% | "
                     f"{100 * v['hard negative first']:.1f}% | {100 * v['hits@1']:.1f}% | - | - | - |"
                     if rule != "chance" else f"| (rule) chance | {100 * v['recall@1']:.2f}% | {100 * v['mrr']:.2f}% | "
                     f"- | {100 * v['hits@1']:.1f}% | - | - | - |")
    lines += ["", control_line(data, "retrieval"), ""]
    if "judge" in data["parts"]:
        lines += judge_section(data, s)
    lines += ["## 4. The rate grid: every rate's mean score on the tuning items", "",
              f"The grid is {', '.join(f'{r:g}' for r in s['rates'])}; a reader whose best rate was at its edge was "
              f"also tried one rate past it ({s['grown'][0]:g} or {s['grown'][1]:g}). The rate kept (bold) is the "
              f"best; one still at the edge of the rates tried is marked: a rate beyond it might do better.", ""]
    lines += rate_grid(data["cells"], "part")
    head, *sections = "\n".join(lines).split("\n## ")  # only the sections of the parts run
    shown = {"1": {"probe"}, "2": {"retrieval", "flag-first"}, "3": {"judge"}, "4": set(PARTS) - {"probe"}}
    return "\n## ".join([head] + [text for text in sections if shown[text[0]] & set(data["parts"])])


def plot(data, path):
    """A panel per kind of part run: the bi-encoders' recall@1 by reader (flag last and first); the judgement's
    tuning accuracy at every check against the training FLOPs spent so far (the rate kept, a line per seed)."""
    plt = pyplot()
    if plt is None:
        return
    panels = [kind for kind, parts in (("retrieval", {"retrieval", "flag-first"}), ("judge", {"judge"}))
              if parts & set(data["parts"])]
    if not panels:
        return
    fig, axes = plt.subplots(1, len(panels), figsize=(7 * len(panels), 4.5), squeeze=False)
    for ax, panel in zip(axes[0], panels):
        if panel == "retrieval":
            readers = [f"{name} ({how})" for name, how in BI_READERS]
            for offset, part in ((-0.2, "retrieval"), (0.2, "flag-first")):
                v = [kept_values(data, part, r, "recall@1") for r in readers]
                ax.bar(np.arange(len(readers)) + offset, [100 * np.mean(x) if x else 0 for x in v], 0.4,
                       yerr=[100 * np.std(x, ddof=1) if len(x) > 1 else 0 for x in v], capsize=3,
                       label="flag last" if part == "retrieval" else "flag first (control)")
            ax.axhline(100 * data["rules"]["retrieval"]["n-gram cosine"]["recall@1"], color="grey", linestyle=":",
                       label="n-gram cosine rule")
            ax.set_xticks(np.arange(len(readers)), readers, rotation=30, ha="right", fontsize=8)
            ax.set_title("bi-encoder retrieval: recall@1 (%) by reader and pooling")
        else:
            kept = kept_rates(data["cells"])
            for k, (name, how) in enumerate(JUDGE_READERS):
                reader = f"{name} ({how})"
                cells = [c for c in data["cells"] if (c["part"], c["reader"]) == ("judge", reader)
                         and c.get("learning rate") == kept.get(("judge", reader))]
                for j, cell in enumerate(cells):
                    ax.plot([x[2] for x in cell["checks"]], [100 * x[1] for x in cell["checks"]], "-o",
                            color=f"C{k}", markersize=3, label=reader if j == 0 else None)
            ax.axhline(100 * data["rules"]["judge"]["n-gram logistic regression"], color="grey", linestyle=":",
                       label="n-gram rule")
            ax.axhline(50, color="black", linestyle=":", linewidth=0.8, label="chance")
            ax.set_xscale("log")
            ax.set_xlabel("training FLOPs spent (fine-tuning)")
            ax.set_ylabel("accuracy on the tuning items (%)")
            ax.set_title("do the two lines agree? trained until validation stops improving")
        ax.legend(fontsize=7)
    fig.tight_layout()
    save(fig, path, dpi=110)
