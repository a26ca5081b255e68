"""study.py must not rot: its quick scale runs every experiment end to end, and what the study computes that does not
depend on training (baselines, uniform attention) is checked against its definition."""
import json

import numpy as np
import pytest
import torch

from experiments import metrics, study

from conftest import run_script


@pytest.mark.slow
def test_study_quick_runs_end_to_end(char_dataset, tmp_path):
    result = run_script("experiments/study.py", "--quick", f"--dataset={char_dataset}", f"--out_dir={tmp_path}")
    assert result.returncode == 0, result.stderr[-3000:]
    data = json.loads((tmp_path / "study-quick.json").read_text())
    quick = study.SCALES["quick"]
    assert set(data["models"]) == {"gpt", "bert", "prefixlm", "t5", "diffusion"}
    assert all(len(model["seeds"]) == quick["seeds"] for model in data["models"].values())  # every number per seed
    budget = data["budget_flops"]
    flops = [run["flops"] for model in data["models"].values() for run in model["seeds"]]
    assert all(budget <= f < 1.5 * budget for f in flops)  # equal compute, up to one step over
    gpt, diffusion = data["models"]["gpt"]["seeds"][0], data["models"]["diffusion"]["seeds"][0]
    assert "elbo_bits" in diffusion and "both sides (exact Bayes)" in gpt["cloze"]
    assert (tmp_path / "study-quick.md").read_text().count("|") > 50
    # the learning rate kept is the one of lowest mean validation loss over the seeds on the model's own objective,
    # every seed trained at every rate of the grid; a kept rate at the grid's edge added the rate beyond it
    for name, by_rate in data["sweep"].items():
        assert {f"{r:g}" for r in quick["learning_rates"]} <= set(by_rate) == {f"{r:g}" for r in
                                                                              data["learning_rates"][name]}
        assert all(len(cell["val_loss"]) == quick["seeds"] for cell in by_rate.values())
        best = min(by_rate, key=lambda r: np.mean(by_rate[r]["val_loss"]))
        assert f"{data['chosen_learning_rate'][name]:g}" == best
        assert f"{data['models'][name]['learning_rate']:g}" == best
        assert [run["val_loss"] for run in data["models"][name]["seeds"]] == by_rate[best]["val_loss"]
        grid, first = sorted(data["learning_rates"][name]), sorted(quick["learning_rates"])
        added = sorted(set(grid) - set(first))  # two rates: every kept rate is at an edge, so each grid grew once
        assert len(grid) == len(first) + quick["rate_extensions"] and len(added) == 1
        assert added[0] in (pytest.approx(first[0] / quick["rate_step"]), pytest.approx(first[-1] * quick["rate_step"]))
    # the positive control of every run: from the data's character frequencies, applied to its own val loss
    control = data["plateau_control"]
    for name, model in data["models"].items():
        assert control["threshold"][name] == pytest.approx(control["reference"][name] - metrics.PLATEAU_MARGIN)
        assert all(run["past_plateau"] == (run["val_loss"] <= control["threshold"][name]) for run in model["seeds"])
    # the budget sweep and the C2 ablation: each share of the budget really spent (within one step)
    for name, by_share in data["budget"].items():
        for share, runs in by_share.items():
            assert all(float(share) * budget <= f < float(share) * budget * 1.5 for f in runs["flops"]), (name, share)
    for name, runs in data["ablation"]["models"].items():
        share = quick["ablation_budget"]
        assert all(share * budget <= run["flops"] < share * budget * 1.5 for run in runs), name
    for task, readers in data["ablation"]["probe"].items():
        assert task in study.PROBE_TASKS and all(len(values) == quick["seeds"] for values in readers.values())
    # the checkpoints finetune.py --study reads are the first seed's runs at the chosen rates; the other seeds too
    for name, model in data["models"].items():
        for folder, seed in ((f"quick-{name}", 1337), (f"quick-seed1338-{name}", 1338)):
            saved = torch.load(tmp_path / "checkpoints" / folder / "ckpt.pt", map_location="cpu", weights_only=False)
            assert (saved["config"]["learning_rate"], saved["config"]["seed"]) == (model["learning_rate"], seed)
            assert saved["config"]["position"] == quick["position"] == "rope"
    # the study's own arithmetic, true whatever the barely trained quick models learned: uniform attention's ranks
    # (bidirectional: one distinct row, rank 1; causal: triangular, full rank) and the NoPE baselines' values
    base = data["attention_rank_baselines"][0]
    T = quick["block_size"] - 1  # the evaluation windows' length
    assert base["uniform bidirectional"] == {"numerical": 1.0, "effective": pytest.approx(1.0, abs=1e-9)}
    causal = np.tril(np.ones((T, T)))
    singular = np.linalg.svd(causal / causal.sum(1, keepdims=True), compute_uv=False)  # computed independently
    p = singular / singular.sum()
    assert base["uniform causal"]["numerical"] == T
    assert base["uniform causal"]["effective"] == pytest.approx(np.exp(-(p * np.log(p)).sum()), rel=1e-9)
    assert len(base["gpt at initialisation"]) == len(data["attention_rank"]["gpt"][0])
    assert len(data["attention_rank"]["bert"]) == quick["seeds"]
    small = data["attention_rank_small_head"]  # the head size << T setting: its own, longer windows
    assert small["baselines"][0]["uniform causal"]["numerical"] == quick["small_head"]["block_size"] - 1
    assert len(small["ranks"]["bert"][0]) == quick["small_head"]["n_layer"]
    nope = data["nope"]
    assert len(nope["causal, NoPE"]) == quick["seeds"]  # one accuracy per seed
    assert nope["chance (a random digit)"] == [0.1] * quick["seeds"]
    assert all(0.28 < v < 0.32 for v in nope["order-blind best (the most frequent digit of the input)"])

    # the compute multiplier on the study's runs: those it shares with the study are reused, not retrained
    multiplied = run_script("experiments/multiplier.py", "--quick", f"--dataset={char_dataset}",
                            f"--out_dir={tmp_path}")
    assert multiplied.returncode == 0, multiplied.stderr[-3000:]
    result = json.loads((tmp_path / "multiplier-quick.json").read_text())
    shared = 3 * quick["seeds"] * (1 + len(quick["budget_fractions"]))  # gpt, bert, diffusion at 0.5 and 1 x
    shared += quick["seeds"]  # and bert at 1.5 x: the C2 ablation's bert, the same run
    shared += 2 * quick["seeds"]  # and prefixlm's and t5's 1 x: the study's main runs
    trained = quick["seeds"] * (1 + 2 * 2)  # diffusion at 1.5 x; prefixlm and t5 at 0.5 and 1.5 x
    assert result["reused"] == shared and result["runs"] == shared + trained
    assert result["learning_rates"] == {name: data["chosen_learning_rate"][name] for name in ("gpt", "bert",
                                                                                              "diffusion", "prefixlm",
                                                                                              "t5")}
    for name in ("gpt", "diffusion"):  # the reused 1 x runs score as the study scored them (bert: its cloze only)
        ours = sorted((run["seed"], run["bits"]) for run in result["runs_by_multiple"][name]["1"])
        assert ours == sorted((run["seed"], pytest.approx(run["second_half_bits_per_char"], rel=1e-6))
                              for run in data["models"][name]["seeds"])
    diffusion = result["multipliers"][0]
    assert diffusion["model"] == "diffusion" and diffusion["target"] == pytest.approx(
        np.mean([run["bits"] for run in result["runs_by_multiple"]["gpt"]["1"]]))

    # --reuse=True after a stop: every finished run is loaded, not retrained, and scores the same
    again = run_script("experiments/study.py", "--quick", f"--dataset={char_dataset}", f"--out_dir={tmp_path}", "--reuse=True",
                       "--quiet=True")
    assert again.returncode == 0, again.stderr[-3000:]
    second = json.loads((tmp_path / "study-quick.json").read_text())
    reused_lines = [line for line in again.stdout.splitlines() if line.startswith("reused ")]
    assert second["reused"] == second["runs"] == data["runs"] == len(reused_lines)
    assert second["models"] == data["models"] and second["ablation"] == data["ablation"]


class FixedStates:
    """A stand-in model for metrics.correction_probe whose final states are fixed features of its input: one-hot of
    the character itself (no context), or of its left and right neighbours (context)."""

    def __init__(self, vocab_size, context):
        self.vocab_size, self.context = vocab_size, context

    def run_stack(self, inputs):
        one_hot = torch.nn.functional.one_hot(inputs, self.vocab_size).float()  # (N, T, V)
        if not self.context:
            return one_hot
        return torch.cat([one_hot.roll(1, dims=1), one_hot.roll(-1, dims=1)], dim=-1)  # (N, T, 2V)


def test_correction_probe_reads_what_the_states_hold():
    """Claim C2's probe must measure the states, not the labels: on a text where the neighbours tell each character
    (a period-5 cycle), states holding the neighbours recover the original at replaced positions, states holding
    only the (random) replacement cannot do better than guessing a character of the cycle."""
    V = 7
    starts = torch.randint(0, 5, (600, 1), generator=torch.Generator().manual_seed(0))
    windows = (starts + torch.arange(40)) % 5  # (600, 40), characters 0..4 of a vocabulary of 7
    train, test = windows[:400], windows[400:]
    inputs, replaced = metrics.corrupt_without_mask(train, V, torch.Generator().manual_seed(1))
    assert 0.10 < replaced.float().mean() < 0.15 and (inputs[replaced] != train[replaced]).all()  # 15% x 6/7 changed
    assert torch.equal(inputs[~replaced], train[~replaced])
    with_context, rule = metrics.correction_probe(FixedStates(V, context=True), train, test, V, seed=0)
    without, _ = metrics.correction_probe(FixedStates(V, context=False), train, test, V, seed=0)
    assert with_context > 0.9, with_context  # both neighbours replaced too: rare
    assert without < 0.35, without  # about 1/5: the replacement says nothing of the original
    assert 0.1 < rule < 0.3  # the most frequent original: one of five about equally frequent characters
    # the next character, on random text: it is in the input one position to the right, so states that hold the
    # neighbours name it, states that hold only the character itself do no better than the most frequent one
    text = torch.randint(0, 5, (600, 40), generator=torch.Generator().manual_seed(2))
    with_context, _ = metrics.correction_probe(FixedStates(V, context=True), text[:400], text[400:], V, 0,
                                               "next character")
    without, rule = metrics.correction_probe(FixedStates(V, context=False), text[:400], text[400:], V, 0,
                                             "next character")
    assert with_context > 0.99, with_context
    assert without < 0.3 and abs(without - rule) < 0.05, (without, rule)


def test_study_rejects_an_unknown_scale():
    result = run_script("experiments/study.py", "--scale=tpu")
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


def test_the_multiplier_interpolates_in_log_flops():
    """A hand-made curve: 4.0, 3.0, 2.0 bits at 1, 2, 4 x. The target 2.5 lies halfway between 2 and 4 x in
    log2, so at 2 ** 1.5 x; a target reached at the first budget is that budget; one never reached is None."""
    from experiments.multiplier import crossing
    assert crossing([1, 2, 4], [4.0, 3.0, 2.0], 2.5, lower_is_better=True) == pytest.approx(2 ** 1.5)
    assert crossing([1, 2, 4], [4.0, 3.0, 2.0], 3.0, lower_is_better=True) == pytest.approx(2.0)
    assert crossing([1, 2, 4], [4.0, 3.0, 2.0], 4.5, lower_is_better=True) == 1
    assert crossing([1, 2, 4], [4.0, 3.0, 2.0], 1.0, lower_is_better=True) is None
    # accuracy: higher is better; 0.4 -> 0.6 between 0.25 and 1 x, the target 0.5 at 0.5 x (halfway in log)
    assert crossing([0.25, 1], [0.4, 0.6], 0.5, lower_is_better=False) == pytest.approx(0.5)
    # not monotone: the first budget that reaches it counts, not the last
    assert crossing([1, 2, 4, 8], [3.0, 2.0, 2.6, 1.0], 2.5, lower_is_better=True) == pytest.approx(2 ** (0.5))


@pytest.mark.slow
def test_plateau_quick_runs_and_marks_where_each_run_left_the_plateau(char_dataset, tmp_path):
    """experiments/plateau.py: every variant's validation curve (one point per evaluation) and the first
    evaluation under its own control, which must agree with the curve and the control of its objective."""
    result = run_script("experiments/plateau.py", "--quick", "--seeds=1", f"--dataset={char_dataset}",
                        f"--out_dir={tmp_path}")
    assert result.returncode == 0, result.stderr[-3000:]
    data = json.loads((tmp_path / "plateau-quick-1seed.json").read_text())
    from experiments import plateau
    assert list(data["variants"]) == [v[0] for v in plateau.VARIANTS] and data["seeds"] == [1337]
    for name, runs in data["variants"].items():
        threshold = data["plateau_control"]["threshold"][name]
        for run in runs:
            iterations = [it for it, _ in run["curve"]]
            assert iterations[0] == 0 and iterations[-1] == run["iterations"], (name, iterations)
            under = [it for it, loss in run["curve"] if loss <= threshold]
            assert run["left_at"] == (under[0] if under else None)
    assert (tmp_path / "plateau-quick-1seed.md").read_text().count("| ") > 20
    diffusion_runs = [v[0] for v in plateau.VARIANTS if v[2] == "diffusion"]  # time_sampler_noise, each of them
    assert list(data["noise"]) == diffusion_runs
    assert all(set(n) == {"stratified t", "independent t", "t fixed at 0.5"} for n in data["noise"].values())


@pytest.mark.slow
def test_attention_quick_draws_both_masks_and_their_even_references(char_dataset, tmp_path):
    """experiments/attention.py: gpt gives exactly nothing to positions on its right (the causal mask, claim A1),
    bert does; the 'even over the mask' references are the closed forms (causal: 1 / (i + 1) to each of i + 1
    positions; bidirectional: 1 / T to each)."""
    result = run_script("experiments/attention.py", "--quick", f"--dataset={char_dataset}", f"--out_dir={tmp_path}")
    assert result.returncode == 0, result.stderr[-3000:]
    data = json.loads((tmp_path / "attention-quick.json").read_text())
    T = data["length"]
    for layer in data["statistics"]["gpt"]:
        assert layer["trained"]["right of it"] == 0.0 and layer["trained"]["right neighbour"] == 0.0
        assert layer["even over the mask"]["itself"] == pytest.approx(sum(1 / (i + 1) for i in range(T)) / T)
        assert layer["even over the mask"]["left neighbour"] == pytest.approx(sum(1 / (i + 1) for i in range(1, T))
                                                                             / (T - 1))
    for layer in data["statistics"]["bert"]:
        assert layer["trained"]["right of it"] > 0.05
        assert layer["even over the mask"]["right of it"] == pytest.approx((T - 1) / (2 * T))
    assert len(data["picture"]["gpt"]) == data["n_layer"]
    # the study's runs are read, never retrained in place: a run there of other settings is one line, nothing written
    record, = (tmp_path / "checkpoints").glob("*-gpt/study_run.json")
    done = json.loads(record.read_text())
    record.write_text(json.dumps(dict(done, settings=dict(done["settings"], device="cuda"))))
    before = (tmp_path / "attention-quick.json").read_text()
    again = run_script("experiments/attention.py", "--quick", f"--dataset={char_dataset}", f"--out_dir={tmp_path}")
    assert again.returncode == 2 and len(again.stderr.strip().splitlines()) == 1, again.stderr[-2000:]
    assert "device 'cuda'" in again.stderr and "--out_dir" in again.stderr
    assert (tmp_path / "attention-quick.json").read_text() == before


def test_attention_by_default_reads_the_committed_summary_and_draws_the_four_masks(tmp_path):
    """experiments/attention.py with no flag trains nothing: it redraws the trained maps from the summary in
    --out_dir and draws the four masks from masks.py (the committed masks.json is that drawing's data). Without a
    summary: one line that names --retrain=True, no checkpoint folder made."""
    import os
    import shutil
    from experiments import attention
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    committed = json.load(open(os.path.join(root, "results", "study", "masks.json")))
    assert committed == json.loads(json.dumps(attention.mask_data()))
    grids = {name.split(":")[0]: np.array(grid, dtype=bool) for name, grid in committed["masks"].items()}
    T, P = committed["length"], committed["prefix"]
    assert (grids["gpt"] == np.tril(np.ones((T, T), dtype=bool))).all() and grids["bert"].all()
    assert grids["prefixlm"][:P].sum() == P * P and grids["prefixlm"][P:, :P].all()  # the prefix reads only itself
    assert (grids["prefixlm"] == grids["t5"]).all()  # claim A2: one pattern (t5 with two stacks of weights)
    shutil.copy(os.path.join(root, "results", "study", "attention-cpu.json"), tmp_path)
    result = run_script("experiments/attention.py", f"--out_dir={tmp_path}")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "gpt gives nothing to its right" in result.stdout and not (tmp_path / "checkpoints").exists()
    assert json.loads((tmp_path / "masks.json").read_text()) == committed
    empty = tmp_path / "empty"
    empty.mkdir()
    missing = run_script("experiments/attention.py", f"--out_dir={empty}")
    assert missing.returncode == 2 and len(missing.stderr.strip().splitlines()) == 1, missing.stderr[-2000:]
    assert "--retrain=True" in missing.stderr and not (empty / "checkpoints").exists()
