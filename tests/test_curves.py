"""experiments/curves.py: the reader's own runs drawn side by side, from the log.jsonl each run writes."""
import json
import math
import os
import subprocess
import sys

import pytest

import train
from conftest import HANG_TIMEOUT, ROOT, tiny_args
from experiments import curves
from experiments.metrics import character_frequency_nats


@pytest.fixture(scope="module")
def two_runs(char_dataset, tmp_path_factory):
    """A tiny gpt and a tiny bert, each evaluated at iterations 0, 10, 20 and 30."""
    folder = tmp_path_factory.mktemp("curves")
    for arch in ("gpt", "bert"):
        train.train(train.resolve_config(tiny_args(char_dataset, str(folder / f"out-{arch}"), arch=arch)))
    return folder


def curves_in(folder, *args):
    return subprocess.run([sys.executable, os.path.join(ROOT, "experiments", "curves.py"), *args], cwd=folder,
                          capture_output=True, text=True, timeout=HANG_TIMEOUT)


def test_every_evaluation_is_read_with_its_flops_and_labelled_with_what_its_loss_averages(two_runs, char_dataset,
                                                                                         specials):
    gpt, bert = (curves.read_run(str(two_runs / f"out-{arch}")) for arch in ("gpt", "bert"))
    assert [p[0] for p in gpt["points"]] == [0, 10, 20, 30] == [p[0] for p in bert["points"]]
    flops = [p[1] for p in gpt["points"]]
    assert flops[0] == 0 and all(b > a for a, b in zip(flops, flops[1:]))  # FLOPs grow with every step
    assert math.isclose(flops[2], 2 * flops[1], rel_tol=1e-9)  # the same batch shape each step: linear in steps
    logged = [json.loads(line) for line in open(two_runs / "out-gpt" / "log.jsonl")]
    assert [r["val_loss"] for r in logged if "val_loss" in r] == [p[2] for p in gpt["points"]]
    assert (gpt["arch"], gpt["objective"], bert["arch"], bert["objective"]) == ("gpt", "clm", "bert", "mlm")
    assert "no density (C4)" in curves.label(bert) and "every next character" in curves.label(gpt)
    plateau = curves.plateau_nats(char_dataset)  # the reference line: character frequencies on the validation text
    splits = {s: os.path.join(char_dataset, f"{s}.bin") for s in ("train", "val")}
    assert plateau == character_frequency_nats(splits["train"], splits["val"], specials.num_ordinary) and 2.5 < plateau < 4.0


def test_the_command_prints_the_table_and_writes_the_json_the_plot_is_drawn_from(two_runs):
    result = curves_in(two_runs, "out-gpt", "out-bert", "--out=both.png")
    assert result.returncode == 0, result.stderr
    assert "out-gpt: gpt, clm" in result.stdout and "out-bert: bert, mlm" in result.stdout
    assert "character frequencies alone" in result.stdout
    data = json.load(open(two_runs / "both.json"))
    assert [run["folder"] for run in data["runs"]] == ["out-gpt", "out-bert"]
    for run in data["runs"]:  # the table prints every evaluation the JSON holds
        for it, flops, loss in run["points"]:
            assert f"{it:>9}   {flops / 1e12:6.3f}   {loss:8.4f}" in result.stdout
    if curves.pyplot() is not None:
        from infra.plots import json_digest, stamp
        name, digest = json_digest(str(two_runs / "both.png"))
        assert stamp(str(two_runs / "both.png")) == f"{name} sha256 {digest}"


@pytest.mark.parametrize("case", ["missing folder", "no log", "damaged log", "no evaluation", "bad option"])
def test_a_wrong_folder_or_a_damaged_log_is_one_line_and_nothing_written(two_runs, tmp_path, case):
    run = tmp_path / "run"
    run.mkdir()
    if case == "damaged log":
        (run / "log.jsonl").write_text('{"iter": 0, "train_loss": 5.0, "val_loss": 5.1}\n{"iter": 10, "val_lo')
    elif case == "no evaluation":
        (run / "log.jsonl").write_text('{"iter": 0, "loss": 5.0}\n')
    args = {"missing folder": ["nowhere"], "bad option": [str(two_runs / "out-gpt"), "--outt=x.png"]}.get(case, ["run"])
    result = curves_in(tmp_path, *args)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "curves.py: error:" in result.stderr
    assert sorted(os.listdir(tmp_path)) == ["run"]
