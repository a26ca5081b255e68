"""
Question: how much more training compute does an objective other than next-token prediction need to reach what
gpt reaches at the study's budget (claim C1's "sample efficiency", measured rather than counted)?

    python experiments/multiplier.py --jobs=2                  # gpt at 0.25..1 x, bert and diffusion at 0.25..16 x,
                                                               # prefixlm and t5 at 0.25..2 x the study's budget, 3
                                                               # seeds -> multiplier-cpu.*: 120 minutes on 2 cores
                                                               # for the 6 runs at 16 x and the 12 of prefixlm and
                                                               # t5 off 1 x, two at a time (the runs up to 8 x
                                                               # reused: another 120 minutes, --largest=8, before)
    python experiments/multiplier.py --jobs=2 --largest=8      # up to 8 x
    python experiments/multiplier.py --quick                   # a smoke run in seconds (the suite runs it)

Every run is the study's (experiments/study.py): the same shape, data, position encoding and, for each model, the
learning rate the study's sweep kept (read from results/study/study-<scale>.json: run the study first). Its runs
at 0.25, 0.5 and 1 x are reused, not retrained (the same settings, the same folders); the larger budgets train
here, each with its schedule sized to its budget (a run finished earlier with the same settings is loaded). Each run is scored on metrics that both sides define, on the
study's held-out windows:
  - diffusion against gpt: bits/char of a window's second half given its first; gpt's is its exact NLL,
    diffusion's its ELBO (an upper bound on its NLL, so a diffusion model reaching gpt's figure is at least as good).
  - bert against gpt: bert has no density, so cloze accuracy (15% of characters blanked one at a time, both sides
    visible) against gpt's exact-Bayes cloze (every candidate scored by the window's likelihood; on the study's
    first bayes_windows windows for every reader, as that costs V passes a blank), and a
    next-character probe (a new linear head on each model's frozen final states of clean text, predicting the
    character after each position; gpt was trained for exactly that, bert never).
The multiplier of a run is the budget at which its curve first reaches gpt's 1 x figure (mean over seeds),
interpolated linearly in log(FLOPs) between the two budgets around the crossing (crossing(), tested on a hand-made
curve); a seed that never reaches it within the budgets trained says so ("> largest"). Set beside: claim C1's
count (bert is supervised on 15% of its positions: 1 / 0.15 = 6.7 x fewer targets per FLOP) and Nie et al. 2024
(arXiv 2410.18514: masked diffusion needs about 16 x an autoregressive model's compute for the same validation
loss, a gap they find constant over 6e18 to 1e20 FLOPs).
"""
import json
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # python experiments/multiplier.py
import infra.quiet_interrupts  # noqa: E402,F401  (before torch: a Ctrl-C while it loads ends quietly)

import numpy as np
import torch

import objectives
from experiments import metrics, study
from experiments.equal_compute import flops_budget, machine_line, resolve_experiment, write_results
from experiments.study_report import mean_std, plus_minus
from infra.configurator import QUICK_NOTE, UserError, run_main
from infra.dataset import get_windows, load_dataset
from infra.progress import StopSignals, format_duration, format_flops
from infra.plots import pyplot, save

DEFAULTS = dict(scale="cpu", quick=False, device="auto", dataset="shakespeare_char", out_dir="results/study",
                seed=1337, quiet=True,
                largest=16.0,  # the largest multiple of the study's budget to train (bert and diffusion)
                jobs=1)  # how many runs train at once (processes, one per core)
MULTIPLES = {"cpu": (0.25, 0.5, 1, 2, 4, 8, 16), "gpu": (0.25, 0.5, 1, 2, 4, 8), "quick": (0.5, 1, 1.5)}
GPT_LARGEST = 1  # gpt only sets the target (its 1 x figure) and its curve up to it
PREFIX_LARGEST = 2  # prefixlm and t5 (exact NLL, each already near gpt at 1 x): up to 2 x, what 2 cores afford
COMPARED = {"diffusion": ("second-half bits/char (gpt: exact NLL; diffusion: ELBO)", "elbo_bits", "lower"),
            "bert": ("cloze accuracy (gpt: exact Bayes; bert: both sides)", "cloze", "higher"),
            "prefixlm": ("second-half bits/char (both exact NLL)", "bits", "lower"),
            "t5": ("second-half bits/char (both exact NLL)", "bits", "lower")}
PROBE = "next-character probe accuracy"


def crossing(multiples, values, target, lower_is_better):
    """The multiple at which a curve (values at increasing multiples) first reaches `target`: interpolated
    linearly in log(multiple) between the last budget short of it and the first that reaches it; the first
    multiple if that already reaches it; None if none does."""
    reached = [(v <= target) if lower_is_better else (v >= target) for v in values]
    if not any(reached):
        return None
    first = reached.index(True)
    if first == 0:
        return multiples[0]
    (m0, v0), (m1, v1) = (multiples[first - 1], values[first - 1]), (multiples[first], values[first])
    share = (target - v0) / (v1 - v0)  # how far between the two budgets the curve meets the target
    return math.exp(math.log(m0) + share * (math.log(m1) - math.log(m0)))


def multipliers(by, seeds, trained_multiples):
    """Per compared model and metric: gpt's 1 x figure (mean over seeds: its exact bits against diffusion's ELBO)
    and each seed's crossing of it, read off that seed's own curve. by: runs_by_multiple."""
    rows = []
    for name, (label, metric, direction) in COMPARED.items():
        for metric_name, key, gpt_key in ((label, metric, "bits" if metric == "elbo_bits" else metric),
                                          *([(PROBE, "probe", "probe")] if name == "bert" else [])):
            target = float(np.mean([run[gpt_key] for run in by["gpt"]["1"]]))
            per_seed = []
            for seed in seeds:
                ms = trained_multiples[name]
                values = [next(run[key] for run in by[name][f"{m:g}"] if run["seed"] == seed) for m in ms]
                per_seed.append(crossing(ms, values, target, direction == "lower"))
            rows.append({"model": name, "metric": metric_name, "target": target, "per_seed": per_seed})
    return rows


def scores(name, model, windows, blanks, specials, s, probe_windows, seed):
    """The metrics one trained run is compared on (the module's docstring)."""
    b = s["bayes_windows"]  # gpt's exact-Bayes cloze reads these windows only: every reader is scored on them
    cloze = metrics.cloze_accuracy(name, model, windows[:b], blanks[:b], specials, b)
    out = {"cloze": cloze.get("both sides (exact Bayes)", cloze.get("both sides"))}
    if name != "bert":  # (bert's chain-rule bits are compared with nothing here: T/2 passes a window saved)
        bits, extra = metrics.second_half_bits(name, model, windows, specials, torch.Generator().manual_seed(seed))
        out.update(bits=bits, elbo_bits=extra.get("elbo_bits", bits))  # gpt's bits are exact: its own bound
    if name in ("gpt", "bert"):
        out["probe"] = metrics.correction_probe(model, *probe_windows, specials.num_ordinary, seed,
                                                task="next character")[0]
    return out


def report(data):
    s, multiples = data["sizes"], data["multiples"]
    control = data["plateau_control"]
    lines = [QUICK_NOTE, ""] if data["scale"] == "quick" else []
    lines += [f"The compute multiplier, scale `{data['scale']}` ({s['n_layer']} layers x {s['n_embd']}, "
              f"{data['position']} positions; the study's budget 1 x = {format_flops(data['budget_flops'])}), "
              f"seeds {', '.join(map(str, data['seeds']))}, each model at the study's kept rate "
              f"({', '.join(f'{n} {r:g}' for n, r in data['learning_rates'].items())}), on {data['machine']}; "
              f"{data['seconds'] / 60:.1f} min for this command ({data['reused']} of its {data['runs']} runs reused: "
              f"finished earlier with the same settings, by the study or by this command's own code). Cloze on the "
              f"first {s['bayes_windows']} evaluation windows for every reader (gpt's exact Bayes costs a forward "
              f"pass per candidate character). Every cell is mean +- std over the seeds; [k/n] = runs past the plateau control "
              f"(own validation loss at least {control['margin']:g} nats under its context-free reference: "
              + ", ".join(f"{n} {v:.3f}" for n, v in control["reference"].items())
              + " nats; experiments/metrics.py says how it "
              "is computed).", ""]
    header = "| model, metric | " + " | ".join(f"{m:g} x" for m in multiples) + " |"
    lines += [header, "|---|" + "---|" * len(multiples)]
    for name, metric, label in (("gpt", "bits", "bits/char (exact)"), ("diffusion", "elbo_bits", "bits/char (ELBO)"),
                                ("diffusion", "bits", "bits/char (chain rule with [MASK])"),
                                ("prefixlm", "bits", "bits/char (exact)"), ("t5", "bits", "bits/char (exact)"),
                                ("gpt", "cloze", "cloze (exact Bayes)"), ("bert", "cloze", "cloze (both sides)"),
                                ("gpt", "probe", PROBE), ("bert", "probe", PROBE)):
        cells = []
        for m in multiples:
            runs = data["runs_by_multiple"].get(name, {}).get(f"{m:g}")
            if not runs:
                cells.append("-")
                continue
            percent = metric in ("cloze", "probe")
            passed = sum(run["past_plateau"] for run in runs)
            cells.append(f"{plus_minus([run[metric] for run in runs], 1 if percent else 3, percent)} "
                         f"[{passed}/{len(runs)}]")
        lines.append(f"| {name}, {label} | " + " | ".join(cells) + " |")
    lines += ["", "Compute to reach gpt's 1 x figure (each seed's crossing, interpolated in log FLOPs; mean +- std "
                  "over the seeds that reached it):", "",
              "| model | metric | gpt at 1 x | multiple of the budget | seeds that reached it |", "|---|---|---|---|---|"]
    for row in data["multipliers"]:
        reached = [m for m in row["per_seed"] if m is not None]
        smallest = min(data["multiples_trained"][row["model"]])
        value = plus_minus(reached, 2) + " x" if reached else f"> {max(data['multiples_trained'][row['model']]):g} x"
        if reached and min(reached) == smallest:  # reached by the smallest budget trained: at most that
            value += f" (<= {smallest:g} x for {sum(m == smallest for m in reached)} seed(s))"
        if reached and len(reached) < len(row["per_seed"]):
            value += f" (the others: > {max(data['multiples_trained'][row['model']]):g} x)"
        lines.append(f"| {row['model']} | {row['metric']} | {row['target']:.3f} | {value} | "
                     f"{len(reached)}/{len(row['per_seed'])} |")
    lines += ["", "Set beside: claim C1's count. bert is supervised on 15% of its positions a step against gpt's "
                  "100%, so per FLOP it reads 1 / 0.15 = 6.7 x fewer targets; if learning were limited by targets "
                  "read, bert would need about 6.7 x the compute. Masked diffusion supervises half its positions on "
                  "average (t ~ U(0, 1)), a count of about 2 x. Nie et al. 2024 (arXiv 2410.18514) fit scaling laws "
                  "to masked diffusion and autoregressive models on SlimPajama and report that masked diffusion "
                  "needs about 16 x the compute of an autoregressive model for the same validation loss. See "
                  "docs/claims.md (C1) for how the numbers above compare."]
    if data.get("interrupted"):
        lines += ["", "**Interrupted: the multiples above are the ones whose runs all finished.**"]
    return lines


def plot(data, path):
    plt = pyplot()
    if plt is None:
        return
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    panels = ((axes[0], (("gpt", "bits"), ("diffusion", "elbo_bits"), ("prefixlm", "bits"), ("t5", "bits")),
               "bits/char, 2nd half (diffusion: ELBO)"),
              (axes[1], (("gpt", "cloze"), ("bert", "cloze")), "cloze accuracy (gpt exact Bayes)"),
              (axes[2], (("gpt", "probe"), ("bert", "probe")), PROBE))
    for axis, curves, label in panels:
        for name, metric in curves:
            by = data["runs_by_multiple"].get(name, {})
            xs = sorted(float(m) for m in by if by[m])
            if not xs:
                continue
            points = [mean_std([run[metric] for run in by[f"{m:g}"]]) for m in xs]
            axis.errorbar([m * data["budget_flops"] / 1e12 for m in xs], [p[0] for p in points],
                          yerr=[p[1] or 0 for p in points], marker="o", capsize=3, label=name)
        target = mean_std([run[curves[0][1]] for run in data["runs_by_multiple"]["gpt"]["1"]])[0]
        axis.axhline(target, color="grey", linestyle="--", label="gpt at 1 x")
        axis.set_xscale("log")
        axis.set_xlabel("training TFLOP")
        axis.set_ylabel(label)
        axis.legend()
    fig.suptitle(f"The compute multiplier, scale {data['scale']}, mean +- std over {len(data['seeds'])} seeds")
    fig.tight_layout()
    save(fig, path, dpi=110)


def main():
    config, scale, device = resolve_experiment(DEFAULTS, study.SCALES, "multiplier")
    s = study.SCALES[scale]
    largest = config["largest"]
    multiples = [m for m in MULTIPLES[scale] if isinstance(largest, (int, float)) and m <= largest]
    if 1 not in multiples:
        raise UserError(f"--largest={config['largest']}: the largest multiple of the budget to train, at least 1")
    study_json = os.path.join(config["out_dir"], f"study-{scale}.json")
    try:
        with open(study_json) as f:
            study_rates = json.load(f)
        rates = study_rates["chosen_learning_rate"]
    except (OSError, ValueError, KeyError, TypeError):
        raise UserError(f"{study_json} is missing or unreadable: the multiplier trains each model at the rate the "
                        f"study kept; run python experiments/study.py{' --quick' if scale == 'quick' else ''} "
                        f"--out_dir={config['out_dir']} first") from None
    t0 = time.perf_counter()
    splits, meta = load_dataset(config["dataset"], s["block_size"], prepare_if_missing=True)
    folder = os.path.join(config["out_dir"], "checkpoints", scale)
    seeds = [config["seed"] + i for i in range(s["seeds"])]
    by_name = {model[0]: model for model in study.MODELS}
    largest_of = {"gpt": GPT_LARGEST, "prefixlm": PREFIX_LARGEST, "t5": PREFIX_LARGEST}
    trained_multiples = {name: [m for m in multiples if m <= largest_of.get(name, math.inf)]
                         for name in ("gpt", "bert", "diffusion", "prefixlm", "t5")}
    def run_folder(name, m, seed):  # the study's own folder where the study trained this run
        if m == 1:
            return f"{folder}-lr{rates[name]:g}-seed{seed}-{name}"
        if name == "bert" and m == s["ablation_budget"] and rates["bert"] == study_rates.get("ablation_learning_rate"):
            return f"{folder}-ablation{m:g}-lr{rates[name]:g}-seed{seed}-{name}"  # claim C2's bert is this run
        return f"{folder}-budget{m:g}-seed{seed}-{name}"

    runs = {(name, m, seed): study.study_run(by_name[name], rates[name], seed, run_folder(name, m, seed), m)
            for m in multiples for name, ms in trained_multiples.items() if m in ms for seed in seeds}
    # (smallest budgets first: a stop leaves every model's curve complete up to the largest multiple finished)
    print(f"[multiplier] {len(runs)} runs: gpt at {', '.join(f'{m:g}' for m in trained_multiples['gpt'])} x, bert "
          f"and diffusion at {', '.join(f'{m:g}' for m in multiples)} x, prefixlm and t5 at "
          f"{', '.join(f'{m:g}' for m in trained_multiples['t5'])} x the study's budget, seeds "
          f"{', '.join(map(str, seeds))} (the study's finished runs are reused)", flush=True)
    trained = study.train_runs(runs, s, dict(config, reuse=True), device, meta)
    if trained is None:
        raise KeyboardInterrupt  # nothing is written: run_main says what is kept
    specials = objectives.Specials.from_meta(meta)
    control = metrics.plateau_control(splits, meta, s, [by_name[name] for name in trained_multiples])
    windows, blanks, rng = study.evaluation_windows(splits, s, config["seed"], device)
    T = windows.size(1)
    probe_windows = (get_windows(splits["train"], 8 * s["eval_windows"], T - 1, rng).to(device),  # the study's
                     get_windows(splits["val"], 4 * s["eval_windows"], T - 1, rng).to(device))
    data = {"scale": scale, "sizes": s, "position": s.get("position", "learned"), "seeds": seeds,
            "budget_flops": flops_budget(s, meta), "learning_rates": {n: rates[n] for n in trained_multiples},
            "multiples": multiples, "multiples_trained": trained_multiples, "plateau_control": control,
            "runs": len(runs), "reused": sum(bool(r.get("reused")) for r in trained.values()),
            "runs_by_multiple": {name: {} for name in trained_multiples}}
    started, interrupted = time.perf_counter(), False
    try:
        with StopSignals(immediate=True):
            for number, ((name, m, seed), result) in enumerate(sorted(trained.items(), key=lambda kv: kv[0][1])):
                if number and number % 6 == 0:
                    left = (time.perf_counter() - started) / number * (len(trained) - number)
                    print(f"[multiplier] scoring {number + 1}/{len(trained)}, ~{format_duration(left)} left",
                          flush=True)
                row = scores(name, result["model"].eval(), windows, blanks, specials, s, probe_windows, seed)
                row.update(seed=seed, val_loss=result["val_loss"], flops=result["flops"],
                           past_plateau=metrics.past_plateau(result["val_loss"], control, name))
                data["runs_by_multiple"][name].setdefault(f"{m:g}", []).append(row)
    except KeyboardInterrupt:
        interrupted = True
    if interrupted:
        raise KeyboardInterrupt  # scoring is minutes: a stop writes nothing (the trained runs are kept)
    data["multipliers"] = multipliers(data["runs_by_multiple"], seeds, trained_multiples)
    data.update(machine=machine_line(device, config), seconds=time.perf_counter() - t0)
    write_results(config["out_dir"], f"multiplier-{scale}", data, "\n".join(report(data)), plot)


if __name__ == "__main__":
    run_main(main, interrupted="the runs finished so far are kept: the same command goes on from them")
