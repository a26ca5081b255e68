"""Fine-tuning (finetune.py, tasks.py; claims B2, E3, F3, X1): the tasks do not leak, the probe leaves the
backbone untouched, each pooling reads what it says, and the command fails in one line."""
import json

import numpy as np
import pytest
import torch

from experiments import finetune, finetune_report, recipe
from experiments import tasks
from conftest import run_script, tiny_args
from model import ModelConfig, Transformer


@pytest.fixture(scope="module")
def texts(char_dataset):
    return tasks.read_texts(char_dataset)


@pytest.mark.parametrize("task", tasks.TASKS)
def test_training_and_evaluation_examples_come_from_disjoint_parts_of_the_text(task, texts):
    data = tasks.make_task(task, texts, 64, 0, {"train": 10 ** 6, "eval": 10 ** 6, "min_eval": 2})
    train_starts = {e["start"] for e in data["train"]}
    eval_starts = {e["start"] for e in data["eval"]}
    assert data["train"] and data["eval"] and not train_starts & eval_starts
    if task == "speaker":  # whole chunks of the training split: every fifth for evaluation
        chunk = lambda start: (start // tasks.CHUNK) % tasks.EVAL_EVERY  # noqa: E731
        assert {chunk(s) for s in eval_starts} == {tasks.EVAL_EVERY - 1}
        assert tasks.EVAL_EVERY - 1 not in {chunk(s) for s in train_starts}
    else:  # training from the training split, evaluation from the validation split
        assert max(train_starts) < texts["val_offset"] <= min(eval_starts)
    # the text itself: every example is found where its offset says (a header, then its lines), so the offsets
    # above speak for the text, and no example is in both parts
    whole = texts["train"] + texts["val"]
    for part in ("train", "eval"):
        for e in data[part][:300]:
            speech = whole[e["start"]:].split("\n\n", 1)[0]
            lines = e["text"].split("\n") + ([e["next"]] if task == "retrieval" else [])
            if task == "tampered" and e["label"] == 1:
                lines = lines[:1]  # its foreign line comes from elsewhere in the same split
            assert all(line in speech for line in lines)
    key = (lambda e: (e["text"], e["next"])) if task == "retrieval" else (lambda e: e["text"])
    assert not {key(e) for e in data["train"]} & {key(e) for e in data["eval"]}


def test_tampered_labels_are_balanced_and_the_tampering_is_a_foreign_line(texts):
    data = tasks.make_task("tampered", texts, 64, 0, {"train": 10 ** 6, "eval": 10 ** 6, "min_eval": 2})
    for part in ("train", "eval"):
        labels = [e["label"] for e in data[part]]
        assert labels.count(0) == labels.count(1) > 0
    source = texts["train"]
    intact = [e for e in data["train"] if e["label"] == 0]
    tampered = [e for e in data["train"] if e["label"] == 1]
    assert all(e["text"] in source for e in intact)  # intact passages are verbatim text
    assert sum(e["text"] in source for e in tampered) <= 0.02 * len(tampered)  # tampered ones are not
    assert all(len(e["text"]) <= 64 and e["text"].count("\n") >= 1 for e in data["train"])


def test_the_ngram_baseline_and_retrieval_scores_are_computed_as_stated():
    texts = ["the king", "the queen", "a horse"]
    x = tasks.ngram_features(texts)
    assert np.allclose(np.linalg.norm(x, axis=1), 1)
    assert x[0] @ x[1] > x[0] @ x[2]  # shared n-grams, higher cosine
    examples = [{"text": f"line {i}", "next": f"line {i + 1}"} for i in range(150)]  # overlapping pairs
    examples += [{"text": "Ay.", "next": "My lord."}, {"text": "No.", "next": "My lord."}]
    sets = tasks.candidate_sets(examples)
    assert (sets[:, 0] == np.arange(len(examples))).all() and all(len(set(row)) == tasks.CANDIDATES for row in sets)
    for i, row in enumerate(sets):  # never the query's own text, nor a copy of the right answer
        assert all(examples[j]["next"] not in (examples[i]["text"], examples[i]["next"]) for j in row[1:])
    rng = np.random.default_rng(0)
    keys = rng.normal(size=(len(examples), 8))
    assert tasks.retrieval_scores(keys, keys, sets) == {"recall@1": 1.0, "mrr": 1.0}
    assert tasks.retrieval_scores(rng.normal(size=(len(examples), 8)), keys, sets)["recall@1"] < 0.1
    assert tasks.classification_scores([0] * 8, [0, 0, 0, 0, 0, 1, 2, 3], 4) == {"accuracy": 0.625,
                                                                             "balanced accuracy": 0.25}
    collapsed = np.ones((len(examples), 8))  # every key the same: ties count against the model
    assert tasks.retrieval_scores(collapsed, collapsed, sets) == {"recall@1": 0.0, "mrr": 1 / tasks.CANDIDATES}


def test_speaker_labels_merge_one_character_under_two_headers(texts):
    data = tasks.make_task("speaker", texts, 64, 0, {"train": 10 ** 6, "eval": 10 ** 6, "min_eval": 2})
    assert "KING RICHARD III" not in data["classes"] and len(data["classes"]) == tasks.NUM_SPEAKERS


def tiny(arch, **kw):
    torch.manual_seed(0)
    layers = dict(n_layer=1, n_decoder_layer=1) if arch == "t5" else dict(n_layer=2)
    return Transformer(ModelConfig(arch=arch, vocab_size=30, block_size=24, n_head=2, n_embd=16, **layers, **kw)).eval()


def test_gpt_last_position_reads_everything_and_its_first_position_reads_only_itself():
    model = tiny("gpt")
    ids = torch.randint(0, 30, (3, 12), generator=torch.Generator().manual_seed(1))
    lengths = torch.full((3,), 12)
    changed = ids.clone()
    changed[:, -1] = (ids[:, -1] + 1) % 30
    with torch.no_grad():
        last, last_changed = (finetune.pooled_features(model, x, lengths, "last") for x in (ids, changed))
        assert (last - last_changed).abs().max() > 1e-3  # the last position has read the last token
        hidden, hidden_changed = model.run_stack(ids), model.run_stack(changed)
        assert torch.equal(hidden[:, 0], hidden_changed[:, 0])  # what mean pooling averages in: blind to it
        mean, mean_changed = (finetune.pooled_features(model, x, lengths, "mean") for x in (ids, changed))
        assert (mean - mean_changed).abs().max() > 1e-4
        bert = tiny("bert")  # the contrast: a bidirectional first position does read the last token
        assert (bert.run_stack(ids)[:, 0] - bert.run_stack(changed)[:, 0]).abs().max() > 1e-3


@pytest.mark.parametrize("arch, pooling", [("gpt", "last"), ("gpt", "mean"), ("bert", "mean"), ("prefixlm", "mean"),
                                           ("t5", "mean")])
def test_padding_is_never_read(arch, pooling):
    """An input's pooled vector is the same alone and right-padded in a batch with a longer input."""
    model = tiny(arch)
    short = torch.randint(1, 30, (1, 7), generator=torch.Generator().manual_seed(2))
    longer = torch.randint(1, 30, (1, 15), generator=torch.Generator().manual_seed(3))
    batch = torch.zeros(2, 15, dtype=torch.long)
    batch[0, :7], batch[1] = short[0], longer[0]
    with torch.no_grad():
        alone = finetune.pooled_features(model, short, torch.tensor([7]), pooling)
        padded = finetune.pooled_features(model, batch, torch.tensor([7, 15]), pooling)
    assert (alone[0] - padded[0]).abs().max() < 1e-5


@pytest.fixture(scope="module")
def gpt_checkpoint(char_dataset, tmp_path_factory):
    out = tmp_path_factory.mktemp("ft") / "out-gpt"
    result = run_script("train.py", *tiny_args(char_dataset, str(out), max_iters=10))
    assert result.returncode == 0, result.stderr[-2000:]
    return str(out)


@pytest.mark.parametrize("task", ["speaker", "retrieval"])
def test_probe_leaves_the_backbone_bit_identical_and_full_changes_it(task, gpt_checkpoint, texts):
    config = dict(finetune.DEFAULTS, steps=3, probe_steps=5)
    data = tasks.make_task(task, texts, 32, 0, {"train": 64, "eval": 120, "min_eval": 2})
    for mode in ("probe", "full"):
        backbone = finetune.Backbone(gpt_checkpoint, "cpu")
        before = {k: v.clone() for k, v in backbone.model.state_dict().items()}
        scores = finetune.run_cell(backbone, task, mode, "last", data, 0, config, stop=False)
        assert all(0 <= v <= 1 for v in scores.values())
        after = backbone.model.state_dict()
        identical = all(torch.equal(before[k], after[k]) for k in before)
        assert identical == (mode == "probe")


@pytest.mark.slow
def test_quick_study_runs_every_task_reader_and_mode(char_dataset, tmp_path):
    result = run_script("experiments/finetune.py", "--study", "--quick", f"--dataset={char_dataset}", f"--out_dir={tmp_path}")
    assert result.returncode == 0, result.stderr[-3000:]
    data = json.loads((tmp_path / "finetune-quick.json").read_text())
    cells = {(c["task"], c["reader"], c["mode"]) for c in data["cells"]}
    assert len(cells) == len(tasks.TASKS) * len(finetune.READERS) * len(finetune.MODES)
    assert set(data["baselines"]) == set(tasks.TASKS) and len(data["frozen"]) == len(finetune.READERS)
    text = (tmp_path / "finetune-quick.md").read_text()
    assert "majority class" in text and "character n-gram" in text
    again = run_script("experiments/finetune.py", "--study", "--quick", f"--dataset={char_dataset}", f"--out_dir={tmp_path}")
    assert again.returncode == 0 and f"reusing {len(data['cells'])} finished cells" in again.stdout


@pytest.mark.parametrize("args, message", [
    (["--task=sentiment"], "unknown --task=sentiment: choose one of speaker, tampered, retrieval"),
    (["--mode=lora"], "unknown --mode=lora"),
    (["--init_from=/nonexistent/out-gpt"], "does not exist"),
    (["--seeds=0"], "--seeds must be at least 1"),
])
def test_bad_arguments_end_in_one_line(args, message, gpt_checkpoint, char_dataset):
    full = [f"--init_from={gpt_checkpoint}"] + args if not any(a.startswith("--init_from") for a in args) else args
    result = run_script("experiments/finetune.py", *full, f"--dataset={char_dataset}")
    assert result.returncode == 2 and message in result.stderr, result.stderr[-2000:]
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr


def test_a_folder_without_checkpoint_and_a_wrong_arch_pooling_end_in_one_line(tmp_path, char_dataset):
    (tmp_path / "empty").mkdir()
    result = run_script("experiments/finetune.py", f"--init_from={tmp_path / 'empty'}", f"--dataset={char_dataset}")
    assert result.returncode == 2 and "holds no ckpt.pt" in result.stderr and "Traceback" not in result.stderr
    out = tmp_path / "out-bert"
    assert run_script("train.py", *tiny_args(char_dataset, str(out), arch="bert", max_iters=5)).returncode == 0
    result = run_script("experiments/finetune.py", f"--init_from={out}", "--pooling=last", f"--dataset={char_dataset}")
    assert result.returncode == 2 and "--pooling=last is for a causal model" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


@pytest.mark.optional_packages
def test_finetune_a_published_bert_folder(tmp_path, char_dataset):
    """finetune.py --init_from=<save_pretrained folder>: the published model reads the task in its own tokens."""
    transformers = pytest.importorskip("transformers")
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + "the king and queen of my lord i you".split()
    folder = tmp_path / "bert"
    transformers.BertForMaskedLM(transformers.BertConfig(
        num_hidden_layers=1, num_attention_heads=2, hidden_size=16, intermediate_size=32, vocab_size=len(words),
        max_position_embeddings=128)).save_pretrained(folder)
    transformers.BertTokenizer(vocab={w: i for i, w in enumerate(words)}).save_pretrained(folder)
    result = run_script("experiments/finetune.py", f"--init_from={folder}", "--task=retrieval", "--probe_steps=5",
                        f"--dataset={char_dataset}")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "bert (pretrained), mean pooling" in result.stdout and "recall@1" in result.stdout.splitlines()[-1]


def test_the_sampling_error_of_a_balanced_accuracy_weighs_each_class_by_its_own_count():
    """Claim X1's noise level: a balanced accuracy is the mean of per-class recalls, so its half-width comes from
    each class's count (a class of 15 examples weighs as much as one of 113), not from the total: 1/7 over the
    speaker task's evaluation classes is +-4.8 points, where a plain binomial over 304 examples says +-3.9.
    The reference is counted by hand: sum of p(1-p)/n over the seven classes present, LEONTES (0) left out."""
    from experiments.finetune_report import sampling_error
    counts = [113, 15, 25, 23, 52, 49, 27, 0]
    p = 1 / 7
    by_hand = 1.96 * (p * (1 - p) * (1 / 113 + 1 / 15 + 1 / 25 + 1 / 23 + 1 / 52 + 1 / 49 + 1 / 27)) ** 0.5 / 7
    assert abs(sampling_error(p, 304, counts) - by_hand) < 1e-12 and round(100 * by_hand, 1) == 4.8
    assert abs(sampling_error(0.5, 100) - 1.96 * 0.05) < 1e-12  # an accuracy: the binomial


def test_a_checkpoint_in_the_study_folder_is_reused_only_if_it_is_that_run(char_dataset):
    """finetune.py --study and encoders.py reuse the study's checkpoints: one whose arch, objective, shape,
    position encoding, seed or rate is not the run's (another arch's ckpt.pt copied there, a 16-wide train.py run,
    a checkpoint of the study's earlier learned-position recipe), or that has not spent its budget, trains again."""
    from experiments import finetune, study
    from experiments.equal_compute import equal_flops_config, flops_budget
    from infra.dataset import load_dataset
    s = study.SCALES["quick"]
    _, meta = load_dataset(char_dataset, s["block_size"], False)
    budget = flops_budget(s, meta)
    run = ("gpt, seed 1337", "gpt", "clm", dict(learning_rate=2e-3, min_lr=2e-4, seed=1337, out_dir="unused"))
    expected = equal_flops_config(run, 1.0, s, char_dataset, "", "cpu", meta, 1337, True, budget)
    differs = lambda config, flops=budget: finetune.checkpoint_differs(  # noqa: E731
        {"config": config, "flops_done": flops}, run, s, char_dataset, "cpu", meta, budget)
    assert differs(dict(expected)) == ""
    for key, value in (("arch", "bert"), ("objective", "mlm"), ("n_embd", 16), ("n_head", 1), ("position", "learned"),
                       ("dataset", "another"), ("seed", 1338), ("learning_rate", 1e-3), ("max_flops", 1.0)):
        assert differs(dict(expected, **{key: value})).startswith(f"{key}={value!r}"), key
    assert "FLOPs of its budget" in differs(dict(expected), budget / 2)


# ----------------------------------------------------------------------------- the study's recipe (claims B2, X1, E3)

def test_the_tuning_items_are_held_out_of_the_training_examples_and_are_no_evaluation_example(texts):
    """A rate is chosen on tuning items: the last quarter of the training examples (at most limits["tune"]),
    which the reader is never trained on, and none of which is an evaluation example."""
    s = dict(finetune.STUDY_SCALES["quick"], seed=0, limits=dict(finetune.STUDY_SCALES["quick"]["limits"], tune=12))
    held = finetune.study_tasks(texts, s)
    for task in tasks.TASKS:
        whole = tasks.make_task(task, texts, s["max_chars"], 0, s["limits"])
        n = min(12, len(whole["train"]) // 4)
        assert held[task]["train"] + held[task]["tune"] == whole["train"] and len(held[task]["tune"]) == n, task
        assert held[task]["eval"] == whole["eval"], task
        key = (lambda e: (e["text"], e["next"])) if task == "retrieval" else (lambda e: (e["text"], e["start"]))
        assert not {key(e) for e in held[task]["tune"]} & {key(e) for e in held[task]["eval"]}, task
    candidates = held["retrieval"]["tune_candidates"]
    assert candidates.shape == (12, 6) and (candidates[:, 0] == np.arange(12)).all()


@pytest.mark.parametrize("mode", finetune.MODES)
def test_a_cell_trains_on_the_training_examples_and_scores_the_tuning_and_evaluation_ones(
        mode, gpt_checkpoint, texts, monkeypatch):
    """run_cell reads only the training examples while it trains, then scores the evaluation examples and
    the tuning ones ("tuning", what the rate is chosen on), with the same head."""
    s = dict(finetune.STUDY_SCALES["quick"], seed=0)
    data = finetune.study_tasks(texts, s)["speaker"]
    read, real = [], finetune.features_of
    monkeypatch.setattr(finetune, "features_of", lambda b, texts, pooling: read.append(texts) or real(b, texts, pooling))
    encoded, real_encode = [], finetune.Backbone.encode
    monkeypatch.setattr(finetune.Backbone, "encode", lambda self, texts: encoded.extend(texts) or real_encode(self, texts))
    config = dict(finetune.DEFAULTS, steps=3, probe_steps=5)
    scores = finetune.run_cell(finetune.Backbone(gpt_checkpoint, "cpu"), "speaker", mode, "last", data, 0, config,
                               stop=False)
    train, evaluation, tune = ([e["text"] for e in data[k]] for k in ("train", "eval", "tune"))
    assert read[-2:] == [evaluation, tune]  # scored last: evaluation, then tuning
    seen_in_training = read[:-2] + ([encoded[:-len(evaluation) - len(tune)]] if mode == "full" else [])
    assert all(set(batch) <= set(train) for batch in seen_in_training) and any(seen_in_training)
    assert set(scores) == {"accuracy", "balanced accuracy", "tuning"} and 0 <= scores["tuning"] <= 1


def test_the_study_reports_each_reader_at_the_rate_its_tuning_score_chose():
    """The table's score of a reader is its evaluation score at the rate of best mean tuning score over seeds,
    even where the evaluation favours another rate; the row's control compares that score with the rule."""
    cells = []
    for seed, low, high in ((1, 0.9, 0.5), (2, 0.1, 0.6), (3, 0.2, 0.6)):  # the low rate wins one seed only
        for rate, tuning, accuracy in ((1e-3, low, 0.99), (3e-3, high, 0.7 + seed / 100)):
            cells.append({"part": "tampered full", "task": "tampered", "mode": "full", "reader": "bert (mean)",
                          "seed": seed, "learning rate": rate, "tuning": tuning, "accuracy": accuracy})
    data = {"cells": cells, "baselines": {"tampered": {"character n-gram logistic regression": {"accuracy": 0.55}}}}
    assert recipe.kept_values(data, "tampered full", "bert (mean)", "accuracy") == [0.71, 0.72, 0.73]
    control = finetune_report.study_controls(data)["tampered full"]
    assert control["best"] == "bert (mean)" and control["passed"]  # 0.72 - 0.01 >= 0.55 + 0.10
    data["baselines"]["tampered"]["character n-gram logistic regression"]["accuracy"] = 0.62
    assert not finetune_report.study_controls(data)["tampered full"]["passed"]


def test_a_rate_grown_to_is_finished_on_every_seed_when_a_stopped_run_goes_on():
    """recipe.grow offers a rate past the grid's edge once; a run stopped after one seed of it goes on with the
    others (recipe.begun), so no rate is kept on one seed's score."""
    cells = [{"part": "speaker full", "reader": "gpt (last)", "seed": seed, "learning rate": rate, "tuning": score}
             for seed in (1, 2) for rate, score in ((1e-3, 0.1), (3e-3, 0.2))]
    cells.append({"part": "speaker full", "reader": "gpt (last)", "seed": 1, "learning rate": 1e-2, "tuning": 0.3})
    assert recipe.grow(cells, (3e-4, 1e-2), [1, 2]) == []  # the grown rate is tried: not offered again
    plan = [("speaker full", "gpt", "last", seed, rate) for seed in (1, 2) for rate in (1e-3, 3e-3)]
    plan += [cell for cell in recipe.begun(cells, [1, 2]) if cell not in plan]
    assert recipe.missing(plan, cells) == [("speaker full", "gpt", "last", 2, 1e-2)]


def test_the_share_of_tuning_items_that_hold_a_training_line_is_counted():
    data = {"train": [{"text": "a b\nc d"}, {"text": "e f", "next": "g h"}],
            "tune": [{"text": "c d\nx y"}, {"text": "x", "next": "g h"}, {"text": "new line"}, {"text": " a b "}]}
    assert finetune.shared_with_training(data) == 0.75  # "c d", "g h" (a next line), "a b" (spaces stripped)


def test_the_study_refuses_a_rate_its_grid_chooses(char_dataset, tmp_path):
    result = run_script("experiments/finetune.py", "--study", "--quick", "--learning_rate=1e-3",
                        f"--dataset={char_dataset}", f"--out_dir={tmp_path}")
    assert result.returncode != 0 and result.stderr.strip().count("\n") == 0 and "Traceback" not in result.stderr
    assert "--learning_rate is for one fine-tuning run" in result.stderr and not list(tmp_path.iterdir())


@pytest.mark.slow
def test_a_stopped_study_writes_beside_the_whole_result_and_goes_on_from_it(char_dataset, tmp_path, monkeypatch):
    """A stop writes the cells that finished to finetune-quick-partial.* (status 130), never over the whole
    result; the same command goes on from them, runs only the rest, and then replaces the whole result, leaving no
    partial file and no "Interrupted" note."""
    import sys
    folders = {(model, 1337): f"run-{model}" for model, _ in finetune.READERS}
    monkeypatch.setattr(finetune, "study_backbones", lambda *args: (folders, {
        f"{model}, seed 1337": {"final_val_loss": 2.0, "written": 0} for model, _ in folders}))
    monkeypatch.setattr(finetune, "Backbone", lambda folder, device: None)
    monkeypatch.setattr(finetune, "evaluate", lambda *args: {"recall@1": 0.01, "mrr": 0.05})
    ran, stop_at = [], [5]

    def cell(backbone, task, mode, pooling, data, seed, config, stop):
        if len(ran) == stop_at[0]:
            raise KeyboardInterrupt
        ran.append((task, mode, pooling))
        metric = {"speaker": "balanced accuracy", "tampered": "accuracy", "retrieval": "recall@1"}[task]
        return {metric: 0.5, "accuracy": 0.5, "mrr": 0.1, "tuning": 0.5}
    monkeypatch.setattr(finetune, "run_cell", cell)
    whole = tmp_path / "finetune-quick.md"
    whole.write_text("a complete run's table\n")
    monkeypatch.setattr(sys, "argv", ["finetune.py", "--study", "--quick", f"--out_dir={tmp_path}",
                                      f"--dataset={char_dataset}"])
    with pytest.raises(SystemExit) as ended:
        finetune.main()
    assert ended.value.code == 130 and whole.read_text() == "a complete run's table\n"
    partial = json.loads((tmp_path / "finetune-quick-partial.json").read_text())
    assert len(partial["cells"]) == 5 and "Interrupted" in partial["notes"][0]
    stop_at[0] = None
    finetune.main()
    done = json.loads((tmp_path / "finetune-quick.json").read_text())
    cells = len(tasks.TASKS) * len(finetune.READERS) * sum(len(finetune.STUDY_SCALES["quick"][k])
                                                           for k in ("rates", "probe_rates"))
    assert len(ran) == len(done["cells"]) == cells and "notes" not in done  # each cell once, the 5 kept
    assert not [p.name for p in tmp_path.iterdir() if "partial" in p.name]
    assert "Interrupted" not in whole.read_text() and "a complete run" not in whole.read_text()
