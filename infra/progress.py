"""
Long work talks, and stops when asked. Every script of the project uses these two:

    progress = Progress("eval val", total=200)
    for k in range(200):
        ...
        progress.update(k + 1)              # "eval val 40/200, 52 s so far, ~3 min left", at most every 10 s

    with StopSignals("stopping after this step") as stop:
        while work_left:
            ...
            if stop:                        # Ctrl-C (SIGINT) or SIGTERM set it; the work saves what it finished
                break                       # and says what it did not do. A second signal raises KeyboardInterrupt.

Plain prints, no dependency: a line every ~10 s is enough to tell a user the job is alive and when it will end.
"""
import errno
import os
import signal
import sys
import threading
import time


def format_duration(seconds):
    if seconds != seconds:  # NaN: nothing measured yet
        return "?"
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def format_flops(flops):
    """8.06 TFLOP, 1.50 GFLOP, ...: a budget that reads right at every scale (a smoke run's is not 0.00 TFLOP)."""
    for unit, size in (("PFLOP", 1e15), ("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6)):
        if flops >= size:
            return f"{flops / size:.2f} {unit}"
    return f"{flops:.0f} FLOP"


class Progress:
    """Prints `what done/total, elapsed, ~left` when at least `every` seconds passed since the last line."""

    def __init__(self, what, total, every=10.0, log=print):
        self.what, self.total, self.every, self.log = what, total, every, log
        self.start = self.last = time.perf_counter()

    def update(self, done):
        now = time.perf_counter()
        if now - self.last < self.every:
            return
        self.last = now
        elapsed = now - self.start
        left = elapsed / done * (self.total - done) if done else float("nan")
        self.log(f"{self.what} {done}/{self.total}, {format_duration(elapsed)} so far, ~{format_duration(left)} left",
                 flush=True)


class RecentRate:
    """Seconds per unit (an iteration) from the recent past: the median of the last `window` measurements, each a
    mean over the units between two log lines. One slow stretch (a busy moment, a checkpoint) moves a median of
    five by one place, not the estimate; a lasting change of speed moves it within a few lines, and changed()
    says so once instead of the estimate swinging silently."""

    def __init__(self, window=5, factor=1.5):
        self.samples, self.window, self.factor = [], window, factor
        self.reported = None  # the rate last said (or the first one)

    def add(self, seconds, units):
        if units > 0:
            self.samples = (self.samples + [seconds / units])[-self.window:]

    def rate(self):
        """The median of the recent rates (None before the first)."""
        ordered = sorted(self.samples)
        if not ordered:
            return None
        middle = len(ordered) // 2
        return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2

    def changed(self):
        """(the rate said before, the rate now) when the median moved by more than `factor` either way since the
        last time it was said; else None. The first rate is set from three measurements (the first line's holds
        warm-up: compiling, the first evaluation), so a start is never taken for a change."""
        now = self.rate()
        if now is None or len(self.samples) < 3 and self.reported is None:
            return None
        if self.reported is None:
            self.reported = now
            return None
        if max(now, self.reported) > self.factor * min(now, self.reported):
            before, self.reported = self.reported, now
            return before, now
        return None


class StopSignals:
    """A context in which SIGINT and SIGTERM do not kill the process but set a flag that the work checks
    (`if stop:`) at points where stopping loses nothing. A second signal raises KeyboardInterrupt at once, for a
    user who does not want to wait. immediate=True raises KeyboardInterrupt at the first signal, SIGTERM included:
    for work whose every finished piece is already kept (bench.py's sections, study.py's models), which catches
    it and writes what it has. Outside the main thread (where Python cannot install handlers) it is a no-op."""

    def __init__(self, message=None, log=print, immediate=False):
        self.message, self.log, self.immediate = message, log, immediate
        self.requested = False
        self.previous = {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self.previous = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
        return self

    def _on_signal(self, signum, frame):
        if self.requested or self.immediate:
            self.requested = True
            raise KeyboardInterrupt
        self.requested = True
        if self.message:
            self.log(f"{signal.Signals(signum).name}: {self.message} (again to quit at once)", flush=True)

    def __exit__(self, *exc):
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)
        return False

    def __bool__(self):
        return self.requested


class StopSignalsWithProgress(StopSignals):
    """StopSignals for work that asks `if stop:` once per step (sample.py's samplers): each ask also counts a step,
    and every `every` seconds a line on standard error says how far the work is and the time left, so a slow
    generation is never a silent one. The samplers stay as they read: they only ask whether to stop."""

    def __init__(self, message, what, total, every=5.0):
        super().__init__(message)
        self.steps, self.total = 0, max(1, total)
        self.progress = Progress(what, self.total, every, log=lambda line, **kw: print(line, file=sys.stderr, **kw))

    def __bool__(self):
        self.steps += 1
        self.progress.update(min(self.steps, self.total))
        return super().__bool__()


def write_atomically(path, text, *more):
    """Write results files whole or not at all: `path, text`, and any further `path, text` pairs as one outcome (a
    table and its JSON, both or neither). What long experiments call after each finished piece, so Ctrl-C keeps
    everything finished and a stop mid-write leaves the previous versions. A full disk is one line (exit status 1)
    with no temporary file left behind. Makes the folders."""
    files, written = [(path, text)] + list(zip(more[::2], more[1::2])), []
    try:
        for name, content in files:
            os.makedirs(os.path.dirname(os.path.abspath(name)), exist_ok=True)
            written.append(name + ".tmp")
            with open(name + ".tmp", "w") as f:
                f.write(content)
    except BaseException as e:
        for tmp in written:
            remove_quietly(tmp)
        if not isinstance(e, OSError):  # Ctrl-C mid-write: the previous versions stay, the partial files go
            raise
        from infra.configurator import Failure
        kept = "the previous versions are kept" if any(os.path.exists(n) for n, _ in files) else "nothing written"
        raise Failure(f"{disk_error(e)} writing {name}; {kept} "
                      f"({', '.join(os.path.basename(n) for n, _ in files)})") from None
    for name, _ in files:
        os.replace(name + ".tmp", name)


def disk_error(error):
    """Why a write failed, in words (torch.save reports a failed write as a RuntimeError around the OSError)."""
    cause = error if isinstance(error, OSError) else error.__context__
    if isinstance(cause, OSError) and cause.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT):
        return "no space left (a full disk or a file-size limit)"
    if isinstance(cause, OSError):
        return cause.strerror or type(cause).__name__
    return f"the write failed ({str(error).strip()[:80]})"


def remove_quietly(path):
    try:
        os.remove(path)
    except OSError:
        pass


def check_writable(paths, option="--out_dir"):
    """Before the work: every file a command will write can be written (a trial write, in folders made for it and
    removed again, so a command refused later leaves nothing behind); a path that is a folder, a parent that is a
    file, a read-only or full disk is one line now, not a traceback at the end of a long run."""
    from infra.configurator import UserError
    for path in paths:
        if os.path.isdir(path):
            raise UserError(f"{path} is a folder, and {option} needs to write a file there: choose another {option}")
        above = os.path.dirname(os.path.abspath(path))
        while not os.path.exists(above):
            above = os.path.dirname(above)
        if not os.path.isdir(above):
            raise UserError(f"{above} is a file, and {option} needs a folder there to write {os.path.basename(path)}: "
                            f"choose another {option}")
        folder, made = os.path.dirname(os.path.abspath(path)), []
        while folder != above:  # the folders this check makes, deepest first
            made.append(folder)
            folder = os.path.dirname(folder)
        try:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            trial = f"{path}.{os.getpid()}.tmp"  # this process's own: two commands may check one folder at once
            with open(trial, "w") as f:
                f.write("x")
            os.remove(trial)
        except OSError as e:
            raise UserError(f"cannot write {path} ({e.strerror}): choose another {option}") from None
        finally:
            for folder in made:  # the writers make them again (write_atomically, train.py's out_dir)
                try:
                    os.rmdir(folder)
                except OSError:  # not empty: another command writes there now
                    break
