"""Every script, not only train.py, fails in one line, stops cleanly and never hangs (results/logs/errors.txt, round
3): the shared argument checks, the one checkpoint loader, output paths checked before the work, stops outside a
training loop, standard output that goes away, and the edges."""
import errno
import os
import pickle
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

import train
from conftest import HANG_TIMEOUT, ROOT, run_script, tiny_args
from infra import checkpoint
from infra.configurator import UserError, apply_overrides, check_compiler, read_text_file
from infra.dataset import get_windows, load_dataset


def one_line(result, *needles, status=2):
    lines = result.stderr.strip().splitlines()
    assert result.returncode == status and len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert all(needle in lines[0] for needle in needles), lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def trained(char_dataset, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("hostile") / "ok")
    train.train(train.resolve_config(tiny_args(char_dataset, out, max_iters=2, eval_interval=2, block_size=128)))
    return out


def damaged(trained, tmp_path, change):
    state = torch.load(os.path.join(trained, "ckpt.pt"), weights_only=False)
    change(state)
    folder = tmp_path / "damaged"
    folder.mkdir(exist_ok=True)
    torch.save(state, folder / "ckpt.pt")
    return str(folder / "ckpt.pt")


# ----------------------------------------------------------------------------- 1. the shared argument checks

@pytest.mark.parametrize("argv, needle", [(["--seed=18446744073709551616"], "out of range"),
                                          (["--seed=-1"], "out of range"), (["--device=cpu:1"], "takes no index")])
def test_every_script_checks_the_seed_and_the_device_as_train_py_does(argv, needle):
    from experiments import finetune, study
    import sample
    for defaults in (train.DEFAULTS, sample.DEFAULTS, finetune.DEFAULTS, study.DEFAULTS):
        with pytest.raises(UserError, match=needle):
            apply_overrides(defaults, argv)


@pytest.mark.slow
def test_finetune_takes_a_checkpoint_file_as_well_as_its_folder(trained, char_dataset):
    result = run_script("experiments/finetune.py", f"--init_from={os.path.join(trained, 'ckpt.pt')}",
                        f"--dataset={char_dataset}", "--probe_steps=2", "--task=tampered")
    assert result.returncode == 0 and "seed 1337" in result.stdout, result.stderr[-1000:]


# ----------------------------------------------------------------------------- 2. damaged checkpoints, one loader

@pytest.mark.parametrize("change, needle", [
    (lambda s: s["meta"].pop("stoi"), "character vocabulary"),
    (lambda s: s["meta"].__setitem__("itos", s["meta"]["itos"][:5]), "character vocabulary"),
    (lambda s: next(iter(s["model"].values())).fill_(float("nan")), "not finite"),
    (lambda s: s.__setitem__("best_val_loss", "low"), "best_val_loss of the wrong type"),
    (lambda s: s["config"].pop("arch"), "names no arch"),
])
def test_a_damaged_checkpoint_is_refused_by_the_loader_every_script_shares(trained, tmp_path, change, needle):
    path = damaged(trained, tmp_path, change)
    with pytest.raises(UserError, match=needle):
        checkpoint.load_checkpoint(path)
    one_line(run_script("sample.py", f"--out_dir={os.path.dirname(path)}", "--max_new_tokens=4"), needle)


# ----------------------------------------------------------------------------- 3. never hang

def test_a_pipe_where_a_checkpoint_or_a_text_should_be_is_refused_at_once(tmp_path):
    fifo = str(tmp_path / "ckpt.pt")
    os.mkfifo(fifo)
    with pytest.raises(UserError, match="not a regular file"):
        checkpoint.load_checkpoint(fifo)  # torch.load would wait on it forever
    with pytest.raises(UserError, match="not a regular file"):
        read_text_file(fifo, "prompt file")


def test_the_ngram_baseline_talks_while_it_is_tuned(capsys):
    from experiments.tasks import tuned_logistic_regression
    x = np.random.default_rng(0).random((60, 16)).astype(np.float32)
    y = np.arange(60) % 3
    lines = []
    predicted = tuned_logistic_regression(x, y, x, 3, log=lambda line, **_: lines.append(line))
    assert predicted.shape == (60,)  # (its progress lines come every 10 s: none in a fraction of a second)
    import experiments.tasks as tasks
    assert "Progress" in tasks.tuned_logistic_regression.__code__.co_names


# ----------------------------------------------------------------------------- 4. outputs: checked first, whole

def test_every_output_path_is_checked_before_the_work(tmp_path):
    (tmp_path / "b.md").mkdir()
    one_line(run_script("bench.py", f"--out={tmp_path / 'b.json'}", "--quick"), "is a folder")
    (tmp_path / "a-file").write_text("")
    for script in ("experiments/reversal.py", "experiments/epochs.py", "experiments/incontext.py"):
        started = time.perf_counter()
        one_line(run_script(script, "--quick", f"--out_dir={tmp_path / 'a-file' / 'x'}"), "a-file is a file",
                 "choose another --out_dir")
        assert time.perf_counter() - started < HANG_TIMEOUT  # (refused before any training: see its one line)


def test_two_commands_checking_one_output_folder_at_once_do_not_trip_each_other(tmp_path):
    """The trial write of check_writable is the process's own file: another command's trial file (here, one that
    is there while this one checks) is neither used nor removed, so two experiments can start in one folder."""
    from infra.progress import check_writable
    other = tmp_path / "planning-cpu.md.tmp"
    other.write_text("another command's trial")
    check_writable([str(tmp_path / "planning-cpu.md")])
    assert other.read_text() == "another command's trial" and sorted(os.listdir(tmp_path)) == [other.name]


def test_a_full_disk_while_preparing_leaves_nothing_and_says_so(tmp_path, monkeypatch):
    from data.prepare_common import write_dataset

    def full(obj, f):  # train.bin and val.bin are written by now; meta.pkl gets four bytes, then the disk is full
        f.write(b"part")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(pickle, "dump", full)
    with pytest.raises(UserError, match="No space left"):
        write_dataset(str(tmp_path), list(range(50)) * 4, {"tokenizer": "char", "num_ordinary": 50})
    assert os.listdir(tmp_path) == []


def test_standard_output_that_goes_away_ends_quietly_or_in_one_line(trained):
    early = subprocess.Popen([sys.executable, os.path.join(ROOT, "masks.py")], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, cwd=ROOT)
    early.stdout.readline()
    early.stdout.close()  # python masks.py | head -1
    assert early.wait(HANG_TIMEOUT) in (0, 141) and b"Traceback" not in early.stderr.read()
    piped = subprocess.Popen([sys.executable, os.path.join(ROOT, "sample.py"), f"--out_dir={trained}",
                              "--num_samples=200", "--max_new_tokens=400"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, cwd=ROOT)
    piped.stdout.readline()
    piped.stdout.close()  # python sample.py ... | head -1 (80 kB: more than a pipe holds, so a write meets the close)
    assert piped.wait(HANG_TIMEOUT) == 141  # its standard error holds its progress lines, and nothing else
    assert all(line.startswith(b"tokens of ") and line.endswith(b" left") for line in piped.stderr.read().splitlines())
    if os.path.exists("/dev/full"):
        with open("/dev/full", "w") as full:
            result = subprocess.run([sys.executable, os.path.join(ROOT, "masks.py")], stdout=full,
                                    stderr=subprocess.PIPE, text=True, cwd=ROOT)
        assert result.returncode == 1 and "cannot write to standard output" in result.stderr
        assert "Traceback" not in result.stderr


def test_a_character_the_terminal_cannot_show_is_escaped(char_dataset, tmp_path):
    text = "café au lait, crème brûlée.\n" * 300
    folder = tmp_path / "accents"
    folder.mkdir()
    from conftest import load_prepare
    (folder / "text.txt").write_text(text, encoding="utf-8")
    load_prepare("shakespeare_char").prepare(str(folder / "text.txt"), str(folder))
    out = str(tmp_path / "run")
    train.train(train.resolve_config(tiny_args(str(folder), out, max_iters=2, eval_interval=2)))
    result = run_script("sample.py", f"--out_dir={out}", "--start=caf", "--max_new_tokens=30", "--num_samples=1",
                        env=dict(os.environ, PYTHONIOENCODING="ascii"))
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr


# ----------------------------------------------------------------------------- 5. stops outside the training loop

def test_sigterm_outside_a_training_loop_is_a_clean_stop_that_says_what_is_kept():
    script = ("import sys, time; sys.path.insert(0, %r)\nfrom infra.configurator import run_main\n"
              "run_main(lambda: (print('ready', flush=True), time.sleep(60)), interrupted='the runs so far are kept')"
              % ROOT)
    process = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    assert process.stdout.readline().strip() == "ready"
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=HANG_TIMEOUT)
    assert process.returncode == 130 and stderr.strip() == "-c: interrupted; the runs so far are kept"


def test_ctrl_c_while_torch_loads_ends_without_a_traceback():
    script = ("import sys; sys.path.insert(0, %r)\nimport infra.quiet_interrupts, os, signal, time\n"
              "os.kill(os.getpid(), signal.SIGINT)\ntime.sleep(30)\nimport torch" % ROOT)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=HANG_TIMEOUT)
    assert result.returncode == 130 and result.stderr == ""
    for command in ("train.py", "sample.py", "bench.py", "experiments/study.py", "experiments/reversal.py"):
        source = open(os.path.join(ROOT, command)).read()
        heavy = [source.index(name) for name in ("import numpy", "import torch") if name in source]
        assert heavy and source.index("import infra.quiet_interrupts") < min(heavy), command


# ----------------------------------------------------------------------------- 6. messages that say what is wrong

def test_messages_name_the_real_problem(trained, char_dataset, tmp_path):
    with pytest.raises(UserError, match="is a folder"):
        read_text_file(str(tmp_path), "--input")
    for name in ("", ".", "./"):
        with pytest.raises(UserError, match="names no dataset"):
            load_dataset(name, 8, prepare_if_missing=False)
    one_line(run_script("bench.py", "--sections=,ceilings"), "empty name")
    one_line(run_script("bench.py", "--sections=all,training"), "all means every section")
    other = tmp_path / "same-size"  # as many characters as the checkpoint's text, other ones
    other.mkdir()
    meta = pickle.load(open(os.path.join(char_dataset, "meta.pkl"), "rb"))
    shifted = "".join(chr(0x400 + i) for i in range(meta["num_ordinary"] - 1))  # and the newline
    (other / "text.txt").write_text((shifted * 40 + "\n") * 20, encoding="utf-8")
    from conftest import load_prepare
    load_prepare("shakespeare_char").prepare(str(other / "text.txt"), str(other))
    result = run_script("train.py", *tiny_args(str(other), trained, init_from="resume", max_iters=4, block_size=128))
    one_line(result, "as many tokens", "other ones")


def test_the_experiments_helpers_and_options_say_what_they_are(tmp_path, char_dataset):
    """A helper among the commands, run as one, says it is not one (no import traceback); --scale=quick is refused
    (the quick scale writes to out-quick/ with --quick only, never into results/); an empty --study_dir is named."""
    for helper in ("structural", "study_report", "tasks", "equal_compute"):
        result = run_script(f"experiments/{helper}.py")
        assert result.returncode == 1 and "not a command" in result.stderr and "Traceback" not in result.stderr
    one_line(run_script("experiments/tagging.py", "--scale=quick", f"--out_dir={tmp_path}"), "unknown --scale=quick",
             "(or --quick)")
    assert not os.listdir(tmp_path)
    one_line(run_script("experiments/tagging.py", "--quick", "--study_dir=", f"--out_dir={tmp_path / 'o'}"),
             "--study_dir is empty")
    one_line(run_script("experiments/reversal.py", "--quick", "--models=gpt,bort", f"--out_dir={tmp_path / 'o'}"),
             "--models=gpt,bort")
    assert not os.listdir(tmp_path)  # refused after the output check: it made no folder
    # encoders: a damaged study file in the study folder (not JSON; a rate that is not a number) is named, and an
    # --out_dir that is a file is refused naming the file this command would write (one part's, not the whole's)
    study = tmp_path / "study"
    study.mkdir()
    for text in ("not json", '{"chosen_learning_rate": {"gpt": "fast"}}'):
        (study / "study-quick.json").write_text(text)
        one_line(run_script("experiments/encoders.py", "--quick", "--parts=judge", f"--study_dir={study}",
                            f"--dataset={char_dataset}", f"--out_dir={tmp_path / 'o'}"),
                 "study-quick.json is damaged", "run python "
                 "experiments/study.py again, or delete it")
    (tmp_path / "a-file").write_text("")
    one_line(run_script("experiments/encoders.py", "--quick", "--parts=judge", f"--study_dir={study}",
                        f"--out_dir={tmp_path / 'a-file'}"), "is a file", "encoders-quick-judge.md")
    assert sorted(os.listdir(tmp_path)) == ["a-file", "study"] and os.listdir(study) == ["study-quick.json"]


# ----------------------------------------------------------------------------- 7. edges

def test_a_config_file_that_exits_is_refused(tmp_path):
    config = tmp_path / "exits.py"
    config.write_text("import sys\nsys.exit(0)\n")
    with pytest.raises(UserError, match="calls sys.exit"):
        train.resolve_config([str(config)])


def test_a_dataset_prepared_again_under_a_running_run_is_noticed(char_dataset, tmp_path):
    data = tmp_path / "data"
    shutil.copytree(char_dataset, data)
    splits, _ = load_dataset(str(data), 16, prepare_if_missing=False)
    rng = np.random.default_rng(0)
    get_windows(splits["train"], 2, 16, rng)
    time.sleep(0.01)
    with open(splits["train"], "r+b") as f:  # rewritten, as prepare.py would
        f.write(b"\x00\x00")
    with pytest.raises(UserError, match="changed while this run was reading it") as refused:
        get_windows(splits["train"], 2, 16, rng)
    assert "--init_from=resume if it saved a checkpoint" in str(refused.value)  # (none may exist yet)


def test_compiling_on_a_cpu_without_a_compiler_is_refused_at_once(monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(UserError, match="needs a C\\+\\+ compiler"):
        check_compiler("cpu")
    check_compiler("cuda")  # CUDA compiles with Triton, not the C++ compiler


def test_published_claims_without_a_text_asks_for_one(monkeypatch):
    """With no --text and no downloaded Tiny Shakespeare (prepare.py --input=... copies none), the advice is the
    one that works offline: pass --text, not run a prepare script that was run."""
    from experiments import published_claims
    monkeypatch.setattr(published_claims, "FALLBACK_TEXTS", [])
    with pytest.raises(UserError, match=r"no text: pass --text=") as refused:
        published_claims.read_text("")
    assert "prepare" not in str(refused.value)



# ----------------------------------------------------------------------------- 5. full disks, folders in the way

def on_a_full_disk(at):
    """The environment of a command whose file ending with `at` cannot be written (tests/full_disk)."""
    return dict(os.environ, FULL_DISK_AT=at, PYTHONPATH=os.pathsep.join(
        [os.path.join(ROOT, "tests", "full_disk")] + os.environ.get("PYTHONPATH", "").split(os.pathsep)))


def leftovers(folder):
    return sorted(str(p) for p in __import__("pathlib").Path(folder).rglob("*.tmp"))


def test_results_files_are_written_together_or_not_at_all(tmp_path, monkeypatch):
    """write_atomically(path, text, path2, text2): a full disk at either file is one failure (exit status 1 through
    run_main), with no temporary file left and neither file half-updated: a table never lands without its JSON."""
    import builtins
    from full_disk.sitecustomize import full_disk_open
    from infra.configurator import Failure
    from infra.progress import write_atomically
    real_open = builtins.open
    json_path, md_path = str(tmp_path / "r.json"), str(tmp_path / "r.md")
    for suffix in ("r.json.tmp", "r.md.tmp"):
        monkeypatch.setattr(builtins, "open", full_disk_open(suffix, real_open))
        with pytest.raises(Failure, match="no space left .* nothing written") as failed:
            write_atomically(json_path, "{}", md_path, "table")
        monkeypatch.setattr(builtins, "open", real_open)
        assert "Traceback" not in str(failed.value) and os.listdir(tmp_path) == [], os.listdir(tmp_path)
    write_atomically(json_path, "{1}", md_path, "table 1")
    monkeypatch.setattr(builtins, "open", full_disk_open("r.md.tmp", real_open))
    with pytest.raises(Failure, match="the previous versions are kept"):
        write_atomically(json_path, "{2}", md_path, "table 2")
    monkeypatch.setattr(builtins, "open", real_open)
    assert sorted(os.listdir(tmp_path)) == ["r.json", "r.md"] and open(json_path).read() == "{1}"


@pytest.mark.parametrize("jobs", [1, 2])
def test_a_full_disk_in_an_experiment_is_one_line_and_exit_status_1(tmp_path, jobs):
    """An experiment's checkpoint cannot be written (in this process, or in a training process of --jobs=2): one
    line, status 1 (a failure, not a usage error), no temporary file; results that cannot be written are neither
    file of their pair."""
    models = "gpt,bert" if jobs > 1 else "gpt"
    result = subprocess.run([sys.executable, os.path.join(ROOT, "experiments", "reversal.py"), "--quick",
                             f"--out_dir={tmp_path}", f"--models={models}", f"--jobs={jobs}"], capture_output=True,
                            text=True, timeout=HANG_TIMEOUT, cwd=ROOT, env=on_a_full_disk("ckpt.pt.tmp"))
    one_line(result, "no space left", "ckpt.pt; no ckpt.pt was written", status=1)
    assert leftovers(tmp_path) == []
    if jobs == 1:
        result = subprocess.run([sys.executable, os.path.join(ROOT, "experiments", "reversal.py"), "--quick",
                                 f"--out_dir={tmp_path}", "--models=gpt"], capture_output=True, text=True,
                                timeout=HANG_TIMEOUT, cwd=ROOT, env=on_a_full_disk("reversal-quick-gpt.md.tmp"))
        one_line(result, "no space left", "nothing written (reversal-quick-gpt.json, reversal-quick-gpt.md)",
                 status=1)
        assert leftovers(tmp_path) == [] and not (tmp_path / "reversal-quick-gpt.json").exists()


def test_a_full_disk_between_the_latest_and_the_best_checkpoint_says_what_is_on_disk(char_dataset, tmp_path):
    out = tmp_path / "out"
    result = subprocess.run([sys.executable, os.path.join(ROOT, "train.py"),
                             *tiny_args(char_dataset, str(out), max_iters=2, eval_interval=2)],
                            capture_output=True, text=True, timeout=HANG_TIMEOUT, cwd=ROOT,
                            env=on_a_full_disk("best.pt.tmp"))
    line = one_line(result, "no space left", "best.pt; no best.pt was written; ckpt.pt of iteration 2 was written",
                    status=1)
    assert "no checkpoint was written" not in line
    assert (out / "ckpt.pt").exists() and not (out / "best.pt").exists() and leftovers(out) == []
    assert checkpoint.load_checkpoint(str(out / "ckpt.pt"))["iter_num"] == 2


@pytest.mark.parametrize("name", ["log.jsonl", "lock"])
def test_a_folder_where_the_run_log_or_the_lock_goes_is_named_and_no_lock_stays(char_dataset, tmp_path, name):
    out = tmp_path / "out"
    (out / name).mkdir(parents=True)
    result = run_script("train.py", *tiny_args(char_dataset, str(out), max_iters=2))
    one_line(result, f"cannot write {out / name}", "Is a directory")
    assert sorted(os.listdir(out)) == [name]  # no lock, log or checkpoint left behind


# ----------------------------------------------------------------------------- 6. processes, names, locales

@pytest.mark.slow
def test_a_torchrun_environment_without_its_peers_talks_stops_at_sigterm_and_gives_up(tmp_path):
    """A complete torchrun environment whose other processes never come: after a few seconds a line says what the
    process waits for; a SIGTERM ends it at once (init_process_group alone would wait half an hour, deaf to it);
    left alone, it gives up with one line."""
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    env = dict(os.environ, RANK="0", WORLD_SIZE="2", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    process = subprocess.Popen([sys.executable, os.path.join(ROOT, "train.py"), f"--out_dir={tmp_path / 'o'}",
                                "--device=cpu"], stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env)
    try:
        line = process.stderr.readline()
        assert f"waiting for all 2 processes of the job to meet at 127.0.0.1:{port}" in line, line
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)
    finally:
        process.kill()
    assert process.returncode == -signal.SIGTERM and not (tmp_path / "o").exists()
    code = "import infra.parallel as p; p.join_process_group({'device': 'cpu'}, give_up_after=3)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env,
                            timeout=HANG_TIMEOUT)
    assert result.returncode == 1 and "did not all meet at" in result.stderr.strip().splitlines()[-1], result.stderr


@pytest.mark.optional_packages  # the same messages with transformers installed and without
def test_a_published_name_or_folder_is_checked_before_the_dataset(char_dataset, trained, tmp_path):
    """--init_from=<not a published checkpoint> says so, not that the dataset is char-level; a train.py out_dir is a
    gpt run to start from (claim G1), and one of another shape says so and how to continue it instead. No package is
    needed to say any of it."""
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    for name, needle in (("gpt3", "could not load 'gpt3'"), (str(tmp_path / "nowhere"), "is not a folder"),
                         (trained, "give this run the gpt's shape: --n_head=2 --n_embd=32 --block_size=128 --n_layer=2")):
        result = run_script("train.py", f"--dataset={char_dataset}", f"--init_from={name}", "--device=cpu",
                            f"--out_dir={tmp_path / 'o'}", env=env)
        assert "char" not in one_line(result, needle)
    empty = tmp_path / "empty"
    empty.mkdir()
    one_line(run_script("train.py", f"--dataset={char_dataset}", f"--init_from={empty}", "--device=cpu",
                        f"--out_dir={tmp_path / 'o'}", env=env), "holds no config.json", "and no ckpt.pt (a train.py run's folder")


def test_a_checkpoint_without_a_setting_of_a_later_version_resumes_at_that_settings_old_value(char_dataset,
                                                                                              tmp_path):
    """A checkpoint written before `position` existed (learned positions were then the only kind) resumes with the
    default, and a different --position names a value the user can pass, never --position=None."""
    out = str(tmp_path / "o")
    train.train(train.resolve_config(tiny_args(char_dataset, out, max_iters=2, eval_interval=2)))
    state = torch.load(os.path.join(out, "ckpt.pt"), weights_only=False)
    del state["config"]["position"], state["model_config"]["position"]
    torch.save(state, os.path.join(out, "ckpt.pt"))
    refused = run_script("train.py", *tiny_args(char_dataset, out, max_iters=4, eval_interval=2), "--position=rope",
                         "--init_from=resume")
    assert "None" not in one_line(refused, "checkpoint", "has position=learned; pass --position=learned")
    resumed = train.train(train.resolve_config(tiny_args(char_dataset, out, max_iters=4, eval_interval=2) +
                                               ["--init_from=resume"]))
    assert resumed["iter_num"] == 4


def test_an_argument_the_locale_cannot_read_names_the_locale():
    """LC_ALL=C with Python's UTF-8 mode off: a non-ASCII prompt arrives as undecodable bytes; the one line says
    it is the locale, not characters missing from the vocabulary."""
    env = dict(os.environ, LC_ALL="C", PYTHONUTF8="0")
    env.pop("LANG", None)
    result = run_script("sample.py", "--start=caf\u00e9", env=env)
    assert "outside the vocabulary" not in one_line(result, "--start", "locale", "UTF-8")


@pytest.mark.slow
def test_a_stop_during_the_first_compiled_step_says_it_waits_for_the_compile(char_dataset, tmp_path):
    """With --compile=True the first step compiles for a while (minutes for t5 on two cores) and the stop flag is
    read between steps: the line printed at once says so, and the run then saves after that step and ends as
    train.py's stops end (status 130, a checkpoint kept)."""
    out = tmp_path / "o"
    process = subprocess.Popen([sys.executable, os.path.join(ROOT, "train.py"),
                                *tiny_args(char_dataset, str(out), max_iters=50, eval_interval=25, quiet=False),
                                "--compile=True"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               cwd=ROOT)
    try:
        for line in process.stdout:
            if line.startswith("step 0:"):  # the evaluation before the first step is done: the step compiles now
                break
        process.send_signal(signal.SIGTERM)
        stdout, stderr = process.communicate(timeout=HANG_TIMEOUT)
    finally:
        process.kill()
    assert "SIGTERM: stopping after the first step, which is still compiling" in stdout, stdout
    assert process.returncode == 130 and "Traceback" not in stderr, (process.returncode, stderr)
    assert "interrupted: saved" in stdout and (out / "ckpt.pt").exists()


@pytest.mark.parametrize("script", ["masks.py", "model.py", "objectives.py", "kvcache.py"])
def test_the_chapter_demos_take_no_arguments_and_end_in_one_line(script):
    """Every chapter file's demo starts through masks.run_demo: --help says what it shows, a stray argument is one
    line and status 2 (it used to run the demo and exit 0), a full disk is one line and status 1, a closed
    standard output (>&-) and a reader gone (| head) end quietly."""
    def run(*args, **streams):
        return subprocess.run([sys.executable, os.path.join(ROOT, script), *args], cwd=ROOT, text=True,
                              timeout=HANG_TIMEOUT, **{"stdout": subprocess.PIPE, "stderr": subprocess.PIPE,
                                                       **streams})
    helped = run("--help")
    assert helped.returncode == 0 and "takes no arguments" in helped.stdout and not helped.stderr
    stray = run("--n_embd=8")
    assert stray.returncode == 2 and stray.stdout == ""
    assert stray.stderr.count("\n") == 1 and "unrecognized argument '--n_embd=8'" in stray.stderr
    piped = subprocess.run(["bash", "-c", f'"{sys.executable}" {script} | true; exit "${{PIPESTATUS[0]}}"'], cwd=ROOT,
                           text=True, capture_output=True, timeout=HANG_TIMEOUT)  # a reader gone before the demo writes
    assert piped.returncode == 0 and piped.stderr == "", piped.stderr[-2000:]
    closed = run(stdout=subprocess.DEVNULL, stdin=subprocess.DEVNULL, close_fds=True,
                 preexec_fn=lambda: os.close(1))  # python <script> >&-
    assert closed.returncode == 0 and "Traceback" not in closed.stderr
    if os.path.exists("/dev/full"):
        with open("/dev/full", "w") as full:
            result = run(stdout=full)
        assert result.returncode == 1 and result.stderr.count("\n") == 1
        assert f"{script}: error: cannot write to standard output" in result.stderr


# ----------------------------------------------------------------------------- 8. a run adapted into its own folder

def test_a_run_is_never_started_into_the_folder_it_starts_from(trained, char_dataset, tmp_path):
    """--init_from=RUN --out_dir=RUN would overwrite the gpt it adapts: refused whatever --overwrite says, RUN
    untouched; the run's ckpt.pt file named instead of its folder is pointed at the folder."""
    before = {name: os.path.getmtime(os.path.join(trained, name)) for name in os.listdir(trained)}
    for overwrite in ("False", "True"):
        one_line(run_script("train.py", f"--dataset={char_dataset}", "--arch=bert", "--objective=diffusion",
                            f"--init_from={trained}", f"--out_dir={trained}/.", f"--overwrite={overwrite}",
                            "--device=cpu", "--max_iters=2"),
                 "--init_from and --out_dir are one folder", "its own --out_dir")
    assert {name: os.path.getmtime(os.path.join(trained, name)) for name in os.listdir(trained)} == before
    one_line(run_script("train.py", f"--dataset={char_dataset}", f"--init_from={trained}/ckpt.pt", "--device=cpu",
                        f"--out_dir={tmp_path / 'o'}"), "is a run's checkpoint file", f"--init_from={trained}")
    assert not (tmp_path / "o").exists()


def test_the_initialisation_is_blamed_for_a_loss_that_is_not_finite_before_any_step(char_dataset, tmp_path,
                                                                                   monkeypatch):
    """--init_std has an upper bound that says why; where the starting loss is not finite (the bound lifted here),
    the message blames the initialisation, not the learning rate (no step was taken)."""
    one_line(run_script("train.py", f"--dataset={char_dataset}", "--init_std=1e30", "--device=cpu",
                        f"--out_dir={tmp_path / 'o'}"), "--init_std=1e+30 is above 1", "near 0.02")
    import infra.train_config
    monkeypatch.setattr(infra.train_config, "INIT_STD_MAX", 1e31)
    with pytest.raises(train.TrainingDiverged) as failure:
        train.train(train.resolve_config(tiny_args(char_dataset, str(tmp_path / "o"), init_std=1e30)))
    assert "at iteration 0" in str(failure.value) and "the initialisation gives it (--init_std=1e+30" in \
        str(failure.value) and "learning_rate" not in str(failure.value)
    assert not (tmp_path / "o" / "ckpt.pt").exists()


def test_a_shape_refusal_offers_only_fixes_that_work(char_dataset, tmp_path):
    """A gpt of 1 layer cannot become a t5 of 2-layer stacks nor a 2-layer bert: the message gives the flags that
    fit it (singular: 1 layer), never 'continue that run', which would not adapt anything."""
    gpt = str(tmp_path / "gpt1")
    train.train(train.resolve_config(tiny_args(char_dataset, gpt, n_layer=1, max_iters=2, eval_interval=2)))
    shape = ["--n_head=2", "--n_embd=32", "--block_size=32"]
    line = one_line(run_script("train.py", f"--dataset={char_dataset}", "--arch=t5", "--objective=span_corruption",
                               f"--init_from={gpt}", "--n_layer=2", *shape, "--device=cpu",
                               f"--out_dir={tmp_path / 't5'}"),
                    "1 layer (here a stack of 2", "--n_layer and --n_decoder_layer of at most 1")
    assert "continue" not in line and "1 layers" not in line
    line = one_line(run_script("train.py", f"--dataset={char_dataset}", "--arch=bert", f"--init_from={gpt}",
                               "--n_layer=2", "--n_embd=64", "--n_head=2", "--block_size=32", "--device=cpu",
                               f"--out_dir={tmp_path / 'bert'}"), "give this run the gpt's shape: --n_embd=32 --n_layer=1")
    assert "continue" not in line


def test_every_folder_an_experiment_reads_is_checked_before_any_work(tmp_path):
    """adaptation.py's --encoders_dir that is a file, or a folder that is not there, and a damaged encoders.py
    result in it, are refused before anything is trained or written."""
    for folder, needle in (("README.md", "--encoders_dir=README.md is a file"),
                           (str(tmp_path / "nowhere"), "does not exist"), ("", "--encoders_dir is empty")):
        one_line(run_script("experiments/adaptation.py", "--quick", f"--encoders_dir={folder}",
                            f"--out_dir={tmp_path / 'o'}"), needle, "experiments/encoders.py")
        assert not (tmp_path / "o").exists() or not os.listdir(tmp_path / "o")
    (tmp_path / "enc").mkdir()  # encoders.py's file there, damaged: named, not read as "encoders.py has not run"
    for text in ("not json", '{"cells": 3}'):
        (tmp_path / "enc" / "encoders-quick.json").write_text(text)
        one_line(run_script("experiments/adaptation.py", "--quick", f"--encoders_dir={tmp_path / 'enc'}",
                            f"--out_dir={tmp_path / 'o'}"), "encoders-quick.json is damaged",
                 "run python experiments/encoders.py again")
        assert not (tmp_path / "o").exists() or not os.listdir(tmp_path / "o")
