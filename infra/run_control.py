"""
Run control: what a training run must keep track of and agree on beside learning, so that train.py's loop
shows only learning and four calls on the run (as nanoGPT's loop shows its evaluation, checkpoint and log line):

    with RunControl(config, processes, log, start, ...) as run:  # out_dir locked, log opened, Ctrl-C / SIGTERM caught
        while True:
            # every eval_interval iterations and at the end: a non-finite training loss stops every process here,
            # then the master evaluates, unless the run is stopping
            if run.evaluate(iter_num, lambda signals, project: estimate_loss(...)):
                # every process learns the master's decision: log.jsonl, ckpt.pt (best.pt), or a divergence stop
                run.save(iter_num, lambda: checkpoint_state(...))
            if run.should_stop(iter_num):                # max_iters, the FLOPs budget, or a signal on any process
                break
            ...one optimisation step...
            run.log_step(iter_num, loss, flops, tokens, supervised)  # counters, divergence, ETA, the log line

What lives here:
- one stop flag (`run.stopped`; `run.signals` hears the signals): a signal on any process becomes a stop every
  process agrees on (signals arrive unevenly), so that they all reach the same save together;
- the master decides, every process follows: the master evaluates and decides whether to save, diverge or stop,
  and broadcasts; every process joins the save (its RNG state goes into the checkpoint);
- divergence: the losses stay on the device and are read back at log and save time (one sync, not one per step),
  a non-finite loss or weight stops every process without saving;
- the time-left estimate, the first evaluation's projection of the whole run, MFU that says when it cannot be
  trusted;
- the out_dir: its lock, log.jsonl, atomic checkpoints, and a failed new run leaving nothing behind.
"""
import math
import os
import time
from types import SimpleNamespace

import torch

from infra.checkpoint import CheckpointWriteFailed, OutDirLock, RunLog, save_checkpoint
from infra.configurator import Failure, UserError, apply_overrides
from infra.progress import RecentRate, StopSignals, format_duration, remove_quietly
from infra.timing import matmul_flops_per_second, matmul_peak, mfu_text


class TrainingDiverged(Failure):
    """A non-finite loss or weight: stop without saving (exit status 1)."""


def format_mfu(flops_per_second, peak):
    """MFU against the matmul rate measured at start, or a question mark where that measurement failed."""
    return f"mfu {mfu_text(flops_per_second, peak)}"


def peak_doubt(at_start, again):
    """One rule for every log line: the matmul rate measured at start is trusted only if a second measurement, at
    the first log line, agrees within 2x (a machine busy during either reports too low a rate). Returns None, or
    the text every MFU figure of the run is replaced by."""
    if max(at_start, again) > 2 * min(at_start, again):
        return (f"mfu ? (the matmul rate measured {at_start / 1e12:.3f}, then {again / 1e12:.3f} TFLOP/s: a busy "
                f"machine, no MFU figure can be trusted)")
    return None


def project_run(seconds_per_eval_batch, iterations, config, device, cpu_recipe, is_cpu_recipe):
    """Lines that say what the whole run will cost here, from two timed evaluation batches (a training step is
    about 3 forward passes). On a CPU, when that is over half an hour, the advice to run the CPU recipe instead,
    unless this run is the recipe (then: the machine is slower than the recipe assumes)."""
    evals = iterations // config["eval_interval"] + 1
    eval_seconds = 2 * config["eval_iters"] * seconds_per_eval_batch
    train_seconds = 3 * iterations * config["gradient_accumulation_steps"] * seconds_per_eval_batch
    total = evals * eval_seconds + train_seconds
    lines = [f"projected on {device}: each evaluation (train and val) ~{format_duration(eval_seconds)}, the "
             f"{iterations} iterations left ~{format_duration(total)}"]
    if device == "cpu" and total > 30 * 60:
        if is_cpu_recipe:
            lines.append("this is the CPU recipe, and on this machine it is slow (busy, or few cores): it will "
                         "still finish; Ctrl-C saves and stops")
        else:
            lines.append(f"these settings are sized for one GPU; on this CPU try nanoGPT's CPU recipe (minutes): "
                         f"{cpu_recipe} --arch={config['arch']}  (Ctrl-C here saves and stops)")
    return lines


STOPPING = "stopping: saving a checkpoint first"  # what a first Ctrl-C or SIGTERM prints


class RunControl:
    def __init__(self, config, processes, log, start, cpu_recipe, is_cpu_recipe, seconds_between_lines):
        """start: train.prepare's dict of where the run starts and ends (iter_num, end_iter, best_val_loss,
        flops_done, peak_dtype: the precision whose matmul rate MFU is measured against, measured here);
        cpu_recipe: the command the projection advises on a CPU, unless this run is the recipe."""
        self.config, self.processes, self.log = config, processes, log
        self.master, self.out_dir = processes.master, config["out_dir"]
        self.fresh = config["init_from"] != "resume"
        self.first_iter, self.end_iter = start["iter_num"], start["end_iter"]
        self.best_val_loss, self.flops_done = start["best_val_loss"], start["flops_done"]
        self.peak_dtype, self.peak_checked, self.mfu_doubt = start["peak_dtype"], False, None
        self.peak_flops = matmul_peak(processes.device, self.peak_dtype)
        log(f"measured matmul peak {self.peak_flops / 1e12:.3f} TFLOP/s (this machine's rate now, what MFU is "
            "measured against; checked again at the first log line)", flush=True)
        self.tokens_seen = self.supervised_seen = 0
        self.last_losses = {}
        self.seconds_between_lines = seconds_between_lines
        self.cpu_recipe, self.is_cpu_recipe = cpu_recipe, is_cpu_recipe
        self.signals = StopSignals(STOPPING, self.log)
        if config["compile"]:  # the flag is read between steps, and the first one compiles for a minute or two
            self.signals.message = "stopping after the first step, which is still compiling: saving a checkpoint then"
        self.stopped = False  # the one stop flag: every process has heard of it, or the master decided it
        self.cut_short = False  # a stop came during an evaluation
        self.pending_losses = []  # (iteration, loss on the device), read back at log and save time
        self.lock = self.run_log = None
        self.created = False
        self.saved_at = None  # the iteration of the last checkpoint this run wrote
        self.clock, self.timed_iters, self.last_line = time.perf_counter(), 0, time.perf_counter()
        self.flops_at_clock = self.flops_done  # the rate of a FLOPs budget's spending, since the last log line
        self.speed = RecentRate()  # seconds per iteration, the median of the recent log lines' (the time left)
        self.evaluation_started, self.evaluation_seconds = None, 0.0  # the last evaluation's cost (the time left)
        self.losses = None  # the last evaluation's {"train", "val"} (None: a stop cut it short, or not the master)

    # ---- the out_dir, for the run's whole life
    def __enter__(self):
        opened = self.processes.master_only(self.open_out_dir)
        if opened:
            self.lock, self.run_log, self.created = opened
        self.signals.__enter__()
        return self

    def open_out_dir(self):
        """The master's files: create out_dir, lock it against a second run, start (or continue) the log. A new
        run with --overwrite=True starts clean: the old checkpoints go now, not at the first save."""
        created = not os.path.exists(self.out_dir)
        lock = None
        try:
            os.makedirs(self.out_dir, exist_ok=True)
            lock = OutDirLock(self.out_dir)
            lock.acquire()
            if self.fresh:
                for name in ("ckpt.pt", "best.pt", "ckpt.pt.tmp", "best.pt.tmp"):
                    remove_quietly(os.path.join(self.out_dir, name))
            return lock, RunLog(os.path.join(self.out_dir, "log.jsonl"), None if self.fresh else self.first_iter), \
                created
        except OSError as e:  # e.g. a folder where the lock or log.jsonl goes: the file is named, the lock freed
            if lock is not None:
                lock.release()
            raise UserError(f"cannot write {e.filename or self.out_dir} in --out_dir={self.out_dir} ({e.strerror}): "
                            f"remove it or choose another folder") from None

    def __exit__(self, kind, value, traceback):
        self.signals.__exit__(kind, value, traceback)
        if self.run_log:
            self.run_log.close()
        if kind is not None and self.master and self.fresh and \
                not os.path.exists(os.path.join(self.out_dir, "ckpt.pt")):
            remove_quietly(os.path.join(self.out_dir, "log.jsonl"))  # a new run that failed leaves no log behind
        if self.lock:
            self.lock.release()
            if self.created and not os.listdir(self.out_dir):  # nor an empty out_dir
                os.rmdir(self.out_dir)
        return False

    # ---- when to stop (the loop's run.should_stop)
    def should_stop(self, iter_num):
        """Whether the run ends at iter_num: max_iters, the FLOPs budget, or a stop every process agreed on."""
        return self.stopped or iter_num >= self.config["max_iters"] or \
            bool(self.config["max_flops"] and self.flops_done >= self.config["max_flops"])

    def last_good_checkpoint(self, iter_num=None):
        """What the message of a run that diverged at iter_num says to do. At iteration 0 of a new run no step
        was taken: the starting weights are the cause, not the learning rate."""
        if iter_num == 0 and self.fresh:
            if self.config["init_from"] == "scratch":
                return (f"none: no training step was taken, so the initialisation gives it (--init_std="
                        f"{self.config['init_std']:g}; GPT-2's is 0.02)")
            return f"none: no training step was taken, so the weights of --init_from={self.config['init_from']} give it"
        path = os.path.join(self.out_dir, "ckpt.pt")
        if os.path.exists(path):
            return f"{path} (lower --learning_rate and resume from it)"
        return "none written yet (lower --learning_rate and start again)"

    def check_losses(self):
        """Read back the losses kept on the device since the last check, stop every process at the first
        non-finite one, and write them to the log."""
        pending = self.pending_losses
        values = torch.stack([loss for _, loss in pending]).tolist() if pending else []
        bad = [it for (it, _), value in zip(pending, values) if not math.isfinite(value)]
        first_bad = self.processes.minimum(float(bad[0]) if bad else math.inf)  # one diverged: all stop
        if math.isfinite(first_bad):
            raise TrainingDiverged(f"the loss became non-finite at iteration {int(first_bad)}; stopped without "
                                   f"saving. Last good checkpoint: {self.last_good_checkpoint(int(first_bad))}")
        if self.run_log:
            for (it, _), value in zip(pending, values):
                self.run_log.write({"iter": it, "loss": value})
        pending.clear()

    # ---- evaluate and save (the loop's run.evaluate and run.save): the master evaluates and decides, every process
    # follows
    def evaluate(self, iter_num, estimate):
        """Every eval_interval iterations and when the run is to stop, on every process: read back the training
        losses (a non-finite one has stopped them all here, before an evaluation is spent on it); then the master,
        unless the run is already stopping, runs estimate(signals, project) (train.estimate_loss: None when a stop
        cut it short; `project`, given at the run's first evaluation only, hears its timing) and prints its line.
        Returns whether an evaluation was due: then every process calls save."""
        if iter_num % self.config["eval_interval"] and not self.should_stop(iter_num):
            return False
        self.check_losses()
        self.losses = None
        self.evaluation_started = time.perf_counter()
        if self.master and not self.stopped:
            self.losses = estimate(self.signals, self.project if iter_num == self.first_iter else None)
            losses = self.losses
            if losses is not None and all(math.isfinite(v) for v in losses.values()):
                self.log(f"step {iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}"
                         + loss_in_bits(self.config["objective"], losses["val"]), flush=True)
        return True

    def save(self, iter_num, state):
        """After an evaluation, on every process: decide (the master) and agree whether to save and whether to stop,
        write the checkpoints (state() builds them: every process gathers its RNG state into it), and restart the
        clock. A non-finite loss raises TrainingDiverged here, on every process, before anything is saved."""
        save, best = self.decide(iter_num, self.losses)
        if save:
            self.write_checkpoints(state(), best)
        self.evaluation_done(iter_num, save)

    def decide(self, iter_num, losses):
        """After the master's evaluation (losses: {"train", "val"}; None when a signal cut it short, or on the
        other processes): every process learns whether to save and whether to stop; a non-finite loss stops
        them all without saving (the training losses were checked by check_losses, just before). Returns (save,
        best): write ckpt.pt, and best.pt too."""
        stopping, diverged, best = self.stopped, None, False
        save = stopping and not self.config["eval_only"]
        if self.master and not stopping:
            if losses is None:  # a signal during evaluation: save what the last step left, and stop
                save, stopping, self.cut_short = not self.config["eval_only"], True, True
            elif not all(math.isfinite(v) for v in losses.values()):
                diverged = (f"the validation loss is {losses['val']} at iteration {iter_num}; stopped without "
                            f"saving. Last good checkpoint: {self.last_good_checkpoint(iter_num)}")
            else:
                self.run_log.write({"iter": iter_num, "train_loss": losses["train"], "val_loss": losses["val"],
                                   "flops": self.flops_done})  # training FLOPs so far: experiments/curves.py
                self.last_losses = losses
                improved, best = losses["val"] < self.best_val_loss, losses["val"] <= self.best_val_loss
                self.best_val_loss = min(self.best_val_loss, losses["val"])
                save = iter_num > 0 and not self.config["eval_only"] and \
                    (improved or self.config["always_save_checkpoint"] or self.should_stop(iter_num))
        save, diverged, stopping = self.processes.from_master([save, diverged, stopping])
        if diverged:
            raise TrainingDiverged(diverged)
        self.stopped = stopping
        return save, best

    def write_checkpoints(self, state, best):
        """The master writes ckpt.pt always, best.pt when the validation loss improved; never weights that are
        not finite. Every process calls it (each gathered its RNG state into `state`)."""
        if not self.master:
            return
        if not all(torch.isfinite(p).all() for p in state["model"].values() if p.is_floating_point()):
            raise TrainingDiverged(f"the weights became non-finite before iteration {state['iter_num']}; stopped "
                                   f"without saving. Last good checkpoint: {self.last_good_checkpoint()}")
        save_checkpoint(state, os.path.join(self.out_dir, "ckpt.pt"))
        self.saved_at = state["iter_num"]
        if best:
            try:
                save_checkpoint(state, os.path.join(self.out_dir, "best.pt"))
            except CheckpointWriteFailed as e:  # the ckpt.pt just written is this iteration's, and kept
                raise CheckpointWriteFailed(f"{e}; ckpt.pt of iteration {state['iter_num']} was written (resume "
                                            f"from it once there is space)") from None
        self.run_log.sync()  # the log is on disk up to the checkpoint

    def evaluation_done(self, iter_num, saved):
        """A stop says what was saved and how to go on; the clock restarts (evaluating and saving are not training
        time)."""
        if self.stopped:
            where = f"saved {os.path.join(self.out_dir, 'ckpt.pt')} at iteration {iter_num}" if saved else \
                "nothing saved"
            again = "the same command" if not self.fresh else "the same command plus --init_from=resume"
            self.log(f"interrupted: {where}; resume with {again}"
                     + (" (it repeats the evaluation that was cut short)" if saved and self.cut_short else ""))
        self.clock, self.timed_iters = time.perf_counter(), 0
        self.flops_at_clock = self.flops_done
        if self.evaluation_started is not None:
            self.evaluation_seconds = self.clock - self.evaluation_started

    def say_how_it_ended(self, iter_num):
        """The last line of a run that was not stopped: where its checkpoint is, and what to run next."""
        if self.stopped:
            return
        if self.saved_at is None:
            why = "--eval_only" if self.config["eval_only"] else f"--max_iters={self.config['max_iters']}"
            self.log(f"finished at iteration {iter_num} without training a step ({why}): nothing saved")
            return
        path = os.path.join(self.out_dir, "ckpt.pt")
        self.log(f"finished at iteration {iter_num}: {path}. Next: python sample.py --out_dir={self.out_dir}, or "
                 f"train longer with the same command plus --init_from=resume --max_iters=<more than {iter_num}>")

    def doubt_mfu(self, why):
        """From now on every log line says "mfu ?"; why (None: no doubt) is said once, on a line of its own."""
        if why is None:
            return
        self.mfu_doubt = "mfu ?"
        if self.master and not self.config["quiet"]:
            self.log(f"no MFU figure: {why.removeprefix('mfu ? ').strip('()')}; every line below says mfu ?")

    def time_left(self, iter_num, flops_per_iteration):
        """Seconds left: the iterations left (to max_iters, or to the FLOPs budget if that ends the run first: a
        step's FLOPs vary with the objective's draws) at the median recent speed, plus the evaluations left at
        what the last one cost."""
        iterations = self.config["max_iters"] - iter_num - 1
        if self.config["max_flops"] and flops_per_iteration > 0:
            iterations = min(iterations, (self.config["max_flops"] - self.flops_done) / flops_per_iteration)
        iterations = max(0.0, iterations)
        interval = self.config["eval_interval"]
        evaluations = int((iter_num + iterations) // interval - iter_num // interval) + 1  # and the final one
        return iterations * self.speed.rate() + evaluations * self.evaluation_seconds

    def project(self, seconds_per_eval_batch):
        for line in project_run(seconds_per_eval_batch, self.end_iter - self.first_iter, self.config,
                                self.processes.device, self.cpu_recipe, self.is_cpu_recipe):
            self.log(line, flush=True)

    # ---- after each optimisation step (the loop's run.log_step)
    def log_step(self, iter_num, loss, flops, tokens, supervised):
        """Count and agree after one optimisation step (step_done); every log_interval iterations, or every
        seconds_between_lines of a slow run, print the log line: the loss in the objective's own units, ms/iter,
        tokens/s, supervised tokens/s (claim C1: the loss reads only the positions the objective supervises), MFU,
        it/s and the time left."""
        line = self.step_done(iter_num, loss, flops, tokens, supervised)
        if line:
            self.log(f"iter {iter_num}: loss {line.loss:.4f}, {line.dt * 1000:.1f} ms/iter, "
                     f"{line.tokens / line.dt:,.0f} tok/s, {line.supervised / line.dt:,.0f} supervised tok/s, "
                     f"{line.mfu}, {1 / line.dt:.2f} it/s, ~{format_duration(line.left)} left", flush=True)

    def step_done(self, iter_num, loss, flops, tokens, supervised):
        """Count (claim C1: tokens the model computed, and the ones the loss read) and agree on the totals and on
        stopping. Every log_interval iterations (or SECONDS_BETWEEN_LINES seconds) returns what the log line says:
        a namespace of loss, dt (s/iter), tokens, supervised (per iteration), mfu (text) and left (s); else None."""
        self.pending_losses.append((iter_num, loss))
        self.signals.message = STOPPING
        line_due = time.perf_counter() - self.last_line > self.seconds_between_lines
        flops, tokens, supervised, asked, line_due = self.processes.sum(
            [float(flops), float(tokens), float(supervised), float(bool(self.signals)), float(line_due)])
        self.flops_done += flops
        self.tokens_seen += int(tokens)
        self.supervised_seen += int(supervised)
        self.timed_iters += 1
        self.stopped = bool(asked)
        if self.stopped:  # perhaps only another process was asked: stop together
            self.signals.requested = True
        if not (iter_num % self.config["log_interval"] == 0 or line_due or self.stopped):
            return None
        loss_value = self.pending_losses[-1][1].item()  # one sync per log line
        self.check_losses()
        now = time.perf_counter()
        dt = (now - self.clock) / self.timed_iters  # mean over the iterations since the last log line
        # (the line's dt and MFU are this interval's; the time left reads RecentRate's median over recent
        # intervals, so one slow interval moves the line's speed, not the projection)
        self.speed.add(now - self.clock, self.timed_iters)
        left = self.time_left(iter_num, (self.flops_done - self.flops_at_clock) / self.timed_iters)
        changed = self.speed.changed()
        if changed and self.master and not self.config["quiet"]:
            self.log(f"this machine's speed changed: {changed[1] * 1000:.1f} ms/iter over the recent lines, "
                     f"{changed[0] * 1000:.1f} before (other work on it?); the time left follows the new speed")
        budget = self.config["max_flops"]
        self.clock, self.timed_iters, self.last_line, self.flops_at_clock = now, 0, now, self.flops_done
        if self.config["quiet"] and self.master and line_due:  # a quiet run (an experiment's) still talks
            where = f" ({100 * min(1.0, self.flops_done / budget):.0f}% of its FLOPs budget)" if budget else \
                f"/{self.end_iter}"
            print(f"  iteration {iter_num + 1}{where}: loss {loss_value:.4f}, ~{format_duration(left)} left in "
                  f"this run", flush=True)
        if not self.peak_checked:  # the peak measured at start, checked once against a second measurement
            self.peak_checked = True
            self.doubt_mfu(peak_doubt(self.peak_flops, matmul_flops_per_second(
                self.processes.device, self.peak_dtype, seconds=0.2)))
            self.clock = self.last_line = time.perf_counter()  # (not training time)
        mfu = format_mfu(flops / self.processes.world_size / dt, self.peak_flops)
        if self.mfu_doubt is None and mfu.startswith("mfu ?"):  # above 100%: no later line trusts the peak either
            self.doubt_mfu(mfu)
        return SimpleNamespace(loss=loss_value, dt=dt, tokens=tokens, supervised=supervised, left=left,
                               mfu=self.mfu_doubt or mfu)


def is_cpu_recipe(config, defaults, recipe):
    """Does this run train what the CPU recipe (a config file) trains: its model, batch and length? Then the
    projection never advises it."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    recipe = apply_overrides(defaults, [os.path.join(root, recipe)])
    keys = ("n_layer", "n_head", "n_embd", "block_size", "batch_size", "max_iters", "eval_iters")
    return all(config[k] == recipe[k] for k in keys)


def out_of_memory_line(error, config):
    """The one line for a RuntimeError that is an out-of-memory failure (the CPU allocator's and CUDA's), or None."""
    message = str(error).strip().splitlines()[0] if str(error).strip() else ""
    if not any(words in message for words in ("out of memory", "can't allocate memory", "not enough memory")):
        return None
    return (f"out of memory ({message[:200]}) with n_layer={config['n_layer']}, n_embd={config['n_embd']}, "
            f"batch_size={config['batch_size']}, block_size={config['block_size']}: use a smaller model or "
            f"--batch_size (with --gradient_accumulation_steps to keep the batch)")


def loss_in_bits(objective, loss):
    """The two losses that are (bounds on) a log-likelihood, in bits per token (claim C4)."""
    if objective == "clm":
        return f" = {loss / math.log(2):.4f} bits/token (exact NLL)"
    if objective == "diffusion":
        return f" = {loss / math.log(2):.4f} bits/token (ELBO: an upper bound on the NLL)"
    return ""
