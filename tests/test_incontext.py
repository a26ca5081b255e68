"""In-context learning in miniature (claims C5, X3): the task needs its demonstrations, evaluation never sees a
training mapping, the effect control tells a reader of demonstrations from everything else, the committed verdict
is what its runs say, and the experiment runs end to end."""
import json
import os

import numpy as np
import pytest
import torch

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


def test_the_same_dataset_made_again_is_left_as_it_is(tmp_path):
    """An experiment makes its dataset at every start: the same text again leaves the files untouched (a run of
    another command reading them is not disturbed); another text replaces them."""
    folder = tmp_path / "data"
    incontext.make_dataset(str(folder), 20_000, np.random.default_rng(0))
    stamp = {name: os.stat(folder / name).st_mtime_ns for name in ("train.bin", "val.bin", "meta.pkl")}
    os.utime(folder / "train.bin", ns=(1, 1))  # a write would set it anew
    incontext.make_dataset(str(folder), 20_000, np.random.default_rng(0))
    assert os.stat(folder / "train.bin").st_mtime_ns == 1 and os.stat(folder / "meta.pkl").st_mtime_ns == \
        stamp["meta.pkl"]
    incontext.make_dataset(str(folder), 20_000, np.random.default_rng(1))
    assert os.stat(folder / "train.bin").st_mtime_ns != 1


@pytest.mark.slow
def test_quick_run_end_to_end(tmp_path):
    result = run_script("experiments/incontext.py", "--quick", f"--out_dir={tmp_path}")
    assert result.returncode == 0, result.stderr[-3000:]
    data = json.loads((tmp_path / "incontext-quick.json").read_text())
    assert len(data["runs"]) == 2 and set(data["runs"][0]["models"]) == {"gpt", "bert", "prefixlm", "t5"}
    budgets = list(incontext.SCALES["quick"]["budgets"])  # the sweep: gpt alone, until it passes or budgets end
    assert [step["multiple"] for step in data["sweep"]] == budgets[:len(data["sweep"])]
    assert data["measured_multiple"] == data["sweep"][-1]["multiple"]
    assert data["chosen_multiple"] in (None, data["measured_multiple"])
    assert data["sweep"][1]["flops"] == pytest.approx(2 * data["sweep"][0]["flops"], rel=0.01)
    for step in data["sweep"]:
        assert all(set(run["models"]) == {"gpt"} for run in step["runs"])
    for run in data["runs"]:
        for name, model in run["models"].items():
            assert set(model["accuracy"]) == {str(k) for k in incontext.K_VALUES}
            assert all(0.0 <= a <= 1.0 for a in model["accuracy"].values())
            assert len(model["induction"]) == 1  # one layer at the quick scale, every arch read the same way
            assert set(model["effect"]) >= {"mean_k1", "margin", "distinct", "rule_mean_k1", "passed"}
            for k, spread in model["spread"].items():
                assert 1 <= spread["distinct"] <= 8 and 1 / 8 <= spread["most_common"] <= 1
        assert set(run["controls"]) == set(run["models"])
        assert all(0.0 <= c["fixed_k0"] <= 1.0 for c in run["controls"].values())
    table = (tmp_path / "incontext-quick.md").read_text()
    assert table.count("\n| ") >= 5 and "12.5" in table and "the last value shown" in table
    assert "Positive control" in table and "distinct, most common" in table and "The sweep" in table
    assert ("not reproduced up to 2 x" in table) == (data["chosen_multiple"] is None)
    # gpt's sweep alone, from the runs just trained (--reuse=True: nothing trains again)
    result = run_script("experiments/incontext.py", "--quick", "--sweep_only=True", "--reuse=True",
                        f"--out_dir={tmp_path}")
    assert result.returncode == 0 and "trained gpt" not in result.stdout, result.stderr[-3000:]
    sweep = json.loads((tmp_path / "incontext-quick-sweep.json").read_text())
    reused = [run["models"]["gpt"].pop("reused") for step in sweep["sweep"] for run in step["runs"]]
    assert all(reused) and not any(run["models"]["gpt"].pop("reused") for step in data["sweep"] for run in step["runs"])
    assert sweep["sweep"] == data["sweep"] and sweep["sweep_only"] and "bert" not in sweep["runs"][0]["models"]
    assert "runs finished earlier, reused" in (tmp_path / "incontext-quick-sweep.md").read_text()
    assert "gpt's accuracy (%) against k at each budget" in (tmp_path / "incontext-quick-sweep.md").read_text()


STOI = {c: i for i, c in enumerate(sorted(set(incontext.KEYS + incontext.VALUES + " \n")))}
FIXED = {key: value for key, value in zip(incontext.KEYS, "CAFHBEGD")}  # what a reader blind to the context says


def planted_reader(rule):
    """answer_logits for a 'model' that answers rule(episode text) (the text without the newline shown before it)."""
    def logits(model, texts, stoi, specials, device):
        out = torch.zeros(len(texts), len(stoi))
        for row, text in enumerate(texts):
            assert text.startswith(incontext.START)  # every episode shown as the training stream shows it
            out[row, stoi[rule(text[len(incontext.START):])]] = 1.0
        return out
    return logits


@pytest.mark.parametrize("reader, passes", [
    (lookup_rule, True),  # reads the demonstrations: finds the query's key, copies its value
    (lambda text: FIXED[text[-1]], False),  # cannot attend back: the query key alone (chance, whatever k)
    (incontext.last_value_rule, False),  # attends back without matching keys: clears the margin, not the rule
    # the rule, and a third of k = 16 read right: ~5 points over the rule, under its 10-point margin
    (lambda text: lookup_rule(text) if len(text) > 40 and sum(map(ord, text)) % 3 == 0 else
     incontext.last_value_rule(text), False),
    (lambda text: "C", False),  # one letter whatever it is shown
    (lambda text: min("E", lookup_rule(text)), False),  # reads them, answers only A-E (E for F, G, H): too few
])
def test_the_effect_control_passes_only_a_reader_of_the_demonstrations(monkeypatch, reader, passes):
    """The effect control computed from what a reader answers on the experiment's own episodes: an ideal lookup
    passes; a reader that cannot attend back (the query key alone), one that copies the last value shown, a
    constant answer, and one that answers only five letters fail. Each is planted in answer_logits, so evaluate,
    accuracy and the control run as in a real evaluation."""
    monkeypatch.setattr(incontext, "answer_logits", planted_reader(reader))
    monkeypatch.setattr(incontext, "induction_scores", lambda *args: ([0.0], 0.0))
    s = dict(eval_episodes=200)
    result = json.loads(json.dumps(incontext.evaluate(None, "gpt", 1337, {"ABCDEFGH"}, s, STOI, None, "cpu")))
    effect = result["effect"]
    assert effect["passed"] is passes, effect
    assert 0.45 < effect["rule_mean_k1"] < 0.50  # the last-value rule clears the 30-point margin on its own
    if passes:
        assert effect["mean_k1"] == 1.0 and effect["distinct"] == 8


RESULTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "results", "study")


@pytest.mark.parametrize("name", sorted(n for n in os.listdir(RESULTS) if n.startswith("incontext-cpu")
                                        and n.endswith(".json")))
def test_the_committed_verdict_is_what_its_runs_say(name):
    """Every committed run (gpt's sweep alone, or the sweep and every arch): each effect control recomputed from its
    accuracies; the budget it reports is the first of the sweep at which gpt passed on every seed (or, none
    passing, the last), the sweep stopped there, and every arch was measured there."""
    data = json.load(open(os.path.join(RESULTS, name)))
    rules = data["rules"]
    for runs in [step["runs"] for step in data["sweep"]] + [data["runs"]]:
        for run in runs:
            for model in run["models"].values():
                assert model["effect"] == pytest.approx(incontext.effect_control(model, rules))
    passing = [step["multiple"] for step in data["sweep"]
               if all(run["models"]["gpt"]["effect"]["passed"] for run in step["runs"])]
    assert data["chosen_multiple"] == (passing[0] if passing else None)
    assert data["chosen_multiple"] in (None, data["measured_multiple"])  # it stopped at the first pass, or ran out
    if data["chosen_multiple"] is None:
        assert len(data["sweep"]) == len(data["sizes"]["budgets"])
    assert [step["multiple"] for step in data["sweep"]] == \
        list(data["sizes"]["budgets"])[:len(data["sweep"])]  # the sweep stopped where gpt first passed
    assert data["measured_multiple"] == data["sweep"][-1]["multiple"]
    for run, gpt in zip(data["runs"], data["sweep"][-1]["runs"]):
        assert run["models"]["gpt"] == gpt["models"]["gpt"]  # the compared gpt is the sweep's last one
    assert len(data["runs"]) == data["sizes"]["seeds"] == 3
    assert data.get("sweep_only") or set(data["runs"][0]["models"]) == {"gpt", "bert", "prefixlm", "t5"}


def test_the_full_table_pads_t5s_layers_and_counts_every_run(monkeypatch):
    """summarise on a full result at 2 layers (t5 reads 1 encoder layer): each induction row has as many cells as
    the header, and the training minutes count every run once (the sweep's gpt and every arch's control)."""
    model = lambda layers: dict(  # noqa: E731
        accuracy={str(k): 0.5 for k in incontext.K_VALUES}, shuffled_k8=0.1, seen_mappings_k8=0.5,
        spread={str(k): {"distinct": 8, "most_common": 0.2} for k in incontext.K_VALUES},
        effect=dict(mean_k1=0.5, floor=0.1, margin=0.4, distinct=8, rule_mean_k1=0.47, passed=False),
        induction=[0.1] * layers, induction_uniform=0.07, train_seconds=60.0)
    runs = [{"seed": seed, "models": {"gpt": model(2), "bert": model(2), "prefixlm": model(2), "t5": model(1)},
             "controls": {name: dict(fixed_k0=1.0, spread={"distinct": 8}, train_seconds=60.0)
                          for name in ("gpt", "bert", "prefixlm", "t5")}} for seed in (1, 2, 3)]
    data = dict(scale="cpu", sizes=dict(incontext.SCALES["cpu"]), runs=runs, seconds=60.0, chosen_multiple=None,
                measured_multiple=1, budget_flops=1e12, rules={"last_value": dict(
                    {str(k): 0.47 for k in incontext.K_VALUES}, shuffled_k8=0.12)},
                sweep=[dict(multiple=1, flops=1e12, runs=[{"seed": r["seed"], "models": {"gpt": r["models"]["gpt"]}}
                                                          for r in runs])])
    text = incontext.summarise(data, "a machine")
    table = text[text.index("| model | layer 0"):].splitlines()
    assert table[0].count("|") == table[2].count("|") == table[-1].count("|")  # header, gpt, t5
    assert table[-1].startswith("| t5 |") and " - |" in table[-1]
    assert "Training 24.0 min summed" in text  # 3 gpt + 9 others + 12 controls, a minute each


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
