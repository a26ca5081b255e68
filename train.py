"""
Train any of the four architectures with one command and one training loop:

    python train.py --arch=bert                                      # defaults sized for one GPU
    python train.py config/train_shakespeare_char_cpu.py --arch=t5   # nanoGPT's CPU recipe: minutes
    python train.py --arch=gpt --init_from=resume                    # continue exactly where it stopped
    torchrun --standalone --nproc_per_node=2 train.py ...            # data parallel (gloo on CPU, NCCL on CUDA)

Defaults are at the top; a config/*.py file and --key=value override them. The loop is the same for every arch:
windows of text -> the objective makes a Batch -> `model(**batch.model_inputs())` -> loss. Each log line reports
the loss in the objective's own units, ms/iter, tokens/s, *supervised* tokens/s (claim C1: the loss is only on
the positions the objective supervises) and MFU against the matmul rate this machine measured at start.
Checkpoints, the log and exact resume live in checkpoint.py; data parallel processes in parallel.py.
"""
import gc
import math
import os
import random
import sys
import time
import traceback
from contextlib import nullcontext
from dataclasses import asdict

import numpy as np
import torch

import objectives
from checkpoint import (CheckpointWriteFailed, OutDirLock, RunLog, check_resume, load_checkpoint,
                        model_from_checkpoint, remove_quietly, restore_rng, rng_state, save_checkpoint)
from configurator import UserError, apply_overrides, check_training_config, model_config, run_main
from dataset import get_windows, load_dataset
from model import Transformer, describe
from parallel import Processes
from progress import Progress, StopSignals, format_duration
from timing import matmul_flops_per_second

# ----------------------------------------------------------------------------- defaults (one GPU)
DEFAULTS = dict(
    arch="gpt",                 # gpt | bert | prefixlm | t5
    objective="",               # "" = the arch's natural one (clm, mlm, prefix_lm, span_corruption)
    dataset="shakespeare_char",  # a folder of data/ holding train.bin, val.bin, meta.pkl
    out_dir="",                 # "" = out-<arch>
    init_from="scratch",        # scratch | resume (from out_dir/ckpt.pt) | gpt2, gpt2-medium, ... (pretrained.py)
    preset="",                  # a model *shape* from model.PRESETS (gpt2, bert-base, t5-small, cpu-*): it sets the
                                # layers/heads/dims/block (winning over those keys); --arch still picks the architecture
    # model
    n_layer=6, n_decoder_layer=0, n_head=6, n_embd=384, block_size=256, dropout=0.2, bias=False,
    position="learned",         # learned | rope | none (NoPE, claim D5)
    # objective settings (the others keep the published values: objectives.py)
    mlm_mask_fraction=0.8, mlm_random_fraction=0.1,  # BERT's 80/10/10 (claim C2's ablation sets 1.0, 0.0)
    ul2_mixture=(0.5, 0.25, 0.25),                   # UL2's S / R / X weights (claim F2)
    # optimisation
    batch_size=64, gradient_accumulation_steps=1, max_iters=5000, max_flops=0.0,  # max_flops > 0: stop at this budget
    learning_rate=1e-3, min_lr=1e-4, warmup_iters=100, lr_decay_iters=5000, decay_lr=True,
    weight_decay=0.1, beta1=0.9, beta2=0.99, grad_clip=1.0,
    # evaluation, logging, checkpoints
    eval_interval=250, eval_iters=200, log_interval=10, eval_only=False, always_save_checkpoint=True,
    overwrite=False,            # a new run into an out_dir that holds a checkpoint: refused unless True
    # system
    device="auto",              # auto | cpu | cuda | cuda:N | mps
    dtype="auto",               # auto (bfloat16 on CUDA, else float32) | float32 | bfloat16 | float16 (CUDA only)
    compile=False, seed=1337, quiet=False,
)
SECONDS_BETWEEN_LINES = 10.0   # a slow run still prints a line this often (between log_interval lines)
CPU_RECIPE = "python train.py config/train_shakespeare_char_cpu.py"


def resolve_config(argv):
    config = apply_overrides(DEFAULTS, argv)
    check_training_config(config)
    return config


class TrainingDiverged(Exception):
    """A non-finite loss or weight: stop without saving (exit status 1)."""


# ----------------------------------------------------------------------------- schedule, batches, evaluation

def learning_rate_at(it, config):
    """Linear warmup, then cosine decay to min_lr at lr_decay_iters (nanoGPT)."""
    if not config["decay_lr"]:
        return config["learning_rate"]
    if it < config["warmup_iters"]:
        return config["learning_rate"] * (it + 1) / (config["warmup_iters"] + 1)
    if it > config["lr_decay_iters"]:
        return config["min_lr"]
    ratio = (it - config["warmup_iters"]) / max(1, config["lr_decay_iters"] - config["warmup_iters"])
    return config["min_lr"] + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (config["learning_rate"] - config["min_lr"])


def batch_for(config, windows, specials, generator):
    """The one place where the objective enters: windows (B, T+1) -> a Batch for config's arch."""
    return objectives.make_batch(config["objective"], windows, specials, generator, config["arch"],
                                 mlm_mask_fraction=config["mlm_mask_fraction"],
                                 mlm_random_fraction=config["mlm_random_fraction"], ul2_mixture=config["ul2_mixture"])


@torch.no_grad()
def estimate_loss(model, config, splits, specials, device, autocast, stop, log, on_first_batches=None):
    """Mean loss over eval_iters batches per split, on the same windows and noise every time (fixed seeds), so
    evaluations are comparable across iterations and architectures. Returns None when a stop was asked for:
    an evaluation is only worth something whole. `on_first_batches(seconds_per_batch)` is called once, after two
    timed batches (train.py projects the run's duration from it)."""
    model.eval()
    result = {}
    for split, path in splits.items():
        data_rng = np.random.default_rng(config["seed"] + 10_000)
        generator = torch.Generator().manual_seed(config["seed"] + 20_000)
        losses = torch.zeros(config["eval_iters"])
        progress = Progress(f"eval {split}", config["eval_iters"], SECONDS_BETWEEN_LINES, log)
        for k in range(config["eval_iters"]):
            if stop:
                model.train()
                return None
            if k == 1:
                t0 = time.perf_counter()
            windows = get_windows(path, config["batch_size"], config["block_size"], data_rng)
            batch = batch_for(config, windows, specials, generator).to(device)
            with autocast:
                _, loss = model(**batch.model_inputs())
            losses[k] = loss.item()  # also a device sync: the clock below reads finished work
            if k == 2 and on_first_batches is not None:
                on_first_batches((time.perf_counter() - t0) / 2)  # batch 0 warmed up; 1 and 2 are timed
                on_first_batches = None
            progress.update(k + 1)
        result[split] = losses.mean().item()
    model.train()
    return result


def loss_in_bits(objective, loss):
    """The two losses that are (bounds on) a log-likelihood, in bits per token (claim C4)."""
    if objective == "clm":
        return f" = {loss / math.log(2):.4f} bits/token (exact NLL)"
    if objective == "diffusion":
        return f" = {loss / math.log(2):.4f} bits/token (ELBO: an upper bound on the NLL)"
    return ""


def precision(config, device):
    """(dtype name, autocast context). Low precision is real or refused: bf16 autocast on CUDA and on the CPU,
    fp16 (with a loss scaler) on CUDA only."""
    device_type = device.split(":")[0]
    dtype = config["dtype"]
    if dtype == "auto":
        dtype = "bfloat16" if device_type == "cuda" and torch.cuda.is_bf16_supported() else "float32"
    if dtype == "float32":
        return dtype, nullcontext()
    if device_type == "cuda" or (device_type == "cpu" and dtype == "bfloat16"):
        return dtype, torch.autocast(device_type=device_type, dtype=getattr(torch, dtype))
    raise UserError(f"--dtype={dtype} is not supported on {device_type}: use float32"
                    + (" or bfloat16 (CPU autocast; slow on CPUs without bf16 units)" if device_type == "cpu" else ""))


def check_losses(pending_losses, processes, run_log, last_good):
    """Read back the losses kept on the device since the last check (one sync, not one per step), stop every
    process at the first non-finite one, and write them to the log."""
    values = torch.stack([loss for _, loss in pending_losses]).tolist() if pending_losses else []
    bad = [it for (it, _), value in zip(pending_losses, values) if not math.isfinite(value)]
    first_bad = processes.minimum(float(bad[0]) if bad else math.inf)  # one process's divergence stops them all
    if math.isfinite(first_bad):
        raise TrainingDiverged(f"the loss became non-finite at iteration {int(first_bad)}; stopped without saving. "
                               f"Last good checkpoint: {last_good}")
    if run_log:
        for (it, _), value in zip(pending_losses, values):
            run_log.write({"iter": it, "loss": value})
    pending_losses.clear()


def write_checkpoints(state, out_dir, is_best, run_log):
    """ckpt.pt always, best.pt when the validation loss improved; never weights that are not finite."""
    if not all(torch.isfinite(p).all() for p in state["model"].values() if p.is_floating_point()):
        raise TrainingDiverged(f"the weights became non-finite before iteration {state['iter_num']}; stopped without "
                               f"saving. Last good checkpoint: {last_good_checkpoint(out_dir)}")
    save_checkpoint(state, os.path.join(out_dir, "ckpt.pt"))
    if is_best:
        save_checkpoint(state, os.path.join(out_dir, "best.pt"))
    run_log.sync()  # the log is on disk up to the checkpoint


def last_good_checkpoint(out_dir):
    path = os.path.join(out_dir, "ckpt.pt")
    if os.path.exists(path):
        return f"{path} (lower --learning_rate and resume from it)"
    return "none written yet (lower --learning_rate and start again)"


def open_out_dir(config, resume_iteration):
    """The master's files: create out_dir, lock it against a second run, start (or continue) the log. A new run
    with --overwrite=True starts clean: the old checkpoints go now, not at the first save."""
    out_dir = config["out_dir"]
    created = not os.path.exists(out_dir)
    try:
        os.makedirs(out_dir, exist_ok=True)
        lock = OutDirLock(out_dir)
        lock.acquire()
    except OSError as e:
        raise UserError(f"cannot write to --out_dir={out_dir} ({e.strerror}): choose another folder") from None
    if resume_iteration is None:
        for name in ("ckpt.pt", "best.pt", "ckpt.pt.tmp", "best.pt.tmp"):
            remove_quietly(os.path.join(out_dir, name))
    return lock, RunLog(os.path.join(out_dir, "log.jsonl"), resume_iteration), created


def remove_failed_run(out_dir):
    """A new run that fails before its first checkpoint leaves no log behind (and no out_dir: see train())."""
    if not os.path.exists(os.path.join(out_dir, "ckpt.pt")):
        remove_quietly(os.path.join(out_dir, "log.jsonl"))


def planned_iterations(config, raw_model, splits, specials, iter_num):
    """Iterations left to the end: max_iters, or fewer when the --max_flops budget ends the run first (estimated
    from one batch made with private random generators, so the run's own draws are untouched)."""
    left = config["max_iters"] - iter_num
    if config["max_flops"]:
        windows = get_windows(splits["train"], config["batch_size"], config["block_size"], np.random.default_rng(0))
        batch = batch_for(config, windows, specials, torch.Generator().manual_seed(0))
        per_step = raw_model.training_flops(batch) * config["gradient_accumulation_steps"]
        left = min(left, math.ceil(config["max_flops"] / per_step) - iter_num)
    return max(0, left)


def project_run(seconds_per_eval_batch, iterations, config, device, log):
    """After two evaluation batches: what the whole run will cost here (a training step ~ 3 forward passes), and
    on a CPU the recipe to use when that is more than half an hour. The defaults stay the one-GPU defaults."""
    evals = iterations // config["eval_interval"] + 1
    eval_seconds = 2 * config["eval_iters"] * seconds_per_eval_batch
    train_seconds = 3 * iterations * config["gradient_accumulation_steps"] * seconds_per_eval_batch
    total = evals * eval_seconds + train_seconds
    log(f"projected on {device}: each evaluation ~{format_duration(eval_seconds)}, the {iterations} iterations "
        f"left ~{format_duration(total)}", flush=True)
    if device == "cpu" and total > 30 * 60:
        log(f"these settings are sized for one GPU; on this CPU try nanoGPT's CPU recipe (minutes): "
            f"{CPU_RECIPE} --arch={config['arch']}  (Ctrl-C here saves and stops)", flush=True)


# ----------------------------------------------------------------------------- the loop

def train(config):
    """Train with a resolved config (dict). Returns a summary dict; raises UserError on bad input."""
    processes = Processes(config)  # one process, or one of several under torchrun
    device, master = processes.device, processes.master
    if config["gradient_accumulation_steps"] % processes.world_size:
        multiple = processes.world_size * math.ceil(config["gradient_accumulation_steps"] / processes.world_size)
        raise UserError(f"gradient_accumulation_steps={config['gradient_accumulation_steps']} is not divisible by the "
                        f"{processes.world_size} processes: pass --gradient_accumulation_steps={multiple}")
    log = print if master and not config["quiet"] else (lambda *a, **k: None)
    out_dir = config["out_dir"]
    checkpoint, checkpoint_path = None, os.path.join(out_dir, "ckpt.pt")
    if config["init_from"] == "resume":
        checkpoint = load_checkpoint(checkpoint_path)  # before anything is prepared or written
    elif os.path.exists(checkpoint_path) and not config["overwrite"]:
        raise UserError(f"{out_dir} already holds a checkpoint: --init_from=resume to continue it, "
                        f"--overwrite=True to start over, or another --out_dir")
    # the master prepares the dataset on first use, the others wait for it
    splits, meta = processes.master_first(lambda: load_dataset(config["dataset"], config["block_size"],
                                                               prepare_if_missing=master))
    specials = objectives.Specials.from_meta(meta)
    if config["objective"] == "ul2" and not specials.modes:  # a published vocabulary (pretrained.dataset_meta)
        raise UserError(f"--objective=ul2 needs UL2's mode tokens, which dataset {config['dataset']} "
                        f"({meta['tokenizer']}'s vocabulary) does not have: use span_corruption")
    if config["objective"] in ("span_corruption", "ul2") and not specials.sentinels:
        raise UserError(f"--objective={config['objective']} needs sentinel tokens, which dataset {config['dataset']} "
                        f"({meta['tokenizer']}'s vocabulary) does not have: use a T5 or character/GPT-2 dataset")
    if config["objective"] in ("mlm", "diffusion") and meta.get("tokenizer_family") == "t5":
        raise UserError(f"--objective={config['objective']} needs a [MASK] token, which T5's vocabulary (dataset "
                        f"{config['dataset']}) does not have: use span_corruption")
    if checkpoint is not None:
        check_resume(config, checkpoint, meta)
    dtype, autocast = precision(config, device)

    # the same initial weights on every process; windows, objective noise and dropout differ between processes
    torch.manual_seed(config["seed"])
    if checkpoint is not None:  # the saved shape, which for fine-tuned published weights no flag describes
        checkpoint["model_config"]["dropout"] = config["dropout"]
        raw_model = model_from_checkpoint(checkpoint, checkpoint_path)  # with its weights
    elif config["init_from"] != "scratch":  # published GPT-2, BERT or T5 weights, fine-tuned (pretrained.py)
        from pretrained import load_for_training
        raw_model = load_for_training(config, meta)
    else:
        raw_model = Transformer(model_config(config, meta["vocab_size"]))
    raw_model = raw_model.to(device)
    torch.manual_seed(config["seed"] + 100 * processes.rank)
    random.seed(config["seed"] + processes.rank)
    data_rng = np.random.default_rng(config["seed"] + processes.rank)
    objective_rng = torch.Generator().manual_seed(config["seed"] + 1 + processes.rank)
    optimizer = raw_model.configure_optimizer(config["weight_decay"], config["learning_rate"],
                                              (config["beta1"], config["beta2"]), device.split(":")[0])
    iter_num, best_val_loss, flops_done = 0, float("inf"), 0.0
    if checkpoint is not None:  # exact resume: weights (loaded above), optimizer moments, counters and every RNG
        try:
            optimizer.load_state_dict(checkpoint["optimizer"])
        except (ValueError, KeyError, TypeError) as e:
            raise UserError(f"{checkpoint_path}: its optimizer state does not fit the model ({e}); retrain") from None
        iter_num, best_val_loss, flops_done = checkpoint["iter_num"], checkpoint["best_val_loss"], checkpoint["flops_done"]
        if len(checkpoint["rng"]) != processes.world_size:
            raise UserError(f"the checkpoint was written by {len(checkpoint['rng'])} process(es), this run has "
                            f"{processes.world_size}: resume with the same --nproc_per_node")
        try:
            restore_rng(checkpoint["rng"][processes.rank], data_rng, objective_rng)
        except (KeyError, TypeError, ValueError, RuntimeError) as e:
            raise UserError(f"{checkpoint_path}: its random-number states are unreadable ({type(e).__name__}); "
                            f"retrain") from None
        checkpoint = None  # free its memory
    scaler = torch.amp.GradScaler(enabled=(dtype == "float16"))  # fp16's narrow range needs loss scaling
    model = torch.compile(raw_model) if config["compile"] else raw_model
    model = processes.wrap(model)  # DDP averages gradients across processes during backward
    peak_flops = matmul_flops_per_second(device, torch.bfloat16 if dtype == "bfloat16" else torch.float32)
    log(f"{describe(raw_model)}; objective {config['objective']}; device {device} ({dtype}); "
        f"measured matmul peak {peak_flops / 1e12:.3f} TFLOP/s", flush=True)
    micro_steps = config["gradient_accumulation_steps"] // processes.world_size
    end_iter = iter_num + planned_iterations(config, raw_model, splits, specials, iter_num)  # for the time-left figures
    fresh = config["init_from"] != "resume"
    lock, run_log, created = processes.master_only(lambda: open_out_dir(config, None if fresh else iter_num)) \
        or (None, None, False)

    pending_losses = []  # (iteration, loss on the device): read back at log/save time, not once per step
    tokens_seen = supervised_seen = 0
    last_losses, stop_agreed = {}, False  # stop_agreed: a stop every process has heard of (signals arrive unevenly)
    t0, timed_iters, first_iter = time.perf_counter(), 0, iter_num
    last_line = time.perf_counter()
    try:
        with StopSignals("stopping: saving a checkpoint first", log) as stop:
            while True:
                stopping = stop_agreed
                done = stopping or iter_num >= config["max_iters"] or \
                    (config["max_flops"] and flops_done >= config["max_flops"])

                # ---- evaluate and save (every process reaches this point together)
                if iter_num % config["eval_interval"] == 0 or done:
                    check_losses(pending_losses, processes, run_log, last_good_checkpoint(out_dir))
                    save_now, diverged, losses = stopping and not config["eval_only"], None, None
                    if master and not stopping:
                        first = None
                        if iter_num == first_iter:
                            first = lambda seconds: project_run(seconds, end_iter - iter_num, config, device, log)
                        losses = estimate_loss(raw_model, config, splits, specials, device, autocast, stop, log, first)
                        if losses is None:  # a signal during evaluation: save what the last step left, and stop
                            save_now, stopping, done = not config["eval_only"], True, True
                        elif not all(math.isfinite(v) for v in losses.values()):
                            diverged = (f"the validation loss is {losses['val']} at iteration {iter_num}; stopped "
                                        f"without saving. Last good checkpoint: {last_good_checkpoint(out_dir)}")
                        else:
                            log(f"step {iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}"
                                + loss_in_bits(config["objective"], losses["val"]), flush=True)
                            run_log.write({"iter": iter_num, "train_loss": losses["train"], "val_loss": losses["val"]})
                            last_losses = losses
                            improved = losses["val"] < best_val_loss
                            best_val_loss = min(best_val_loss, losses["val"])
                            save_now = iter_num > 0 and not config["eval_only"] and \
                                (improved or config["always_save_checkpoint"] or done)
                    # the master decides; every process joins the save (its RNG state goes in) or the stop
                    save_now, diverged, stopping, done = processes.from_master([save_now, diverged, stopping, done])
                    if diverged:
                        raise TrainingDiverged(diverged)
                    if save_now:
                        state = {"model": raw_model.state_dict(), "optimizer": optimizer.state_dict(), "config": config,
                                 "model_config": asdict(raw_model.config), "meta": meta, "iter_num": iter_num,
                                 "best_val_loss": best_val_loss, "flops_done": flops_done,
                                 "rng": processes.gather(rng_state(data_rng, objective_rng))}
                        if master:
                            improved = losses is not None and losses["val"] <= best_val_loss
                            write_checkpoints(state, out_dir, improved, run_log)
                    if stopping:
                        saved = f"saved {checkpoint_path} at iteration {iter_num}" if save_now else "nothing saved"
                        log(f"interrupted: {saved}; resume with the same command plus --init_from=resume")
                        break
                    t0, timed_iters = time.perf_counter(), 0  # evaluation and saving are not training time
                if done or config["eval_only"]:
                    break

                # ---- one optimisation step: learning rate, micro-steps, clip, step
                lr = learning_rate_at(iter_num, config)
                for group in optimizer.param_groups:
                    group["lr"] = lr
                step_tokens = step_supervised = step_flops = 0
                for micro_step in range(micro_steps):
                    windows = get_windows(splits["train"], config["batch_size"], config["block_size"], data_rng)
                    batch = batch_for(config, windows, specials, objective_rng)
                    step_tokens += batch.processed_positions()
                    step_supervised += batch.supervised_positions()  # claim C1: what the loss actually reads
                    step_flops += raw_model.training_flops(batch)
                    batch = batch.to(device)
                    if processes.ddp:  # average gradients once per step, on the last micro-step, not on every one
                        model.require_backward_grad_sync = micro_step == micro_steps - 1
                    with autocast:
                        _, loss = model(**batch.model_inputs())
                        loss = loss / micro_steps  # the accumulated gradient is the mean over micro-steps
                    scaler.scale(loss).backward()
                if config["grad_clip"] > 0:
                    scaler.unscale_(optimizer)
                    torch.nn.utils.clip_grad_norm_(model.parameters(), config["grad_clip"])
                scaler.step(optimizer)
                scaler.update()
                optimizer.zero_grad(set_to_none=True)  # frees the gradients' memory until the next backward
                pending_losses.append((iter_num, loss.detach() * micro_steps))

                # ---- count and log; the processes agree on the totals, on logging and on stopping
                line_due = time.perf_counter() - last_line > SECONDS_BETWEEN_LINES
                step_flops, step_tokens, step_supervised, stop_agreed, line_due = processes.sum(
                    [float(step_flops), float(step_tokens), float(step_supervised), float(bool(stop)), float(line_due)])
                flops_done += step_flops
                tokens_seen += int(step_tokens)
                supervised_seen += int(step_supervised)
                timed_iters += 1
                if iter_num % config["log_interval"] == 0 or line_due or stop_agreed:
                    loss_value = pending_losses[-1][1].item()  # one sync per log line
                    check_losses(pending_losses, processes, run_log, last_good_checkpoint(out_dir))
                    t1 = time.perf_counter()
                    dt = (t1 - t0) / timed_iters  # mean over the iterations since the last log line
                    t0, timed_iters, last_line = t1, 0, t1
                    left = (end_iter - iter_num - 1) * dt
                    log(f"iter {iter_num}: loss {loss_value:.4f}, {dt * 1000:.1f} ms/iter, "
                        f"{step_tokens / dt:,.0f} tok/s, {step_supervised / dt:,.0f} supervised tok/s, "
                        f"mfu {100 * step_flops / processes.world_size / dt / peak_flops:.1f}%, "
                        f"{1 / dt:.2f} it/s, ~{format_duration(left)} left", flush=True)
                iter_num += 1
                stop_agreed = bool(stop_agreed)
                if stop_agreed:  # perhaps only another process was asked: stop together
                    stop.requested = True
            check_losses(pending_losses, processes, run_log, last_good_checkpoint(out_dir))
            if processes.ddp:  # the proof that gradients were averaged: every process holds the same weights
                checksums = processes.gather(torch.stack([p.detach().double().sum()
                                                          for p in raw_model.parameters()]).cpu())
                log(f"parameters identical on all {processes.world_size} processes: "
                    f"{all(torch.equal(checksums[0], c) for c in checksums)}")
    except BaseException:
        if master and fresh:
            run_log.close()
            remove_failed_run(out_dir)
        raise
    finally:
        if run_log:
            run_log.close()
        if lock:
            lock.release()
            if created and not os.listdir(out_dir):  # a new run that wrote nothing leaves no folder either
                os.rmdir(out_dir)
    return {"model": raw_model, "iter_num": iter_num, "val_loss": last_losses.get("val"),
            "train_loss": last_losses.get("train"), "flops": flops_done, "tokens_seen": tokens_seen,
            "supervised_seen": supervised_seen, "interrupted": bool(stop), "meta": meta}


def train_reporting_errors(config, ddp):
    """train(config), its expected failures turned into one line and an exit status (SystemExit)."""
    try:
        train(config)
        if ddp:  # leave together: gloo aborts (SIGABRT) a process whose peer tears down while it still talks
            torch.distributed.barrier()
    except (TrainingDiverged, CheckpointWriteFailed) as e:
        print(f"train.py: error: {e}", file=sys.stderr)
        sys.exit(1)
    except RuntimeError as e:  # torch.OutOfMemoryError is one too; the CPU allocator raises a plain RuntimeError
        message = str(e).strip().splitlines()[0] if str(e).strip() else ""
        if not any(words in message for words in ("out of memory", "can't allocate memory", "not enough memory")):
            raise
        print(f"train.py: error: out of memory ({message[:200]}) with n_layer={config['n_layer']}, "
              f"n_embd={config['n_embd']}, batch_size={config['batch_size']}, block_size={config['block_size']}: "
              f"use a smaller model or --batch_size (with --gradient_accumulation_steps to keep the batch)",
              file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        print("train.py: interrupted; nothing saved since the last checkpoint", file=sys.stderr)
        sys.exit(130)


def main():
    config = resolve_config(sys.argv[1:])
    if int(os.environ.get("RANK", -1)) == -1:
        return train_reporting_errors(config, ddp=False)
    # Under torchrun every ending, finished or failed, leaves through os._exit: in the interpreter's C++ teardown
    # gloo's transport threads are sometimes destroyed still running ("terminate called without an active
    # exception", SIGABRT; 1 in ~30 launches on a 2-core machine, even after a barrier and destroy_process_group),
    # which turns exit status 0 (or 1, 2, 130) into 134. By then train() has closed its log and released its lock.
    # Skipped with the teardown: atexit handlers (compile workers stop by themselves when their parent goes).
    from torch.distributed import destroy_process_group, init_process_group
    init_process_group(backend="nccl" if torch.cuda.is_available() and config["device"] != "cpu" else "gloo")
    status = 0
    try:
        run_main(lambda: train_reporting_errors(config, ddp=True))  # run_main: UserError -> one line, exit 2
    except SystemExit as e:
        status = e.code if isinstance(e.code, int) else 1
    except BaseException:  # not one of ours: show it, as Python would, then leave the same way
        traceback.print_exc()
        status = 1
    gc.collect()  # the DDP wrapper holds the process group: free it while the interpreter is whole
    destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


if __name__ == "__main__":
    run_main(main)
