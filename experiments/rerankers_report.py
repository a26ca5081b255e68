"""
How experiments/rerankers.py's cells are read (claims E3's reranker half, X1): each (task, reranker, reader) at the
rate kept for it (recipe.py: the best mean tuning hits@1 over seeds), the interaction task's effect control, and the
table and plot written from the cells. Nothing here trains or measures: a result file can be rewritten from its JSON.
"""
from experiments.recipe import kept_rates, kept_values, rate_grid, rate_kept
from experiments.study_report import backbones_line, mean_std, plus_minus
from infra.configurator import QUICK_NOTE
from infra.plots import pyplot, save

TASKS = ("flag", "detail")
KINDS = ("bi-encoder", "cross-encoder")


def readers(data):
    return list(dict.fromkeys(c["reader"] for c in data["cells"]))


def controls(data):
    """Per task and reader: does the cross-encoder beat its own bi-encoder (mean - std above the other's mean +
    std, at the rates kept)? The detail task's outcome is the effect control: some reader's cross-encoder wins."""
    out = {}
    for task in TASKS:
        for reader in readers(data):
            bi, cross = (kept_values(data, f"{task} {kind}", reader, "hits@1") for kind in KINDS)
            if not (bi and cross):
                continue
            (b, b_std), (c, c_std) = mean_std(bi), mean_std(cross)
            out[f"{task}, {reader}"] = {
                "bi-encoder": b, "cross-encoder": c,
                "cross-encoder wins": bool(c - (c_std or 0.0) > b + (b_std or 0.0)),
                "bi-encoder wins": bool(b - (b_std or 0.0) > c + (c_std or 0.0))}
    detail = [v for k, v in out.items() if k.startswith("detail,")]
    out["effect control passed"] = any(v["cross-encoder wins"] for v in detail)
    return out


def largest_budget(data):
    return data["settings"]["max_steps"]


def report(data):
    s, scale = data["settings"], data["scale"]
    pct = lambda v: plus_minus(v, 1, percent=True)  # noqa: E731
    lines = [QUICK_NOTE, ""] if scale == "quick" else []
    lines += [f"Rerankers as they are used (claims E3, X1), scale `{scale}`: the study's equal-FLOPs checkpoints "
              f"(experiments/study.py's scale `{s['study_scale']}`), one pretraining run per seed "
              f"({', '.join(map(str, data['seeds']))}); mean +- std over seeds, in %. Both rerankers rerank the same "
              f"lists, the n-gram cosine rule's top {s['candidates']} among every evaluation document, and learn "
              f"from the same examples: {s['queries_per_step']} training queries a step, each with its document "
              f"and {s['negatives']} hard negatives from its own first-stage list, one listwise cross-entropy (the "
              f"bi-encoder: cosine / {s['temperature']:g}; the cross-encoder: a linear head on the pooled pair, the "
              f"query first). Each trains until hits@1 on {data['task sizes']['flag']['tune']} tuning queries held "
              f"out of the training ones stops improving ({s['patience']} checks in a row without a better one, a "
              f"check every {s['check_every']} steps, at most {s['max_steps']} steps, the schedule decaying over "
              f"them; the weights of the best check kept), at each rate of the grid "
              f"{', '.join(f'{r:g}' for r in s['rates'])} (warmup over the first {100 * s['warmup']:.0f}%, a fresh "
              f"head at {s['head_learning_rate']:g}, a rate past an edge kept tried once); the rate kept is the one "
              f"of best mean tuning hits@1 over seeds. Steps and training FLOPs are each reranker's own, found by "
              f"validation. On {data['machine']}, {data['seconds'] / 60:.1f} min."
              + "".join(f" {note}" for note in data.get("notes", [])), "", backbones_line(data), ""]
    c = data["controls"]
    detail_rows = {k: v for k, v in c.items() if k.startswith("detail,")}
    if c["effect control passed"]:
        winners = [k.split(", ", 1)[1] for k, v in detail_rows.items() if v["cross-encoder wins"]]
        verdict = (f"**Effect control: passed.** On the interaction task the cross-encoder beats its own "
                   f"bi-encoder by more than both spreads for {', '.join(winners)}.")
    else:
        verdict = (f"**Effect control: not passed: no cross-encoder beats its bi-encoder on the interaction task, "
                   f"up to {largest_budget(data)} steps of training with early stopping** (the effect is not "
                   f"reproduced up to this budget; the plot shows each reranker's tuning hits@1 against the "
                   f"training FLOPs it spent).")
    for task, title, what in (
            ("flag", "the answer in one line (built for the bi-encoder)",
             f"documents of two {s['line']}-character lines and a last line A or B naming the one the document is "
             f"about; the query is that line"),
            ("detail", "near duplicates (built for interaction)",
             f"groups of {s['size']} near duplicates of a {s['length']}-character line, each with one letter changed "
             f"at its own place; the query is a {s['fragment']}-character piece of its document holding that letter")):
        sizes, example = data["task sizes"][task], data["examples"][task]
        lines += [f"## {title}", "", f"{what}. {sizes['train']} training queries, {sizes['eval']} evaluation queries. "
                  f"Example: query {example['query']!r}, its document {example['document']!r}.", "",
                  "| reader | reranker | hits@1 | by seed | rate kept | steps run | best step | training TFLOP |",
                  "|---|---|---|---|---|---|---|---|"]
        for reader in readers(data):
            for kind in KINDS:
                part = f"{task} {kind}"
                values = lambda key, scale=1.0: [scale * v for v in kept_values(data, part, reader, key)]  # noqa
                by_seed = ", ".join(f"{100 * v:.1f}%" for v in values("hits@1"))
                lines.append(f"| {reader} | {kind} | {pct(values('hits@1'))} | {by_seed} | "
                             f"{rate_kept(data['cells'], part, reader)}"
                             f" | {plus_minus(values('steps run'), 0)} | {plus_minus(values('best step'), 0)} | "
                             f"{plus_minus(values('flops', 1e-12), 2)} |")
        for rule, v in data["rules"][task].items():
            lines.append(f"| (rule) {rule} | - | {100 * v:.1f}% | - | - | - | - | - |")
        lines.append("")
        for reader in readers(data):
            row = c.get(f"{task}, {reader}")
            if row:
                word = ("the cross-encoder wins" if row["cross-encoder wins"] else "the bi-encoder wins" if
                        row["bi-encoder wins"] else "neither wins by more than the spreads")
                lines.append(f"- {reader}: {word} (bi-encoder {100 * row['bi-encoder']:.1f}%, cross-encoder "
                             f"{100 * row['cross-encoder']:.1f}%).")
        lines += ["", verdict, ""] if task == "detail" else [""]
    if data["prices"]:
        lines += ["## The price", "", f"Median ms to rerank one query's {s['candidates']} candidates, over "
                  f"{s['timing_repeats']} repeats, first seed, on this machine (the bi-encoder's documents encoded "
                  f"beforehand, once each).", "", "| reader | cross-encoder | bi-encoder | bi-encoder, one document "
                  "encoded once |", "|---|---|---|---|"]
        for reader, p in data["prices"].items():
            lines.append(f"| {reader} | {p['cross-encoder']:.2f} | {p['bi-encoder']:.2f} | "
                         f"{p['bi-encoder, encoding one document (once)']:.3f} |")
        lines.append("")
    lines += ["## The rate grid: every rate's mean tuning hits@1", ""]
    lines += rate_grid(data["cells"], "task and reranker")
    return "\n".join(lines)


def plot(data, path):
    """Per task: each reranker's tuning hits@1 at every check against the training FLOPs spent so far (the rate
    kept, one line per seed), the first stage's order as a line."""
    plt = pyplot()
    if plt is None:
        return
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
    kept = kept_rates(data["cells"])
    colours = {}
    for ax, task in zip(axes, TASKS):
        for reader in readers(data):
            for kind, style in zip(KINDS, ("--", "-")):
                part = f"{task} {kind}"
                colour = colours.setdefault((reader, kind), f"C{len(colours)}")
                cells = [cell for cell in data["cells"] if (cell["part"], cell["reader"]) == (part, reader)
                         and cell["learning rate"] == kept.get((part, reader))]
                for k, cell in enumerate(cells):
                    flops, score = [x[2] for x in cell["checks"]], [100 * x[1] for x in cell["checks"]]
                    ax.plot(flops, score, style, color=colour, marker="o", markersize=3,
                            label=f"{reader}, {kind}" if k == 0 else None)
        ax.axhline(100 * data["rules"][task]["n-gram cosine (the first stage's order)"], color="grey",
                   linestyle=":", label="n-gram rule (first stage)")
        ax.axhline(100 * data["rules"][task]["chance among the list"], color="black", linestyle=":", linewidth=0.8,
                   label="chance among the list")
        ax.set_xscale("log")
        ax.set_xlabel("training FLOPs spent (fine-tuning)")
        ax.set_ylabel("tuning hits@1 (%)")
        ax.set_title({"flag": "flag task (answer in one line)", "detail": "near duplicates (interaction)"}[task])
        ax.legend(fontsize=7)
    fig.tight_layout()
    save(fig, path, dpi=110)
