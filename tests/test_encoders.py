"""Where encoders still win (experiments/encoders.py; claims E3, X1, F3, B2): the causal prefix is blind to what
follows and the bidirectional readers are not (every arch), echo pools exactly the second copy, the contrastive
loss and the ranking scores agree with plain references, the rules score what they say, no evaluation text is
fine-tuned on, a failing control reads "failed", and the command runs end to end."""
import json
import math
import re
from collections import Counter

import numpy as np
import pytest
import torch

from conftest import run_script
from experiments import encoder_tasks, encoders
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
    passed = encoders.control_outcome({"a": [0.8, 0.82, 0.81], "b": [0.9, 0.55, 0.7]}, rule)
    assert passed["best"] == "a" and passed["passed"]  # b's mean is lower
    assert not encoders.control_outcome({"a": [0.60, 0.61, 0.59]}, rule)["passed"]  # 0.60 - 0.01 < 0.6
    assert not encoders.control_outcome({"a": [0.9, 0.5, 0.7]}, rule)["passed"]  # its std eats the margin
    data = {"rules": {"retrieval": {"n-gram cosine": {"recall@1": 0.5, "hits@1": 0.5}},
                      "judge": {"n-gram logistic regression": 0.5}},
            "cells": [{"part": "retrieval", "reader": "bert (mean)", "seed": s, "recall@1": 0.55} for s in range(3)]}
    assert encoders.controls(data) == {"retrieval": {"best": "bert (mean)", "mean": 0.55, "std": 0.0, "rule": 0.5,
                                                     "passed": False}}


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
    s = dict(encoders.SCALES["quick"], steps=2)
    encoders.biencoder_cell(tiny_backbone("gpt"), "mean", task, s, 0, False, "first")
    documents = [t for t in read if t.count("\n") == 2]
    assert documents and all(t.split("\n")[0] in encoder_tasks.FLAGS for t in documents)
    assert set(task["docs_flag_first"]) <= set(documents) and not set(task["docs"]) & set(documents)


def test_no_evaluation_text_is_fine_tuned_on(quick_task, monkeypatch):
    """Training examples come from the training split, evaluation ones from the validation split, none in both;
    and what the fine-tuning loops read (every text embedded while a loop trains) holds no evaluation line."""
    texts, task = quick_task
    assert all(line in texts["train"].replace("\n", " ") for line in task["train_lines"])
    assert all(line in texts["val"].replace("\n", " ") for line in task["eval_lines"])
    for train, evaluation in (("train_lines", "eval_lines"), ("train", "eval"), ("judge_train", "judge_eval")):
        assert task[train] and task[evaluation] and not set(task[train]) & set(task[evaluation]), train
    read, training = [], []
    real_train, real_embed = encoders.train, encoders.embed

    def watched_train(*args, **kwargs):
        training.append(True)
        try:
            return real_train(*args, **kwargs)
        finally:
            training.pop()

    def watched_embed(backbone, texts, how, span=None):
        if training:
            read.extend(texts)
        return real_embed(backbone, texts, how, span)

    monkeypatch.setattr(encoders, "train", watched_train)
    monkeypatch.setattr(encoders, "embed", watched_embed)
    s = dict(encoders.SCALES["quick"], timing_repeats=1)
    task = dict(task, first_seed=-1)  # no timing here
    for part in ("retrieval", "flag-first", "reranking", "judge"):
        encoders.run_one(part, tiny_backbone("bert"), "mean", task, s, 0, stop=False)
    assert read
    evaluation = set(task["eval_lines"]) | {line for t in task["judge_eval"] for line in t.split("\n")}
    assert not [t for t in read if set(t.split("\n")) & evaluation]  # (a line is read whole or not at all)


def test_the_experiment_runs_end_to_end(char_dataset, tmp_path):
    result = run_script("experiments/encoders.py", "--quick", f"--out_dir={tmp_path}", f"--dataset={char_dataset}",
                        f"--study_dir={tmp_path / 'study'}")
    assert result.returncode == 0, result.stderr[-2000:]
    data = json.loads((tmp_path / "encoders-quick.json").read_text())
    text = (tmp_path / "encoders-quick.md").read_text()
    assert "smoke run" in text and text.count("Positive control:") == 3 and data["machine"]
    planned = sum(len(readers) for readers in encoders.PARTS.values())
    assert len(data["cells"]) == planned and set(data["controls"]) == {"retrieval", "reranking", "judge"}
    metric = {"probe": "balanced accuracy", "retrieval": "recall@1", "flag-first": "recall@1", "reranking": "hits@1",
              "judge": "accuracy"}  # each part measured by its own cell
    assert all(metric[c["part"]] in c for c in data["cells"]) and set(metric) == set(encoders.PARTS)
    gpt = [c for c in data["cells"] if (c["part"], c["reader"]) == ("probe", "gpt (mean)")][0]
    assert gpt["equal pairs"] == gpt["pairs"] and gpt["balanced accuracy"] == 0.5
    priced = [c for c in data["cells"] if "ms per query" in c]
    assert len(priced) == len(encoders.CROSS_READERS) and all(v > 0 for c in priced for v in c["ms per query"].values())
