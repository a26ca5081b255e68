"""Exact resume, atomic checkpoints, Ctrl-C, non-finite losses, determinism, and data parallel training."""
import json
import os
import signal
import subprocess
import sys

import pytest
import torch

from infra import checkpoint
import train
from conftest import HANG_TIMEOUT, ROOT, run_script, tiny_args


def iteration_losses(out_dir):
    with open(os.path.join(out_dir, "log.jsonl")) as f:
        return [(r["iter"], r["loss"]) for r in map(json.loads, f) if "loss" in r]


def run(dataset, out_dir, **overrides):
    # bert with dropout: the data sampler, the objective's noise and dropout's RNG all have to resume exactly
    args = dict(arch="bert", dropout=0.1, max_iters=24, lr_decay_iters=24, eval_interval=6, log_interval=5)
    args.update(overrides)
    return train.train(train.resolve_config(tiny_args(dataset, out_dir, **args)))


def test_resume_is_bit_identical(char_dataset, tmp_path):
    straight, split = str(tmp_path / "straight"), str(tmp_path / "split")
    run(char_dataset, straight)
    run(char_dataset, split, max_iters=12)
    run(char_dataset, split, init_from="resume")
    a, b = iteration_losses(straight), iteration_losses(split)
    assert [i for i, _ in a] == list(range(24)) and a == b  # float equality, every iteration


def test_same_seed_same_losses_other_seed_other_losses(char_dataset, tmp_path):
    run(char_dataset, str(tmp_path / "a"), max_iters=8)
    run(char_dataset, str(tmp_path / "b"), max_iters=8)
    run(char_dataset, str(tmp_path / "c"), max_iters=8, seed=7)
    a, b, c = (iteration_losses(str(tmp_path / x)) for x in "abc")
    assert a == b and a != c


def test_checkpoints_keep_latest_and_best(char_dataset, tmp_path):
    out = str(tmp_path / "o")
    run(char_dataset, out, max_iters=12)
    latest = torch.load(os.path.join(out, "ckpt.pt"), weights_only=False)
    best = torch.load(os.path.join(out, "best.pt"), weights_only=False)
    assert latest["iter_num"] == 12 and best["best_val_loss"] <= latest["best_val_loss"] + 1e-12
    for key in ("model", "optimizer", "config", "meta", "rng", "iter_num", "best_val_loss"):
        assert key in latest
    assert len(latest["rng"]) == 1 and set(latest["rng"][0]) >= {"python", "numpy_data", "objective", "torch", "cuda"}


def fake_state(iteration, **extra):
    """The smallest state load_checkpoint accepts: every entry present, of the right type."""
    meta = {"tokenizer": "char", "vocab_size": 1, "num_ordinary": 1, "specials": {}, "num_sentinels": 0,
            "stoi": {"a": 0}, "itos": ["a"]}
    return {"model": {}, "optimizer": {}, "config": {"arch": "gpt", "objective": "clm"}, "model_config": {},
            "meta": meta, "iter_num": iteration,
            "best_val_loss": float("inf"), "flops_done": 0.0, "rng": [], **extra}


def test_a_failed_save_leaves_the_previous_checkpoint(tmp_path, monkeypatch):
    path = str(tmp_path / "ckpt.pt")
    checkpoint.save_checkpoint(fake_state(1, weights=torch.ones(10)), path)

    def broken_save(obj, f):  # writes half a file, then the process "dies"
        f.write(b"\x80\x02partial")
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", broken_save)
    with pytest.raises(KeyboardInterrupt):
        checkpoint.save_checkpoint(fake_state(2), path)
    monkeypatch.undo()
    assert checkpoint.load_checkpoint(path)["iter_num"] == 1


def test_a_process_killed_while_saving_leaves_a_loadable_checkpoint(tmp_path):
    path = str(tmp_path / "ckpt.pt")
    checkpoint.save_checkpoint(fake_state(1), path)
    # the child's torch.save writes half a file, says so, and hangs: the kill lands mid-write, every time
    script = (f"import sys, time; sys.path.insert(0, {ROOT!r}); import torch; from infra import checkpoint\n"
              f"def slow_save(obj, f):\n"
              f"    f.write(b'half a checkpoint'); f.flush(); print('writing', flush=True); time.sleep(60)\n"
              f"torch.save = slow_save\n"
              f"checkpoint.save_checkpoint({{k: None for k in checkpoint.CHECKPOINT_KEYS}}, {path!r})\n")
    process = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline().strip() == "writing"
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert os.path.getsize(path + ".tmp") > 0  # the interrupted write is there, beside the checkpoint
    assert checkpoint.load_checkpoint(path)["iter_num"] == 1  # the previous checkpoint, intact


@pytest.mark.slow
def test_ctrl_c_saves_and_exits_130_then_resume_continues(char_dataset, tmp_path):
    out = str(tmp_path / "o")
    args = tiny_args(char_dataset, out, max_iters=100000, lr_decay_iters=100000, eval_interval=100000,
                     log_interval=1, quiet=False)
    process = subprocess.Popen([sys.executable, os.path.join(ROOT, "train.py"), *args], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, cwd=ROOT)
    for line in process.stdout:
        if line.startswith("iter 20"):
            break
    process.send_signal(signal.SIGINT)
    stdout, stderr = process.communicate(timeout=60)
    assert process.returncode == 130, stderr
    assert "interrupted" in stdout and "--init_from=resume" in stdout and "Traceback" not in stderr
    saved = checkpoint.load_checkpoint(os.path.join(out, "ckpt.pt"))["iter_num"]
    assert saved > 20
    result = run_script("train.py", *tiny_args(char_dataset, out, init_from="resume", max_iters=saved + 5,
                                               lr_decay_iters=100000, eval_interval=100000))
    assert result.returncode == 0, result.stderr
    assert checkpoint.load_checkpoint(os.path.join(out, "ckpt.pt"))["iter_num"] == saved + 5


def test_a_new_run_does_not_overwrite_a_checkpoint_unless_asked(char_dataset, tmp_path):
    out = str(tmp_path / "o")
    run(char_dataset, out, max_iters=2)
    before = os.path.getmtime(os.path.join(out, "ckpt.pt"))
    result = run_script("train.py", *tiny_args(char_dataset, out, max_iters=2))
    assert result.returncode == 2 and "already holds a checkpoint" in result.stderr
    assert os.path.getmtime(os.path.join(out, "ckpt.pt")) == before
    assert run_script("train.py", *tiny_args(char_dataset, out, max_iters=2, overwrite=True)).returncode == 0


def test_non_finite_loss_stops_without_writing(char_dataset, tmp_path):
    out = str(tmp_path / "o")
    result = run_script("train.py", *tiny_args(char_dataset, out, learning_rate=1e30, log_interval=1))
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "at iteration" in result.stderr and "Last good checkpoint" in result.stderr
    assert not os.path.exists(os.path.join(out, "ckpt.pt"))


LAUNCH = [sys.executable, "-m", "infra.parallel", "--standalone", "--nproc_per_node=2", os.path.join(ROOT, "train.py")]


@pytest.mark.slow
def test_two_process_data_parallel_run(char_dataset, tmp_path):
    out = str(tmp_path / "ddp")
    args = tiny_args(char_dataset, out, max_iters=6, eval_interval=3, log_interval=1, gradient_accumulation_steps=2,
                     quiet=False)
    result = subprocess.run([*LAUNCH, *args], capture_output=True, text=True, timeout=HANG_TIMEOUT, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.count("iter 5:") == 1  # only rank 0 logs
    assert "parameters identical on all 2 processes: True" in result.stdout  # gradients were averaged
    saved = checkpoint.load_checkpoint(os.path.join(out, "ckpt.pt"))
    assert saved["iter_num"] == 6 and len(saved["rng"]) == 2  # each process's RNG state
    assert saved["rng"][0]["numpy_data"] != saved["rng"][1]["numpy_data"]
    assert sorted(os.listdir(out)) == ["best.pt", "ckpt.pt", "log.jsonl"]
    resumed = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                              os.path.join(ROOT, "train.py"), *args, "--init_from=resume", "--max_iters=8"],
                             capture_output=True, text=True, timeout=HANG_TIMEOUT, cwd=ROOT)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert checkpoint.load_checkpoint(os.path.join(out, "ckpt.pt"))["iter_num"] == 8


def test_gradient_accumulation_must_divide_across_processes(char_dataset, tmp_path):
    out = str(tmp_path / "ddp")
    args = tiny_args(char_dataset, out, gradient_accumulation_steps=3)
    result = subprocess.run([*LAUNCH, *args], capture_output=True, text=True, timeout=HANG_TIMEOUT, cwd=ROOT)
    assert result.returncode == 2 and "not divisible" in result.stderr and not os.path.exists(out)
    assert "pass --gradient_accumulation_steps=4" in result.stderr  # says which value works
    assert result.stderr.count("train.py: error:") == 1  # by rank 0 alone
    assert "Traceback" not in result.stderr and "ChildFailedError" not in result.stderr  # not torchrun's report


def launched_process(launcher, rank):
    """The pid of the training process of the given rank among the launcher's children."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                parent = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{pid}/environ", "rb") as f:
                environ = f.read().split(b"\0")
        except OSError:
            continue
        if parent == launcher and f"RANK={rank}".encode() in environ:
            return int(pid)
    raise AssertionError(f"no process of rank {rank} under {launcher}")


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="finds the launched processes through /proc")
@pytest.mark.parametrize("ending", ["SIGTERM to the launcher", "SIGUSR1 to the launcher", "SIGKILL to process 1"])
@pytest.mark.slow
def test_a_launched_job_stopped_or_losing_a_process_ends_in_one_line_each(char_dataset, tmp_path, ending):
    """Stopping the launcher (SIGTERM, or SIGUSR1, which it takes as a stop: torchrun alone dies of it and leaves
    its workers training) stops every process, a checkpoint saved, status 130, no process left; a process killed
    outright makes its peer stop with one line (not gloo's traceback) and the launcher say which process died."""
    out = str(tmp_path / "ddp")
    args = tiny_args(char_dataset, out, max_iters=100_000, lr_decay_iters=100_000, eval_interval=50, log_interval=1,
                     gradient_accumulation_steps=2, quiet=False)
    launcher = subprocess.Popen([*LAUNCH, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    for line in launcher.stdout:
        if line.startswith("iter 60:"):  # past the first checkpoint (iteration 50)
            break
    workers = [launched_process(launcher.pid, rank) for rank in (0, 1)]
    if ending == "SIGKILL to process 1":
        os.kill(workers[1], signal.SIGKILL)
    else:
        launcher.send_signal(signal.SIGUSR1 if "SIGUSR1" in ending else signal.SIGTERM)
    stdout, stderr = launcher.communicate(timeout=HANG_TIMEOUT)
    for pid in workers:  # no worker left training as an orphan
        assert not os.path.exists(f"/proc/{pid}") or " Z " in open(f"/proc/{pid}/stat").read(), pid
    lines = [line for line in stderr.splitlines() if "torch/distributed/run.py" not in line]  # (its OMP note)
    assert "Traceback" not in stderr and "ChildFailedError" not in stderr, stderr[-2000:]
    if ending != "SIGKILL to process 1":
        assert launcher.returncode == 130 and "interrupted: saved" in stdout, stderr[-2000:]
        assert checkpoint.load_checkpoint(os.path.join(out, "ckpt.pt"))["iter_num"] > 60
    else:
        assert launcher.returncode == 137, stderr[-2000:]
        assert lines == ["train.py: error: process 0: another process of the job stopped answering (ended or was "
                         "killed); this one stops too, its last checkpoint kept",
                         "train.py: process 1 was killed by SIGKILL"]
        assert checkpoint.load_checkpoint(os.path.join(out, "ckpt.pt"))["iter_num"] >= 50


# ----------------------------------------------------------------------------- round 2

def start(dataset, out_dir, preexec_fn=None, **overrides):
    args = tiny_args(dataset, out_dir, **{"quiet": False, "log_interval": 1, **overrides})
    return subprocess.Popen([sys.executable, os.path.join(ROOT, "train.py"), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=ROOT, preexec_fn=preexec_fn)


def wait_for(process, prefix):
    for line in process.stdout:
        if line.startswith(prefix):
            return
    raise AssertionError(f"no {prefix!r}: {process.stderr.read()}")


@pytest.mark.slow
def test_kill_9_keeps_the_log_and_a_resume_appends_without_duplicates(char_dataset, tmp_path):
    out = str(tmp_path / "o")
    process = start(char_dataset, out, max_iters=100_000, lr_decay_iters=100_000, eval_interval=5)
    wait_for(process, "iter 12:")
    process.kill()  # SIGKILL: no handler runs, nothing is flushed after this
    process.wait()
    logged = [r["iter"] for r in map(json.loads, open(os.path.join(out, "log.jsonl"))) if "loss" in r]
    assert logged[:13] == list(range(13))  # every line written before the kill reached the file
    saved = checkpoint.load_checkpoint(os.path.join(out, "ckpt.pt"))["iter_num"]
    assert saved >= 10
    result = run_script("train.py", *tiny_args(char_dataset, out, init_from="resume", max_iters=20, eval_interval=5))
    assert result.returncode == 0, result.stderr
    records = list(map(json.loads, open(os.path.join(out, "log.jsonl"))))
    assert [r["iter"] for r in records if "loss" in r] == list(range(20))  # kept, appended, no duplicates
    assert [r["iter"] for r in records if "val_loss" in r] == [0, 5, 10, 15, 20]


@pytest.mark.slow
def test_one_run_per_out_dir(char_dataset, tmp_path):
    out = str(tmp_path / "o")
    first = start(char_dataset, out, max_iters=100_000, lr_decay_iters=100_000, eval_interval=5)
    wait_for(first, "iter 6:")  # a checkpoint exists: both a fresh run and a resume could start
    try:
        for extra in ({"overwrite": True}, {"init_from": "resume"}):
            second = run_script("train.py", *tiny_args(char_dataset, out, **extra))
            assert second.returncode == 2 and f"another run (PID {first.pid})" in second.stderr, second.stderr
            assert len(second.stderr.strip().splitlines()) == 1
    finally:
        first.send_signal(signal.SIGTERM)
        first.communicate(timeout=60)
    assert first.returncode == 130 and not os.path.exists(os.path.join(out, "lock"))  # stopped; released on exit
    with open(os.path.join(out, "lock"), "w") as f:  # a stale lock: its process is gone, the kernel lock too
        f.write("999999999\n")
    resumed = run_script("train.py", *tiny_args(char_dataset, out, init_from="resume", max_iters=1))
    assert resumed.returncode == 0, resumed.stderr


def limit_file_size(limit):
    def apply():
        import resource
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


def test_a_full_disk_during_a_save_is_one_line(char_dataset, tmp_path):
    out = str(tmp_path / "o")
    process = start(char_dataset, out, max_iters=4, eval_interval=2, preexec_fn=limit_file_size(100_000))
    _, stderr = process.communicate(timeout=HANG_TIMEOUT)
    assert process.returncode == 1 and stderr.strip().count("\n") == 0 and "Traceback" not in stderr, stderr
    assert "no space left" in stderr and "no ckpt.pt was written" in stderr
    assert not os.path.exists(out)  # a new run that saved nothing leaves nothing
    run(char_dataset, out, arch="gpt", max_iters=2, eval_interval=2)  # a good checkpoint; a resume cannot save
    process = start(char_dataset, out, init_from="resume", max_iters=4, eval_interval=2,
                    preexec_fn=limit_file_size(100_000))
    _, stderr = process.communicate(timeout=HANG_TIMEOUT)
    assert process.returncode == 1 and "is intact" in stderr, stderr
    assert sorted(os.listdir(out)) == ["best.pt", "ckpt.pt", "log.jsonl"]  # no .tmp left
    assert checkpoint.load_checkpoint(os.path.join(out, "ckpt.pt"))["iter_num"] == 2


def test_resume_refuses_another_objective_and_overwrite_starts_clean(char_dataset, tmp_path):
    out = str(tmp_path / "o")
    run(char_dataset, out, max_iters=2, eval_interval=2)
    result = run_script("train.py", *tiny_args(char_dataset, out, arch="bert", objective="diffusion",
                                               init_from="resume"))
    assert result.returncode == 2 and "cannot resume: --objective=diffusion" in result.stderr, result.stderr
    diverging = run_script("train.py", *tiny_args(char_dataset, out, overwrite=True, learning_rate=1e30,
                                                  log_interval=1))
    assert diverging.returncode == 1 and "none written yet" in diverging.stderr, diverging.stderr
    assert not os.path.exists(os.path.join(out, "ckpt.pt")) and not os.path.exists(os.path.join(out, "best.pt"))


def test_bfloat16_on_the_cpu_is_real_and_float16_is_refused(char_dataset, tmp_path):
    config = train.resolve_config(tiny_args(char_dataset, str(tmp_path / "a"), dtype="bfloat16"))
    autocast = train.precision(config["dtype"], "cpu")
    with autocast:
        assert torch.nn.Linear(4, 4)(torch.ones(2, 4)).dtype == torch.bfloat16  # autocast, not a label
    result = train.train(config)
    assert result["iter_num"] == 30 and result["val_loss"] < 4.0
    config = train.resolve_config(tiny_args(char_dataset, str(tmp_path / "b"), dtype="float16"))
    with pytest.raises(train.UserError, match="float16 is not supported on cpu"):
        train.train(config)


def test_compiled_training_follows_eager_training(char_dataset, tmp_path):
    """train.py --compile=True, the GPU recipe's path, run on the CPU: the same losses as eager to float rounding
    (dropout off: compiled dropout draws other random numbers), and a checkpoint a plain model loads (the
    compiled wrapper's names never reach the file)."""
    runs = {}
    for compiled in (False, True):
        out = str(tmp_path / str(compiled))
        run(char_dataset, out, dropout=0.0, max_iters=6, log_interval=1, eval_interval=6, compile=compiled)
        runs[compiled] = iteration_losses(out)
    assert [i for i, _ in runs[True]] == [i for i, _ in runs[False]] == list(range(6))
    assert max(abs(a - b) for (_, a), (_, b) in zip(runs[True], runs[False])) < 1e-4, runs
    model, saved = checkpoint.load_model(str(tmp_path / "True" / "ckpt.pt"), "cpu")
    assert not any("_orig_mod" in name for name in saved["model"]) and saved["iter_num"] == 6


def test_a_model_that_does_not_fit_in_memory(char_dataset, tmp_path):
    out = str(tmp_path / "o")
    result = run_script("train.py", *tiny_args(char_dataset, out, n_head=1, n_embd=2 ** 18))
    assert result.returncode == 1 and "out of memory" in result.stderr and "n_embd=262144" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and not os.path.exists(out)


def test_a_batch_that_does_not_fit_leaves_nothing(char_dataset, tmp_path, monkeypatch):
    def no_memory(*args, **kwargs):
        raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 99999999999 bytes.")
    monkeypatch.setattr(train.Transformer, "forward", no_memory)
    out = str(tmp_path / "o")
    monkeypatch.setattr(sys, "argv", ["train.py", *tiny_args(char_dataset, out)])
    with pytest.raises(SystemExit) as exit_status:
        train.main()
    assert exit_status.value.code == 1 and not os.path.exists(out)  # no out_dir, no empty log.jsonl


def test_a_checkpoint_written_before_the_published_settings_moved_still_loads(char_dataset, tmp_path):
    """Checkpoints of the earlier layout hold ModelConfig's ten published-weight settings; at their defaults (every
    model trained from scratch) they are dropped and the checkpoint resumes and samples; a fine-tuned published
    BERT's or T5's settings become the PublishedConfig of that family."""
    import torch
    from infra.checkpoint import EARLIER_PUBLISHED_FIELDS, upgrade_model_config
    out = str(tmp_path / "o")
    assert run_script("train.py", *tiny_args(char_dataset, out, max_iters=4, eval_interval=2)).returncode == 0
    path = os.path.join(out, "ckpt.pt")
    checkpoint = torch.load(path, weights_only=False)
    checkpoint["model_config"].update(EARLIER_PUBLISHED_FIELDS)
    torch.save(checkpoint, path)
    sampled = run_script("sample.py", f"--out_dir={out}", "--max_new_tokens=4", "--num_samples=1")
    assert sampled.returncode == 0, sampled.stderr
    resumed = run_script("train.py", *tiny_args(char_dataset, out, init_from="resume", max_iters=6, eval_interval=2))
    assert resumed.returncode == 0, resumed.stderr
    bert = upgrade_model_config(dict(arch="bert", n_layer=2, **dict(EARLIER_PUBLISHED_FIELDS, post_norm=True,
                                     norm_eps=1e-12, activation="gelu", segment_vocab_size=2, mlm_head=True)))
    assert bert["family"] == "bert" and bert["norm_eps"] == 1e-12 and "post_norm" not in bert
    t5 = upgrade_model_config(dict(arch="t5", position="relative", **dict(EARLIER_PUBLISHED_FIELDS, norm="rmsnorm")))
    assert t5["family"] == "t5" and "norm" not in t5


@pytest.mark.parametrize("argument, needle", [
    ("--nproc_per_node=0", "--nproc_per_node=0: the number of processes"),
    ("--nproc_per_node=-1", "--nproc_per_node=-1: the number of processes"),
    ("--nproc_per_node=abc", "--nproc_per_node=abc: the number of processes"),
    ("--nproc_per_node=1.5", "--nproc_per_node=1.5: the number of processes"),
    ("--nnodes=0", "--nnodes=0: the number of machines"),
    ("--max-restarts=1", "a restarted train.py starts a fresh run"),
])
def test_the_launchers_own_bad_arguments_are_one_line(argument, needle):
    """python -m infra.parallel refuses torchrun's arguments that torchrun would meet with a traceback (or, for
    --max-restarts, with a second run that does not resume), before any process starts: one line, status 2."""
    result = subprocess.run([sys.executable, "-m", "infra.parallel", "--standalone", argument, "train.py"],
                            cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and result.stdout == "", (result.returncode, result.stdout)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("python -m infra.parallel: error: ") and needle in lines[0], lines


def test_sample_under_the_launcher_is_refused_once_not_printed_twice():
    """sample.py is one process: under the launcher every process would write the same samples (they used to be
    printed twice). One line, from the first process only, status 2."""
    result = subprocess.run([sys.executable, "-m", "infra.parallel", "--standalone", "--nproc_per_node=2",
                             "sample.py", "--out_dir=nowhere"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    lines = [line for line in result.stderr.splitlines() if "torch/distributed/run.py" not in line]
    assert result.returncode == 2 and result.stdout == "", (result.returncode, result.stdout)
    assert lines == ["sample.py: error: sample.py runs in one process: start it with python, not under torchrun or "
                     "infra.parallel"], lines


@pytest.mark.parametrize("variable", [{"RANK": "1"}, {"LOCAL_RANK": "1"}, {"WORLD_SIZE": "2"}])
def test_sample_as_one_process_of_a_job_is_refused(variable):
    """One torchrun variable is enough to say the process is one of several: one line, status 2, nothing run."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    result = subprocess.run([sys.executable, "sample.py", "--out_dir=nowhere"], cwd=ROOT, capture_output=True,
                            text=True, timeout=120, env=dict(env, **variable))
    assert result.returncode == 2 and result.stdout == "" and len(result.stderr.strip().splitlines()) == 1
    assert "sample.py runs in one process" in result.stderr


def test_a_rendezvous_on_port_0_for_several_machines_is_refused_at_once():
    """Two machines cannot meet on "any free port": torchrun would wait its whole timeout without a word."""
    result = subprocess.run([sys.executable, "-m", "infra.parallel", "--nnodes=2", "--nproc_per_node=1",
                             "--rdzv_backend=c10d", "--rdzv_endpoint=localhost:0", "train.py"],
                            cwd=ROOT, capture_output=True, text=True, timeout=60)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and "port 0 means any free port" in lines[0], lines
