"""
The experiments' shared harness: train several objectives to the same training FLOPs, over seeds, and start an
experiment's command the same way everywhere. Not a command; study.py, incontext.py, reversal.py, planning.py,
tagging.py, epochs.py and finetune.py build on it.

    train_all(models, ...)             every (name, arch, objective, settings) to the FLOPs of s["gpt_iters"]
                                       iterations of the gpt of scale s (forward + backward, t5's two stacks
                                       counted), each with a learning rate that decays over its own share
    train_and_evaluate_seeds(...)      that, for each seed, followed by the experiment's own evaluation
    train_in_processes(runs, jobs)     train_all's runs in `jobs` processes at once (--jobs=N, one per core),
                                       each on its share of the threads
    machine_line(device, config)       the machine a result file names, and how its training runs shared it
    resolve_experiment(...)            overrides, scale (--quick or --scale, not both), device, result files checked

Why equal FLOPs and not equal iterations: an iteration of bert reads 15% of its positions and one of t5 runs two
stacks, so equal iterations would hand one objective more compute than another (claim C1 is about exactly that).
"""
import sys

if __name__ == "__main__":  # beside the commands, but not one: one line, not an import error
    sys.exit("equal_compute.py: a helper of every experiment, not a command: "
             "experiments/README.md lists the commands")

import contextlib
import json
import multiprocessing
import multiprocessing.connection
import os
import re
import signal
import threading
import time
import traceback
import warnings

import torch

import objectives
import train
from infra.checkpoint import load_model
from infra.configurator import Failure, UserError, apply_overrides, output_folder, pick_device
from infra.dataset import fingerprint, load_dataset
from infra.plots import pyplot
from infra.progress import StopSignals, check_writable, format_duration, format_flops, write_atomically
from infra.timing import machine_name
from infra.train_config import MODEL_KEYS, model_config
from model import ModelConfig, Transformer

# The processes of train_in_processes (and of encoders.py's workers) talk through pipes, which hold nothing the
# multiprocessing resource tracker cleans up: if it was killed, its warning that resources "might leak" is untrue
warnings.filterwarnings("ignore", message="resource_tracker: process died unexpectedly", category=UserWarning,
                        module=r"multiprocessing\.resource_tracker")


def resolve_experiment(defaults, scales, name, extensions=(".md", ".json", ".png")):
    """The common start of the experiments: overrides, the scale (--quick or --scale), seed and device, and the result
    files (out_dir/<name>-<scale><extension>) checked writable before any work."""
    config = apply_overrides(defaults, sys.argv[1:])
    config["out_dir"] = output_folder(config, defaults)
    check_jobs(config)
    if config["scale"] not in scales or config["scale"] == "quick":  # checked even where --quick wins over it
        raise UserError(f"unknown --scale={config['scale']}: {', '.join(k for k in scales if k != 'quick')} "
                        f"(or --quick)")
    if config["quick"] and config["scale"] != defaults["scale"]:  # (not silently the quick scale)
        raise UserError(f"--quick runs the smoke scale, not --scale={config['scale']}: give one of the two")
    scale = "quick" if config["quick"] else config["scale"]
    last_seed = config["seed"] + scales[scale].get("seeds", 1) - 1  # every seed is checked now, not when it comes
    if last_seed >= 2 ** 32:
        raise UserError(f"--seed={config['seed']}: its {scales[scale]['seeds']} seeds run up to {last_seed}, past "
                        f"2**32 - 1: use a smaller --seed")
    check_writable([os.path.join(config["out_dir"], f"{name}-{scale}{extension}") for extension in extensions])
    return config, scale, pick_device(config["device"])


def check_jobs(config):
    """--jobs, where a command has it: how many training runs at once, a whole number >= 1."""
    jobs = config.get("jobs", 1)
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise UserError(f"--jobs={jobs}: how many runs train at once, a whole number >= 1 (the cores the machine "
                        f"has: {os.cpu_count()})")


def machine_line(device, config, runs=None):
    """The machine a result file names (machine_name: this process's threads) and, with --jobs, how the training
    runs shared it: as many at once as --jobs, or as there were runs (`runs`, where the caller knows)."""
    jobs = min(config.get("jobs", 1), runs or config.get("jobs", 1))
    return machine_name(device) + (f", {jobs} training runs at once (processes; each run's seconds measured beside "
                                   f"the others')" if jobs > 1 else "")


def train_and_evaluate_seeds(label, models, s, dataset, work, device, meta, config, evaluate):
    """The seed loop of the small experiments: for each of s["seeds"] seeds (config["seed"] + k), train `models` to
    equal FLOPs (checkpoints in work/seed<seed>-<name>) and evaluate({name: summary}) them. config["jobs"] > 1:
    every seed's runs train first, that many at a time (train_in_processes), and the loop loads them. A stop while
    training or evaluating ends the loop, keeping (and evaluating) the seeds whose runs all finished. Returns (runs,
    budget, interrupted), runs a list of {"seed": seed, "models": evaluate's result}."""
    runs, t0, budget = [], time.perf_counter(), flops_budget(s, meta)
    seeds = [config["seed"] + k for k in range(s["seeds"])]
    folders = {seed: os.path.join(work, f"seed{seed}") for seed in seeds}
    outcomes, stopped = None, False
    if config.get("jobs", 1) > 1:
        outcomes, stopped = train_in_processes(
            {f"{model[0]}, seed {seed}": (model, (s, dataset, folders[seed], device, meta, seed, config["quiet"]),
                                          config["reuse"]) for seed in seeds for model in models},
            config["jobs"], label)
        seeds = [seed for seed in seeds if all(f"{model[0]}, seed {seed}" in outcomes for model in models)]
    for number, seed in enumerate(seeds):
        print(f"[{label}] seed {number + 1}/{len(seeds)}, {format_duration(time.perf_counter() - t0)} so far", flush=True)
        trained, _ = train_all(models, s, dataset, folders[seed], device, meta, seed, config["quiet"],
                               reuse=config["reuse"], outcomes=None if outcomes is None else
                               {model[0]: outcomes[f"{model[0]}, seed {seed}"] for model in models})
        if trained is None:
            return runs, budget, True
        try:
            with StopSignals(immediate=True):
                runs.append({"seed": seed, "models": evaluate(trained)})
        except KeyboardInterrupt:
            print(f"interrupted while evaluating seed {seed}", flush=True)
            return runs, budget, True
    return runs, budget, stopped


def same_settings(recorded, settings):
    """Whether a finished run's recorded settings are these. A setting train.py gained after the record was written
    (init_std) is missing from it: the run used the behaviour that setting's default keeps, so a missing key
    counts as its default."""
    wanted = json.loads(json.dumps(settings))
    defaults = json.loads(json.dumps(train.DEFAULTS))
    added = {k: v for k, v in wanted.items() if k not in recorded and k in defaults and v == defaults[k]}
    return dict(added, **recorded) == wanted


def train_all(models, s, dataset, checkpoints, device, meta, seed, quiet, reuse=False, divergence_is_a_result=False,
              again="--reuse=True goes on from the finished runs", jobs=1, outcomes=None):
    """Train each (name, arch, objective, extra settings) of `models` on `dataset` to the same training FLOPs:
    s["gpt_iters"] iterations of the gpt of shape s (times extra["budget_fraction"], if given). Checkpoints go to
    <checkpoints>-<name> unless extra names an out_dir; extra may also set learning_rate, min_lr and seed.
    reuse=True: a run whose folder holds a finished run of exactly these settings (study_run.json, written after
    training) is loaded instead of retrained, so a long study stopped half-way goes on where it stopped.
    divergence_is_a_result=True (a learning-rate sweep): a run whose loss stops being finite is recorded as
    {"diverged": why, "val_loss": None} and the others go on; otherwise it ends the study with one line.
    again: how the caller's command goes on after an interruption, for the message.
    jobs > 1: the runs train first, that many at once, in processes of their own (train_in_processes); outcomes:
    what such processes made of each run ({name: (trained | reused | diverged, why)}), loaded (or, diverged,
    recorded) here without training anything.
    Returns ({name: train.train's summary + seconds and objective}, budget), or (None, budget) if interrupted."""
    budget = flops_budget(s, meta)
    if jobs > 1 and len(models) > 1 and outcomes is None:
        outcomes, stopped = train_in_processes(
            {model[0]: (model, (s, dataset, checkpoints, device, meta, seed, quiet), reuse) for model in models}, jobs,
            "train at equal FLOPs", again, divergence_is_a_result)
        if stopped:
            return None, budget
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
        kind, why = outcomes[name] if outcomes is not None else (None, None)
        if kind == "diverged":  # in a process of its own (train_in_processes)
            trained[name] = diverged(name, why, divergence_is_a_result)
            continue
        if (reuse or kind) and os.path.exists(record):
            with open(record) as f:
                done = json.load(f)
            if same_settings(done["settings"], settings):
                try:
                    model, checkpoint = load_model(os.path.join(run_config["out_dir"], "ckpt.pt"), device)
                except UserError as e:
                    raise UserError(f"cannot reuse {name}: delete {run_config['out_dir']} (that run trains again) or "
                                    f"run without --reuse=True ({e})") from None
                wanted = dict(train.DEFAULTS, **run_config)
                differ = [f"{k}={checkpoint['config'].get(k)}, not {wanted[k]}" for k in MODEL_KEYS + ("objective",)
                          if checkpoint["config"].get(k) != wanted[k]]
                if not differ:  # the record's settings and the weights themselves agree
                    result = dict(done["summary"], model=model, meta=meta, reused=kind in (None, "reused"))
                    print(f"reused {name}: finished earlier with the same settings ({run_config['out_dir']})"
                          if result["reused"] else f"loaded {name}: trained above, in a process of its own",
                          flush=True)
                    trained[name] = result  # the time left is estimated from the runs trained now only
                    continue
                print(f"not reusing {name}: its checkpoint holds {'; '.join(differ)}; it trains again", flush=True)
        if os.path.exists(record):
            os.remove(record)  # from now on the folder holds this run, finished or not
        t0 = time.perf_counter()
        try:
            result = train.train(run_config)
        except train.TrainingDiverged as e:
            trained[name] = diverged(name, str(e), divergence_is_a_result)
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


def diverged(name, why, divergence_is_a_result):
    """A run whose loss stopped being finite: a result of its own (a learning-rate sweep), or the end of the study."""
    if not divergence_is_a_result:
        raise Failure(divergence_message(name, why))
    print(f"{name} diverged: {why}", flush=True)
    return {"diverged": why, "val_loss": None}


def divergence_message(name, why):
    """The one line a run that diverged ends a study with."""
    return (f"{name} diverged: {why} (lower that model's learning rate in the experiment's settings; --reuse=True "
            f"keeps the runs already finished)")


def train_in_processes(runs, jobs, label, again="--reuse=True goes on from them", divergence_is_a_result=False):
    """Train `runs`, {key: (model, train_all's arguments after `models`: (s, dataset, checkpoints, device, meta,
    seed, quiet), reuse)}, each in a process of its own, `jobs` at a time, each with its share of the threads.
    Returns (outcomes, stopped): outcomes {key: (trained | reused | diverged, why)} for the runs that finished,
    which train_all(outcomes=...) then loads. Ctrl-C or SIGTERM stops every process as train.py stops; the runs
    that finished are kept (--reuse=True loads them), a run stopped mid-way trains again; a second signal kills
    the processes at once. The processes print nothing: this one prints the progress, with the time left estimated
    from the runs finished or, before any has, from how far the runs under way say they are (ShareReports). An
    error in one, or a divergence that is not a result (divergence_is_a_result as train_all's), stops them all with
    its message."""
    context = multiprocessing.get_context("spawn")  # not fork: a forked OpenMP runtime can hang
    jobs = min(jobs, len(runs))
    threads = max(1, torch.get_num_threads() // jobs)
    reports = {}  # key -> the reading end of the pipe its process reports on (a pipe, not a multiprocessing queue:
    # a queue's named semaphores are the resource tracker's to clean, which prints tracebacks if it was killed)
    units = {key: run[0][3].get("budget_fraction", 1.0) for key, run in runs.items()}  # a run's share of the budget
    waiting, running, begun, outcomes, failed, usage = list(runs), {}, {}, {}, None, False
    trained_units = trained_seconds = 0.0  # what the runs trained here cost: the time left is estimated from them
    shares = {}  # key -> the share of its FLOPs budget a run under way has done, as its process last said
    started = last_line = time.perf_counter()
    print(f"[{label}] {len(runs)} training runs, {jobs} at a time, each in a process of {threads} thread(s)",
          flush=True)
    try:
        with StopSignals("stopping the training processes") as stop:
            while running or (waiting and not stop and failed is None):
                while waiting and len(running) < jobs and not stop and failed is None:
                    key = waiting.pop(0)
                    model, arguments, reuse = runs[key]
                    reports[key], sending = context.Pipe(duplex=False)
                    running[key] = process = context.Process(target=train_one,
                                                             args=(model, arguments, reuse, threads, sending))
                    process.start()
                    sending.close()  # the process holds the only writing end: its end is the pipe's end of file
                    begun[key] = time.perf_counter()
                ready = multiprocessing.connection.wait([reports[key] for key in running], timeout=1)
                for key in [key for key in running if reports[key] in ready]:
                    try:
                        kind, said = reports[key].recv()  # said: why (an outcome), or how far (progress)
                    except (EOFError, OSError):  # a process that ended without a word (killed, out of memory)
                        reports.pop(key).close()
                        process = running.pop(key)
                        process.join()
                        if not stop and failed is None:
                            failed = f"training {key}: its process ended with status {process.exitcode} " \
                                f"(killed, or out of memory); {again.replace('them', 'the runs that finished')}"
                        continue
                    if kind == "progress":  # a run under way: the share of its budget done (no outcome yet)
                        shares[key] = said
                        continue
                    running.pop(key).join()  # (a process that reported is in `running` until here)
                    reports.pop(key).close()
                    if kind == "diverged" and not divergence_is_a_result and failed is None:
                        failed = divergence_message(key, said)
                    elif kind in ("trained", "reused", "diverged"):
                        outcomes[key] = (kind, said)
                        if kind == "trained":  # its process's whole life: starting it costs time too
                            trained_units += units[key]
                            trained_seconds += time.perf_counter() - begun[key]
                    elif kind in ("error", "failed") and failed is None:
                        failed, usage = f"training {key}: {said}", kind == "error"
                if stop or failed:
                    for process in running.values():
                        if not getattr(process, "asked_to_stop", False):
                            process.asked_to_stop = True
                            process.terminate()  # SIGTERM: train.py saves its checkpoint and returns
                now = time.perf_counter()
                if now - last_line >= 10:
                    last_line, left = now, float("nan")
                    # seconds per unit of budget in one process: from the runs finished, or, before any has, from
                    # the runs under way
                    rate = trained_seconds / trained_units if trained_units else under_way_rate(
                        {key: (now - begun[key], units[key] * shares[key]) for key in running if shares.get(key)})
                    if rate:  # what is left: the runs waiting, and what the runs under way have not done yet
                        under_way = [max(0.0, units[key] * rate - (now - begun[key])) for key in running]
                        work = sum(units[key] for key in waiting) * rate + sum(under_way)
                        left = max([work / jobs] + under_way)
                    print(f"[{label}] {len(outcomes)}/{len(runs)} runs finished, {len(running)} training, "
                          f"{format_duration(now - started)} so far, ~{format_duration(left)} left", flush=True)
    finally:  # a second Ctrl-C (quit at once) or an error here: no process is left behind
        for process in running.values():
            if process.pid is not None:
                process.kill()
    if failed:  # a wrong setting is the user's (status 2); a run that diverged, died or failed is not (1)
        raise UserError(failed) if usage else Failure(failed)
    if stop:
        print(f"interrupted: {len(outcomes)} of {len(runs)} runs finished and kept ({again}; a run stopped "
              f"mid-way trains again)", flush=True)
    return outcomes, bool(stop)


def under_way_rate(runs):
    """Seconds per unit of budget from runs that have not finished: {key: (seconds since it began, units done)}
    (before any run finishes, the time left is estimated from these); None if none has said how far it is."""
    return sum(seconds for seconds, _ in runs.values()) / sum(done for _, done in runs.values()) if runs else None


class ShareReports:
    """A training process's stdout: nothing is printed; the share of its FLOPs budget that a quiet run prints every
    few seconds ("(P% of its FLOPs budget)", infra/run_control.py) goes to the parent as ("progress", P/100),
    which estimates the time left from it before any run has finished."""
    SHARE = re.compile(r"\((\d+)% of its FLOPs budget\)")

    def __init__(self, reports):
        self.reports = reports

    def write(self, text):
        found = self.SHARE.search(text)
        if found:
            with contextlib.suppress(OSError):  # the parent is gone: stop_when_gone stops this run
                self.reports.send(("progress", int(found[1]) / 100))
        return len(text)

    def flush(self):
        pass


def train_one(model, arguments, reuse, threads, reports):
    """One run of train_in_processes, in a process of its own: (what train_all made of it, why) on the pipe
    `reports`, its own, and ("progress", share of its budget done) while it trains (ShareReports).
    Only SIGTERM stops it: the parent sends one at a Ctrl-C (which a terminal sends to every process of the
    command: the parent alone answers it), and the process sends itself one if the parent is gone."""
    outcome, parent = ("stopped", ""), multiprocessing.parent_process()
    try:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})  # this thread's, and every thread's it starts
        threading.Thread(target=stop_when_gone, args=(parent.sentinel,), daemon=True).start()
        torch.set_num_threads(threads)
        with contextlib.redirect_stdout(ShareReports(reports)), StopSignals(immediate=True):
            trained, _ = train_all([model], *arguments, reuse=reuse, divergence_is_a_result=True)
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # done: a stop now must not lose the report
        result = {} if trained is None else trained[model[0]]
        outcome = ("stopped", "") if trained is None else ("diverged", result["diverged"]) if "diverged" in result \
            else ("reused" if result.get("reused") else "trained", "")
    except KeyboardInterrupt:  # SIGTERM outside train.py's loop (loading the data): nothing to keep
        pass
    except UserError as e:
        outcome = ("error", str(e))
    except Failure as e:
        outcome = ("failed", str(e))
    except BaseException:  # noqa: B902  (the parent says it in one line and stops the others)
        outcome = ("failed", traceback.format_exc(limit=-3).strip().splitlines()[-1])
    if parent.is_alive():
        with contextlib.suppress(OSError):  # (gone since: nobody is left to tell)
            reports.send(outcome)


def stop_when_gone(sentinel):
    """A training process's watch on its parent: if the command ends without stopping it (killed, out of memory),
    the process stops as at a SIGTERM (keeping a checkpoint) instead of training on unseen."""
    multiprocessing.connection.wait([sentinel])
    os.kill(os.getpid(), signal.SIGTERM)


def equal_flops_config(model, fraction, s, dataset, checkpoints, device, meta, seed, quiet, budget):
    """train.py's config for one (name, arch, objective, extra settings) of train_all: the shape of scale s (t5 splits
    its layers; s["position"], learned when not given, is its position encoding), `fraction` of the FLOPs budget,
    and a learning rate that decays over the model's own share of it (its own iteration count). What a study run
    trains with is this, and nothing else."""
    name, arch, objective, extra = model
    layers = dict(n_layer=s["n_layer"] // 2 or 1, n_decoder_layer=s["n_layer"] // 2 or 1) if arch == "t5" else {}
    iterations = max(1, round(fraction * s["gpt_iters"]))
    args = dict(arch=arch, objective=objective, dataset=dataset, device=device, out_dir=f"{checkpoints}-{name}",
                n_layer=s["n_layer"], n_head=s["n_head"], n_embd=s["n_embd"], block_size=s["block_size"],
                position=s.get("position", "learned"), batch_size=s["batch_size"], dropout=0.0, bias=False, max_iters=10 ** 9,
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
    windows = torch.randint(0, specials.num_ordinary, (config["batch_size"], config["block_size"] + 1))
    return model.training_flops(objectives.batch_for(config, windows, specials, torch.Generator().manual_seed(0)))


def write_results(out_dir, name, data, text, plot=None):
    """The common end of the experiments: print the report and write out_dir/<name>.json (every number) and .md
    (the report), each whole or not at all, then plot(data, <name>.png), drawn from what the JSON holds."""
    print("\n" + text)
    base = os.path.join(out_dir, name)
    write_atomically(base + ".json", json.dumps(data, indent=1), base + ".md", text + "\n")
    drawn = plot is not None and pyplot() is not None
    if drawn:
        plot(json.loads(json.dumps(data)), base + ".png")  # as experiments/redraw.py reads it back
    print(f"\nwrote {base}.md{', .json and .png' if drawn else ' and .json'} in {format_duration(data['seconds'])}",
          flush=True)
