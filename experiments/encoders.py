"""
Question: where do encoders still win (claims E3, X1, F3, and the payoff of B2)? At equal size and equal
pretraining FLOPs, which backbone makes the better embedding model and the better judge of a whole input, and why?
Rerankers (a cross-encoder against a bi-encoder, as rerankers are used) live in experiments/rerankers.py.

    python experiments/encoders.py --jobs=2     # 4 parts x their readers x 3 seeds x 3 rates (135 cells, two at
                                                # a time), then one rate past each edge kept; its minutes for these
                                                # four parts not measured yet
                                                # -> results/structural/encoders-cpu.{md,json,png}
    python experiments/encoders.py --parts=judge --jobs=2   # the judgement alone, each cell to early stopping
                                                # (30 cells): 40 minutes on 2 cores of an Intel Xeon
                                                # -> results/structural/encoders-cpu-judge.{md,json,png}
    python experiments/encoders.py --parts=retrieval --steps_multiple=3   # some parts, at 3 x the steps
    python experiments/encoders.py --jobs=2 --reuse=True  # keep the cells of the earlier run; run the rest
    python experiments/encoders.py --quick      # a smoke run in seconds (the test suite runs it) -> out-quick/

The backbones are the study's equal-FLOPs checkpoints (experiments/finetune.py's study_backbones: gpt, bert,
prefixlm, t5, masked diffusion, one pretraining run per seed; --jobs=N pretrains N at once when they are missing).
Every task is made from the text (experiments/encoder_tasks.py): training examples from the training split,
evaluation examples from the validation split, which no backbone read in pretraining.

1. The structural fact (an illustration: it holds by construction). A causal state at position i has read
   characters 0..i only, so gpt's states over a text's first half are the same to the bit whatever follows; a
   bidirectional reader's are not; reading the text twice and pooling over the second copy (echo embeddings,
   Springer et al. 2024) gives the causal model the whole text. Each evaluation first half appears twice, followed
   once by a second half that holds a capital letter (label 1) and once by one that does not (label 0): a probe
   on the frozen first-half mean is then exactly at 50% for gpt (its two vectors are equal), and above 50% only
   for a reader whose first-half states have read the second half.
2. Bi-encoder retrieval, a document whose meaning is decided at its end. A document is two lines of text and a
   last line "A" or "B" that says which of the two it is about; the query is that line. Every line is the topic of
   one document and the distractor of another (its hard negative), so spelling overlap cannot tell the two apart
   (the n-gram cosine rule ties them) and the flag, read last, decides. Each reader is fine-tuned as a bi-encoder
   with in-batch InfoNCE (the hard negative in the batch), the same steps and batch for each; recall@1 and MRR
   among all evaluation documents. Control of the mechanism: the same with the flag as the first line, which every
   position of a causal reader has read.
3. A whole-input judgement (F3): two lines, the second the first again (agree) or the first with one word replaced
   by another of the same length (disagree), exactly half each; a head on the pooled state, fine-tuned until its
   accuracy on tuning items stops improving (the weights of its best check kept: the steps are found by validation).

One fine-tuning recipe for every reader (the verdict should be the architecture's, not its recipe's): the same
steps and batch, the backbone at every rate of a small grid with a warmup then a linear decay, and the rate kept
for a reader chosen by its mean score over seeds on tuning items held out of the training ones (never on the
evaluation items); every rate's score is in the result.

Baselines under the same scoring: chance, the character n-gram rules (tasks.py's features: cosine for retrieval, a
tuned logistic regression for the judgements) and, where a rule can be told the task's format, that rule too (it
shows the task is well posed; the question is what a backbone learns from the examples alone). Positive control of
each part: its best reader's mean minus one std above the spelling rule by CONTROL_MARGIN, or the part gives no
verdict. Mean +- std over seeds; each seed is its own pretraining run and fine-tuning order. The readers of each
part, the controls and the report: experiments/encoders_report.py; the recipe (the schedule, the rate kept, the grid
grown, the cells in worker processes): experiments/recipe.py.
"""
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # python experiments/encoders.py
import infra.quiet_interrupts  # noqa: E402,F401  (before torch: a Ctrl-C while it loads ends quietly)

import numpy as np
import torch
import torch.nn.functional as F

from experiments.encoder_tasks import documents, flagged_line, make_tasks
from experiments.equal_compute import machine_line, resolve_experiment, write_results
from experiments.finetune import Backbone, hidden_states, study_backbones
from experiments.encoders_report import PARTS, controls, plot, report
from experiments.recipe import begun, finished_cells, grow, missing, train
from experiments.study_report import plateau_threshold
from experiments.tasks import classification_scores, ngram_features, read_texts, tuned_logistic_regression
from infra.configurator import UserError, check_input_folder, output_folder, run_main
from infra.progress import StopSignals, check_writable, format_duration

DEFAULTS = dict(scale="cpu", quick=False, device="auto", dataset="shakespeare_char", out_dir="results/structural",
                study_dir="results/study",  # where experiments/study.py and finetune.py keep their checkpoints
                seed=1337, quiet=True,
                parts="all",  # or some of probe, retrieval, flag-first, judge (comma-separated)
                steps_multiple=1,  # every fine-tuning run at this multiple of the scale's steps
                reuse=False,  # True: keep the cells of the earlier run of the same settings (its .json); run the rest
                jobs=1)  # how many fine-tuning cells (and missing pretraining runs) run at once (processes)
SCALES = {  # line: characters of a document's line (two lines, the flag and two newlines must fit twice in the
    # study's context for echo); half: of the structural part's windows; judge_line: of the agreement task's lines
    "cpu": dict(study_scale="cpu", line=14, half=16, judge_line=20, train_lines=4000, eval_lines=1000,
                probe_windows=2000, judge_examples=3000, rerank_queries=500, candidates=20, steps=300, probe_steps=400,
                batch_size=32, rates=(3e-4, 1e-3, 3e-3), grown=(1e-4, 1e-2), head_learning_rate=3e-3,
                judge_steps=1500, check_every=150, patience=3, warmup=0.1, tune_lines=500, tune_queries=250,
                judge_tune=500, temperature=0.05, seeds=3),
    "gpu": dict(study_scale="gpu", line=60, half=64, judge_line=100, train_lines=20000, eval_lines=2000,
                probe_windows=10000, judge_examples=20000, rerank_queries=1000, candidates=20, steps=2000,
                probe_steps=1000, batch_size=64, rates=(3e-5, 1e-4, 3e-4), grown=(1e-5, 1e-3),
                head_learning_rate=3e-3, judge_steps=16000, check_every=500, patience=4, warmup=0.1, tune_lines=2000,
                tune_queries=500, judge_tune=2000, temperature=0.05, seeds=3),
    "quick": dict(study_scale="quick", line=6, half=8, judge_line=10, train_lines=96, eval_lines=40, probe_windows=48,
                  judge_examples=48, rerank_queries=16, candidates=8, steps=3, probe_steps=5, batch_size=8,
                  rates=(1e-3, 3e-3), grown=(3e-4, 1e-2), head_learning_rate=3e-3, judge_steps=6, check_every=2,
                  patience=1, warmup=0.1, tune_lines=24, tune_queries=8, judge_tune=12, temperature=0.05, seeds=1),
}



# ----------------------------------------------------------------------------- what is measured

def info_nce(queries, docs, temperature):
    """In-batch contrastive loss: query i's document is docs[i], every other document of the batch a negative."""
    queries, docs = F.normalize(queries, dim=-1), F.normalize(docs, dim=-1)
    return F.cross_entropy(queries @ docs.T / temperature, torch.arange(len(queries), device=queries.device))


def ranks(similarity):
    """The rank of row i's right answer, column i, among the row's entries; a tie counts against it."""
    similarity = np.asarray(similarity)
    return (similarity >= np.diag(similarity)[:, None]).sum(1)


def recall_and_mrr(similarity):
    """Recall@1 and MRR of the queries (rows) among all documents (columns), query i's document column i."""
    r = ranks(similarity)
    return {"recall@1": float((r == 1).mean()), "mrr": float((1.0 / r).mean())}


def hits_at_1(scores):
    """(queries, candidates) scores, the right candidate in column 0: how often it alone scores highest."""
    scores = np.asarray(scores)
    return float((scores[:, 1:] < scores[:, :1]).all(1).mean())


def hard_negative_first(similarity):
    """How often query i's best-scoring document is its hard negative, document i - 1."""
    n = len(similarity)
    return float((np.asarray(similarity).argmax(1) == (np.arange(n) - 1) % n).mean())


def balanced_accuracy(predicted, truth):
    return classification_scores(predicted, truth, 2)["balanced accuracy"]  # tasks.py's: the mean of class recalls


# ----------------------------------------------------------------------------- reading a text into a vector

def embed(backbone, texts, how, span=None):
    """One vector (N, C) per text: mean over its characters (or those in span = (a, b)), its last position, or echo:
    the text read twice and the mean over the second copy (whose states have read the whole first copy)."""
    ids, lengths = backbone.encode([t + t for t in texts] if how == "echo" else texts)
    hidden = hidden_states(backbone.model, ids, lengths)  # (N, T, C)
    if how == "last":  # a causal model's only position that has read everything
        return hidden[torch.arange(len(texts), device=ids.device), lengths - 1]
    own = lengths // 2 if how == "echo" else lengths  # each text's own length
    start = own if how == "echo" else torch.zeros_like(own)  # where its (second) copy starts
    a, b = (torch.zeros_like(own), own) if span is None else (torch.full_like(own, span[0]),
                                                                torch.full_like(own, span[1]))
    positions = torch.arange(ids.size(1), device=ids.device)[None, :]
    chosen = ((positions >= start[:, None] + a[:, None]) & (positions < start[:, None] + b[:, None])).to(hidden.dtype)
    return (hidden * chosen[..., None]).sum(1) / chosen.sum(1, keepdim=True)


def embed_all(backbone, texts, how, span=None, batch=256):
    """embed in batches (an even size: the structural part's pairs share a batch), without gradients."""
    backbone.model.eval()
    with torch.no_grad():
        return torch.cat([embed(backbone, texts[i:i + batch], how, span) for i in range(0, len(texts), batch)])


# ----------------------------------------------------------------------------- the four parts, one cell each

def probe_cell(backbone, how, task, s, seed, stop):
    """Part 1: pooled first-half vectors of the evaluation windows (how many pairs are equal to the bit), and a
    linear probe trained on the frozen training windows' vectors, scored on the evaluation windows."""
    span = (0, s["half"])
    train_x = embed_all(backbone, task["train"], how, span)
    eval_x = embed_all(backbone, task["eval"], how, span)
    pairs = eval_x.view(-1, 2, eval_x.size(-1))
    equal = [bool(torch.equal(p[0], p[1])) for p in pairs]
    torch.manual_seed(seed)
    head = torch.nn.Linear(eval_x.size(-1), 2).to(eval_x.device)
    optimizer = torch.optim.AdamW(head.parameters(), lr=s["head_learning_rate"], weight_decay=0.0)
    y = torch.from_numpy(task["train_labels"]).to(eval_x.device)
    generator = torch.Generator().manual_seed(seed)
    for _ in range(s["probe_steps"]):
        if stop:
            raise KeyboardInterrupt
        index = torch.randperm(len(y), generator=generator)[:s["batch_size"]].to(eval_x.device)
        loss = F.cross_entropy(head(train_x[index]), y[index])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        predicted = head(eval_x).argmax(-1).cpu().numpy()
    return {"equal pairs": int(sum(equal)), "pairs": len(equal),
            "median difference": float((pairs[:, 0] - pairs[:, 1]).abs().amax(-1).median()),
            "balanced accuracy": balanced_accuracy(predicted, task["eval_labels"])}


def biencoder_cell(backbone, how, task, s, seed, stop, flag_at):
    """Part 2: fine-tune as a bi-encoder (in-batch InfoNCE, each batch's documents built around its own lines so
    every query's hard negative is in the batch); score among all evaluation documents and on the 20-candidate
    sets. Returns recall@1, MRR, how often the hard negative ranks first, and hits@1."""
    lines = task["train_lines"]

    def batch_loss(rng):
        chosen = [lines[i] for i in rng.choice(len(lines), s["batch_size"], replace=False)]
        return info_nce(embed(backbone, chosen, how), embed(backbone, documents(chosen, rng, flag_at), how),
                        s["temperature"])

    train(backbone, None, s["steps"], s, batch_loss, stop, seed)
    ending = "" if flag_at == "end" else "_flag_first"
    tuning = biencoder_scores(backbone, how, task["tune_lines"], task["tune_docs" + ending], task["tune_sets"])
    return {**biencoder_scores(backbone, how, task["eval_lines"], task["docs" + ending], task["candidate_sets"]),
            "tuning": tuning["recall@1"]}  # (what the rate is chosen on: held out of the training split)


def biencoder_scores(backbone, how, queries, docs, sets):
    """Recall@1, MRR and how often the hard negative ranks first, query i's document docs[i] among all of them;
    hits@1 on the candidate sets."""
    similarity = (F.normalize(embed_all(backbone, queries, how), dim=-1)
                  @ F.normalize(embed_all(backbone, docs, how), dim=-1).T).cpu().numpy()
    return {**recall_and_mrr(similarity), "hard negative first": hard_negative_first(similarity),
            "hits@1": hits_at_1(similarity[np.arange(len(sets))[:, None], sets])}


def judge_cell(backbone, how, task, s, seed, stop):
    """Part 3: a head on the pooled state, fine-tuned with the backbone on the agreement examples until the accuracy
    on the tuning items stops improving (at most s["judge_steps"] steps; the weights of its best check are kept)."""
    return classifier_cell(backbone, how, [(task[f"judge_{split}"], task[f"judge_{split}_labels"])
                                           for split in ("train", "tune", "eval")],
                           s["judge_steps"], 2 * s["judge_line"] + 1, s, seed, stop)


def classifier_cell(backbone, how, splits, steps, length, s, seed, stop):
    """A fresh two-class head on the pooled state, trained with the backbone on splits[0] = (texts, labels) until
    the accuracy on the tuning items splits[1] stops improving (at most `steps`, a check every s["check_every"]); the
    accuracy on splits[2], the steps run, the training FLOPs they cost (inputs of `length` tokens) and every check."""
    (texts, labels), (tune, tune_labels), (evaluation, eval_labels) = splits
    labels = torch.from_numpy(labels)
    torch.manual_seed(seed)
    head = torch.nn.Linear(backbone.model.config.n_embd, 2).to(backbone.device)

    def batch_loss(rng):
        index = rng.choice(len(texts), min(s["batch_size"], len(texts)), replace=False)
        logits = head(embed(backbone, [texts[i] for i in index], how))
        return F.cross_entropy(logits, labels[index].to(logits.device))

    def accuracy(texts, labels):
        with torch.no_grad():
            return float((head(embed_all(backbone, texts, how)).argmax(-1).cpu().numpy() == labels).mean())

    checks = train(backbone, head, steps, s, batch_loss, stop, seed, validate=lambda: accuracy(tune, tune_labels))
    per_step = step_flops(backbone.model, s["batch_size"], length)
    best_step, tuning = max(checks, key=lambda check: check[1])  # (the first best: the weights kept)
    return {"accuracy": accuracy(evaluation, eval_labels), "tuning": tuning,
            "steps run": checks[-1][0], "best step": best_step, "flops": checks[-1][0] * per_step,
            "checks": [[step, score, step * per_step] for step, score in checks]}


def step_flops(model, batch, length):
    """Training FLOPs of one fine-tuning step on `batch` inputs of `length` tokens, as model.training_flops counts
    them (6 per parameter per token, attention's 12 * layers * T^2 * d), without the output head, which a reader
    does not use (t5: its encoder only, which is what it reads with)."""
    config = model.config
    parameters = sum(p.numel() for p in model.blocks.parameters())  # (t5's: its encoder's)
    return batch * (6 * length * parameters + 12 * len(model.blocks) * length ** 2 * config.n_embd)


# ----------------------------------------------------------------------------- rules, the same scoring

def rules(task, parts=("retrieval", "probe", "judge"), log=lambda *a, **k: None):
    """What a rule without a model reaches on each part, under the part's own scoring. log: where the tuned
    regressions' progress lines go (a minute of them at the cpu scale)."""
    out = {}
    if "retrieval" in parts:
        n, sets = len(task["eval_lines"]), task["candidate_sets"]
        queries = ngram_features(task["eval_lines"])
        out["retrieval"] = {"chance": {"recall@1": 1 / n, "mrr": sum(1 / k for k in range(1, n + 1)) / n,
                                       "hits@1": 1 / sets.shape[1]}}
        for name, docs in (("n-gram cosine", task["docs"]),
                           ("n-gram cosine of the flagged line (a rule told the format)",
                            [flagged_line(d) for d in task["docs"]])):
            similarity = queries @ ngram_features(docs).T
            out["retrieval"][name] = {**recall_and_mrr(similarity),
                                      "hard negative first": hard_negative_first(similarity),
                                      "hits@1": hits_at_1(similarity[np.arange(len(sets))[:, None], sets])}
    if "probe" in parts:
        cuts = (("first half", lambda texts: [t[:len(t) // 2] for t in texts]), ("whole window", lambda t: t))
        out["probe"] = {f"n-gram logistic regression of the {name}": balanced_accuracy(tuned_logistic_regression(
            ngram_features(cut(task["train"])), task["train_labels"], ngram_features(cut(task["eval"])), 2,
            log=log), task["eval_labels"]) for name, cut in cuts}
    if "judge" in parts:
        truth = task["judge_eval_labels"]
        judged = tuned_logistic_regression(ngram_features(task["judge_train"]), task["judge_train_labels"],
                                           ngram_features(task["judge_eval"]), 2, log=log)
        majority = np.bincount(task["judge_train_labels"]).argmax()
        same = np.array([int(t.split("\n")[0] == t.split("\n")[1]) for t in task["judge_eval"]])
        out["judge"] = {"majority class": float((truth == majority).mean()),
                        "n-gram logistic regression": float((judged == truth).mean()),
                        "the two lines compared (a rule told the format)": float((same == truth).mean())}
    return out


# ----------------------------------------------------------------------------- the experiment

CELL_COST = {"probe": 0.2, "retrieval": 1.0, "flag-first": 1.0, "judge": 4.0}  # relative time


def run_one(part, backbone, how, task, s, seed, stop):
    """One cell: part's reader fine-tuned (s["learning_rate"]: one rate of the grid) and scored."""
    if part == "probe":
        return probe_cell(backbone, how, task, s, seed, stop)
    if part in ("retrieval", "flag-first"):
        return biencoder_cell(backbone, how, task, s, seed, stop, "first" if part == "flag-first" else "end")
    if part == "judge":
        return judge_cell(backbone, how, task, s, seed, stop)
    raise ValueError(f"unknown part {part!r}")


def earlier_cells(path, data):
    """--reuse=True: the cells and seconds of the run written at path, if it ran these very settings (those this code
    reads: a setting an older version had and this one dropped decides nothing); else none."""
    try:
        with open(path) as f:
            earlier = json.load(f)
    except (OSError, ValueError):
        print(f"[encoders] no earlier run to reuse in {path}: every cell runs", flush=True)
        return [], 0.0
    def what_a_cell_depends_on(run):  # (the rates the grid grows to are a plan, not how a cell runs)
        settings = {k: (run.get("settings") or {}).get(k) for k in data["settings"] if k != "grown"}
        return json.loads(json.dumps(dict({k: run.get(k) for k in ("seeds", "parts", "checkpoints")},
                                          settings=settings)))
    if what_a_cell_depends_on(earlier) != what_a_cell_depends_on(data):
        print(f"[encoders] {path} holds a run of other settings or checkpoints: every cell runs", flush=True)
        return [], 0.0
    return earlier["cells"], earlier.get("seconds", 0.0)


# What the cells read: set here, or in each worker process (--jobs > 1) by prepare
WORKER = {}


def prepare(config, s, folders, device, task=None):
    """The task (built from the seed: the same items in every process), the scale and the backbones' folders."""
    WORKER.update(task=task or make_tasks(read_texts(config["dataset"]), s, config["seed"]), s=s, folders=folders,
                  device=device)


def run_cell(cell, stop=False):
    """cell: (part, model, how, seed, rate); a fresh copy of the backbone (fine-tuning changes its weights)."""
    part, model, how, seed, rate = cell
    backbone = Backbone(WORKER["folders"][(model, seed)], WORKER["device"])
    torch.manual_seed(seed)
    s = WORKER["s"] if rate is None else dict(WORKER["s"], learning_rate=rate)
    result = run_one(part, backbone, how, WORKER["task"], s, seed, stop)
    return cell, dict(result, **({} if rate is None else {"learning rate": rate}))


def main():
    config, scale, device = resolve_experiment(DEFAULTS, SCALES, "encoders", ())  # its files: checked below
    check_input_folder(config, "--study_dir", DEFAULTS["study_dir"], "the --out_dir of experiments/study.py or "
                       "finetune.py --study, whose checkpoints are read")
    parts = list(PARTS) if config["parts"] == "all" else str(config["parts"]).split(",")
    if not parts or any(part not in PARTS for part in parts) or len(set(parts)) < len(parts):
        raise UserError(f"--parts={config['parts']}: choose all, or some of {', '.join(PARTS)} (comma-separated)")
    multiple = config["steps_multiple"]
    if isinstance(multiple, bool) or not isinstance(multiple, int) or multiple < 1:
        raise UserError(f"--steps_multiple={multiple}: a whole number >= 1 (each fine-tuning run's steps, times it)")
    name = f"encoders-{scale}" + ("" if config["parts"] == "all" else "-" + "-".join(parts)) + \
        ("" if multiple == 1 else f"-x{multiple}")  # a partial run never overwrites the whole one
    check_writable([os.path.join(config["out_dir"], name + extension) for extension in (".md", ".json", ".png")])
    s = dict(SCALES[scale], steps=SCALES[scale]["steps"] * multiple)
    from experiments.study import SCALES as STUDY_SCALES  # the context of the checkpoints read
    block = STUDY_SCALES[s["study_scale"]]["block_size"]
    longest = max(2 * (2 * s["line"] + 3), 4 * s["half"], 2 * s["judge_line"] + 1)
    if longest > block:  # (echo reads a document, or a window, twice)
        raise UserError(f"scale {scale}'s longest input is {longest} characters, the study's models read {block}")
    t0 = time.perf_counter()
    texts = read_texts(config["dataset"])
    task = make_tasks(texts, s, config["seed"])
    seeds = [config["seed"] + k for k in range(s["seeds"])]
    study_dir = output_folder({"quick": config["quick"], "out_dir": config["study_dir"]},
                              {"out_dir": DEFAULTS["study_dir"]})  # --quick: the quick study's, in out-quick/
    began = time.time()
    folders, identities = study_backbones(dict(config, out_dir=study_dir), s["study_scale"], device, seeds,
                                          "--study_dir")
    pretrained_now = any(v["written"] >= int(began) for v in identities.values())  # else --jobs shared nothing
    print("[encoders] the trivial baselines first: the n-gram rules of every part, tuned on the training examples",
          flush=True)
    data = {"scale": scale, "settings": s, "parts": parts, "steps_multiple": multiple, "seeds": seeds,
            "machine": machine_line(device, config, runs=None if pretrained_now else 1), "checkpoints": identities,
            "plateau_threshold": plateau_threshold(study_dir, s["study_scale"]), "cells": [],
            "rules": rules(task, log=print),
            "task sizes": {"train lines": len(task["train_lines"]), "eval lines": len(task["eval_lines"]),
                           "probe train": len(task["train"]), "probe eval": len(task["eval"]),
                           "judge train": len(task["judge_train"]), "judge eval": len(task["judge_eval"])},
            "examples": {"document": task["docs"][0], "query": task["eval_lines"][0],
                         "agreement": task["judge_eval"][:2], "window": task["eval"][:2]}}
    # every part's cells before the next part's (a stopped run keeps whole parts); every rate of the grid for every
    # reader and seed (the probe, frozen, has none)
    plan = [(part, model, how, seed, rate) for part in parts for seed in seeds
            for rate in ([None] if part == "probe" else s["rates"]) for model, how in PARTS[part]]
    if config["reuse"]:
        data["cells"], earlier = earlier_cells(os.path.join(config["out_dir"], name + ".json"), data)
        t0 -= earlier  # the seconds written are those of every cell kept, too
        plan += [cell for cell in begun(data["cells"], seeds) if cell not in plan]  # (a rate grown, half run)
    cost = lambda cells: sum(CELL_COST[cell[0]] for cell in cells)  # noqa: E731  (for the time left)
    jobs = min(config["jobs"], len(plan))
    print(f"[encoders] {len(plan)} cells (parts x readers x seeds x rates {', '.join(f'{r:g}' for r in s['rates'])})"
          f", {jobs} at a time" + (f"; {len(data['cells'])} kept from the earlier run" if data["cells"] else ""),
          flush=True)
    started, done = time.perf_counter(), 0.0  # (done: the cost of the cells run by this command)
    arguments = ({k: config[k] for k in ("dataset", "seed")}, s, folders, device)
    prepare(*arguments, task=task)  # here; each worker process makes its own
    try:
        with StopSignals(immediate=True) as stop:
            todo = missing(plan, data["cells"])
            while True:  # the grid, then the one rate past each rate kept at its edge (grow)
                to_do = cost(todo) + done  # what this command runs in all, as far as it knows now
                for (part, model, how, seed, rate), result in finished_cells(todo, jobs, run_cell, stop, prepare,
                                                                              arguments):
                    data["cells"].append({"part": part, "reader": f"{model} ({how})", "seed": seed, **result})
                    done += CELL_COST[part]
                    left = (time.perf_counter() - started) / done * (to_do - done)
                    print(f"[encoders] {len(data['cells'])}/{len(plan)} done: {part}, {model} ({how}), seed {seed}"
                          + ("" if rate is None else f", rate {rate:g}") + f"; ~{format_duration(max(0, left))} left",
                          flush=True)
                grown = grow(data["cells"], s["grown"], seeds)
                plan += grown
                todo = missing(plan, data["cells"])
                if not todo:
                    break
                print(f"[encoders] the grid grown past {len(grown) // len(seeds)} rates kept at its edge: "
                      f"{len(todo)} cells more", flush=True)
    except KeyboardInterrupt:
        if not data["cells"]:
            raise  # nothing finished, nothing written (run_main: status 130, what is kept)
        name += "-partial"  # never over the whole result a complete run wrote
        print(f"interrupted: {len(data['cells'])} of {len(plan)} cells done; they are written to {name}.*",
              flush=True)
        data["notes"] = [f"**Interrupted: {len(data['cells'])} of {len(plan)} cells done; a reader's rows may hold "
                         f"fewer seeds than the header names.**"]
    data["controls"] = controls(data)
    data["seconds"] = time.perf_counter() - t0
    write_results(config["out_dir"], name, data, report(data, s, scale), plot)
    if "notes" in data:  # stopped: what finished is written; the status says it was a stop
        sys.exit(130)


if __name__ == "__main__":
    run_main(main, interrupted="the study's checkpoints it trained are kept and reused next time")
