"""
Question: what does pretraining give a head trained on few labels (claim B2, the 2018 paradigm: pretrain once,
fine-tune a small head per task)? Each of the study's pretrained backbones gets a fresh head and is fine-tuned on
N labelled lines; beside it its twin, the same architecture and size from random weights, trained on the same N
labels by the same recipe; beside both the rules.

    python experiments/fewlabels.py --jobs=2    # 2 label counts x 2 starts x 3 readers x 3 seeds x 3 rates, each
                                                # cell trained to early stopping, then one rate past each edge kept
                                                # (126 cells): 42 minutes on 2 cores of an Intel Xeon, the study's
                                                # checkpoints present (missing: ~30 more)
                                                # -> results/structural/fewlabels-cpu.{md,json,png}
    python experiments/fewlabels.py --quick     # a smoke run in seconds (the test suite runs it) -> out-quick/

The task (experiments/encoder_tasks.py's misspelt_lines): is a line of the text as written, or does it hold one
misspelt word (two neighbouring letters inside a whole word swapped, into no word of the training text)? Both kinds
hold the same letters, spaces and word lengths, so a bag of character n-grams learnt from N labels sees little; the
pretraining text spelt every word many times, so a backbone that learnt to predict it knows how they are spelt.
Training lines from the training split (the N-label sets nested: the smaller is the start of the larger), the
tuning items (the rate and the stopping step of every reader alike, held out of the training lines) too, the
evaluation lines from the validation split.

Readers (the pooled state a head reads, as experiments/encoders.py's judgement): gpt's last position (the only one
that has read the whole line), bert's and prefixlm's mean. Each (label count, start, reader) trains until its
accuracy on the tuning items stops improving, at every rate of the grid, the rate kept by its mean tuning accuracy
over seeds (experiments/recipe.py); from scratch is the same Transformer, built from the checkpoint's config with
fresh weights (the seed's).

Baselines under the same scoring: the majority class, a character 1-3-gram logistic regression tuned on the same N
labels (experiments/tasks.py), and a rule told the task (a word of four letters or more that the training text
never spells so: misspelt), which needs no label and shows the task is well posed.

Effect control (the winner first): some pretrained reader's mean - std above both its from-scratch twin's mean +
std and the n-gram rule, at some label count; else B2's payoff is "not reproduced" at these label counts and steps.
"""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # python experiments/fewlabels.py
import infra.quiet_interrupts  # noqa: E402,F401  (before torch: a Ctrl-C while it loads ends quietly)

import numpy as np
import torch
import torch.nn.functional as F

from experiments.encoder_tasks import misspelt_lines, whole_words, words_of
from experiments.encoders import classifier_cell
from experiments.equal_compute import machine_line, resolve_experiment, write_results
from experiments.fewlabels_report import READERS, STARTS, controls, plot, report
from experiments.finetune import Backbone, study_backbones
from experiments.recipe import note_stop, run_grid
from experiments.study_report import plateau_threshold
from experiments.tasks import ngram_features, read_texts, tuned_logistic_regression
from infra.configurator import UserError, check_input_folder, output_folder, run_main
from infra.progress import StopSignals
from model import Transformer

DEFAULTS = dict(scale="cpu", quick=False, device="auto", dataset="shakespeare_char", out_dir="results/structural",
                study_dir="results/study", seed=1337, jobs=1)
SCALES = {  # line: characters a line; labels: the label counts N; tune, eval: items
    "cpu": dict(study_scale="cpu", line=20, labels=(300, 1000), tune=300, eval=1000, max_steps=1500,
                check_every=100, patience=3, batch_size=32, rates=(3e-4, 1e-3, 3e-3), grown=(1e-4, 1e-2),
                head_learning_rate=3e-3, warmup=0.1, seeds=3),
    "gpu": dict(study_scale="gpu", line=60, labels=(300, 1000, 3000), tune=1000, eval=2000, max_steps=8000,
                check_every=250, patience=4, batch_size=64, rates=(3e-5, 1e-4, 3e-4), grown=(1e-5, 1e-3),
                head_learning_rate=3e-3, warmup=0.1, seeds=3),
    "quick": dict(study_scale="quick", line=16, labels=(8, 16), tune=8, eval=16, max_steps=4, check_every=2,
                  patience=1, batch_size=8, rates=(1e-3, 3e-3), grown=(3e-4, 1e-2), head_learning_rate=3e-3,
                  warmup=0.1, seeds=1),
}


# ----------------------------------------------------------------------------- the task and the rules

def make_task(texts, s, seed):
    """The training lines (the first N of them for label count N), the tuning lines after them, the evaluation
    lines from the validation split (no line of the training split among them)."""
    rng = np.random.default_rng(seed)
    words = words_of(texts["train"])
    lines, labels = misspelt_lines(texts["train"], max(s["labels"]) + s["tune"], s["line"], rng, words)
    evaluation, eval_labels = misspelt_lines(texts["val"], s["eval"], s["line"], rng, words, exclude=set(lines))
    n = max(s["labels"])
    return {"train": lines[:n], "train_labels": labels[:n], "tune": lines[n:], "tune_labels": labels[n:],
            "eval": evaluation, "eval_labels": eval_labels, "words": words}


def told_rule(lines, words):
    """The rule told the task: misspelt (1) where a whole word of four letters or more (not cut by the line's edges)
    is spelt as the training text never spells a word; else as written (0). It reads no label."""
    return np.array([int(any(m.group() not in words for m in whole_words(line))) for line in lines])


def highest_surprise(backbone, lines, batch=256):
    """Per line, the highest loss (nats) of the pretrained model's own predictions of its characters, no
    fine-tuning: gpt's next-character predictions; bert's prediction of each character masked in turn (its
    pseudo-likelihood: one pass per position). Where a word is misspelt, a model that learnt the spelling is
    surprised."""
    out = []
    model = backbone.model
    with torch.no_grad():
        for i in range(0, len(lines), batch):
            ids, lengths = backbone.encode(lines[i:i + batch])
            if backbone.arch == "gpt":  # position t - 1 predicts character t (claim D4's causal read)
                loss = F.cross_entropy(model.logits(model.run_stack(ids))[:, :-1].transpose(1, 2), ids[:, 1:],
                                       reduction="none")  # (B, T - 1)
                real = torch.arange(1, ids.size(1), device=ids.device)[None, :] < lengths[:, None]
            else:  # bert: character t masked, read from both sides
                loss = torch.stack([F.cross_entropy(model.logits(model.run_stack(
                    ids.index_fill(1, torch.tensor([t], device=ids.device), backbone.mask), lengths=lengths)[:, t]),
                    ids[:, t], reduction="none") for t in range(ids.size(1))], 1)  # (B, T)
                real = torch.arange(ids.size(1), device=ids.device)[None, :] < lengths[:, None]
            out.append(loss.masked_fill(~real, float("-inf")).amax(1).cpu())
    return torch.cat(out).numpy()


def threshold_rule(train_scores, train_labels, eval_scores):
    """Label 1 above a threshold, the one between two training scores that labels the training lines best (the
    lowest on a tie): a one-number classifier fitted on the N labels."""
    ordered = np.sort(np.unique(train_scores))
    cuts = np.concatenate([[ordered[0] - 1], (ordered[1:] + ordered[:-1]) / 2])
    right = [((train_scores > cut) == train_labels).mean() for cut in cuts]
    return (eval_scores > cuts[int(np.argmax(right))]).astype(int)


SURPRISED = ("gpt", "bert")  # the pretrained models whose own predictions read a line's every character


def surprise_readers(folders, seeds, task, s, device):
    """{model: {N: [accuracy per seed]}}: each pretrained model's highest surprise over a line, with a threshold
    fitted on the first N training lines."""
    out = {model: {str(n): [] for n in s["labels"]} for model in SURPRISED}
    for model in SURPRISED:
        for seed in seeds:
            print(f"[fewlabels] {model}'s own surprise over every line, seed {seed} (bert: a pass per position)",
                  flush=True)
            backbone = Backbone(folders[(model, seed)], device)
            train, evaluation = highest_surprise(backbone, task["train"]), highest_surprise(backbone, task["eval"])
            for n in s["labels"]:
                predicted = threshold_rule(train[:n], task["train_labels"][:n], evaluation)
                out[model][str(n)].append(float((predicted == task["eval_labels"]).mean()))
    return out


def rules(task, s, log=lambda *a, **k: None):
    """Per label count: the majority class and the tuned n-gram regression on the first N training lines; the rule
    told the task (no labels)."""
    truth, out = task["eval_labels"], {}
    for n in s["labels"]:
        y = task["train_labels"][:n]
        predicted = tuned_logistic_regression(ngram_features(task["train"][:n]), y, ngram_features(task["eval"]), 2,
                                              log=log)
        out[str(n)] = {"majority class": float((truth == np.bincount(y).argmax()).mean()),
                       "n-gram logistic regression": float((predicted == truth).mean())}
    out["told"] = float((told_rule(task["eval"], task["words"]) == truth).mean())
    return out


# ----------------------------------------------------------------------------- the cells, here or in workers

WORKER = {}  # what the cells read: set here, or in each worker process (--jobs > 1) by prepare


def prepare(config, s, folders, device, task=None):
    """The task (built from the seed: the same items in every process), the scale and the backbones' folders."""
    WORKER.update(task=task or make_task(read_texts(config["dataset"]), s, config["seed"]), s=s, folders=folders,
                  device=device)


def run_cell(cell, stop=False):
    """cell: (part, model, how, seed, rate), part "<N> <start>": the backbone of that seed, or its twin from random
    weights, with a fresh head, fine-tuned on the first N training lines to early stopping."""
    part, model, how, seed, rate = cell
    labels, start = part.split(" ", 1)
    task, s = WORKER["task"], dict(WORKER["s"], learning_rate=rate)
    backbone = Backbone(WORKER["folders"][(model, seed)], WORKER["device"])
    if start == "from scratch":  # the same architecture and size, fresh weights: what the labels alone teach
        torch.manual_seed(seed)
        backbone.model = Transformer(backbone.model.config).to(WORKER["device"])
    n = int(labels)
    splits = [(task["train"][:n], task["train_labels"][:n]), (task["tune"], task["tune_labels"]),
              (task["eval"], task["eval_labels"])]
    return cell, dict(classifier_cell(backbone, how, splits, s["max_steps"], s["line"], s, seed, stop),
                      **{"learning rate": rate})


def parts(s):
    """(label count, start) as cell parts, the largest label count first (a stopped run keeps it whole)."""
    return [f"{n} {start}" for n in sorted(s["labels"], reverse=True) for start in STARTS]


def main():
    config, scale, device = resolve_experiment(DEFAULTS, SCALES, "fewlabels")
    check_input_folder(config, "--study_dir", DEFAULTS["study_dir"], "the --out_dir of experiments/study.py or "
                       "finetune.py --study, whose checkpoints are read")
    s = SCALES[scale]
    from experiments.study import SCALES as STUDY_SCALES  # the context of the checkpoints read
    if s["line"] > STUDY_SCALES[s["study_scale"]]["block_size"]:
        raise UserError(f"scale {scale}'s lines are {s['line']} characters, longer than the study's context")
    t0 = time.perf_counter()
    task = make_task(read_texts(config["dataset"]), s, config["seed"])
    seeds = [config["seed"] + k for k in range(s["seeds"])]
    study_dir = output_folder({"quick": config["quick"], "out_dir": config["study_dir"]},
                              {"out_dir": DEFAULTS["study_dir"]})
    began = time.time()
    folders, identities = study_backbones(dict(config, out_dir=study_dir), s["study_scale"], device, seeds,
                                          "--study_dir")
    pretrained_now = any(v["written"] >= int(began) for v in identities.values())
    print("[fewlabels] the rules first: the n-gram regression tuned on each label count", flush=True)
    data = {"scale": scale, "settings": s, "seeds": seeds, "checkpoints": identities,
            "machine": machine_line(device, config, runs=None if pretrained_now else 1),
            "plateau_threshold": plateau_threshold(study_dir, s["study_scale"]), "cells": [],
            "rules": rules(task, s, log=print), "surprise": surprise_readers(folders, seeds, task, s, device),
            "task sizes": {"train": len(task["train"]), "tune": len(task["tune"]), "eval": len(task["eval"])},
            "examples": [[line, int(label)] for line, label in zip(task["eval"][:4], task["eval_labels"][:4])]}
    plan = [(part, model, how, seed, rate) for part in parts(s) for seed in seeds for rate in s["rates"]
            for model, how in READERS]
    jobs = min(config["jobs"], len(plan))
    print(f"[fewlabels] {len(plan)} cells (label counts x starts x readers x seeds x rates), {jobs} at a time, each "
          f"trained until its tuning accuracy stops improving (at most {s['max_steps']} steps)", flush=True)
    arguments = ({k: config[k] for k in ("dataset", "seed")}, s, folders, device)
    prepare(*arguments, task=task)  # here; each worker process makes its own
    try:
        with StopSignals(immediate=True) as stop:
            run_grid(plan, data["cells"], s, seeds, jobs, run_cell, stop, prepare, arguments, "fewlabels", "accuracy")
    except KeyboardInterrupt:
        if not data["cells"]:
            raise  # nothing finished, nothing written (run_main: status 130, what is kept)
        note_stop(data, plan, f"fewlabels-{scale}-partial")
    data["controls"] = controls(data)
    data["seconds"] = time.perf_counter() - t0
    write_results(config["out_dir"], f"fewlabels-{scale}" + ("-partial" if "notes" in data else ""), data,
                  report(data), plot)
    if "notes" in data:
        sys.exit(130)


if __name__ == "__main__":
    run_main(main, interrupted="the study's checkpoints it trained are kept and reused next time")
