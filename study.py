"""
The chapter's empirical claims at equal compute, on char-level Tiny Shakespeare.

    python study.py                  # CPU scale: nanoGPT's CPU recipe size, ~11 minutes on 2 cores
    python study.py --scale=gpu      # 6 layers x 384 dims, block 256, on one GPU
    python study.py --quick          # a smoke run in seconds (the test suite runs it)

1. Trains gpt, bert, prefixlm, t5 and a masked-diffusion bert to the *same training FLOPs* (forward + backward,
   t5's encoder and decoder both counted) at about the same parameter count (t5 splits its layers between its
   two stacks), then scores all of them on the same held-out windows with metrics that mean the same thing for
   every architecture:
     - bits per character of a window's second half given its first half (claim C4): exact chain rule for gpt,
       prefixlm (first half as prefix) and t5 (first half to the encoder); for bert and the diffusion model the
       chain rule with [MASK] placeholders for the not-yet-scored positions, a proper normalised density costing
       one forward pass per position; for the diffusion model also its ELBO;
     - cloze accuracy on single masked characters (claims B1, D1): bert/diffusion natively, t5 with a sentinel,
       gpt from the left context only and by exact Bayes (every candidate scored by the window's likelihood:
       V forward passes per blank);
     - supervised positions seen during training and wall-clock time (claim C1).
2. NoPE (claim D5): causal and bidirectional models without positional encoding, and with learned positions, on
   index lookup (`d1..d8 SEP q -> d_q`), beside every position-blind baseline scored the same way, 3 seeds.
3. Attention rank (claim D3): numerical and effective rank of the trained gpt's and bert's attention matrices,
   beside the same models at initialisation and uniform attention (what the mask alone gives); and again for a
   gpt and a bert with heads much smaller than the window (8 vs 255 at CPU scale), where the claim's bottleneck
   (a head's logits have rank <= head size) can bite.
4. Ablation (claim C2): BERT's 80/10/10 against 100% [MASK], measured at positions that are not [MASK].
Writes study_results/study-<scale>.md (the table README shows) and .json.
"""
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

import objectives
import train
from configurator import UserError, apply_overrides, check_seed, model_config, pick_device, run_main
from progress import Progress, StopSignals, format_duration
from dataset import get_windows, load_dataset
from model import IGNORE_INDEX, ModelConfig, Transformer

DEFAULTS = dict(scale="cpu", quick=False, device="auto", dataset="shakespeare_char", out_dir="study_results",
                seed=1337, quiet=False)  # quiet=True: no training log lines (only the study's own)

SCALES = {  # model size and the FLOPs budget, expressed as gpt iterations
    "cpu": dict(n_layer=4, n_head=4, n_embd=128, block_size=64, batch_size=12, gpt_iters=2000, eval_windows=64,
                bayes_windows=24, nope_steps=1500, nope_seeds=3, eval_iters=20,
                small_head=dict(n_layer=2, n_head=4, n_embd=32, block_size=256, batch_size=8, gpt_iters=3000,
                                eval_iters=5)),
    "gpu": dict(n_layer=6, n_head=6, n_embd=384, block_size=256, batch_size=64, gpt_iters=5000, eval_windows=256,
                bayes_windows=32, nope_steps=3000, nope_seeds=3, eval_iters=100,
                small_head=dict(n_layer=4, n_head=8, n_embd=64, block_size=1024, batch_size=16, gpt_iters=2000,
                                eval_iters=20)),
    "quick": dict(n_layer=1, n_head=2, n_embd=32, block_size=32, batch_size=4, gpt_iters=15, eval_windows=4,
                  bayes_windows=2, nope_steps=10, nope_seeds=2, eval_iters=2,
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
LN2 = math.log(2)


# ----------------------------------------------------------------------------- training at equal FLOPs

def train_all(models, s, dataset, checkpoints, device, meta, seed, quiet):
    """Train each (name, arch, objective, extra settings) of `models` on `dataset` to the same training FLOPs:
    s["gpt_iters"] iterations of the gpt of shape s. Checkpoints go to <checkpoints>-<name>. Returns
    ({name: train.train's summary + seconds and objective}, budget), or (None, budget) if interrupted."""
    budget = flops_budget(s, meta)
    trained, started = {}, time.perf_counter()
    for number, (name, arch, objective, extra) in enumerate(models):
        if trained:  # equal FLOPs: models cost about the same, so the mean so far predicts the rest
            per_model = (time.perf_counter() - started) / len(trained)
            left = f", ~{format_duration(per_model * (len(models) - number))} of training left"
        else:
            left = ""
        print(f"[train at equal FLOPs] model {number + 1}/{len(models)}: {name} ({arch}, {objective}){left}", flush=True)
        layers = dict(n_layer=s["n_layer"] // 2 or 1, n_decoder_layer=s["n_layer"] // 2 or 1) if arch == "t5" else {}
        args = dict(arch=arch, objective=objective, dataset=dataset, device=device,
                    out_dir=f"{checkpoints}-{name}", n_layer=s["n_layer"],
                    n_head=s["n_head"], n_embd=s["n_embd"], block_size=s["block_size"], batch_size=s["batch_size"],
                    dropout=0.0, bias=False, max_iters=10 ** 9, max_flops=float(budget),
                    lr_decay_iters=s["gpt_iters"], warmup_iters=min(100, s["gpt_iters"] // 10),
                    learning_rate=1e-3, min_lr=1e-4, beta2=0.99, eval_interval=10 ** 9, eval_iters=20,
                    log_interval=10 ** 9, seed=seed, quiet=quiet, overwrite=True)
        args.update(**layers, **extra, eval_iters=s["eval_iters"])
        run_config = train.resolve_config([f"--{k}={v}" for k, v in args.items()])
        # every model decays its learning rate over its own share of the budget: its own iteration count
        per_step = estimate_step_flops(run_config, s, meta)
        run_config["lr_decay_iters"] = int(budget / per_step) + 1
        t0 = time.perf_counter()
        try:
            result = train.train(run_config)
        except train.TrainingDiverged as e:
            raise UserError(f"{name} diverged: {e}") from None
        if result["interrupted"]:
            not_trained = [m[0] for m in models[number:]]
            print(f"interrupted: trained {', '.join(trained) or 'no model'}; not finished: {', '.join(not_trained)} "
                  f"({name}'s checkpoint is in {run_config['out_dir']}); no metrics computed, they compare every "
                  f"model", flush=True)
            return None, budget
        result["seconds"] = time.perf_counter() - t0
        result["objective"] = objective
        print(f"trained {name}: {result['iter_num']} iterations, {result['flops'] / 1e12:.2f} TFLOP, "
              f"{result['seconds']:.0f} s, val loss {result['val_loss']:.4f} ({objective})", flush=True)
        trained[name] = result
    return trained, budget


def flops_budget(s, meta):
    """Every model's training FLOPs: s["gpt_iters"] iterations of the gpt of shape s."""
    gpt = Transformer(ModelConfig(arch="gpt", vocab_size=meta["vocab_size"], block_size=s["block_size"], n_layer=s["n_layer"],
                                  n_head=s["n_head"], n_embd=s["n_embd"], bias=False))
    one_batch = objectives.clm(torch.zeros(s["batch_size"], s["block_size"] + 1, dtype=torch.long))
    return s["gpt_iters"] * gpt.training_flops(one_batch)


def estimate_step_flops(config, s, meta):
    """FLOPs of one training step, from a batch the objective really produces (t5's lengths depend on it)."""
    model = Transformer(model_config(config, vocab_size=meta["vocab_size"]))
    specials = objectives.Specials.from_meta(meta)
    windows = torch.randint(0, specials.num_ordinary, (s["batch_size"], s["block_size"] + 1))
    return model.training_flops(train.batch_for(config, windows, specials, torch.Generator().manual_seed(0)))


# ----------------------------------------------------------------------------- common metrics

def text_log_probs(logits, num_ordinary):
    """Log-probabilities over the text characters only: every model is scored as a distribution over text."""
    return torch.log_softmax(logits[..., :num_ordinary].float(), dim=-1)


@torch.no_grad()
def second_half_bits(name, model, windows, specials, generator):
    """Bits per character of windows[:, H:] given windows[:, :H] (H = T/2). Returns (bits, extra dict)."""
    N, T = windows.shape
    H = T // 2
    V = specials.num_ordinary
    arch, device = model.config.arch, windows.device
    targets = windows[:, H:]  # (N, T - H)
    if arch in ("gpt", "prefixlm"):
        prefix = torch.full((N,), H, device=device) if arch == "prefixlm" else None
        logp = text_log_probs(model(windows[:, :-1], prefix_length=prefix)[0][:, H - 1:], V)
        nll = -logp.gather(-1, targets[..., None]).sum()
        return (nll / targets.numel() / LN2).item(), {}
    if arch == "t5":  # the first half to the encoder, the second half as the span after sentinel <S0>
        sentinel, eos = specials.sentinels[0], specials.eos
        column = lambda token: torch.full((N, 1), token, device=device)  # noqa: E731
        encoder = torch.cat([windows[:, :H], column(sentinel), column(eos)], dim=1)
        decoder = torch.cat([column(specials.pad), column(sentinel), targets[:, :-1]], dim=1)
        logp = text_log_probs(model(encoder, decoder_inputs=decoder)[0][:, 1:], V)
        nll = -logp.gather(-1, targets[..., None]).sum()
        return (nll / targets.numel() / LN2).item(), {}
    # bidirectional: chain rule left to right, [MASK] on every position not scored yet (one pass per position)
    nll = 0.0
    for k in range(H, T):
        inputs = windows.clone()
        inputs[:, k:] = specials.mask
        logp = text_log_probs(model(inputs)[0][:, k], V)
        nll -= logp.gather(-1, windows[:, k:k + 1]).sum().item()
    extra = {}
    if name == "diffusion":  # the ELBO of the second half: t ~ U(0,1), mask with prob t, weight 1/t
        samples, total = 32, 0.0
        for _ in range(samples):
            t = torch.rand(N, 1, generator=generator).clamp(min=1e-3).to(device)
            masked = torch.zeros_like(windows, dtype=torch.bool)
            masked[:, H:] = torch.rand(N, T - H, generator=generator).to(device) < t
            inputs = torch.where(masked, specials.mask, windows)
            logp = text_log_probs(model(inputs)[0], V).gather(-1, windows[..., None])[..., 0]
            total += (-(logp * masked) / t).sum().item()
        extra["elbo_bits"] = total / samples / targets.numel() / LN2
    return nll / targets.numel() / LN2, extra


@torch.no_grad()
def cloze_accuracy(name, model, windows, blanks, specials, bayes_windows):
    """Accuracy on single blanked characters (the rest of the window intact). blanks: (N, k) positions >= 1."""
    N, T = windows.shape
    V = specials.num_ordinary
    arch, device = model.config.arch, windows.device
    truth = windows.gather(1, blanks)  # (N, k)
    k = blanks.size(1)
    rows = torch.arange(N * k, device=device)
    results = {}
    if arch in ("bert",):
        inputs = windows.repeat_interleave(k, 0)  # one copy per blank
        inputs[rows, blanks.flatten()] = specials.mask
        predicted = text_log_probs(model(inputs)[0][rows, blanks.flatten()], V).argmax(-1)
        results["both sides"] = (predicted == truth.flatten()).float().mean().item()
    elif arch == "t5":
        inputs = windows.repeat_interleave(k, 0)
        inputs[rows, blanks.flatten()] = specials.sentinels[0]
        encoder = torch.cat([inputs, torch.full((N * k, 1), specials.eos, device=device)], dim=1)
        decoder = torch.tensor([[specials.pad, specials.sentinels[0]]], device=device).expand(N * k, -1)
        predicted = text_log_probs(model(encoder, decoder_inputs=decoder)[0][:, 1], V).argmax(-1)
        results["both sides"] = (predicted == truth.flatten()).float().mean().item()
    else:  # left context only: the logits just before the blank
        if arch == "prefixlm":  # everything before the blank is a bidirectional prefix
            inputs = windows.repeat_interleave(k, 0)
            logits = model(inputs[:, :-1], prefix_length=blanks.flatten())[0]
            predicted = text_log_probs(logits[rows, blanks.flatten() - 1], V).argmax(-1)
        else:
            logits = model(windows[:, :-1])[0]
            predicted = text_log_probs(logits.gather(1, (blanks - 1)[..., None].expand(-1, -1, logits.size(-1))),
                                       V).argmax(-1).flatten()
        results["left only"] = (predicted == truth.flatten()).float().mean().item()
        if arch == "gpt":  # exact Bayes: p(c | both sides) is proportional to p(window with c); V passes per blank
            correct = total = 0
            for n in range(min(N, bayes_windows)):
                for j in range(k):
                    candidates = windows[n].repeat(V, 1)
                    candidates[:, blanks[n, j]] = torch.arange(V, device=device)
                    logp = text_log_probs(model(candidates[:, :-1])[0], V)
                    score = logp.gather(-1, candidates[:, 1:, None])[..., 0].sum(-1)
                    correct += int(score.argmax() == truth[n, j])
                    total += 1
            results["both sides (exact Bayes)"] = correct / total
    return results


def character_counts(train_path, num_ordinary):
    return np.bincount(np.memmap(train_path, dtype=np.uint16, mode="r"), minlength=num_ordinary)[:num_ordinary]


def character_frequency_bits(train_path, windows, num_ordinary):
    """The trivial rule under the common metric: bits/char of the windows' second halves when every character
    comes from the training text's character frequencies (add-one smoothed)."""
    counts = character_counts(train_path, num_ordinary)
    log_p = torch.log(torch.tensor((counts + 1) / (counts + 1).sum(), dtype=torch.float64)).to(windows.device)
    H = windows.size(1) // 2
    return -log_p[windows[:, H:]].mean().item() / LN2


def unigram_reference(train_path, windows, blanks, num_ordinary):
    """The floor every model must beat: character frequencies from the training split (bits/char of the second
    halves, and cloze accuracy when always guessing the most frequent character)."""
    most_frequent = int(character_counts(train_path, num_ordinary).argmax())
    cloze = (windows.gather(1, blanks) == most_frequent).float().mean().item()
    return {"bits_per_char": character_frequency_bits(train_path, windows, num_ordinary), "cloze": cloze}


def mean_std(values):
    """(mean, sample std) over seeds, ignoring missing values; std None for a single value, (None, None) for none."""
    values = [v for v in values if v is not None]
    if not values:
        return None, None
    return float(np.mean(values)), float(np.std(values, ddof=1)) if len(values) > 1 else None


# ----------------------------------------------------------------------------- claim C2: the ablation

@torch.no_grad()
def non_mask_positions(model, windows, specials, generator):
    """Prediction quality where the input is not [MASK]: 15% of characters replaced by a random one (no [MASK]
    anywhere): accuracy at the replaced positions (recover the original) and at untouched ones (identity)."""
    V = specials.num_ordinary
    chosen = (torch.rand(windows.shape, generator=generator) < 0.15).to(windows.device)
    random_tokens = torch.randint(0, V, windows.shape, generator=generator).to(windows.device)
    replaced = chosen & (random_tokens != windows)
    inputs = torch.where(replaced, random_tokens, windows)
    predicted = text_log_probs(model(inputs)[0], V).argmax(-1)
    correct = predicted == windows
    masked_inputs = torch.where(chosen, specials.mask, windows)
    at_mask = text_log_probs(model(masked_inputs)[0], V).argmax(-1) == windows
    return {"at [MASK]": at_mask[chosen].float().mean().item(),
            "at replaced characters": correct[replaced].float().mean().item(),
            "at untouched characters": correct[~chosen].float().mean().item()}


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
    return [rank_summary(probabilities) for probabilities in model.attention_maps(windows)]  # (N, nh, T, T) each


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

def resolve_experiment(defaults, scales):
    """The common start of study.py and incontext.py: overrides, the scale (--quick wins), seed and device."""
    config = apply_overrides(defaults, sys.argv[1:])
    scale = "quick" if config["quick"] else config["scale"]
    if scale not in scales:
        raise UserError(f"unknown --scale={scale}: {', '.join(k for k in scales if k != 'quick')} (or --quick)")
    check_seed(config["seed"])
    return config, scale, pick_device(config["device"])


def main():
    config, scale, device = resolve_experiment(DEFAULTS, SCALES)
    torch.manual_seed(config["seed"])
    s = SCALES[scale]
    t0 = time.perf_counter()
    splits, meta = load_dataset(config["dataset"], s["block_size"], prepare_if_missing=True)
    trained, budget = train_all(MODELS, s, config["dataset"], os.path.join(config["out_dir"], "checkpoints", scale),
                                device, meta, config["seed"], config["quiet"])
    if trained is None:  # interrupted during training: what finished is on disk, and said
        return
    specials = objectives.Specials.from_meta(meta)
    rng = np.random.default_rng(config["seed"] + 7)
    # block_size - 1 characters: room for the EOS that t5 expects after its input
    windows = get_windows(splits["val"], s["eval_windows"], s["block_size"] - 2, rng).to(device)
    N, T = windows.shape
    k = max(1, round(0.15 * (T - 1)))
    blanks = torch.stack([torch.randperm(T - 1, generator=torch.Generator().manual_seed(i))[:k] + 1
                          for i in range(N)]).sort(dim=1).values.to(device)

    rows, data = [], {"scale": scale, "device": device, "budget_flops": budget, "models": {}}
    not_done = [name for name in trained] + ["reference", "ablation", "attention_rank", "attention_rank_small_head",
                                             "nope"]
    try:  # Ctrl-C or SIGTERM: what was measured is written, and the message names what was not
        with StopSignals(immediate=True):
            for number, (name, result) in enumerate(trained.items()):
                print(f"[study] metrics {number + 1}/{len(trained)}: {name}, "
                      f"{format_duration(time.perf_counter() - t0)} so far", flush=True)
                model = result["model"].eval()
                generator = torch.Generator().manual_seed(config["seed"])
                bits, extra = second_half_bits(name, model, windows, specials, generator)
                cloze = cloze_accuracy(name, model, windows, blanks, specials, s["bayes_windows"])
                entry = {"arch": model.config.arch, "objective": result["objective"],
                         "parameters": model.num_parameters(), "iterations": result["iter_num"],
                         "flops": result["flops"], "seconds": result["seconds"],
                         "supervised_seen": result["supervised_seen"], "tokens_seen": result["tokens_seen"],
                         "val_loss": result["val_loss"], "second_half_bits_per_char": bits, "cloze": cloze, **extra}
                data["models"][name] = entry
                not_done.remove(name)
                cloze_text = ", ".join(f"{kind} {100 * value:.1f}%" for kind, value in cloze.items())
                elbo = f" (ELBO {extra['elbo_bits']:.3f})" if "elbo_bits" in extra else ""
                rows.append([name, result["objective"], f"{entry['parameters'] / 1e6:.2f}M", entry["iterations"],
                             f"{entry['flops'] / 1e12:.2f}", f"{entry['supervised_seen']:,}", f"{entry['seconds']:.0f}",
                             f"{entry['val_loss']:.3f}", f"{bits:.3f}{elbo}", cloze_text])
            reference = unigram_reference(splits["train"], windows, blanks, specials.num_ordinary)
            data["unigram_reference"] = reference
            not_done.remove("reference")
            rows.append(["character frequencies (reference)", "-", "-", "-", "-", "-", "-", "-",
                         f"{reference['bits_per_char']:.3f}",
                         f"{100 * reference['cloze']:.1f}% (always the most frequent)"])
            g = torch.Generator().manual_seed(config["seed"])
            data["ablation"] = {name: non_mask_positions(trained[name]["model"], windows, specials, g)
                                for name in ("bert", "bert-100%-mask")}
            not_done.remove("ablation")
            ranks = {name: attention_ranks(trained[name]["model"], windows[:16]) for name in ("gpt", "bert")}
            baselines = attention_rank_baselines({name: trained[name]["model"] for name in ("gpt", "bert")},
                                                 windows[:16], config["seed"])
            data["attention_rank"], data["attention_rank_baselines"] = ranks, baselines  # both, or neither
            not_done.remove("attention_rank")
            # claim D3's bottleneck: a head's logits q k^T have rank <= head size, so it can only bite when the head
            # size is well below T (above: 32 vs 63). gpt and bert again, small heads, long windows, equal FLOPs
            small = s["small_head"]
            print(f"[study] attention rank at head size {small['n_embd'] // small['n_head']}, T = "
                  f"{small['block_size'] - 1} (claim D3): training gpt and bert", flush=True)
            small_trained, _ = train_all([m for m in MODELS if m[0] in ("gpt", "bert")], small, config["dataset"],
                                         os.path.join(config["out_dir"], "checkpoints", f"{scale}-small-head"),
                                         device, meta, config["seed"], quiet=True)
            if small_trained is None:  # interrupted: what was measured is written
                raise KeyboardInterrupt
            small_models = {name: result["model"].eval() for name, result in small_trained.items()}
            long_windows = get_windows(splits["val"], 16, small["block_size"] - 2, rng).to(device)
            data["attention_rank_small_head"] = {
                "ranks": {name: attention_ranks(model, long_windows) for name, model in small_models.items()},
                "baselines": attention_rank_baselines(small_models, long_windows, config["seed"])}
            not_done.remove("attention_rank_small_head")
            print("[study] NoPE experiment (claim D5)", flush=True)
            data["nope"] = nope_experiment(s["nope_steps"], device,
                                           [config["seed"] + i for i in range(s["nope_seeds"])])
            not_done.remove("nope")
    except KeyboardInterrupt:
        data["not_done"] = not_done
        print(f"interrupted: not measured: {', '.join(not_done)}; writing what was", flush=True)
    data["seconds"] = time.perf_counter() - t0

    V = specials.num_ordinary
    lines = [f"Equal-compute study, scale `{scale}` ({s['n_layer']} layers x {s['n_embd']} dims, block "
             f"{s['block_size']}, batch {s['batch_size']}), budget {budget / 1e12:.2f} TFLOP per model (= "
             f"{s['gpt_iters']} gpt iterations), device {device}, {N} held-out windows. Whole run "
             f"{data['seconds'] / 60:.1f} min. t5 splits the layers, {s['n_layer'] // 2 or 1} + {s['n_layer'] // 2 or 1}; "
             f"gpt's exact-Bayes cloze uses the first {min(N, s['bayes_windows'])} windows ({V} forward passes per "
             f"blank), every other cloze all {N}. The last row is what character frequencies alone achieve: models "
             f"near it learned little beyond them at this budget.", "",
             "| model | objective | params | iters | TFLOP | supervised positions | train s | val loss (own units) "
             "| bits/char, 2nd half given 1st | cloze accuracy |", "|" + "---|" * 10]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    if "gpt" in data["models"] and "diffusion" in data["models"]:
        lines += ["", f"Validation loss as bits/char: gpt exact NLL {data['models']['gpt']['val_loss'] / LN2:.3f}, "
                      f"diffusion ELBO (upper bound on its NLL) {data['models']['diffusion']['val_loss'] / LN2:.3f}."]
    if "ablation" in data:
        lines += ["", "Claim C2, prediction where the input is not [MASK] (accuracy):", "",
                  "| model | at [MASK] | at replaced characters | at untouched characters |", "|---|---|---|---|"]
        lines += [f"| {name} | " + " | ".join(f"{100 * v:.1f}%" for v in values.values()) + " |"
                  for name, values in data["ablation"].items()]
    if "nope" in data:
        seeds = len(data["nope"]["causal, NoPE"])
        lines += ["", f"Claim D5, index lookup (`BOS d1..d8 SEP q -> d_q`, one answer token; {s['nope_steps']} steps, "
                      f"{seeds} seeds, mean +- std over seeds; the last three rows are rules that ignore order, "
                      f"scored on the same examples):", "", "| model or rule | accuracy |", "|---|---|"]
        for name, values in data["nope"].items():
            mean, std = mean_std(values)
            lines.append(f"| {name} | {100 * mean:.1f}%" + (f" +- {100 * std:.1f}" if std is not None else "") + " |")
    if "attention_rank" in data:
        lines += rank_table(data["attention_rank"], data["attention_rank_baselines"], s, min(16, N))
    if "attention_rank_small_head" in data:
        small = data["attention_rank_small_head"]
        lines += rank_table(small["ranks"], small["baselines"], s["small_head"], 16)
    if "not_done" in data:
        lines += ["", f"**Interrupted: not measured: {', '.join(data['not_done'])}.**"]
    text = "\n".join(lines)
    print("\n" + text)
    os.makedirs(config["out_dir"], exist_ok=True)
    with open(os.path.join(config["out_dir"], f"study-{scale}.md"), "w") as f:
        f.write(text + "\n")
    with open(os.path.join(config["out_dir"], f"study-{scale}.json"), "w") as f:
        json.dump(data, f, indent=1)
    if data["models"]:
        plot(data, os.path.join(config["out_dir"], f"study-{scale}.png"))


def rank_table(ranks, base, setting, windows_used):
    """Markdown lines of claim D3's table: per layer, trained beside initialisation, with uniform attention."""
    pair = lambda r: f"{r['numerical']:.1f} / {r['effective']:.1f}"  # noqa: E731
    T = setting["block_size"] - 1
    lines = ["", f"Claim D3, attention rank (T = {T}, head size {setting['n_embd'] // setting['n_head']}, "
                 f"{setting['n_layer']} layers x {setting['n_embd']} dims; numerical / effective, mean over heads and "
                 f"{windows_used} windows), trained beside the same models at initialisation; uniform attention gives "
                 f"{pair(base['uniform causal'])} causal and {pair(base['uniform bidirectional'])} bidirectional:", "",
             "| layer | gpt trained | gpt at init | bert trained | bert at init |", "|---|---|---|---|---|"]
    lines += [f"| {i} | {pair(g_)} | {pair(gi)} | {pair(b_)} | {pair(bi)} |" for i, (g_, gi, b_, bi) in
              enumerate(zip(ranks["gpt"], base["gpt at initialisation"], ranks["bert"], base["bert at initialisation"]))]
    return lines


def plot(data, path):
    """Bits/char of the second half and cloze accuracy per model, when matplotlib is installed."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    names = list(data["models"])
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    left.bar(names, [data["models"][n]["second_half_bits_per_char"] for n in names])
    left.set_ylabel("bits/char, second half given the first")
    cloze = [(f"{n}: {kind}", value) for n in names for kind, value in data["models"][n]["cloze"].items()]
    right.barh([c[0] for c in cloze], [100 * c[1] for c in cloze])
    right.set_xlabel("cloze accuracy (%)")
    for axis in (left,):
        axis.tick_params(axis="x", rotation=30)
    fig.suptitle(f"Equal compute ({data['budget_flops'] / 1e12:.1f} TFLOP each), scale {data['scale']}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    run_main(main)
