"""
Question: pretrain once, add a small head, fine-tune per task (claim B2): do encoders beat decoders of the same
size and recipe on judgements over a whole input (F3), on embeddings for retrieval (E3), on classification (X1)?

    python experiments/finetune.py --init_from=out-cpu-bert --task=speaker --mode=probe   # one checkpoint, one task
    python experiments/finetune.py --init_from=out-cpu-gpt --task=tampered --mode=full --pooling=mean --seeds=3
    python experiments/finetune.py --init_from=bert-base-uncased --task=retrieval  # published (infra/pretrained.py)
    python experiments/finetune.py --study          # the study's gpt, bert, prefixlm, t5, diffusion x every task x
                                                    # mode x 3 seeds: 85 minutes -> results/study/finetune-cpu.*
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
--mode=full fine-tunes everything. Baselines under the same scoring: the majority class and a character
1-3-gram logistic regression (numpy); for retrieval chance and n-gram cosine similarity.
"""
import json
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # python experiments/finetune.py
import infra.quiet_interrupts  # noqa: E402,F401  (before torch: a Ctrl-C while it loads ends quietly)

import numpy as np
import torch
import torch.nn.functional as F

from infra.checkpoint import load_checkpoint, load_model
from infra.configurator import QUICK_NOTE, UserError, apply_overrides, check_seed, output_folder, pick_device, run_main
from infra.dataset import load_dataset
from infra.progress import StopSignals, check_writable, format_duration, write_atomically
from experiments.equal_compute import check_jobs, equal_flops_config, flops_budget, machine_line, train_all
from infra.train_config import MODEL_KEYS
from experiments.study_report import mean_std
from experiments.tasks import CANDIDATES, TASKS, baselines, classification_scores, make_task, read_texts, retrieval_scores
from infra.plots import pyplot, save

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
    device="auto",
    study=False, scale="cpu", quick=False, out_dir="results/study", fresh=False,  # --study: the whole table
    jobs=1,                  # --study's pretraining: how many runs train at once (processes, one per core)
)
MODES = ("probe", "full")


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
            self.tokenizer, self.pad = tokenizer_for(meta), Specials.from_meta(meta).pad
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
    """Train one (task, mode, seed) and score it on the task's evaluation examples. probe: the backbone is frozen
    and its features computed once; full: backbone + head train together. Returns the metrics."""
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
    if mode == "probe":
        for p in model.parameters():
            p.requires_grad_(False)
        cached = {key: features_of(backbone, [e[key] for e in train], pooling) for key in keys}
        optimizer = torch.optim.AdamW(head.parameters(), lr=config["head_learning_rate"], weight_decay=0.0)
        steps = config["probe_steps"]
    else:
        model.train()
        for p in model.parameters():
            p.requires_grad_(True)
        optimizer = torch.optim.AdamW([{"params": model.parameters(), "lr": config["learning_rate"]},
                                       {"params": head.parameters(), "lr": config["head_learning_rate"]}],
                                      weight_decay=0.0)
        steps = config["steps"]
    labels = torch.tensor([e.get("label", 0) for e in train], device=backbone.device)
    for step in range(steps):
        if stop:
            raise KeyboardInterrupt
        # without replacement: a pair twice in one batch would be its own in-batch negative
        index = torch.randperm(len(train), generator=generator)[:config["batch_size"]]
        if mode == "probe":
            inputs = {key: values[index.to(values.device)] for key, values in cached.items()}
        else:
            inputs = {key: pooled_features(model, *backbone.encode([train[i][key] for i in index.tolist()]), pooling)
                      for key in keys}
        if task == "retrieval":  # in-batch negatives: each line's own next line against the batch's others
            q, k = F.normalize(head(inputs["text"]), dim=-1), F.normalize(head(inputs["next"]), dim=-1)
            loss = F.cross_entropy(q @ k.T / config["temperature"], torch.arange(len(q), device=q.device))
        else:
            loss = F.cross_entropy(head(inputs["text"]), labels[index.to(labels.device)])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    model.eval()
    with torch.no_grad():
        if task == "retrieval":
            return score_retrieval(backbone, data, pooling, head)
        predicted = head(features_of(backbone, [e["text"] for e in data["eval"]], pooling)).argmax(-1).cpu()
        return classification_scores(predicted.numpy(), [e["label"] for e in data["eval"]], len(data["classes"]))


@torch.no_grad()
def score_retrieval(backbone, data, pooling, head=torch.nn.Identity()):
    """Recall@1 and MRR of the evaluation queries among their candidates, with the pooled states passed through
    `head` (the identity: as they come out of pretraining, no training at all)."""
    q, k = (head(features_of(backbone, [e[key] for e in data["eval"]], pooling)).cpu().numpy()
            for key in ("text", "next"))
    return retrieval_scores(q, k, data["candidates"])


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
    check_seed(config["seed"])


def format_metric(values):
    mean, std = mean_std(values)
    return f"{100 * mean:.1f}" + ("" if std is None else f" +- {100 * std:.1f}")


# ----------------------------------------------------------------------------- the study: every arch x task x mode

STUDY_SCALES = {  # which study.py checkpoints (and their context, the longest example), and the fine-tuning budget
    "cpu": dict(seeds=3, steps=300, probe_steps=600, max_chars=64, limits={"train": 3000, "eval": 1000, "min_eval": 100}),
    "gpu": dict(seeds=5, steps=2000, probe_steps=2000, max_chars=256,
                limits={"train": 20000, "eval": 2000, "min_eval": 100}),
    # quick: the 32-token models read the first half of 64-character examples (a smoke run)
    "quick": dict(seeds=1, steps=3, probe_steps=5, max_chars=64, limits={"train": 64, "eval": 120, "min_eval": 2}),
}
READERS = [("gpt", "last"), ("gpt", "mean"), ("bert", "mean"), ("prefixlm", "mean"), ("t5", "mean"),
           ("diffusion", "mean")]  # (study model, pooling)


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
    missing = []
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
            missing.append(run)
    if missing:
        check_writable([os.path.join(config["out_dir"], "checkpoints", "ckpt.pt")], option)  # (a trial write)
        print(f"[finetune study] pretraining {len(missing)} runs at equal FLOPs (study.py, scale {scale}; learning "
              f"rates " + (f"from {study_json}" if rates else "1e-3: study.py has not chosen them")
              + f"); the others are reused from {prefix}-*", flush=True)
        trained, _ = train_all(missing, s, config["dataset"], prefix, device, meta, seeds[0], True,
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


def study(config):
    config["out_dir"] = output_folder(config, DEFAULTS)
    check_jobs(config)
    scale = "quick" if config["quick"] else config["scale"]
    if scale not in STUDY_SCALES:
        raise UserError(f"unknown --scale={scale}: {', '.join(k for k in STUDY_SCALES if k != 'quick')} (or --quick)")
    one_run_only = [k for k in ("init_from", "task", "mode", "pooling", "seeds", "steps", "probe_steps")
                    if config[k] != DEFAULTS[k]]
    if one_run_only:
        raise UserError(f"--{one_run_only[0]} is for one fine-tuning run; --study runs every task, mode and reader "
                        f"with the scale's settings (STUDY_SCALES): drop it")
    check_config(config)
    check_writable([os.path.join(config["out_dir"], f"finetune-{scale}{extension}")
                    for extension in (".md", ".json", ".png")])
    settings = dict(STUDY_SCALES[scale], scale=scale, seed=config["seed"], dataset=config["dataset"],
                    batch_size=config["batch_size"], learning_rate=config["learning_rate"],
                    head_learning_rate=config["head_learning_rate"], temperature=config["temperature"])
    run = dict(config, **{k: settings[k] for k in ("steps", "probe_steps")})
    device = pick_device(config["device"])
    texts = read_texts(config["dataset"])
    t0 = time.perf_counter()
    seeds = [config["seed"] + k for k in range(settings["seeds"])]  # one pretraining run per seed
    folders, settings["checkpoints"] = study_backbones(config, scale, device, seeds)
    json_path = os.path.join(config["out_dir"], f"finetune-{scale}.json")
    data = {"settings": settings, "device": device, "machine": machine_line(device, config), "cells": [], "baselines": {}, "frozen": [], "examples": {}}
    if os.path.exists(json_path) and not config["fresh"]:
        with open(json_path) as f:
            previous = json.load(f)
        if previous.get("settings") == settings:
            data = previous
            print(f"reusing {len(data['cells'])} finished cells from {json_path} (--fresh=True to start over)")
        else:
            print(f"{json_path} holds results of other settings or other pretrained checkpoints: starting over "
                  f"(they are replaced)", flush=True)
    seconds_before = data.get("seconds", 0.0)
    done = {(c["task"], c["reader"], c["mode"], c["seed"]) for c in data["cells"]}
    plan = [(task, name, pooling, mode, seed) for task in TASKS for name, pooling in READERS for mode in MODES
            for seed in seeds if (task, f"{name} ({pooling})", mode, seed) not in done]
    os.makedirs(config["out_dir"], exist_ok=True)
    tasks, cell_seconds = {}, []
    for task in TASKS:  # deterministic, a second or two each; the report states their sizes and class balance
        tasks[task] = make_task(task, texts, settings["max_chars"], config["seed"], settings["limits"])
        classes = tasks[task]["classes"]
        data["examples"][task] = {"train": len(tasks[task]["train"]), "eval": len(tasks[task]["eval"]),
                                  "classes": classes,
                                  "eval_class_counts": [sum(e["label"] == c for e in tasks[task]["eval"])
                                                        for c in range(len(classes))]}
    stopped = False
    try:
        with StopSignals(immediate=True) as stop:
            for number, (task, name, pooling, mode, seed) in enumerate(plan):
                if task not in data["baselines"]:  # the same examples for every reader: baselines once per task
                    data["baselines"][task] = baselines(task, tasks[task])
                reader = f"{name} ({pooling})"
                backbone = Backbone(folders[(name, seed)], device)  # fresh weights: full mode changes them
                if task == "retrieval" and not any((f["reader"], f.get("seed")) == (reader, seed) for f in data["frozen"]):
                    data["frozen"].append({"reader": reader, "seed": seed,
                                           **score_retrieval(backbone, tasks[task], pooling)})
                left = f", ~{format_duration(np.mean(cell_seconds) * (len(plan) - number))} left" if cell_seconds else ""
                print(f"[finetune study] {number + 1}/{len(plan)}: {task}, {reader}, {mode}, seed {seed}{left}",
                      flush=True)
                started = time.perf_counter()
                scores = run_cell(backbone, task, mode, pooling, tasks[task], seed, run, stop)
                cell_seconds.append(time.perf_counter() - started)
                data["cells"].append({"task": task, "reader": reader, "mode": mode, "seed": seed,
                                      "seconds": cell_seconds[-1], **scores})
                write_atomically(json_path, json.dumps(data, indent=1))
    except KeyboardInterrupt:
        print(f"interrupted: {len(data['cells'])} cells kept in {json_path}; rerun the same command to go on")
        stopped = True
    data["seconds"] = seconds_before + time.perf_counter() - t0
    text = study_report(data, scale)
    print("\n" + text)
    write_atomically(json_path, json.dumps(data, indent=1), os.path.join(config["out_dir"], f"finetune-{scale}.md"),
                     text + "\n")
    study_plot(data, os.path.join(config["out_dir"], f"finetune-{scale}.png"))
    print(f"wrote {os.path.join(config['out_dir'], f'finetune-{scale}')}.md, .json and .png", flush=True)
    if stopped:
        sys.exit(130)  # a stop, after writing what finished (docs/reliability.md)


METRIC = {"speaker": "balanced accuracy", "tampered": "accuracy", "retrieval": "recall@1"}  # the table's
SECOND_METRIC = {"speaker": "accuracy", "retrieval": "mrr"}  # shown too


def sampling_error(p, examples, class_counts=None):
    """95% half-width of a score p measured on `examples` evaluation examples: binomial for an accuracy; for a
    balanced accuracy (the mean of per-class recalls, classes with examples only) each class's recall varies with
    its own count, so a small class weighs as much as a large one: 1.96 sqrt(sum_c p(1-p)/n_c) / C."""
    if class_counts:
        counts = [n for n in class_counts if n > 0]
        return 1.96 * math.sqrt(sum(p * (1 - p) / n for n in counts)) / len(counts)
    return 1.96 * math.sqrt(p * (1 - p) / examples)


def study_report(data, scale):
    s = data["settings"]
    readers = [f"{name} ({pooling})" for name, pooling in READERS]
    lines = [QUICK_NOTE, ""] if scale == "quick" else []
    lines += [f"Fine-tuning the study's equal-FLOPs checkpoints (scale `{scale}`), {s['seeds']} seeds (mean +- std "
             f"in %): each seed is its own pretraining run (study.py's run of that seed, at the learning rate its "
             f"sweep chose) and sets the head's initialisation and the order of training examples, so the std "
             f"includes pretraining; not the choice of evaluation examples (see the sampling error below). full: {s['steps']} steps of batch {s['batch_size']} at "
             f"learning rate {s['learning_rate']} (head {s['head_learning_rate']}); probe: {s['probe_steps']} "
             f"head-only steps on frozen features; retrieval's frozen row: the pooled states, untrained. Inputs of "
             f"at most {s['max_chars']} characters. t5 reads with its encoder (half its layers). On "
             f"{data.get('machine', data['device'])}; {data.get('seconds', 0) / 60:.1f} min in all (pretraining included when it "
             f"happened).", "",
             "| task (metric) | mode | " + " | ".join(readers) + " |", "|---|---|" + "---|" * len(readers)]
    for task in TASKS:
        metrics = [METRIC[task]] + ([SECOND_METRIC[task]] if task in SECOND_METRIC else [])
        for metric in metrics:
            modes = (["frozen"] if task == "retrieval" else []) + list(MODES)
            for mode in modes:
                cells = []
                for reader in readers:
                    if mode == "frozen":
                        values = [f[metric] for f in data["frozen"] if f["reader"] == reader]
                    else:
                        values = [c[metric] for c in data["cells"] if (c["task"], c["reader"], c["mode"]) ==
                                  (task, reader, mode)]
                    cells.append(format_metric(values) if values else "-")
                lines.append(f"| {task} ({metric}) | {mode} | " + " | ".join(cells) + " |")
    lines += ["", "Baselines under the same scoring (no model), and the evaluation set's own sampling error (95% "
                  "half-width of the table's metric: at the majority-class score, or at chance for retrieval):", ""]
    for task, rules in data["baselines"].items():
        examples = data["examples"][task]
        p = rules["majority class"][METRIC[task]] if "majority class" in rules else 1 / CANDIDATES
        half_width = sampling_error(p, examples["eval"], examples.get("eval_class_counts")
                                    if METRIC[task] == "balanced accuracy" else None)
        balance = ", ".join(f"{name} {count}" for name, count in zip(examples["classes"],
                                                                     examples.get("eval_class_counts", [])))
        lines.append(f"- {task} ({examples['train']} training / {examples['eval']} evaluation examples"
                     + (f", {len(examples['classes'])} classes; evaluation: {balance}" if examples["classes"] else "")
                     + "): " +
                     "; ".join(f"{rule} " + ", ".join(f"{k} {100 * v:.1f}%" for k, v in scores.items())
                               for rule, scores in rules.items()) + f"; sampling error +-{100 * half_width:.1f} points")
    return "\n".join(lines)


def study_plot(data, path):
    plt = pyplot()
    if plt is None:
        return
    readers = [f"{name} ({pooling})" for name, pooling in READERS]
    fig, axes = plt.subplots(1, len(TASKS), figsize=(15, 4.5))
    for axis, task in zip(axes, TASKS):
        metric = METRIC[task]
        for offset, mode in zip((-0.2, 0.2), MODES):
            values = [[c[metric] for c in data["cells"] if (c["task"], c["reader"], c["mode"]) == (task, r, mode)]
                      for r in readers]
            means = [100 * np.mean(v) if v else 0 for v in values]
            errors = [100 * np.std(v, ddof=1) if len(v) > 1 else 0 for v in values]
            axis.bar(np.arange(len(readers)) + offset, means, 0.4, yerr=errors, label=mode, capsize=3)
        for number, (rule, scores) in enumerate(data["baselines"].get(task, {}).items()):
            axis.axhline(100 * scores[metric], linestyle=(":", "--")[number % 2], color="grey", label=rule)
        axis.set_xticks(np.arange(len(readers)), readers, rotation=35, ha="right", fontsize=8)
        axis.set_title(f"{task} ({metric}, %)")
        axis.legend(fontsize=7)
    fig.tight_layout()
    save(fig, path, dpi=120)


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
        scores = score_retrieval(backbone, data, pooling)
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
