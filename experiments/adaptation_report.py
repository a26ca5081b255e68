"""
How experiments/adaptation.py's runs and cells are read (claim G1; the reversal part, claim X4): the targets built
from gpt, the metrics each is scored on, the positive control (gpt continued reaches gpt from scratch), the verdicts
(ahead only where the mean +- std ranges do not overlap), and the tables and plot written from them. Nothing here
trains or measures: a result file can be rewritten from its JSON.
"""
import numpy as np

from experiments import reversal
from experiments.structural import SETTINGS
from experiments.study_report import mean_std, plus_minus
from infra.configurator import QUICK_NOTE
from infra.plots import pyplot, save
from infra.progress import format_flops

TARGETS = {  # name: (arch, objective, extra settings of the adaptation phase)
    "bert": ("bert", "mlm", {}),
    "diffusion": ("bert", "diffusion", {"shift_logits": True}),
    "t5": ("t5", "span_corruption", {}),
    "gpt": ("gpt", "clm", {}),  # the positive control: gpt continued, the same restart
}
METRICS = (("own", "own validation loss", "lower"), ("bits", "bits/char, 2nd half (diffusion: ELBO)", "lower"),
           ("cloze", "cloze", "higher"), ("tagging", "tagging probe", "higher"),
           ("retrieval", "retrieval recall@1", "higher"))
PUBLISHED = {
    "bert": "Gisserot-Boukhlef et al. 2025 (610M, 42K steps): 25% CLM then 75% MLM above MLM alone on every task "
            "family, by 0.3-5 points (retrieval +0.3, token classification +0.9, QA +5.0).",
    "diffusion": "Gong et al. 2024 (DiffuGPT): GPT-2 adapted into a masked-diffusion model beats diffusion models "
                 "trained from scratch on far more tokens; without the shift or the annealing it does worse.",
    "t5": "T5Gemma (2025): encoder-decoders adapted from Gemma 2 beat the decoder they came from; it does not train "
          "one from scratch at the same compute.",
}


# ----------------------------------------------------------------------------- the report

CONTINUATION_MARGIN = 0.03  # nats: how close gpt continued must come to gpt from scratch (the positive control)


def values(data, target, share, metric):
    """One row's values per seed: metric "own" from the runs, the others from the scoring cells."""
    if metric == "own":
        return [r["val_loss"] for r in data["runs"] if (r["target"], r["share"]) == (target, share)
                and r["val_loss"] is not None]
    return [c[metric] for c in data["cells"] if (c["target"], c["share"]) == (target, share) and metric in c]


def continuation_control(data, shares, seeds):
    """The positive control: gpt continued from each share reaches gpt from scratch (mean own validation loss at
    most CONTINUATION_MARGIN above it), every seed of both finished. Returns {"passed", "own": {share: mean}}."""
    gpt_own = {f: mean_std(values(data, "gpt", f, "own"))[0] for f in (0, *shares)}  # (a diverged seed: left out)
    return {"passed": all(None not in (gpt_own[f], gpt_own[0]) and gpt_own[f] <= gpt_own[0]
                          + CONTINUATION_MARGIN for f in shares) and len(values(data, "gpt", 0, "own"))
            == len(seeds) and all(len(values(data, "gpt", f, "own")) == len(seeds) for f in shares),
            "own": gpt_own}


def seed_differences(data, target, share):
    """A row's own validation loss minus the same target's from scratch, seed by seed (the seeds both have)."""
    own = {(r["share"], r["seed"]): r["val_loss"] for r in data["runs"] if r["target"] == target
           and r["val_loss"] is not None}
    return [own[share, seed] - own[0, seed] for (f, seed) in sorted(own) if f == share and (0, seed) in own]


def verdict(adapted, scratch, direction):
    """'adapted ahead', 'scratch ahead' or 'within noise': ahead only when the mean +- std ranges do not overlap."""
    (ma, sa), (ms, ss) = mean_std(adapted), mean_std(scratch)
    if ma is None or ms is None:
        return "-"
    low_a, high_a, low_s, high_s = ma - (sa or 0), ma + (sa or 0), ms - (ss or 0), ms + (ss or 0)
    better = (lambda a, b: a < b) if direction == "lower" else (lambda a, b: a > b)
    if (high_a < low_s or low_a > high_s) and better(ma, ms):
        return "adapted ahead"
    if high_a < low_s or low_a > high_s:
        return "scratch ahead"
    return "within noise"


def cell_text(data, target, share, metric):
    vs = values(data, target, share, metric)
    return plus_minus(vs, 1, percent=True) if metric in ("cloze", "tagging", "retrieval") else plus_minus(vs, 3)


def row_name(target, share):
    return f"{target}, from scratch" if share == 0 else f"{target}, from gpt at {share:g}"


def report(data):
    s, shares, budget = data["sizes"], data["shares"], data["budget_flops"]
    lines = [QUICK_NOTE, ""] if data["scale"] == "quick" else []
    lines += [f"Built from the decoder (claim G1), scale `{data['scale']}` (the study's {s['n_layer']} layers x "
              f"{s['n_embd']}; t5 {max(1, s['n_layer'] // 2)} + {max(1, s['n_layer'] // 2)}), every row "
              f"{format_flops(budget)} of training in all (the gpt phase counted), seeds "
              f"{', '.join(map(str, data['seeds']))}, on {data['machine']}; {data['seconds'] / 60:.1f} min for this "
              f"command. Mean +- std over seeds. The adaptation phase's rate: the study's grid, the one of lowest "
              f"mean own validation loss kept per row. Retrieval fine-tunes each reader at the rate encoders.py kept "
              f"for it from scratch ("
              + ", ".join(f"{t} {r:g}" for t, r in data["retrieval_rates"].items())
              + ("" if data["retrieval_rates_read"] else "; encoders.py has not run here: its grid's middle rate")
              + ").", "",
              "| row | rate kept | FLOPs (gpt + own) | " + " | ".join(label for _, label, _ in METRICS) + " |",
              "|---|---|---|" + "---|" * len(METRICS)]
    for target in TARGETS:
        if target == "gpt":
            continue
        for share in (0, *shares):
            runs = [r for r in data["runs"] if (r["target"], r["share"]) == (target, share)]
            flops = np.mean([r["gpt_flops"] for r in runs]), np.mean([r["flops"] for r in runs])
            lines.append(f"| {row_name(target, share)} | {runs[0]['rate']:g}"
                         + (" (edge)" if runs[0].get("edge") else "") + f" | "
                         f"{flops[0] / budget:.2f} + {flops[1] / budget:.2f} = {sum(flops) / budget:.2f} x | "
                         + " | ".join(cell_text(data, target, share, m) + (" \\*" if (m, target) == ("own", "diffusion")
                                                                          and share else "")
                                      for m, _, _ in METRICS) + " |")
    for metric, label, _ in METRICS[1:]:
        for rule, value in data["rules"][metric].items():
            cells = ["-"] * len(METRICS)
            cells[[m for m, _, _ in METRICS].index(metric)] = f"{value:.3f}" if metric == "bits" else \
                f"{100 * value:.1f}%"
            lines.append(f"| (rule) {rule} | - | - | " + " | ".join(cells) + " |")
    lines += ["", f"\\* the adapted diffusion model never masks position 0 (no position before it can score it), so "
                  f"its own loss averages one masked position in {s['block_size']} fewer (its plateau control is "
                  f"computed the same way): compare it on bits/char, the same for every row.", "",
              "Adapted against from scratch (ahead only where the mean +- std ranges do not overlap):", "",
              "| target | metric | " + " | ".join(f"from gpt at {f:g}" for f in shares) + " |",
              "|---|---|" + "---|" * len(shares)]
    for target in (t for t in TARGETS if t != "gpt"):
        for metric, label, direction in METRICS[1:]:
            lines.append(f"| {target} | {label} | " + " | ".join(
                verdict(values(data, target, f, metric), values(data, target, 0, metric), direction)
                for f in shares) + " |")
    control = data["control"]
    lines += ["", f"Positive control (gpt continued with its own objective for the rest of the budget reaches gpt "
                  f"from scratch: mean own validation loss at most {CONTINUATION_MARGIN} nats above it): "
                  + ("passed" if control["passed"] else
                     "**FAILED: a restart alone costs; adaptation is judged by its schedule**")
                  + f". gpt from scratch {plus_minus(values(data, 'gpt', 0, 'own'))}, "
              + ", ".join(f"continued from {f:g} {plus_minus(values(data, 'gpt', f, 'own'))}" for f in shares)
              + "; continued minus from scratch, per seed (nats): " + "; ".join(
                  f"from {f:g} " + ", ".join(f"{d:+.3f}" for d in seed_differences(data, "gpt", f)) for f in shares)
              + "."]
    past = [r for r in data["runs"] if r["past_plateau"]]
    lines += ["", f"Every backbone past the study's plateau control (own validation loss at least "
                  f"{data['plateau_control']['margin']:g} nats under its context-free reference): {len(past)} of "
                  f"{len(data['runs'])}" + ("" if len(past) == len(data["runs"]) else ": not past: " + ", ".join(
                      f"{row_name(r['target'], r['share'])} seed {r['seed']}" for r in data["runs"]
                      if not r["past_plateau"])) + ".", "",
              "Every rate of the adaptation grid (own validation loss, mean over seeds; kept in bold):", "",
              "| row | " + " | ".join(f"{r:g}" for r in data["rates_tried"]) + " |",
              "|---|" + "---|" * len(data["rates_tried"])]
    for key, by_rate in data["grid"].items():
        target, share = key.split("|")
        kept = data["kept"][key]
        lines.append(f"| {row_name(target, float(share))} | " + " | ".join(
            "-" if f"{r:g}" not in by_rate else (f"**{by_rate[f'{r:g}']:.3f}**" if r == kept else
                                                 f"{by_rate[f'{r:g}']:.3f}") for r in data["rates_tried"]) + " |")
    lines += ["", "Published, beside:"] + [f"- {t}: {text}" for t, text in PUBLISHED.items()]
    return lines


def plot(data, path):
    plt = pyplot()
    if plt is None:
        return
    panels = METRICS[1:]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 4))
    xs = [0, *data["shares"]]
    for axis, (metric, label, _) in zip(axes, panels):
        for target in (t for t in TARGETS if t != "gpt"):
            points = [mean_std(values(data, target, f, metric)) for f in xs]
            axis.errorbar(xs, [p[0] for p in points], yerr=[p[1] or 0 for p in points], marker="o", capsize=3,
                          label=target)
        for rule, value in data["rules"][metric].items():
            axis.axhline(value, linestyle="--", color="grey", linewidth=1)
        axis.set_xlabel("gpt's share of the budget (0 = from scratch)")
        axis.set_title(label + (" (dashed: rules)" if data["rules"][metric] else ""))
    axes[0].legend()
    fig.suptitle(f"Adapted from gpt against from scratch at equal FLOPs, scale {data['scale']}, "
                 f"{len(data['seeds'])} seeds")
    fig.tight_layout()
    save(fig, path, dpi=110)


# ----------------------------------------------------------------------------- the reversal task (claim X4)

def reversal_report(data):
    s, shares, budget = data["sizes"], data["shares"], data["budget_flops"]

    def runs_of(target, share):
        return [r for r in data["rows"] if (r["target"], r["share"]) == (target, share)]

    lines = [QUICK_NOTE, ""] if data["scale"] == "quick" else []
    lines += [f"The reversal task's backward half (claim X4) on models built from gpt (claim G1): reversal.py's text "
              f"and shape, scale `{data['scale']}` ({s['n_layer']} layers x {s['n_embd']}; t5 "
              f"{max(1, s['n_layer'] // 2)} + {max(1, s['n_layer'] // 2)}), {s['entities']} entities (half asked), "
              f"every row {format_flops(budget)} of training in all (the gpt phase counted; gpt's phase alone: its "
              f"share), every run at "
              f"reversal.py's one rate ({SETTINGS['learning_rate']:g}), seeds {', '.join(map(str, data['seeds']))}, "
              f"on {data['machine']}; {data['seconds'] / 60:.1f} min for this command. gpt trains on the text for a "
              f"share of the budget, then each target from its weights for the rest (as on the study's text). Exact "
              f"match of the answer, mean +- std over seeds (per character in brackets).", "",
              "| row | " + " | ".join(reversal.KINDS) + " | val loss (own objective) | FLOPs (gpt + own) |",
              "|---|" + "---|" * (len(reversal.KINDS) + 2)]
    failed = []
    for target in ("gpt", *(t for t in TARGETS if t != "gpt")):
        for share in (0, *shares):
            runs = runs_of(target, share)
            name = f"gpt alone at {share:g} (the others' start)" if target == "gpt" and share else \
                row_name(target, share)
            if not reversal.learned(runs):
                failed.append(name)
            flops = np.mean([r["gpt_flops"] for r in runs]) / budget, np.mean([r["flops"] for r in runs]) / budget
            lines.append(f"| {name} | " + " | ".join(reversal.cells(runs)) + f" | "
                         f"{plus_minus([r['val_loss'] for r in runs], 3)} | {flops[0]:.2f} + {flops[1]:.2f} = "
                         f"{sum(flops):.2f} x |")
    lines += reversal.rule_rows(data["baselines"], 3)
    lines += ["", "Positive control (the forward questions, the direction the text states, >= 90% exact in every "
                  "seed: the model learned the facts at this budget): "
              + (f"**not passed by {'; '.join(failed)}**: those rows decide nothing." if failed else "passed by every row."),
              "", "Adapted against from scratch, exact match (ahead only where the mean +- std ranges do not overlap; "
                  "'-': a row that failed the positive control):", "",
              "| target | question | " + " | ".join(f"from gpt at {f:g}" for f in shares) + " |",
              "|---|---|" + "---|" * len(shares)]
    for target in (t for t in TARGETS if t != "gpt"):
        for kind in ("backward", "backward, infill"):
            scratch = runs_of(target, 0)
            lines.append(f"| {target} | {kind} | " + " | ".join(
                verdict([r["eval"][kind][0] for r in runs_of(target, f)], [r["eval"][kind][0] for r in scratch],
                        "higher") if reversal.learned(scratch) and reversal.learned(runs_of(target, f)) else "-"
                for f in shares) + " |")
    lines += ["", f"Published, beside: {reversal.PUBLISHED}"]
    return lines
