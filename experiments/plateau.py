"""
Question: why did bert and masked diffusion sit on the character-frequency plateau in the equal-compute study
(their validation loss near what character frequencies alone give, for most or all of the budget) while gpt
learned, and what moves them off it? A model compared there must first have learned (the study's positive
control), so the study's recipe is chosen from what this finds.

    python experiments/plateau.py --jobs=2    # 16 variants at the study's shape and budget, 30 runs (gpt and
                                              # t5 1 seed, the others 2) -> results/study/plateau-cpu.{md,json,png}:
                                              # 37 minutes on 2 cores, all 30 trained (a test run beside it at times)
    python experiments/plateau.py --jobs=2 --seeds=1   # the first seed only -> plateau-cpu-1seed.*
    python experiments/plateau.py --quick     # a smoke run in seconds (the test suite runs it) -> out-quick/

Every variant trains at the study's CPU shape (4 layers x 128, block 64, batch 12) to the study's FLOPs budget
(2,000 gpt iterations), evaluated every 100 iterations (its own objective's validation loss, the same windows each
time). One thing changes from the old recipe (learned positions, rate 1e-3 with 100 warmup iterations): the position
encoding, learned (a table the model must train) against rotary (relative position in every attention score from
the first step), for bert and diffusion; t5 and gpt with learned positions as references (gpt's causal mask tells
each position how many came before it, claim D5). Then the optimisation, one change at a time, on bert and
diffusion with learned positions (the variants that stayed longest on the plateau): a 4 x longer warmup, the rate
3 x lower and 3 x higher (bert), twice the batch (half the steps: the same FLOPs). Diffusion's time sampler is
measured rather than retrained: time_sampler_noise, on each diffusion run of the first seed, compares the spread of
the training loss with t stratified over the batch (training's, MDLM's low-discrepancy sampler), drawn
independently per row, and fixed (no 1/t spread). Last, the initialisation scale (train.py's init_std): half and
twice GPT-2's N(0, 0.02), for bert and diffusion with learned positions.
A run leaves the plateau at the first evaluation where its validation loss is at least 0.3 nats under its
objective's context-free reference (metrics.plateau_control, computed from the data: for bert and diffusion nearly
what character frequencies give); the table gives that iteration per seed ("never" when it did not by the end) and
the final loss.
"""
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # python experiments/plateau.py
import infra.quiet_interrupts  # noqa: E402,F401  (before torch: a Ctrl-C while it loads ends quietly)

import numpy as np
import torch

import objectives
from experiments.equal_compute import machine_line, resolve_experiment, train_all, write_results
from experiments.study import SCALES as STUDY_SCALES
from experiments.metrics import plateau_control
from experiments.study_report import plus_minus
from infra.configurator import QUICK_NOTE, UserError, run_main
from infra.dataset import get_windows, load_dataset
from infra.progress import check_writable, format_duration, format_flops
from infra.plots import pyplot, save

DEFAULTS = dict(scale="cpu", quick=False, device="auto", dataset="shakespeare_char", out_dir="results/study",
                seed=1337, quiet=True, reuse=False,  # reuse=True: load runs finished earlier with the same settings
                jobs=1,  # how many runs train at once (processes, one per core)
                seeds=2)  # 1: the first seed only (-1seed in the result's name: never over the whole result)
SCALES = {"cpu": dict(STUDY_SCALES["cpu"], seeds=2, eval_every=100),
          "gpu": dict(STUDY_SCALES["gpu"], seeds=2, eval_every=250),
          "quick": dict(STUDY_SCALES["quick"], seeds=2, eval_every=5)}
OLD = dict(position="learned", learning_rate=1e-3, min_lr=1e-4)  # the recipe every variant changes one thing of
VARIANTS = [  # name, arch, objective, settings, seeds (--seeds_of_contrasts=2: the position contrasts twice)
    ("gpt, learned positions", "gpt", "clm", OLD, 1),
    ("bert, learned positions", "bert", "mlm", OLD, 2),
    ("bert, rotary positions", "bert", "mlm", dict(OLD, position="rope"), 2),
    ("diffusion, learned positions", "bert", "diffusion", OLD, 2),
    ("diffusion, rotary positions", "bert", "diffusion", dict(OLD, position="rope"), 2),
    ("t5, learned positions", "t5", "span_corruption", OLD, 1),
    # the optimisation, one change at a time, on the variants that stayed longest on the plateau (learned positions)
    ("bert, learned, warmup 400", "bert", "mlm", dict(OLD, warmup_iters=400), 2),
    ("bert, learned, rate 3e-4", "bert", "mlm", dict(OLD, learning_rate=3e-4, min_lr=3e-5), 2),
    ("bert, learned, rate 3e-3", "bert", "mlm", dict(OLD, learning_rate=3e-3, min_lr=3e-4), 2),
    ("bert, learned, batch x2", "bert", "mlm", dict(OLD, batch_factor=2), 2),  # half the steps: the same FLOPs
    ("diffusion, learned, warmup 400", "bert", "diffusion", dict(OLD, warmup_iters=400), 2),
    ("diffusion, learned, batch x2", "bert", "diffusion", dict(OLD, batch_factor=2), 2),
    # the initialisation scale, half and twice GPT-2's N(0, 0.02) (train.py's init_std)
    ("bert, learned, init std 0.01", "bert", "mlm", dict(OLD, init_std=0.01), 2),
    ("bert, learned, init std 0.04", "bert", "mlm", dict(OLD, init_std=0.04), 2),
    ("diffusion, learned, init std 0.01", "bert", "diffusion", dict(OLD, init_std=0.01), 2),
    ("diffusion, learned, init std 0.04", "bert", "diffusion", dict(OLD, init_std=0.04), 2),
]
NOISE_BATCHES = {"cpu": 200, "gpu": 200, "quick": 4}  # batches per time sampler in time_sampler_noise


def with_batch(settings, s):
    """A variant's train.py settings: batch_factor (a multiple of the scale's batch) made a batch_size."""
    settings = dict(settings)
    if "batch_factor" in settings:
        settings["batch_size"] = s["batch_size"] * settings.pop("batch_factor")
    return settings


def curve(out_dir):
    """[(iteration, validation loss)] of a finished run, from its log.jsonl (train.py writes one line per
    evaluation)."""
    with open(os.path.join(out_dir, "log.jsonl")) as f:
        records = [json.loads(line) for line in f if line.strip()]
    return [(r["iter"], r["val_loss"]) for r in records if "val_loss" in r]


def left_plateau(points, threshold):
    """The first iteration whose validation loss is at or under the control's threshold; None if none is."""
    return next((it for it, loss in points if loss <= threshold), None)


def time_sampler_noise(model, splits, meta, s, seed, batches):
    """How noisy diffusion's training loss is as an estimate of its ELBO, for a trained model: over `batches`
    batches of the study's size (validation windows, the same windows for every sampler), the mean and std of the
    batch loss when t is stratified over the batch (training's sampler), drawn independently per row, and fixed
    at 0.5 (no 1/t spread at all: a reference for the noise the masked positions and the text alone give; its mean
    is a different quantity)."""
    specials = objectives.Specials.from_meta(meta)
    rng = np.random.default_rng(seed)
    samplers = {"stratified t": dict(stratified=True), "independent t": dict(stratified=False),
                "t fixed at 0.5": dict(rate=0.5)}
    generators = {name: torch.Generator().manual_seed(seed) for name in samplers}
    losses = {name: [] for name in samplers}
    model.eval()
    with torch.no_grad():
        for _ in range(batches):
            windows = get_windows(splits["val"], s["batch_size"], s["block_size"], rng)
            for name, knobs in samplers.items():
                batch = objectives.diffusion(windows, specials, generators[name], **knobs).to(
                    next(model.parameters()).device)
                losses[name].append(model(**batch.model_inputs())[1].item())
    return {name: {"mean": float(np.mean(v)), "std": float(np.std(v, ddof=1))} for name, v in losses.items()}


def report(data, s):
    control = data["plateau_control"]
    lines = [QUICK_NOTE, ""] if data["scale"] == "quick" else []
    lines += [f"Leaving the character-frequency plateau, scale `{data['scale']}` ({s['n_layer']} layers x "
              f"{s['n_embd']} dims, block {s['block_size']}, batch {s['batch_size']} unless the variant says), each "
              f"run to {format_flops(data['budget_flops'])} ({s['gpt_iters']} gpt iterations), evaluated every "
              f"{s['eval_every']} iterations; seeds {', '.join(map(str, data['seeds']))}; on {data['machine']}; "
              f"{data['seconds'] / 60:.1f} min for this command, the training of its runs "
              f"{sum(r['seconds'] for runs in data['variants'].values() for r in runs) / 60:.1f} min summed ("
              f"{sum(r['reused'] for runs in data['variants'].values() for r in runs)} of them reused from an earlier "
              f"run of the same settings). Control: own validation loss at least {control['margin']:g} nats "
              f"under the objective's context-free reference (metrics.context_free_reference: what a predictor that "
              f"reads only the input token at its position reaches; character frequencies alone give "
              f"{control['character_frequencies_nats']:.3f}). 'left at' is the first evaluation under it, per "
              f"seed, as a share of the run's iterations (never: not by the end); 'final' is the validation loss at "
              f"the end, mean +- std.",
              "", "| variant | objective | context-free reference | left the plateau at (per seed) | final val loss | "
              "past the control |", "|---|---|---|---|---|---|"]
    for name, runs in data["variants"].items():
        if not runs:
            continue
        at = ", ".join("never" if run["left_at"] is None else f"{run['left_at']} ({run['left_at'] / run['iterations']:.0%})"
                       for run in runs)
        final = [run["val_loss"] for run in runs]
        passed = sum(loss <= control["threshold"][name] for loss in final)
        lines.append(f"| {name} | {runs[0]['objective']} | {control['reference'][name]:.3f} | {at} | "
                     f"{plus_minus(final)} | {passed}/{len(runs)} |")
    if data.get("noise"):
        lines += ["", f"Diffusion's time sampler: the batch loss (its ELBO estimate, nats) over "
                      f"{data['noise_batches']} validation batches of {s['batch_size']} windows, the same windows for "
                      f"each sampler, at the end of each diffusion run of seed {data['seeds'][0]} "
                      f"(plateau.time_sampler_noise). Training draws t stratified over the batch (MDLM's "
                      f"low-discrepancy sampler); independent t is the plain alternative; t fixed at 0.5 removes "
                      f"the 1/t weight's spread (a reference: its mean is not the ELBO).", "",
                  "| run | " + " | ".join(f"{n}: mean +- std" for n in next(iter(data["noise"].values()))) +
                  " | std, independent / stratified |", "|---|---|---|---|---|"]
        for name, noise in data["noise"].items():
            ratio = noise["independent t"]["std"] / noise["stratified t"]["std"]
            lines.append(f"| {name} | " + " | ".join(f"{v['mean']:.3f} +- {v['std']:.3f}" for v in noise.values())
                         + f" | {ratio:.2f} |")
    if data.get("interrupted"):
        lines += ["", "**Interrupted: the seeds above are the ones that finished.**"]
    return lines


def plot(data, path):
    """Validation loss against the share of the budget, one panel per model, every seed a line."""
    plt = pyplot()
    if plt is None:
        return
    panels = ["bert", "diffusion", "t5", "gpt"]
    fig, axes = plt.subplots(1, len(panels), figsize=(18, 4.5), sharey=True)
    control = data["plateau_control"]
    for axis, panel in zip(axes, panels):
        for number, (name, runs) in enumerate((n, r) for n, r in data["variants"].items() if n.startswith(panel)):
            for k, run in enumerate(runs):
                share = [it / run["iterations"] for it, _ in run["curve"]]
                axis.plot(share, [loss for _, loss in run["curve"]], color=f"C{number}", alpha=0.9 - 0.3 * k,
                          label=name if k == 0 else None)
        axis.axhline(control["character_frequencies_nats"], color="grey", linestyle="--",
                     label="character frequencies")
        axis.set_title(panel)
        axis.set_xlabel("share of the FLOPs budget")
        axis.set_ylim(1.2, 4.0)
        axis.legend(fontsize=7)
    axes[0].set_ylabel("validation loss, own objective (nats)")
    fig.suptitle(f"Leaving the plateau, scale {data['scale']}, every seed a line")
    fig.tight_layout()
    save(fig, path, dpi=110)


def main():
    config, scale, device = resolve_experiment(DEFAULTS, SCALES, "plateau", ())
    if config["seeds"] not in range(1, SCALES[scale]["seeds"] + 1):
        raise UserError(f"--seeds={config['seeds']}: 1 to {SCALES[scale]['seeds']} (how many of the seeds to run)")
    result_name = f"plateau-{scale}" + ("" if config["seeds"] == SCALES[scale]["seeds"] else f"-{config['seeds']}seed")
    check_writable([os.path.join(config["out_dir"], result_name + ext) for ext in (".md", ".json", ".png")])
    s = dict(SCALES[scale], seeds=config["seeds"])
    t0 = time.perf_counter()
    splits, meta = load_dataset(config["dataset"], s["block_size"], prepare_if_missing=True)
    control = plateau_control(splits, meta, s, [v[:4] for v in VARIANTS])
    work = os.path.join(config["out_dir"], "checkpoints", f"plateau-{scale}")
    data = {"scale": scale, "plateau_control": control, "variants": {v[0]: [] for v in VARIANTS}, "seeds": []}
    interrupted = False
    for number, seed in enumerate(config["seed"] + k for k in range(s["seeds"])):
        models = [(name, arch, objective, dict(with_batch(settings, s), eval_interval=s["eval_every"]))
                  for name, arch, objective, settings, seeds in VARIANTS if number < seeds]
        print(f"[plateau] seed {seed} ({number + 1}/{s['seeds']}): {len(models)} variants, "
              f"{format_duration(time.perf_counter() - t0)} so far", flush=True)
        trained, budget = train_all(models, s, config["dataset"], os.path.join(work, f"seed{seed}"), device, meta,
                                    seed, config["quiet"], reuse=config["reuse"], jobs=config["jobs"])
        data["budget_flops"] = budget
        if trained is None:
            interrupted = True
            break
        for name, result in trained.items():
            if number == 0 and result["objective"] == "diffusion":  # what stratifying t saves (report's 2nd table)
                data.setdefault("noise", {})[name] = time_sampler_noise(result["model"], splits, meta, s, seed,
                                                                         NOISE_BATCHES[scale])
                data["noise_batches"] = NOISE_BATCHES[scale]
            points = curve(result["out_dir"])
            data["variants"][name].append({"seed": seed, "objective": result["objective"], "curve": points,
                                           "seconds": result.get("seconds", 0), "reused": bool(result.get("reused")),
                                           "iterations": result["iter_num"], "val_loss": result["val_loss"],
                                           "left_at": left_plateau(points, control["threshold"][name])})
        data["seeds"].append(seed)
    if not data["seeds"]:
        raise KeyboardInterrupt  # nothing finished: nothing is written (run_main says what is kept)
    data.update(machine=machine_line(device, config), seconds=time.perf_counter() - t0, interrupted=interrupted)
    write_results(config["out_dir"], result_name + ("-partial" if interrupted else ""),  # never over a whole one
                  data, "\n".join(report(data, s)), plot)
    if interrupted:
        raise KeyboardInterrupt


if __name__ == "__main__":
    run_main(main, interrupted="the runs finished so far are kept: the same command with --reuse=True goes on "
                              "from them")
