"""In-context learning in miniature (claims C5, X3): the task needs its demonstrations, evaluation never sees a
training mapping, and the experiment runs end to end."""
import json

import numpy as np

from experiments import incontext
from conftest import run_script


def lookup_rule(text):
    """The ideal in-context learner: find the query key among the demonstrations, answer with its value."""
    query = text[-1]
    shown = [text[i + 1] for i in range(0, len(text) - 1, 3) if text[i] == query]
    return shown[-1] if shown else "A"


def rule_accuracy(episodes):
    return sum(lookup_rule(text) == answer for text, answer in episodes) / len(episodes)


def test_the_answer_is_in_the_demonstrations_and_nowhere_else():
    rng = np.random.default_rng(0)
    for k in (1, 2, 8, 16):
        episodes = [incontext.make_episode(incontext.random_mapping(rng), k, rng) for _ in range(500)]
        assert rule_accuracy(episodes) == 1.0  # the demonstrations determine the answer
        assert all(len(text) == 3 * k + 1 for text, _ in episodes)
    n = 8000  # without demonstrations, or with another mapping's: chance, 1/8 (binomial std 0.0037)
    blind = [incontext.make_episode(incontext.random_mapping(rng), 0, rng) for _ in range(n)]
    shuffled = [incontext.make_episode(incontext.random_mapping(rng), 8, rng, shuffled=True) for _ in range(n)]
    assert abs(rule_accuracy(blind) - 0.125) < 0.02 and abs(rule_accuracy(shuffled) - 0.125) < 0.02
    permuted = []  # the control it replaces: permuting the shown values keeps information, the rule beats chance
    for _ in range(n):
        text, answer = incontext.make_episode(incontext.random_mapping(rng), 8, rng)
        values = rng.permutation([text[i + 1] for i in range(0, 24, 3)])
        permuted.append(("".join(f"{text[i]}{v} " for i, v in zip(range(0, 24, 3), values)) + text[-1], answer))
    assert rule_accuracy(permuted) > 0.18


def test_evaluation_never_uses_a_training_mapping(tmp_path, monkeypatch):
    used = []
    original = incontext.random_mapping
    monkeypatch.setattr(incontext, "random_mapping", lambda rng: used.append(original(rng)) or used[-1])
    seen = incontext.make_dataset(str(tmp_path / "data"), 20_000, np.random.default_rng(0))
    assert seen and seen <= set(used)  # every mapping of the training text is recorded
    rng = np.random.default_rng(1)
    assert not any(incontext.unseen_mapping(rng, seen) in seen for _ in range(2000))
    text = open(tmp_path / "data" / "train.bin", "rb").read()
    assert len(text) // 2 >= 0.9 * 20_000  # the budget of training characters is there


def test_quick_run_end_to_end(tmp_path):
    result = run_script("experiments/incontext.py", "--quick", f"--out_dir={tmp_path}")
    assert result.returncode == 0, result.stderr[-3000:]
    data = json.loads((tmp_path / "incontext-quick.json").read_text())
    assert len(data["runs"]) == 2 and set(data["runs"][0]["models"]) == {"gpt", "bert", "prefixlm", "t5"}
    for run in data["runs"]:
        for name, model in run["models"].items():
            assert set(model["accuracy"]) == {str(k) for k in incontext.K_VALUES}
            assert all(0.0 <= a <= 1.0 for a in model["accuracy"].values())
    assert len(data["runs"][0]["models"]["gpt"]["induction"]) == 1  # one layer at the quick scale
    for run in data["runs"]:  # the spread beside every accuracy, and the positive control of every arch
        for name, model in run["models"].items():
            for k, spread in model["spread"].items():
                assert 1 <= spread["distinct"] <= 8 and 1 / 8 <= spread["most_common"] <= 1
        assert set(run["controls"]) == set(run["models"])
        assert all(0.0 <= c["fixed_k0"] <= 1.0 for c in run["controls"].values())
    table = (tmp_path / "incontext-quick.md").read_text()
    assert table.count("\n| ") >= 5 and "12.5" in table
    assert "Positive control" in table and "distinct, most common" in table


def test_the_spread_tells_a_constant_answer_from_chance(monkeypatch):
    """accuracy(spread=): a model that answers one letter whatever it is shown reads distinct 1, most common 100%,
    even where its accuracy (1/4 here) looks like chance; a varied one reads what it answered."""
    from experiments import incontext
    episodes = [(f"ep{k}", answer) for k, answer in enumerate("abcd")]
    monkeypatch.setattr(incontext, "answers", lambda model, episodes, *args: ["a"] * len(episodes))
    spread = {}
    assert incontext.accuracy(None, episodes, {}, None, "cpu", spread) == 0.25
    assert spread == {"distinct": 1, "most_common": 1.0}
    monkeypatch.setattr(incontext, "answers", lambda model, episodes, *args: list("abac"))
    assert incontext.accuracy(None, episodes, {}, None, "cpu", spread) == 0.5
    assert spread == {"distinct": 3, "most_common": 0.5}
