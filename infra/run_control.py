"""
Run control: everything a training run must keep track of and agree on that is not learning itself, so that
train.py's loop reads as nanoGPT's (learning rate, evaluate and save, micro-steps, clip, step, log).

    with RunControl(config, processes, ...) as run:     # out_dir locked, log opened, Ctrl-C / SIGTERM caught
        while True:
            if iter_num % eval_interval == 0 or run.finished(iter_num):
                run.evaluate_and_save(iter_num, evaluate, checkpoint_state)
            if run.finished(iter_num):
                break
            ...one optimisation step...
            run.step_done(iter_num, loss, flops, tokens, supervised)   # counters, divergence, the log line, ETA

What lives here:
- one stop flag (`run.stop`): a signal on any process becomes a stop every process agrees on (signals arrive
  unevenly), so that they all reach the same save together;
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

import torch

from infra.checkpoint import OutDirLock, RunLog, remove_quietly, save_checkpoint
from infra.configurator import UserError
from infra.progress import StopSignals, format_duration
from infra.timing import mfu_text


class TrainingDiverged(Exception):
    """A non-finite loss or weight: stop without saving (exit status 1)."""


def format_mfu(flops_per_second, peak):
    """MFU against the matmul rate measured at start, or a question mark where that measurement failed."""
    return f"mfu {mfu_text(flops_per_second, peak)}"


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


class RunControl:
    def __init__(self, config, processes, log, iter_num, end_iter, best_val_loss, flops_done, peak_flops,
                 seconds_between_lines, cpu_recipe, is_cpu_recipe):
        self.config, self.processes, self.log = config, processes, log
        self.master, self.out_dir = processes.master, config["out_dir"]
        self.fresh = config["init_from"] != "resume"
        self.first_iter, self.end_iter = iter_num, end_iter
        self.best_val_loss, self.flops_done, self.peak_flops = best_val_loss, flops_done, peak_flops
        self.tokens_seen = self.supervised_seen = 0
        self.last_losses = {}
        self.seconds_between_lines = seconds_between_lines
        self.cpu_recipe, self.is_cpu_recipe = cpu_recipe, is_cpu_recipe
        self.signals = StopSignals("stopping: saving a checkpoint first", log)
        self.stop = False  # the one stop flag: every process has heard of it, or the master decided it
        self.pending_losses = []  # (iteration, loss on the device), read back at log and save time
        self.lock = self.run_log = None
        self.created = False
        self.saved_at = None  # the iteration of the last checkpoint this run wrote
        self.clock, self.timed_iters, self.last_line = time.perf_counter(), 0, time.perf_counter()
        self.flops_at_clock = flops_done  # the rate of a FLOPs budget's spending, since the last log line

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
        try:
            os.makedirs(self.out_dir, exist_ok=True)
            lock = OutDirLock(self.out_dir)
            lock.acquire()
        except OSError as e:
            raise UserError(f"cannot write to --out_dir={self.out_dir} ({e.strerror}): choose another folder") from None
        if self.fresh:
            for name in ("ckpt.pt", "best.pt", "ckpt.pt.tmp", "best.pt.tmp"):
                remove_quietly(os.path.join(self.out_dir, name))
        return lock, RunLog(os.path.join(self.out_dir, "log.jsonl"), None if self.fresh else self.first_iter), created

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

    # ---- when to stop
    def finished(self, iter_num):
        return self.stop or iter_num >= self.config["max_iters"] or \
            bool(self.config["max_flops"] and self.flops_done >= self.config["max_flops"])

    def last_good_checkpoint(self):
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
                                   f"saving. Last good checkpoint: {self.last_good_checkpoint()}")
        if self.run_log:
            for (it, _), value in zip(pending, values):
                self.run_log.write({"iter": it, "loss": value})
        pending.clear()

    # ---- evaluate and save
    def evaluate_and_save(self, iter_num, evaluate, checkpoint_state):
        """The master evaluates (`evaluate(on_first_batches)` -> {"train": loss, "val": loss}, or None when a
        signal came during it) and decides; every process follows: save (each its RNG state), diverge, or stop."""
        self.check_losses()
        finished = self.finished(iter_num)
        stopping, diverged, losses, cut_short = self.stop, None, None, False
        save = stopping and not self.config["eval_only"]
        if self.master and not stopping:
            first = iter_num == self.first_iter
            losses = evaluate(self.project if first else None)
            if losses is None:  # a signal during evaluation: save what the last step left, and stop
                save, stopping, cut_short = not self.config["eval_only"], True, True
            elif not all(math.isfinite(v) for v in losses.values()):
                diverged = (f"the validation loss is {losses['val']} at iteration {iter_num}; stopped without "
                            f"saving. Last good checkpoint: {self.last_good_checkpoint()}")
            else:
                self.log(f"step {iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}"
                         + loss_in_bits(self.config["objective"], losses["val"]), flush=True)
                self.run_log.write({"iter": iter_num, "train_loss": losses["train"], "val_loss": losses["val"]})
                self.last_losses = losses
                improved = losses["val"] < self.best_val_loss
                self.best_val_loss = min(self.best_val_loss, losses["val"])
                save = iter_num > 0 and not self.config["eval_only"] and \
                    (improved or self.config["always_save_checkpoint"] or finished)
        save, diverged, stopping = self.processes.from_master([save, diverged, stopping])
        if diverged:
            raise TrainingDiverged(diverged)
        if save:
            state = checkpoint_state()
            if self.master:
                self.write_checkpoints(state, best=losses is not None and losses["val"] <= self.best_val_loss)
        if stopping:
            self.stop = True
            saved = f"saved {os.path.join(self.out_dir, 'ckpt.pt')} at iteration {iter_num}" if save else \
                "nothing saved"
            self.log(f"interrupted: {saved}; resume with the same command plus --init_from=resume"
                     + (" (it repeats the evaluation that was cut short)" if save and cut_short else ""))
        self.clock, self.timed_iters = time.perf_counter(), 0  # evaluation and saving are not training time
        self.flops_at_clock = self.flops_done

    def say_how_it_ended(self, iter_num):
        """The last line of a run that was not stopped: where its checkpoint is, and what to run next."""
        if self.stop:
            return
        if self.saved_at is None:
            why = "--eval_only" if self.config["eval_only"] else f"--max_iters={self.config['max_iters']}"
            self.log(f"finished at iteration {iter_num} without training a step ({why}): nothing saved")
            return
        path = os.path.join(self.out_dir, "ckpt.pt")
        self.log(f"finished at iteration {iter_num}: {path}. Next: python sample.py --out_dir={self.out_dir}, or "
                 f"train longer with the same command plus --init_from=resume --max_iters=<more than {iter_num}>")

    def project(self, seconds_per_eval_batch):
        for line in project_run(seconds_per_eval_batch, self.end_iter - self.first_iter, self.config,
                                self.processes.device, self.cpu_recipe, self.is_cpu_recipe):
            self.log(line, flush=True)

    def write_checkpoints(self, state, best):
        """ckpt.pt always, best.pt when the validation loss improved; never weights that are not finite."""
        if not all(torch.isfinite(p).all() for p in state["model"].values() if p.is_floating_point()):
            raise TrainingDiverged(f"the weights became non-finite before iteration {state['iter_num']}; stopped "
                                   f"without saving. Last good checkpoint: {self.last_good_checkpoint()}")
        save_checkpoint(state, os.path.join(self.out_dir, "ckpt.pt"))
        self.saved_at = state["iter_num"]
        if best:
            save_checkpoint(state, os.path.join(self.out_dir, "best.pt"))
        self.run_log.sync()  # the log is on disk up to the checkpoint

    # ---- after each optimisation step
    def step_done(self, iter_num, loss, flops, tokens, supervised):
        """Count (claim C1: tokens the model computed, and the ones the loss read), agree on the totals and on
        stopping, and print the log line every log_interval iterations or SECONDS_BETWEEN_LINES seconds."""
        self.pending_losses.append((iter_num, loss))
        line_due = time.perf_counter() - self.last_line > self.seconds_between_lines
        flops, tokens, supervised, stop, line_due = self.processes.sum(
            [float(flops), float(tokens), float(supervised), float(bool(self.signals)), float(line_due)])
        self.flops_done += flops
        self.tokens_seen += int(tokens)
        self.supervised_seen += int(supervised)
        self.timed_iters += 1
        self.stop = bool(stop)
        if iter_num % self.config["log_interval"] == 0 or line_due or self.stop:
            loss_value = self.pending_losses[-1][1].item()  # one sync per log line
            self.check_losses()
            now = time.perf_counter()
            dt = (now - self.clock) / self.timed_iters  # mean over the iterations since the last log line
            left = (self.config["max_iters"] - iter_num - 1) * dt
            budget = self.config["max_flops"]
            if budget:  # or the FLOPs budget ends it first: what is left of that, at the rate since the last line
                # (a step's FLOPs vary with the objective's draws: the planned iteration count is an estimate)
                spent = max(1.0, self.flops_done - self.flops_at_clock)
                left = min(left, max(0.0, budget - self.flops_done) * (now - self.clock) / spent)
            self.clock, self.timed_iters, self.last_line, self.flops_at_clock = now, 0, now, self.flops_done
            self.log(f"iter {iter_num}: loss {loss_value:.4f}, {dt * 1000:.1f} ms/iter, {tokens / dt:,.0f} tok/s, "
                     f"{supervised / dt:,.0f} supervised tok/s, "
                     f"{format_mfu(flops / self.processes.world_size / dt, self.peak_flops)}, {1 / dt:.2f} it/s, "
                     f"~{format_duration(left)} left", flush=True)
            if self.config["quiet"] and self.master and line_due:  # a quiet run (an experiment's) still talks
                where = f" ({100 * min(1.0, self.flops_done / budget):.0f}% of its FLOPs budget)" if budget else \
                    f"/{self.end_iter}"
                print(f"  iteration {iter_num + 1}{where}: loss {loss_value:.4f}, ~{format_duration(left)} left in "
                      f"this run", flush=True)
        if self.stop:  # perhaps only another process was asked: stop together
            self.signals.requested = True


def loss_in_bits(objective, loss):
    """The two losses that are (bounds on) a log-likelihood, in bits per token (claim C4)."""
    if objective == "clm":
        return f" = {loss / math.log(2):.4f} bits/token (exact NLL)"
    if objective == "diffusion":
        return f" = {loss / math.log(2):.4f} bits/token (ELBO: an upper bound on the NLL)"
    return ""
