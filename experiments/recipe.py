"""
One fine-tuning recipe for every reader (experiments/encoders.py and experiments/finetune.py --study): a verdict
about an architecture should not be a verdict about the recipe that fine-tuned it.

- the same steps and batch for every reader, AdamW with a linear warmup over the first steps, then linear to 0;
- every rate of a small grid on every seed; the rate kept for a reader is the one of best mean score over seeds on
  tuning items held out of the training ones (never an evaluation item); a reader whose best rate is at the edge
  of the grid is tried once at the rate past that edge;
- each (part, reader, seed, rate) is one cell, run here or in worker processes (--jobs).

A cell is a tuple (part, model, how, seed, rate); running it gives (cell, result), the result a dict with the
scores, "tuning" (the score the rate is chosen on) and "learning rate"; a finished cell as the caller keeps it holds
"part", "reader" ("model (how)"), "seed" and the result.
"""
import contextlib
import copy
import multiprocessing
import multiprocessing.connection
import signal
import time
import traceback

import numpy as np
import torch

from experiments.study_report import mean_std
from infra.configurator import Failure, UserError
from infra.progress import format_duration

CONTROL_MARGIN = 0.10  # a part's positive control: its best reader (mean - std) this far above the spelling rule


# ----------------------------------------------------------------------------- the schedule and the loop

def rate_factor(step, steps, warmup):
    """The fine-tuning schedule, the same for every reader: a linear warmup over the first `warmup` share of the
    steps (the first steps of a fresh head would otherwise shake the pretrained weights), then linear to 0."""
    w = max(1, round(warmup * steps))
    return (step + 1) / w if step < w else max(0.0, (steps - step) / max(1, steps - w))


def train(backbone, head, steps, s, batch_loss, stop, seed, validate=None):
    """`steps` of AdamW on the backbone (s["learning_rate"], one rate of the grid) and the head
    (s["head_learning_rate"]), both on rate_factor's schedule; batch_loss(rng) draws a batch, returns its loss.
    backbone None: the head alone trains (on frozen features).

    validate: None (every step runs), or a function () -> score on the tuning items (higher is better) for early
    stopping: it is called every s["check_every"] steps and at the end; the weights of the best score are put back
    at the end (the first check of the best score), and training stops once s["patience"] checks in a row fell
    under the best score (a check level with it restarts the count; the steps then are the most it may run: the
    schedule still decays over them). Returns [(steps done, score)] of every check."""
    groups, modules = [], [m for m in (backbone and backbone.model, head) if m is not None]
    if backbone is not None:
        backbone.model.train()
        groups.append({"params": backbone.model.parameters(), "lr": s["learning_rate"]})
    if head is not None:
        groups.append({"params": head.parameters(), "lr": s["head_learning_rate"]})
    optimizer = torch.optim.AdamW(groups, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: rate_factor(step, steps, s["warmup"]))
    rng = np.random.default_rng(seed)
    checks, best, best_at, best_weights = [], None, 0, None
    for step in range(steps):
        if stop:
            raise KeyboardInterrupt
        loss = batch_loss(rng)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        schedule.step()
        if validate is not None and ((step + 1) % s["check_every"] == 0 or step + 1 == steps):
            for m in modules:
                m.eval()
            with torch.no_grad():
                checks.append((step + 1, float(validate())))
            for m in modules:
                m.train()
            if best is None or checks[-1][1] > best:  # the weights worth keeping, copied off the ones training
                best, best_weights = checks[-1][1], [copy.deepcopy(m.state_dict()) for m in modules]
            if checks[-1][1] >= best:  # (a tie with the best restarts the count: validation is still level)
                best_at = len(checks)
            elif len(checks) - best_at >= s["patience"]:
                break  # s["patience"] checks in a row under the best score: validation stopped improving
    if best_weights is not None:
        for m, weights in zip(modules, best_weights):
            m.load_state_dict(weights)
    for m in modules:
        m.eval()
    return checks


# ----------------------------------------------------------------------------- the rate kept, the grid grown

def kept_rates(cells):
    """{(part, reader): the rate of the grid whose mean tuning score over seeds is best} (on a tie the lower): the
    rate is chosen on items held out of the training ones, never on the evaluation items."""
    scores = {}
    for c in cells:
        if "tuning" in c:
            scores.setdefault((c["part"], c["reader"]), {}).setdefault(c["learning rate"], []).append(c["tuning"])
    return {key: max(sorted(by_rate), key=lambda rate: np.mean(by_rate[rate])) for key, by_rate in scores.items()}


def kept_values(data, part, reader, metric):
    """A reader's score per seed at the rate kept for it (a frozen reader has no rate: its cells' scores)."""
    kept = kept_rates(data["cells"]).get((part, reader))
    return [c[metric] for c in data["cells"] if (c["part"], c["reader"]) == (part, reader) and metric in c
            and c.get("learning rate") == kept]


def tried_rates(cells, part, reader):
    return sorted({c["learning rate"] for c in cells if (c["part"], c["reader"]) == (part, reader)
                   and "learning rate" in c})


def rate_kept(cells, part, reader):
    """The rate kept for a reader as text, marked when it is still the lowest or highest it was tried at."""
    rate, tried = kept_rates(cells).get((part, reader)), tried_rates(cells, part, reader)
    if rate is None:
        return "-"
    return f"{rate:g}" + (" (edge)" if len(tried) > 1 and rate in (tried[0], tried[-1]) else "")


def grow(cells, grown, seeds):
    """The cells that grow the grid: a reader whose kept rate is the lowest (highest) it was tried at is tried at
    grown[part][0] ([1]), the one rate past the grid on that side, on every seed (once: a rate kept there is
    reported at the edge). grown: {part: (below, above)}, or one pair for every part."""
    out = []
    for (part, reader), rate in kept_rates(cells).items():
        tried = tried_rates(cells, part, reader)
        below, above = grown[part] if isinstance(grown, dict) else grown
        for edge, beyond in ((tried[0], below), (tried[-1], above)):
            if rate == edge and beyond not in tried:
                model, how = reader[:-1].split(" (")
                out += [(part, model, how, seed, beyond) for seed in seeds]
    return out


def begun(cells, seeds):
    """The cells of every seed for each (part, reader, rate) a finished cell has: a rate an earlier run grew to is
    finished on every seed even where that run stopped half-way (grow offers a rate once)."""
    return list(dict.fromkeys((c["part"], *c["reader"][:-1].split(" ("), seed, c.get("learning rate"))
                              for c in cells for seed in seeds))


def missing(plan, cells):
    """The cells of the plan not among those finished."""
    done = {(c["part"], c["reader"], c["seed"], c.get("learning rate")) for c in cells}
    return [cell for cell in plan if (cell[0], f"{cell[1]} ({cell[2]})", cell[3], cell[4]) not in done]


def rate_grid(cells, first_column):
    """The table of every rate's mean tuning score, a row per (part, reader), the rate kept in bold and marked where
    it is still at the edge of the rates tried; first_column names what a part is."""
    columns = sorted({c["learning rate"] for c in cells if "learning rate" in c})
    lines = [f"| {first_column} | reader | " + " | ".join(f"{rate:g}" for rate in columns) + " | kept |",
             "|---|---|" + "---|" * (len(columns) + 1)]
    for (part, reader), rate in kept_rates(cells).items():
        tuned = [c for c in cells if (c["part"], c["reader"]) == (part, reader) and "tuning" in c]
        by_rate = {x: [c["tuning"] for c in tuned if c["learning rate"] == x] for x in columns}
        lines.append(f"| {part} | {reader} | " + " | ".join(
            ("-" if not v else (f"**{100 * np.mean(v):.1f}%**" if x == rate else f"{100 * np.mean(v):.1f}%"))
            for x, v in by_rate.items()) + f" | {rate_kept(cells, part, reader)} |")
    return lines


def control_outcome(values, rule):
    """A part's positive control: its best reader's mean - std (over seeds) at least CONTROL_MARGIN above the
    spelling rule's score. values: {reader: [score per seed]}."""
    best = max(values, key=lambda reader: np.mean(values[reader]))
    mean, std = mean_std(values[best])
    passed = mean - (std or 0.0) >= rule + CONTROL_MARGIN
    return {"best": best, "mean": mean, "std": std, "rule": rule, "passed": bool(passed)}


# ----------------------------------------------------------------------------- cells in worker processes

def worker(connection, prepare, arguments, run, threads):
    """A worker process of finished_cells: prepare(*arguments) once (the tasks, the same seed: the same items), then
    run(cell, False) for each cell it is sent, sending back ("done", its result), or ("refused", the one line) for a
    UserError or Failure, or ("bug", the traceback), until it is sent None or its parent is gone."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the parent ends the workers
    torch.set_num_threads(threads)
    try:
        prepare(*arguments)
        while True:
            try:
                cell = connection.recv()
            except EOFError:  # the parent is gone: nothing to tell
                return
            if cell is None:
                return
            connection.send(("done", run(cell, False)))
    except (UserError, Failure) as e:  # the parent says it in one line, as if the cell had run there
        message = ("refused", (type(e).__name__, str(e)))
    except Exception:  # noqa: B902  (a bug: the parent shows where, in this process)
        message = ("bug", traceback.format_exc())
    with contextlib.suppress(OSError):
        connection.send(message)


def finished_cells(plan, jobs, run, stop, prepare=None, arguments=()):
    """Yield run(cell) as the cells finish: here, one after another (the caller has prepared what run reads), or in
    `jobs` worker processes that each call prepare(*arguments) first (spawned, not forked: a forked OpenMP runtime
    can hang), each with its share of the threads. run and prepare: functions of a module (sent by name)."""
    if jobs == 1:
        for cell in plan:
            yield run(cell, stop)
        return
    arguments = (prepare, arguments, run, max(1, torch.get_num_threads() // jobs))
    context, waiting, workers, finished = multiprocessing.get_context("spawn"), list(plan), {}, False

    def give(connection):  # the next cell, or None: the worker ends (a worker gone shows at its next read)
        with contextlib.suppress(OSError):
            connection.send(waiting.pop(0) if waiting else None)

    # (pipes, not a multiprocessing pool: a pool's queues hold named semaphores, which the resource tracker cleans
    # up, printing tracebacks if it was killed meanwhile)
    try:
        for _ in range(min(jobs, len(waiting))):
            here, there = context.Pipe()
            process = context.Process(target=worker, args=(there, *arguments), daemon=True)
            process.start()
            workers[here] = process
            there.close()  # the worker holds the only other end: its end is the pipe's end of file
            give(here)
        busy = set(workers)
        while busy:
            for connection in multiprocessing.connection.wait(list(busy)):
                try:
                    kind, said = connection.recv()
                except (EOFError, OSError):  # ended without a word (killed from outside, out of memory)
                    workers[connection].join()
                    raise Failure(f"a worker process ended with status {workers[connection].exitcode} (killed, "
                                  f"or out of memory)") from None
                if kind == "refused":
                    raise (UserError if said[0] == "UserError" else Failure)(said[1])
                if kind == "bug":
                    raise RuntimeError(f"a worker process failed:\n{said}")
                if not waiting:
                    busy.discard(connection)
                give(connection)
                yield said
        finished = True
    finally:  # finished (each worker was sent None), stopped or failed: no worker is left behind
        for process in workers.values():
            if finished:
                process.join(timeout=5)
            if process.exitcode is None:
                process.kill()
                process.join()


def run_grid(plan, cells, s, seeds, jobs, run, stop, prepare, arguments, tag, score):
    """Every cell of `plan` not in `cells` (in `jobs` worker processes), then the one rate past each rate kept at its
    edge (grow), until none is missing. Each finished cell is appended to `cells` as {"part", "reader", "seed",
    **result} (a stop leaves the finished ones there) with a line: its `score` (a key of the result), the steps it
    ran and the time left. The plan (a list) grows in place."""
    started, done, todo = time.perf_counter(), 0, missing(plan, cells)
    while todo:
        for (part, model, how, seed, rate), result in finished_cells(todo, jobs, run, stop, prepare, arguments):
            cells.append({"part": part, "reader": f"{model} ({how})", "seed": seed, **result})
            done += 1
            left = (time.perf_counter() - started) / done * (len(missing(plan, cells)))
            print(f"[{tag}] {len(cells)}/{len(plan)} done: {part}, {model} ({how}), seed {seed}, rate {rate:g}: "
                  f"{score} {100 * result[score]:.1f}% after {result['steps run']} steps; "
                  f"~{format_duration(max(0, left))} left", flush=True)
        grown = grow(cells, s["grown"], seeds)
        plan += grown  # (the caller's list: a stop reports the plan as far as it grew)
        todo = missing(plan, cells)
        if todo:
            print(f"[{tag}] the grid grown past {len(grown) // len(seeds)} rates kept at its edge: {len(todo)} "
                  f"cells more", flush=True)


def note_stop(data, plan, name):
    """After a stop with some cells finished: say so, and mark the result (written as name, a -partial file)."""
    print(f"interrupted: {len(data['cells'])} of {len(plan)} cells done; they are written to {name}.*", flush=True)
    data["notes"] = [f"**Interrupted: {len(data['cells'])} of {len(plan)} cells done; a row may hold fewer seeds "
                     f"than the header names.**"]
