"""Where encoders still win (experiments/encoders.py; claims E3, X1, F3, B2): the causal prefix is blind to what
follows and the bidirectional readers are not (every arch), echo pools exactly the second copy, the contrastive
loss and the ranking scores agree with plain references, the rules score what they say, no evaluation text is
fine-tuned on, a failing control reads "failed", and the command runs end to end."""
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter

import numpy as np
import pytest
import torch

from conftest import ROOT, children_of, run_killing_the_resource_tracker, run_script
from experiments import encoder_tasks, encoders, encoders_report, recipe
from experiments.finetune import Backbone, hidden_states
from model import ModelConfig, Transformer

CHARS = "\n !',.:;?ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"


class Tokenizer:
    def __init__(self):
        self.stoi = {c: i for i, c in enumerate(CHARS)}

    def encode(self, text):
        return [self.stoi[c] for c in text]


def tiny_backbone(arch):
    """A Backbone around a tiny random model of `arch` (encode as Backbone's: right-padded ids and lengths)."""
    torch.manual_seed(0)
    layers = dict(n_layer=1, n_decoder_layer=1) if arch == "t5" else dict(n_layer=2)
    model = Transformer(ModelConfig(arch=arch, vocab_size=len(CHARS) + 2, block_size=64, n_head=2, n_embd=16,
                                    **layers)).eval()
    backbone = Backbone.__new__(Backbone)
    backbone.model, backbone.tokenizer, backbone.pad, backbone.suffix = model, Tokenizer(), len(CHARS), []
    backbone.arch, backbone.device = arch, "cpu"
    return backbone


# ----------------------------------------------------------------------------- the structural fact (part 1)

@pytest.mark.parametrize("arch, how, blind", [("gpt", "mean", True), ("gpt", "echo", False), ("bert", "mean", False),
                                              ("prefixlm", "mean", False), ("t5", "mean", False)])
def test_a_causal_prefix_is_blind_to_what_follows_and_a_bidirectional_one_is_not(arch, how, blind):
    """Windows sharing their first half: gpt's pooled first-half vectors are equal to the bit, so its probe is at
    exactly 50%; every reader that has read the second half (bert, prefixlm, t5's encoder, gpt's echo) differs."""
    backbone = tiny_backbone(arch)
    s = dict(encoders.SCALES["quick"], half=8, probe_steps=20)
    firsts = ["the king", "my lord,", "good sir", "o heave,"]
    task = {"train": [], "eval": [], "train_labels": [], "eval_labels": []}
    for part in ("train", "eval"):
        for first in firsts:
            task[part] += [first + " And The", first + " and so "]
            task[f"{part}_labels"] += [1, 0]
        task[f"{part}_labels"] = np.array(task[f"{part}_labels"])
    result = encoders.probe_cell(backbone, how, task, s, 0, stop=False)
    assert result["pairs"] == len(firsts)
    if blind:
        assert result["equal pairs"] == len(firsts) and result["median difference"] == 0.0
        assert result["balanced accuracy"] == 0.5  # one prediction for both windows of a first half
    else:
        assert result["equal pairs"] == 0 and result["median difference"] > 1e-4


def test_echo_pools_exactly_the_second_copy_and_mean_the_real_characters():
    backbone = tiny_backbone("gpt")
    texts = ["to be or not", "a horse!", "my kingdom for"]  # different lengths: right padding
    with torch.no_grad():
        echo = encoders.embed(backbone, texts, "echo")
        mean = encoders.embed(backbone, texts, "mean")
        last = encoders.embed(backbone, texts, "last")
        span = encoders.embed(backbone, texts, "echo", span=(2, 5))
        for i, text in enumerate(texts):
            ids = torch.tensor([backbone.tokenizer.encode(text + text)])
            hidden = hidden_states(backbone.model, ids, torch.tensor([ids.size(1)]))[0]
            n = len(text)
            assert torch.allclose(echo[i], hidden[n:2 * n].mean(0), atol=1e-6)
            assert torch.allclose(span[i], hidden[n + 2:n + 5].mean(0), atol=1e-6)
            assert not torch.allclose(echo[i], hidden[:n].mean(0), atol=1e-4)  # not the first copy
            alone = hidden_states(backbone.model, ids[:, :n], torch.tensor([n]))[0]
            assert torch.allclose(mean[i], alone.mean(0), atol=1e-6) and torch.allclose(last[i], alone[-1], atol=1e-6)


# ----------------------------------------------------------------------------- what is measured

def test_the_contrastive_loss_is_a_plain_softmax_over_the_batch():
    g = torch.Generator().manual_seed(0)
    q, d, temperature = torch.randn(5, 7, generator=g), torch.randn(5, 7, generator=g), 0.05
    expected = 0.0
    for i in range(5):
        sims = [float(q[i] @ d[j] / (q[i].norm() * d[j].norm())) / temperature for j in range(5)]
        expected -= sims[i] - math.log(sum(math.exp(x) for x in sims))
    assert encoders.info_nce(q, d, temperature).item() == pytest.approx(expected / 5, rel=1e-5)


def plain_ranks(similarity):
    """Row i's right answer is column i; its rank counts every other column that scores at least as high."""
    return [1 + sum(similarity[i][j] >= similarity[i][i] for j in range(len(similarity[i])) if j != i)
            for i in range(len(similarity))]


def test_recall_mrr_hits_and_hard_negatives_against_plain_counts():
    similarity = np.array([[0.9, 0.1, 0.2, 0.3],   # right first
                           [0.5, 0.4, 0.6, 0.1],   # third, and its hard negative (column 0) above it
                           [0.2, 0.7, 0.7, 0.0],   # a tie with column 1: counts against it (rank 2)
                           [0.1, 0.1, 0.95, 0.3]])  # second; its hard negative (column 2) first
    r = plain_ranks(similarity)
    assert r == [1, 3, 2, 2]
    scores = encoders.recall_and_mrr(similarity)
    assert scores["recall@1"] == 0.25 and scores["mrr"] == pytest.approx(np.mean([1 / x for x in r]))
    assert encoders.hard_negative_first(similarity) == 0.5  # rows 1 and 3
    candidates = np.array([[3.0, 1.0, 2.0], [1.0, 1.0, 0.0], [0.5, 2.0, 0.1], [2.0, 1.9, 1.99]])
    assert encoders.hits_at_1(candidates) == 0.5  # a tie with the right one is a miss


def test_a_failing_control_reads_failed():
    rule = 0.5
    passed = recipe.control_outcome({"a": [0.8, 0.82, 0.81], "b": [0.9, 0.55, 0.7]}, rule)
    assert passed["best"] == "a" and passed["passed"]  # b's mean is lower
    assert not recipe.control_outcome({"a": [0.60, 0.61, 0.59]}, rule)["passed"]  # 0.60 - 0.01 < 0.6
    assert not recipe.control_outcome({"a": [0.9, 0.5, 0.7]}, rule)["passed"]  # its std eats the margin
    data = {"rules": {"retrieval": {"n-gram cosine": {"recall@1": 0.5, "hits@1": 0.5}},
                      "judge": {"n-gram logistic regression": 0.5}},
            "cells": [{"part": "retrieval", "reader": "bert (mean)", "seed": s, "recall@1": 0.55} for s in range(3)]}
    assert encoders_report.controls(data) == {"retrieval": {"best": "bert (mean)", "mean": 0.55, "std": 0.0, "rule": 0.5,
                                                     "passed": False}}


def test_the_report_shows_the_sections_of_the_parts_run():
    """A run of some parts shows their sections only, numbered as the docstring numbers the parts (the judge 3,
    the rate grid 4, shown for any fine-tuned part); no reranking section is left over."""
    s = encoders.SCALES["quick"]
    rule = {"recall@1": 0.1, "mrr": 0.2, "hard negative first": 0.3, "hits@1": 0.4}
    data = {"seeds": [1], "machine": "a machine", "seconds": 60.0, "checkpoints": {}, "steps_multiple": 1,
            "cells": [], "controls": {}, "rules": {"probe": {"n-gram rule": 0.5}, "retrieval": {"n-gram cosine": rule},
                                                   "judge": {"majority class": 0.5}},
            "task sizes": {"probe eval": 4, "eval lines": 4, "judge train": 4, "judge eval": 4}}
    for parts, numbers in ((["probe"], ["1"]), (["judge"], ["3", "4"]), (["retrieval", "flag-first"], ["2", "4"]),
                           (list(encoders.PARTS), ["1", "2", "3", "4"])):
        text = encoders_report.report(dict(data, parts=parts), s, "quick")
        assert re.findall(r"^## (\d)\.", text, flags=re.M) == numbers, parts
        assert ("whole-input judgement" in text) == ("judge" in parts) and "cross-encoder" not in text
    assert set(encoders.PARTS) == {"probe", "retrieval", "flag-first", "judge"}


def plain_cosine(a, b):
    count = lambda t: Counter(t[i:i + n] for n in (1, 2, 3) for i in range(len(t) - n + 1))  # noqa: E731
    x, y = count(a), count(b)
    return sum(x[k] * y[k] for k in x) / math.sqrt(sum(v * v for v in x.values()) * sum(v * v for v in y.values()))


def test_the_documents_and_the_rules_score_what_they_say():
    """Each line is the topic of one document and the other line of the one before (its hard negative); the flag
    names the topic, first or last; the n-gram rule's scores are those of a plain n-gram cosine, which cannot
    read the flag; a rule told the format finds every document."""
    rng = np.random.default_rng(0)
    lines = [f"line {w} of {v}" for w in ("one", "two", "six", "ten") for v in ("ham", "lear", "cor")]
    docs = encoder_tasks.documents(lines, rng)
    for i, doc in enumerate(docs):
        first, second, flag = doc.split("\n")
        assert {first, second} == {lines[i], lines[(i + 1) % len(lines)]} and flag in encoder_tasks.FLAGS
        assert (first, second)[encoder_tasks.FLAGS.index(flag)] == lines[i] == encoder_tasks.flagged_line(doc)
        moved = f"{flag}\n{first}\n{second}"
        assert encoder_tasks.flagged_line(moved, "first") == lines[i]
    sets = encoder_tasks.candidate_sets(len(lines), 5, 6, rng)
    assert (sets[:, 0] == np.arange(5)).all() and (sets[:, 1] == (np.arange(5) - 1) % len(lines)).all()
    assert all(len(set(row)) == 6 for row in sets)
    task = {"eval_lines": lines, "docs": docs, "candidate_sets": sets}
    plain = np.array([[plain_cosine(q, d) for d in docs] for q in lines])
    r = plain_ranks(plain)
    scores = encoders.rules(task, parts=("retrieval",))["retrieval"]
    assert scores["n-gram cosine"]["recall@1"] == pytest.approx(np.mean([x == 1 for x in r]))
    assert scores["n-gram cosine"]["mrr"] == pytest.approx(np.mean([1 / x for x in r]))
    assert scores["n-gram cosine of the flagged line (a rule told the format)"]["recall@1"] == 1.0
    assert scores["chance"]["recall@1"] == 1 / len(lines)


def test_agreement_and_split_windows_are_labelled_as_stated():
    text = ("Now is the winter of our discontent made glorious summer by this sun of York; and all the clouds "
            "that lour'd upon our house in the deep bosom of the ocean buried. ") * 20
    rng = np.random.default_rng(0)
    examples, labels = encoder_tasks.agreement_examples(text, 20, 20, rng)
    assert list(labels) == [0, 1] * 10
    for example, label in zip(examples, labels):
        a, b = example.split("\n")
        assert len(a) == len(b) == 20 and (a == b) == bool(label)
        if not label:  # one whole word replaced by one of the same length and case pattern
            old = [w for w in re.finditer(r"[A-Za-z]+", a) if b[w.start():w.end()] != w.group()]
            assert len(old) == 1 and 0 < old[0].start() and old[0].end() < 20, (a, b)
            new = b[old[0].start():old[0].end()]
            assert new.isalpha() and encoder_tasks.word_shape(new) == encoder_tasks.word_shape(old[0].group())
            assert b[:old[0].start()] == a[:old[0].start()] and b[old[0].end():] == a[old[0].end():]
    windows, labels = encoder_tasks.split_windows(text.replace("Now", "nOw"), 10, 8, rng)
    for k in range(0, 10, 2):  # each first half twice, the label decided by the second half
        assert windows[k][:8] == windows[k + 1][:8] and list(labels[k:k + 2]) == [1, 0]
        assert any(c.isupper() for c in windows[k][8:]) and not any(c.isupper() for c in windows[k + 1][8:])


@pytest.fixture(scope="module")
def quick_task(char_dataset):
    from experiments.tasks import read_texts
    texts = read_texts(char_dataset)
    return texts, encoder_tasks.make_tasks(texts, encoders.SCALES["quick"], 1337)


def test_the_flag_first_part_reads_the_same_documents_flag_first(quick_task, monkeypatch):
    """Part 2's control: each evaluation document with its flag line moved first, the same two lines in the same
    order, and the bi-encoder's flag-first cell ranks those (its training documents built the same way)."""
    _, task = quick_task
    for doc, moved, line in zip(task["docs"], task["docs_flag_first"], task["eval_lines"]):
        first, second, flag = doc.split("\n")
        assert moved == f"{flag}\n{first}\n{second}" and encoder_tasks.flagged_line(moved, "first") == line
    read = []
    real = encoders.embed

    def watched(backbone, texts, how, span=None):
        read.extend(texts)
        return real(backbone, texts, how, span)

    monkeypatch.setattr(encoders, "embed", watched)
    s = dict(encoders.SCALES["quick"], steps=2, learning_rate=1e-3)
    encoders.biencoder_cell(tiny_backbone("gpt"), "mean", task, s, 0, False, "first")
    documents = [t for t in read if t.count("\n") == 2]
    assert documents and all(t.split("\n")[0] in encoder_tasks.FLAGS for t in documents)
    assert set(task["docs_flag_first"]) <= set(documents) and not set(task["docs"]) & set(documents)


def texts_read_while_training(monkeypatch):
    """A list that fills with every text embedded with gradients while a fine-tuning loop (encoders.train) runs:
    what it trains on (its validation checks read the tuning items without gradients, to stop early)."""
    read, training = [], []
    real_train, real_embed = encoders.train, encoders.embed

    def watched_train(*args, **kwargs):
        training.append(True)
        try:
            return real_train(*args, **kwargs)
        finally:
            training.pop()

    def watched_embed(backbone, texts, how, span=None):
        if training and torch.is_grad_enabled():
            read.extend(texts)
        return real_embed(backbone, texts, how, span)

    monkeypatch.setattr(encoders, "train", watched_train)
    monkeypatch.setattr(encoders, "embed", watched_embed)
    return read


def test_no_evaluation_text_is_fine_tuned_on(quick_task, monkeypatch):
    """Training examples come from the training split, evaluation ones from the validation split, none in both;
    the tuning items a rate is chosen on are held out of the training ones (neither trained on nor evaluated);
    and what the fine-tuning loops read (every text embedded while a loop trains) holds no evaluation line and no
    tuning line."""
    texts, task = quick_task
    assert all(line in texts["train"].replace("\n", " ") for line in task["train_lines"] + task["tune_lines"])
    assert all(line in texts["val"].replace("\n", " ") for line in task["eval_lines"])
    for train, evaluation in (("train_lines", "eval_lines"), ("train", "eval"), ("judge_train", "judge_eval"),
                              ("train_lines", "tune_lines"), ("tune_lines", "eval_lines"),
                              ("judge_train", "judge_tune"), ("judge_tune", "judge_eval")):
        assert task[train] and task[evaluation] and not set(task[train]) & set(task[evaluation]), train
    assert len(task["judge_tune"]) == len(task["judge_tune_labels"]) == encoders.SCALES["quick"]["judge_tune"]
    assert all(encoder_tasks.flagged_line(d) == line for d, line in zip(task["tune_docs"], task["tune_lines"]))
    read = texts_read_while_training(monkeypatch)
    s = dict(encoders.SCALES["quick"], learning_rate=1e-3)
    for part in ("retrieval", "flag-first", "judge"):
        encoders.run_one(part, tiny_backbone("bert"), "mean", task, s, 0, stop=False)
    assert read
    evaluation = set(task["eval_lines"]) | {line for t in task["judge_eval"] for line in t.split("\n")}
    evaluation |= set(task["tune_lines"]) | {line for t in task["judge_tune"] for line in t.split("\n")}
    assert not [t for t in read if set(t.split("\n")) & evaluation]  # (a line is read whole or not at all)


@pytest.mark.slow
def test_the_experiment_runs_end_to_end(char_dataset, tmp_path):
    result = run_script("experiments/encoders.py", "--quick", f"--out_dir={tmp_path}", f"--dataset={char_dataset}",
                        f"--study_dir={tmp_path / 'study'}")
    assert result.returncode == 0, result.stderr[-2000:]
    data = json.loads((tmp_path / "encoders-quick.json").read_text())
    text = (tmp_path / "encoders-quick.md").read_text()
    assert "smoke run" in text and text.count("Positive control:") == 2 and data["machine"]
    rates = encoders.SCALES["quick"]["rates"]  # every fine-tuned reader at every rate of the grid
    planned = sum(len(readers) * (1 if part == "probe" else len(rates)) for part, readers in encoders.PARTS.items())
    grid = [c for c in data["cells"] if c.get("learning rate") in (None, *rates)]
    assert len(grid) == planned and set(data["controls"]) == {"retrieval", "judge"}
    beyond = [c for c in data["cells"] if c not in grid]  # the grid grown past a rate kept at its edge, never more
    assert all(c["learning rate"] in encoders.SCALES["quick"]["grown"] for c in beyond)
    assert not recipe.grow(data["cells"], encoders.SCALES["quick"]["grown"], data["seeds"])
    assert "## 4. The rate grid" in text and "rate kept" in text
    again = run_script("experiments/encoders.py", "--quick", f"--out_dir={tmp_path}", f"--dataset={char_dataset}",
                       f"--study_dir={tmp_path / 'study'}", "--reuse=True")  # every cell kept: none runs again
    assert again.returncode == 0 and "done:" not in again.stdout and "kept from the earlier run" in again.stdout
    assert json.loads((tmp_path / "encoders-quick.json").read_text())["cells"] == data["cells"]
    metric = {"probe": "balanced accuracy", "retrieval": "recall@1", "flag-first": "recall@1",
              "judge": "accuracy"}  # each part measured by its own cell
    assert all(metric[c["part"]] in c for c in data["cells"]) and set(metric) == set(encoders.PARTS)
    gpt = [c for c in data["cells"] if (c["part"], c["reader"]) == ("probe", "gpt (mean)")][0]
    assert gpt["equal pairs"] == gpt["pairs"] and gpt["balanced accuracy"] == 0.5

    # --jobs=2: the same cells, in worker processes; the multiprocessing resource tracker killed (kill -9) on the
    # way changes nothing and prints nothing (a pool's queues left it semaphores to clean: KeyError tracebacks)
    jobs = run_killing_the_resource_tracker("experiments/encoders.py", "--quick", f"--dataset={char_dataset}",
                                            f"--out_dir={tmp_path / 'jobs'}", f"--study_dir={tmp_path / 'study'}",
                                            "--jobs=2")
    assert jobs.returncode == 0 and not re.search("Traceback|Error|Warning", jobs.stderr), jobs.stderr[-2000:]
    key = lambda cell: json.dumps(cell, sort_keys=True)  # noqa: E731  (the workers finish in any order)
    cells = json.loads((tmp_path / "jobs" / "encoders-quick.json").read_text())["cells"]
    assert sorted(map(key, cells)) == sorted(map(key, data["cells"]))

    # a worker killed (kill -9, or out of memory): one line, status 1, no process left behind
    process = subprocess.Popen([sys.executable, os.path.join(ROOT, "experiments/encoders.py"), "--quick",
                                f"--dataset={char_dataset}", f"--out_dir={tmp_path / 'killed'}",
                                f"--study_dir={tmp_path / 'study'}", "--jobs=2"], cwd=ROOT, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        workers = set()
        while process.poll() is None and len(workers) < 2:
            workers = children_of(process.pid, b"spawn_main")
            time.sleep(0.05)
        assert len(workers) == 2, "the command ended before its two workers started"
        os.kill(min(workers), signal.SIGKILL)
        _, err = process.communicate(timeout=600)
    finally:
        process.kill()
    assert process.returncode == 1 and err.count("\n") == 1 and "a worker process ended with status -9" in err, err
    assert not any(os.path.exists(f"/proc/{pid}") for pid in workers)


# ----------------------------------------------------------------------------- pinned against references

def test_each_part_runs_its_own_cell():
    """run_one sends each part to its own cell: the flag-first part to the bi-encoder with the flag first (a part
    sent to the flag-last cell would repeat the retrieval column)."""
    called = []
    fake = {name: (lambda name: lambda *args, **kwargs: called.append((name, args[-1] if name == "biencoder_cell"
                                                                        else None)) or {})(name)
            for name in ("probe_cell", "biencoder_cell", "judge_cell")}
    with pytest.MonkeyPatch.context() as patch:
        for name, function in fake.items():
            patch.setattr(encoders, name, function)
        for part in encoders.PARTS:
            encoders.run_one(part, None, "mean", {}, {}, 0, False)
    assert called == [("probe_cell", None), ("biencoder_cell", "end"), ("biencoder_cell", "first"),
                      ("judge_cell", None)]


def test_both_flags_occur_about_equally_and_name_their_line(quick_task):
    """A document's flag must vary (A: about its first line, B: its second) or the flag decides nothing: both
    flags in about equal numbers, in the evaluation documents and in the training documents a batch builds."""
    _, task = quick_task
    flags = Counter(doc.split("\n")[2] for doc in task["docs"])
    assert set(flags) == set(encoder_tasks.FLAGS) and min(flags.values()) >= 0.3 * len(task["docs"]), flags
    built = encoder_tasks.documents([f"line {k:04d}" for k in range(1000)], np.random.default_rng(5))
    share = Counter(doc.split("\n")[2] for doc in built)["A"] / len(built)
    assert 0.45 < share < 0.55, share  # 1,000 fair coins: 0.5 +- 0.016
    for doc in built[:50]:
        assert encoder_tasks.flagged_line(doc) == doc.split("\n")["AB".index(doc.split("\n")[2])]


def test_every_evaluation_set_comes_from_the_validation_text(quick_task):
    """Each evaluation example is cut from the validation split and each training one from the training split
    (checked against the texts themselves: disjoint sets drawn from the wrong split would pass a disjointness
    test)."""
    texts, task = quick_task
    train, val = (texts[split].replace("\n", " ") for split in ("train", "val"))
    half = encoders.SCALES["quick"]["half"]
    for name, text in (("eval", val), ("train", train)):
        for window in task[name]:
            assert window[:half] in text and window[half:] in text, (name, window)
    for name, text in (("judge_eval", val), ("judge_train", train)):
        for example in task[name]:
            assert example.split("\n")[0] in text, (name, example)  # the unchanged line; the other may differ
    assert all(line in val for line in task["eval_lines"]) and all(line in train for line in task["train_lines"])


def test_seeds_change_the_fine_tuning_batches(quick_task):
    """Two seeds of a cell read different training batches (the same batches for every seed would leave only the
    checkpoint to vary, and the +- would understate the spread)."""
    _, task = quick_task
    s = dict(encoders.SCALES["quick"], steps=3, learning_rate=1e-3)
    read = {}
    for seed in (1, 2):
        seen = read.setdefault(seed, [])
        real = encoders.embed

        def watched(backbone, texts, how, span=None):
            seen.extend(texts)
            return real(backbone, texts, how, span)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(encoders, "embed", watched)
            patch.setattr(encoders, "embed_all", lambda backbone, texts, how, span=None: torch.zeros(len(texts), 16))
            for part in ("retrieval", "judge"):
                encoders.run_one(part, tiny_backbone("bert"), "mean", task, s, seed, False)
    assert read[1] and read[2] and read[1] != read[2]


def test_each_seed_fine_tunes_its_own_pretraining_run(char_dataset, tmp_path, monkeypatch):
    """The command's loop: every cell of seed k loads seed k's checkpoint and runs with seed k (not the first seed
    every time)."""
    import sys
    seeds = [1337, 1338]
    monkeypatch.setitem(encoders.SCALES, "quick", dict(encoders.SCALES["quick"], seeds=2))
    folders = {(model, seed): f"run-{model}-{seed}" for model in ("gpt", "bert", "prefixlm", "t5", "diffusion")
               for seed in seeds}
    monkeypatch.setattr(encoders, "study_backbones", lambda *args: (folders, {
        f"{model}, seed {seed}": {"final_val_loss": 2.0, "written": 0} for model, seed in folders}))
    loaded, ran = [], []

    class Loaded:
        def __init__(self, folder, device):
            loaded.append(folder)
    monkeypatch.setattr(encoders, "Backbone", Loaded)
    monkeypatch.setattr(encoders, "run_one", lambda part, backbone, how, task, s, seed, stop: ran.append(seed) or {})
    monkeypatch.setattr(encoders, "rules", lambda task, **kwargs: {"retrieval": {"n-gram cosine": {"recall@1": 0, "hits@1": 0}},
                                                         "judge": {"n-gram logistic regression": 0}, "probe": {}})
    monkeypatch.setattr(encoders, "report", lambda *args: "")
    monkeypatch.setattr(encoders, "plot", lambda *args: None)
    monkeypatch.setattr(sys, "argv", ["encoders.py", "--quick", f"--out_dir={tmp_path}", f"--dataset={char_dataset}",
                                      "--parts=retrieval,judge"])
    encoders.main()
    plan = [(model, seed) for part in ("retrieval", "judge") for seed in seeds
            for _ in encoders.SCALES["quick"]["rates"] for model, _ in encoders.PARTS[part]]
    assert loaded == [folders[key] for key in plan] and ran == [seed for _, seed in plan]


def test_the_judgement_rule_and_the_probe_learn_from_training_examples_only(quick_task, monkeypatch):
    """The n-gram rules are fitted on the training examples (fitted on the evaluation ones they would score far
    above what a rule can do); the structural probe is trained on the training windows' vectors: trained on a
    training set of one class it answers that class everywhere, balanced accuracy exactly 0.5 on an evaluation
    set of both classes (plain accuracy would read 0.67 there)."""
    _, task = quick_task
    fitted = []
    real = encoders.tuned_logistic_regression

    def watched(x_train, y_train, x_eval, num_classes, **kwargs):
        fitted.append((x_train.shape[0], list(y_train), x_eval.shape[0]))
        return real(x_train, y_train, x_eval, num_classes, **kwargs)
    monkeypatch.setattr(encoders, "tuned_logistic_regression", watched)
    encoders.rules(task, parts=("probe", "judge"))
    assert fitted[-1] == (len(task["judge_train"]), list(task["judge_train_labels"]), len(task["judge_eval"]))
    assert all(n == len(task["train"]) and labels == list(task["train_labels"]) for n, labels, _ in fitted[:-1])
    firsts = ["the king", "my lord,", "good sir", "o heave,", "what dos", "and the "]
    probe_task = {"train": [f + " And The" for f in firsts[:4]], "train_labels": np.array([1, 1, 1, 1]),
                  "eval": [f + tail for f in firsts[4:] for tail in (" And The", " and so ")] + firsts[:2],
                  "eval_labels": np.array([1, 0, 1, 0, 1, 1])}
    probe_task["eval"][-2:] = [f + " and so " for f in firsts[:2]]
    probe_task["eval_labels"] = np.array([1, 0, 1, 0, 0, 0])[[0, 2, 1, 3, 4, 5]]  # 2 of class 1, 4 of class 0
    result = encoders.probe_cell(tiny_backbone("bert"), "mean", probe_task,
                                 dict(encoders.SCALES["quick"], half=8, probe_steps=200), 0, False)
    assert result["balanced accuracy"] == 0.5


def test_equal_to_the_bit_means_equal_to_the_bit(monkeypatch):
    """The structural part counts pairs whose vectors are identical, not close: a difference of 1e-6 is a
    difference (a reader that read the second half at all)."""
    vectors = torch.zeros(4, 16)
    vectors[3, 0] = 1e-6  # the second pair differs by a hair
    monkeypatch.setattr(encoders, "embed_all", lambda backbone, texts, how, span=None: vectors[:len(texts)])
    task = {"train": ["a"] * 4, "train_labels": np.array([1, 0, 1, 0]), "eval": ["a"] * 4,
            "eval_labels": np.array([1, 0, 1, 0])}
    result = encoders.probe_cell(None, "mean", task, dict(encoders.SCALES["quick"], probe_steps=1), 0, False)
    assert result["equal pairs"] == 1


def test_retrieval_ranks_by_cosine_not_by_dot_product(monkeypatch):
    """Queries and documents are compared by cosine: a document with a long vector does not win by its length."""
    lines = ["q0", "q1", "q2"]
    query_vectors = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    doc_vectors = torch.tensor([[1.0, 0.1], [0.1, 1.0], [1.0, 1.0]]) * torch.tensor([[10.0], [10.0], [1.0]])
    monkeypatch.setattr(encoders, "train", lambda *args: None)
    monkeypatch.setattr(encoders, "embed_all", lambda backbone, texts, how, span=None:
                        query_vectors if texts[0] == "q0" else doc_vectors)
    task = {"train_lines": lines, "eval_lines": lines, "docs": ["d0", "d1", "d2"], "docs_flag_first": [],
            "candidate_sets": np.array([[0, 2, 1]])}
    task.update(tune_lines=lines, tune_docs=task["docs"], tune_sets=task["candidate_sets"])
    result = encoders.biencoder_cell(tiny_backbone("gpt"), "mean", task, encoders.SCALES["quick"], 0, False, "end")
    assert result["recall@1"] == 1.0  # by dot product q2 would pick a long document (score 11) over its own (2)


def test_mrr_counts_every_rank():
    """MRR over all documents: a right answer ranked 20th adds 1/20, not 0 (no cut at 10)."""
    similarity = np.eye(30)
    similarity[0, 1:20] = 2.0  # query 0's document ranks 20th
    assert encoders.recall_and_mrr(similarity)["mrr"] == pytest.approx((29 + 1 / 20) / 30)


def test_reuse_keeps_the_cells_of_the_same_settings_only(tmp_path):
    """--reuse=True keeps an earlier run's cells when every setting this code reads is the same (a setting only an
    older version had, such as the reranking part's, decides nothing; the grid's growth is a plan); one setting
    changed, or other checkpoints, and every cell runs again."""
    s = encoders.SCALES["quick"]
    data = {"seeds": [1], "parts": ["judge"], "checkpoints": {"bert, seed 1": {"written": 5}}, "settings": s}
    cells = [{"part": "judge", "reader": "bert (mean)", "seed": 1, "accuracy": 0.5}]
    path = tmp_path / "encoders-quick-judge.json"
    for earlier, kept in ((dict(s, rerank_batch=4, grown=(1e-5, 1e-1)), True), (dict(s, judge_steps=7), False),
                          (dict(s, temperature=None), False)):
        path.write_text(json.dumps(dict(data, settings=earlier, cells=cells, seconds=9.0)))
        assert encoders.earlier_cells(str(path), data) == ((cells, 9.0) if kept else ([], 0.0)), earlier
    path.write_text(json.dumps(dict(data, checkpoints={"bert, seed 1": {"written": 6}}, cells=cells, seconds=9.0)))
    assert encoders.earlier_cells(str(path), data) == ([], 0.0)


@pytest.mark.parametrize("stop_at", [0, 3])
def test_a_stop_never_replaces_a_whole_result(char_dataset, tmp_path, monkeypatch, stop_at):
    """A stop before any cell finished writes nothing (status 130); a stop later writes what finished beside the
    whole result (-partial), never over it."""
    import sys
    folders = {(model, 1337): f"run-{model}" for model in ("gpt", "bert", "prefixlm", "t5", "diffusion")}
    monkeypatch.setattr(encoders, "study_backbones", lambda *args: (folders, {
        f"{model}, seed 1337": {"final_val_loss": 2.0, "written": 0} for model, _ in folders}))
    monkeypatch.setattr(encoders, "Backbone", lambda folder, device: None)
    cells = []

    def one(part, backbone, how, task, s, seed, stop):
        if len(cells) == stop_at:
            raise KeyboardInterrupt
        cells.append(part)
        return {"balanced accuracy": 0.5, "equal pairs": 1, "pairs": 1, "median difference": 0.0}
    monkeypatch.setattr(encoders, "run_one", one)
    whole = tmp_path / "encoders-quick-probe.md"
    whole.write_text("a complete run's table\n")
    monkeypatch.setattr(sys, "argv", ["encoders.py", "--quick", f"--out_dir={tmp_path}", f"--dataset={char_dataset}",
                                      "--parts=probe"])
    if stop_at == 0:
        with pytest.raises(KeyboardInterrupt):
            encoders.main()
        assert sorted(p.name for p in tmp_path.iterdir()) == ["encoders-quick-probe.md"]
    else:
        with pytest.raises(SystemExit) as ended:
            encoders.main()
        assert ended.value.code == 130  # a stop's status, after writing what finished beside the whole result
        assert (tmp_path / "encoders-quick-probe-partial.json").exists()
        assert len(json.loads((tmp_path / "encoders-quick-probe-partial.json").read_text())["cells"]) == stop_at
    assert whole.read_text() == "a complete run's table\n"


# ----------------------------------------------------------------------------- the fine-tuning recipe (claims E3, X1)

def test_the_rate_is_chosen_on_the_tuning_items_over_seeds_never_on_the_evaluation():
    """Every reader's rate is the one of best mean tuning score over seeds (one seed's luck does not choose it);
    its evaluation scores are then reported at that rate alone, whatever the evaluation says of the others."""
    cells = []
    for seed, tuning_low, tuning_high in ((1, 0.9, 0.5), (2, 0.1, 0.6), (3, 0.2, 0.6)):  # low wins seed 1 only
        cells += [{"part": "judge", "reader": "bert (mean)", "seed": seed, "learning rate": 1e-3,
                   "tuning": tuning_low, "accuracy": 0.99},  # the evaluation favours the low rate
                  {"part": "judge", "reader": "bert (mean)", "seed": seed, "learning rate": 3e-3,
                   "tuning": tuning_high, "accuracy": 0.6 + seed / 100}]
    data = {"cells": cells, "settings": {"rates": [1e-3, 3e-3]}}
    assert recipe.kept_rates(cells) == {("judge", "bert (mean)"): 3e-3}  # mean 0.567 against 0.4
    assert recipe.kept_values(data, "judge", "bert (mean)", "accuracy") == [0.61, 0.62, 0.63]
    assert recipe.rate_kept(data["cells"], "judge", "bert (mean)") == "0.003 (edge)"
    tie = [dict(c, tuning=0.5) for c in cells]
    assert recipe.kept_rates(tie) == {("judge", "bert (mean)"): 1e-3}  # a tie keeps the lower rate
    probe = [{"part": "probe", "reader": "gpt (mean)", "seed": 1, "balanced accuracy": 0.5}]  # frozen: no rate
    assert recipe.kept_values({"cells": probe}, "probe", "gpt (mean)", "balanced accuracy") == [0.5]


def test_the_schedule_warms_up_then_decays_to_zero():
    """rate_factor: linear from 1/w to 1 over the first w = 10% of the steps, then linear to 0; and train() steps
    the optimiser at exactly those rates."""
    factors = [recipe.rate_factor(step, 100, 0.1) for step in range(100)]
    assert factors[0] == pytest.approx(0.1) and factors[9] == 1.0 and factors[10] == 1.0
    assert all(a <= b for a, b in zip(factors[:10], factors[1:10])) and factors[-1] == pytest.approx(1 / 90)
    assert all(a > b for a, b in zip(factors[10:], factors[11:]))
    backbone, seen = tiny_backbone("bert"), []
    real_step = torch.optim.AdamW.step

    def watched(self, *args, **kwargs):
        seen.append([group["lr"] for group in self.param_groups])
        return real_step(self, *args, **kwargs)
    head = torch.nn.Linear(16, 1)
    s = dict(encoders.SCALES["quick"], learning_rate=1e-3, head_learning_rate=3e-3, warmup=0.25)
    loss = lambda rng: head(encoders.embed(backbone, ["to be or"], "mean")).sum()  # noqa: E731
    try:
        torch.optim.AdamW.step = watched
        recipe.train(backbone, head, 8, s, loss, False, 0)
    finally:
        torch.optim.AdamW.step = real_step
    expected = [recipe.rate_factor(step, 8, 0.25) for step in range(8)]
    assert [pytest.approx([1e-3 * f, 3e-3 * f]) for f in expected] == seen


def test_the_grid_grows_past_a_rate_kept_at_its_edge_once():
    """A reader whose best tuning score is at the grid's highest (lowest) rate is tried one rate past it on every
    seed; one kept inside the grid is not; a reader already tried past the edge is not grown again."""
    s = dict(encoders.SCALES["cpu"])  # grid 3e-4, 1e-3, 3e-3; grown to 1e-4 or 1e-2

    def cells(reader, scores):
        return [{"part": "retrieval", "reader": reader, "seed": seed, "learning rate": rate, "tuning": score}
                for rate, score in scores.items() for seed in (1, 2)]
    top = cells("gpt (last)", {3e-4: 0.1, 1e-3: 0.2, 3e-3: 0.3})
    low = cells("bert (mean)", {3e-4: 0.3, 1e-3: 0.2, 3e-3: 0.1})
    inside = cells("t5 (mean)", {3e-4: 0.1, 1e-3: 0.3, 3e-3: 0.2})
    assert sorted(recipe.grow(top + low + inside, s["grown"], [1, 2])) == sorted(
        [("retrieval", "gpt", "last", 1, 1e-2), ("retrieval", "gpt", "last", 2, 1e-2),
         ("retrieval", "bert", "mean", 1, 1e-4), ("retrieval", "bert", "mean", 2, 1e-4)])
    grown = top + cells("gpt (last)", {1e-2: 0.5})  # still best at the new edge: reported there, not grown again
    assert recipe.grow(grown, s["grown"], [1, 2]) == []
    data = {"cells": grown, "settings": s}
    assert recipe.rate_kept(data["cells"], "retrieval", "gpt (last)") == "0.01 (edge)"
    data = {"cells": top + cells("gpt (last)", {1e-2: 0.05}), "settings": s}
    assert recipe.rate_kept(data["cells"], "retrieval", "gpt (last)") == "0.003"  # no longer at the edge of what was tried


STRUCTURAL = os.path.join(ROOT, "results", "structural")


@pytest.mark.parametrize("name", sorted(n for n in os.listdir(STRUCTURAL) if n.startswith("encoders-cpu")
                                        and n.endswith(".json")))
def test_the_committed_result_is_what_its_cells_say(name):
    """Every committed encoders run: its controls recomputed from its cells, its .md the report of its .json; each
    judgement cell trained to early stopping as it says: a check every check_every steps and at its last step,
    the steps run the last check's, stopped only after `patience` checks in a row under its best (or at the cap),
    its tuning score its best check's (the first of them, whose weights were kept) and its FLOPs the steps run
    times one step's."""
    data = json.load(open(os.path.join(STRUCTURAL, name)))
    assert data["controls"] == encoders_report.controls(data)
    with open(os.path.join(STRUCTURAL, name[:-5] + ".md"), encoding="utf-8") as f:
        assert f.read() == encoders_report.report(data, data["settings"], data["scale"]) + "\n"
    s = data["settings"]
    for cell in (c for c in data["cells"] if c["part"] == "judge"):
        assert_early_stopped(cell, s, s["judge_steps"])


def assert_early_stopped(cell, s, most):
    """A cell trained to early stopping as it says (recipe.train): a check every check_every steps and at its last
    step, the steps run the last check's, stopped only after `patience` checks in a row under its best (or at
    `most` steps), its tuning score its best check's (the first of them, whose weights were kept) and its FLOPs
    the steps run times one step's."""
    steps = [check[0] for check in cell["checks"]]
    scores = [check[1] for check in cell["checks"]]
    assert steps == sorted(steps) and all(b - a == s["check_every"] for a, b in zip(steps, steps[1:-1]))
    assert cell["steps run"] == steps[-1] <= most
    best = max(scores)
    assert cell["tuning"] == best and cell["best step"] == steps[scores.index(best)]
    level = max(i for i, v in enumerate(scores) if v == best)  # a check level with the best restarts the count
    assert steps[-1] == most or len(scores) - 1 - level == s["patience"]
    per_step = cell["flops"] / cell["steps run"]
    assert all(check[2] == pytest.approx(check[0] * per_step) for check in cell["checks"])
