"""
Question: pretrain once, add a small head, fine-tune per task (claim B2): do encoders beat decoders of the same
size and recipe on judgements over a whole input (F3), on embeddings for retrieval (E3), on classification (X1)?

    python experiments/finetune.py --init_from=out-cpu-bert --task=speaker --mode=probe   # one checkpoint, one task
    python experiments/finetune.py --init_from=out-cpu-gpt --task=tampered --mode=full --pooling=mean --seeds=3
    python experiments/finetune.py --init_from=bert-base-uncased --task=retrieval  # published (infra/pretrained.py)
    python experiments/finetune.py --study --jobs=2 # the study's gpt, bert, prefixlm, t5, diffusion x every task x
                                                    # mode x 3 seeds x every rate of the grid, two cells at a time:
                                                    # 106 minutes on 2 cores of an Intel Xeon (the test suite
                                                    # beside it part of the time; 390 cells, 66 of them the grid
                                                    # grown past its edge) -> results/study/finetune-cpu.*
    python experiments/finetune.py --study --quick  # seconds (the test suite runs it) -> out-quick/

Tasks (tasks.py, made from the text of the prepared char-level dataset, training and evaluation examples from
disjoint parts of it): speaker (which of 8 speakers said a speech), tampered (is one line of a passage replaced
by a line from elsewhere? claim F3) and retrieval (find the line that follows a line among 100 candidates by
cosine similarity of pooled states, claim E3: recall@1 and MRR, with frozen features, a linear map trained on
them, and after a contrastive fine-tune with in-batch negatives).

Reading a whole input into one vector (--pooling): bert, the t5 encoder and the diffusion model attend both ways,
so every position has seen the whole input: mean over positions. prefixlm reads the whole input as its
bidirectional prefix: mean. gpt is causal: position i has seen tokens 0..i only, so the *last* position is the
only one that has seen everything (--pooling=last, its default); --pooling=mean averages positions that saw less
and less of the input.
--mode=probe trains only the head on frozen features (the backbone is bit-identical afterwards, tested);
--mode=full fine-tunes everything; both on the recipe below (a warmup over --warmup of the steps, then linear
to 0). Baselines under the same scoring: the majority class and a character
1-3-gram logistic regression (numpy); for retrieval chance and n-gram cosine similarity.

--study fine-tunes every reader on one recipe (experiments/recipe.py, shared with experiments/encoders.py): the
same steps and batch, a warmup then a linear decay, every rate of a small grid (the backbone's in full mode, the
head's in probe mode) on every seed, and the rate kept for a reader chosen by its mean score over seeds on tuning
items held out of the training examples (never on an evaluation example); the grid grows one rate past a rate kept
at its edge. Each row has a positive control: its best reader at least 10 points above the character n-gram rule,
or the row gives no verdict. The backbones' pretraining losses are stated against the study's plateau control.
"""
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # python experiments/finetune.py
import infra.quiet_interrupts  # noqa: E402,F401  (before torch: a Ctrl-C while it loads ends quietly)

import numpy as np
import torch
import torch.nn.functional as F

from infra.checkpoint import load_checkpoint, load_model
from infra.configurator import UserError, apply_overrides, check_seed, output_folder, pick_device, run_main
from infra.dataset import load_dataset
from infra.progress import StopSignals, check_writable, format_duration, write_atomically
from experiments import recipe
from experiments.equal_compute import check_jobs, equal_flops_config, flops_budget, machine_line, train_all
from infra.train_config import MODEL_KEYS
from experiments.finetune_report import METRIC, MODES, READERS, format_metric, study_controls, study_plot, study_report
from experiments.study_report import plateau_threshold
from experiments.tasks import (CANDIDATES, TASKS, baselines, candidate_sets, classification_scores, make_task, read_texts,
                               retrieval_scores)

DEFAULTS = dict(
    init_from="",            # a train.py out_dir (its ckpt.pt), or a published name / save_pretrained folder
    task="speaker",          # speaker | tampered | retrieval
    mode="probe",            # probe (head only, backbone frozen) | full (everything)
    pooling="auto",          # auto (gpt: last, the others: mean) | last (causal models only) | mean
    dataset="shakespeare_char",  # the text the tasks are made from (char-level, prepared)
    seed=1337, seeds=1,      # seeds seed, seed+1, ...: the head's initialisation and the order of training examples
    steps=300,               # full fine-tuning steps
    probe_steps=600,         # head-only steps on cached features
    batch_size=32, learning_rate=3e-4, head_learning_rate=3e-3, temperature=0.05,  # temperature: contrastive loss
    # (--study tries every rate of its grid: its backbone's in full mode, its head's in probe mode)
    warmup=0.1,              # the rates rise linearly over this share of the steps, then fall linearly to 0
    device="auto",
    study=False, scale="cpu", quick=False, out_dir="results/study", fresh=False,  # --study: the whole table
    jobs=1,                  # --study: how many fine-tuning cells (and missing pretraining runs) run at once
)


# ----------------------------------------------------------------------------- a backbone and its pooled features

class Backbone:
    """A model, its tokenizer and pad id, from a train.py out_dir or a published checkpoint."""

    def __init__(self, init_from, device):
        self.suffix = []  # ids appended to every input
        path = init_from if os.path.isfile(init_from) else os.path.join(init_from, "ckpt.pt")  # a run or its file
        published = os.path.exists(os.path.join(init_from, "config.json")) or \
            not (os.path.exists(init_from) or os.sep in init_from or init_from.startswith(".") or
                 init_from.endswith(".pt"))
        if os.path.exists(path):
            from objectives import Specials
            from infra.pretrained import tokenizer_for
            self.model, checkpoint = load_model(path, device)
            meta = checkpoint["meta"]
            specials = Specials.from_meta(meta)
            self.tokenizer, self.pad = tokenizer_for(meta), specials.pad
            self.objective = checkpoint["config"].get("objective")
        elif published:  # a hub name or a save_pretrained folder (pretrained.py; needs transformers)
            from infra.pretrained import load_for_sampling
            try:
                self.model, self.tokenizer, specials = load_for_sampling(init_from, device)
            except UserError as e:
                if os.path.exists(init_from) or "/" in init_from:
                    raise
                raise UserError(f"{e}; nor is there a folder {init_from} here (a train.py out_dir: train first)") from None
            self.pad, self.objective = specials.pad, "pretrained"
            if self.model.config.arch == "bert":  # BERT read [CLS] text [SEP] in pretraining
                self.suffix = [self.tokenizer.hf.sep_token_id]
        elif os.path.isdir(init_from):
            raise UserError(f"--init_from={init_from} holds no ckpt.pt (a train.py out_dir) and no config.json (a "
                            f"save_pretrained folder): train first (python train.py --out_dir={init_from} ...)")
        else:
            raise UserError(f"--init_from={init_from} does not exist: pass a train.py out_dir (or its ckpt.pt)")
        self.arch, self.device = self.model.config.arch, device
        self.mask = specials.mask  # [MASK]: what a masked model's own predictions read (fewlabels.py)

    def encode(self, texts):
        """Right-padded ids (B, T) and lengths (B,), each text cut to the model's context."""
        rows = []
        for text in texts:
            if hasattr(self.tokenizer, "stoi"):  # a char-level checkpoint of another text: drop unknown characters
                text = "".join(ch for ch in text if ch in self.tokenizer.stoi)
            ids = self.tokenizer.encode(text)[:self.model.config.block_size - len(self.suffix)]
            rows.append(ids + self.suffix)
        lengths = torch.tensor([max(1, len(r)) for r in rows])
        ids = torch.full((len(rows), int(lengths.max())), self.pad, dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, :len(r)] = torch.tensor(r, dtype=torch.long)
        return ids.to(self.device), lengths.to(self.device)


def hidden_states(model, ids, lengths):
    """Every position's final state (B, T, C), as each reader reads an input. Every reader attends to the real
    tokens only: bert and the t5 encoder mask the padding keys; prefixlm takes the whole input as its bidirectional
    prefix (prefix_length = length, so the padding after it is never a key of a real position); gpt's right padding
    comes after every real position, which a causal model cannot see (its state at i has read tokens 0..i only)."""
    arch = model.config.arch
    if arch == "t5":
        return model.encode(ids, lengths=lengths)
    if arch == "bert":
        return model.run_stack(ids, lengths=lengths)
    if arch == "prefixlm":
        return model.run_stack(ids, prefix_length=lengths)
    return model.run_stack(ids)


def pooled_features(model, ids, lengths, pooling):
    """One vector (B, C) per input: the last position (a causal model's only one that has read everything) or the
    mean over the real positions."""
    hidden = hidden_states(model, ids, lengths)
    if pooling == "last":  # claim D4's other face: only the last position of a causal model has read everything
        return hidden[torch.arange(ids.size(0), device=ids.device), lengths - 1]
    real = (torch.arange(ids.size(1), device=ids.device)[None, :] < lengths[:, None]).to(hidden.dtype)
    return (hidden * real[..., None]).sum(1) / lengths[:, None].to(hidden.dtype)  # (B, C)


def resolve_pooling(pooling, arch):
    if pooling == "auto":
        return "last" if arch == "gpt" else "mean"
    if pooling not in ("last", "mean"):
        raise UserError(f"--pooling={pooling}: choose auto, last or mean")
    if pooling == "last" and arch != "gpt":
        raise UserError(f"--pooling=last is for a causal model (gpt), whose last position alone has read the whole "
                        f"input; this checkpoint is {arch}, which attends both ways: use --pooling=mean")
    return pooling


@torch.no_grad()
def features_of(backbone, texts, pooling, batch_size=64):
    backbone.model.eval()
    out = []
    for i in range(0, len(texts), batch_size):
        out.append(pooled_features(backbone.model, *backbone.encode(texts[i:i + batch_size]), pooling).float())
    return torch.cat(out)


# ----------------------------------------------------------------------------- training a head (and the backbone)

def run_cell(backbone, task, mode, pooling, data, seed, config, stop):
    """Train one (task, mode, seed) on the recipe every reader shares (experiments/recipe.py: AdamW, a warmup, then
    linear to 0) and score it on the task's evaluation examples, and on its tuning examples when data holds some
    ("tuning": the score a rate of the grid is chosen on). probe: the backbone is frozen, its features computed
    once, the head trains at config["head_learning_rate"]; full: the backbone (config["learning_rate"]) and the
    head train together. Returns the metrics."""
    model, n_embd = backbone.model, backbone.model.config.n_embd
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    if task == "retrieval":  # a linear map of the pooled state, identity at the start: frozen features unchanged
        head = torch.nn.Linear(n_embd, n_embd, bias=False)
        torch.nn.init.eye_(head.weight)
    else:
        head = torch.nn.Linear(n_embd, len(data["classes"]))  # its initialisation differs per seed
        torch.nn.init.normal_(head.weight, std=0.02, generator=generator)
        torch.nn.init.zeros_(head.bias)
    head = head.to(backbone.device)
    train = data["train"]
    keys = ("text", "next") if task == "retrieval" else ("text",)  # what each example gives the model to read
    labels = torch.tensor([e.get("label", 0) for e in train], device=backbone.device)
    for p in model.parameters():
        p.requires_grad_(mode == "full")
    if mode == "probe":
        cached = {key: features_of(backbone, [e[key] for e in train], pooling) for key in keys}
        read = lambda index, key: cached[key][torch.from_numpy(index).to(backbone.device)]  # noqa: E731
    else:
        read = lambda index, key: pooled_features(  # noqa: E731
            model, *backbone.encode([train[i][key] for i in index.tolist()]), pooling)

    def batch_loss(rng):
        # without replacement: a pair twice in one batch would be its own in-batch negative
        index = rng.permutation(len(train))[:config["batch_size"]]
        if task == "retrieval":  # in-batch negatives: each line's own next line against the batch's others
            q, k = (F.normalize(head(read(index, key)), dim=-1) for key in keys)
            return F.cross_entropy(q @ k.T / config["temperature"], torch.arange(len(q), device=q.device))
        return F.cross_entropy(head(read(index, "text")), labels[torch.from_numpy(index).to(labels.device)])

    steps = config["probe_steps"] if mode == "probe" else config["steps"]
    recipe.train(None if mode == "probe" else backbone, head, steps, config, batch_loss, stop, seed)
    model.eval()
    scores = evaluate(backbone, task, pooling, head, data["eval"], data.get("candidates"), data["classes"])
    if "tune" in data:
        tuning = evaluate(backbone, task, pooling, head, data["tune"], data.get("tune_candidates"), data["classes"])
        scores["tuning"] = tuning[METRIC[task]]
    return scores


@torch.no_grad()
def evaluate(backbone, task, pooling, head, examples, candidates, classes):
    """The task's metrics on `examples`, the pooled states passed through `head` (the identity: retrieval's frozen
    row, the states as they come out of pretraining): recall@1 and MRR among each query's candidates, or accuracy
    and balanced accuracy."""
    features = lambda key: head(features_of(backbone, [e[key] for e in examples], pooling)).cpu()  # noqa: E731
    if task == "retrieval":
        return retrieval_scores(features("text").numpy(), features("next").numpy(), candidates)
    return classification_scores(features("text").argmax(-1).numpy(), [e["label"] for e in examples], len(classes))


def check_config(config):
    if config["task"] not in TASKS:
        raise UserError(f"unknown --task={config['task']}: choose one of {', '.join(TASKS)}")
    if config["mode"] not in MODES:
        raise UserError(f"unknown --mode={config['mode']}: choose probe (head only) or full (everything)")
    for key in ("seeds", "steps", "probe_steps", "batch_size"):
        if config[key] < 1:
            raise UserError(f"--{key} must be at least 1, got {config[key]}")
    for key in ("learning_rate", "head_learning_rate", "temperature"):
        if not config[key] > 0:
            raise UserError(f"--{key} must be positive, got {config[key]}")
    if not 0 <= config["warmup"] < 1:
        raise UserError(f"--warmup is the share of the steps the rates rise over: at least 0, below 1; got "
                        f"{config['warmup']}")
    check_seed(config["seed"])


# ----------------------------------------------------------------------------- the study: every arch x task x mode

STUDY_SCALES = {  # which study.py checkpoints (and their context, the longest example), the fine-tuning budget, how
    # many training examples are held out as tuning items, and the recipe's grids: the backbone's rates (full) and
    # the head's (probe, the backbone frozen), each with the one rate past each edge it grows to
    "cpu": dict(seeds=3, steps=300, probe_steps=600, max_chars=64,
                limits={"train": 3000, "eval": 1000, "min_eval": 100, "tune": 500},
                rates=(3e-4, 1e-3, 3e-3), grown=(1e-4, 1e-2), probe_rates=(1e-3, 3e-3, 1e-2), probe_grown=(3e-4, 3e-2)),
    "gpu": dict(seeds=5, steps=2000, probe_steps=2000, max_chars=256,
                limits={"train": 20000, "eval": 2000, "min_eval": 100, "tune": 2000},
                rates=(3e-5, 1e-4, 3e-4), grown=(1e-5, 1e-3), probe_rates=(1e-3, 3e-3, 1e-2), probe_grown=(3e-4, 3e-2)),
    # quick: the 32-token models read the first half of 64-character examples (a smoke run; its grid not grown)
    "quick": dict(seeds=1, steps=3, probe_steps=5, max_chars=64,
                  limits={"train": 64, "eval": 120, "min_eval": 2, "tune": 16},
                  rates=(1e-3, 3e-3), grown=(1e-3, 3e-3), probe_rates=(1e-2,), probe_grown=(1e-2, 1e-2)),
}
CELL_SECONDS = {("retrieval", "full"): 65, ("retrieval", "probe"): 9, "full": 43, "probe": 2}  # one core, for the
# time left


def checkpoint_differs(checkpoint, run, s, dataset, device, meta, budget):
    """What makes a checkpoint found in the study's folder not the study's run `run` (an entry of train_all):
    its arch, objective, shape, position encoding, data, seed or schedule differ from what that run trains with, or
    it has not spent the FLOPs budget. Returns the differences as text ("" if it is the run)."""
    expected = equal_flops_config(run, 1.0, s, dataset, "", device, meta, run[3]["seed"], True, budget)
    keys = MODEL_KEYS + ("objective", "dataset", "seed", "learning_rate", "min_lr", "warmup_iters", "batch_size",
                         "max_flops")
    differ = [f"{key}={checkpoint['config'].get(key)!r}, not {expected[key]!r}" for key in keys
              if checkpoint["config"].get(key) != expected[key]]
    if checkpoint["flops_done"] < budget:
        differ.append(f"{checkpoint['flops_done']:.3g} FLOPs of its budget's {budget:.3g}")
    return "; ".join(differ)


def study_backbones(config, scale, device, seeds, option="--out_dir"):
    """The study's equal-FLOPs checkpoints of gpt, bert, prefixlm, t5 and diffusion, one pretraining run per seed
    (study.py's folders: <prefix>-<name> for the first seed, <prefix>-seed<seed>-<name> for the others): reused
    when study.py (or an earlier --study) left them finished in out_dir/checkpoints, else trained now with
    study.py's own code at the learning rates its sweep chose. option: the caller's name for config["out_dir"] (a
    folder that cannot be written is one line naming it). Returns ({(name, seed): folder}, identities)."""
    from experiments import study  # its scales and models; imported here, only --study needs them
    s = study.SCALES[scale]
    _, meta = load_dataset(config["dataset"], s["block_size"], prepare_if_missing=True)
    budget = flops_budget(s, meta)
    prefix = os.path.join(config["out_dir"], "checkpoints", scale)
    wanted = [m for m in study.MODELS if m[0] in {name for name, _ in READERS}]
    folders = {(m[0], seed): f"{prefix}-{m[0]}" if seed == seeds[0] else f"{prefix}-seed{seed}-{m[0]}"
               for m in wanted for seed in seeds}
    study_json = os.path.join(config["out_dir"], f"study-{scale}.json")  # the rates study.py's sweep chose
    rates = {}
    if os.path.exists(study_json):
        try:
            with open(study_json) as f:
                rates = json.load(f).get("chosen_learning_rate", {})
            rates = {name: float(rate) for name, rate in rates.items()}
        except (OSError, ValueError, TypeError, AttributeError) as e:
            raise UserError(f"{study_json} is damaged ({type(e).__name__}): it names the learning rates the study "
                            f"chose; run python experiments/study.py again, or delete it (the study's pretraining "
                            f"then uses rate 1e-3)") from None
    to_train = []
    for name, arch, objective, extra in wanted:
        for seed in seeds:
            path = os.path.join(folders[(name, seed)], "ckpt.pt")
            rate = dict(learning_rate=rates[name], min_lr=rates[name] / 10) if name in rates else {}
            run = (f"{name}, seed {seed}", arch, objective, dict(extra, **rate, seed=seed, out_dir=folders[(name, seed)]))
            if os.path.exists(path):
                differ = checkpoint_differs(load_checkpoint(path), run, s, config["dataset"], device, meta, budget)
                if not differ:
                    continue
                print(f"[finetune study] not reusing {path}: it holds {differ}; it trains again", flush=True)
            to_train.append(run)
    if to_train:
        check_writable([os.path.join(config["out_dir"], "checkpoints", "ckpt.pt")], option)  # (a trial write)
        print(f"[finetune study] pretraining {len(to_train)} runs at equal FLOPs (study.py, scale {scale}; learning "
              f"rates " + (f"from {study_json}" if rates else "1e-3: study.py has not chosen them")
              + f"); the others are reused from {prefix}-*", flush=True)
        trained, _ = train_all(to_train, s, config["dataset"], prefix, device, meta, seeds[0], True,
                               again="the same command goes on from the finished runs", jobs=config.get("jobs", 1))
        if trained is None:  # train_all said which checkpoints are finished; they are reused next time
            raise KeyboardInterrupt  # run_main: status 130 and what is kept (the finished pretraining runs)
    identities = {}  # which pretraining runs the results belong to: a retrained checkpoint invalidates them
    for (name, seed), folder in folders.items():
        checkpoint = load_checkpoint(os.path.join(folder, "ckpt.pt"))
        identities[f"{name}, seed {seed}"] = {
            "iter_num": checkpoint["iter_num"], "seed": checkpoint["config"]["seed"],
            "learning_rate": checkpoint["config"]["learning_rate"], "final_val_loss": checkpoint["best_val_loss"],
            "written": int(os.path.getmtime(os.path.join(folder, "ckpt.pt")))}
    return folders, identities


def study_tasks(texts, s):
    """Each task's training, tuning and evaluation examples: the tuning items (the last quarter of the training
    examples, at most limits["tune"]) are held out of the training ones; a rate is chosen on them, never on an
    evaluation example."""
    out = {}
    for task in TASKS:
        data = make_task(task, texts, s["max_chars"], s["seed"], s["limits"])
        n = min(s["limits"]["tune"], len(data["train"]) // 4)
        if n < 2:
            raise UserError(f"--task={task} has {len(data['train'])} training examples: too few to hold tuning "
                            f"items out of them; use a longer text")
        data["train"], data["tune"] = data["train"][:-n], data["train"][-n:]
        if task == "retrieval":  # (fewer candidates than the evaluation's where the tuning items are few)
            data["tune_candidates"] = candidate_sets(data["tune"], size=min(CANDIDATES, n // 2))
        out[task] = data
    return out


def lines_of(example):
    return {line.strip() for key in ("text", "next") for line in example.get(key, "").split("\n") if line.strip()}


def shared_with_training(data):
    """The share of a task's tuning items that hold a line of text also in a training example: they are held-out
    examples, not held-out text (overlapping passages and consecutive line pairs reach both), so the rate is
    chosen on items that are partly familiar; the evaluation examples come from the validation split."""
    seen = set().union(*(lines_of(e) for e in data["train"]))
    return float(np.mean([bool(lines_of(e) & seen) for e in data["tune"]]))


STUDY = {}  # what the study's cells read: set here, or in each worker process (--jobs > 1) by prepare_study


def prepare_study(dataset, s, folders, device, tasks=None):
    STUDY.update(tasks=tasks or study_tasks(read_texts(dataset), s), s=s, folders=folders, device=device)


def run_study_cell(cell, stop):
    """cell: ("<task> <mode>", model, pooling, seed, rate): a fresh copy of the seed's backbone (full fine-tuning
    changes its weights), trained at the grid's rate for what the mode trains (the backbone, or the head)."""
    part, name, pooling, seed, rate = cell
    task, mode = part.split()
    config = dict(STUDY["s"], **{"learning_rate" if mode == "full" else "head_learning_rate": rate})
    started = time.perf_counter()
    scores = run_cell(Backbone(STUDY["folders"][(name, seed)], STUDY["device"]), task, mode, pooling,
                      STUDY["tasks"][task], seed, config, stop)
    return cell, dict(scores, **{"learning rate": rate, "seconds": time.perf_counter() - started})


def earlier_study(paths, settings):
    """(the results of an earlier --study of these very settings and checkpoints, the file they were in), its
    partial file first; (None, None) if there is none."""
    for path in paths:
        if not os.path.exists(path):
            continue
        try:
            with open(path) as f:
                previous = json.load(f)
        except (OSError, ValueError) as e:
            raise UserError(f"{path} is damaged ({type(e).__name__}): delete it, or pass --fresh=True") from None
        if previous.get("settings") == json.loads(json.dumps(settings)):
            print(f"reusing {len(previous['cells'])} finished cells from {path} (--fresh=True to start over)")
            previous.pop("notes", None)  # (an earlier stop's)
            return previous, path
        print(f"{path} holds results of other settings or other pretrained checkpoints: they are not reused (a "
              f"partial file is replaced by this run's)", flush=True)
    return None, None


def study(config):
    config["out_dir"] = output_folder(config, DEFAULTS)
    check_jobs(config)
    scale = "quick" if config["quick"] else config["scale"]
    if scale not in STUDY_SCALES:
        raise UserError(f"unknown --scale={scale}: {', '.join(k for k in STUDY_SCALES if k != 'quick')} (or --quick)")
    one_run_only = [k for k in ("init_from", "task", "mode", "pooling", "seeds", "steps", "probe_steps",
                                "learning_rate") if config[k] != DEFAULTS[k]]
    if one_run_only:
        raise UserError(f"--{one_run_only[0]} is for one fine-tuning run; --study runs every task, mode and reader "
                        f"with the scale's settings and rate grids (STUDY_SCALES): drop it")
    check_config(config)
    name = os.path.join(config["out_dir"], f"finetune-{scale}")
    check_writable([name + extension for extension in (".md", ".json", ".png", "-partial.json")])
    s = dict(STUDY_SCALES[scale], scale=scale, seed=config["seed"], dataset=config["dataset"],
             batch_size=config["batch_size"], head_learning_rate=config["head_learning_rate"],
             temperature=config["temperature"], warmup=config["warmup"])
    device = pick_device(config["device"])
    texts = read_texts(config["dataset"])
    t0 = time.perf_counter()
    seeds = [config["seed"] + k for k in range(s["seeds"])]  # one pretraining run per seed
    began = time.time()
    folders, s["checkpoints"] = study_backbones(config, scale, device, seeds)
    pretrained_now = any(v["written"] >= int(began) for v in s["checkpoints"].values())
    data, reused = (None, None) if config["fresh"] else earlier_study([name + "-partial.json", name + ".json"], s)
    data = data or {"settings": s, "cells": [], "baselines": {}, "frozen": [], "examples": {}, "seconds": 0.0}
    data.update(machine=machine_line(device, config, runs=None if pretrained_now or config["jobs"] > 1 else 1),
                plateau_threshold=plateau_threshold(config["out_dir"], scale))
    seconds_before = data["seconds"]
    tasks = study_tasks(texts, s)
    for task, t in tasks.items():  # deterministic; the report states their sizes and class balance
        data["examples"][task] = {
            "train": len(t["train"]), "tune": len(t["tune"]), "eval": len(t["eval"]), "classes": t["classes"],
            "tuning items sharing a line with training": shared_with_training(t),
            "eval_class_counts": [sum(e["label"] == c for e in t["eval"]) for c in range(len(t["classes"]))]}
        if task not in data["baselines"]:  # the same examples for every reader: baselines once per task
            data["baselines"][task] = baselines(task, t)
    os.makedirs(config["out_dir"], exist_ok=True)
    plan = [(f"{task} {mode}", model, pooling, seed, rate) for task in TASKS for mode in MODES for seed in seeds
            for rate in s["rates" if mode == "full" else "probe_rates"] for model, pooling in READERS]
    grown = {f"{task} {mode}": s["grown" if mode == "full" else "probe_grown"] for task in TASKS for mode in MODES}
    plan += [cell for cell in recipe.begun(data["cells"], seeds) if cell not in plan]
    cost = lambda cells: sum(CELL_SECONDS.get(tuple(c[0].split()), CELL_SECONDS[c[0].split()[1]])  # noqa: E731
                             for c in cells)
    arguments = (config["dataset"], s, folders, device)
    prepare_study(*arguments, tasks=tasks)  # here; each worker process makes its own
    jobs, stopped, started, done = min(config["jobs"], len(plan)), False, time.perf_counter(), 0
    try:
        with StopSignals(immediate=True) as stop:
            print(f"[finetune study] retrieval's frozen row first: the untrained pooled states of "
                  f"{len(READERS) * len(seeds)} backbones", flush=True)
            for model, pooling in READERS:  # retrieval's frozen row: the pooled states, untrained
                for seed in seeds:
                    if stop:
                        raise KeyboardInterrupt
                    if not any((f["reader"], f["seed"]) == (f"{model} ({pooling})", seed) for f in data["frozen"]):
                        t = tasks["retrieval"]
                        data["frozen"].append({"reader": f"{model} ({pooling})", "seed": seed, **evaluate(
                            Backbone(folders[(model, seed)], device), "retrieval", pooling, torch.nn.Identity(),
                            t["eval"], t["candidates"], [])})
            todo = recipe.missing(plan, data["cells"])
            print(f"[finetune study] {len(plan)} cells (tasks x modes x seeds x rates x readers), {jobs} at a "
                  f"time; {len(plan) - len(todo)} done before", flush=True)
            while True:  # the grid, then the one rate past each rate kept at its edge (recipe.grow)
                to_do = cost(todo) + done
                for cell, result in recipe.finished_cells(todo, jobs, run_study_cell, stop, prepare_study, arguments):
                    part, model, pooling, seed, rate = cell
                    task, mode = part.split()
                    data["cells"].append({"part": part, "task": task, "mode": mode, "reader": f"{model} ({pooling})",
                                          "seed": seed, **result})
                    done += cost([cell])
                    data["seconds"] = seconds_before + time.perf_counter() - t0
                    write_atomically(name + "-partial.json", json.dumps(data, indent=1))
                    left = (time.perf_counter() - started) / done * (to_do - done)
                    print(f"[finetune study] {len(data['cells'])}/{len(plan)}: {task}, {model} ({pooling}), {mode}, "
                          f"seed {seed}, rate {rate:g}; ~{format_duration(max(0, left))} left", flush=True)
                more = recipe.grow(data["cells"], grown, seeds)
                plan += more
                todo = recipe.missing(plan, data["cells"])
                if not todo:
                    break
                print(f"[finetune study] the grid grown past {len(more) // len(seeds)} rates kept at its edge: "
                      f"{len(todo)} cells more", flush=True)
    except KeyboardInterrupt:
        stopped = True
    if done or stopped or not seconds_before:  # (a rerun with nothing left to run rewrites the report only)
        data["seconds"] = seconds_before + time.perf_counter() - t0
    data["controls"] = study_controls(data)
    out = name + ("-partial" if stopped else "")  # never over the whole result a complete run wrote
    if stopped:
        data["notes"] = [f"**Interrupted: {len(data['cells'])} of {len(plan)} cells done; rows may hold fewer "
                         f"seeds or rates than the header names; the same command goes on from them.**"]
    text = study_report(data, scale)
    print("\n" + text)
    write_atomically(out + ".json", json.dumps(data, indent=1), out + ".md", text + "\n")
    study_plot(data, out + ".png")
    if not stopped and (done or reused == name + "-partial.json"):  # its progress is in the whole result now
        for extension in (".json", ".md", ".png"):
            if os.path.exists(name + "-partial" + extension):
                os.remove(name + "-partial" + extension)
    print(f"wrote {out}.md, .json and .png", flush=True)
    if stopped:
        sys.exit(130)  # a stop, after writing what finished (docs/reliability.md)


# ----------------------------------------------------------------------------- one checkpoint, one task

LIMITS = {"train": 4000, "eval": 1000, "min_eval": 100}


def main():
    config = apply_overrides(DEFAULTS, sys.argv[1:])
    if config["study"] or config["quick"]:
        return study(config)
    check_config(config)
    if not config["init_from"]:
        raise UserError("--init_from=<out_dir of train.py, or a published model> is needed (or --study)")
    device = pick_device(config["device"])
    texts = read_texts(config["dataset"])  # before the model: a bad dataset costs nothing
    backbone = Backbone(config["init_from"], device)
    pooling = resolve_pooling(config["pooling"], backbone.arch)
    data = make_task(config["task"], texts, backbone.model.config.block_size, config["seed"], LIMITS)
    print(f"{config['task']}: {len(data['train'])} training and {len(data['eval'])} evaluation examples; "
          f"{backbone.arch} ({backbone.objective}), {pooling} pooling, --mode={config['mode']}", flush=True)
    print("  the trivial baselines (a character n-gram logistic regression is tuned, with its progress)...", flush=True)
    for name, scores in baselines(config["task"], data).items():
        print(f"  baseline, {name}: " + ", ".join(f"{k} {100 * v:.1f}%" for k, v in scores.items()))
    if config["task"] == "retrieval":
        scores = evaluate(backbone, "retrieval", pooling, torch.nn.Identity(), data["eval"], data["candidates"], [])
        print("  frozen pooled states, no training: " + ", ".join(f"{k} {100 * v:.1f}%" for k, v in scores.items()))
    results, t0, stopped = [], time.perf_counter(), False
    with StopSignals(immediate=True) as stop:
        try:
            for k in range(config["seeds"]):
                seed = config["seed"] + k
                fresh = Backbone(config["init_from"], device) if k else backbone  # full mode changes the weights
                started = time.perf_counter()
                scores = run_cell(fresh, config["task"], config["mode"], pooling, data, seed, config, stop)
                results.append(scores)
                left = (time.perf_counter() - t0) / (k + 1) * (config["seeds"] - k - 1)
                print(f"  seed {seed}: " + ", ".join(f"{k_} {100 * v:.1f}%" for k_, v in scores.items()) +
                      f" ({time.perf_counter() - started:.1f} s" + (f", ~{format_duration(left)} left)" if left else ")"),
                      flush=True)
        except KeyboardInterrupt:
            print(f"interrupted after {len(results)} of {config['seeds']} seeds", flush=True)
            stopped = True
    if results:
        print(f"{config['task']}, {backbone.arch}, {config['mode']}, {len(results)} seed(s): " +
              ", ".join(f"{key} {format_metric([r[key] for r in results])}%" for key in results[0]) +
              f"; {time.perf_counter() - t0:.1f} s")
    if stopped:
        sys.exit(130)  # a stop, after printing the seeds that finished (docs/reliability.md)


if __name__ == "__main__":
    run_main(main, interrupted="with --study, the finished cells and pretraining runs are kept: the same command "
                              "goes on from them")
