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
from experiments.study_report import PROBE_TASKS, plot, report
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


PLATEAU_MARGIN = 0.3  # nats: how far under its context-free reference a run's own validation loss must end


def character_frequency_nats(train_path, val_path, num_ordinary):
    """What character frequencies alone give: the cross-entropy of the validation text under the training text's
    character frequencies (add-one smoothed), nats per character."""
    counts = character_counts(train_path, num_ordinary)
    log_p = np.log((counts + 1) / (counts + 1).sum())
    val = np.memmap(val_path, dtype=np.uint16, mode="r")
    return float(-log_p[val[val < num_ordinary]].mean())


def context_free_reference(model, splits, meta, s, batches=(200, 100), seed=0):
    """The loss, under a model's own objective (its targets and weights, as model.loss averages them), of the best
    predictor that reads nothing but the one input token at the position it predicts: p(target | that token),
    counted on training batches (add-one smoothed) and scored on validation batches. What a model that learned
    nothing from context reaches: character frequencies where that token is [MASK] (bert, diffusion, t5's spans
    mostly), the copy of an unchanged token (bert's 10%), the sentinels' order (t5), the previous character (the
    causal objectives: a bigram, a stricter bar than character frequencies)."""
    name, arch, objective, extra = model
    settings = dict(extra, arch=arch, objective=objective)
    specials, V = objectives.Specials.from_meta(meta), meta["vocab_size"]
    rng, generator = np.random.default_rng(seed), torch.Generator().manual_seed(seed)

    def pairs(split, count):
        for _ in range(count):
            batch = objectives.batch_for(settings, get_windows(splits[split], s["batch_size"], s["block_size"], rng),
                                         specials, generator)
            inputs = batch.decoder_inputs if arch == "t5" else batch.inputs
            weights = torch.ones(batch.targets.shape) if batch.loss_weights is None else batch.loss_weights
            yield inputs.numpy(), batch.targets.numpy(), weights.numpy(), batch.loss_weights is not None

    counts = np.ones((V, V))
    for inputs, targets, weights, _ in pairs("train", batches[0]):
        kept = targets != IGNORE_INDEX
        np.add.at(counts, (inputs[kept], targets[kept]), 1)
    log_p = np.log(counts / counts.sum(1, keepdims=True))
    losses = []
    for inputs, targets, weights, weighted in pairs("val", batches[1]):
        kept = targets != IGNORE_INDEX
        total = -(weights[kept] * log_p[inputs[kept], targets[kept]]).sum()
        losses.append(total / (targets.size if weighted else max(1, kept.sum())))  # model.loss's averages
    return float(np.mean(losses))


def plateau_control(splits, meta, s, models):
    """The positive control every run must pass before it is compared: its own validation loss at least
    PLATEAU_MARGIN under its objective's context-free reference (context_free_reference, from the data). Character
    frequencies are given beside it (the plateau bert and diffusion sat on with learned positions).
    models: entries of MODELS (or the same shape)."""
    V = objectives.Specials.from_meta(meta).num_ordinary
    reference = {model[0]: context_free_reference(model, splits, meta, s) for model in models}
    return {"character_frequencies_nats": character_frequency_nats(splits["train"], splits["val"], V),
            "margin": PLATEAU_MARGIN, "reference": reference,
            "threshold": {name: value - PLATEAU_MARGIN for name, value in reference.items()}}


def past_plateau(val_loss, control, name):
    """Did run `name` learn from context? (a diverged run, val_loss None, did not)"""
    return val_loss is not None and val_loss <= control["threshold"][name]


# ----------------------------------------------------------------------------- claim C2: the ablation

def corrupt_without_mask(windows, num_ordinary, generator):
    """Claim C2's inputs: about 15% of characters replaced by a random other character and no [MASK] anywhere, as
    at fine-tuning time. Returns (inputs, replaced), replaced marking the positions whose character changed."""
    chosen = torch.rand(windows.shape, generator=generator) < 0.15
    random_tokens = torch.randint(0, num_ordinary, windows.shape, generator=generator).to(windows.device)
    replaced = chosen.to(windows.device) & (random_tokens != windows)
    return torch.where(replaced, random_tokens, windows), replaced


@torch.no_grad()
def non_mask_positions(model, windows, specials, generator):
    """The model's own output head where the input is not [MASK] (corrupt_without_mask): accuracy at the replaced
    positions (recover the original) and at untouched ones (identity), and at [MASK] on the same positions. An
    illustration: the 100%-[MASK] model's head never got a loss at a non-[MASK] input, so it fails there by
    construction; correction_probe is the measurement."""
    V = specials.num_ordinary
    inputs, replaced = corrupt_without_mask(windows, V, generator)
    correct = text_log_probs(model(inputs)[0], V).argmax(-1) == windows
    at_mask = text_log_probs(model(torch.where(replaced, specials.mask, windows))[0], V).argmax(-1) == windows
    return {"at [MASK]": at_mask[replaced].float().mean().item(),
            "at replaced characters": correct[replaced].float().mean().item(),
            "at untouched characters": correct[~replaced].float().mean().item()}


def correction_probe(model, train_windows, test_windows, num_ordinary, seed, task="original at replaced", steps=300):
    """Claim C2 measured: does the [MASK] mismatch hurt the *states* a fine-tuned head reads? A new linear head
    is trained on the frozen final states of [MASK]-free inputs of training windows and scored on test_windows.
    task "original at replaced": inputs from corrupt_without_mask, target the original character at the replaced
    positions, which only the context tells (the random character says nothing of it). task "next character":
    clean inputs, target the character at i + 1 from the state at i (it is in the input, one position to the right:
    only attention can bring it to position i). Returns (the head's accuracy, the accuracy of always naming the
    most frequent target of the training positions, on the same test positions)."""
    g = torch.Generator().manual_seed(seed)

    def states(windows):
        if task == "next character":
            with torch.no_grad():
                hidden = model.run_stack(windows)  # (N, T, C)
            return hidden[:, :-1].flatten(0, 1), windows[:, 1:].flatten()
        inputs, replaced = corrupt_without_mask(windows, num_ordinary, g)
        with torch.no_grad():
            hidden = model.run_stack(inputs)  # (N, T, C), after the final norm: what a task head reads
        return hidden[replaced], windows[replaced]

    x_train, y_train = states(train_windows)
    x_test, y_test = states(test_windows)
    torch.manual_seed(seed)
    head = torch.nn.Linear(x_train.size(1), num_ordinary).to(x_train.device)
    optimizer = torch.optim.AdamW(head.parameters(), lr=1e-2, weight_decay=1e-2)
    for _ in range(steps):  # full batch: a few thousand positions
        loss = F.cross_entropy(head(x_train), y_train)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    most_frequent = torch.bincount(y_train, minlength=num_ordinary).argmax()
    with torch.no_grad():
        return (head(x_test).argmax(-1) == y_test).float().mean().item(), (y_test == most_frequent).float().mean().item()


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
            print(f"[study] kept rates at the edge of their grid: " + ", ".join(
                f"{name} gets {lr[0]:g}" for name, lr in new.items()), flush=True)
        trained = train_runs(runs, s, config, device, meta, divergence_is_a_result=True)
        if trained is None:
            return None
        results.update(trained)
        chosen = {name: min(grid, key=lambda lr: mean_loss(results, name, lr, seeds)) for name, grid in grids.items()}
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
