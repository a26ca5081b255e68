"""
Question: does a reranker that reads the query and a candidate together (a cross-encoder) beat one that compares two
vectors made apart (a bi-encoder), as rerankers are used (claims E3's reranker half, X1)? Both rerank the same
first-stage lists, both learn from the same (query, positive, hard negatives) examples with the same listwise loss,
each until validation stops improving, at its rate chosen over seeds; the compute each spent is its own.

    python experiments/rerankers.py --jobs=2    # 2 tasks x 2 rerankers x 3 seeds x 3 rates (bert), each cell
                                                # trained to early stopping, then one rate past each edge kept
                                                # (48 cells): 64 minutes on 2 cores of an Intel Xeon, tests beside
                                                # it for part of them, the study's checkpoints present (missing:
                                                # ~30 more)
                                                # -> results/structural/rerankers-cpu.{md,json,png}
    python experiments/rerankers.py --quick     # a smoke run in seconds (the test suite runs it) -> out-quick/

Two tasks, made from the text (experiments/encoder_tasks.py), training items from the training split, evaluation
items from the validation split:

- flag: encoders.py's documents, two lines and a last line "A" or "B" that says which line the document is about;
  the query is that line. The answer sits in one line, which a single vector holds: a task built for the bi-encoder.
- detail: groups of near duplicates, one line with one letter changed, at a different place in each; the query is a
  piece of its document that holds the changed letter. Every candidate of the group holds the query's other
  characters in the same places: a vector made before the query was read must have kept every character's place,
  while a reader of the pair only has to compare. A task built for interaction.

As rerankers are used: a cheap first stage (the n-gram cosine rule over every evaluation document) proposes each
query's top CANDIDATES; both rerankers rerank those lists (hits@1: the right document alone ranked first; the
first stage's recall of the right document is the ceiling, reported). Training examples: each training query, its
document, and hard negatives drawn from the first stage's list for it (the negatives a deployed reranker meets).
The listwise loss: cross-entropy of the positive against its negatives, scored by cosine / temperature (bi-encoder)
or by a linear head on the pooled pair (cross-encoder). Early stopping: hits@1 on tuning queries held out of the
training ones, every check_every steps; training stops after `patience` checks without a better one (at most
max_steps), and the weights of the best check are kept. The recipe (a rate grid with warmup and linear decay, the
rate kept by its mean tuning score over seeds, the grid grown past an edge): experiments/recipe.py.

Effect control of the interaction task (the winner first): some cross-encoder's mean - std above its own
bi-encoder's mean + std on the detail task; else the claim reads "not reproduced up to max_steps", with the curve
of tuning hits@1 against training FLOPs. Baselines under the same scoring: chance among the list, and the first
stage's own order (the n-gram rule).
"""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # python experiments/rerankers.py
import infra.quiet_interrupts  # noqa: E402,F401  (before torch: a Ctrl-C while it loads ends quietly)

import numpy as np
import torch
import torch.nn.functional as F

from experiments.encoder_tasks import documents, near_duplicates, text_lines
from experiments.encoders import embed, embed_all, step_flops
from experiments.equal_compute import machine_line, resolve_experiment, write_results
from experiments.finetune import Backbone, study_backbones
from experiments.recipe import note_stop, run_grid, train
from experiments.rerankers_report import KINDS, TASKS, controls, plot, report
from experiments.study_report import plateau_threshold
from experiments.tasks import ngram_features, read_texts
from infra.configurator import UserError, check_input_folder, output_folder, run_main
from infra.progress import StopSignals
from infra.timing import median_time

DEFAULTS = dict(scale="cpu", quick=False, device="auto", dataset="shakespeare_char", out_dir="results/structural",
                study_dir="results/study", seed=1337, jobs=1)
SCALES = {  # line: a flag document's line; length, fragment: a detail document and its query; groups: of near
    # duplicates (size each); queries: every n-th document's query is evaluated
    "cpu": dict(study_scale="cpu", line=14, train_lines=3000, eval_lines=500, length=40, fragment=10, size=20,
                train_groups=300, eval_groups=50, tune_queries=100, query_every=2, candidates=20, negatives=7,
                queries_per_step=4, max_steps=900, check_every=150, patience=3, rates=(3e-4, 1e-3, 3e-3),
                grown=(1e-4, 1e-2), head_learning_rate=3e-3, warmup=0.1, temperature=0.05, timing_repeats=5, seeds=3),
    "gpu": dict(study_scale="gpu", line=60, train_lines=20000, eval_lines=2000, length=100, fragment=20, size=20,
                train_groups=2000, eval_groups=100, tune_queries=500, query_every=1, candidates=20, negatives=7,
                queries_per_step=8, max_steps=8000, check_every=500, patience=4, rates=(3e-5, 1e-4, 3e-4),
                grown=(1e-5, 1e-3), head_learning_rate=3e-3, warmup=0.1, temperature=0.05, timing_repeats=5, seeds=3),
    "quick": dict(study_scale="quick", line=6, train_lines=60, eval_lines=24, length=20, fragment=6, size=6,
                  train_groups=10, eval_groups=4, tune_queries=8, query_every=2, candidates=6, negatives=3,
                  queries_per_step=2, max_steps=4, check_every=2, patience=1, rates=(1e-3, 3e-3), grown=(3e-4, 1e-2),
                  head_learning_rate=3e-3, warmup=0.1, temperature=0.05, timing_repeats=1, seeds=1),
}
READERS = [("bert", "mean")]  # (study model, how its vector is read): the masked encoder, the reranker of the
# literature (monoBERT); gpt's last position is the other reader a 2-core run would add, at twice the time


# ----------------------------------------------------------------------------- the tasks and the first stage

def first_stage(queries, docs, count):
    """Each query's `count` documents of highest n-gram cosine (the cheap first stage), best first: (Q, count)."""
    similarity = ngram_features(queries) @ ngram_features(docs).T
    return np.argsort(-similarity, axis=1, kind="stable")[:, :count]


def make_split(text, s, rng, kind, lines_wanted, groups, exclude=()):
    """One split of a task: documents, queries (query i's document is docs[answer[i]]) and the first stage's lists."""
    if kind == "flag":
        lines = text_lines(text, lines_wanted, s["line"], rng, exclude)
        docs, queries, answer = documents(lines, rng), lines, np.arange(len(lines))
    else:
        docs, all_queries, _ = near_duplicates(text, groups, s["size"], s["length"], s["fragment"], rng, exclude)
        answer = np.arange(0, len(docs), s["query_every"])
        queries = [all_queries[i] for i in answer]
    return {"docs": docs, "queries": queries, "answer": answer,
            "lists": first_stage(queries, docs, s["candidates"])}


def make_tasks(texts, s, seed):
    """Both tasks: training items from the training split (the last tune_queries held out for early stopping and
    the rate), evaluation items from the validation split."""
    rng = np.random.default_rng(seed)
    tasks = {}
    for kind in TASKS:
        train = make_split(texts["train"], s, rng, kind, s["train_lines"], s["train_groups"])
        evaluation = make_split(texts["val"], s, rng, kind, s["eval_lines"], s["eval_groups"],
                                exclude=set(train["docs"]) | set(train["queries"]))
        n = s["tune_queries"]
        if not 0 < n < len(train["queries"]):
            raise UserError(f"the scale's tune_queries ({n}) must be positive and under the {len(train['queries'])} "
                            f"training queries")
        tune = dict(train, queries=train["queries"][-n:], answer=train["answer"][-n:], lists=train["lists"][-n:])
        train = dict(train, queries=train["queries"][:-n], answer=train["answer"][:-n], lists=train["lists"][:-n])
        tasks[kind] = {"train": train, "tune": tune, "eval": evaluation}
    return tasks


def rule_scores(split):
    """The first stage's own order scored like a reranker: hits@1 (the list's first is the right document) and the
    ceiling (the right document is in the list at all); chance among the list."""
    lists, answer = split["lists"], split["answer"]
    present = (lists == answer[:, None]).any(1)
    return {"n-gram cosine (the first stage's order)": float((lists[:, 0] == answer).mean()),
            "chance among the list": float(np.mean(present / lists.shape[1])),
            "the right document in the list (the ceiling)": float(present.mean())}


# ----------------------------------------------------------------------------- the two rerankers

def scores(backbone, head, kind, how, queries, docs, temperature):
    """One score per (query, document): the cosine of two vectors made apart / temperature (bi-encoder), or a
    linear head on the pair read together in one sequence (cross-encoder; the query first)."""
    if kind == "bi-encoder":
        return (F.normalize(embed(backbone, queries, how), dim=-1)
                * F.normalize(embed(backbone, docs, how), dim=-1)).sum(-1) / temperature
    return head(embed(backbone, [f"{q}\n{d}" for q, d in zip(queries, docs)], how)).squeeze(-1)


def list_hits(backbone, head, kind, how, split, s):
    """hits@1 of a reranker on a split's first-stage lists; a query whose right document is not in its list counts
    as a miss. The bi-encoder encodes each document once."""
    lists, answer = split["lists"], split["answer"]
    with torch.no_grad():
        if kind == "bi-encoder":
            q = F.normalize(embed_all(backbone, split["queries"], how), dim=-1)
            d = F.normalize(embed_all(backbone, split["docs"], how), dim=-1)
            table = torch.einsum("qc,qkc->qk", q, d[torch.from_numpy(lists).to(d.device)]).cpu().numpy()
        else:
            pairs = [(split["queries"][i], split["docs"][j]) for i, row in enumerate(lists) for j in row]
            table = torch.cat([scores(backbone, head, kind, how, [q for q, _ in pairs[i:i + 256]],
                                      [d for _, d in pairs[i:i + 256]], s["temperature"])
                               for i in range(0, len(pairs), 256)]).view(lists.shape).cpu().numpy()
    right = lists == answer[:, None]
    present = right.any(1)
    mine = table[np.arange(len(table)), right.argmax(1)]
    others = np.where(right, -np.inf, table)
    return float((present & (others < mine[:, None]).all(1)).mean())  # (a tie counts against, as hits_at_1)


def reranker_cell(backbone, kind, how, task, s, seed, stop):
    """One (task, reranker, reader, seed, rate): trained listwise on the training queries, each with its document
    and `negatives` hard negatives from its first-stage list, until hits@1 on the tuning queries stops improving;
    hits@1 on the evaluation lists, the steps run, the training FLOPs and every check."""
    train_split = task["train"]
    torch.manual_seed(seed)
    head = torch.nn.Linear(backbone.model.config.n_embd, 1).to(backbone.device) if kind == "cross-encoder" else None
    k = s["negatives"]

    def batch_loss(rng):
        queries, docs = [], []
        for i in rng.choice(len(train_split["queries"]), s["queries_per_step"], replace=False):
            others = [j for j in train_split["lists"][i] if j != train_split["answer"][i]]
            chosen = rng.choice(others, k, replace=False)
            queries += [train_split["queries"][i]] * (k + 1)
            docs += [train_split["docs"][train_split["answer"][i]]] + [train_split["docs"][j] for j in chosen]
        if kind == "bi-encoder":  # each query read once, as a bi-encoder does
            q = F.normalize(embed(backbone, queries[::k + 1], how), dim=-1)
            d = F.normalize(embed(backbone, docs, how), dim=-1).view(len(q), k + 1, -1)
            logits = torch.einsum("qc,qkc->qk", q, d) / s["temperature"]
        else:
            logits = scores(backbone, head, kind, how, queries, docs, s["temperature"]).view(-1, k + 1)
        return F.cross_entropy(logits, torch.zeros(len(logits), dtype=torch.long, device=logits.device))

    checks = train(backbone, head, s["max_steps"], s, batch_loss, stop, seed,
                   validate=lambda: list_hits(backbone, head, kind, how, task["tune"], s))
    per_step = training_step_flops(backbone.model, kind, s, task)
    best_step, tuning = max(checks, key=lambda check: check[1])
    return {"hits@1": list_hits(backbone, head, kind, how, task["eval"], s), "tuning": tuning,
            "steps run": checks[-1][0], "best step": best_step, "flops": checks[-1][0] * per_step,
            "checks": [[step, score, step * per_step] for step, score in checks]}


def training_step_flops(model, kind, s, task):
    """FLOPs of one training step (encoders.step_flops' count), at the task's longest query and document."""
    q = max(len(x) for x in task["train"]["queries"])
    d = max(len(x) for x in task["train"]["docs"])
    n, pairs = s["queries_per_step"], s["queries_per_step"] * (s["negatives"] + 1)
    if kind == "bi-encoder":
        return step_flops(model, n, q) + step_flops(model, pairs, d)
    return step_flops(model, pairs, q + 1 + d)


def price(backbone, how, task, s):
    """Median ms to rerank one query's list: the cross-encoder reads (query, candidate) once per candidate; the
    bi-encoder encodes the query and takes dot products with document vectors encoded beforehand (their one-off
    cost per document beside it). The weights' values do not change the time: the pretrained backbone is timed."""
    head = torch.nn.Linear(backbone.model.config.n_embd, 1).to(backbone.device)
    split = task["eval"]
    query, docs = split["queries"][0], [split["docs"][j] for j in split["lists"][0]]
    vectors = embed_all(backbone, docs, how)

    def median_ms(work):  # (the device synchronised around each repeat: on a GPU the work is asynchronous)
        with torch.no_grad():
            return 1000 * median_time(work, backbone.device, s["timing_repeats"], warmup=0)
    return {"cross-encoder": median_ms(lambda: scores(backbone, head, "cross-encoder", how, [query] * len(docs), docs,
                                                      s["temperature"])),
            "bi-encoder": median_ms(lambda: embed(backbone, [query], how) @ vectors.T),
            "bi-encoder, encoding one document (once)": median_ms(lambda: embed_all(backbone, docs, how)) / len(docs)}


# ----------------------------------------------------------------------------- the cells, here or in workers

WORKER = {}  # what the cells read: set here, or in each worker process (--jobs > 1) by prepare


def prepare(config, s, folders, device, tasks=None):
    """The tasks (built from the seed: the same items in every process), the scale and the backbones' folders."""
    WORKER.update(tasks=tasks or make_tasks(read_texts(config["dataset"]), s, config["seed"]), s=s, folders=folders,
                  device=device)


def run_cell(cell, stop=False):
    """cell: (part, model, how, seed, rate), part "<task> <kind>"; a fresh copy of the backbone."""
    part, model, how, seed, rate = cell
    task_name, kind = part.split(" ", 1)
    backbone = Backbone(WORKER["folders"][(model, seed)], WORKER["device"])
    s = dict(WORKER["s"], learning_rate=rate)
    return cell, dict(reranker_cell(backbone, kind, how, WORKER["tasks"][task_name], s, seed, stop),
                      **{"learning rate": rate})


PARTS = [f"{task} {kind}" for task in TASKS for kind in KINDS]


def main():
    config, scale, device = resolve_experiment(DEFAULTS, SCALES, "rerankers")
    check_input_folder(config, "--study_dir", DEFAULTS["study_dir"], "the --out_dir of experiments/study.py or "
                       "finetune.py --study, whose checkpoints are read")
    s = SCALES[scale]
    from experiments.study import SCALES as STUDY_SCALES  # the context of the checkpoints read
    longest = max(s["line"] + 1 + 2 * s["line"] + 3, s["fragment"] + 1 + s["length"])
    if longest > STUDY_SCALES[s["study_scale"]]["block_size"]:
        raise UserError(f"scale {scale}'s longest pair is {longest} characters, longer than the study's context")
    t0 = time.perf_counter()
    tasks = make_tasks(read_texts(config["dataset"]), s, config["seed"])
    seeds = [config["seed"] + k for k in range(s["seeds"])]
    study_dir = output_folder({"quick": config["quick"], "out_dir": config["study_dir"]},
                              {"out_dir": DEFAULTS["study_dir"]})
    began = time.time()
    folders, identities = study_backbones(dict(config, out_dir=study_dir), s["study_scale"], device, seeds,
                                          "--study_dir")
    pretrained_now = any(v["written"] >= int(began) for v in identities.values())
    data = {"scale": scale, "settings": s, "seeds": seeds, "checkpoints": identities,
            "machine": machine_line(device, config, runs=None if pretrained_now else 1),
            "plateau_threshold": plateau_threshold(study_dir, s["study_scale"]), "cells": [], "prices": {},
            "rules": {task: rule_scores(tasks[task]["eval"]) for task in TASKS},
            "task sizes": {task: {split: len(tasks[task][split]["queries"]) for split in ("train", "tune", "eval")}
                           for task in TASKS},
            "examples": {task: {"query": tasks[task]["eval"]["queries"][0],
                                "document": tasks[task]["eval"]["docs"][tasks[task]["eval"]["answer"][0]]}
                         for task in TASKS}}
    plan = [(part, model, how, seed, rate) for part in PARTS for seed in seeds for rate in s["rates"]
            for model, how in READERS]
    jobs = min(config["jobs"], len(plan))
    print(f"[rerankers] {len(plan)} cells (tasks x rerankers x readers x seeds x rates), {jobs} at a time, each "
          f"trained until its tuning hits@1 stops improving (at most {s['max_steps']} steps)", flush=True)
    arguments = ({k: config[k] for k in ("dataset", "seed")}, s, folders, device)
    prepare(*arguments, tasks=tasks)  # here; each worker process makes its own
    try:
        with StopSignals(immediate=True) as stop:
            run_grid(plan, data["cells"], s, seeds, jobs, run_cell, stop, prepare, arguments, "rerankers", "hits@1")
            print("[rerankers] timing the two rerankers per query, alone on the machine", flush=True)
            data["prices"] = {f"{model} ({how})": price(Backbone(folders[(model, seeds[0])], device), how,
                                                          tasks["detail"], s) for model, how in READERS}
    except KeyboardInterrupt:
        if not data["cells"]:
            raise  # nothing finished, nothing written (run_main: status 130, what is kept)
        note_stop(data, plan, f"rerankers-{scale}-partial")
    data["controls"] = controls(data)
    data["seconds"] = time.perf_counter() - t0
    write_results(config["out_dir"], f"rerankers-{scale}" + ("-partial" if "notes" in data else ""), data,
                  report(data), plot)
    if "notes" in data:
        sys.exit(130)


if __name__ == "__main__":
    run_main(main, interrupted="the study's checkpoints it trained are kept and reused next time")
