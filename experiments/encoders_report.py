"""
How experiments/encoders.py's cells are read (claims E3, X1, F3, B2): the readers compared in each part, each part's
positive control, and the table and plot written from the cells (the rate kept for each reader, chosen over seeds on
the tuning items, is experiments/recipe.py's). Nothing here trains or measures: every function reads the
cells (and the rules) of a run, so a result file can be rewritten from its JSON.
"""
import numpy as np

from experiments.recipe import CONTROL_MARGIN, control_outcome, kept_rates, kept_values, rate_kept
from experiments.study_report import backbones_line, plus_minus
from infra.configurator import QUICK_NOTE
from infra.plots import pyplot, save

PROBE_READERS = [("gpt", "mean"), ("gpt", "echo"), ("bert", "mean"), ("prefixlm", "mean"), ("t5", "mean"),
                 ("diffusion", "mean")]  # (study model, how its vector is read)
BI_READERS = [("gpt", "mean"), ("gpt", "last"), ("gpt", "echo"), ("bert", "mean"), ("prefixlm", "mean"),
              ("t5", "mean"), ("diffusion", "mean")]
FLAG_FIRST_READERS = [("gpt", "mean"), ("gpt", "last"), ("bert", "mean")]  # the mechanism's control
CROSS_READERS = [("gpt", "last"), ("bert", "mean"), ("prefixlm", "mean"), ("t5", "mean"), ("diffusion", "mean")]
JUDGE_READERS = [("gpt", "last"), ("bert", "mean"), ("prefixlm", "mean")]  # each trained to early stopping: the
# causal reader, the masked encoder, and the causal objective with a bidirectional mask
PARTS = {"probe": PROBE_READERS, "retrieval": BI_READERS, "flag-first": FLAG_FIRST_READERS,
         "reranking": CROSS_READERS, "judge": JUDGE_READERS}


# ----------------------------------------------------------------------------- scores at the rate kept, the controls

def controls(data):
    """Each part's positive control, from the cells and the rules."""
    out = {}
    for part, metric, rule in (("retrieval", "recall@1", data["rules"]["retrieval"]["n-gram cosine"]["recall@1"]),
                               ("reranking", "hits@1", data["rules"]["retrieval"]["n-gram cosine"]["hits@1"]),
                               ("judge", "accuracy", data["rules"]["judge"]["n-gram logistic regression"])):
        scores = {f"{name} ({how})": kept_values(data, part, f"{name} ({how})", metric) for name, how in PARTS[part]}
        scores = {reader: v for reader, v in scores.items() if v}
        if scores:
            out[part] = control_outcome(scores, rule)
    return out


# ----------------------------------------------------------------------------- the report

def per_step(s):
    """What each reranker reads and scores per fine-tuning step: (characters read, pairs scored)."""
    document = 2 * s["line"] + 3  # two lines, the flag, two newlines
    pairs = s["rerank_batch"] * (s["rerank_negatives"] + 1)
    return {"bi-encoder": (s["batch_size"] * (s["line"] + document), s["batch_size"] ** 2),
            "cross-encoder": (pairs * (s["line"] + 1 + document), pairs)}


def recipe_text(data, s):
    """The fine-tuning recipe, the same for every reader, in words."""
    (bi_chars, bi_pairs), (cross_chars, cross_pairs) = per_step(s).values()
    return (f"Fine-tuning, the same for every reader: {s['steps']} steps of AdamW, batch {s['batch_size']}, the "
            f"backbone at each rate of the grid {', '.join(f'{r:g}' for r in s['rates'])} (a fresh head at "
            f"{s['head_learning_rate']:g}), warmup over the first {100 * s['warmup']:.0f}% of the steps, then "
            f"linear to 0 (a reader whose best rate is at the grid's edge is also tried at {s['grown'][0]:g} or "
            f"{s['grown'][1]:g}); the rate kept for a reader is the one of best mean score over seeds on tuning "
            f"items held out of the training ones ({s['tune_lines']} lines, {s['tune_queries']} candidate sets, "
            f"{s['judge_tune']} agreement examples; never an evaluation item): section 5 gives every rate's score. "
            f"Per step the bi-encoder reads {s['batch_size']} queries and {s['batch_size']} documents ({bi_chars} "
            f"characters) and scores {bi_pairs} (query, document) pairs by dot products; the cross-encoder reads "
            f"{s['rerank_batch']} queries x {s['rerank_negatives'] + 1} candidates, {cross_pairs} pairs, each one "
            f"sequence ({cross_chars} characters): " + (
                "the same characters per step (about the same FLOPs), not the same pairs" if
                abs(cross_chars / bi_chars - 1) < 0.1 else f"{cross_chars / bi_chars:.2f} x the bi-encoder's "
                f"characters per step") + " (echo reads every text twice).")


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
    outcome = data["controls"]

    def control_line(part):
        c = outcome.get(part)
        if c is None:
            return "Positive control: not run."
        word = "passed" if c["passed"] else "FAILED (no verdict from this part)"
        spread = "(one seed)" if c["std"] is None else f"+- {100 * c['std']:.1f}"
        return (f"Positive control: {word}: best {c['best']} {100 * c['mean']:.1f}% {spread} against the spelling "
                f"rule's {100 * c['rule']:.1f}%.")

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
              f"candidates (part 3's sets). Flag first: the same documents with the flag as their first line.", "",
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
    lines += ["", control_line("retrieval"), "",
              "## 3. Reranking: a cross-encoder against the bi-encoder", "",
              f"hits@1 among {s['candidates']} candidates ({s['rerank_queries']} queries: the right document, its "
              f"hard negative, {s['candidates'] - 2} others); the bi-encoder column is part 2's, same sets. Price: "
              f"median ms per query over {s['timing_repeats']} repeats, first seed, on this machine.", "",
              f"| reader | bi-encoder hits@1 | its rate kept | cross-encoder hits@1 | its rate kept | "
              f"cross, ms/query ({s['candidates']} / {data['task sizes']['eval lines']}) | bi, ms/query "
              f"({s['candidates']} / {data['task sizes']['eval lines']}) | bi, ms per document (once) |",
              "|---|---|---|---|---|---|---|---|"]
    for name, how in CROSS_READERS:
        reader = f"{name} ({how})"
        times = ["-"] * 3
        if reader in data.get("prices", {}):
            p, n = data["prices"][reader], data["task sizes"]["eval lines"]
            times = [f"{p['cross-encoder, %d candidates' % s['candidates']]:.1f} / "
                     f"{p['cross-encoder, %d candidates' % n]:.1f}",
                     f"{p['bi-encoder, %d candidates' % s['candidates']]:.2f} / "
                     f"{p['bi-encoder, %d candidates' % n]:.2f}",
                     f"{p['bi-encoder, encoding one document (once)']:.3f}"]
        lines.append(f"| {reader} | {pct(kept_values(data, 'retrieval', reader, 'hits@1'))} | "
                     f"{rate_kept(data['cells'], 'retrieval', reader)} | {pct(kept_values(data, 'reranking', reader, 'hits@1'))} | "
                     f"{rate_kept(data['cells'], 'reranking', reader)} | " + " | ".join(times) + " |")
    (bi_chars, bi_pairs), (cross_chars, cross_pairs) = per_step(s).values()
    lines += [f"| (rule) n-gram cosine | {100 * r['retrieval']['n-gram cosine']['hits@1']:.1f}% | - | - | - | - | - "
              f"| - |", "", f"Pairs per fine-tuning step: the bi-encoder scores {bi_pairs} (reading {bi_chars} "
              f"characters), the cross-encoder {cross_pairs} (reading {cross_chars}).", "",
              control_line("reranking"), "",
              "## 4. A whole-input judgement: do the two lines agree?", "",
              f"{data['task sizes']['judge train']} training and {data['task sizes']['judge eval']} evaluation "
              f"examples of two {s['judge_line']}-character lines, half agreeing; accuracy. Each reader trains until "
              f"its accuracy on the {s['judge_tune']} tuning items stops improving ({s['patience']} checks in a row, "
              f"one every {s['check_every']} steps, without a better one; at most {s['judge_steps']} steps, the "
              f"schedule decaying over them), then keeps the weights of its best check: the compute each spent is "
              f"its own, found by validation (steps and training FLOPs: mean +- std over seeds, at the rate kept).",
              "", "| reader | accuracy | rate kept | steps run | best step | training TFLOP |", "|---|---|---|---|---|---|"]
    for name, how in JUDGE_READERS:
        reader = f"{name} ({how})"
        spent = [plus_minus([scale * v for v in kept_values(data, "judge", reader, key)], digits)
                 for key, scale, digits in (("steps run", 1, 0), ("best step", 1, 0), ("flops", 1e-12, 2))]
        lines.append(f"| {reader} | {pct(kept_values(data, 'judge', reader, 'accuracy'))} | "
                     f"{rate_kept(data['cells'], 'judge', reader)} | " + " | ".join(spent) + " |")
    for rule, v in r["judge"].items():
        lines.append(f"| (rule) {rule} | {100 * v:.1f}% | - | - | - | - |")
    columns = sorted({c["learning rate"] for c in data["cells"] if "learning rate" in c})
    lines += ["", control_line("judge"), "", "## 5. The rate grid: every rate's mean score on the tuning items", "",
              f"The grid is {', '.join(f'{r:g}' for r in s['rates'])}; a reader whose best rate was at its edge was "
              f"also tried one rate past it ({s['grown'][0]:g} or {s['grown'][1]:g}). The rate kept (bold) is the "
              f"best; one still at the edge of the rates tried is marked: a rate beyond it might do better.", "",
              "| part | reader | " + " | ".join(f"{rate:g}" for rate in columns) + " | kept |",
              "|---|---|" + "---|" * (len(columns) + 1)]
    kept = kept_rates(data["cells"])
    for (part, reader), rate in kept.items():
        cells = [c for c in data["cells"] if (c["part"], c["reader"]) == (part, reader) and "tuning" in c]
        by_rate = {x: [c["tuning"] for c in cells if c["learning rate"] == x] for x in columns}
        lines.append(f"| {part} | {reader} | " + " | ".join(
            ("-" if not v else (f"**{100 * np.mean(v):.1f}%**" if x == rate else f"{100 * np.mean(v):.1f}%"))
            for x, v in by_rate.items()) + f" | {rate_kept(data['cells'], part, reader)} |")
    head, *sections = "\n".join(lines).split("\n## ")  # only the sections of the parts run
    shown = {"1": {"probe"}, "2": {"retrieval", "flag-first"}, "3": {"reranking"}, "4": {"judge"},
             "5": set(PARTS) - {"probe"}}
    return "\n## ".join([head] + [text for text in sections if shown[text[0]] & set(data["parts"])])


def plot(data, path):
    plt = pyplot()
    if plt is None:
        return
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
    readers = [f"{name} ({how})" for name, how in BI_READERS]
    for offset, part in ((-0.2, "retrieval"), (0.2, "flag-first")):
        v = [kept_values(data, part, r, "recall@1") for r in readers]
        axes[0].bar(np.arange(len(readers)) + offset, [100 * np.mean(x) if x else 0 for x in v], 0.4,
                    yerr=[100 * np.std(x, ddof=1) if len(x) > 1 else 0 for x in v], capsize=3,
                    label="flag last" if part == "retrieval" else "flag first (control)")
    axes[0].axhline(100 * data["rules"]["retrieval"]["n-gram cosine"]["recall@1"], color="grey", linestyle=":",
                    label="n-gram cosine rule")
    axes[0].set_xticks(np.arange(len(readers)), readers, rotation=30, ha="right", fontsize=8)
    axes[0].set_title("bi-encoder retrieval: recall@1 (%) by reader and pooling")
    axes[0].legend(fontsize=7)
    readers = [f"{name} ({how})" for name, how in CROSS_READERS]
    for offset, (part, label) in ((-0.2, ("retrieval", "bi-encoder")), (0.2, ("reranking", "cross-encoder"))):
        v = [kept_values(data, part, r, "hits@1") for r in readers]
        axes[1].bar(np.arange(len(readers)) + offset, [100 * np.mean(x) if x else 0 for x in v], 0.4,
                    yerr=[100 * np.std(x, ddof=1) if len(x) > 1 else 0 for x in v], capsize=3, label=label)
    axes[1].axhline(100 * data["rules"]["retrieval"]["n-gram cosine"]["hits@1"], color="grey", linestyle=":",
                    label="n-gram cosine rule")
    axes[1].set_xticks(np.arange(len(readers)), readers, rotation=30, ha="right", fontsize=8)
    axes[1].set_title(f"reranking: hits@1 of {data['settings']['candidates']} (%)")
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    save(fig, path, dpi=110)
