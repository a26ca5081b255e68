"""
Train any of the four architectures with one command and one training loop:

    python train.py --arch=bert                                     # defaults sized for one GPU
    python train.py config/train_shakespeare_char_cpu.py --arch=t5  # nanoGPT's CPU recipe: minutes
    python train.py --arch=gpt --init_from=resume                   # exact resume where it stopped
    torchrun --standalone --nproc_per_node=2 train.py --gradient_accumulation_steps=2
        # data parallel (gloo on CPU, NCCL on CUDA): the accumulation steps of one update are split
        # between the processes
    python -m infra.parallel --standalone --nproc_per_node=2 train.py ...
        # the same, a failure one line (no torchrun traceback) and its status

Defaults are at the top; a config/*.py file and --key=value override them. The loop is the same for
every arch: windows of text -> the objective makes a Batch (`batch_for`; a gpt being opened into a
diffusion model gets its step's attention mask with it, infra/adaptation.py's `training_batch`) ->
`model(**batch.model_inputs())` -> loss. Each log line reports the loss in the objective's own
units, ms/iter, tokens/s, *supervised* tokens/s (claim C1: the loss is only on the positions the
objective supervises) and MFU against the matmul rate this machine measured at start. What a run
must agree on and keep track of beside learning (stops, the master's decisions, divergence, the time
left, the out_dir) is infra/run_control.py, which the loop asks four things: `run.evaluate`,
`run.save`, `run.should_stop`, `run.log_step`; checkpoints and exact resume are
infra/checkpoint.py.
"""
import math
import os
import random
import sys
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass

# before torch: a Ctrl-C while it loads ends quietly
import infra.quiet_interrupts  # noqa: E402,F401

import numpy as np
import torch

import objectives
from objectives import batch_for
from infra.adaptation import adapted_model, training_batch
from infra.checkpoint import (CheckpointWriteFailed, check_resume, load_checkpoint,
                              model_from_checkpoint, restore_training_state, rng_state)
from infra.configurator import UserError, apply_overrides, run_main
from infra.hardware import compile_option, run_choices
from infra.dataset import get_windows, load_dataset
from infra.parallel import Processes, peer_lost_line, run_under_torchrun, under_torchrun
from infra.progress import Progress
from infra.run_control import RunControl, TrainingDiverged, is_cpu_recipe, out_of_memory_line
from infra.train_config import check_objective_fits_dataset, check_training_config, model_config
from model import Transformer, describe

# ----------------------------------------------------------------------------- defaults (one GPU)
DEFAULTS = dict(
    arch="gpt",                 # gpt | bert | prefixlm | t5
    objective="",               # "" = the arch's natural one (clm, mlm, prefix_lm, span_corruption)
    dataset="shakespeare_char",  # a folder of data/ holding train.bin, val.bin, meta.pkl
    out_dir="out-{arch}",       # {arch} and {objective} are filled in
    init_from="scratch",        # scratch | resume (from out_dir/ckpt.pt) | gpt2, gpt2-medium, ...
                                # (infra/pretrained.py) | another run's out_dir: its gpt made into
                                # this arch (infra/adaptation.py)
    preset="",                  # a model *shape* from model.PRESETS (gpt2, bert-base, t5-small,
                                # cpu-*): it sets the layers/heads/dims/block (winning over those
                                # keys); --arch still picks the architecture
    # model: layers (t5: of its encoder; n_decoder_layer 0 = as many), heads, width,
    # context length in tokens
    n_layer=6, n_decoder_layer=0, n_head=6, n_embd=384, block_size=256, dropout=0.2, bias=False,
    position="learned",         # learned | rope | none (NoPE, claim D5)
    shift_logits=False,         # position i - 1's output scores token i
                                # (diffusion adapted from gpt, DiffuGPT)
    init_std=0.02,              # the std of every weight at initialisation (GPT-2's; residual
                                # outputs / sqrt(depth))
    # objective settings (the others keep the published values: objectives.py)
    mlm_mask_fraction=0.8, mlm_random_fraction=0.1,  # BERT's 80/10/10
                                                     # (claim C2's ablation sets 1.0, 0.0)
    ul2_mixture=(0.5, 0.25, 0.25),                   # UL2's S / R / X weights (claim F2)
    anneal_steps=0,             # gpt -> diffusion: the causal mask opens to full over this
                                # many steps (claim G1)
    # optimisation
    batch_size=64, gradient_accumulation_steps=1, max_iters=5000,
    max_flops=0.0,              # > 0: stop at this budget
    learning_rate=1e-3, min_lr=1e-4, warmup_iters=100, lr_decay_iters=5000, decay_lr=True,
    weight_decay=0.1, beta1=0.9, beta2=0.99, grad_clip=1.0,
    # evaluation, logging, checkpoints
    eval_interval=250, eval_iters=200, log_interval=10, eval_only=False,
    always_save_checkpoint=True,
    overwrite=False,            # a new run into an out_dir that holds a checkpoint:
                                # refused unless True
    # system
    device="auto",              # auto | cpu | cuda | cuda:N | mps
    dtype="auto",               # auto (what the device computes natively: infra/hardware.py) |
                                # float32 | bfloat16 | float16 (CUDA only)
    compile="auto",             # auto (on CUDA, not on a CPU) | True | False
    seed=1337,
    quiet=False,                # True (the experiments): no log lines, only "iteration N/M,
                                # ~T left" every 10 s
)
SECONDS_BETWEEN_LINES = 10.0   # a slow run still prints a line this often
                               # (between log_interval lines)
CPU_RECIPE = "config/train_shakespeare_char_cpu.py"


def resolve_config(argv):
    config = apply_overrides(DEFAULTS, argv)
    config["compile"] = compile_option(config["compile"])  # "auto", True or False
    check_training_config(config)
    return config


# -------------------------------------------------------------------- schedule, batches, evaluation

def learning_rate_at(it, config):
    """Linear warmup, then cosine decay to min_lr at lr_decay_iters (nanoGPT)."""
    if not config["decay_lr"]:
        return config["learning_rate"]
    if it < config["warmup_iters"]:
        return config["learning_rate"] * (it + 1) / (config["warmup_iters"] + 1)
    if it > config["lr_decay_iters"]:
        return config["min_lr"]
    decay_steps = max(1, config["lr_decay_iters"] - config["warmup_iters"])
    ratio = (it - config["warmup_iters"]) / decay_steps
    coefficient = 0.5 * (1.0 + math.cos(math.pi * ratio))  # from 1 down to 0
    return config["min_lr"] + coefficient * (config["learning_rate"] - config["min_lr"])


@torch.no_grad()
def estimate_loss(model, config, splits, specials, device, autocast, stop, log,
                  on_first_batches=None):
    """Mean loss over eval_iters batches per split, on the same windows and noise every time (fixed
    seeds), so evaluations are comparable across iterations and architectures. Returns None when a
    stop was asked for: an evaluation is only worth something whole, and it has nothing to lose, so
    a signal ends it at once (within the operation under way, not the batch).
    `on_first_batches(seconds_per_batch)` is called once, after two timed batches (the run's
    duration is projected from it)."""
    model.eval()
    result = {}
    progress = Progress(f"evaluation ({' then '.join(splits)}), batches",
                        len(splits) * config["eval_iters"], SECONDS_BETWEEN_LINES, log)
    try:
        stop.immediate = True  # (infra/progress.StopSignals: the first signal raises
                               # KeyboardInterrupt here)
        for number, (split, path) in enumerate(splits.items()):
            data_rng = np.random.default_rng(config["seed"] + 10_000)
            generator = torch.Generator().manual_seed(config["seed"] + 20_000)
            losses = torch.zeros(config["eval_iters"])
            for k in range(config["eval_iters"]):
                if stop:  # asked before this evaluation began
                    return None
                if k == 1:
                    t0 = time.perf_counter()
                windows = get_windows(path, config["batch_size"], config["block_size"], data_rng)
                batch = batch_for(config, windows, specials, generator).to(device)
                with autocast:
                    _, loss = model(**batch.model_inputs())
                losses[k] = loss.item()  # also a device sync: the clock below reads finished work
                if k == 2 and on_first_batches is not None:
                    # batch 0 warmed up; 1 and 2 are timed
                    on_first_batches((time.perf_counter() - t0) / 2)
                    on_first_batches = None
                progress.update(number * config["eval_iters"] + k + 1)
            result[split] = losses.mean().item()
        return result
    except KeyboardInterrupt:
        log(f"{stop.message}: the evaluation under way is cut short (again to quit at once)",
            flush=True)
        return None
    finally:
        stop.immediate = False
        model.train()


def precision(dtype, device):
    """The autocast context of a precision (infra/hardware.py resolves --dtype=auto). Low
    precision is real or refused: bf16 autocast on CUDA and on the CPU, fp16 (with a loss
    scaler) on CUDA only."""
    device_type = device.split(":")[0]
    if dtype == "float32":
        return nullcontext()
    if device_type == "cuda" or (device_type == "cpu" and dtype == "bfloat16"):
        return torch.autocast(device_type=device_type, dtype=getattr(torch, dtype))
    raise UserError(f"--dtype={dtype} is not supported on {device_type}: use float32"
                    + (" or bfloat16 (CPU autocast; slow on CPUs without bf16 units)"
                       if device_type == "cpu" else ""))


def planned_iterations(config, raw_model, splits, specials, iter_num):
    """Iterations left to the end: max_iters, or fewer when the --max_flops budget ends the run
    first (estimated from one batch made with private random generators, so the run's own draws are
    untouched)."""
    left = config["max_iters"] - iter_num
    if config["max_flops"]:
        windows = get_windows(splits["train"], config["batch_size"], config["block_size"],
                              np.random.default_rng(0))
        batch = batch_for(config, windows, specials, torch.Generator().manual_seed(0))
        per_step = raw_model.training_flops(batch) * config["gradient_accumulation_steps"]
        left = min(left, math.ceil(config["max_flops"] / per_step) - iter_num)
    return max(0, left)


def build_model(config, checkpoint, meta):
    """The model to train: the checkpoint's (its shape and weights), published weights,
    or a fresh one."""
    if checkpoint is not None:
        # the saved shape (for fine-tuned published weights no flag describes it); only dropout
        # comes from this run
        checkpoint["model_config"]["dropout"] = config["dropout"]
        return model_from_checkpoint(checkpoint, os.path.join(config["out_dir"], "ckpt.pt"))
    gpt = os.path.join(config["init_from"], "ckpt.pt")
    if os.path.exists(gpt):  # a trained gpt, its weights in this arch's modules (claim G1)
        source = load_checkpoint(gpt)
        return adapted_model(config, meta, source, model_from_checkpoint(source, gpt))
    if config["init_from"] != "scratch":
        # published GPT-2, BERT or T5 weights, fine-tuned (infra/pretrained.py)
        from infra.pretrained import load_for_training
        return load_for_training(config, meta)
    return Transformer(model_config(config, meta["vocab_size"]))


def load_data(config, processes):
    """The dataset (the master prepares it on first use, the others wait), its special tokens, and
    the resume checkpoint (read before anything is prepared or written)."""
    checkpoint_path = os.path.join(config["out_dir"], "ckpt.pt")
    checkpoint = None
    if config["init_from"] == "resume":
        checkpoint = load_checkpoint(checkpoint_path)
    elif os.path.exists(checkpoint_path) and not config["overwrite"]:
        raise UserError(f"{config['out_dir']} already holds a checkpoint: --init_from=resume to "
                        "continue it, --overwrite=True to start over, or another --out_dir")
    splits, meta = processes.master_first(lambda: load_dataset(
        config["dataset"], config["block_size"], prepare_if_missing=processes.master))
    specials = objectives.Specials.from_meta(meta)
    check_objective_fits_dataset(config, specials, meta)
    if checkpoint is not None:
        check_resume(config, checkpoint, meta)
    return checkpoint, splits, meta, specials


# ----------------------------------------------------------------------------- the run

@dataclass
class Setup:
    """What the loop uses, built once by prepare()."""
    processes: Processes  # one process, or one of several under torchrun (infra/parallel.py)
    device: str
    log: object  # print on the master (unless --quiet=True), else a function that prints nothing
    micro_steps: int  # this process's share of --gradient_accumulation_steps
    splits: dict  # "train" and "val": the dataset's token ids
    meta: dict  # the dataset's vocabulary and special tokens (saved with every checkpoint)
    specials: objectives.Specials  # the special tokens' ids, as the objectives use them
    autocast: object  # the precision's context (does nothing in float32)
    raw_model: Transformer  # the model itself: evaluated, counted, saved
    model: torch.nn.Module  # what trains: raw_model, compiled and wrapped for DDP where asked
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler  # float16's loss scaling (does nothing in other precisions)
    data_rng: np.random.Generator  # which windows each step reads
    objective_rng: torch.Generator  # the objective's draws: masks, spans, diffusion's t


def prepare(config):
    """Everything the loop needs, built once: the processes, the data, the model (fresh, published
    or resumed), the optimizer and every random-number generator, restored exactly when resuming.
    Returns (setup, start): setup the things the loop uses; start where the run starts and ends,
    for RunControl (the counters a resumed run continues, the precision MFU is measured in)."""
    processes = Processes(config)  # one process, or one of several under torchrun
    device = processes.device
    dtype, config["compile"], choices = run_choices(config, device)  # --dtype, --compile: auto
    log = print if processes.master and not config["quiet"] else (lambda *a, **k: None)
    micro_steps = processes.micro_steps(config["gradient_accumulation_steps"])
    checkpoint, splits, meta, specials = load_data(config, processes)
    autocast = precision(dtype, device)
    torch.manual_seed(config["seed"])  # the same initial weights on every process
    raw_model = build_model(config, checkpoint, meta).to(device)
    # windows, objective noise and dropout differ between processes
    torch.manual_seed(config["seed"] + 100 * processes.rank)
    random.seed(config["seed"] + processes.rank)
    data_rng = np.random.default_rng(config["seed"] + processes.rank)
    objective_rng = torch.Generator().manual_seed(config["seed"] + 1 + processes.rank)
    optimizer = raw_model.configure_optimizer(config["weight_decay"], config["learning_rate"],
                                              (config["beta1"], config["beta2"]),
                                              device.split(":")[0])
    iter_num, best_val_loss, flops_done = 0, float("inf"), 0.0
    if checkpoint is not None:  # exact resume: optimizer moments, counters and every RNG state
        path = os.path.join(config["out_dir"], "ckpt.pt")
        iter_num, best_val_loss, flops_done = restore_training_state(
            checkpoint, path, optimizer, processes, data_rng, objective_rng)
        log(f"resuming {path} from iteration {iter_num}")
    model = torch.compile(raw_model) if config["compile"] else raw_model
    model = processes.wrap(model)  # DDP averages gradients across processes during backward
    log(f"{describe(raw_model)}; objective {config['objective']}; device {device} ({dtype})")
    log(choices, flush=True)  # what auto chose, and why
    scaler = torch.amp.GradScaler(enabled=(dtype == "float16"))  # fp16's narrow range needs it
    setup = Setup(processes, device, log, micro_steps, splits, meta, specials, autocast, raw_model,
                  model, optimizer, scaler, data_rng, objective_rng)
    end_iter = iter_num + planned_iterations(config, raw_model, splits, specials, iter_num)
    start = dict(iter_num=iter_num, end_iter=end_iter, best_val_loss=best_val_loss,
                 flops_done=flops_done,
                 peak_dtype=getattr(torch, dtype))  # MFU: the peak of the precision it runs in
    return setup, start


def checkpoint_state(config, setup, run, iter_num):
    """Everything needed to rebuild the model and continue exactly
    (every process's RNG states included)."""
    return {"model": setup.raw_model.state_dict(), "optimizer": setup.optimizer.state_dict(),
            "config": config, "model_config": asdict(setup.raw_model.config), "meta": setup.meta,
            "iter_num": iter_num, "best_val_loss": run.best_val_loss, "flops_done": run.flops_done,
            "rng": setup.processes.gather(rng_state(setup.data_rng, setup.objective_rng))}


def loop(config, setup, run):
    """The training loop: learning rate, evaluate and save, micro-steps, clip, step, log. Returns
    the iteration it ended at. `run` (infra/run_control.py) keeps the counters and makes
    every process agree: the loop asks it four things, to evaluate, to save, whether to stop and
    to log a step."""
    model, optimizer, scaler = setup.model, setup.optimizer, setup.scaler
    iter_num, micro_steps = run.first_iter, setup.micro_steps
    while True:
        # ---- learning rate
        lr = learning_rate_at(iter_num, config)
        for group in optimizer.param_groups:
            group["lr"] = lr
        # ---- evaluate and save, every eval_interval iterations and at the end: the master
        # evaluates (a training loss gone non-finite since the last check stops every process
        # first), every process follows its decision
        if run.evaluate(iter_num, lambda signals, project: estimate_loss(
                setup.raw_model, config, setup.splits, setup.specials, setup.device,
                setup.autocast, signals, setup.log, project)):
            # log.jsonl; ckpt.pt, and best.pt when the validation loss improved; a non-finite loss
            # stops every process here, without saving
            run.save(iter_num, lambda: checkpoint_state(config, setup, run, iter_num))
        if run.should_stop(iter_num) or config["eval_only"]:
            return iter_num
        # ---- one optimisation step: micro-steps (gradient accumulation), clip, step
        step_tokens = step_supervised = step_flops = 0
        for micro_step in range(micro_steps):
            windows = get_windows(setup.splits["train"], config["batch_size"], config["block_size"],
                                  setup.data_rng)
            # the objective's batch (objectives.batch_for), with whatever attention mask it
            # carries (a gpt being opened into a diffusion model: infra/adaptation.py)
            batch = training_batch(config, windows, setup.specials, setup.objective_rng, iter_num)
            step_tokens += batch.processed_positions()
            # claim C1: what the loss actually reads
            step_supervised += batch.supervised_positions()
            step_flops += setup.raw_model.training_flops(batch)
            if setup.processes.ddp:
                # average gradients once per step, on the last micro-step, not on every one
                model.require_backward_grad_sync = micro_step == micro_steps - 1
            with setup.autocast:
                _, loss = model(**batch.to(setup.device).model_inputs())
                loss = loss / micro_steps  # the accumulated gradient is the mean over micro-steps
            scaler.scale(loss).backward()
        if config["grad_clip"] > 0:
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), config["grad_clip"])
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)  # frees the gradients' memory until the next backward
        # ---- count and log: the processes agree on the totals and on stopping; every
        # log_interval iterations (or SECONDS_BETWEEN_LINES of a slow run) the log line
        run.log_step(iter_num, loss.detach() * micro_steps, step_flops, step_tokens,
                     step_supervised)
        iter_num += 1


def train(config):
    """Train with a resolved config (dict). Returns a summary dict; raises
    UserError on bad input."""
    setup, start = prepare(config)
    with RunControl(config, setup.processes, setup.log, start, f"python train.py {CPU_RECIPE}",
                    is_cpu_recipe(config, DEFAULTS, CPU_RECIPE), SECONDS_BETWEEN_LINES) as run:
        iter_num = loop(config, setup, run)
        run.check_losses()
        if setup.processes.ddp:
            # the proof that gradients were averaged: every process holds the same weights
            setup.log(f"parameters identical on all {setup.processes.world_size} processes: "
                      f"{setup.processes.identical(setup.raw_model)}")
    run.say_how_it_ended(iter_num)
    # out_dir: its log.jsonl holds every evaluation
    return {"model": setup.raw_model, "iter_num": iter_num, "val_loss": run.last_losses.get("val"),
            "train_loss": run.last_losses.get("train"), "flops": run.flops_done,
            "tokens_seen": run.tokens_seen, "supervised_seen": run.supervised_seen,
            "interrupted": run.stopped, "meta": setup.meta, "out_dir": config["out_dir"]}


def train_reporting_errors(config, ddp):
    """train(config), its expected failures turned into one line and an exit status (SystemExit)."""
    try:
        summary = train(config)
        if ddp:
            # leave together: gloo aborts (SIGABRT) a process whose peer tears down
            # while it still talks
            torch.distributed.barrier()
        if summary["interrupted"]:
            # a stop: saved, and said how to resume; every command's stop status
            sys.exit(130)
    except (TrainingDiverged, CheckpointWriteFailed) as e:
        print(f"train.py: error: {e}", file=sys.stderr)
        sys.exit(1)
    except RuntimeError as e:
        # torch.OutOfMemoryError is one too; the CPU allocator raises a plain RuntimeError, and
        # under DDP a lost peer raises one (peer_lost_line)
        line = out_of_memory_line(e, config) or (ddp and peer_lost_line(e))
        if not line:
            raise
        print(f"train.py: error: {line}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        print("train.py: interrupted; nothing saved since the last checkpoint", file=sys.stderr)
        sys.exit(130)


def main():
    config = resolve_config(sys.argv[1:])
    if not under_torchrun():  # (a stray RANK or half a torchrun environment: one line, not a hang)
        return train_reporting_errors(config, ddp=False)
    run_under_torchrun(config, lambda: run_main(lambda: train_reporting_errors(config, ddp=True)))


if __name__ == "__main__":
    run_main(main)
