"""Rerankers as they are used (experiments/rerankers.py; claims E3, X1): hits@1 on the first stage's lists agrees
with a plain loop, the cross-encoder reads the pair together while the bi-encoder compares two vectors made apart,
both learn from the same examples, the tasks keep evaluation and tuning items apart, early stopping keeps the best
check's weights, the FLOPs are the model's own count, the effect control asks for a win on the interaction task,
and the command runs end to end (its wrong options and folders in one line)."""
import itertools
import json
import os
from collections import Counter

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from conftest import ROOT, run_script
from experiments import encoder_tasks, encoders, recipe, rerankers, rerankers_report
from experiments.redraw import drawer
from model import ModelConfig, Transformer
from objectives import Batch, clm, mlm, synthetic_specials
from test_encoders import assert_early_stopped, tiny_backbone


@pytest.fixture(scope="module")
def quick_tasks(char_dataset):
    from experiments.tasks import read_texts
    texts = read_texts(char_dataset)
    return texts, rerankers.make_tasks(texts, rerankers.SCALES["quick"], 1337)


# ----------------------------------------------------------------------------- hits@1 on the first stage's lists

def plain_hits(table, lists, answer):
    """Query by query: a hit when its right document is in its list and every other candidate scores lower."""
    hits = 0
    for i, row in enumerate(lists):
        if answer[i] in row:
            mine = table[i][list(row).index(answer[i])]
            hits += all(table[i][k] < mine for k, j in enumerate(row) if j != answer[i])
    return hits / len(lists)


def a_split(rng):
    """Six queries over eight documents: query 1's document is not in its list (while its list's first scores
    highest), query 2's ties with another candidate; the rest drawn at random."""
    lists = np.array([[0, 1, 2, 3], [4, 5, 6, 7], [2, 3, 1, 0]] + [rng.permutation(8)[:4] for _ in range(3)])
    answer = np.array([0, 1, 2] + [row[rng.integers(4)] for row in lists[3:]])
    return {"queries": [f"q{i}" for i in range(6)], "docs": [f"d{j}" for j in range(8)], "answer": answer,
            "lists": lists}


def test_list_hits_against_a_plain_loop(monkeypatch):
    """Both rerankers' hits@1 is the plain per-query count: a right document absent from the list is a miss, a
    tie with it counts against it (scores from a table: the cross-encoder's pair by pair, the bi-encoder's from
    one vector per text)."""
    rng = np.random.default_rng(0)
    split = a_split(rng)
    pair_score = {(q, d): float(rng.integers(3)) for q in split["queries"] for d in split["docs"]}  # ties
    pair_score.update({("q0", "d0"): 9.0, ("q1", "d4"): 9.0, ("q2", "d2"): 5.0, ("q2", "d3"): 5.0})
    monkeypatch.setattr(rerankers, "scores", lambda backbone, head, kind, how, queries, docs, temperature:
                        torch.tensor([pair_score[(q, d)] for q, d in zip(queries, docs)]))
    table = [[pair_score[(q, split["docs"][j])] for j in row] for q, row in zip(split["queries"], split["lists"])]
    expected = plain_hits(table, split["lists"], split["answer"])
    assert 0 < expected < 1
    s = rerankers.SCALES["quick"]
    assert rerankers.list_hits(None, None, "cross-encoder", "mean", split, s) == pytest.approx(expected)

    vectors = {text: rng.normal(size=5) for text in split["queries"] + split["docs"]}
    vectors["d3"] = 2 * vectors["d2"]  # the same direction: q2's right document ties with d3
    vectors["d4"] = vectors["q1"]  # first in q1's list, which lacks q1's document
    monkeypatch.setattr(rerankers, "embed_all", lambda backbone, texts, how:
                        torch.tensor(np.stack([vectors[t] for t in texts]), dtype=torch.float32))
    cosine = lambda a, b: a @ b / np.linalg.norm(a) / np.linalg.norm(b)  # noqa: E731
    table = [[cosine(vectors[q], vectors[split["docs"][j]]) for j in row]
             for q, row in zip(split["queries"], split["lists"])]
    expected = plain_hits(table, split["lists"], split["answer"])
    assert 0 < expected < 1 and table[2][0] == pytest.approx(table[2][1])
    assert rerankers.list_hits(None, None, "bi-encoder", "mean", split, s) == pytest.approx(expected)


# ----------------------------------------------------------------------------- the two rerankers

@pytest.mark.parametrize("arch, how", [("bert", "mean"), ("gpt", "last")])
def test_the_cross_encoder_reads_the_pair_together_the_bi_encoder_apart(arch, how):
    """A cross-encoder's score is not a sum of what the query and the document give alone: s(q1, d1) + s(q2, d2)
    differs from s(q1, d2) + s(q2, d1) (a cross-encoder with its interaction removed would be equal). The
    bi-encoder's score is the cosine of two vectors, each made from its own text alone, / temperature."""
    backbone, temperature = tiny_backbone(arch), 0.05
    torch.manual_seed(1)
    head = torch.nn.Linear(backbone.model.config.n_embd, 1)
    queries, docs = ["to be or", "not to"], ["that is the", "question, whether"]
    with torch.no_grad():
        def cross(i, j):
            return rerankers.scores(backbone, head, "cross-encoder", how, [queries[i]], [docs[j]], temperature).item()
        assert abs(cross(0, 0) + cross(1, 1) - cross(0, 1) - cross(1, 0)) > 1e-4
        pairs = list(itertools.product(queries, docs))
        bi = rerankers.scores(backbone, None, "bi-encoder", how, [q for q, _ in pairs], [d for _, d in pairs],
                              temperature)
        for (q, d), score in zip(pairs, bi):
            alone = F.cosine_similarity(encoders.embed(backbone, [q], how), encoders.embed(backbone, [d], how))
            assert abs(score.item() * temperature - alone.item()) < 1e-5


def pairs_trained_on(kind, task, s):
    """The (query, document) pairs of every training step of a reranker_cell, in order: what its batch_loss embeds
    with gradients (validation reads the tuning lists without). The bi-encoder embeds each query once, then its
    documents; the cross-encoder embeds "query\\ndocument" (a query is one line)."""
    read, real = [], rerankers.embed

    def watched(backbone, texts, how, span=None):
        if torch.is_grad_enabled():
            read.append(list(texts))
        return real(backbone, texts, how, span)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(rerankers, "embed", watched)
        rerankers.reranker_cell(tiny_backbone("bert"), kind, "mean", task, s, 0, False)
    if kind == "cross-encoder":
        return [tuple(text.split("\n", 1)) for texts in read for text in texts]
    group = s["negatives"] + 1
    return [(queries[i // group], doc) for queries, docs in zip(read[::2], read[1::2]) for i, doc in enumerate(docs)]


@pytest.mark.parametrize("task_name", rerankers.TASKS)
def test_both_rerankers_train_on_the_same_examples(quick_tasks, task_name):
    """Same seed, same examples: each training query with its own document first, then `negatives` distinct hard
    negatives from its own first-stage list, never its document; no tuning query among them."""
    task = quick_tasks[1][task_name]
    s = dict(rerankers.SCALES["quick"], learning_rate=1e-3, max_steps=3, check_every=3)
    bi, cross = (pairs_trained_on(kind, task, s) for kind in rerankers.KINDS)
    group = s["negatives"] + 1
    assert bi == cross and len(bi) == s["max_steps"] * s["queries_per_step"] * group
    train = task["train"]
    for k in range(0, len(bi), group):
        query, positive = bi[k]
        negatives = [doc for q, doc in bi[k + 1:k + group]]
        assert all(q == query for q, _ in bi[k:k + group]) and len(set(negatives)) == s["negatives"]
        assert query not in task["tune"]["queries"]
        assert any(train["docs"][train["answer"][i]] == positive and positive not in negatives
                   and set(negatives) <= {train["docs"][j] for j in train["lists"][i]}
                   for i, q in enumerate(train["queries"]) if q == query), (query, positive, negatives)


# ----------------------------------------------------------------------------- the tasks

def source_lines(name, split, s):
    """The text lines a split is made of: a flag document's two lines; a detail group's line, each of its
    characters the one most of the group's near duplicates hold (each changes a letter at its own place)."""
    if name == "flag":
        return [line for doc in split["docs"] for line in doc.split("\n")[:2]]
    groups = [split["docs"][g:g + s["size"]] for g in range(0, len(split["docs"]), s["size"])]
    return ["".join(Counter(column).most_common(1)[0][0] for column in zip(*group)) for group in groups]


def test_the_tasks_keep_evaluation_and_tuning_items_apart(quick_tasks):
    """Evaluation items come from the validation text, training and tuning items from the training text; the
    tuning queries (early stopping, the rate) are held out of the training ones; each query's document holds it;
    and the first stage's lists hold the right document for most queries (else reranking decides little)."""
    texts, tasks = quick_tasks
    s = rerankers.SCALES["quick"]
    train_text, val_text = (texts[split].replace("\n", " ") for split in ("train", "val"))
    for name, task in tasks.items():
        train, tune = task["train"], task["tune"]
        assert len(tune["queries"]) == s["tune_queries"] and train["queries"]
        assert not set(train["queries"]) & set(tune["queries"]) and not set(train["answer"]) & set(tune["answer"])
        for split, text in ((train, train_text), (tune, train_text), (task["eval"], val_text)):
            lines = source_lines(name, split, s)
            assert lines and all(line in text for line in lines), name
            assert split["lists"].shape == (len(split["queries"]), s["candidates"])
            assert rerankers.rule_scores(split)["the right document in the list (the ceiling)"] > 0.5, name
            for query, j in zip(split["queries"], split["answer"]):
                assert query in split["docs"][j]
                assert name == "detail" or encoder_tasks.flagged_line(split["docs"][j]) == query
        eval_lines = set(source_lines(name, task["eval"], s))
        assert not eval_lines & set(source_lines(name, train, s)), name


# ----------------------------------------------------------------------------- early stopping, FLOPs

def test_early_stopping_stops_after_patience_checks_and_keeps_the_best_weights():
    """train(validate=...): a check every check_every steps and at the last; after `patience` checks in a row under
    the best score (one level with it restarts the count) it stops, returns every check, and puts back the weights
    of the first check of the best score; a score that keeps rising runs every step and keeps the last."""
    torch.manual_seed(0)
    x = torch.randn(8, 3)
    s = {"head_learning_rate": 0.05, "warmup": 0.1, "check_every": 1, "patience": 2}

    def run(steps, scores, **settings):
        head, seen, scores = torch.nn.Linear(3, 1), [], iter(scores)

        def validate():
            seen.append(head.weight.detach().clone())
            return next(scores)
        checks = recipe.train(None, head, steps, dict(s, **settings), lambda rng: (head(x) - 1).pow(2).mean(),
                              False, 0, validate=validate)
        return checks, head, seen
    checks, head, seen = run(20, itertools.chain([0.1, 0.5, 0.5, 0.4], itertools.repeat(0.3)))
    assert checks == [(1, 0.1), (2, 0.5), (3, 0.5), (4, 0.4), (5, 0.3)]
    assert torch.equal(head.weight, seen[1]) and not torch.equal(seen[1], seen[-1]) and not head.training
    checks, head, seen = run(5, itertools.count(), check_every=2)
    assert checks == [(2, 0), (4, 1), (5, 2)] and torch.equal(head.weight, seen[-1])


def tiny_model(arch, **layers):
    return Transformer(ModelConfig(arch=arch, vocab_size=200, block_size=32, n_layer=2, n_head=2, n_embd=16, **layers))


@pytest.mark.parametrize("arch", ["gpt", "bert"])
def test_step_flops_is_the_models_own_count_less_the_output_head(arch):
    """encoders.step_flops (what each fine-tuning step costs, rerankers.py's FLOPs): model.training_flops of a
    batch of its objective (built as equal_compute.flops_budget builds gpt's) less the output head's 6 * tokens *
    vocab * n_embd, which a reader does not run."""
    model, specials = tiny_model(arch), synthetic_specials(200)
    windows = torch.randint(0, specials.num_ordinary, (3, 25))
    batch = clm(windows) if arch == "gpt" else mlm(windows, specials, torch.Generator().manual_seed(0))
    B, T = batch.inputs.shape
    head = 6 * B * T * model.config.vocab_size * model.config.n_embd
    assert encoders.step_flops(model, B, T) == model.training_flops(batch) - head


def test_step_flops_of_t5_counts_its_encoder_only():
    """t5 reads with its encoder: its training_flops of the encoder's tokens alone (no decoder input) less the
    decoder's cross-attention keys and values made from them; the decoder's size changes nothing."""
    models = [tiny_model("t5", n_decoder_layer=layers) for layers in (1, 3)]
    B, T = 3, 24
    inputs = torch.zeros(B, T, dtype=torch.long)
    encoder_only = models[0].training_flops(Batch(inputs=inputs, targets=inputs[:, :0], decoder_inputs=inputs[:, :0]))
    cross_kv = sum(p.numel() for b in models[0].decoder_blocks for p in b.cross_attention.key_value.parameters())
    assert encoders.step_flops(models[0], B, T) == encoder_only - 6 * B * T * cross_kv
    assert encoders.step_flops(models[1], B, T) == encoders.step_flops(models[0], B, T)


# ----------------------------------------------------------------------------- the effect control

def cells(part, reader, hits, rate=1e-3, tuning=0.5):
    return [{"part": part, "reader": reader, "seed": seed, "learning rate": rate, "tuning": tuning, "hits@1": h}
            for seed, h in enumerate(hits)]


def test_the_effect_control_asks_for_a_win_on_the_interaction_task():
    """Passed only when some reader's cross-encoder on the detail task has mean - std above its own bi-encoder's
    mean + std, at the rates kept: a clear win on the flag task, a win inside the spreads, or a better score at a
    rate not kept, does not pass it."""
    bert, gpt = "bert (mean)", "gpt (last)"
    flag = cells("flag bi-encoder", bert, [0.2, 0.21, 0.19]) + cells("flag cross-encoder", bert, [0.8, 0.81, 0.79])
    close = cells("detail bi-encoder", bert, [0.5, 0.6, 0.4]) + cells("detail cross-encoder", bert, [0.65, 0.75, 0.55])
    not_kept = cells("detail cross-encoder", bert, [0.99, 0.99, 0.99], rate=3e-3, tuning=0.1)
    out = rerankers_report.controls({"cells": flag + close + not_kept})
    assert out["flag, bert (mean)"]["cross-encoder wins"]
    assert out["detail, bert (mean)"]["cross-encoder"] == pytest.approx(0.65)  # at the rate kept
    assert not out["detail, bert (mean)"]["cross-encoder wins"] and not out["effect control passed"]
    wins = cells("detail bi-encoder", gpt, [0.5, 0.6, 0.4]) + cells("detail cross-encoder", gpt, [0.75, 0.85, 0.65])
    out = rerankers_report.controls({"cells": flag + close + wins})
    assert out["detail, gpt (last)"]["cross-encoder wins"] and out["effect control passed"]
    losses = cells("detail bi-encoder", gpt, [0.75, 0.85, 0.65]) + cells("detail cross-encoder", gpt, [0.5, 0.6, 0.4])
    out = rerankers_report.controls({"cells": losses})
    assert out["detail, gpt (last)"]["bi-encoder wins"] and not out["effect control passed"]


# ----------------------------------------------------------------------------- the command

@pytest.mark.parametrize("option, needle", [("--seeed=3", "unknown option --seeed: did you mean --seed?"),
                                            ("--study_dir=", "--study_dir is empty"),
                                            ("--study_dir=README.md", "--study_dir=README.md is a file")])
def test_a_wrong_option_or_study_folder_is_one_line(tmp_path, option, needle):
    """Refused before any work: one line, status 2, no traceback, no output folder made (a study folder that is
    not there yet is no error: the study's checkpoints are trained there)."""
    result = run_script("experiments/rerankers.py", "--quick", option, f"--out_dir={tmp_path / 'o'}")
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert needle in lines[0] and not (tmp_path / "o").exists()


@pytest.mark.slow
def test_the_experiment_runs_end_to_end(char_dataset, tmp_path):
    """Every (task, reranker, reader, seed, rate) cell of the grid runs, each cell's checks are those of early
    stopping, and the JSON alone gives back the controls and the report written beside it."""
    result = run_script("experiments/rerankers.py", "--quick", f"--out_dir={tmp_path}", f"--dataset={char_dataset}",
                        f"--study_dir={tmp_path / 'study'}")
    assert result.returncode == 0, result.stderr[-2000:]
    data = json.loads((tmp_path / "rerankers-quick.json").read_text())
    text = (tmp_path / "rerankers-quick.md").read_text()
    assert "smoke run" in text and "Effect control" in text and data["machine"]
    assert data["controls"] == rerankers_report.controls({"cells": data["cells"]})
    assert rerankers_report.report(data) + "\n" == text
    assert drawer("rerankers-quick") is rerankers_report.plot  # experiments/redraw.py redraws its plot from the JSON
    s = rerankers.SCALES["quick"]
    grid = [c for c in data["cells"] if c["learning rate"] in s["rates"]]
    assert len(grid) == len(rerankers.PARTS) * len(rerankers.READERS) * s["seeds"] * len(s["rates"])
    assert all(c["learning rate"] in s["grown"] for c in data["cells"] if c not in grid)
    assert not recipe.grow(data["cells"], s["grown"], data["seeds"])
    for c in data["cells"]:
        steps = [check[0] for check in c["checks"]]
        assert steps == sorted(steps) and c["steps run"] == steps[-1] <= s["max_steps"] and 0 <= c["hits@1"] <= 1
        assert c["tuning"] == max(check[1] for check in c["checks"]) and c["best step"] in steps
        assert c["flops"] == c["checks"][-1][2] > 0
    prices = data["prices"]
    assert set(prices) == {f"{model} ({how})" for model, how in rerankers.READERS}
    assert all(v > 0 for p in prices.values() for v in p.values())


STRUCTURAL = os.path.join(ROOT, "results", "structural")


@pytest.mark.parametrize("name", sorted(n for n in os.listdir(STRUCTURAL) if n.startswith("rerankers-cpu")
                                        and n.endswith(".json")))
def test_the_committed_result_is_what_its_cells_say(name):
    """Every committed run: its controls (the interaction task's effect control) recomputed from its cells, its .md
    the report of its .json, and each cell trained to early stopping as it says (checks every check_every steps,
    the steps run its last check's, its tuning score its best check's, its FLOPs steps run times one step's)."""
    data = json.load(open(os.path.join(STRUCTURAL, name)))
    assert data["controls"] == rerankers_report.controls(data)
    with open(os.path.join(STRUCTURAL, name[:-5] + ".md"), encoding="utf-8") as f:
        assert f.read() == rerankers_report.report(data) + "\n"
    s = data["settings"]
    for cell in data["cells"]:
        assert_early_stopped(cell, s, s["max_steps"])
