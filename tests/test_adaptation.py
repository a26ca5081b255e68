"""Claim G1: other architectures made from a trained gpt (infra/adaptation.py, experiments/adaptation.py).
The annealed mask's ends, the shifted outputs, every adapted weight equal to gpt's to the bit, and the FLOPs of the
two phases adding up to the study's budget by a count made here."""
import json
import os
import sys

import pytest
import torch

import masks
import objectives
from conftest import run_script, tiny_args
from infra.adaptation import DiffusionFromGpt
from model import ModelConfig, Transformer


# ----------------------------------------------------------------------------- the annealed mask (masks.py)

def test_the_annealed_mask_is_causal_at_the_first_step_and_bidirectional_at_the_last():
    T, steps = 16, 50
    generator = torch.Generator().manual_seed(0)
    first = masks.annealed_mask(T, masks.annealed_fraction(0, steps), generator)
    last = masks.annealed_mask(T, masks.annealed_fraction(steps - 1, steps), generator)
    assert torch.equal(first, masks.causal_mask(T))
    assert torch.equal(last, masks.bidirectional_mask(T))
    assert masks.annealed_fraction(10 * steps, steps) == 1.0  # after the annealing: full
    middle = masks.annealed_mask(T, masks.annealed_fraction(steps // 2, steps), generator)
    assert torch.equal(middle | masks.causal_mask(T), middle)  # the causal part is always open
    future = ~masks.causal_mask(T)
    share = middle[future].float().mean().item()  # about half of the future keys opened half-way
    assert 0.3 < share < 0.7


def test_the_training_loop_opens_the_mask_step_by_step(char_dataset, tmp_path, monkeypatch):
    """train.py passes masks.annealed_mask to the model at each step, with the fraction of that step (the batch
    infra/adaptation.training_batch makes carries it)."""
    import train
    gpt = tmp_path / "gpt"
    train.train(train.resolve_config(tiny_args(char_dataset, str(gpt), max_iters=4)))
    seen = []
    original = masks.annealed_mask
    monkeypatch.setattr(masks, "annealed_mask", lambda T, opened, *a, **k: seen.append(opened) or original(
        T, opened, *a, **k))
    train.train(train.resolve_config(tiny_args(char_dataset, str(tmp_path / "d"), arch="bert", objective="diffusion",
                                               init_from=str(gpt), shift_logits=True, anneal_steps=5, max_iters=8)))
    assert seen == [0.0, 0.25, 0.5, 0.75]  # then fully open: bert's own mask, no mask tensor at all


# ----------------------------------------------------------------------- the shift (infra/adaptation.py, objectives.py)

def tiny(arch, kind=Transformer, **extra):
    torch.manual_seed(0)
    return kind(ModelConfig(arch=arch, vocab_size=70, block_size=16, n_layer=2, n_head=2, n_embd=16,
                            position="rope", bias=False, **extra)).eval()


def test_a_shifted_model_scores_token_i_with_position_i_minus_1():
    plain, shifted = tiny("bert"), tiny("bert", DiffusionFromGpt, shift_logits=True)
    shifted.load_state_dict(plain.state_dict())
    ids = torch.randint(0, 65, (2, 12))
    a, b = plain(ids)[0], shifted(ids)[0]
    assert torch.equal(b[:, 1:], a[:, :-1])
    assert torch.equal(b[:, 0], torch.zeros_like(b[:, 0]))  # nothing before position 0


def test_the_diffusion_objective_of_a_shifted_model_never_masks_position_0(specials):
    windows = torch.randint(0, specials.num_ordinary, (64, 17))
    kept = objectives.batch_for({"objective": "diffusion", "arch": "bert", "shift_logits": True}, windows, specials,
                                torch.Generator().manual_seed(0))
    plain = objectives.batch_for({"objective": "diffusion", "arch": "bert"}, windows, specials,
                                 torch.Generator().manual_seed(0))
    assert not (kept.inputs[:, 0] == specials.mask).any() and (plain.inputs[:, 0] == specials.mask).any()
    assert torch.equal(kept.inputs[:, 1:], plain.inputs[:, 1:])  # the rest as before, draw for draw


def test_an_attention_mask_given_to_the_model_replaces_the_archs():
    """bert's weights under a causal mask compute exactly gpt's function: the arch is only its mask (claim A1)."""
    gpt, bert = tiny("gpt"), tiny("bert")
    bert.load_state_dict(gpt.state_dict())
    ids = torch.randint(0, 65, (2, 12))
    assert torch.equal(bert(ids, attention=masks.causal_mask(12))[0], gpt(ids)[0])
    assert not torch.allclose(bert(ids)[0], gpt(ids)[0])


# ----------------------------------------------------------------------------- the weights (infra/adaptation.py)

@pytest.fixture(scope="module")
def trained_gpt(char_dataset, tmp_path_factory):
    import train
    folder = tmp_path_factory.mktemp("adaptation") / "gpt"
    train.train(train.resolve_config(tiny_args(char_dataset, str(folder), n_layer=2, max_iters=6, position="rope")))
    return str(folder)


def adapted(char_dataset, trained_gpt, tmp_path, arch, **extra):
    import train
    config = train.resolve_config(tiny_args(char_dataset, str(tmp_path / arch), arch=arch, init_from=trained_gpt,
                                            position="rope", **dict(dict(n_layer=2), **extra)))
    setup, _ = train.prepare(config)
    gpt = torch.load(os.path.join(trained_gpt, "ckpt.pt"), map_location="cpu", weights_only=False)["model"]
    return setup.raw_model, gpt


@pytest.mark.parametrize("arch, extra", [("bert", {}), ("bert", {"objective": "diffusion", "shift_logits": True,
                                                                  "anneal_steps": 3}), ("prefixlm", {})])
def test_one_stack_models_start_from_every_gpt_weight_to_the_bit(char_dataset, trained_gpt, tmp_path, arch, extra):
    model, gpt = adapted(char_dataset, trained_gpt, tmp_path, arch, **extra)
    state = model.state_dict()
    assert set(state) == set(gpt)
    assert all(torch.equal(state[name], gpt[name]) for name in gpt)


def test_t5_starts_with_gpts_lower_blocks_in_both_stacks_and_cross_attention_from_self_attention(
        char_dataset, trained_gpt, tmp_path):
    """The study's shape: gpt's 2 layers, t5 1 + 1 (half in each stack, as equal_compute splits them)."""
    model, gpt = adapted(char_dataset, trained_gpt, tmp_path, "t5", n_layer=1, n_decoder_layer=1)
    state = model.state_dict()
    checked = 0
    for name, value in state.items():
        if name.startswith("decoder_blocks."):
            block, module, rest = name.split(".", 1)[1].split(".", 2)
            module = {"cross_attention": "attention", "norm_cross": "norm_1"}.get(module, module)
            source = f"blocks.{block}.{module}.{rest}"
        elif name.startswith("decoder_norm."):
            source = "final_norm." + name[len("decoder_norm."):]
        else:
            source = name
        assert torch.equal(value, gpt[source]), name
        checked += 1
    assert checked == len(state) and any(k.startswith("decoder_blocks.0.cross_attention") for k in state)


def test_adapting_from_a_run_that_is_not_a_gpt_of_this_shape_is_one_line(char_dataset, trained_gpt, tmp_path):
    bert = tmp_path / "bert"
    assert run_script("train.py", *tiny_args(char_dataset, str(bert), arch="bert", max_iters=2)).returncode == 0
    for args, words in ((dict(arch="bert", init_from=str(bert)), "holds a bert run"),
                        (dict(arch="bert", init_from=trained_gpt, n_embd=64, position="rope"), "n_embd 32 (here 64)"),
                        (dict(arch="gpt", anneal_steps=5), "--anneal_steps and --shift_logits")):
        result = run_script("train.py", *tiny_args(char_dataset, str(tmp_path / "x"), **args))
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 1 or result.returncode == 2, result.stderr
        assert len(lines) == 1 and words in lines[0] and "Traceback" not in result.stderr, result.stderr
        assert not os.path.exists(tmp_path / "x" / "ckpt.pt")


def test_resuming_an_adapted_run_needs_its_shift_and_annealing(char_dataset, trained_gpt, tmp_path):
    run = tiny_args(char_dataset, str(tmp_path / "d"), arch="bert", objective="diffusion", max_iters=4,
                    n_layer=2, position="rope")
    first = run_script("train.py", *run, f"--init_from={trained_gpt}", "--shift_logits=True", "--anneal_steps=3")
    assert first.returncode == 0, first.stderr
    for flags, words in (([], "shift_logits=True"), (["--shift_logits=True"], "anneal_steps=3")):
        again = run_script("train.py", *run, "--init_from=resume", "--max_iters=6", *flags)
        assert again.returncode != 0 and words in again.stderr and "Traceback" not in again.stderr, again.stderr
    resumed = run_script("train.py", *run, "--init_from=resume", "--max_iters=6", "--shift_logits=True",
                         "--anneal_steps=3")
    assert resumed.returncode == 0, resumed.stderr


def test_shift_logits_without_a_gpt_run_to_start_from_is_refused(char_dataset, tmp_path):
    result = run_script("train.py", *tiny_args(char_dataset, str(tmp_path / "d"), arch="bert", objective="diffusion",
                                               shift_logits=True))
    assert result.returncode != 0 and "--shift_logits" in result.stderr and "Traceback" not in result.stderr
    assert not os.path.exists(tmp_path / "d")


def test_a_run_adapted_from_a_gpt_trained_again_since_is_not_reused(tmp_path):
    from experiments.adaptation import forget_if_stale
    gpt, adapted = tmp_path / "gpt", tmp_path / "adapted"
    gpt.mkdir(), adapted.mkdir()
    (gpt / "ckpt.pt").write_text("")
    (adapted / "study_run.json").write_text("{}")
    os.utime(gpt / "ckpt.pt", (1_000, 1_000))
    forget_if_stale(("x", "bert", "mlm", {"out_dir": str(adapted)}), str(gpt))
    assert (adapted / "study_run.json").exists()  # the gpt is older: the run stands
    os.utime(gpt / "ckpt.pt", None)  # the gpt trained again, now
    os.utime(adapted / "study_run.json", (2_000, 2_000))
    forget_if_stale(("x", "bert", "mlm", {"out_dir": str(adapted)}), str(gpt))
    assert not (adapted / "study_run.json").exists()


# ----------------------------------------------------------------------------- the experiment (--quick)

def hand_flops_per_step(C, L, V, T, B):
    """A gpt (or bert) step counted by hand: 6 FLOPs per weight per token (each block: attention's query, key,
    value and output C x C each, the MLP's two C x 4C, two norms of C; the tied head V x C) plus attention's
    12 L T^2 C."""
    weights = L * (4 * C * C + 8 * C * C + 2 * C) + V * C
    return B * (6 * T * weights + 12 * L * T * T * C)


@pytest.fixture(scope="module")
def quick(char_dataset, tmp_path_factory):
    out = tmp_path_factory.mktemp("adaptation-quick")
    result = run_script("experiments/adaptation.py", "--quick", f"--dataset={char_dataset}", f"--out_dir={out}")
    assert result.returncode == 0, result.stderr[-3000:]
    with open(out / "adaptation-quick.json") as f:
        return json.load(f), (out / "adaptation-quick.md").read_text(), out


@pytest.mark.slow
def test_the_two_phases_add_up_to_the_studys_budget(quick, meta):
    from experiments.study import SCALES
    data, _, out = quick
    s = SCALES["quick"]
    per_step = hand_flops_per_step(s["n_embd"], s["n_layer"], meta["vocab_size"], s["block_size"], s["batch_size"])
    assert data["budget_flops"] == s["gpt_iters"] * per_step  # the budget: the study's gpt iterations, by hand
    for run in data["runs"]:
        if run["target"] in ("bert", "diffusion", "gpt") and run["share"]:
            gpt_steps, own_steps = [torch.load(os.path.join(folder, "ckpt.pt"), map_location="cpu",
                                               weights_only=False)["iter_num"] for folder in (
                os.path.join(out, "checkpoints", f"quick-budget{run['share']:g}-seed{run['seed']}-gpt"),
                os.path.join(out, "checkpoints", f"quick-adapt{run['share']:g}-lr{run['rate']:g}-seed{run['seed']}-"
                                                 f"{run['target']}"))]
            assert run["gpt_flops"] == gpt_steps * per_step and run["flops"] == own_steps * per_step
        total = run["gpt_flops"] + run["flops"]
        assert data["budget_flops"] <= total < data["budget_flops"] + 2 * per_step * 1.1  # at most a step over each


@pytest.mark.slow
def test_the_quick_run_reports_every_row_its_rules_verdicts_and_control(quick):
    data, text, out = quick
    for target in ("bert", "diffusion", "t5"):
        assert f"| {target}, from scratch |" in text and f"| {target}, from gpt at 0.5 |" in text
    assert "(rule) n-gram of both sides" in text and "(rule) n-gram cosine" in text
    assert "Positive control (gpt continued" in text and "Adapted against from scratch" in text
    assert {c["kind"] for c in data["cells"]} == {"common", "tagging", "retrieval"}
    from experiments.adaptation import TARGETS
    assert len(data["runs"]) == len(TARGETS) * (1 + len(data["shares"])) * len(data["seeds"])
    assert os.path.exists(out / "adaptation-quick.png") or "matplotlib" not in sys.modules


@pytest.mark.slow
def test_the_reversal_tasks_targets_start_from_its_own_gpt_and_add_up_to_its_budget(quick):
    """Claim X4 on adapted models: each target of the reversal task starts from the gpt trained on that task's
    text at its share (not the study's), and both phases add up to reversal.py's budget."""
    from experiments.reversal import SCALES
    _, _, out = quick
    with open(out / "adaptation-reversal-quick.json") as f:
        data = json.load(f)
    work = os.path.join(str(out), "checkpoints", "reversal-quick")
    rows = {(r["target"], r["share"], r["seed"]): r for r in data["rows"]}
    assert {(t, f) for t, f, _ in rows} == {(t, f) for t in ("gpt", "bert", "diffusion", "t5") for f in (0, 0.5)}
    per_step = data["budget_flops"] / SCALES["quick"]["gpt_iters"]
    for (target, share, seed), row in rows.items():
        if share and target != "gpt":
            checkpoint = torch.load(os.path.join(work, f"from-adapt{share:g}-lr0.003-seed{seed}-{target}", "ckpt.pt"),
                                    map_location="cpu", weights_only=False)
            assert checkpoint["config"]["init_from"] == os.path.join(work, f"budget{share:g}-seed{seed}-gpt")
            assert row["gpt_flops"] == rows[("gpt", share, seed)]["flops"] > 0
        total = row["gpt_flops"] + row["flops"]
        wanted = data["budget_flops"] * (share if target == "gpt" and share else 1)
        assert wanted <= total < wanted + 2 * per_step * 1.1  # at most a step over each phase (t5's a bit dearer)
    text = (out / "adaptation-reversal-quick.md").read_text()
    assert "| bert, from gpt at 0.5 |" in text and "(rule) lookup of the facts both ways" in text


def test_the_reversal_verdicts_read_only_rows_that_learned_the_facts():
    """A row whose model did not learn the facts (forward under 90% in a seed) decides nothing (the positive
    control), and a difference is called only where the ranges do not overlap."""
    from experiments import reversal
    from experiments.adaptation_report import reversal_report

    def row(target, share, seed, forward, backward):
        return {"target": target, "share": share, "seed": seed, "val_loss": 1.0, "flops": 1.0, "gpt_flops": 0.0,
                "eval": {"forward": (forward, forward), "backward": (backward, backward),
                         "backward, infill": (1.0, 1.0)}, "train_half_backward": (1.0, 1.0)}
    rows = []
    for seed in (1, 2, 3):
        rows += [row("gpt", 0, seed, 1.0, 0.0), row("gpt", 0.5, seed, 1.0, 0.0),
                 row("bert", 0, seed, 1.0, 0.1 + seed / 100), row("bert", 0.5, seed, 1.0, 0.6 + seed / 100),
                 row("diffusion", 0, seed, 1.0, 0.1), row("diffusion", 0.5, seed, 0.95 - seed / 10, 0.9),
                 row("t5", 0, seed, 0.95, 0.5 + seed / 100), row("t5", 0.5, seed, 1.0, 0.1 * seed)]
    data = {"scale": "cpu", "sizes": reversal.SCALES["cpu"], "seeds": [1, 2, 3], "shares": [0.5], "rows": rows,
            "budget_flops": 1.0, "baselines": {}, "machine": "a machine", "seconds": 60.0}
    text = "\n".join(reversal_report(data))
    assert "| bert | backward | adapted ahead |" in text and "| bert | backward, infill | within noise |" in text
    assert "| diffusion | backward | - |" in text and "not passed by diffusion, from gpt at 0.5**" in text
    assert "| t5 | backward | scratch ahead |" in text


@pytest.mark.parametrize("flag, words", [("--part=both", "reversal"), ("--seed=4294967295", "past 2**32 - 1")])
def test_an_unknown_part_or_a_seed_out_of_range_is_one_line_before_any_work(tmp_path, flag, words):
    """The seeds of both parts (3 at the cpu scale) are checked before the first run trains."""
    result = run_script("experiments/adaptation.py", "--part=reversal" if "seed" in flag else "--quick", flag,
                        f"--out_dir={tmp_path / 'o'}")
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert flag in lines[0] and words in lines[0]
    assert not list((tmp_path / "o").rglob("*.*"))  # no result file, no dataset, no run


def test_verdicts_call_a_difference_only_when_the_ranges_do_not_overlap():
    from experiments.adaptation_report import verdict
    assert verdict([1.0, 1.1, 0.9], [2.0, 2.1, 1.9], "lower") == "adapted ahead"
    assert verdict([1.0, 1.1, 0.9], [2.0, 2.1, 1.9], "higher") == "scratch ahead"
    assert verdict([1.0, 1.5, 0.5], [1.2, 1.3, 1.1], "lower") == "within noise"
