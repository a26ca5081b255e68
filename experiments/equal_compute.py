"""
The experiments' shared harness: train several objectives to the same training FLOPs, over seeds, and start an
experiment's command the same way everywhere. Not a command; study.py, incontext.py, reversal.py, planning.py,
tagging.py, epochs.py and finetune.py build on it.

    train_all(models, ...)             every (name, arch, objective, settings) to the FLOPs of s["gpt_iters"]
                                       iterations of the gpt of scale s (forward + backward, t5's two stacks
                                       counted), each with a learning rate that decays over its own share
    train_and_evaluate_seeds(...)      that, for each seed, followed by the experiment's own evaluation
    train_in_processes(runs, jobs)     train_all's runs in `jobs` processes at once (--jobs=2 on 2 cores: about
                                       half the wall time), each on its share of the threads
    resolve_experiment(...)            overrides, scale (--quick wins), device, result files checked writable

Why equal FLOPs and not equal iterations: an iteration of bert reads 15% of its positions and one of t5 runs two
stacks, so equal iterations would hand one objective more compute than another (claim C1 is about exactly that).
"""
import sys

if __name__ == "__main__":  # beside the commands, but not one: one line, not an import error
    sys.exit("equal_compute.py: a helper of every experiment, not a command: "
             "experiments/README.md lists the commands")

import json
import multiprocessing
import os
import queue
import time
import traceback

import torch

import objectives
import train
from infra.checkpoint import load_model
from infra.configurator import UserError, apply_overrides, output_folder, pick_device
from infra.dataset import fingerprint, load_dataset
from infra.progress import Progress, StopSignals, check_writable, format_duration, format_flops, write_atomically
from infra.train_config import model_config
from model import ModelConfig, Transformer


def resolve_experiment(defaults, scales, name, extensions=(".md", ".json", ".png")):
    """The common start of the experiments: overrides, the scale (--quick wins), seed and device, and the result
    files (out_dir/<name>-<scale><extension>) checked writable before any work."""
    config = apply_overrides(defaults, sys.argv[1:])
    config["out_dir"] = output_folder(config, defaults)
    if "jobs" in config and (isinstance(config["jobs"], bool) or not isinstance(config["jobs"], int)
                             or config["jobs"] < 1):
        raise UserError(f"--jobs={config['jobs']}: how many runs train at once, a whole number >= 1 (the cores the "
                        f"machine has: {os.cpu_count()})")
    scale = "quick" if config["quick"] else config["scale"]
    if scale not in scales or (scale == "quick" and not config["quick"]):  # quick output goes to out-quick/ only
        raise UserError(f"unknown --scale={scale}: {', '.join(k for k in scales if k != 'quick')} (or --quick)")
    check_writable([os.path.join(config["out_dir"], f"{name}-{scale}{extension}") for extension in extensions])
    return config, scale, pick_device(config["device"])


def train_and_evaluate_seeds(label, models, s, dataset, work, device, meta, config, evaluate):
    """The seed loop of the small experiments: for each of s["seeds"] seeds (config["seed"] + k), train `models` to
    equal FLOPs (checkpoints in work/seed<seed>-<name>) and evaluate({name: summary}) them. config["jobs"] > 1:
    every seed's runs train first, that many at a time (train_in_processes), and the loop loads them. A stop while
    training or evaluating ends the loop, keeping the seeds finished. Returns (runs, budget, interrupted), runs a
    list of {"seed": seed, "models": evaluate's result}."""
    runs, budget, t0 = [], None, time.perf_counter()
    seeds = [config["seed"] + k for k in range(s["seeds"])]
    reuse, fresh = config["reuse"], None
    if config.get("jobs", 1) > 1:
        fresh = train_in_processes([(model, (s, dataset, os.path.join(work, f"seed{seed}"), device, meta, seed,
                                             config["quiet"]), reuse) for seed in seeds for model in models],
                                   config["jobs"], label)
        if fresh is None:
            return runs, flops_budget(s, meta), True
        reuse = True  # every run is finished now: the loop below loads them
    for number, seed in enumerate(seeds):
        print(f"[{label}] seed {number + 1}/{len(seeds)}, {format_duration(time.perf_counter() - t0)} so far", flush=True)
        trained, budget = train_all(models, s, dataset, os.path.join(work, f"seed{seed}"), device, meta, seed,
                                    config["quiet"], reuse=reuse)
        if trained is None:
            return runs, budget, True
        if fresh is not None:  # trained by this command's processes, not reused from an earlier one
            for name in trained:
                trained[name]["reused"] = (name, seed) not in fresh
        try:
            with StopSignals(immediate=True):
                runs.append({"seed": seed, "models": evaluate(trained)})
        except KeyboardInterrupt:
            print(f"interrupted while evaluating seed {seed}", flush=True)
            return runs, budget, True
    return runs, budget, False


def train_all(models, s, dataset, checkpoints, device, meta, seed, quiet, reuse=False, divergence_is_a_result=False,
              again="--reuse=True goes on from the finished runs", jobs=1):
    """Train each (name, arch, objective, extra settings) of `models` on `dataset` to the same training FLOPs:
    s["gpt_iters"] iterations of the gpt of shape s (times extra["budget_fraction"], if given). Checkpoints go to
    <checkpoints>-<name> unless extra names an out_dir; extra may also set learning_rate, min_lr and seed.
    reuse=True: a run whose folder holds a finished run of exactly these settings (study_run.json, written after
    training) is loaded instead of retrained, so a long study stopped half-way goes on where it stopped.
    divergence_is_a_result=True (a learning-rate sweep): a run whose loss stops being finite is recorded as
    {"diverged": why, "val_loss": None} and the others go on; otherwise it ends the study with one line.
    again: how the caller's command goes on after an interruption, for the message.
    jobs > 1: the runs train first in that many processes at once (train_in_processes), then load as reused ones.
    Returns ({name: train.train's summary + seconds and objective}, budget), or (None, budget) if interrupted."""
    if jobs > 1 and len(models) > 1:
        fresh = train_in_processes([(model, (s, dataset, checkpoints, device, meta, seed, quiet), reuse)
                                    for model in models], jobs, "train at equal FLOPs", again)
        if fresh is None:
            return None, flops_budget(s, meta)
        trained, budget = train_all(models, s, dataset, checkpoints, device, meta, seed, quiet, True,
                                    divergence_is_a_result, again)
        for name in trained or {}:  # trained by this command's processes, not reused from an earlier one
            trained[name]["reused"] = (name, seed) not in fresh
        return trained, budget
    budget = flops_budget(s, meta)
    fractions = [m[3].get("budget_fraction", 1.0) for m in models]  # a run costs its share of the budget
    trained, started, units_done = {}, time.perf_counter(), 0.0
    tokens = {}  # dataset -> fingerprint of the tokens: a run is reused only if it read the same ones
    for number, (name, arch, objective, extra) in enumerate(models):
        extra = dict(extra)
        fraction = extra.pop("budget_fraction", 1.0)
        elapsed = time.perf_counter() - started
        left = f", ~{format_duration(elapsed / units_done * sum(fractions[number:]))} of training left" \
            if units_done and elapsed > 1 else ""
        print(f"[train at equal FLOPs] run {number + 1}/{len(models)}: {name} ({arch}, {objective}){left}", flush=True)
        run_config = equal_flops_config((name, arch, objective, extra), fraction, s, dataset, checkpoints, device,
                                        meta, seed, quiet, budget)
        record = os.path.join(run_config["out_dir"], "study_run.json")
        if run_config["dataset"] not in tokens:
            tokens[run_config["dataset"]] = fingerprint(load_dataset(run_config["dataset"], s["block_size"], True)[0])
        settings = dict({k: v for k, v in run_config.items() if k not in ("quiet", "overwrite")},
                        tokens=tokens[run_config["dataset"]])
        if reuse and os.path.exists(record):
            with open(record) as f:
                done = json.load(f)
            if done["settings"] == json.loads(json.dumps(settings)):
                result = dict(done["summary"], model=load_model(os.path.join(run_config["out_dir"], "ckpt.pt"),
                                                                device)[0], meta=meta, reused=True)
                print(f"reused {name}: finished with the same settings ({run_config['out_dir']})", flush=True)
                trained[name] = result  # the time left is estimated from the runs trained now only
                continue
        if os.path.exists(record):
            os.remove(record)  # from now on the folder holds this run, finished or not
        t0 = time.perf_counter()
        try:
            result = train.train(run_config)
        except train.TrainingDiverged as e:
            if not divergence_is_a_result:
                raise UserError(f"{name} diverged: {e} (lower that model's learning rate in the "
                                f"experiment's settings; --reuse=True keeps the runs already finished)") from None
            print(f"{name} diverged: {e}", flush=True)
            trained[name] = {"diverged": str(e), "val_loss": None}
            units_done += fraction
            continue
        if result["interrupted"]:
            not_trained = [m[0] for m in models[number:]]
            print(f"interrupted: trained {', '.join(trained) or 'no model'}; not finished: {', '.join(not_trained)} "
                  f"({name}'s checkpoint is in {run_config['out_dir']}); no metrics computed, they compare every "
                  f"model ({again})", flush=True)
            return None, budget
        result["seconds"] = time.perf_counter() - t0
        result["objective"] = objective
        summary = {k: v for k, v in result.items() if k not in ("model", "meta", "interrupted")}
        write_atomically(record, json.dumps({"settings": settings, "summary": summary}))
        print(f"trained {name}: {result['iter_num']} iterations, {format_flops(result['flops'])}, "
              f"{result['seconds']:.0f} s, val loss {result['val_loss']:.4f} ({objective})", flush=True)
        trained[name] = result
        units_done += fraction
    return trained, budget


def train_in_processes(runs, jobs, label, again="--reuse=True goes on from them"):
    """Train `runs`, each (model, train_all's arguments after `models`: (s, dataset, checkpoints, device, meta, seed,
    quiet), reuse), in processes of their own, `jobs` at a time, each with its share of the threads; a train_all
    with reuse=True then loads them. Returns the {(name, seed)} trained now (not reused), or None if stopped:
    Ctrl-C or SIGTERM stops every process as train.py stops (what finished is kept for --reuse=True). The processes
    print nothing: this one prints the progress. A run that diverges is left to the train_all that follows."""
    context = multiprocessing.get_context("spawn")  # not fork: a forked OpenMP runtime can hang
    threads = max(1, torch.get_num_threads() // jobs)
    reports = context.Queue()
    waiting, running, fresh, failed = list(runs), {}, set(), None
    progress = Progress(f"[{label}] training runs finished:", len(runs))
    print(f"[{label}] {len(runs)} training runs, {jobs} processes of {threads} thread(s)", flush=True)
    try:
        with StopSignals(f"stopping the {jobs} training processes (each saves its checkpoint)") as stop:
            while running or (waiting and not stop and failed is None):
                while waiting and len(running) < jobs and not stop and failed is None:
                    model, arguments, reuse = waiting.pop(0)
                    process = context.Process(target=train_one, args=(model, arguments, reuse, threads, reports))
                    process.start()
                    running[(model[0], arguments[5])] = process
                try:
                    key, outcome = reports.get(timeout=1)
                    running.pop(key).join()  # (a process that reported is in `running` until here)
                    if outcome == "trained":
                        fresh.add(key)
                    elif outcome not in ("reused", "diverged", "stopped") and failed is None:
                        failed = f"{key[0]} (seed {key[1]}): {outcome}"
                except queue.Empty:  # a process that ended without a word (killed from outside, out of memory); one
                    for key, process in list(running.items()):  # that reported has its word in the queue already
                        if process.exitcode is not None and reports.empty():
                            running.pop(key)
                            if not stop and failed is None:
                                failed = f"{key[0]} (seed {key[1]}): its process ended with status {process.exitcode}"
                if stop or failed:
                    for process in running.values():
                        if process.exitcode is None and not getattr(process, "asked_to_stop", False):
                            process.asked_to_stop = True
                            process.terminate()  # SIGTERM: train.py saves its checkpoint and returns
                progress.update(len(runs) - len(waiting) - len(running))
    finally:  # a second Ctrl-C (quit at once) or an error here: no process is left behind
        for process in running.values():
            process.kill()
    if failed:
        raise UserError(f"training {failed}")
    if stop:
        print(f"interrupted: {len(fresh)} runs trained, their checkpoints kept ({again})", flush=True)
        return None
    return fresh


def train_one(model, arguments, reuse, threads, reports):
    """One run of train_in_processes, in a process of its own: what train_all made of it, as one word, or the
    error."""
    os.setsid()  # a group of its own: a Ctrl-C reaches the parent, which stops each process once
    torch.set_num_threads(threads)
    sys.stdout = open(os.devnull, "w")  # the parent prints the progress
    try:
        trained, _ = train_all([model], *arguments, reuse=reuse, divergence_is_a_result=True)
        result = None if trained is None else trained[model[0]]
        outcome = "stopped" if result is None else "diverged" if "diverged" in result else \
            "reused" if result.get("reused") else "trained"
    except UserError as e:
        outcome = str(e)
    except BaseException:  # noqa: B902  (the parent says it in one line and stops)
        outcome = traceback.format_exc(limit=-3).strip().splitlines()[-1]
    reports.put(((model[0], arguments[5]), outcome))


def equal_flops_config(model, fraction, s, dataset, checkpoints, device, meta, seed, quiet, budget):
    """train.py's config for one (name, arch, objective, extra settings) of train_all: the shape of scale s (t5 splits
    its layers), `fraction` of the FLOPs budget, and a learning rate that decays over the model's own share of it
    (its own iteration count). What a study run trains with is this, and nothing else."""
    name, arch, objective, extra = model
    layers = dict(n_layer=s["n_layer"] // 2 or 1, n_decoder_layer=s["n_layer"] // 2 or 1) if arch == "t5" else {}
    iterations = max(1, round(fraction * s["gpt_iters"]))
    args = dict(arch=arch, objective=objective, dataset=dataset, device=device, out_dir=f"{checkpoints}-{name}",
                n_layer=s["n_layer"], n_head=s["n_head"], n_embd=s["n_embd"], block_size=s["block_size"],
                batch_size=s["batch_size"], dropout=0.0, bias=False, max_iters=10 ** 9,
                max_flops=float(fraction * budget), lr_decay_iters=iterations, warmup_iters=min(100, iterations // 10),
                learning_rate=1e-3, min_lr=1e-4, beta2=0.99, eval_interval=10 ** 9, eval_iters=20,
                log_interval=10 ** 9, seed=seed, quiet=quiet, overwrite=True)
    args.update(**layers, **extra, eval_iters=s["eval_iters"])
    config = train.resolve_config([f"--{k}={v}" for k, v in args.items()])
    config["lr_decay_iters"] = int(fraction * budget / estimate_step_flops(config, s, meta)) + 1
    return config


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
    return model.training_flops(objectives.batch_for(config, windows, specials, torch.Generator().manual_seed(0)))
