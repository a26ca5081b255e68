"""
The metrics every experiment on the study's checkpoints shares (experiments/study.py, multiplier.py, epochs.py,
plateau.py): each means the same thing for every architecture, so one number compares a decoder, an
encoder, an encoder-decoder and a masked-diffusion model.

- second_half_bits: bits per character of a window's second half given its first (claim C4), the exact chain rule
  where the architecture has one, the chain rule through [MASK] placeholders (and the ELBO) where it has not;
- cloze_accuracy: single masked characters (claims B1, D1), natively, with a sentinel, from the left, or by exact
  Bayes over every candidate;
- the context-free references a run must get under to count as having learned (plateau_control: its own
  objective's loss with every input position hidden, from the data) and the character frequencies;
- correction_probe: a linear probe on frozen final states (claim C2's ablation, the multiplier's next-character
  probe).
"""
import math

import numpy as np
import torch
import torch.nn.functional as F

import objectives
from infra.dataset import get_windows
from model import IGNORE_INDEX

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
