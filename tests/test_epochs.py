"""Repeated data (claim X2, epochs.py): the runs learn from the first N characters only, are scored on the
validation split, read the number of epochs they say, and the summary finds best epochs and crossovers."""
import json
import os

import numpy as np
import pytest

from experiments import epochs
import train
from conftest import run_script
from infra.configurator import UserError
from infra.dataset import load_dataset


def occurs_in(window, data):
    """Does the token sequence `window` occur somewhere in `data` (1-D arrays)?"""
    starts = np.flatnonzero(data[:len(data) - len(window) + 1] == window[0])
    return any(np.array_equal(data[i:i + len(window)], window) for i in starts)


def test_the_budget_dataset_holds_the_first_n_training_tokens_and_the_whole_validation_split(char_dataset, tmp_path):
    splits, meta = load_dataset(char_dataset, 32, prepare_if_missing=False)
    folder = epochs.budget_dataset(splits, meta, 3000, str(tmp_path / "budget"))
    source_train = np.fromfile(splits["train"], dtype=np.uint16)
    budget_train = np.fromfile(os.path.join(folder, "train.bin"), dtype=np.uint16)
    assert len(budget_train) == 3000 and np.array_equal(budget_train, source_train[:3000])
    assert np.array_equal(np.fromfile(os.path.join(folder, "val.bin"), dtype=np.uint16),
                          np.fromfile(splits["val"], dtype=np.uint16))
    load_dataset(folder, 32, prepare_if_missing=False)  # a dataset train.py accepts (sizes match meta.pkl)
    with pytest.raises(epochs.UserError, match="more than the"):
        epochs.budget_dataset(splits, meta, len(source_train) + 1, str(tmp_path / "too-much"))


@pytest.mark.slow
def test_quick_run_trains_on_the_budget_only_and_scores_on_the_validation_split(char_dataset, tmp_path, monkeypatch):
    s = dict(epochs.SCALES["quick"], epochs=(1, 4), seeds=1)
    monkeypatch.setitem(epochs.SCALES, "quick", s)
    monkeypatch.setattr("sys.argv", ["epochs.py", "--quick", f"--dataset={char_dataset}", f"--out_dir={tmp_path}"])
    drawn, scored = [], []
    real_get_windows, real_second_half_bits = train.get_windows, epochs.second_half_bits

    def recording_get_windows(path, *args):
        windows = real_get_windows(path, *args)
        drawn.append((path, windows.numpy()))
        return windows

    def recording_second_half_bits(name, model, windows, *args):
        scored.append(windows.cpu().numpy())
        return real_second_half_bits(name, model, windows, *args)

    monkeypatch.setattr(train, "get_windows", recording_get_windows)
    monkeypatch.setattr(epochs, "second_half_bits", recording_second_half_bits)
    epochs.main()

    budget = os.path.join(str(tmp_path), "checkpoints", "epochs-quick", "data")
    source_train = np.fromfile(os.path.join(char_dataset, "train.bin"), dtype=np.uint16)
    val = np.fromfile(os.path.join(char_dataset, "val.bin"), dtype=np.uint16)
    first_n = source_train[:s["unique_chars"]]
    training = [w for path, w in drawn if path == os.path.join(budget, "train.bin")]
    assert training and {os.path.dirname(p) for p, _ in drawn} == {budget}  # no other file was ever read
    for batch in training[::7]:  # every training window lies inside the first N characters
        assert all(occurs_in(row, first_n) for row in batch)
    data = json.loads((tmp_path / "epochs-quick.json").read_text())
    assert len(data["runs"]) == len(epochs.SERIES) * 2 and len(scored) == 2 * len(data["runs"])
    held_out = scored[0::2]  # each run scores the validation windows first, then the training windows
    for windows in held_out:
        assert all(occurs_in(row, val) for row in windows)
    for windows in scored[1::2]:
        assert all(occurs_in(row, first_n) for row in windows)
    for row in data["runs"]:  # the run read the number of epochs it reports (up to one batch)
        one_batch = s["batch_size"] * s["block_size"] / s["unique_chars"]
        assert abs(row["epochs_read"] - row["epochs"]) <= one_batch
        assert row["iterations"] == epochs.iterations_for(row["epochs"], s["unique_chars"], s)
        assert 0 < row["bits_val"] < 12 and 0 < row["bits_train"] < 12
    diffusion = [r for r in data["runs"] if r["series"] == "diffusion"]
    assert all(r["elbo_bits_val"] is not None and r["bits_val"] == r["elbo_bits_val"] for r in diffusion)
    text = (tmp_path / "epochs-quick.md").read_text()
    assert "Crossover" in text and "Character frequencies" in text

    # a second run with the same settings reuses every finished run: no training at all
    monkeypatch.setattr(train, "train", lambda config: pytest.fail("a finished run was trained again"))
    epochs.main()

    # other settings never replace the finished runs unasked: one line (run_main: status 2), the files untouched
    before = (tmp_path / "epochs-quick.json").read_text()
    monkeypatch.setitem(epochs.SCALES, "quick", dict(s, position="learned"))
    with pytest.raises(UserError, match="runs of other settings: --fresh=True replaces them"):
        epochs.main()
    assert (tmp_path / "epochs-quick.json").read_text() == before


def synthetic_runs(curves, seeds=(1, 2)):
    return [{"series": name, "epochs": e, "seed": seed, "bits_val": value + 0.01 * seed, "bits_train": value - 1,
             "chain_bits_val": value} for name, curve in curves.items() for e, value in curve.items() for seed in seeds]


def test_summary_finds_the_best_epoch_and_a_crossover_only_when_diffusion_stays_below():
    s = {"epochs": (1, 2, 4, 8)}
    runs = synthetic_runs({"gpt": {1: 3.0, 2: 2.5, 4: 2.6, 8: 3.0}, "gpt, dropout 0.2": {1: 3.1, 2: 2.6, 4: 2.5, 8: 2.7},
                           "diffusion": {1: 3.5, 2: 3.0, 4: 2.4, 8: 2.3}})
    table, best, crossover = epochs.summarise(runs, s)
    assert best == {"gpt": 2, "gpt, dropout 0.2": 4, "diffusion": 8} and crossover == 4
    assert table["gpt"][2]["bits_val"][0] == pytest.approx(2.515) and table["gpt"][2]["seeds"] == 2
    assert table["gpt"][2]["bits_val"][1] == pytest.approx(np.std([2.51, 2.52], ddof=1))
    # diffusion below at 2 epochs only, above again later: no crossover
    runs = synthetic_runs({"gpt": {1: 3.0, 2: 2.5, 4: 2.4, 8: 2.3}, "diffusion": {1: 3.5, 2: 2.4, 4: 2.5, 8: 2.4}})
    assert epochs.summarise(runs, s)[2] is None
    # below at the last epoch count only: one point is not a crossover
    runs = synthetic_runs({"gpt": {1: 3.0, 2: 2.5, 4: 2.4, 8: 2.3}, "diffusion": {1: 3.5, 2: 2.6, 4: 2.5, 8: 2.2}})
    assert epochs.summarise(runs, s)[2] is None
    # below by less than the seed spread: not a crossover either
    runs = synthetic_runs({"gpt": {4: 2.4, 8: 2.3}, "diffusion": {4: 2.39, 8: 2.29}}, seeds=(1, 5))
    assert epochs.summarise(runs, s)[2] is None
    # the largest epoch count not measured yet (an interrupted run): no verdict
    runs = synthetic_runs({"gpt": {1: 3.0, 2: 2.5, 4: 2.6, 8: 3.0}, "diffusion": {1: 3.5, 2: 2.0, 4: 2.0}})
    assert epochs.summarise(runs, s)[2] is None


def test_the_crossover_skips_the_epoch_counts_past_gpts_last_and_compares_with_the_better_gpt():
    """gpt's series stop at max_epochs (overfit long before): the epoch counts past it have no gpt to compare
    with and are skipped, not read as an unfinished run; below them, diffusion is compared with the better gpt."""
    s = {"epochs": (1, 2, 4, 8), "max_epochs": {"gpt": 4, "gpt, dropout 0.2": 4}}
    curves = {"gpt": {1: 3.0, 2: 2.5, 4: 2.9}, "gpt, dropout 0.2": {1: 3.1, 2: 2.6, 4: 2.7},
              "diffusion": {1: 3.5, 2: 2.55, 4: 2.4, 8: 2.3}}
    assert epochs.summarise(synthetic_runs(curves), s)[2] is None  # below at 4 only (2: above the better gpt)
    curves["diffusion"][2] = 2.3
    assert epochs.summarise(synthetic_runs(curves), s)[2] == 2  # below at 2 and 4, 8 skipped
    curves["gpt, dropout 0.2"][2] = 2.2  # the better gpt at 2 is now below diffusion: the crossover moves to 4,
    assert epochs.summarise(synthetic_runs(curves), s)[2] is None  # one count only, no crossover
    del curves["gpt"][4]  # a planned gpt run not finished yet: no verdict from there down
    curves["gpt, dropout 0.2"][2] = 2.6
    assert epochs.summarise(synthetic_runs(curves), s)[2] is None


def test_each_objective_trains_at_the_rate_the_study_kept_for_it():
    """The runs use the study's settings: the rate study.py kept per objective at the CPU scale."""
    with open(os.path.join(os.path.dirname(epochs.__file__), "..", "results", "study", "study-cpu.json")) as f:
        models = json.load(f)["models"]
    kept = {m["objective"]: m["learning_rate"] for m in models.values()}
    assert {objective: kept[objective] for objective in epochs.STUDY_RATES} == epochs.STUDY_RATES
    assert {objective for _, _, objective, _ in epochs.SERIES} <= set(epochs.STUDY_RATES)


def test_epochs_rejects_an_unknown_scale():
    result = run_script("experiments/epochs.py", "--scale=tpu")
    assert result.returncode == 2 and "unknown --scale=tpu" in result.stderr and "Traceback" not in result.stderr

