"""
Question: right context decides (claim B1, and X1's mechanism). On a per-character label that depends on what comes
later, is a causal reader capped at what the prefix tells, whatever its training, while a bidirectional one is not?

    python experiments/tagging.py                # 6 readers x probe/full x 3 seeds: 8 minutes measured
                                                 # -> results/structural/tagging-cpu.{md,json}
    python experiments/tagging.py --quick        # a smoke run in seconds (the test suite runs it) -> out-quick/

A causal state at position i is a function of characters 0..i only, so on a label that depends on later ones its
accuracy is capped by the best guess from the prefix; a bidirectional state is not. (A decoder pooled at its last
position sees the whole input, so a whole-sequence label does not separate them: a per-position one does.) Three
labels of every letter of Tiny Shakespeare, each decided by characters to its right:

    ends a word        the next character is not a letter                    (decided one character later)
    long word          its word has five letters or more                     (decided at the fifth letter or the end)
    next word capital  the next word starts with a capital                   (decided at that word's first letter)

Each reader gets windows of 32 characters and a head on every position's final state (one linear map, two
logits per label, class-balanced), trained on windows of the training split and scored on windows of the
validation split, balanced accuracy over the positions of the window's first half whose deciding character lies
inside the window. Readers: the study's equal-FLOPs checkpoints (experiments/finetune.py's, one pretraining run
per seed): gpt (its causal states), gpt reading the window twice and tagged on the second copy (echo embeddings,
Springer et al. 2024: the second copy has seen the whole first), bert, prefixlm (the window as its prefix), t5's
encoder, masked diffusion. probe: the head alone on frozen states; full: backbone and head together.
Beside them, under the same scoring: the best rule that reads only the prefix (a character n-gram of the left
context, n chosen on held-out text) and the best rule that reads both sides (n-grams of both).
"""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # python experiments/tagging.py
import infra.quiet_interrupts  # noqa: E402,F401  (before torch: a Ctrl-C while it loads ends quietly)

import numpy as np
import torch
import torch.nn.functional as F

from experiments.finetune import Backbone, hidden_states, study_backbones
from experiments.study_report import plus_minus
from experiments.tasks import read_texts
from infra.configurator import QUICK_NOTE, check_input_folder, output_folder, run_main
from experiments.equal_compute import machine_line, resolve_experiment, write_results
from infra.progress import StopSignals, format_duration

DEFAULTS = dict(scale="cpu", quick=False, device="auto", dataset="shakespeare_char", out_dir="results/structural",
                study_dir="results/study",  # where experiments/study.py and finetune.py keep their checkpoints
                seed=1337, quiet=True,
                jobs=1)  # the study's pretraining, when missing: how many runs train at once (processes)
SCALES = {  # which study checkpoints (finetune.py's), the windows, the head's training
    "cpu": dict(study_scale="cpu", window=32, train_windows=2000, eval_windows=1000, steps=300, probe_steps=400,
                batch_size=32, learning_rate=3e-4, head_learning_rate=3e-3, seeds=3),
    "gpu": dict(study_scale="gpu", window=128, train_windows=20000, eval_windows=4000, steps=2000, probe_steps=1000,
                batch_size=64, learning_rate=1e-4, head_learning_rate=3e-3, seeds=3),
    "quick": dict(study_scale="quick", window=16, train_windows=64, eval_windows=32, steps=3, probe_steps=5,
                  batch_size=8, learning_rate=3e-4, head_learning_rate=3e-3, seeds=1),
}
LABELS = ("ends a word", "long word", "next word capital")
READERS = [("gpt", "states"), ("gpt", "echo"), ("bert", "states"), ("prefixlm", "states"), ("t5", "states"),
           ("diffusion", "states")]
MODES = ("probe", "full")


# ----------------------------------------------------------------------------- the labels, from the text

def labels_of(text):
    """(labels (3, n) in {1, 0, -1 = not a letter}, decided_at (3, n): the position of the character that decides
    each label)."""
    n = len(text)
    letter = np.array([c.isalpha() for c in text] + [False])
    labels, decided = np.full((3, n), -1), np.zeros((3, n), dtype=int)
    i = 0
    while i < n:
        if not letter[i]:
            i += 1
            continue
        end = i
        while letter[end]:
            end += 1  # the word is text[i:end]
        following = end
        while following < n and not letter[following]:
            following += 1  # the next word's first letter (n: none)
        for j in range(i, end):
            labels[0, j], decided[0, j] = int(j == end - 1), j + 1
            long = end - i >= 5
            labels[1, j], decided[1, j] = int(long), max(j, i + 4 if long else end)
            capital = following < n and text[following].isupper()
            labels[2, j], decided[2, j] = int(capital), following
        i = end
    return labels, decided


def windows_of(text, count, length, rng):
    """count random windows (start offsets) of `length` characters, and which positions of each are scored: the
    first half's letters whose deciding character is inside the window."""
    labels, decided = labels_of(text)
    starts = rng.integers(0, len(text) - length, count)
    offsets = starts[:, None] + np.arange(length)[None, :]  # (count, length)
    y = labels[:, offsets]  # (3, count, length)
    scored = (y >= 0) & (decided[:, offsets] < (starts + length)[None, :, None])
    scored[:, :, length // 2:] = False
    return starts, np.where(scored, y, -1)


def balanced_accuracy(predicted, truth):
    recalls = [(predicted[truth == c] == c).mean() for c in (0, 1) if (truth == c).any()]
    return float(np.mean(recalls))


# ----------------------------------------------------------------------------- rules that read the text

def ngram_rule(train, evaluation, length, left, right):
    """Per label: P(label | the `left` characters ending at i and the `right` after it, inside the window), counted
    on the training windows; predicts 1 where that exceeds the label's base rate (what balanced accuracy rewards).
    train, evaluation: (text, window starts, labels). Returns the balanced accuracy per label on `evaluation`."""
    def contexts(text, starts):
        windows = ["\0" * left + text[s:s + length] + "\0" * right for s in starts]
        return [[w[i:i + left + 1] + "|" + w[i + left + 1:i + left + 1 + right] for i in range(length)] for w in windows]

    (train_text, train_starts, y_train), (eval_text, eval_starts, y_eval) = train, evaluation
    train_contexts, eval_contexts = contexts(train_text, train_starts), contexts(eval_text, eval_starts)
    scores = []
    for label in range(len(LABELS)):
        counts = {}
        for row, ys in zip(train_contexts, y_train[label]):
            for context, y in zip(row, ys):
                if y >= 0:
                    total, ones = counts.get(context, (0, 0))
                    counts[context] = (total + 1, ones + int(y))
        base = y_train[label][y_train[label] >= 0].mean()
        predicted, truth = [], []
        for row, ys in zip(eval_contexts, y_eval[label]):
            for context, y in zip(row, ys):
                if y >= 0:
                    total, ones = counts.get(context, (0, 0))
                    predicted.append(int(total > 0 and ones / total > base))
                    truth.append(int(y))
        scores.append(balanced_accuracy(np.array(predicted), np.array(truth)))
    return scores


def best_rule(train, evaluation, length, sides):
    """The best n-gram rule that reads only the prefix (sides="the prefix") or both sides, for each label: its
    context sizes chosen on held-out training windows (one half fitted, the other scored), then fitted on all of
    them and scored on `evaluation`. Returns (balanced accuracy per label, (left, right) per label)."""
    text, starts, y = train
    half = len(starts) // 2
    first, second = (text, starts[:half], y[:, :half]), (text, starts[half:], y[:, half:])
    sizes = [(n, 0) for n in range(0, 7)] if sides == "the prefix" else [(n, m) for n in range(0, 4) for m in range(1, 4)]
    tuned = {size: ngram_rule(first, second, length, *size) for size in sizes}
    chosen = [max(sizes, key=lambda size: tuned[size][label]) for label in range(len(LABELS))]  # each label its own
    scored = {size: ngram_rule(train, evaluation, length, *size) for size in set(chosen)}
    return [scored[size][label] for label, size in enumerate(chosen)], chosen


# ----------------------------------------------------------------------------- a reader and its head

def reader_states(backbone, text, starts, length, how):
    """Final states (N, length, C) of each window; echo: the window read twice, the states of the second copy."""
    windows = [text[s:s + length] for s in starts]
    ids, lengths = backbone.encode([w + w if how == "echo" else w for w in windows])
    hidden = hidden_states(backbone.model, ids, lengths)
    return hidden[:, -length:] if how == "echo" else hidden[:, :length]


def run_cell(backbone, how, mode, train, evaluation, length, seed, s, stop):
    """Train the head (probe: on frozen states; full: with the backbone) on `train` and return balanced accuracy
    per label on `evaluation`; each is (text, window starts, labels (3, N, length))."""
    (text, starts, y), (eval_text, eval_starts, eval_y) = train, evaluation
    model, C = backbone.model, backbone.model.config.n_embd
    torch.manual_seed(seed)
    head = torch.nn.Linear(C, 2 * len(LABELS)).to(backbone.device)
    targets = torch.from_numpy(y).permute(1, 2, 0).to(backbone.device)  # (N, length, labels), -1 = not scored
    weights = []  # class-balanced: each class counts as much as the other, as balanced accuracy does
    for label in range(len(LABELS)):
        known = targets[..., label][targets[..., label] >= 0]
        ones = known.float().mean().clamp(1e-3, 1 - 1e-3)
        weights.append(torch.stack([0.5 / (1 - ones), 0.5 / ones]))

    def loss_of(states, rows):
        logits = head(states).view(*states.shape[:2], len(LABELS), 2)
        losses = [F.cross_entropy(logits[..., k, :].flatten(0, 1), rows[..., k].flatten(), weight=weights[k],
                                  ignore_index=-1) for k in range(len(LABELS))]
        return sum(losses) / len(LABELS)

    generator = torch.Generator().manual_seed(seed)
    if mode == "probe":
        model.eval()
        with torch.no_grad():
            cached = torch.cat([reader_states(backbone, text, starts[i:i + 256], length, how)
                                for i in range(0, len(starts), 256)])
        optimizer, steps = torch.optim.AdamW(head.parameters(), lr=s["head_learning_rate"], weight_decay=0.0), \
            s["probe_steps"]
    else:
        model.train()
        optimizer = torch.optim.AdamW([{"params": model.parameters(), "lr": s["learning_rate"]},
                                       {"params": head.parameters(), "lr": s["head_learning_rate"]}], weight_decay=0.0)
        steps = s["steps"]
    for _ in range(steps):
        if stop:
            raise KeyboardInterrupt
        index = torch.randperm(len(starts), generator=generator)[:s["batch_size"]]
        states = cached[index.to(cached.device)] if mode == "probe" else \
            reader_states(backbone, text, starts[index.numpy()], length, how)
        loss = loss_of(states, targets[index.to(targets.device)])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    model.eval()
    with torch.no_grad():
        predicted = torch.cat([head(reader_states(backbone, eval_text, eval_starts[i:i + 256], length, how))
                               for i in range(0, len(eval_starts), 256)]).view(len(eval_starts), length, len(LABELS), 2)
    predicted = predicted.argmax(-1).permute(2, 0, 1).cpu().numpy()  # (labels, N, length)
    return [balanced_accuracy(predicted[k][eval_y[k] >= 0], eval_y[k][eval_y[k] >= 0]) for k in range(len(LABELS))]


# ----------------------------------------------------------------------------- the experiment

def report(data, s, scale):
    lines = [QUICK_NOTE, ""] if scale == "quick" else []
    lines += [f"Right context decides (claim B1), scale `{scale}`: windows of {s['window']} characters, "
              f"{s['train_windows']} training windows (training split), {s['eval_windows']} evaluation windows "
              f"(validation split), scored on each window's first half; the study's equal-FLOPs checkpoints "
              f"(experiments/study.py's scale `{s['study_scale']}`), one pretraining run per seed "
              f"({', '.join(map(str, data['seeds']))}); full: {s['steps']} steps, probe: {s['probe_steps']} head "
              f"steps; on {data['machine']}, {data['seconds'] / 60:.1f} min. Balanced accuracy (%) per label, mean "
              f"+- std over seeds.", "",
              "| reader | mode | " + " | ".join(LABELS) + " |", "|---|---|" + "---|" * len(LABELS)]
    for name, how in READERS:
        reader = f"{name} ({how})"
        for mode in MODES:
            cells = [c for c in data["cells"] if (c["reader"], c["mode"]) == (reader, mode)]
            if cells:
                lines.append(f"| {reader} | {mode} | " + " | ".join(
                    plus_minus([c["balanced accuracy"][k] for c in cells], 1, percent=True)
                    for k in range(len(LABELS))) + " |")
    for rule, (scores, sizes) in data["rules"].items():  # (in brackets: the characters it reads left, right)
        lines.append(f"| (rule) {rule}, its context chosen per label | - | "
                     + " | ".join(f"{100 * v:.1f}% ({left} left, {right} right)" for v, (left, right) in
                                  zip(scores, sizes)) + " |")
    lines += ["", "The prefix rule estimates the causal cap from below (a longer prefix can tell more than its "
                  "n-gram); a causal reader above it has found more in the prefix, not in the right context."]
    return "\n".join(lines)


def main():
    config, scale, device = resolve_experiment(DEFAULTS, SCALES, "tagging", (".md", ".json"))
    check_input_folder(config, "--study_dir", DEFAULTS["study_dir"], "the --out_dir of experiments/study.py or "
                       "finetune.py --study, whose checkpoints are read")  # missing: pretrained there
    s = SCALES[scale]
    t0 = time.perf_counter()
    texts = read_texts(config["dataset"])
    rng = np.random.default_rng(config["seed"])
    train = (texts["train"], *windows_of(texts["train"], s["train_windows"], s["window"], rng))
    evaluation = (texts["val"], *windows_of(texts["val"], s["eval_windows"], s["window"], rng))
    seeds = [config["seed"] + k for k in range(s["seeds"])]
    study_dir = output_folder({"quick": config["quick"], "out_dir": config["study_dir"]},
                              {"out_dir": DEFAULTS["study_dir"]})  # --quick: the quick study's, in out-quick/
    backbone_config = dict(config, out_dir=study_dir)
    folders, identities = study_backbones(backbone_config, s["study_scale"], device, seeds)
    data = {"scale": scale, "machine": machine_line(device, config), "seeds": seeds, "checkpoints": identities, "cells": [],
            "rules": {f"n-gram of {sides}": best_rule(train, evaluation, s["window"], sides)
                      for sides in ("the prefix", "both sides")}}
    plan = [(name, how, mode, seed) for seed in seeds for name, how in READERS for mode in MODES]
    try:
        with StopSignals(immediate=True) as stop:
            for number, (name, how, mode, seed) in enumerate(plan):
                elapsed = time.perf_counter() - t0
                left = f", ~{format_duration(elapsed / number * (len(plan) - number))} left" if number else ""
                print(f"[tagging] {number + 1}/{len(plan)}: {name} ({how}), {mode}, seed {seed}{left}", flush=True)
                backbone = Backbone(folders[(name, seed)], device)  # fresh weights: full mode changes them
                scores = run_cell(backbone, how, mode, train, evaluation, s["window"], seed, s, stop)
                data["cells"].append({"reader": f"{name} ({how})", "mode": mode, "seed": seed,
                                      "balanced accuracy": scores})
    except KeyboardInterrupt:
        print(f"interrupted: {len(data['cells'])} of {len(plan)} cells done; they are written", flush=True)
        data["interrupted"] = True
    data["seconds"] = time.perf_counter() - t0
    write_results(config["out_dir"], f"tagging-{scale}", data, report(data, s, scale))
    if data.get("interrupted"):
        sys.exit(130)  # a stop, after writing what finished (docs/reliability.md)


if __name__ == "__main__":
    run_main(main, interrupted="the study's checkpoints it trained are kept and reused next time")
