"""A newcomer's first hour: the README's quick start works as written, in order; smoke runs stay out of git;
numbers that rest on a failed measurement say so; a run says how it started and how it ended."""
import os
import re
import shutil
import signal
import subprocess
import sys

import pytest

import train
from conftest import HANG_TIMEOUT, ROOT, tiny_args
from infra.configurator import QUICK_OUTPUT, output_folder
from infra.timing import machine_name
from infra.run_control import format_mfu

QUICK_START = [  # the README's quick start, in its order (the test below reads them from the README)
    "pip install torch --index-url https://download.pytorch.org/whl/cpu",  # CPU only
    "pip install -r requirements.txt",
    "python masks.py",
    "python train.py config/train_shakespeare_char_cpu.py --arch=gpt",
    'python sample.py --out_dir=out-cpu-gpt --start="ROMEO:"',
    "python train.py config/train_shakespeare_char_cpu.py --arch=bert",
    "python experiments/curves.py out-cpu-gpt out-cpu-bert",
    "pip install -r requirements.txt",  # with a GPU
    "python train.py --arch=gpt",
    'python sample.py --out_dir=out-gpt --start="ROMEO:"',
]
TINY = ["--max_iters=20", "--eval_interval=10", "--eval_iters=2", "--log_interval=10"]  # the recipe, in seconds


def readme_quick_start():
    readme = open(os.path.join(ROOT, "README_en.md"), encoding="utf-8").read()  # README.md's the same (test_house)
    section = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```\n(.*?)```", section, flags=re.S)
    commands = [line.split("  #")[0].strip() for block in blocks for line in block.splitlines()]
    return [c for c in commands if c.startswith(("python", "pip"))]


def run_in(folder, command, *extra, timeout=HANG_TIMEOUT):
    args = command.split()[1:] + list(extra)
    return subprocess.run([sys.executable, os.path.join(ROOT, args[0]), *args[1:]], cwd=folder, capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.slow
def test_the_quick_start_runs_as_written_in_order(char_dataset, tmp_path):
    """In a fresh folder, the README's commands in order: the CPU recipe (tiny here: 20 iterations) trains gpt,
    samples from it, trains bert, and the curves command reads both runs; the GPU-sized default on a CPU advises
    the recipe, and Ctrl-C saves into out-gpt."""
    assert readme_quick_start() == QUICK_START
    os.symlink(os.path.join(ROOT, "config"), tmp_path / "config")  # a clone's folder, with the outputs kept apart
    data = f"--dataset={char_dataset}"
    masks = run_in(tmp_path, QUICK_START[2])
    assert masks.returncode == 0 and "identical: True" in masks.stdout
    for command in (QUICK_START[3], QUICK_START[5]):
        trained = run_in(tmp_path, command, data, *TINY)
        assert trained.returncode == 0, trained.stderr
        assert "finished at iteration 20" in trained.stdout and "python sample.py --out_dir=out-cpu-" in trained.stdout
        if command == QUICK_START[3]:
            sample = run_in(tmp_path, QUICK_START[4].replace('"', ""), "--max_new_tokens=8", "--num_samples=1")
            assert sample.returncode == 0, sample.stderr
    curves = run_in(tmp_path, QUICK_START[6])
    assert curves.returncode == 0, curves.stderr
    assert "out-cpu-gpt" in curves.stdout and "out-cpu-bert" in curves.stdout
    default = subprocess.Popen([sys.executable, os.path.join(ROOT, "train.py"), "--arch=gpt", data, "--device=cpu"],
                               cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = []
    for line in default.stdout:
        lines.append(line)
        if line.startswith("these settings are sized for one GPU"):
            break
    default.send_signal(signal.SIGINT)  # Ctrl-C during the first evaluation
    stdout, stderr = default.communicate(timeout=HANG_TIMEOUT)
    assert default.returncode == 130, stderr
    assert "config/train_shakespeare_char_cpu.py --arch=gpt" in lines[-1], lines
    assert "interrupted: saved out-gpt/ckpt.pt at iteration 0" in stdout, stdout
    assert os.path.exists(tmp_path / "out-gpt" / "ckpt.pt")
    made = sorted(os.listdir(tmp_path))
    assert [f for f in made if not f.startswith("curves")] == ["config", "out-cpu-bert", "out-cpu-gpt", "out-gpt"]


def test_smoke_runs_write_outside_the_committed_results(tmp_path):
    """--quick left at the default writes to out-quick/ (git-ignored), for every command that has one."""
    from experiments import (encoders, epochs, fewlabels, finetune, incontext, planning, rerankers, reversal, study,
                             tagging)
    for defaults in (study.DEFAULTS, finetune.DEFAULTS, incontext.DEFAULTS, epochs.DEFAULTS, reversal.DEFAULTS,
                     planning.DEFAULTS, tagging.DEFAULTS, encoders.DEFAULTS, rerankers.DEFAULTS, fewlabels.DEFAULTS):
        quick = output_folder(dict(defaults, quick=True), defaults)
        assert quick.startswith(QUICK_OUTPUT + os.sep) and not quick.startswith("results")
        assert output_folder(dict(defaults, quick=True, out_dir="mine"), defaults) == "mine"
        assert output_folder(dict(defaults), defaults) == defaults["out_dir"]
    if shutil.which("git") is None or not os.path.isdir(os.path.join(ROOT, ".git")):
        pytest.skip("not a git clone: the ignore rule cannot be checked")
    ignored = subprocess.run(["git", "check-ignore", "-q", f"{QUICK_OUTPUT}/study/study-quick.json"], cwd=ROOT)
    assert ignored.returncode == 0, "out-quick/ must be ignored by git"
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", ROOT, str(clone)], check=True)
    bench = subprocess.run([sys.executable, "bench.py", "--quick", "--sections=ceilings", "--compile=False"],
                           cwd=clone, capture_output=True, text=True, timeout=HANG_TIMEOUT)
    assert bench.returncode == 0, bench.stderr
    kind = "cpu-amd" if "AMD" in machine_name("cpu") else "cpu"  # results/bench holds one file per CPU kind
    assert f"wrote {QUICK_OUTPUT}/bench/bench-{kind}-quick.json" in bench.stdout
    status = subprocess.run(["git", "status", "--porcelain"], cwd=clone, capture_output=True, text=True).stdout
    assert status == "", status


def test_an_mfu_above_100_percent_is_reported_as_a_measurement_problem(char_dataset, tmp_path, capsys, monkeypatch):
    """A peak measured on a busy machine (forced here to 1 MFLOP/s) is never the base of an MFU figure above 100%."""
    assert format_mfu(0.5e12, 1e12) == "mfu 50.0%"
    assert format_mfu(3e12, 1e12).startswith("mfu ? (")
    from infra import run_control  # where the peak MFU is read against is measured
    monkeypatch.setattr(run_control, "matmul_peak", lambda *args, **kwargs: 1e6)
    train.train(train.resolve_config(tiny_args(char_dataset, str(tmp_path / "o"), max_iters=3, log_interval=1,
                                               quiet=False)))
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith("iter ")]
    assert lines and all(", mfu ?," in line for line in lines), lines  # the caveat itself is said once:
    assert out.count("busy machine") == 1 and "no MFU figure: " in out
    assert not any(re.search(r"mfu [0-9.]+%", line) for line in lines)


def test_a_run_says_how_it_started_and_how_it_ended(char_dataset, tmp_path, capsys):
    out = str(tmp_path / "o")
    train.train(train.resolve_config(tiny_args(char_dataset, out, max_iters=4, eval_interval=2, quiet=False)))
    first = capsys.readouterr().out
    assert f"finished at iteration 4: {os.path.join(out, 'ckpt.pt')}" in first
    assert f"python sample.py --out_dir={out}" in first and "--init_from=resume --max_iters=<more than 4>" in first
    train.train(train.resolve_config(tiny_args(char_dataset, out, init_from="resume", max_iters=6, eval_interval=2,
                                               quiet=False)))
    resumed = capsys.readouterr().out
    assert resumed.splitlines()[0] == f"resuming {os.path.join(out, 'ckpt.pt')} from iteration 4"
    train.train(train.resolve_config(tiny_args(char_dataset, str(tmp_path / "none"), max_iters=0, quiet=False)))
    assert "finished at iteration 0 without training a step (--max_iters=0): nothing saved" in capsys.readouterr().out


def test_a_peak_measured_on_a_busy_machine_is_doubted_from_the_first_line(char_dataset, tmp_path, capsys,
                                                                          monkeypatch):
    """One rule for every log line: the matmul rate measured at start is checked once more at the first line; when
    the two disagree (here 1 GFLOP/s at start, 50 at the first line) no line prints an MFU figure, the first
    included (an MFU of 50% against a peak measured 50x too low would look like a fact)."""
    from infra import run_control
    assert run_control.peak_doubt(1e11, 1.5e11) is None and "busy machine" in run_control.peak_doubt(1e9, 5e10)
    monkeypatch.setattr(run_control, "matmul_peak", lambda *args, **kwargs: 1e9)
    monkeypatch.setattr(run_control, "matmul_flops_per_second", lambda *args, **kwargs: 5e10)
    train.train(train.resolve_config(tiny_args(char_dataset, str(tmp_path / "o"), max_iters=3, log_interval=1,
                                               quiet=False)))
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith("iter ")]
    assert lines and all(", mfu ?," in line for line in lines), lines
    assert out.count("the matmul rate measured 0.001, then 0.050 TFLOP/s") == 1  # said once, on its own line
    first = out.splitlines().index(lines[0])
    assert "the matmul rate measured 0.001" in out.splitlines()[first - 1]  # just before the first figure it spares


def test_samples_say_what_trained_them_and_warn_when_untrained(char_dataset, tmp_path):
    """sample.py first says which run wrote the weights and how far it got; weights saved at iteration 0 (Ctrl-C
    at once) or by a run stopped early come with a warning, not silently as noise; a missing checkpoint names the
    run folders that are here; a checkpoint naming an objective its arch does not have is refused."""
    import torch
    out = str(tmp_path / "o")
    assert subprocess.run([sys.executable, os.path.join(ROOT, "train.py"),
                           *tiny_args(char_dataset, out, max_iters=4, eval_interval=2)]).returncode == 0
    sample = run_in(tmp_path, f"python sample.py --out_dir={out}", "--max_new_tokens=4", "--num_samples=1")
    assert sample.returncode == 0, sample.stderr
    assert sample.stdout.splitlines()[0].startswith(f"{out}/ckpt.pt: gpt (clm), trained 4 of 4 iterations, best "
                                                    f"val loss "), sample.stdout
    assert "warning" not in sample.stdout
    path = os.path.join(out, "ckpt.pt")
    for done, warning in ((0, "untrained"), (2, "stopped at iteration 2 of 4")):
        checkpoint = torch.load(path, weights_only=False)
        checkpoint["iter_num"] = done
        torch.save(checkpoint, path)
        sample = run_in(tmp_path, f"python sample.py --out_dir={out}", "--max_new_tokens=4", "--num_samples=1")
        assert sample.returncode == 0 and warning in sample.stdout.splitlines()[1], sample.stdout
    missing = run_in(tmp_path, "python sample.py --out_dir=out-gpt")
    assert missing.returncode == 2 and f"(looked in {tmp_path / 'out-gpt'})" in missing.stderr, missing.stderr
    assert "runs there, the most trained first: --out_dir=o (4 iterations)" in missing.stderr, missing.stderr
    checkpoint["config"]["objective"] = "ul3"
    torch.save(checkpoint, path)
    wrong = run_in(tmp_path, f"python sample.py --out_dir={out}")
    assert wrong.returncode == 2 and "objective 'ul3' that arch 'gpt' does not have" in wrong.stderr, wrong.stderr
    assert len(wrong.stderr.strip().splitlines()) == 1


def test_prepare_says_what_the_special_tokens_are(tmp_path, capsys):
    """The vocabulary line names the special tokens instead of a bare count: what 106 extra ids are for."""
    from conftest import load_prepare
    source = tmp_path / "input.txt"
    source.write_text("To be, or not to be: that is the question.\n" * 400, encoding="utf-8")
    load_prepare("shakespeare_char").prepare(str(source), str(tmp_path))
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert "106 special: [PAD] [EOS] [MASK], UL2's 3 mode tokens, 100 span sentinels <S0>..<S99>" in line, line


def test_a_missing_checkpoint_points_at_the_most_trained_run(tmp_path, monkeypatch):
    """No checkpoint where --out_dir says: the runs of that folder are offered by how far they trained (a Ctrl-C at
    iteration 0 leaves an untrained ckpt.pt whose name may sort first), a near-miss of a name gets "did you mean",
    and the message says which folder it looked in (a relative --out_dir is read from the current folder)."""
    from infra.checkpoint import missing_checkpoint
    for name, last in (("out-bert", 0), ("out-cpu-gpt", 2000), ("out-cpu-bert", 750)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "ckpt.pt").write_bytes(b"")
        (tmp_path / name / "log.jsonl").write_text("".join(f'{{"iter": {i}, "loss": 1.0}}\n' for i in (0, last)))
    monkeypatch.chdir(tmp_path)
    line = missing_checkpoint(os.path.join("out-gpt", "ckpt.pt"))
    assert f"(looked in {tmp_path / 'out-gpt'})" in line
    assert line.endswith("the most trained first: --out_dir=out-cpu-gpt (2000 iterations), --out_dir=out-cpu-bert "
                         "(750 iterations), --out_dir=out-bert (0 iterations)"), line
    assert missing_checkpoint(os.path.join("out-cpu-gtp", "ckpt.pt")).endswith("did you mean --out_dir=out-cpu-gpt?")


@pytest.mark.parametrize("script", ["train.py", "sample.py", "bench.py", "experiments/study.py",
                                    "experiments/multiplier.py"])
def test_help_and_a_mistyped_option_are_answered_before_torch_loads(script):
    """--help lists each option with its default and the comment beside it in the file; an option the command
    lacks is one line with the likely one, exit 2. Neither waits for torch (seconds on a busy laptop): the
    interpreter's import log shows it was never imported."""
    helped = subprocess.run([sys.executable, "-X", "importtime", script, "--help"], cwd=ROOT, capture_output=True,
                            text=True, timeout=60)
    assert helped.returncode == 0 and helped.stdout.startswith(f"usage: python {os.path.basename(script)}")
    assert "# " in helped.stdout and "=" in helped.stdout  # defaults with their words
    assert not re.search(r"\|\s+torch$", helped.stderr, re.M), "torch was imported for --help"
    typo = subprocess.run([sys.executable, "-X", "importtime", script, "--seeed=3"], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert typo.returncode == 2 and typo.stdout == ""
    said = [line for line in typo.stderr.splitlines() if not line.startswith("import time:")]
    hint = "did you mean --seed?" if script != "bench.py" else "run with --help to list the options"  # (no seed)
    assert said == [f"{os.path.basename(script)}: error: unknown option --seeed: {hint}"], said
    assert not re.search(r"\|\s+torch$", typo.stderr, re.M)
