"""
The equal-compute study's report (study.py): every table of study-<scale>.md and the plot, from the results dict
study.main collects (the same dict it writes as study-<scale>.json). Numbers are means +- sample std over seeds.
Also the line the experiments that fine-tune the study's checkpoints print about them (backbones_line: each one's
pretraining loss against the study's plateau control).
"""
import sys

if __name__ == "__main__":  # beside the commands, but not one: one line, not an import error
    sys.exit("study_report.py: a helper of study.py, not a command: "
             "experiments/README.md lists the commands")

import json
import math
import os

import numpy as np

from infra.configurator import QUICK_NOTE
from infra.progress import format_flops
from infra.plots import pyplot, save

LN2 = math.log(2)


def mean_std(values):
    """(mean, sample std) over seeds, ignoring missing values; std None for a single value, (None, None) for none."""
    values = [v for v in values if v is not None]
    if not values:
        return None, None
    return float(np.mean(values)), float(np.std(values, ddof=1)) if len(values) > 1 else None


def plus_minus(values, digits=3, percent=False):
    """'mean +- std' over seeds ('mean' alone for one value)."""
    mean, std = mean_std([100 * v if percent and v is not None else v for v in values])
    if mean is None:
        return "-"
    unit = "%" if percent else ""
    return f"{mean:.{digits}f}{unit}" + (f" +- {std:.{digits}f}" if std is not None else "")


def plateau_threshold(study_dir, scale):
    """The study's plateau control, {model: the validation loss a backbone must be under}, when study.py wrote it
    (finetune.py --study's own pretraining does not)."""
    path = os.path.join(study_dir, f"study-{scale}.json")
    try:
        with open(path) as f:
            return json.load(f)["plateau_control"]["threshold"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def backbones_line(data):
    """Each fine-tuned backbone's pretraining validation loss by seed, against the study's plateau control."""
    threshold = data.get("plateau_threshold") or {}
    out = []
    for model in dict.fromkeys(k.split(",")[0] for k in data["checkpoints"]):
        losses = [v["final_val_loss"] for k, v in data["checkpoints"].items() if k.startswith(model + ",")]
        line = f"{model} " + ", ".join(f"{v:.3f}" for v in losses)
        if model in threshold:
            past = sum(v <= threshold[model] for v in losses)
            line += f" (control {threshold[model]:.3f}: {past} of {len(losses)} past)"
        out.append(line)
    tail = "" if threshold else " (no plateau control recorded: experiments/study.py writes it)"
    return ("The backbones' own validation loss at the end of pretraining, by seed, against the study's plateau "
            "control (its own objective's context-free reference less the margin; a backbone above it learned no "
            "context and gives no verdict): " + "; ".join(out) + "." + tail)


def report(data, s, N, V):
    """The markdown of study-<scale>.md: every number is a mean +- std over the seeds unless it says otherwise."""
    budget, seeds = data["budget_flops"], data["seeds"]
    lines = [QUICK_NOTE, ""] if data["scale"] == "quick" else []
    lines += [f"Equal-compute study, scale `{data['scale']}` ({s['n_layer']} layers x {s['n_embd']} dims, block "
             f"{s['block_size']}, batch {s['batch_size']}), budget {format_flops(budget)} per model (= "
             f"{s['gpt_iters']} gpt iterations), on {data.get('machine', data['device'])}, {N} held-out windows. Every number is a "
             f"mean +- sample std over {len(seeds)} training seeds ({', '.join(map(str, seeds))}; the common metrics on "
             f"the same evaluation windows for all, the val loss on windows drawn by each run's seed) unless it says "
             f"otherwise. Whole run {data['seconds'] / 60:.1f} min here, training of its "
             f"{data.get('runs', 0)} runs {data.get('training_seconds', 0) / 60:.1f} min in all "
             f"({data.get('reused', 0)} of them reused from an earlier run of the same settings). t5 splits the "
             f"layers, {s['n_layer'] // 2 or 1} + {s['n_layer'] // 2 or 1}; every model has "
             f"{data.get('position', 'learned')} positions. gpt's exact-Bayes cloze uses the first "
             f"{min(N, s['bayes_windows'])} windows ({V} forward passes per blank), every other cloze all {N}. Each "
             f"model trains at its learning rate from the sweep below; the sweep's runs at that rate are the runs "
             f"here (the rate of lowest mean validation loss over the seeds: a small optimistic bias on every "
             f"model's val loss alike). 'in its own setting' is the validation loss of "
             f"the model's training objective (nats per supervised position: gpt next character, bert the 15% "
             f"corrupted positions, prefixlm the second half given the first, t5 its spans, diffusion its weighted "
             f"ELBO); it is the model's in-distribution score, comparable only between models of the same objective. "
             f"The common metric, bits/char of a window's second half given the first, is gpt's native task and far "
             f"from how bert (15% blanks) and t5 (short spans) were trained; cloze (15% of characters blanked one at a "
             f"time) is bert's. The last row is what character frequencies alone achieve.", ""]
    if not data["models"]["gpt"]["seeds"]:
        lines.append("(no model was scored)")
    if data["models"]["gpt"]["seeds"]:
        control = data["plateau_control"]
        lines += [f"Positive control, every run: past the plateau when its own validation loss is at least "
                  f"{control['margin']:g} nats under its objective's context-free reference: the loss, under the "
                  f"model's own objective, of the best predictor that reads only the input token at the position it "
                  f"predicts (character frequencies where that token is [MASK], a copy where bert leaves it "
                  f"unchanged, the sentinels' order for t5, the previous character for the causal objectives): "
                  + ", ".join(f"{name} {value:.3f}" for name, value in control["reference"].items())
                  + f" nats (character frequencies alone: {control['character_frequencies_nats']:.3f}). A row with a "
                  f"run that fails names it; its mean includes it.", "",
                  "| model | objective | lr | params | iters | supervised positions | train s | in its own setting "
                  "(val loss) | past the plateau | bits/char, 2nd half given 1st | cloze accuracy |",
                  "|" + "---|" * 11]
        for name, model in data["models"].items():
            runs = model["seeds"]
            if not runs:
                continue
            column = lambda key: [run[key] for run in runs]  # noqa: E731
            bits = plus_minus(column("second_half_bits_per_char"))
            if "elbo_bits" in runs[0]:
                bits += f" (ELBO {plus_minus(column('elbo_bits'))})"
            cloze = ", ".join(f"{kind} {plus_minus([run['cloze'][kind] for run in runs], 1, True)}"
                              for kind in runs[0]["cloze"])
            lines.append(f"| {name} | {model['objective']} | {model['learning_rate']:g} | "
                         f"{runs[0]['parameters'] / 1e6:.2f}M | {round(np.mean(column('iterations')))} | "
                         f"{round(np.mean(column('supervised_seen'))):,} | {plus_minus(column('seconds'), 0)} | "
                         f"{plus_minus(column('val_loss'))} | {plateau_cell(runs, 'seed')} | {bits} | {cloze} |")
        reference = data["unigram_reference"]
        lines.append(f"| character frequencies (reference) | - | - | - | - | - | - | "
                     f"{control['character_frequencies_nats']:.3f} | - | "  # (its val loss column: nats)
                     f"{reference['bits_per_char']:.3f} | {100 * reference['cloze']:.1f}% (always the most frequent) |")
        gpt, diffusion = data["models"]["gpt"]["seeds"], data["models"]["diffusion"]["seeds"]
        if gpt and diffusion:
            lines += ["", f"Validation loss as bits/char: gpt exact NLL "
                          f"{plus_minus([run['val_loss'] / LN2 for run in gpt])}, diffusion ELBO (an upper bound on its "
                          f"NLL) {plus_minus([run['val_loss'] / LN2 for run in diffusion])}."]
    if "sweep" in data:
        lines += sweep_table(data)
    if "budget" in data:
        lines += budget_table(data)
    if "ablation" in data:
        lines += ablation_table(data)
    if "nope" in data:
        nope_seeds = len(data["nope"]["causal, NoPE"])
        lines += ["", f"Claim D5, index lookup (`BOS d1..d8 SEP q -> d_q`, one answer token; {s['nope_steps']} steps, "
                      f"{nope_seeds} seeds; the last three rows are rules that ignore order, scored on the same "
                      f"examples):", "", "| model or rule | accuracy |", "|---|---|"]
        lines += [f"| {name} | {plus_minus(values, 1, True)} |" for name, values in data["nope"].items()]
    if "attention_rank" in data:
        lines += rank_table(data["attention_rank"], data["attention_rank_baselines"], s, min(16, N), seeds,
                            [run["second_half_bits_per_char"] for run in data["models"]["bert"]["seeds"]])
    if "attention_rank_small_head" in data:
        small = data["attention_rank_small_head"]
        lines += rank_table(small["ranks"], small["baselines"], s["small_head"], 16, seeds)
    if "not_done" in data:
        lines += ["", f"**Interrupted: not measured: {', '.join(data['not_done'])}.**"]
    return lines


def plateau_cell(runs, label):
    """'3/3', or '2/3; not: seed 1338 (3.130)': how many runs passed the positive control, naming those that did
    not. runs: dicts with val_loss, past_plateau and `label` (what names a run)."""
    behind = [run for run in runs if not run["past_plateau"]]
    return f"{len(runs) - len(behind)}/{len(runs)}" + ("; not: " + ", ".join(
        f"{label} {run[label]} ({'diverged' if run['val_loss'] is None else format(run['val_loss'], '.3f')})"
        for run in behind) if behind else "")


def sweep_table(data):
    """The learning-rate sweep: every rate of each model's grid, mean +- std of the validation loss over the
    seeds, how many runs passed the control, the rate kept."""
    seeds, control = data["seeds"], data["plateau_control"]
    rates = sorted({float(r) for by_rate in data["sweep"].values() for r in by_rate})
    lines = ["", f"Learning-rate sweep, seeds {', '.join(map(str, seeds))}, each rate at the full budget (min lr = rate "
                 f"/ 10, cosine, warmup 100 iterations or a tenth of a shorter run): validation loss on the model's own objective, mean +- std "
                 f"over the seeds, and [runs past the plateau]; * = the rate kept (lowest mean; chosen without "
                 f"looking at the common metrics). Every grid starts at the same rates; a kept rate at the edge of "
                 f"its model's grid added the next rate beyond it, so a kept rate is inside its grid unless marked "
                 f"*edge; - = not tried:", "",
             "| model | " + " | ".join(f"lr {r:g}" for r in rates) + " |", "|---|" + "---|" * len(rates)]
    for name, by_rate in data["sweep"].items():
        grid = sorted(float(r) for r in by_rate)
        cells = []
        for rate in rates:
            cell = by_rate.get(f"{rate:g}")
            if cell is None:
                cells.append("-")
                continue
            losses = cell["val_loss"]
            passed = sum(past is not None and past <= control["threshold"][name] for past in losses)
            text = ("diverged" if None in losses else plus_minus(losses)) + f" [{passed}/{len(losses)}]"
            if f"{rate:g}" == f"{data['chosen_learning_rate'][name]:g}":  # (a rate read back from its text)
                text += " *edge" if rate in (grid[0], grid[-1]) else " *"
            cells.append(text)
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def budget_table(data):
    """Claim C4's gap against compute: bits/char of the second half at each share of the budget, and each
    model's gap to gpt (paired by seed)."""
    shares = [f"{f:g}" for f in data["budget_fractions"]] + ["1"]
    budget = data["budget"]
    tflop = ", ".join(format_flops(float(f) * data['budget_flops']) for f in shares)
    lines = ["", f"Does the gap close with compute? bits/char of the second half given the first at "
                 f"{', '.join(shares)} x the budget ({tflop}), each model at the rate chosen at 1 x (the best "
                 f"rate of a shorter run may differ), its schedule sized to its budget; the gap to gpt is per seed, then mean +- std. Character frequencies: "
                 f"{data['unigram_reference']['bits_per_char']:.3f}.", "",
             "| model | " + " | ".join(f"{f} x budget" for f in shares) + " |", "|---|" + "---|" * len(shares)]
    for name in budget:
        lines.append(f"| {name} | " + " | ".join(plus_minus(budget[name][f]["second_half_bits_per_char"])
                                                 for f in shares) + " |")
        if budget[name][shares[0]]["elbo_bits"][0] is not None:
            lines.append(f"| {name} (ELBO) | " + " | ".join(plus_minus(budget[name][f]["elbo_bits"]) for f in shares)
                         + " |")
    threshold = data["plateau_control"]["threshold"]
    for name in budget:
        lines.append(f"| {name}: runs past the plateau | " + " | ".join(
            f"{sum(loss is not None and loss <= threshold[name] for loss in budget[name][f]['val_loss'])}/"
            f"{len(budget[name][f]['val_loss'])}" for f in shares) + " |")
    for name in budget:
        if name != "gpt":
            gaps = [[b - g for b, g in zip(budget[name][f]["second_half_bits_per_char"],
                                           budget["gpt"][f]["second_half_bits_per_char"])] for f in shares]
            lines.append(f"| {name} - gpt | " + " | ".join(plus_minus(gap) for gap in gaps) + " |")
    return lines


PROBE_TASKS = {"original at replaced": "the original character at a randomly replaced position (bert's own "
                                       "10%-random subtask; the 100%-[MASK] model never trained for it)",
               "next character": "the next character, from a clean input (a task neither model trained for)"}


def past_the_plateau(data):
    """Claim C2 compares the two models only where both learned: every seed of each past the study's positive
    control (its own validation loss under data["plateau_control"]["threshold"][name]). Returns (verdict, the names
    that are not past)."""
    threshold = data["plateau_control"]["threshold"]
    behind = [name for name, runs in data["ablation"]["models"].items()
              if not all(run["val_loss"] is not None and run["val_loss"] <= threshold[name] for run in runs)]
    return not behind, behind


def ablation_table(data):
    """Claim C2: where the input holds no [MASK], the built-in heads (an illustration) and new probes (the
    measurement), beside whether both models are past the plateau at all."""
    ablation, reference = data["ablation"], data["unigram_reference"]
    past, behind = past_the_plateau(data)
    margin = data["plateau_control"]["margin"]
    verdict = (f"yes: every seed of both at least {margin:g} nats under its context-free reference on its own "
               f"validation loss" if past else f"NO for {', '.join(behind)} (not {margin:g} nats under its "
               f"context-free reference in every seed): the comparison below is inconclusive")
    lines = ["", f"Claim C2: bert (80/10/10) against bert-100%-mask (every chosen position [MASK]), both at "
                 f"{data['ablation_budget']:g} x the budget and one learning rate, {data['ablation_learning_rate']:g} (the "
                 f"masking is the only difference). Past the "
                 f"plateau? {verdict}. Character frequencies: {reference['bits_per_char']:.3f} bits/char, cloze "
                 f"{100 * reference['cloze']:.1f}%.", "",
             "| model | val loss (own objective) | bits/char, 2nd half given 1st | cloze accuracy |", "|---|---|---|---|"]
    for name, runs in ablation["models"].items():
        lines.append(f"| {name} | {plus_minus([run['val_loss'] for run in runs])} | "
                     f"{plus_minus([run['second_half_bits_per_char'] for run in runs])} | "
                     f"{plus_minus([run['cloze']['both sides'] for run in runs], 1, True)} |")
    lines += ["", "Inputs with about 15% of characters replaced by a random one and no [MASK] anywhere (as at "
                  "fine-tuning). The models' own output heads (an illustration: the 100%-[MASK] model's never got a "
                  "loss at a non-[MASK] input, so it fails there by construction):", "",
              "| model | at [MASK] (same positions) | at replaced characters | at untouched characters |",
              "|---|---|---|---|"]
    for name, runs in ablation["own head"].items():
        lines.append(f"| {name} | " + " | ".join(plus_minus([run[kind] for run in runs], 1, True)
                                                 for kind in runs[0]) + " |")
    tasks = list(ablation["probe"])
    lines += ["", "The measurement: a new linear head on each model's frozen final states ([MASK]-free inputs of "
                  "training windows), scored on held-out windows (accuracy); the task names what it predicts: "
                  + "; ".join(f"*{task}*: {PROBE_TASKS[task]}" for task in tasks) + ".", "",
              "| states of | " + " | ".join(tasks) + " |", "|---|" + "---|" * len(tasks)]
    for name in ablation["probe"][tasks[0]]:
        lines.append(f"| {name} | " + " | ".join(plus_minus(ablation["probe"][task][name], 1, True) for task in tasks)
                     + " |")
    return lines


def rank_table(ranks, baselines, setting, windows_used, seeds, bits=None):
    """Markdown lines of claim D3's table: per layer, trained beside initialisation, with uniform attention (what
    the mask alone gives) and the share of the trained gpt-bert gap in effective rank that uniform attention
    already has. bits: bert's bits/char per seed, printed beside its per-seed numerical ranks (did that seed learn?)."""
    cell = lambda runs, layer: (f"{plus_minus([run[layer]['numerical'] for run in runs], 1)} / "  # noqa: E731
                                f"{plus_minus([run[layer]['effective'] for run in runs], 1)}")
    uniform = {kind: baselines[0][f"uniform {kind}"] for kind in ("causal", "bidirectional")}
    mask_gap = uniform["causal"]["effective"] - uniform["bidirectional"]["effective"]
    T = setting["block_size"] - 1
    lines = ["", f"Claim D3, attention rank (T = {T}, head size {setting['n_embd'] // setting['n_head']}, "
                 f"{setting['n_layer']} layers x {setting['n_embd']} dims; numerical rank / effective rank, each the "
                 f"mean over heads and {windows_used} windows, then mean +- std over seeds), trained beside the same "
                 f"models at initialisation. Uniform attention over the allowed keys (the mask alone, no learning) "
                 f"gives {uniform['causal']['numerical']:.1f} / {uniform['causal']['effective']:.1f} causal and "
                 f"{uniform['bidirectional']['numerical']:.1f} / {uniform['bidirectional']['effective']:.1f} "
                 f"bidirectional; the last column is that difference as a share of the trained gpt - bert gap in "
                 f"effective rank:", "",
             "| layer | gpt trained | gpt at init | bert trained | bert at init | the mask's share of the gap |",
             "|---|---|---|---|---|---|"]
    at_init = {name: [base[f"{name} at initialisation"] for base in baselines] for name in ("gpt", "bert")}
    for layer in range(len(ranks["gpt"][0])):
        gap = np.mean([run[layer]["effective"] for run in ranks["gpt"]]) - \
            np.mean([run[layer]["effective"] for run in ranks["bert"]])
        share = f"{100 * mask_gap / gap:.0f}%" if gap > 0 else "-"
        lines.append(f"| {layer} | {cell(ranks['gpt'], layer)} | {cell(at_init['gpt'], layer)} | "
                     f"{cell(ranks['bert'], layer)} | {cell(at_init['bert'], layer)} | {share} |")
    per_seed = "; ".join(
        f"seed {seeds[number]}: " + ", ".join(f"{layer['numerical']:.0f}" for layer in run)
        + (f" ({bits[number]:.3f} bits/char)" if bits else "") for number, run in enumerate(ranks["bert"]))
    lines += ["", f"bert's numerical rank per layer, per seed (of {T}): {per_seed}."]
    return lines


def plot(data, path):
    """Bits/char of the second half and cloze accuracy per model (mean, std as error bars), and the budget sweep,
    when matplotlib is installed."""
    plt = pyplot()
    if plt is None:
        return
    models = {name: model["seeds"] for name, model in data["models"].items() if model["seeds"]}
    names = list(models)
    fig, (left, middle, right) = plt.subplots(1, 3, figsize=(16, 4.5))
    bits = [mean_std([run["second_half_bits_per_char"] for run in models[n]]) for n in names]
    left.bar(names, [m for m, _ in bits], yerr=[sd or 0 for _, sd in bits], capsize=3)
    left.axhline(data["unigram_reference"]["bits_per_char"], color="grey", linestyle="--", label="character frequencies")
    left.set_ylabel("bits/char, second half given the first")
    left.tick_params(axis="x", rotation=30)
    left.legend()
    cloze = [(f"{n}: {kind}", mean_std([100 * run["cloze"][kind] for run in models[n]]))
             for n in names for kind in models[n][0]["cloze"]]
    middle.barh([c[0] for c in cloze], [c[1][0] for c in cloze], xerr=[c[1][1] or 0 for c in cloze], capsize=3)
    middle.set_xlabel("cloze accuracy (%)")
    if "budget" in data:
        shares = [f"{f:g}" for f in data["budget_fractions"]] + ["1"]
        for name, by_share in data["budget"].items():
            points = [mean_std(by_share[f]["second_half_bits_per_char"]) for f in shares]
            right.errorbar([float(f) * data["budget_flops"] / 1e12 for f in shares], [m for m, _ in points],
                           yerr=[sd or 0 for _, sd in points], marker="o", capsize=3, label=name)
        right.axhline(data["unigram_reference"]["bits_per_char"], color="grey", linestyle="--")
        right.set_xscale("log")
        right.set_xlabel("training TFLOP")
        right.set_ylabel("bits/char, second half")
        right.legend()
    fig.suptitle(f"Equal compute ({data['budget_flops'] / 1e12:.1f} TFLOP each), scale {data['scale']}, "
                 f"mean +- std over {len(data['seeds'])} seeds")
    fig.tight_layout()
    save(fig, path, dpi=120)
