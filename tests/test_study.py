"""study.py must not rot: its quick scale runs every experiment end to end, and what the study computes that does not
depend on training (baselines, uniform attention) is checked against its definition."""
import json

import numpy as np
import pytest
import torch

import study

from conftest import run_script


def test_study_quick_runs_end_to_end(char_dataset, tmp_path):
    result = run_script("study.py", "--quick", f"--dataset={char_dataset}", f"--out_dir={tmp_path}")
    assert result.returncode == 0, result.stderr[-3000:]
    data = json.loads((tmp_path / "study-quick.json").read_text())
    assert set(data["models"]) == {"gpt", "bert", "prefixlm", "t5", "diffusion", "bert-100%-mask"}
    flops = [m["flops"] for m in data["models"].values()]
    budget = data["budget_flops"]
    assert all(budget <= f < 1.5 * budget for f in flops)  # equal compute, up to one step over
    assert "elbo_bits" in data["models"]["diffusion"] and "both sides (exact Bayes)" in data["models"]["gpt"]["cloze"]
    assert (tmp_path / "study-quick.md").read_text().count("|") > 50
    # the study's own arithmetic, true whatever the barely trained quick models learned: uniform attention's ranks
    # (bidirectional: one distinct row, rank 1; causal: triangular, full rank) and the NoPE baselines' values
    base = data["attention_rank_baselines"]
    T = study.SCALES["quick"]["block_size"] - 1  # the evaluation windows' length
    assert base["uniform bidirectional"] == {"numerical": 1.0, "effective": pytest.approx(1.0, abs=1e-9)}
    causal = np.tril(np.ones((T, T)))
    singular = np.linalg.svd(causal / causal.sum(1, keepdims=True), compute_uv=False)  # computed independently
    p = singular / singular.sum()
    assert base["uniform causal"]["numerical"] == T
    assert base["uniform causal"]["effective"] == pytest.approx(np.exp(-(p * np.log(p)).sum()), rel=1e-9)
    assert len(base["gpt at initialisation"]) == len(data["attention_rank"]["gpt"])
    small = data["attention_rank_small_head"]  # the head size << T setting: its own, longer windows
    assert small["baselines"]["uniform causal"]["numerical"] == study.SCALES["quick"]["small_head"]["block_size"] - 1
    assert len(small["ranks"]["bert"]) == study.SCALES["quick"]["small_head"]["n_layer"]
    nope = data["nope"]
    assert len(nope["causal, NoPE"]) == 2  # one accuracy per seed
    assert nope["chance (a random digit)"] == [0.1, 0.1]
    assert all(0.28 < v < 0.32 for v in nope["order-blind best (the most frequent digit of the input)"])


def test_study_rejects_an_unknown_scale():
    result = run_script("study.py", "--scale=tpu")
    assert result.returncode == 2 and "unknown --scale=tpu" in result.stderr and "Traceback" not in result.stderr


def test_position_blind_baselines_are_what_their_rules_score():
    """study.position_blind_baselines states each rule's expected accuracy in closed form; play the rules on the
    examples and score them as the models are scored (the answer token)."""
    inputs, targets, digits, query = study.nope_batch(20000, "gpt", torch.Generator().manual_seed(0))
    answer = targets[:, -1]
    # read the task back from the model's inputs, `BOS d1..d8 SEP q`: the target is the digit at index q
    assert torch.equal(inputs[:, 1:9], digits) and (inputs[:, 9] == 10).all()
    assert torch.equal(answer, inputs[torch.arange(len(query)), 1 + inputs[:, 10] - 13])
    stated = study.position_blind_baselines(digits)
    g = torch.Generator().manual_seed(1)
    mode = torch.mode(digits, dim=1).values  # a most frequent digit (ties: any one is as good)
    random_input_digit = digits[torch.arange(len(query)), torch.randint(0, 8, (len(query),), generator=g)]
    played = {"order-blind best (the most frequent digit of the input)": (mode == answer).double().mean().item(),
              "order-blind: a random digit of the input": (random_input_digit == answer).double().mean().item(),
              "chance (a random digit)": (torch.randint(0, 10, (len(query),), generator=g) == answer).double().mean()
              .item()}
    for rule, value in stated.items():
        assert abs(played[rule] - value) < 0.01, (rule, played[rule], value)  # 20,000 examples: ~0.3% sampling error
