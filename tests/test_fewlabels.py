"""Few labels, pretrained against from scratch (experiments/fewlabels.py; claim B2): the misspelling task changes
one word's spelling and nothing a bag of letters sees, the rule told the task reads it without labels, the twin
from scratch is the same architecture with fresh weights, the label sets are nested and kept apart from the tuning
and evaluation lines, the effect control asks for a win over both the twin and the n-gram rule by more than the
spread, and the command runs end to end (its wrong options in one line)."""
import json
import os
import re
from collections import Counter

import numpy as np
import pytest
import torch

from conftest import ROOT, run_script
from experiments import encoder_tasks, fewlabels, fewlabels_report, recipe
from experiments.redraw import drawer
from model import Transformer
from test_encoders import assert_early_stopped, tiny_backbone


@pytest.fixture(scope="module")
def texts(char_dataset):
    from experiments.tasks import read_texts
    return read_texts(char_dataset)


# ----------------------------------------------------------------------------- the task and the rules

def test_a_misspelt_line_swaps_two_letters_inside_one_whole_word(texts):
    """Label 0: a fragment of the text as written; label 1: the same letters, spaces and word lengths, with two
    neighbouring inner letters of one whole word (four letters or more, not cut by the edges) swapped into a word
    the training text never spells; half of each, alternately."""
    words = encoder_tasks.words_of(texts["train"])
    lines, labels = encoder_tasks.misspelt_lines(texts["train"], 200, 20, np.random.default_rng(0), words)
    assert list(labels) == [k % 2 for k in range(200)] and len(set(lines)) == 200
    flat = texts["train"].replace("\n", " ")
    for line, label in zip(lines, labels):
        assert len(line) == 20
        if label == 0:
            assert line in flat
            continue
        assert line not in flat
        changed = [m for m in re.finditer(r"[A-Za-z]+", line) if m.group() not in words
                   and 0 < m.start() and m.end() < len(line)]
        assert len(changed) == 1, line
        m = changed[0]
        word = m.group()
        originals = [word[:i] + word[i + 1] + word[i] + word[i + 2:] for i in range(1, len(word) - 2)]
        assert len(word) >= 4 and any(line[:m.start()] + w + line[m.end():] in flat and w in words
                                      for w in originals), line
        assert Counter(line) == Counter(next(line[:m.start()] + w + line[m.end():] for w in originals
                                             if w in words))
    # a swap that spells another word ("from" -> "form") is no misspelling: only "bread" may be misspelt here
    text = "from form bread " * 40
    lines, labels = encoder_tasks.misspelt_lines(text, 6, 15, np.random.default_rng(0), {"from", "form", "bread"})
    assert all(re.search(r"\b(berad|braed)\b", line) for line in lines[1::2])


def test_the_rule_told_the_task_reads_it_without_labels_and_the_task_is_split_apart(texts):
    """The told rule (an unknown spelling of a whole word) catches every misspelt line and is right on most of the
    others, which shows the task is well posed; the label sets are nested (N lines: the first N), the tuning lines
    come after the largest, and no evaluation line is a training or tuning line."""
    s = dict(fewlabels.SCALES["cpu"], labels=(100, 300), tune=100, eval=400)
    task = fewlabels.make_task(texts, s, 1337)
    assert len(task["train"]) == 300 and len(task["tune"]) == 100 and len(task["eval"]) == 400
    assert not set(task["eval"]) & (set(task["train"]) | set(task["tune"]))
    assert not set(task["tune"]) & set(task["train"])
    told = fewlabels.told_rule(task["eval"], task["words"])
    assert (told == task["eval_labels"]).mean() > 0.85  # (its misses: words of the validation text that the
    assert (told[task["eval_labels"] == 1] == 1).all()  # training text never spells); every misspelling caught
    assert (fewlabels.told_rule(task["eval"], set()) == 1).mean() > 0.9  # the words it knows are what decide


def plain_surprise(backbone, line):
    """The highest loss of the model's own predictions of a line's characters, one at a time: gpt reads the
    characters before t alone; bert reads the whole line with character t replaced by [MASK]."""
    ids = torch.tensor([backbone.tokenizer.encode(line)])
    losses = []
    with torch.no_grad():
        for t in range(1 if backbone.arch == "gpt" else 0, ids.size(1)):
            if backbone.arch == "gpt":
                logits = backbone.model.logits(backbone.model.run_stack(ids[:, :t]))[0, -1]
            else:
                masked = ids.clone()
                masked[0, t] = backbone.mask
                logits = backbone.model.logits(backbone.model.run_stack(masked))[0, t]
            losses.append(float(torch.nn.functional.cross_entropy(logits, ids[0, t])))
    return max(losses)


@pytest.mark.parametrize("arch", fewlabels.SURPRISED)
def test_a_models_own_surprise_against_a_plain_loop(arch):
    """The batched surprise (lines of other lengths padded together) is the plain one-prediction-at-a-time loop's,
    for gpt (each character from those before it) and bert (each character masked in turn)."""
    backbone = tiny_backbone(arch)
    backbone.mask = backbone.pad + 1
    lines = ["the king is dead", "my lord", "ab"]
    batched = fewlabels.highest_surprise(backbone, lines)
    assert batched == pytest.approx([plain_surprise(backbone, line) for line in lines], abs=1e-4)


def test_the_threshold_is_the_one_that_labels_the_training_lines_best():
    """Against a brute force over every cut between training scores: the same predictions on the evaluation
    scores; a separable training set is labelled right."""
    rng = np.random.default_rng(0)
    train, labels = rng.normal(size=40), rng.integers(0, 2, 40)
    evaluation = rng.normal(size=200)
    cuts = sorted(set(train))
    best = max([cuts[0] - 1] + [(a + b) / 2 for a, b in zip(cuts, cuts[1:])],
               key=lambda cut: (((train > cut) == labels).mean(), -cut))
    assert (fewlabels.threshold_rule(train, labels, evaluation) == (evaluation > best)).all()
    assert (fewlabels.threshold_rule(np.array([1.0, 2, 3, 4]), np.array([0, 0, 1, 1]), np.array([2.4, 2.6]))
            == [0, 1]).all()


# ----------------------------------------------------------------------------- the twin from scratch

def test_the_twin_is_the_same_architecture_with_fresh_weights(monkeypatch):
    """A "from scratch" cell fine-tunes a model of the backbone's config whose weights are a fresh draw (no matrix
    equal to the backbone's, the same draw for the same seed); a "pretrained" cell the backbone's own weights. Both
    read the first N training lines."""
    monkeypatch.setattr(fewlabels, "Backbone", lambda folder, device: tiny_backbone("bert"))  # its "pretraining"
    seen = []
    monkeypatch.setattr(fewlabels, "classifier_cell", lambda backbone, how, splits, steps, length, s, seed, stop:
                        seen.append((backbone.model, splits[0][0])) or {})
    task = {"train": [f"line {k}" for k in range(10)], "train_labels": np.arange(10) % 2, "tune": ["a"],
            "tune_labels": np.array([0]), "eval": ["b"], "eval_labels": np.array([1])}
    fewlabels.prepare({}, dict(fewlabels.SCALES["quick"]), {("bert", 5): "folder"}, "cpu", task=task)
    for part in ("4 pretrained", "4 from scratch", "6 from scratch"):
        fewlabels.run_cell((part, "bert", "mean", 5, 1e-3))
    (pretrained, read0), (scratch, read1), (again, read2) = seen
    assert read0 == read1 == task["train"][:4] and read2 == task["train"][:6]
    own = tiny_backbone("bert").model.state_dict()
    assert all(torch.equal(v, own[k]) for k, v in pretrained.state_dict().items())
    assert scratch.config == pretrained.config and type(scratch) is type(pretrained)
    matrices = [k for k, v in scratch.state_dict().items() if v.dim() == 2]
    assert matrices and not any(torch.equal(scratch.state_dict()[k], own[k]) for k in matrices)
    assert all(torch.equal(v, again.state_dict()[k]) for k, v in scratch.state_dict().items())


def test_the_twins_of_bert_and_prefixlm_are_one_network():
    """From the same fresh weights, bert's reader (padding keys masked) and prefixlm's (the whole input its
    bidirectional prefix) give the same states at every real position, padded or not (claim A2: another mask, and
    here not even that): their twins from scratch differ by nothing, so only pretraining can tell them apart."""
    from experiments.encoders import embed
    def twin(arch):  # as fewlabels.run_cell makes it
        backbone = tiny_backbone(arch)
        torch.manual_seed(0)
        backbone.model = Transformer(backbone.model.config)
        return backbone

    lines = ["the king is dead", "my lord", "a"]
    with torch.no_grad():
        bert, prefixlm, gpt = (embed(twin(arch), lines, "mean") for arch in ("bert", "prefixlm", "gpt"))
    assert torch.allclose(bert, prefixlm, atol=1e-6)
    assert not torch.allclose(gpt, bert, atol=1e-3)  # the causal mask: other states from the same weights


# ----------------------------------------------------------------------------- the effect control

def cells(part, reader, accuracy, rate=1e-3, tuning=0.5):
    return [{"part": part, "reader": reader, "seed": seed, "learning rate": rate, "tuning": tuning, "accuracy": a}
            for seed, a in enumerate(accuracy)]


def test_the_effect_control_asks_for_a_win_over_the_twin_and_the_rule():
    """Passed only when some pretrained reader's mean - std is above both its twin's mean + std and the n-gram rule
    on the same labels, at the rates kept: a win inside the spreads, a win under the rule, or a win at a rate not
    kept does not pass it."""
    bert, gpt = "bert (mean)", "gpt (last)"
    rules = {"10": {"n-gram logistic regression": 0.6}, "30": {"n-gram logistic regression": 0.75}}
    data = lambda c: {"cells": c, "settings": {"labels": (10, 30)}, "rules": rules}  # noqa: E731
    close = cells("10 pretrained", bert, [0.7, 0.8, 0.6]) + cells("10 from scratch", bert, [0.55, 0.65, 0.45])
    not_kept = cells("10 pretrained", gpt, [0.99] * 3, rate=3e-3, tuning=0.1) + \
        cells("10 pretrained", gpt, [0.5] * 3) + cells("10 from scratch", gpt, [0.5, 0.51, 0.49])
    under_rule = cells("30 pretrained", bert, [0.72, 0.73, 0.71]) + cells("30 from scratch", bert, [0.5] * 3)
    out = fewlabels_report.controls(data(close + not_kept + under_rule))
    assert out["10, gpt (last)"]["pretrained"] == pytest.approx(0.5)  # at the rate kept
    assert not any(v["pretrained wins"] for k, v in out.items() if k != "effect control passed")
    assert not out["effect control passed"]
    wins = cells("10 pretrained", bert, [0.8, 0.85, 0.75]) + cells("10 from scratch", bert, [0.55, 0.65, 0.45])
    out = fewlabels_report.controls(data(wins + not_kept + under_rule))
    assert out["10, bert (mean)"]["pretrained wins"] and out["effect control passed"]


# ----------------------------------------------------------------------------- the command

@pytest.mark.parametrize("option, needle", [("--seeed=3", "unknown option --seeed: did you mean --seed?"),
                                            ("--study_dir=README.md", "--study_dir=README.md is a file")])
def test_a_wrong_option_or_study_folder_is_one_line(tmp_path, option, needle):
    """Refused before any work: one line, status 2, no traceback, no output folder made."""
    result = run_script("experiments/fewlabels.py", "--quick", option, f"--out_dir={tmp_path / 'o'}")
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert needle in lines[0] and not (tmp_path / "o").exists()


@pytest.mark.parametrize("stop_at", [0, 3])
def test_a_stop_never_replaces_a_whole_result(char_dataset, tmp_path, monkeypatch, stop_at):
    """A stop before any cell finished writes nothing (status 130 from run_main); a stop later writes what
    finished beside the whole result (-partial, its report saying so), never over it."""
    import sys
    folders = {(model, 1337): f"run-{model}" for model in ("gpt", "bert", "prefixlm", "t5", "diffusion")}
    monkeypatch.setattr(fewlabels, "study_backbones", lambda *args: (folders, {
        f"{model}, seed 1337": {"final_val_loss": 2.0, "written": 0} for model, _ in folders}))
    monkeypatch.setattr(fewlabels, "surprise_readers", lambda folders, seeds, task, s, device: {
        model: {str(n): [0.5] for n in s["labels"]} for model in fewlabels.SURPRISED})
    monkeypatch.setattr(fewlabels, "Backbone", lambda folder, device: tiny_backbone("bert"))
    cells = []

    def one(backbone, how, splits, steps, length, s, seed, stop):
        if len(cells) == stop_at:
            raise KeyboardInterrupt
        cells.append(how)
        return {"accuracy": 0.5, "tuning": 0.5, "steps run": 2, "best step": 2, "flops": 1.0,
                "checks": [[2, 0.5, 1.0]]}
    monkeypatch.setattr(fewlabels, "classifier_cell", one)
    whole = tmp_path / "fewlabels-quick.md"
    whole.write_text("a complete run's table\n")
    monkeypatch.setattr(sys, "argv", ["fewlabels.py", "--quick", f"--out_dir={tmp_path}", f"--dataset={char_dataset}"])
    if stop_at == 0:
        with pytest.raises(KeyboardInterrupt):
            fewlabels.main()
        assert sorted(p.name for p in tmp_path.iterdir()) == ["fewlabels-quick.md"]
    else:
        with pytest.raises(SystemExit) as ended:
            fewlabels.main()
        assert ended.value.code == 130
        data = json.loads((tmp_path / "fewlabels-quick-partial.json").read_text())
        assert len(data["cells"]) == stop_at
        assert "Interrupted: 3 of" in (tmp_path / "fewlabels-quick-partial.md").read_text()
    assert whole.read_text() == "a complete run's table\n"


@pytest.mark.slow
def test_the_experiment_runs_end_to_end(char_dataset, tmp_path):
    """Every (label count, start, reader, seed, rate) cell of the grid runs to early stopping, and the JSON alone
    gives back the controls and the report written beside it."""
    result = run_script("experiments/fewlabels.py", "--quick", f"--out_dir={tmp_path}", f"--dataset={char_dataset}",
                        f"--study_dir={tmp_path / 'study'}")
    assert result.returncode == 0, result.stderr[-2000:]
    data = json.loads((tmp_path / "fewlabels-quick.json").read_text())
    text = (tmp_path / "fewlabels-quick.md").read_text()
    assert "smoke run" in text and "Effect control" in text and data["machine"]
    assert data["controls"] == fewlabels_report.controls(data)
    assert fewlabels_report.report(data) + "\n" == text
    assert drawer("fewlabels-quick") is fewlabels_report.plot
    s = fewlabels.SCALES["quick"]
    grid = [c for c in data["cells"] if c["learning rate"] in s["rates"]]
    assert len(grid) == len(fewlabels.parts(s)) * len(fewlabels.READERS) * s["seeds"] * len(s["rates"])
    assert not recipe.grow(data["cells"], s["grown"], data["seeds"])
    assert set(data["rules"]) == {str(n) for n in s["labels"]} | {"told"}


STRUCTURAL = os.path.join(ROOT, "results", "structural")


@pytest.mark.parametrize("name", sorted(n for n in os.listdir(STRUCTURAL) if n.startswith("fewlabels-cpu")
                                        and n.endswith(".json")))
def test_the_committed_result_is_what_its_cells_say(name):
    """Every committed run: its controls recomputed from its cells, its .md the report of its .json, each cell
    trained to early stopping as it says."""
    data = json.load(open(os.path.join(STRUCTURAL, name)))
    assert data["controls"] == fewlabels_report.controls(data)
    with open(os.path.join(STRUCTURAL, name[:-5] + ".md"), encoding="utf-8") as f:
        assert f.read() == fewlabels_report.report(data) + "\n"
    s = data["settings"]
    for cell in data["cells"]:
        assert_early_stopped(cell, s, s["max_steps"])
