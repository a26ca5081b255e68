"""
Question: at equal training compute, how do the five objectives compare on metrics that mean the same thing for
every architecture, and which of the chapter's empirical claims (B1, C1, C2, C4, D1, D3, D5) hold at this scale?

    python experiments/study.py --jobs=2        # CPU scale -> results/study/study-cpu.*: 117 minutes measured on 2
                                                # cores shared with other jobs (a stop, then --reuse=True), its 84
                                                # runs 196 minutes of training summed; alone, ~80 (estimated)
    python experiments/study.py --scale=gpu     # 6 layers x 384 dims, block 256, on one GPU
    python experiments/study.py --quick         # a smoke run in seconds (the test suite runs it) -> out-quick/
    python experiments/study.py --reuse=True    # after a Ctrl-C: finished runs of the same settings are reloaded

1. Trains gpt, bert, prefixlm, t5 and a masked-diffusion bert to the *same training FLOPs* (forward + backward,
   t5's encoder and decoder both counted) at about the same parameter count (t5 splits its layers between its
   two stacks), every one with rotary positions (experiments/plateau.py: with learned ones bert and diffusion sat
   on the character-frequency plateau). Each gets the same learning-rate sweep: every rate of its grid on every
   seed, the rate of lowest mean validation loss on its own objective kept, and a grid whose kept rate is at its
   edge extended by one rate beyond it; the sweep's runs at the kept rate are the study's runs, 3 seeds. Every run
   must pass a positive control: its own validation loss at least 0.3 nats under what character frequencies give
   (plateau_control, from the data); a run that fails is named in its row. All are scored on the same held-out
   windows with metrics that mean the same thing for every architecture:
     - bits per character of a window's second half given its first half (claim C4): exact chain rule for gpt,
       prefixlm (first half as prefix) and t5 (first half to the encoder); for bert and the diffusion model the
       chain rule with [MASK] placeholders for the not-yet-scored positions, a proper normalised density costing
       one forward pass per position; for the diffusion model also its ELBO;
     - cloze accuracy on single masked characters (claims B1, D1): bert/diffusion natively, t5 with a sentinel,
       gpt from the left context only and by exact Bayes (every candidate scored by the window's likelihood:
       V forward passes per blank);
     - each model's validation loss on its own objective (its in-distribution score), supervised positions seen
       during training and wall-clock time (claim C1).
   And a budget sweep: gpt, bert and diffusion at 1/4 and 1/2 of the budget too (does the gap close with compute?).
2. NoPE (claim D5): causal and bidirectional models without positional encoding, and with learned positions, on
   index lookup (`d1..d8 SEP q -> d_q`), beside every position-blind baseline scored the same way.
3. Attention rank (claim D3): numerical and effective rank of the trained gpt's and bert's attention matrices,
   beside the same models at initialisation and uniform attention (what the mask alone gives); and again for a
   gpt and a bert with heads much smaller than the window (8 vs 255 at CPU scale), where the claim's bottleneck
   (a head's logits have rank <= head size) can bite.
4. Ablation (claim C2): BERT's 80/10/10 against 100% [MASK], both at 2 x the budget and bert's kept rate (the
   masking is the only difference), each checked past the plateau control, then compared on inputs without any
   [MASK]: new linear probes on the frozen final states (the original character at randomly replaced positions;
   the next character of a clean input); the models' own heads are shown too, an illustration.
Writes results/study/study-<scale>.md, .json and .png (with matplotlib); the tables and the plot are drawn by
experiments/study_report.py.
"""
import json
import math
import os
import shutil
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # python experiments/study.py
import infra.quiet_interrupts  # noqa: E402,F401  (before torch: a Ctrl-C while it loads ends quietly)

import numpy as np
import torch
import torch.nn.functional as F

import objectives
from experiments.equal_compute import flops_budget, machine_line, resolve_experiment, train_all
from experiments.metrics import (cloze_accuracy, correction_probe, non_mask_positions, past_plateau, plateau_control,
                                 second_half_bits, unigram_reference)
from experiments.study_report import PROBE_TASKS, plot, report
from infra.attention_maps import attention_maps
from infra.configurator import UserError, run_main
from infra.dataset import get_windows, load_dataset
from infra.progress import Progress, StopSignals, format_duration, format_flops, write_atomically
from model import IGNORE_INDEX, ModelConfig, Transformer

DEFAULTS = dict(scale="cpu", quick=False, device="auto", dataset="shakespeare_char", out_dir="results/study",
                seed=1337, quiet=False,  # quiet=True: no training log lines (only the study's own)
                reuse=False,  # True: load runs finished earlier with the same settings instead of retraining them
                jobs=1)  # how many runs train at once (processes, one per core)

# Every scale: rotary positions for every model (experiments/plateau.py: with learned positions a bidirectional
# stack is blind to order until its position table has learned, and bert and diffusion sat on the
# character-frequency plateau for most of the budget; the causal mask gives gpt order for free, claim D5).
# learning_rates: the grid every model starts from; a model whose kept rate (lowest mean validation loss over the
# seeds) is at an edge of its grid gets the next rate beyond it (x or / rate_step), up to rate_extensions times.
SCALES = {  # model size and the FLOPs budget, expressed as gpt iterations
    "cpu": dict(n_layer=4, n_head=4, n_embd=128, block_size=64, batch_size=12, gpt_iters=2000, eval_windows=64,
                bayes_windows=24, nope_steps=1500, eval_iters=20, position="rope",
                seeds=3, learning_rates=(1e-3, 2e-3, 4e-3), rate_step=2, rate_extensions=3,
                budget_fractions=(0.25, 0.5), ablation_budget=2,
                small_head=dict(n_layer=2, n_head=4, n_embd=32, block_size=256, batch_size=8, gpt_iters=1500,
                                eval_iters=5)),
    "gpu": dict(n_layer=6, n_head=6, n_embd=384, block_size=256, batch_size=64, gpt_iters=5000, eval_windows=256,
                bayes_windows=32, nope_steps=3000, eval_iters=100, position="rope",
                seeds=3, learning_rates=(3e-4, 1e-3, 3e-3), rate_step=3, rate_extensions=2,
                budget_fractions=(0.25, 0.5), ablation_budget=2,
                small_head=dict(n_layer=4, n_head=8, n_embd=64, block_size=1024, batch_size=16, gpt_iters=2000,
                                eval_iters=20)),
    "quick": dict(n_layer=1, n_head=2, n_embd=32, block_size=32, batch_size=4, gpt_iters=15, eval_windows=4,
                  bayes_windows=2, nope_steps=10, eval_iters=2, position="rope",
                  seeds=2, learning_rates=(1e-3, 2e-3), rate_step=2, rate_extensions=1,
                  budget_fractions=(0.5,), ablation_budget=1.5,
                  small_head=dict(n_layer=1, n_head=2, n_embd=8, block_size=64, batch_size=2, gpt_iters=5,
                                  eval_iters=2)),
}
MODELS = [  # name, arch, objective, extra training settings
    ("gpt", "gpt", "clm", {}),
    ("bert", "bert", "mlm", {}),
    ("prefixlm", "prefixlm", "prefix_lm", {}),
    ("t5", "t5", "span_corruption", {}),
    ("diffusion", "bert", "diffusion", {}),
    ("bert-100%-mask", "bert", "mlm", {"mlm_mask_fraction": 1.0, "mlm_random_fraction": 0.0}),  # claim C2
]
BUDGET_MODELS = ("gpt", "bert", "diffusion")  # the budget sweep (claim C4's gap against compute)
LN2 = math.log(2)


# ----------------------------------------------------------------------------- claim D5: NoPE

NOPE_DIGITS, NOPE_LENGTH = 10, 8
NOPE_MODELS = (("causal, NoPE", "gpt", "none"), ("bidirectional, NoPE", "bert", "none"),
               ("causal, learned positions", "gpt", "learned"), ("bidirectional, learned positions", "bert", "learned"))


def nope_batch(size, arch, generator):
    """Index lookup, the task of claim D5's test: `BOS d1..d8 SEP q` -> d_q, one answer token per example, so no
    answer is ever an input (under teacher forcing, a task with several answer tokens lets an order-blind model
    count what it has already emitted: reversing digits that way scored ~46%, a model that knew no order). gpt
    predicts the answer at q's position; bert reads `BOS d1..d8 SEP q [MASK]` and fills the [MASK].
    Returns (inputs, targets, digits (size, 8), query (size,))."""
    n, SEP, MASK, BOS, FIRST_INDEX = NOPE_LENGTH, 10, 11, 12, 13  # query tokens 13..20 name the indices 1..8
    digits = torch.randint(0, NOPE_DIGITS, (size, n), generator=generator)
    query = torch.randint(0, n, (size,), generator=generator)
    answer = digits[torch.arange(size), query]
    columns = [torch.full((size, 1), BOS), digits, torch.full((size, 1), SEP), (FIRST_INDEX + query)[:, None]]
    if arch == "bert":
        columns.append(torch.full((size, 1), MASK))
    inputs = torch.cat(columns, dim=1)
    targets = torch.full_like(inputs, IGNORE_INDEX)
    targets[:, -1] = answer
    return inputs, targets, digits, query


def position_blind_baselines(digits):
    """What rules that ignore where each digit sits reach on index lookup, scored as the models are (the answer
    token only). The best of them is the mode of the digits: given only the multiset, the answer is each digit with
    probability count / 8, so no order-blind model can beat E[max count / 8] (a permutation-equivariant model, e.g.
    bidirectional NoPE, is one)."""
    counts = F.one_hot(digits, NOPE_DIGITS).sum(1).double()  # (N, 10)
    share = counts / NOPE_LENGTH
    return {"order-blind best (the most frequent digit of the input)": share.max(1).values.mean().item(),
            "order-blind: a random digit of the input": (share ** 2).sum(1).mean().item(),
            "chance (a random digit)": 1 / NOPE_DIGITS}


def nope_experiment(steps, device, seeds):
    """Claim D5: the causal mask carries position; bidirectional attention without positions cannot know order.
    Every model trained `steps` steps per seed on index lookup (nope_batch); accuracy on 2000 fresh examples, with
    the position-blind baselines on the same examples. Returns {name: [accuracy per seed]}."""
    results = {name: [] for name, _, _ in NOPE_MODELS}
    progress = Progress("[study] NoPE training steps", len(seeds) * len(NOPE_MODELS) * steps)
    for seed_number, seed in enumerate(seeds):
        for model_number, (name, arch, position) in enumerate(NOPE_MODELS):
            steps_before = (seed_number * len(NOPE_MODELS) + model_number) * steps
            torch.manual_seed(seed)
            model = Transformer(ModelConfig(arch=arch, vocab_size=21, block_size=NOPE_LENGTH + 4, n_layer=2,
                                            n_head=4, n_embd=64, position=position, dropout=0.0)).to(device)
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
            g = torch.Generator().manual_seed(seed)
            for step in range(steps):
                progress.update(steps_before + step)  # a line every 10 s, with the time left
                inputs, targets, _, _ = nope_batch(64, arch, g)
                _, loss = model(inputs.to(device), targets.to(device))
                loss.backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            model.eval()
            with torch.no_grad():
                inputs, targets, digits, _ = nope_batch(2000, arch, torch.Generator().manual_seed(10_000 + seed))
                predicted = model(inputs.to(device))[0][:, -1].argmax(-1).cpu()
                results[name].append((predicted == targets[:, -1]).double().mean().item())
        for rule, value in position_blind_baselines(digits).items():  # the same 2000 examples, per seed
            results.setdefault(rule, []).append(value)
    return results


# ----------------------------------------------------------------------------- claim D3: attention rank

def rank_summary(P):
    """Mean numerical rank and mean effective rank (exp of the entropy of the normalised singular values, Roy &
    Vetterli 2007) of a stack of attention matrices (..., T, T)."""
    P = P.double().flatten(0, -3)
    singular = torch.linalg.svdvals(P)
    p = singular / singular.sum(-1, keepdim=True)
    effective = torch.exp(-(p * torch.log(p.clamp(min=1e-30))).sum(-1))
    return {"numerical": torch.linalg.matrix_rank(P).double().mean().item(), "effective": effective.mean().item()}


@torch.no_grad()
def attention_ranks(model, windows):
    """Per layer: rank_summary of the attention matrices, over heads and windows."""
    return [rank_summary(probabilities) for probabilities in attention_maps(model, windows)]  # (N, nh, T, T) each


@torch.no_grad()
def attention_rank_baselines(trained, windows, seed):
    """What the mask alone gives (claim D3 is about training, so the trained ranks are read against these): each
    model's ranks at initialisation (same config, fresh weights), and uniform attention over the allowed keys,
    causal (row i: 1/(i+1) on keys 0..i: triangular, full rank) and bidirectional (every row 1/T: rank 1)."""
    T = windows.size(1)
    causal = torch.tril(torch.ones(T, T, dtype=torch.double))
    out = {"uniform causal": rank_summary((causal / causal.sum(-1, keepdim=True))[None]),
           "uniform bidirectional": rank_summary(torch.full((1, T, T), 1.0 / T, dtype=torch.double))}
    for name, model in trained.items():
        torch.manual_seed(seed)
        fresh = Transformer(model.config).to(windows.device).eval()
        out[f"{name} at initialisation"] = attention_ranks(fresh, windows)
    return out


# ----------------------------------------------------------------------------- the study

def study_run(model, learning_rate, seed, out_dir, fraction=1.0):
    """One training run for train_all: an entry of MODELS at a learning rate, seed and share of the budget."""
    name, arch, objective, extra = model
    label = f"{name}, lr {learning_rate:g}, seed {seed}" + (f", {fraction:g} of the budget" if fraction != 1 else "")
    return (label, arch, objective, dict(extra, learning_rate=learning_rate, min_lr=learning_rate / 10, seed=seed,
                                         out_dir=out_dir, budget_fraction=fraction))


def evaluation_windows(splits, s, seed, device):
    """The held-out windows every model is scored on, and the cloze blanks in them (15% of each window's
    positions after the first). Returns (windows (N, T), blanks (N, k), the generator that drew them)."""
    rng = np.random.default_rng(seed + 7)
    # block_size - 1 characters: room for the EOS that t5 expects after its input. The same windows for every
    # seed: the +- over seeds is the training run's spread, not the choice of evaluation text
    windows = get_windows(splits["val"], s["eval_windows"], s["block_size"] - 2, rng).to(device)
    N, T = windows.shape
    k = max(1, round(0.15 * (T - 1)))
    blanks = torch.stack([torch.randperm(T - 1, generator=torch.Generator().manual_seed(i))[:k] + 1
                          for i in range(N)]).sort(dim=1).values.to(device)
    return windows, blanks, rng


def mean_loss(results, name, rate, seeds):
    """The sweep's score of a rate: the mean validation loss over the seeds (inf if any seed diverged)."""
    losses = [results[(name, rate, seed)]["val_loss"] for seed in seeds]
    return math.inf if None in losses else float(np.mean(losses))


def lowest_mean_rates(grids, results, seeds):
    """{name: the rate of its grid of lowest mean validation loss over the seeds (mean_loss)}: every seed counts."""
    return {name: min(grid, key=lambda lr: mean_loss(results, name, lr, seeds)) for name, grid in grids.items()}


def next_rates(grids, chosen, step):
    """Where a model's kept rate is the lowest or highest of its grid, the rate one step beyond it (the best rate
    may lie outside). Returns {name: [the new rate]} for those models only."""
    beyond = {}
    for name, rate in chosen.items():
        grid = sorted(grids[name])
        if rate == grid[0]:
            beyond[name] = [grid[0] / step]
        elif rate == grid[-1]:
            beyond[name] = [grid[-1] * step]
    return beyond


def rate_sweep(compared, s, seeds, folder, config, device, meta):
    """Every model at every rate of its grid, every seed, at the full budget; the kept rate has the lowest mean
    validation loss over the seeds (the same effort for every model), and a grid whose kept rate is at its edge
    grows one rate beyond it (next_rates), up to s["rate_extensions"] times. Returns (grids, {(name, rate, seed):
    summary}, chosen), or None when interrupted."""
    grids = {m[0]: sorted(s["learning_rates"]) for m in compared}
    results, new = {}, dict(grids)
    for round_number in range(s["rate_extensions"] + 1):
        runs = {(m[0], lr, seed): study_run(m, lr, seed, f"{folder}-lr{lr:g}-seed{seed}-{m[0]}")
                for m in compared for lr in new.get(m[0], []) for seed in seeds}
        if round_number:
            print("[study] kept rates at the edge of their grid: " + ", ".join(
                f"{name} gets {lr[0]:g}" for name, lr in new.items()), flush=True)
        trained = train_runs(runs, s, config, device, meta, divergence_is_a_result=True)
        if trained is None:
            return None
        results.update(trained)
        chosen = lowest_mean_rates(grids, results, seeds)
        new = next_rates(grids, chosen, s["rate_step"])
        if not new or round_number == s["rate_extensions"]:
            return grids, results, chosen
        for name, rates in new.items():
            grids[name] = sorted(grids[name] + rates)


def train_runs(runs, s, config, device, meta, divergence_is_a_result=False):
    """train_all over {key: study_run(...)}; returns {key: summary}, or None when interrupted."""
    trained, _ = train_all(list(runs.values()), s, config["dataset"], "", device, meta, config["seed"],
                           config["quiet"], reuse=config["reuse"], divergence_is_a_result=divergence_is_a_result,
                           jobs=config["jobs"])
    return None if trained is None else {key: trained[run[0]] for key, run in runs.items()}


def main():
    config, scale, device = resolve_experiment(DEFAULTS, SCALES, "study")
    torch.manual_seed(config["seed"])
    s = SCALES[scale]
    t0 = time.perf_counter()
    splits, meta = load_dataset(config["dataset"], s["block_size"], prepare_if_missing=True)
    folder = os.path.join(config["out_dir"], "checkpoints", scale)
    seeds = [config["seed"] + i for i in range(s["seeds"])]
    fractions, ablation_share = s["budget_fractions"], s["ablation_budget"]
    if 1 in fractions or ablation_share in fractions:
        raise UserError(f"SCALES['{scale}']: budget_fractions must leave out 1 (the main runs) and ablation_budget")
    by_name = {model[0]: model for model in MODELS}
    compared = [model for model in MODELS if model[0] != "bert-100%-mask"]  # the ablation is measured apart (C2)
    budget = flops_budget(s, meta)
    print(f"[study] 1/3 learning-rate sweep at equal FLOPs ({format_flops(budget)} each): {len(compared)} models x "
          f"rates {', '.join(f'{r:g}' for r in s['learning_rates'])} x seeds {', '.join(map(str, seeds))}; each "
          f"keeps the rate of lowest mean validation loss on its own objective, a rate at the grid's edge gets the "
          f"next one beyond it", flush=True)
    swept = rate_sweep(compared, s, seeds, folder, config, device, meta)
    if swept is None:
        raise KeyboardInterrupt  # run_main: status 130, and that the finished runs are kept
    grids, sweep, chosen = swept
    failed = [name for name, lr in chosen.items() if mean_loss(sweep, name, lr, seeds) == math.inf]
    if failed:
        raise UserError(f"every learning rate diverged on some seed for {', '.join(failed)}; lower "
                        f"SCALES['{scale}']['learning_rates'] in study.py")
    print("[study] learning rates chosen: " + ", ".join(f"{name} {lr:g}" for name, lr in chosen.items()), flush=True)
    ablation_rate = chosen["bert"]  # claim C2: both maskings at bert's kept rate, the masking the only difference
    runs = {}
    for seed in seeds:  # every seed's run at the chosen rate is the sweep's
        for name in BUDGET_MODELS:
            for fraction in fractions:  # claim C4's gap against compute: does it shrink with the budget?
                runs[(name, fraction, seed)] = study_run(by_name[name], chosen[name], seed,
                                                         f"{folder}-budget{fraction:g}-seed{seed}-{name}", fraction)
        for name in ("bert", "bert-100%-mask"):
            runs[(name, "ablation", seed)] = study_run(by_name[name], ablation_rate, seed, f"{folder}-ablation"
                                                       f"{ablation_share:g}-lr{ablation_rate:g}-seed{seed}-{name}",
                                                       ablation_share)
    print(f"[study] 2/3 {', '.join(BUDGET_MODELS)} at {', '.join(f'{f:g}' for f in fractions)} of the budget; bert "
          f"and bert-100%-mask at {ablation_share:g} x the budget and bert's rate (claim C2): {len(runs)} runs",
          flush=True)
    trained = train_runs(runs, s, config, device, meta)
    if trained is None:
        raise KeyboardInterrupt
    for m in compared:  # each seed's run at the chosen rate, where finetune.py --study and the others read it
        for seed in seeds:
            trained[(m[0], seed)] = sweep[(m[0], chosen[m[0]], seed)]
            source = f"{folder}-lr{chosen[m[0]]:g}-seed{seed}-{m[0]}"
            target = f"{folder}-{m[0]}" if seed == seeds[0] else f"{folder}-seed{seed}-{m[0]}"
            shutil.rmtree(target + ".partial", ignore_errors=True)
            shutil.copytree(source, target + ".partial")  # whole, then in place: a stop never leaves half of one
            shutil.rmtree(target, ignore_errors=True)
            os.replace(target + ".partial", target)
    # claim D3's bottleneck: a head's logits q k^T have rank <= head size, so it can only bite when the head size is
    # well below T (above: 32 vs 63). gpt and bert again, small heads, long windows, the scale's positions
    small = dict(s["small_head"], position=s.get("position", "learned"))
    print(f"[study] 3/3 attention rank at head size {small['n_embd'] // small['n_head']}, T = {small['block_size'] - 1} "
          f"(claim D3): gpt and bert, seeds {', '.join(map(str, seeds))}", flush=True)
    small_trained = train_runs({(name, seed): study_run(by_name[name], 1e-3, seed, f"{folder}-small-head-seed{seed}-"
                                                        f"{name}") for seed in seeds for name in ("gpt", "bert")},
                               small, config, device, meta)
    if small_trained is None:
        raise KeyboardInterrupt

    specials = objectives.Specials.from_meta(meta)
    V = specials.num_ordinary
    windows, blanks, rng = evaluation_windows(splits, s, config["seed"], device)
    N, T = windows.shape
    control = plateau_control(splits, meta, s, MODELS)
    data = {"scale": scale, "device": device, "machine": machine_line(device, config), "budget_flops": budget,
            "seeds": seeds, "position": s.get("position", "learned"), "learning_rates": grids,
            "chosen_learning_rate": chosen, "plateau_control": control, "budget_fractions": list(fractions), "ablation_budget": ablation_share,
            "ablation_learning_rate": ablation_rate,
            "models": {m[0]: {"arch": m[1], "objective": m[2], "learning_rate": chosen[m[0]], "seeds": []}
                       for m in compared}}
    every_run = list({id(r): r for r in [*sweep.values(), *trained.values(), *small_trained.values()]}.values())
    data.update(runs=len(every_run), reused=sum(bool(r.get("reused")) for r in every_run),
                training_seconds=sum(r.get("seconds", 0) for r in every_run))  # a diverged run has no seconds
    not_done = ["metrics", "sweep", "budget", "ablation", "attention_rank", "attention_rank_small_head", "nope"]

    def scored(name, result, seed):  # the common metrics of one trained run
        model = result["model"].eval()
        bits, extra = second_half_bits(name, model, windows, specials, torch.Generator().manual_seed(seed))
        return {"seed": seed, "parameters": model.num_parameters(), "iterations": result["iter_num"],
                "flops": result["flops"], "seconds": result["seconds"], "supervised_seen": result["supervised_seen"],
                "tokens_seen": result["tokens_seen"], "val_loss": result["val_loss"],
                "past_plateau": past_plateau(result["val_loss"], control, name), "second_half_bits_per_char": bits,
                "cloze": cloze_accuracy(name, model, windows, blanks, specials, s["bayes_windows"]), **extra}

    try:  # Ctrl-C or SIGTERM: what was measured is written, and the message names what was not
        with StopSignals(immediate=True):
            data["unigram_reference"] = unigram_reference(splits["train"], windows, blanks, V)
            started, total = time.perf_counter(), len(compared) * len(seeds)
            for number, (seed, name) in enumerate((seed, m[0]) for seed in seeds for m in compared):
                left = (time.perf_counter() - started) / number * (total - number) if number else 0
                print(f"[study] metrics {number + 1}/{total}: {name}, seed {seed}"
                      + (f", ~{format_duration(left)} left" if number else ""), flush=True)
                data["models"][name]["seeds"].append(scored(name, trained[(name, seed)], seed))
            not_done.remove("metrics")
            print("[study] the budget sweep's runs on the common metric", flush=True)
            data["sweep"] = {name: {f"{lr:g}": {key: [sweep[(name, lr, seed)].get(key) for seed in seeds]
                                                for key in ("val_loss", "diverged")} for lr in grid}
                             for name, grid in grids.items()}
            not_done.remove("sweep")
            by_share = {name: {} for name in BUDGET_MODELS}
            for name in BUDGET_MODELS:
                for fraction in fractions:
                    results = [trained[(name, fraction, seed)] for seed in seeds]
                    scores = [second_half_bits(name, result["model"].eval(), windows, specials,
                                               torch.Generator().manual_seed(seed)) for result, seed in zip(results, seeds)]
                    by_share[name][f"{fraction:g}"] = {"val_loss": [result["val_loss"] for result in results],
                                                       "second_half_bits_per_char": [b for b, _ in scores],
                                                       "elbo_bits": [e.get("elbo_bits") for _, e in scores],
                                                       "flops": [result["flops"] for result in results]}
                runs = data["models"][name]["seeds"]  # the full budget: the main runs, scored above
                by_share[name]["1"] = {key: [run.get(key) for run in runs]
                                       for key in ("val_loss", "second_half_bits_per_char", "elbo_bits", "flops")}
            data["budget"] = by_share
            not_done.remove("budget")
            print(f"[study] claim C2 ({ablation_share:g} x the budget): the common metrics, the built-in heads and a "
                  f"new probe on [MASK]-free inputs", flush=True)
            probe_train = get_windows(splits["train"], 8 * s["eval_windows"], T - 1, rng).to(device)
            probe_test = get_windows(splits["val"], 4 * s["eval_windows"], T - 1, rng).to(device)
            ablation = {"models": {"bert": [], "bert-100%-mask": []}, "own head": {"bert": [], "bert-100%-mask": []},
                        "probe": {task: {"bert": [], "bert-100%-mask": [], "bert at 1 x the budget": [],
                                         "bert at initialisation": [], "(rule) the most frequent target": []}
                                  for task in PROBE_TASKS}}
            for seed in seeds:
                torch.manual_seed(seed)
                readers = {name: trained[(name, "ablation", seed)]["model"].eval()
                           for name in ("bert", "bert-100%-mask")}
                readers["bert at 1 x the budget"] = trained[("bert", seed)]["model"].eval()
                readers["bert at initialisation"] = Transformer(readers["bert"].config).to(device).eval()
                for name in ("bert", "bert-100%-mask"):
                    ablation["models"][name].append(scored(name, trained[(name, "ablation", seed)], seed))
                    ablation["own head"][name].append(non_mask_positions(readers[name], windows, specials,
                                                                         torch.Generator().manual_seed(seed)))
                for task, results in ablation["probe"].items():
                    for name, model in readers.items():  # the same positions for every reader of a seed
                        accuracy, rule = correction_probe(model, probe_train, probe_test, V, seed, task)
                        results[name].append(accuracy)
                    results["(rule) the most frequent target"].append(rule)
            data["ablation"] = ablation
            not_done.remove("ablation")
            print("[study] claim D3: attention ranks", flush=True)
            ranks = {name: [attention_ranks(trained[(name, seed)]["model"].eval(), windows[:16]) for seed in seeds]
                     for name in ("gpt", "bert")}
            baselines = [attention_rank_baselines({name: trained[(name, seed)]["model"] for name in ("gpt", "bert")},
                                                  windows[:16], seed) for seed in seeds]
            data["attention_rank"], data["attention_rank_baselines"] = ranks, baselines  # both, or neither
            not_done.remove("attention_rank")
            long_windows = get_windows(splits["val"], 16, small["block_size"] - 2, rng).to(device)
            data["attention_rank_small_head"] = {
                "ranks": {name: [attention_ranks(small_trained[(name, seed)]["model"].eval(), long_windows)
                                 for seed in seeds] for name in ("gpt", "bert")},
                "baselines": [attention_rank_baselines({name: small_trained[(name, seed)]["model"]
                                                        for name in ("gpt", "bert")}, long_windows, seed)
                              for seed in seeds]}
            not_done.remove("attention_rank_small_head")
            print("[study] NoPE experiment (claim D5)", flush=True)
            data["nope"] = nope_experiment(s["nope_steps"], device, seeds)
            not_done.remove("nope")
    except KeyboardInterrupt:
        data["not_done"] = not_done
        print(f"interrupted: not measured: {', '.join(not_done)}; writing what was", flush=True)
    data["seconds"] = time.perf_counter() - t0
    text = "\n".join(report(data, s, N, V))
    print("\n" + text)
    base = os.path.join(config["out_dir"], f"study-{scale}" + ("-partial" if "not_done" in data else ""))  # a stop
    write_atomically(base + ".md", text + "\n", base + ".json", json.dumps(data, indent=1))  # never over a whole one
    if "metrics" not in not_done:
        plot(data, base + ".png")
    print(f"wrote {base}.md, .json and .png", flush=True)
    if "not_done" in data:
        sys.exit(130)  # a stop, after writing what was measured (docs/reliability.md)


if __name__ == "__main__":
    run_main(main, interrupted="the runs finished so far are kept: the same command with --reuse=True goes on "
                              "from them")
