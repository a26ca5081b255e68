"""What the experiments measure, each choice pinned to an explicit reference on hand-made data: the rate kept (mean
over seeds), the split each number is read from, the weighting and the target of each comparison, the thresholds
of the positive controls, the anneal's length and the probes' held-out items. No full training run: every test
calls the function that makes the choice on numbers whose answer is known."""
import json
import math
import os

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import masks
import objectives
import train
from data.prepare_common import special_token_ids, write_dataset
from experiments import adaptation, adaptation_report, encoders, epochs, metrics, multiplier, plateau, study
from infra.dataset import get_windows, load_dataset
from model import IGNORE_INDEX, Transformer

LN2 = math.log(2)


def tiny_dataset(folder, train_ids, val_ids, letters):
    """A character dataset whose train.bin and val.bin hold exactly these ids (the letters of `letters`)."""
    ids = np.array(list(train_ids) + list(val_ids), dtype=np.uint16)
    os.makedirs(folder, exist_ok=True)
    write_dataset(str(folder), ids, {"tokenizer": "char", "num_ordinary": len(letters),
                                     "itos": dict(enumerate(letters)), "stoi": {c: i for i, c in enumerate(letters)}},
                  train_tokens=len(train_ids))
    return str(folder)


@pytest.fixture(scope="module")
def abab(tmp_path_factory):
    """The text "abab..." (40,000 characters): two letters, equally frequent, each given away by the one before."""
    return tiny_dataset(tmp_path_factory.mktemp("abab"), [0, 1] * 18000, [0, 1] * 2000, "ab")


@pytest.fixture(scope="module")
def frequencies(tmp_path_factory):
    """Training split "a" x 300 then "b" x 100; validation split "cb" repeated: "c" never occurs in training, "a"
    never in validation, so frequencies fitted on the wrong split give other numbers everywhere."""
    return tiny_dataset(tmp_path_factory.mktemp("frequencies"), [0] * 300 + [1] * 100, [2, 1] * 100, "abc")


# ----------------------------------------------------------------------------- the rate kept: the study's sweep, G1's

def test_the_study_keeps_the_rate_of_lowest_mean_loss_over_every_seed():
    """Each model's kept rate has the lowest validation loss averaged over all seeds: the first seed (or the last)
    alone would keep 4e-3, where one seed diverged; the mean keeps 2e-3."""
    losses = {1e-3: (2.0, 3.0, 3.0), 2e-3: (2.5, 2.5, 2.5), 4e-3: (1.0, None, 1.0)}  # means 2.67, 2.5, diverged
    results = {(name, rate, seed): {"val_loss": loss} for name in ("gpt", "bert")
               for rate, by_seed in losses.items() for seed, loss in zip((1, 2, 3), by_seed)}
    results[("gpt", 1e-3, 2)]["val_loss"] = 1.0  # gpt's mean at 1e-3: 2.0
    grids = {"gpt": [1e-3, 2e-3, 4e-3], "bert": [1e-3, 2e-3, 4e-3]}
    assert study.lowest_mean_rates(grids, results, [1, 2, 3]) == {"gpt": 1e-3, "bert": 2e-3}


def test_adaptation_keeps_the_rate_of_lowest_mean_loss_over_every_seed_per_target_and_share():
    """claim G1's adaptation phase gets the study's effort: per (target, share), the rate of lowest mean validation
    loss over the seeds (one seed's best would be 4e-3 for bert), each key read from its own runs."""
    losses = {("bert", 0.5): {1e-3: (2.0, 3.0), 2e-3: (2.4, 2.4), 4e-3: (1.0, 4.0)},
              ("diffusion", 0.5): {1e-3: (2.0, 2.0), 2e-3: (2.4, 2.4), 4e-3: (3.0, 3.0)}}
    results = {(t, f, rate, seed): {"val_loss": loss} for (t, f), by_rate in losses.items()
               for rate, by_seed in by_rate.items() for seed, loss in zip((7, 8), by_seed)}
    grids = {key: sorted(by_rate) for key, by_rate in losses.items()}
    assert adaptation.lowest_mean_rates(grids, results, [7, 8]) == {("bert", 0.5): 2e-3, ("diffusion", 0.5): 1e-3}


# ----------------------------------------------------------------------------- the split each number reads

def test_the_evaluation_windows_are_cut_from_the_validation_split(tmp_path):
    """Every model is scored on held-out text: with training ids 0..3 and validation ids 4..7, every evaluation
    window holds ids 4..7 only, each a stretch of the validation text; the blanks sit after the first position."""
    rng = np.random.default_rng(0)
    folder = tiny_dataset(tmp_path, rng.integers(0, 4, 3000), rng.integers(4, 8, 600), "abcdefgh")
    splits, _ = load_dataset(folder, 16, False)
    windows, blanks, _ = study.evaluation_windows(splits, dict(eval_windows=16, block_size=16), 0, "cpu")
    val = np.fromfile(splits["val"], dtype=np.uint16)
    assert windows.shape == (16, 15) and bool((windows >= 4).all())
    assert all(any(np.array_equal(val[i:i + 15], row) for i in range(len(val) - 14)) for row in windows.numpy())
    assert blanks.shape == (16, 2) and bool((blanks >= 1).all() and (blanks < 15).all())


def test_character_frequencies_are_fitted_on_the_training_split_by_hand(tmp_path):
    """The character-frequency floor (bits/char of the second halves, nats on the validation text, the cloze of
    the most frequent character) comes from the training text's add-one counts, never from what it scores: here
    training is "a" x 6, "b" x 2 and the scored text is all "b" and "c"."""
    np.array([0] * 6 + [1] * 2, dtype=np.uint16).tofile(tmp_path / "train.bin")
    np.array([2, 1] * 4, dtype=np.uint16).tofile(tmp_path / "val.bin")
    windows = torch.tensor([[2, 1, 2, 1, 2, 1, 2, 1]] * 3)  # second halves: "c", "b", "c", "b"
    p = np.array([7, 3, 1]) / 11  # add-one counts 6+1, 2+1, 0+1
    train_path, val_path = str(tmp_path / "train.bin"), str(tmp_path / "val.bin")
    expected_bits = -(np.log2(p[1]) + np.log2(p[2])) / 2
    assert metrics.character_frequency_bits(train_path, windows, 3) == pytest.approx(expected_bits, rel=1e-12)
    reference = metrics.unigram_reference(train_path, windows, torch.tensor([[1, 2]] * 3), 3)
    assert reference == {"bits_per_char": pytest.approx(expected_bits, rel=1e-12), "cloze": 0.0}  # "a": never there
    assert metrics.character_frequency_nats(train_path, val_path, 3) == pytest.approx(-np.log(p[1:]).mean(), rel=1e-12)


def test_the_plateau_control_and_adaptations_rules_read_character_frequencies_of_the_training_split(
        frequencies, monkeypatch):
    """The callers pass the training split: plateau_control's character-frequency level and adaptation's rules
    (bits/char of the second halves, the most frequent character's cloze), by hand on the `frequencies` text
    (training counts a 300, b 100, c 0; every scored half is "c" and "b" alternating, half each)."""
    splits, meta = load_dataset(frequencies, 32, False)
    p = np.array([301, 101, 1]) / 403
    control = metrics.plateau_control(splits, meta, dict(batch_size=4, block_size=16), [])
    assert control["character_frequencies_nats"] == pytest.approx(-np.log(p[1:]).mean(), rel=1e-9)
    monkeypatch.setattr(adaptation, "WORKER", {"tagging": (None, None), "task": None})
    monkeypatch.setattr(adaptation.tagging, "best_rule", lambda *args: ([0.5], None))
    monkeypatch.setattr(adaptation.encoders, "rules", lambda task, parts: {"retrieval": {"n-gram cosine": {
        "recall@1": 0.0}}})
    rules = adaptation.rules(splits, meta, "quick", 1337)
    assert rules["bits"]["character frequencies"] == pytest.approx(-np.log2(p[1:]).mean(), rel=1e-9)
    assert rules["cloze"]["the most frequent character"] == 0.0  # "a", the training text's: never in validation


def test_the_epochs_floor_is_fitted_on_the_unique_data_budget_only(tmp_path, monkeypatch):
    """claim X2's character-frequency floor: the frequencies of the unique data the runs may read (the first
    unique_chars training characters, all "a" here), not of the whole training split (then "b" x 3000): by hand,
    the held-out halves ("ab" alternating) cost -(log2 2001/2002 + log2 1/2002) / 2 bits/char."""
    unique = epochs.SCALES["quick"]["unique_chars"]
    folder = tiny_dataset(tmp_path / "data", [0] * unique + [1] * 3000, [0, 1] * 500, "ab")
    seeds_trained = []

    def stopped(config):  # the first run is interrupted at once: main writes what it has, then exits 130
        seeds_trained.append(config["seed"])
        return {"interrupted": True}
    monkeypatch.setattr(train, "train", stopped)
    monkeypatch.setattr("sys.argv", ["epochs.py", "--quick", f"--dataset={folder}", f"--out_dir={tmp_path / 'out'}"])
    with pytest.raises(SystemExit) as stop:
        epochs.main()
    assert stop.value.code == 130 and seeds_trained == [1337]
    floor = json.loads((tmp_path / "out" / "epochs-quick.json").read_text())["character_frequency_bits"]
    p = np.array([unique + 1, 1]) / (unique + 2)
    assert floor == pytest.approx(-np.log2(p).mean(), rel=1e-9)


# ----------------------------------------------------------------------------- the context-free reference

def test_the_weighted_context_free_reference_averages_as_model_loss_does(abab):
    """Diffusion's loss weights each masked position by 1/t and divides by every position (model.loss): on
    "abab" its context-free predictor sees [MASK] and knows nothing (log 2 nats a masked position), so the
    reference is log 2 per position in expectation (E[masked / t] = 1); averaged over the masked positions only it
    would be about 2 log 2. And batch by batch it is exactly model.loss of that predictor (C4)."""
    splits, meta = load_dataset(abab, 16, False)
    s = dict(batch_size=16, block_size=16)
    diffusion = ("diffusion", "bert", "diffusion", {})
    assert metrics.context_free_reference(diffusion, splits, meta, s) == pytest.approx(LN2, rel=0.05)
    # the same number from model.loss itself, on the batches context_free_reference draws (few, for speed)
    specials, V = objectives.Specials.from_meta(meta), meta["vocab_size"]
    rng, generator = np.random.default_rng(3), torch.Generator().manual_seed(3)
    settings = {"arch": "bert", "objective": "diffusion"}
    draw = [objectives.batch_for(settings, get_windows(splits[split], 16, 16, rng), specials, generator)
            for split in ["train"] * 20 + ["val"] * 10]
    counts = np.ones((V, V))
    for batch in draw[:20]:
        kept = batch.targets != IGNORE_INDEX
        np.add.at(counts, (batch.inputs[kept].numpy(), batch.targets[kept].numpy()), 1)
    log_p = torch.tensor(np.log(counts / counts.sum(1, keepdims=True)))
    losses = [Transformer.loss(log_p[batch.inputs], batch.targets, batch.loss_weights).item() for batch in draw[20:]]
    got = metrics.context_free_reference(diffusion, splits, meta, s, batches=(20, 10), seed=3)
    assert got == pytest.approx(np.mean(losses), rel=1e-6)  # (model.loss reads float32 logits)


# ----------------------------------------------------------------------------- the compute multiplier (C1, C4)

def test_the_multiplier_scores_gpts_cloze_by_exact_bayes_and_diffusions_bits_by_its_elbo(monkeypatch):
    """What each run is compared on: gpt's cloze is its exact-Bayes figure (both sides, as bert's), never its
    left-only one; diffusion's bits are its ELBO, not its chain rule through [MASK]; gpt's bits are exact."""
    monkeypatch.setattr(metrics, "cloze_accuracy", lambda name, *args: {
        "gpt": {"left only": 0.2, "both sides (exact Bayes)": 0.7}}.get(name, {"both sides": 0.6}))
    monkeypatch.setattr(metrics, "second_half_bits", lambda name, *args: {
        "gpt": (2.0, {}), "diffusion": (3.0, {"elbo_bits": 2.5})}[name])
    monkeypatch.setattr(metrics, "correction_probe", lambda *args, **kwargs: (0.4, 0.1))
    windows, blanks, s = torch.zeros(4, 8, dtype=torch.long), torch.ones(4, 1, dtype=torch.long), {"bayes_windows": 2}
    specials = objectives.Specials.from_meta({"specials": special_token_ids(3), "num_ordinary": 3,
                                              "num_sentinels": 100})
    read = {name: multiplier.scores(name, None, windows, blanks, specials, s, (None, None), 0)
            for name in ("gpt", "bert", "diffusion")}
    assert read["gpt"] == {"cloze": 0.7, "bits": 2.0, "elbo_bits": 2.0, "probe": 0.4}
    assert read["bert"] == {"cloze": 0.6, "probe": 0.4}
    assert read["diffusion"] == {"cloze": 0.6, "bits": 3.0, "elbo_bits": 2.5}


def hand_made_curves():
    """runs_by_multiple with gpt's figures at 1 x (two seeds) and, for each compared model, one curve per seed,
    listed with the second seed first."""
    gpt = [{"seed": 1, "bits": 2.0, "elbo_bits": 9.0, "cloze": 0.6, "probe": 0.3},
           {"seed": 2, "bits": 2.2, "elbo_bits": 9.0, "cloze": 0.7, "probe": 0.5}]
    by = {"gpt": {"1": gpt}}
    for name in ("diffusion", "prefixlm", "t5"):  # seed 1 reaches 2.1 at 2 x, seed 2 at 4 x
        key = "elbo_bits" if name == "diffusion" else "bits"
        by[name] = {"1": [{"seed": 2, key: 3.0}, {"seed": 1, key: 3.0}],
                    "2": [{"seed": 2, key: 2.5}, {"seed": 1, key: 2.1}],
                    "4": [{"seed": 2, key: 2.1}, {"seed": 1, key: 2.0}]}
    by["bert"] = {"1": [{"seed": 2, "cloze": 0.4, "probe": 0.1}, {"seed": 1, "cloze": 0.4, "probe": 0.1}],
                  "2": [{"seed": 2, "cloze": 0.5, "probe": 0.2}, {"seed": 1, "cloze": 0.65, "probe": 0.4}],
                  "4": [{"seed": 2, "cloze": 0.65, "probe": 0.4}, {"seed": 1, "cloze": 0.7, "probe": 0.5}]}
    return by


def test_the_multipliers_target_is_gpts_figure_of_the_same_metric():
    """Each row's target is gpt's 1 x figure of the metric compared (mean over seeds): diffusion's ELBO against
    gpt's exact bits (not a bound of gpt's), bert's cloze against gpt's (exact-Bayes) cloze, the probe against
    gpt's probe, prefixlm's and t5's exact bits against gpt's."""
    trained = {name: [1, 2, 4] for name in ("diffusion", "bert", "prefixlm", "t5")}
    rows = multiplier.multipliers(hand_made_curves(), [1, 2], trained)
    targets = {(row["model"], row["metric"]): row["target"] for row in rows}
    assert targets == {("diffusion", multiplier.COMPARED["diffusion"][0]): pytest.approx(2.1),
                       ("bert", multiplier.COMPARED["bert"][0]): pytest.approx(0.65),
                       ("bert", multiplier.PROBE): pytest.approx(0.4),
                       ("prefixlm", multiplier.COMPARED["prefixlm"][0]): pytest.approx(2.1),
                       ("t5", multiplier.COMPARED["t5"][0]): pytest.approx(2.1)}


def test_each_seeds_multiplier_is_read_off_its_own_curve():
    """Per seed, the crossing of that seed's curve (runs listed in any order): seed 1 reaches gpt's figure at 2 x,
    seed 2 at 4 x; a seed read off another seed's curve would give both the same multiple."""
    trained = {name: [1, 2, 4] for name in ("diffusion", "bert", "prefixlm", "t5")}
    for row in multiplier.multipliers(hand_made_curves(), [1, 2], trained):
        assert row["per_seed"] == [pytest.approx(2.0), pytest.approx(4.0)], row


# ----------------------------------------------------------------------------- plateau.py's report

def test_the_plateau_report_counts_the_runs_under_the_threshold_not_the_reference():
    """'past the control' counts the runs whose final loss is at least the margin (0.3 nats) under the context-
    free reference: 2.8 is under bert's reference 3.0 but not under its threshold 2.7, 2.6 is."""
    control = {"margin": metrics.PLATEAU_MARGIN, "character_frequencies_nats": 3.3, "reference": {"bert": 3.0},
               "threshold": {"bert": 3.0 - metrics.PLATEAU_MARGIN}}
    runs = [{"seed": seed, "objective": "mlm", "curve": [], "seconds": 1.0, "reused": False, "iterations": 100,
             "val_loss": loss, "left_at": at} for seed, loss, at in ((1, 2.8, None), (2, 2.6, 90))]
    data = {"scale": "cpu", "plateau_control": control, "variants": {"bert": runs}, "seeds": [1, 2],
            "budget_flops": 1e12, "machine": "a CPU", "seconds": 60.0}
    s = dict(plateau.SCALES["cpu"])
    row = next(line for line in plateau.report(data, s) if line.startswith("| bert |"))
    assert row.endswith("| 1/2 |"), row
    assert plateau.left_plateau([(0, 3.0), (50, 2.8), (90, 2.7), (100, 2.6)], control["threshold"]["bert"]) == 90


# ----------------------------------------------------------------------------- adaptation's controls (G1)

def continuation_data(scratch, continued):
    """adaptation's data with gpt's own validation loss per seed, from scratch (share 0) and continued (0.5)."""
    runs = [{"target": "gpt", "share": share, "seed": seed, "val_loss": loss}
            for share, losses in ((0, scratch), (0.5, continued)) for seed, loss in losses.items()]
    return {"runs": runs, "cells": []}


def test_the_continuation_control_fails_a_restart_that_costs_more_than_0_03_nats():
    """gpt continued for the rest of the budget must come within 0.03 nats of gpt from scratch: a restart that
    costs 0.05 nats fails (a 0.3 margin, or the continued run read against itself, would pass it); one that costs
    0.02 passes; a seed that did not finish fails; the per-seed differences are paired by seed."""
    assert adaptation_report.CONTINUATION_MARGIN == 0.03
    scratch = {1: 2.00, 2: 2.02}
    costly = adaptation_report.continuation_control(continuation_data(scratch, {2: 2.07, 1: 2.05}), [0.5], [1, 2])
    assert costly == {"passed": False, "own": {0: pytest.approx(2.01), 0.5: pytest.approx(2.06)}}
    cheap = continuation_data(scratch, {2: 2.04, 1: 2.02})
    assert adaptation_report.continuation_control(cheap, [0.5], [1, 2])["passed"] is True
    assert adaptation_report.seed_differences(cheap, "gpt", 0.5) == [pytest.approx(0.02), pytest.approx(0.02)]
    diverged = continuation_data(scratch, {1: 2.02, 2: None})
    assert adaptation_report.continuation_control(diverged, [0.5], [1, 2])["passed"] is False


def test_the_diffusion_model_built_from_gpt_is_held_to_the_shifted_reference(abab):
    """The adapted diffusion model never masks position 0 (shift_logits), so its own loss averages one masked
    position fewer: it is read against SHIFTED's reference (its own settings), which on "abab" with 4 positions is
    3/4 of the unshifted one (log 2 per position); a scratch diffusion run against the unshifted one."""
    assert adaptation.SHIFTED[1:] == adaptation.TARGETS["diffusion"]
    control = {"threshold": {"diffusion": 2.0, adaptation.SHIFTED[0]: 2.2}}
    assert adaptation.past_plateau_of({"target": "diffusion", "share": 0.5, "val_loss": 2.1}, control)
    assert not adaptation.past_plateau_of({"target": "diffusion", "share": 0, "val_loss": 2.1}, control)
    splits, meta = load_dataset(abab, 4, False)
    s = dict(batch_size=256, block_size=4)
    shifted = metrics.context_free_reference(adaptation.SHIFTED, splits, meta, s)
    unshifted = metrics.context_free_reference(("diffusion", "bert", "diffusion", {}), splits, meta, s)
    assert shifted == pytest.approx(0.75 * LN2, rel=0.05) and unshifted == pytest.approx(LN2, rel=0.05)


def test_the_anneal_is_a_tenth_of_the_adaptation_phase_not_of_the_whole_budget():
    """The causal mask opens over the first 10% of the adaptation phase's own steps ((1 - share) x the study's gpt
    iterations): 100 steps at share 0.5 on the CPU scale (2,000 gpt iterations), 375 at share 0.25 on the GPU
    one; the mask is full from step 99, half open at step 50; the other targets have no anneal."""
    cpu, gpu = study.SCALES["cpu"], study.SCALES["gpu"]
    run = adaptation.adaptation_run("diffusion", 0.5, 1e-3, 1337, "p", "gpt-folder", adaptation.SCALES["cpu"], cpu)
    assert run[3]["anneal_steps"] == 100 and run[3]["budget_fraction"] == 0.5 and run[3]["shift_logits"] is True
    assert masks.annealed_fraction(99, 100) == 1.0 and masks.annealed_fraction(50, 100) == pytest.approx(50 / 99)
    run = adaptation.adaptation_run("diffusion", 0.25, 1e-3, 1337, "p", "gpt-folder", adaptation.SCALES["gpu"], gpu)
    assert run[3]["anneal_steps"] == 375
    assert "anneal_steps" not in adaptation.adaptation_run("bert", 0.5, 1e-3, 1, "p", "g", adaptation.SCALES["cpu"],
                                                           cpu)[3]


def test_adaptations_common_bits_are_diffusions_elbo(monkeypatch):
    """Each backbone's bits/char on the common metric: diffusion's ELBO (as the study compares it), not its
    chain rule through [MASK]; the others' exact bits (C4)."""
    meta = {"specials": special_token_ids(3), "num_ordinary": 3, "num_sentinels": 100}
    monkeypatch.setattr(adaptation, "WORKER", {"folders": {("diffusion", 0.5, 1): "d", ("t5", 0.5, 1): "t"},
                                               "device": "cpu", "scale": "quick", "meta": meta,
                                               "windows": torch.zeros(4, 8, dtype=torch.long),
                                               "blanks": torch.ones(4, 1, dtype=torch.long),
                                               "ss": {"bayes_windows": 2}})
    monkeypatch.setattr(adaptation, "load_model", lambda path, device: (None, None))
    monkeypatch.setattr(metrics, "cloze_accuracy", lambda *args: {"both sides": 0.5})
    monkeypatch.setattr(metrics, "second_half_bits", lambda name, *args: {
        "diffusion": (3.0, {"elbo_bits": 2.5}), "t5": (2.0, {})}[name])
    assert adaptation.run_cell(("common", "diffusion", 0.5, 1))[1] == {"bits": 2.5, "cloze": 0.5}
    assert adaptation.run_cell(("common", "t5", 0.5, 1))[1] == {"bits": 2.0, "cloze": 0.5}


# ----------------------------------------------------------------------------- epochs.py (X2)

def test_the_epochs_plan_runs_every_cheap_cell_and_each_key_point_on_every_seed():
    """A cell's runs differ by seed: every epoch count up to all_seeds_up_to on both seeds, the others on the first;
    once those finished, the second seed at each series' best epoch count."""
    s = dict(epochs=(1, 2, 4), max_epochs={}, seeds=2, all_seeds_up_to=2)
    plan = epochs.plan_runs(s, [], 1337)
    cells = {}
    for series, e, seed in plan:
        cells.setdefault((series[0], e), []).append(seed)
    assert all(cells[(name, e)] == ([1337, 1338] if e <= 2 else [1337]) for name, *_ in epochs.SERIES
               for e in (1, 2, 4))
    curve = {1: 3.0, 2: 2.5, 4: 2.0}
    runs = [{"series": series[0], "epochs": e, "seed": seed, "bits_val": curve[e], "bits_train": 1.0,
             "chain_bits_val": curve[e]} for series, e, seed in plan]
    assert sorted((p[0][0], p[1], p[2]) for p in epochs.plan_runs(s, runs, 1337)) == sorted(
        (name, 4, 1338) for name, *_ in epochs.SERIES)  # 4 epochs: every series' best


def test_each_epochs_run_trains_with_its_own_seed_and_curves_diffusions_elbo(monkeypatch):
    """train_and_score hands its seed to train.py (two seeds of a cell are two trainings), and the curve of a
    diffusion row is its ELBO (its chain rule kept beside), as the paper compares (X2)."""
    configs = []

    class Model:
        def eval(self):
            return self

    def trained(config):
        configs.append(config)
        return {"interrupted": False, "model": Model(), "iter_num": 3, "tokens_seen": 300, "val_loss": 2.0,
                "train_loss": 1.9}
    monkeypatch.setattr(train, "train", trained)
    monkeypatch.setattr(train, "resolve_config", lambda argv: dict(a[2:].split("=", 1) for a in argv))
    monkeypatch.setattr(epochs, "second_half_bits", lambda name, *args: (3.0, {"elbo_bits": 2.5}))
    s, windows = epochs.SCALES["quick"], {"val": None, "train": None}
    rows = [epochs.train_and_score("diffusion", "bert", "diffusion", {}, 1, seed, s, "data", windows, None, "cpu",
                                   True, "out") for seed in (1337, 1338)]
    assert [c["seed"] for c in configs] == ["1337", "1338"] and [r["seed"] for r in rows] == [1337, 1338]
    assert rows[0]["bits_val"] == rows[0]["elbo_bits_val"] == 2.5 and rows[0]["chain_bits_val"] == 3.0


# ----------------------------------------------------------------------------- the probes' held-out items

def test_the_structural_probe_is_trained_on_the_training_vectors_and_scored_on_the_evaluation_ones(monkeypatch):
    """encoders' probe (part 1) learns from the training items only: the evaluation items here carry the
    opposite labels of the same directions, so a probe that learned from the training vectors scores 0%
    balanced accuracy on them; one that read the evaluation vectors (with either split's labels) would score
    100%. The two sets of texts are disjoint."""
    signs = [1, -1, 1, -1, -1, 1, 1, -1]
    vectors = {f"train {i}": sign for i, sign in enumerate(signs)}
    vectors.update({f"eval {i}": -sign for i, sign in enumerate(signs)})
    monkeypatch.setattr(encoders, "embed_all", lambda backbone, texts, how, span=None: torch.tensor(
        [[3.0 * vectors[t], 0.5, 0.0, 0.0] for t in texts]))
    labels = np.array([int(sign > 0) for sign in signs])
    task = {"train": [f"train {i}" for i in range(8)], "eval": [f"eval {i}" for i in range(8)],
            "train_labels": labels, "eval_labels": labels}
    assert not set(task["train"]) & set(task["eval"])
    s = dict(encoders.SCALES["quick"], probe_steps=30, head_learning_rate=1e-2)
    assert encoders.probe_cell(None, "mean", task, s, 0, False)["balanced accuracy"] == 0.0


def test_the_correction_probe_is_trained_on_the_training_windows_and_scored_on_the_test_ones():
    """metrics.correction_probe (C2, the multiplier's next-character probe): its head is fitted on the training
    windows' states only. Training windows count up, test windows count down, the states are the characters
    themselves: a head fitted on the training windows names x + 1 and scores 0 on the test windows; fitted on
    the test windows it would score 1."""
    class OneHotStates:
        def run_stack(self, windows):
            return F.one_hot(windows, 12).float()
    start = torch.randint(0, 12, (16, 1), generator=torch.Generator().manual_seed(0))
    up, down = (start + torch.arange(10)) % 12, (start - torch.arange(10)) % 12
    accuracy, _ = metrics.correction_probe(OneHotStates(), up, down, 12, seed=0, task="next character", steps=30)
    assert accuracy == 0.0
