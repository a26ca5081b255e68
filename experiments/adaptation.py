"""
Question: at equal total training FLOPs, is an encoder, a masked-diffusion model or an encoder-decoder better
trained from scratch or made from a trained gpt, as recent work makes them (claim G1)?

    python experiments/adaptation.py --jobs=2   # both parts below, the reversal task first: 70.2 minutes on
                                                # 2 cores of an AMD EPYC, alone, 23.3 of them training study.py's
                                                # runs, which a machine where study.py ran reuses (then 47)
    python experiments/adaptation.py --part=study --jobs=2   # 3 targets x 3 rates x 3 seeds of adaptation
                                                # (one more rate past an edge), the gpt continuation control, then
                                                # every kept backbone scored -> results/study/adaptation-cpu.{md,
                                                # json,png}: 33.4 minutes there (33 runs of adaptation, 60 scoring
                                                # cells), 56.8 with the study's 15 from-scratch runs and its gpt at
                                                # half the budget trained first
    python experiments/adaptation.py --part=reversal --jobs=2   # the reversal task (claim X4) built from its
                                                # own gpt: 24 runs -> results/study/adaptation-reversal-cpu.md:
                                                # 13.4 minutes there
    python experiments/adaptation.py --quick    # a smoke run in seconds (the test suite runs it) -> out-quick/

Two phases share the study's budget (experiments/study.py's FLOPs for one model). First gpt trains for a share f of
it (SCALES' shares: f = 0.5 at scale cpu, 0.25 and 0.5 at scale gpu; the study's own gpt runs at those budgets,
reused); then each target trains from gpt's weights (infra/adaptation.py says which module gets which) for the
rest, 1 - f, so both phases add up to the budget:
    bert       MLM (15%, 80/10/10), bidirectional from its first step: CLM then MLM (Gisserot-Boukhlef et al.
               2025, arXiv 2507.00994)
    diffusion  masked diffusion (1/t-weighted ELBO), its attention opened from causal to full over the first 10%
               of its steps (masks.annealed_mask) and its outputs shifted (position i - 1 scores token i), so
               that gpt's head keeps its alignment (DiffuGPT: Gong et al. 2024, arXiv 2410.17891)
    t5         span corruption; each stack gpt's lower blocks, the cross-attention copied from the self-attention
               (T5Gemma, arXiv 2504.06225, at the parameter count of the t5 it is compared with)
against the same three trained from scratch for the whole budget (the study's runs, experiments/finetune.py's
study_backbones). The adaptation phase gets the study's own effort: every rate of the study's grid on every seed,
the rate of lowest mean validation loss (own objective) kept per target and share, one rate past an edge kept.
Positive control: gpt continued with its own objective for the rest of the budget (the same restart, warmup and
decay) must reach the gpt trained from scratch for the whole budget; if a restart alone cost much, adaptation would
be judged by its schedule. Every backbone must be past the study's plateau control.

Each kept backbone is scored on what it is for, beside the rules a trivial reader reaches on the same scoring:
  - the study's common metrics (bits/char of a window's second half: diffusion's ELBO, t5's exact NLL; cloze
    accuracy, both sides visible) and the character-frequency rule;
  - right-context tagging (claim B1, experiments/tagging.py's labels): a probe on the frozen states, balanced
    accuracy averaged over the three labels, beside the n-gram rules that read the prefix and both sides;
  - bi-encoder retrieval (claim E3, experiments/encoders.py's part 2): fine-tuned at the rate encoders.py kept
    for that architecture's reader from scratch (so the rate favours scratch, if anything), recall@1, beside the
    n-gram cosine rule.
A difference is called only when the two rows' mean +- std over seeds do not overlap.

The reversal task's backward half (claim X4) needs its own text, so it has its own gpt: reversal.py's text, shape
and recipe (one rate for every model, as reversal.py trains them; 3 seeds), gpt trained on it for the same share
of reversal.py's budget, then bert, diffusion and t5 from that gpt as above for the rest, against the same from
scratch; asked the evaluation half's questions beside reversal.py's rules. Positive control per row: the forward
questions (the direction the text states) answered in >= 90% of cases in every seed, or the row decides nothing.
How the runs are read (the verdicts, the tables, the plot): experiments/adaptation_report.py.
"""
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # python experiments/adaptation.py
import infra.quiet_interrupts  # noqa: E402,F401  (before torch: a Ctrl-C while it loads ends quietly)

import numpy as np
import torch

import objectives
from experiments import encoders, metrics, reversal, study, tagging
from experiments.adaptation_report import (TARGETS, continuation_control, plot, report, reversal_report,
                                          row_name)
from experiments.equal_compute import flops_budget, machine_line, resolve_experiment, train_all, write_results
from experiments.finetune import Backbone, study_backbones
from experiments.recipe import finished_cells, kept_rates
from experiments.structural import SETTINGS, compared_models, run_record
from experiments.tasks import read_texts
from infra.checkpoint import load_model
from infra.configurator import UserError, check_input_folder, run_main
from infra.dataset import load_dataset
from infra.progress import StopSignals, check_writable, format_duration, format_flops

DEFAULTS = dict(scale="cpu", quick=False, device="auto", dataset="shakespeare_char", out_dir="results/study",
                encoders_dir="results/structural",  # where encoders.py wrote the retrieval rates it kept
                seed=1337, quiet=True,
                jobs=1,  # how many runs train (and backbones are scored) at once, in processes
                part="all")  # "study": the study's text alone; "reversal": the reversal task alone
SCALES = {  # the study's scale read; shares: gpt's share of the budget before adaptation; anneal: of the steps
    "cpu": dict(study_scale="cpu", shares=(0.5,), anneal=0.1),  # (0.25, 0.5): twice the adaptation runs
    "gpu": dict(study_scale="gpu", shares=(0.25, 0.5), anneal=0.1),
    "quick": dict(study_scale="quick", shares=(0.5,), anneal=0.1),
}
SHIFTED = ("diffusion from gpt", "bert", "diffusion", {"shift_logits": True})  # its plateau control's objective


# ----------------------------------------------------------------------------- the runs

def adaptation_run(target, share, rate, seed, prefix, gpt_folder, s, ss, base=None):
    """One run of the adaptation phase for train_all: target from gpt_folder's weights, 1 - share of the budget
    (ss: the scale of the runs; base: settings under the target's own)."""
    arch, objective, extra = TARGETS[target]
    extra = dict(base or {}, **extra)
    if objective == "diffusion":  # steps of the phase: a bert step costs a gpt step (same tokens, same weights)
        extra["anneal_steps"] = max(1, round(s["anneal"] * (1 - share) * ss["gpt_iters"]))
    return (f"{target} from gpt at {share:g}, lr {rate:g}, seed {seed}", arch, objective,
            dict(extra, init_from=gpt_folder, learning_rate=rate, min_lr=rate / 10, seed=seed,
                 out_dir=f"{prefix}-adapt{share:g}-lr{rate:g}-seed{seed}-{target}", budget_fraction=1 - share))


def mean_val(results, key_of, rate, seeds):
    losses = [results[key_of(rate, seed)]["val_loss"] for seed in seeds]
    return float("inf") if None in losses else float(np.mean(losses))


def lowest_mean_rates(grids, results, seeds):
    """{(target, share): the rate of its grid of lowest mean validation loss over the seeds (mean_val)}."""
    return {(t, f): min(grid, key=lambda r: mean_val(results, lambda r, seed: (t, f, r, seed), r, seeds))
            for (t, f), grid in grids.items()}


def forget_if_stale(run, gpt_folder):
    """A finished adaptation run is reused only if the gpt it started from has not been trained again since."""
    record = os.path.join(run[3]["out_dir"], "study_run.json")
    if os.path.exists(record) and os.path.getmtime(os.path.join(gpt_folder, "ckpt.pt")) > os.path.getmtime(record):
        os.remove(record)


def adapt_all(s, ss, seeds, shares, gpt_folders, rates, prefix, config, device, meta):
    """Every target at every rate of the study's grid (gpt's control at its study rate only), every share and seed;
    a kept rate at the grid's edge gets the rate beyond it, up to ss["rate_extensions"] times, as in the study.
    Returns ({(target, share, rate, seed): summary}, {(target, share): kept rate}), or None when interrupted."""
    grids = {(t, f): ([rates["gpt"]] if t == "gpt" else sorted(ss["learning_rates"])) for t in TARGETS for f in shares}
    results, new = {}, dict(grids)
    for round_number in range(ss["rate_extensions"] + 1):
        runs = {(t, f, r, seed): adaptation_run(t, f, r, seed, prefix, gpt_folders[(f, seed)], s, ss)
                for (t, f), grid in new.items() for r in grid for seed in seeds}
        for (t, f, r, seed), run in runs.items():
            forget_if_stale(run, gpt_folders[(f, seed)])
        print(f"[adaptation] {'the grid' if not round_number else 'a rate past an edge'}: {len(runs)} runs",
              flush=True)
        trained = study.train_runs(runs, ss, dict(config, reuse=True), device, meta, divergence_is_a_result=True)
        if trained is None:
            return None
        results.update(trained)
        kept = lowest_mean_rates(grids, results, seeds)
        for (t, f), rate in kept.items():
            if mean_val(results, lambda r, seed: (t, f, r, seed), rate, seeds) == float("inf"):
                raise UserError(f"{t} from gpt at {f:g}: a seed diverged at every rate tried "
                                f"({', '.join(f'{r:g}' for r in grids[(t, f)])}); give SCALES['{s['study_scale']}'] "
                                f"in experiments/study.py lower learning_rates")
        beyond = study.next_rates(grids, {k: r for k, r in kept.items() if k[0] != "gpt"}, ss["rate_step"])
        if not beyond or round_number == ss["rate_extensions"]:
            return results, kept
        new = beyond
        for k, r in beyond.items():
            grids[k] = sorted(grids[k] + r)


def last_val_loss(folder):
    """A run's validation loss at its last evaluation (log.jsonl), the same field for every row."""
    with open(os.path.join(folder, "log.jsonl")) as f:
        return [json.loads(line) for line in f if "val_loss" in line][-1]["val_loss"]


def study_rates(out_dir, scale):
    """The rates the study's sweep kept ({name: rate}), 1e-3 each if it has not run (finetune's fallback)."""
    try:
        with open(os.path.join(out_dir, f"study-{scale}.json")) as f:
            return {name: float(rate) for name, rate in json.load(f)["chosen_learning_rate"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {name: 1e-3 for name in ("gpt", "bert", "prefixlm", "t5", "diffusion")}


def retrieval_rates(encoders_dir, scale):
    """The rate encoders.py kept for each reader's retrieval ({target: rate}), or, where encoders.py has not run
    (no file), its grid's middle rate. A file that is there but cannot be read is one line, before any work."""
    path = os.path.join(encoders_dir, f"encoders-{scale}.json")
    try:
        with open(path) as f:
            kept = kept_rates(json.load(f)["cells"])
    except FileNotFoundError:
        kept = {}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise UserError(f"{path} is damaged ({type(e).__name__}): run python experiments/encoders.py again, or "
                        f"delete it (the grid's middle rate is used where encoders.py has not run)") from None
    middle = sorted(encoders.SCALES[scale]["rates"])[len(encoders.SCALES[scale]["rates"]) // 2]
    return {t: kept.get(("retrieval", f"{t} (mean)"), middle) for t in TARGETS if t != "gpt"}, bool(kept)


# ----------------------------------------------------------------------------- scoring a backbone

WORKER = {}  # what the scoring cells read: set here, or in each worker process by prepare


def prepare(dataset, seed, scale, folders, device, rates):
    """The evaluation windows, the tagging windows and the retrieval task (all from the seed: the same items in
    every process), and the backbones' folders."""
    ss = study.SCALES[SCALES[scale]["study_scale"]]
    splits, meta = load_dataset(dataset, ss["block_size"], prepare_if_missing=True)
    windows, blanks, _ = study.evaluation_windows(splits, ss, seed, device)
    texts, ts = read_texts(dataset), tagging.SCALES[scale]
    rng = np.random.default_rng(seed)  # tagging.py's windows, drawn as it draws them
    train = (texts["train"], *tagging.windows_of(texts["train"], ts["train_windows"], ts["window"], rng))
    evaluation = (texts["val"], *tagging.windows_of(texts["val"], ts["eval_windows"], ts["window"], rng))
    WORKER.update(ss=ss, meta=meta, windows=windows, blanks=blanks, tagging=(train, evaluation),
                  task=encoders.make_tasks(texts, encoders.SCALES[scale], seed), scale=scale, folders=folders,
                  device=device, rates=rates, splits=splits)


def run_cell(cell, stop=False):
    """cell: (kind, target, share, seed); share 0 = from scratch. Returns (cell, {metric: value})."""
    kind, target, share, seed = cell
    folder, device, scale = WORKER["folders"][(target, share, seed)], WORKER["device"], WORKER["scale"]
    torch.manual_seed(seed)
    if kind == "common":
        model, _ = load_model(os.path.join(folder, "ckpt.pt"), device)
        windows, blanks, b = WORKER["windows"], WORKER["blanks"], WORKER["ss"]["bayes_windows"]
        specials = objectives.Specials.from_meta(WORKER["meta"])
        cloze = metrics.cloze_accuracy(target, model, windows[:b], blanks[:b], specials, b)  # (multiplier's)
        bits, extra = metrics.second_half_bits(target, model, windows, specials, torch.Generator().manual_seed(seed))
        return cell, {"bits": extra.get("elbo_bits", bits),  # diffusion: its ELBO, as the study compares it
                      "cloze": cloze.get("both sides (exact Bayes)", cloze.get("both sides"))}
    backbone = Backbone(folder, device)
    if kind == "tagging":
        train, evaluation = WORKER["tagging"]
        ts = tagging.SCALES[scale]
        scores = tagging.run_cell(backbone, "states", "probe", train, evaluation, ts["window"], seed, ts, stop)
        return cell, {"tagging": float(np.mean(scores)), "per label": scores}
    es = dict(encoders.SCALES[scale], learning_rate=WORKER["rates"][target])
    out = encoders.run_one("retrieval", backbone, "mean", WORKER["task"], es, seed, stop)
    return cell, {"retrieval": out["recall@1"]}


def rules(splits, meta, scale, seed):
    """What trivial readers reach under each scoring."""
    ss = study.SCALES[SCALES[scale]["study_scale"]]
    windows, blanks, _ = study.evaluation_windows(splits, ss, seed, "cpu")
    b, V = ss["bayes_windows"], objectives.Specials.from_meta(meta).num_ordinary  # cloze reads the first b windows
    cloze = metrics.unigram_reference(splits["train"], windows[:b], blanks[:b], V)["cloze"]
    bits = metrics.character_frequency_bits(splits["train"], windows, V)
    train, evaluation = WORKER["tagging"]
    window = tagging.SCALES[scale]["window"]
    out = {"bits": {"character frequencies": bits}, "cloze": {"the most frequent character": cloze}}
    out["tagging"] = {f"n-gram of {sides}": float(np.mean(tagging.best_rule(train, evaluation, window, sides)[0]))
                      for sides in ("the prefix", "both sides")}
    out["retrieval"] = {"n-gram cosine": encoders.rules(WORKER["task"], parts=("retrieval",))["retrieval"]
                        ["n-gram cosine"]["recall@1"]}
    return out


# ----------------------------------------------------------------------------- scoring against the plateau

def past_plateau_of(run, control):
    """A backbone's plateau control: the diffusion model built from gpt (shifted outputs, position 0 never masked)
    against SHIFTED's reference, every other row against its own target's."""
    shifted = run["target"] == "diffusion" and run["share"]
    return metrics.past_plateau(run["val_loss"], control, SHIFTED[0] if shifted else run["target"])


# ----------------------------------------------------------------------------- the reversal task (claim X4)

def reversal_runs(work, seeds, shares, s, rs):
    """The reversal task's runs, reversal.py's recipe (rotary positions, one rate for every model): ({key: run} of
    the first phase, {key: run} of the second). Key (target, share, seed): share 0, from scratch for the whole
    budget; gpt at a share, the gpt phase; the others at a share, adapted from that gpt for the rest."""
    models = {m[0]: m for m in compared_models(None) if m[0] in TARGETS}
    first = {(name, 0, seed): (f"{name}, seed {seed}", arch, objective,
                               dict(extra, seed=seed, out_dir=os.path.join(work, f"seed{seed}-{name}")))
             for name, (_, arch, objective, extra) in models.items() for seed in seeds}
    first.update({("gpt", f, seed): (f"gpt at {f:g}, seed {seed}", "gpt", "clm", dict(
        models["gpt"][3], seed=seed, budget_fraction=f, out_dir=os.path.join(work, f"budget{f:g}-seed{seed}-gpt")))
        for f in shares for seed in seeds})
    second = {(t, f, seed): adaptation_run(t, f, SETTINGS["learning_rate"], seed, os.path.join(work, "from"),
                                           first[("gpt", f, seed)][3]["out_dir"], s, rs, base=SETTINGS)
              for t in TARGETS if t != "gpt" for f in shares for seed in seeds}
    return first, second


def reversal_part(config, scale, device):
    """The backward half of the reversal task (reversal.py's text and shape) for the targets built from a gpt trained
    on that text, against the same from scratch. Writes out_dir/adaptation-reversal-<scale>.{md,json}."""
    s, rs = SCALES[scale], reversal.SCALES[scale]
    t0 = time.perf_counter()
    work = os.path.join(config["out_dir"], "checkpoints", f"reversal-{scale}")
    entities, train_half, eval_half, stoi, folders = reversal.prepare_task(config["seed"], scale, work)
    _, meta = load_dataset(folders["data"], rs["block_size"], prepare_if_missing=False)
    seeds = [config["seed"] + k for k in range(rs["seeds"])]
    first, second = reversal_runs(work, seeds, s["shares"], s, rs)
    for key, run in second.items():
        forget_if_stale(run, first[("gpt", key[1], key[2])][3]["out_dir"])
    results = {}
    for phase, runs in (("from scratch, and gpt's phase", first), ("built from gpt", second)):
        print(f"[adaptation] reversal task, {phase}: {len(runs)} runs", flush=True)
        trained, _ = train_all(list(runs.values()), rs, folders["data"], "", device, meta, config["seed"],
                               config["quiet"], reuse=True, again="the same command reuses them", jobs=config["jobs"])
        if trained is None:
            raise KeyboardInterrupt  # run_main: the finished runs are kept
        results.update({key: trained[run[0]] for key, run in runs.items()})
    print(f"[adaptation] reversal task: asking {len(results)} models", flush=True)
    specials, rows = objectives.Specials.from_meta(meta), []
    with StopSignals(immediate=True):
        for (target, share, seed), result in results.items():
            gpt_phase = results[("gpt", share, seed)]["flops"] if share and target != "gpt" else 0.0
            rows.append({"target": target, "share": share, "seed": seed, **run_record(result), "gpt_flops": gpt_phase,
                         **reversal.score(result, entities, train_half, eval_half, specials, stoi)})
    data = {"scale": scale, "sizes": rs, "seeds": seeds, "shares": list(s["shares"]), "rows": rows,
            "budget_flops": flops_budget(rs, meta), "baselines": reversal.rule_baselines(entities, eval_half),
            "machine": machine_line(device, config), "seconds": time.perf_counter() - t0}
    write_results(config["out_dir"], f"adaptation-reversal-{scale}", data, "\n".join(reversal_report(data)))


# ----------------------------------------------------------------------------- the experiment

def study_part(config, scale, device):
    """The study's text: every target adapted at every rate of the study's grid, the control, every kept backbone
    scored. Writes out_dir/adaptation-<scale>.{md,json,png}."""
    s = SCALES[scale]
    ss = study.SCALES[s["study_scale"]]
    t0 = time.perf_counter()
    splits, meta = load_dataset(config["dataset"], ss["block_size"], prepare_if_missing=True)
    seeds, shares = [config["seed"] + k for k in range(ss["seeds"])], s["shares"]
    prefix = os.path.join(config["out_dir"], "checkpoints", s["study_scale"])
    rates = study_rates(config["out_dir"], s["study_scale"])
    budget = flops_budget(ss, meta)
    print(f"[adaptation] 1/4 from scratch: the study's runs at the whole budget ({format_flops(budget)})", flush=True)
    scratch, _ = study_backbones(config, s["study_scale"], device, seeds)
    print(f"[adaptation] 2/4 gpt's phase: the study's gpt at {', '.join(f'{f:g}' for f in shares)} of the budget",
          flush=True)
    gpt = next(m for m in study.MODELS if m[0] == "gpt")
    gpt_runs = {(f, seed): study.study_run(gpt, rates["gpt"], seed, f"{prefix}-budget{f:g}-seed{seed}-gpt", f)
                for f in shares for seed in seeds}
    gpt_trained = study.train_runs(gpt_runs, ss, dict(config, reuse=True), device, meta)
    if gpt_trained is None:
        raise KeyboardInterrupt  # run_main: the finished runs are kept
    print("[adaptation] 3/4 the adaptation phase: every target from gpt's weights, the rest of the budget",
          flush=True)
    adapted = adapt_all(s, ss, seeds, shares, {k: run[3]["out_dir"] for k, run in gpt_runs.items()}, rates, prefix,
                        config, device, meta)
    if adapted is None:
        raise KeyboardInterrupt
    results, kept = adapted
    control = metrics.plateau_control(splits, meta, ss, [m for m in study.MODELS if m[0] in TARGETS]
                                      + [SHIFTED])  # the adapted diffusion model's own loss keeps position 0
    runs, folders = [], {}
    for target in TARGETS:
        for seed in seeds:
            folder = scratch[(target, seed)]
            checkpoint = torch.load(os.path.join(folder, "ckpt.pt"), map_location="cpu", weights_only=False)
            folders[(target, 0, seed)] = folder
            runs.append({"target": target, "share": 0, "seed": seed, "rate": checkpoint["config"]["learning_rate"],
                         "val_loss": last_val_loss(folder), "flops": checkpoint["flops_done"], "gpt_flops": 0.0})
            for f in shares:
                r = results[(target, f, kept[(target, f)], seed)]
                folders[(target, f, seed)] = r["out_dir"]
                tried = sorted({k[2] for k in results if k[:2] == (target, f)})
                runs.append({"target": target, "share": f, "seed": seed, "rate": kept[(target, f)],
                             "edge": len(tried) > 1 and kept[(target, f)] in (tried[0], tried[-1]),
                             "val_loss": last_val_loss(r["out_dir"]), "flops": r["flops"],
                             "gpt_flops": gpt_trained[(f, seed)]["flops"]})
    for run in runs:
        run["past_plateau"] = past_plateau_of(run, control)
    retrieval, read = retrieval_rates(config["encoders_dir"], scale)
    arguments = (config["dataset"], config["seed"], scale, folders, device, retrieval)
    prepare(*arguments)
    print("[adaptation] 4/4 scoring every kept backbone; the rules first", flush=True)
    data = {"scale": scale, "sizes": ss, "seeds": seeds, "shares": list(shares), "budget_flops": budget,
            "runs": runs, "cells": [], "plateau_control": control, "retrieval_rates": retrieval,
            "retrieval_rates_read": read, "rules": rules(splits, meta, scale, config["seed"]),
            "kept": {f"{t}|{f:g}": r for (t, f), r in kept.items()},
            "rates_tried": sorted({k[2] for k in results}),
            "grid": {f"{t}|{f:g}": {f"{r:g}": mean_val(results, lambda r, seed: (t, f, r, seed), r, seeds)
                                    for r in sorted({k[2] for k in results if k[:2] == (t, f)})}
                     for (t, f) in kept}}
    plan = [("common", t, f, seed) for seed in seeds for t in TARGETS for f in (0, *shares)]
    plan += [(kind, t, f, seed) for kind in ("tagging", "retrieval") for seed in seeds for t in TARGETS if t != "gpt"
             for f in (0, *shares)]
    cost = {"common": 1.0, "tagging": 1.0, "retrieval": 3.0}
    total, done, started = sum(cost[c[0]] for c in plan), 0.0, time.perf_counter()
    with StopSignals(immediate=True) as stop:
        for (kind, target, share, seed), result in finished_cells(plan, min(config["jobs"], len(plan)), run_cell,
                                                                   stop, prepare, arguments):
            data["cells"].append({"kind": kind, "target": target, "share": share, "seed": seed, **result})
            done += cost[kind]
            left = (time.perf_counter() - started) / done * (total - done)
            print(f"[adaptation] scored {len(data['cells'])}/{len(plan)}: {kind}, {row_name(target, share)}, "
                  f"seed {seed}; ~{format_duration(left)} left", flush=True)
    data["control"] = continuation_control(data, shares, seeds)
    data.update(machine=machine_line(device, config), seconds=time.perf_counter() - t0)
    write_results(config["out_dir"], f"adaptation-{scale}", data, "\n".join(report(data)), plot)


def main():
    config, scale, device = resolve_experiment(DEFAULTS, SCALES, "adaptation")
    check_input_folder(config, "--encoders_dir", DEFAULTS["encoders_dir"], "the --out_dir of experiments/encoders.py, "
                       "whose kept retrieval rates are read")
    if config["encoders_dir"] != DEFAULTS["encoders_dir"] and not os.path.isdir(config["encoders_dir"]):
        raise UserError(f"--encoders_dir={config['encoders_dir']} does not exist: pass the --out_dir of "
                        f"experiments/encoders.py (default {DEFAULTS['encoders_dir']})")
    if config["part"] not in ("all", "study", "reversal"):
        raise UserError(f"--part={config['part']}: all, study (the study's text alone) or reversal (the reversal "
                        f"task alone)")
    if config["part"] != "reversal":  # the study part reads encoders.py's rates: a damaged file is one line now
        retrieval_rates(config["encoders_dir"], scale)
    seeds = max(reversal.SCALES[scale]["seeds"], study.SCALES[SCALES[scale]["study_scale"]]["seeds"])
    if config["seed"] + seeds - 1 >= 2 ** 32:  # every seed checked now, not when its run comes
        raise UserError(f"--seed={config['seed']}: its {seeds} seeds run up to {config['seed'] + seeds - 1}, past "
                        f"2**32 - 1: use a smaller --seed")
    if config["part"] != "study":
        check_writable([os.path.join(config["out_dir"], f"adaptation-reversal-{scale}{e}") for e in (".md", ".json")])
        reversal_part(config, scale, device)
    if config["part"] != "reversal":
        study_part(config, scale, device)


if __name__ == "__main__":
    run_main(main, interrupted="the finished training runs are kept: the same command reuses them and scores again")
