"""Long work talks and stops when asked: progress lines during a slow evaluation, a signal during evaluation
stops within seconds and leaves a loadable checkpoint, and a GPU-sized run on a CPU says so at once."""
import contextlib
import os
import re
import signal
import subprocess
import sys
import time

import pytest
import torch

from infra import checkpoint
import train
from conftest import ROOT, run_script, tiny_args
from infra.progress import Progress, StopSignals, format_duration
from infra.run_control import is_cpu_recipe, project_run


def start_train(*args):
    return subprocess.Popen([sys.executable, os.path.join(ROOT, "train.py"), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=ROOT)


def read_until(process, prefix):
    """Lines of stdout up to and including the first that starts with prefix."""
    lines = []
    for line in process.stdout:
        lines.append(line)
        if line.startswith(prefix):
            return lines
    raise AssertionError(f"no line starting with {prefix!r}: {''.join(lines)} {process.stderr.read()}")


def test_progress_lines_during_a_slow_evaluation(char_dataset, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(train, "SECONDS_BETWEEN_LINES", 0.05)  # the real run prints every 10 s
    real_get_windows = train.get_windows

    def slow_get_windows(*args):  # a slow evaluation on any machine: 60 batches take >= 0.3 s per split
        time.sleep(0.005)
        return real_get_windows(*args)

    monkeypatch.setattr(train, "get_windows", slow_get_windows)
    args = tiny_args(char_dataset, str(tmp_path / "o"), max_iters=1, eval_iters=60, quiet=False)
    train.train(train.resolve_config(args))
    out = capsys.readouterr().out
    first_evaluation = out.split("step 0:")[0]
    lines = [line for line in first_evaluation.splitlines() if line.startswith("evaluation (train then val), batches ")]
    done = [int(line.split("batches ")[1].split("/")[0]) for line in lines]
    # one count over both halves: the time left is the whole evaluation's, not the train half's
    assert done == sorted(done) and all(0 < d <= 120 for d in done) and "/120, " in lines[0] and "left" in lines[0]
    assert any(d <= 60 for d in done) and any(d > 60 for d in done), done
    assert "projected on cpu: each evaluation (train and val)" in out  # the first evaluation projects the run


def test_a_quiet_run_still_says_how_far_it_is(char_dataset, tmp_path, capsys, monkeypatch):
    """The experiments train quietly (their own lines only), but a run of minutes must still talk: every
    SECONDS_BETWEEN_LINES one short line with the iteration and the time left, and nothing else of train.py's."""
    monkeypatch.setattr(train, "SECONDS_BETWEEN_LINES", 0.0)  # every step is "due"
    train.train(train.resolve_config(tiny_args(char_dataset, str(tmp_path / "o"), max_iters=6, quiet=True)))
    lines = capsys.readouterr().out.splitlines()
    assert lines and all(line.startswith("  iteration ") and line.endswith(" left in this run") for line in lines), lines
    assert [line.split()[1] for line in lines] == [f"{i}/6:" for i in range(1, 7)]


def test_a_flops_budget_run_says_its_share_of_the_budget_and_never_a_negative_time(char_dataset, tmp_path, capsys,
                                                                                    monkeypatch):
    """A run that a FLOPs budget ends (every experiment's) plans its iterations from one batch; an objective whose
    steps cost more or less than that batch (t5's, UL2's) runs past or short of the plan. The line says the share
    of the budget spent and the time left from the FLOPs left: never "iteration 8/4" or a negative time."""
    one_step = train.train(train.resolve_config(tiny_args(char_dataset, str(tmp_path / "a"), max_iters=1)))["flops"]
    monkeypatch.setattr(train, "SECONDS_BETWEEN_LINES", 0.0)
    monkeypatch.setattr(train, "planned_iterations", lambda *a: 2)  # a plan that is short of what the budget buys
    capsys.readouterr()
    train.train(train.resolve_config(tiny_args(char_dataset, str(tmp_path / "b"), max_iters=10 ** 9,
                                               max_flops=5.5 * one_step)))
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) >= 3, lines  # past the planned 2 iterations
    shares = [int(re.search(r"\((\d+)% of its FLOPs budget\)", line).group(1)) for line in lines]
    assert shares == sorted(shares) and shares[-1] <= 100
    assert not [line for line in lines if "~-" in line], lines


@pytest.mark.slow
def test_a_signal_during_evaluation_stops_within_seconds_and_saves(char_dataset, tmp_path):
    out = str(tmp_path / "o")
    process = start_train(*tiny_args(char_dataset, out, eval_iters=1_000_000, quiet=False))  # an endless evaluation
    read_until(process, "projected on")  # printed after three evaluation batches: we are inside the evaluation
    asked = time.perf_counter()
    process.send_signal(signal.SIGTERM)
    stdout, stderr = process.communicate(timeout=60)
    seconds = time.perf_counter() - asked
    assert process.returncode == 130 and "Traceback" not in stderr, stderr  # a stop's status, every command's
    assert seconds < 10, seconds
    assert "interrupted: saved" in stdout and "--init_from=resume" in stdout
    assert checkpoint.load_checkpoint(os.path.join(out, "ckpt.pt"))["iter_num"] == 0  # no step was completed
    resumed = run_script("train.py", *tiny_args(char_dataset, out, init_from="resume", max_iters=4, eval_interval=2))
    assert resumed.returncode == 0, resumed.stderr
    assert checkpoint.load_checkpoint(os.path.join(out, "ckpt.pt"))["iter_num"] == 4


def test_a_gpu_sized_run_on_a_cpu_is_advised_the_recipe_and_the_recipe_is_not():
    """The projection's logic on given speeds (no test may depend on how fast this machine is): the defaults at
    0.5 s per evaluation batch (what 2 CPU cores take) are hours and get the advice; the recipe itself is never
    advised to itself, however slow the machine; a short run gets no advice."""
    gpu_sized = train.resolve_config(["--arch=bert", "--device=cpu"])
    recipe = train.resolve_config([train.CPU_RECIPE, "--arch=bert"])
    assert not is_cpu_recipe(gpu_sized, train.DEFAULTS, train.CPU_RECIPE)
    assert is_cpu_recipe(recipe, train.DEFAULTS, train.CPU_RECIPE)
    lines = project_run(0.5, gpu_sized["max_iters"], gpu_sized, "cpu", "python train.py " + train.CPU_RECIPE, False)
    assert lines[0].startswith("projected on cpu") and lines[0].endswith(" h"), lines
    assert "config/train_shakespeare_char_cpu.py --arch=bert" in lines[1]
    slow = project_run(5.0, recipe["max_iters"], recipe, "cpu", "python train.py " + train.CPU_RECIPE, True)
    assert len(slow) == 2 and "train_shakespeare_char_cpu.py" not in slow[1] and "slow" in slow[1]
    assert len(project_run(0.005, recipe["max_iters"], recipe, "cpu", "", True)) == 1  # minutes: nothing to advise
    assert len(project_run(0.5, gpu_sized["max_iters"], gpu_sized, "cuda", "", False)) == 1  # advice is for CPUs


def test_progress_and_stop_signals_in_isolation(capsys):
    progress = Progress("work", total=4, every=0.0)
    progress.update(1)
    assert capsys.readouterr().out.startswith("work 1/4, ") and format_duration(7200) == "2.0 h"
    with StopSignals("stopping") as stop:
        assert not stop
        os.kill(os.getpid(), signal.SIGTERM)  # handled: sets the flag instead of ending the process
        time.sleep(0.1)
        assert stop
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # the previous handler is back


def test_a_signal_ends_an_evaluation_within_the_batch_under_way(char_dataset):
    """A GPU-sized evaluation batch takes tens of seconds on a CPU: a stop must not wait for it. The stand-in
    model signals this process in the middle of its first forward pass; nothing after that point may run (an
    evaluation that finished its batch first would record it), and the evaluation returns None (stopped)."""
    config = train.resolve_config(tiny_args(char_dataset, "unused", eval_iters=50))
    splits, meta = train.load_dataset(config["dataset"], config["block_size"], prepare_if_missing=False)
    specials = train.objectives.Specials.from_meta(meta)
    after_the_signal = []

    class StandIn(torch.nn.Module):
        def forward(self, **inputs):
            os.kill(os.getpid(), signal.SIGTERM)  # Ctrl-C or SIGTERM, half-way through a batch
            after_the_signal.append(True)  # the rest of the batch (a model's remaining layers)
            return None, torch.tensor(1.0)

    lines = []
    with StopSignals("stopping: saving a checkpoint first", log=lambda *a, **k: lines.append(a[0])) as stop:
        losses = train.estimate_loss(StandIn(), config, splits, specials, "cpu", contextlib.nullcontext(), stop,
                                     lambda *a, **k: lines.append(a[0]))
        assert stop and not stop.immediate  # the stop is kept for the run; later signals wait again
    assert losses is None and after_the_signal == [], (losses, after_the_signal)
    assert any("cut short" in line for line in lines), lines
    with StopSignals("stopping") as stop:  # asked just before the evaluation: not one batch is evaluated
        stop.requested = True
        assert train.estimate_loss(StandIn(), config, splits, specials, "cpu", contextlib.nullcontext(), stop,
                                   lambda *a, **k: None) is None
    assert after_the_signal == [] and not stop.immediate


@pytest.mark.slow
def test_a_resumed_run_that_stops_says_to_run_the_same_command(char_dataset, tmp_path):
    out = str(tmp_path / "o")
    assert run_script("train.py", *tiny_args(char_dataset, out, max_iters=4, eval_interval=2)).returncode == 0
    process = start_train(*tiny_args(char_dataset, out, init_from="resume", max_iters=8, eval_interval=2,
                                     eval_iters=1_000_000, quiet=False))
    read_until(process, "projected on")
    process.send_signal(signal.SIGTERM)
    stdout, stderr = process.communicate(timeout=60)
    assert process.returncode == 130, stderr
    assert "resume with the same command" in stdout and "plus --init_from=resume" not in stdout, stdout


def test_the_time_left_holds_through_one_slow_stretch():
    """The time left is the median of the recent log lines' speeds: a synthetic run at 50 ms/iter with one window
    ten times slower (an evaluation, a busy moment) keeps its estimate within 10% of the true 50 ms/iter; a lasting
    change of speed is followed within three lines, and said once."""
    from infra.progress import RecentRate
    speed = RecentRate()
    windows = [0.05] * 6 + [0.5] + [0.05] * 4  # seconds per iteration, one log line each (10 iterations)
    estimates = []
    for seconds_per_iteration in windows:
        speed.add(10 * seconds_per_iteration, 10)
        estimates.append(speed.rate())
        assert speed.changed() is None  # one outlier is not a change of speed
    assert all(abs(e - 0.05) <= 0.005 for e in estimates[1:]), estimates  # the mean would jump to ~0.09
    said = []
    for _ in range(4):  # the machine becomes 3x slower for good
        speed.add(1.5, 10)
        said.append(speed.changed())
    assert speed.rate() == pytest.approx(0.15)
    assert [s is not None for s in said].count(True) == 1 and said[2] is not None  # on the 3rd slow line, once
    assert said[2][0] == pytest.approx(0.05)


def test_a_sampler_that_asks_whether_to_stop_also_says_how_far_it_is(capsys):
    """sample.py's samplers ask `if stop:` once per step; that ask also counts the step and, every few seconds
    (here every time), says on standard error how far the generation is: a slow one is never silent."""
    from infra.progress import StopSignalsWithProgress
    with StopSignalsWithProgress("stopping", "tokens of 3 sample(s)", 4, every=0.0) as stop:
        asked = [bool(stop) for _ in range(4)]
    assert asked == [False] * 4
    err = capsys.readouterr().err.splitlines()
    assert err[-1].startswith("tokens of 3 sample(s) 4/4, ") and err[-1].endswith("left"), err
