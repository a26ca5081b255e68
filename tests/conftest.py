"""Shared fixtures: a small char-level dataset prepared with the project's own prepare script, tiny configs."""
import importlib.util
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

import preloaded

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
torch.set_num_threads(min(2, torch.get_num_threads()))

SHARED_TEXT = os.path.join(ROOT, "..", "shared", "data", "tinyshakespeare", "input.txt")


def load_prepare(name):
    spec = importlib.util.spec_from_file_location(f"prepare_{name}", os.path.join(ROOT, "data", name, "prepare.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def pytest_configure(config):
    config.addinivalue_line("markers", "optional_packages: behaves differently where transformers or matplotlib "
                                       "is installed (.ci/run's last step runs these with both)")
    config.addinivalue_line("markers", "slow: an end-to-end run (an experiment's smoke scale, several processes, a "
                                       "stop across processes): python -m pytest -q -m slow")


def pytest_collection_modifyitems(config, items):
    """`python -m pytest -q` is the fast tier: every claim, every exactness check and every one-line error, the
    end-to-end runs (marked slow) left to `-m slow`. Any -m expression chooses for itself, and a test file or test
    named on the command line runs whole."""
    named = any(os.path.isfile(arg.split("::")[0]) for arg in config.args)
    if config.option.markexpr or named:
        return
    slow = [item for item in items if item.get_closest_marker("slow")]
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = [item for item in items if not item.get_closest_marker("slow")]


@pytest.fixture(scope="session")
def char_dataset(tmp_path_factory):
    """Char-level Tiny Shakespeare (its first 200k characters) from ../shared when that folder sits beside the
    clone (as in CI), else tests/stand_in_text.py's made-up plays of the same structure (a user's offline clone)."""
    folder = tmp_path_factory.mktemp("shakespeare_char")
    source = folder / "source.txt"
    if os.path.exists(SHARED_TEXT):
        text = open(SHARED_TEXT, encoding="utf-8").read()[:200_000]
    else:
        from stand_in_text import stand_in_text
        text = stand_in_text(200_000)
    source.write_text(text, encoding="utf-8")
    load_prepare("shakespeare_char").prepare(str(source), str(folder))
    return str(folder)


@pytest.fixture(scope="session")
def meta(char_dataset):
    import pickle
    with open(os.path.join(char_dataset, "meta.pkl"), "rb") as f:
        return pickle.load(f)


@pytest.fixture(scope="session")
def specials(meta):
    from objectives import Specials
    return Specials.from_meta(meta)


def tiny_args(dataset, out_dir, arch="gpt", **overrides):
    """A few-second training run on CPU."""
    args = dict(arch=arch, dataset=dataset, out_dir=out_dir, device="cpu", n_layer=2, n_head=2, n_embd=32,
                block_size=32, batch_size=8, dropout=0.0, max_iters=30, lr_decay_iters=30, warmup_iters=5,
                eval_interval=10, eval_iters=2, log_interval=5, learning_rate=3e-3, quiet=True)
    args.update(overrides)
    return [f"--{k}={v}" for k, v in args.items()]


# Subprocess limits guard against a hang only, never measure speed: a loaded laptop takes many times longer
HANG_TIMEOUT = 1800


def run_script(script, *args, timeout=HANG_TIMEOUT, env=None):
    """Run one of the project's scripts as a user would; returns CompletedProcess. In a child of a process that
    imported torch once (tests/preloaded.py: the same argv, folder, output and status), or, with env, in a new
    interpreter."""
    if env is None:
        return preloaded.run(os.path.join(ROOT, script), args, ROOT, timeout)
    return subprocess.run([sys.executable, os.path.join(ROOT, script), *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env=env)


def pytest_sessionfinish(session):
    preloaded.stop_server()


def children_of(pid, marker):
    """The pids of the processes whose parent is `pid` and whose command line holds `marker` (bytes), from /proc:
    b"spawn_main" for multiprocessing's workers, b"resource_tracker" for its resource tracker."""
    found = set()
    for child in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{child}/stat") as f:
                parent = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{child}/cmdline", "rb") as f:
                if parent == pid and marker in f.read():
                    found.add(int(child))
        except (OSError, IndexError, ValueError):  # ended meanwhile
            pass
    return found


def run_killing_the_resource_tracker(script, *args):
    """Run a script with --jobs=2 as run_script does, and kill -9 the multiprocessing resource tracker its worker
    processes start, as soon as it is there (the kill is asserted to have happened: else nothing was tested)."""
    process = subprocess.Popen([sys.executable, os.path.join(ROOT, script), *args], cwd=ROOT, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        killed, deadline = set(), time.monotonic() + 60
        while not killed and process.poll() is None and time.monotonic() < deadline:
            killed = children_of(process.pid, b"resource_tracker")
            for pid in killed:
                os.kill(pid, signal.SIGKILL)
            time.sleep(0.05)
        out, err = process.communicate(timeout=HANG_TIMEOUT)
    finally:
        process.kill()
    assert killed, "the resource tracker never started: the test did not test the kill"
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)
