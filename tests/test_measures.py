"""The functions that turn trained models into the study's numbers, each read against an independent computation
on a stand-in whose answer is known in closed form (claims B1, C2, C4, D1, D3, D5), and the training path's
objective settings pinned to the published values (C1, C2, F1, F2), not to the tables under test."""
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import objectives
import train
from experiments import equal_compute, metrics, study
from experiments.study_report import past_the_plateau

V, T, N = 12, 24, 32  # text vocabulary, window length, windows
LN2 = math.log(2)


def stand_in_specials():
    """Text ids 0..V-1, then the project's specials (the order of data/prepare_common.py)."""
    from data.prepare_common import NUM_SENTINELS, special_token_ids
    return objectives.Specials.from_meta({"specials": special_token_ids(V), "num_ordinary": V,
                                          "num_sentinels": NUM_SENTINELS})


SPECIALS = stand_in_specials()
VOCAB = V + 106


class StandIn:
    """A "model" that answers by a rule: rule(ids) -> predicted ids (or a (B, T, V) float of logits over the text), at
    every position; its logits are a peak of `sharpness` nats on that id. What the metrics call: model(inputs,
    prefix_length=..., decoder_inputs=...)[0], model.config.arch, model.eval()."""

    def __init__(self, arch, rule, sharpness=30.0):
        self.config = type("Config", (), {"arch": arch})()
        self.rule, self.sharpness = rule, sharpness

    def eval(self):
        return self

    def __call__(self, inputs, prefix_length=None, decoder_inputs=None, **_):
        predicted = self.rule(inputs, decoder_inputs)
        if predicted.dtype.is_floating_point:
            return predicted, None
        logits = torch.zeros(*predicted.shape, VOCAB)
        valid = (predicted >= 0) & (predicted < V)  # a rule with nothing to go on answers uniformly over the text
        logits[valid] = self.sharpness * F.one_hot(predicted[valid], VOCAB).float()
        return logits, None


def counting_windows(n=N, length=T, seed=0):
    """Every row counts: x[i + 1] = x[i] + 1 (mod V), from a random start. Each character is given away by its
    left neighbour (x[i-1] + 1) and by its right one (x[i+1] - 1)."""
    start = torch.randint(0, V, (n, 1), generator=torch.Generator().manual_seed(seed))
    return (start + torch.arange(length)) % V


def text_only(ids):
    return torch.where(ids < V, ids, -1)  # [MASK], sentinels: nothing to go on


def successor(inputs, decoder_inputs):  # predicts x[i + 1] from x[i]: a causal reader that knows the rule
    return torch.where(inputs < V, (inputs + 1) % V, -1)


def from_left_neighbour(inputs, decoder_inputs):  # a bidirectional reader that looks only left: x[i-1] + 1
    left = torch.cat([torch.full_like(inputs[:, :1], -1), inputs[:, :-1]], dim=1)
    return torch.where((left >= 0) & (left < V), (left + 1) % V, -1)


def from_right_neighbour(inputs, decoder_inputs):  # a bidirectional reader that looks only right: x[i+1] - 1
    right = torch.cat([inputs[:, 1:], torch.full_like(inputs[:, :1], -1)], dim=1)
    return torch.where((right >= 0) & (right < V), (right - 1) % V, -1)


def own_input(inputs, decoder_inputs):  # reads the position itself: it sees the answer only if it is not hidden
    return text_only(inputs)


def unigram(probabilities):
    """A context-free model: the same distribution over the text at every position."""
    log_p = torch.log(torch.tensor(probabilities, dtype=torch.float))
    return lambda inputs, decoder_inputs: torch.cat([log_p, torch.full((VOCAB - V,), -1e4)]).expand(
        *(decoder_inputs if decoder_inputs is not None else inputs).shape, VOCAB).clone()


def bits(name, arch, rule, windows, generator_seed=0):
    return metrics.second_half_bits(name, StandIn(arch, rule), windows, SPECIALS,
                                    torch.Generator().manual_seed(generator_seed))


# ----------------------------------------------------------------------------- the common metric and the ELBO

def t5_reader(rule_on_decoder):
    """t5's layout: the encoder reads [first half, <S0>, EOS], the decoder [PAD, <S0>, second half[:-1]]. The
    decoder's position after <S0> is predicted from the encoder's last text character, the rest from the decoder."""
    def rule(inputs, decoder_inputs):
        last_text = inputs[torch.arange(inputs.size(0)), (inputs < V).sum(1) - 1]
        out = rule_on_decoder(decoder_inputs, None)
        out[:, 1] = (last_text + 1) % V
        return out
    return rule


@pytest.mark.parametrize("arch", ["gpt", "prefixlm", "t5"])
def test_second_half_bits_reads_each_layout_where_its_next_character_is(arch):
    """A reader that knows the rule scores ~0 bits/char on counting windows; an off-by-one in the alignment of
    logits and targets would score ~log2 V."""
    windows = counting_windows()
    rule = t5_reader(successor) if arch == "t5" else successor
    score, _ = bits(arch, arch, rule, windows)
    assert score < 1e-6, score


@pytest.mark.parametrize("arch", ["gpt", "prefixlm", "t5", "bert"])
def test_second_half_bits_of_a_context_free_model_is_its_cross_entropy(arch):
    """For a unigram model the metric is -mean log2 p(x) over the second halves, computed here with numpy."""
    rng = np.random.default_rng(0)
    p = rng.dirichlet(np.ones(V))
    windows = torch.from_numpy(rng.choice(V, size=(N, T), p=p))
    score, _ = bits("bert" if arch == "bert" else arch, arch, unigram(p), windows)
    expected = -np.log2(p[windows[:, T // 2:].numpy()]).mean()
    assert score == pytest.approx(expected, rel=1e-5)


class PrefixPeeker(StandIn):
    """A prefix-LM reader that copies the next character wherever its mask shows it: position i sees i + 1 only
    inside the bidirectional prefix (i + 1 < prefix_length); elsewhere it has nothing to go on."""

    def __init__(self):
        super().__init__("prefixlm", None)

    def __call__(self, inputs, prefix_length=None, decoder_inputs=None, **_):
        positions = torch.arange(inputs.size(1))
        visible = positions[None, :-1] + 1 < prefix_length[:, None]  # (B, T - 1): is i + 1 in the prefix?
        self.rule = lambda ids, _: torch.cat([torch.where(visible, ids[:, 1:], -1), torch.full_like(ids[:, :1], -1)],
                                             dim=1)
        return super().__call__(inputs)


def test_the_prefixlm_metric_scores_only_what_its_prefix_hides():
    """prefixlm reads the first half as its bidirectional prefix, and every scored character lies after it: a
    reader that copies what its prefix shows has nothing and scores log2 V. A prefix one character longer would
    show it the first scored character (0 bits there)."""
    windows = counting_windows()
    score, _ = metrics.second_half_bits("prefixlm", PrefixPeeker(), windows, SPECIALS, torch.Generator())
    assert score == pytest.approx(math.log2(V), rel=1e-5)


def test_the_bidirectional_chain_rule_hides_the_future():
    """bert and diffusion are scored left to right with [MASK] on every position not scored yet. A reader that
    copies from the right would score 0 bits/char if the future leaked; hidden, it has nothing and scores log2 V.
    A reader that looks left is exact (the chain rule conditions on the past)."""
    windows = counting_windows()
    assert bits("bert", "bert", from_left_neighbour, windows)[0] < 1e-6
    assert bits("bert", "bert", from_right_neighbour, windows)[0] == pytest.approx(math.log2(V), rel=1e-5)
    assert bits("bert", "bert", own_input, windows)[0] == pytest.approx(math.log2(V), rel=1e-5)


def test_the_diffusion_elbo_weights_each_masked_position_by_one_over_t():
    """For a context-free model every masked position costs its cross-entropy whatever the rest, so the ELBO's
    expectation (E[masked / t] = 1 per position) is exactly the cross-entropy: log2 V for a uniform model. Weighting
    by 1 instead of 1/t would give half of it (E[t] = 1/2). The estimate is a Monte Carlo mean: within 8%."""
    windows = torch.randint(0, V, (4 * N, T), generator=torch.Generator().manual_seed(1))
    uniform = unigram(np.full(V, 1 / V))
    score, extra = bits("diffusion", "bert", uniform, windows)
    assert score == pytest.approx(math.log2(V), rel=1e-5)  # the exact chain rule of a uniform model
    assert extra["elbo_bits"] == pytest.approx(math.log2(V), rel=0.08)


def test_the_diffusion_elbo_integrates_over_every_masking_rate():
    """A reader that needs its left neighbour (x[i-1] + 1): a masked position costs log V only where that
    neighbour is masked too (probability t), and nothing otherwise; the second half's first position always has
    its neighbour in the visible first half. So E[masked * cost / t] = t log V for the other T/2 - 1 positions, and
    over t ~ U(0, 1) the ELBO is (T/2 - 1) / (T/2) * log2 V / 2 bits/char. Rates drawn from another range (U(1/2,
    1): x 1.5) or weighted by 1 (x 2/3) move it far outside the Monte Carlo's 5%."""
    windows = counting_windows(4 * N)
    _, extra = bits("diffusion", "bert", from_left_neighbour, windows)
    H = T // 2
    assert extra["elbo_bits"] == pytest.approx((H - 1) / H * math.log2(V) / 2, rel=0.05)  # ~4 standard errors


def test_stratified_diffusion_times_lower_the_noise_where_the_loss_depends_on_t():
    """objectives.diffusion(stratified=True), training's sampler (MDLM's low-discrepancy t, one per stratum of the
    batch), against t drawn independently per row (what experiments/plateau.py's time_sampler_noise compares on
    trained models). A stand-in whose cross-entropy grows with the share of its row that is masked (fewer visible
    neighbours), as a trained model's does: both estimates have the same mean (the ELBO), the stratified one a
    clearly smaller spread over batches (~1.7 x here over seeds 0..4). A flag that changed nothing gives a ratio
    of exactly 1."""
    losses = {True: [], False: []}
    generators = {True: torch.Generator().manual_seed(0), False: torch.Generator().manual_seed(0)}
    for k in range(300):
        windows = torch.randint(0, V, (8, 65), generator=torch.Generator().manual_seed(k))
        for stratified, generator in generators.items():
            batch = objectives.diffusion(windows, SPECIALS, generator, stratified=stratified)
            masked = (batch.loss_weights > 0).float()
            cost = 1 + 4 * masked.mean(1, keepdim=True)  # (B, 1) nats a masked position costs in its row
            losses[stratified].append(float((batch.loss_weights * cost).sum() / batch.loss_weights.numel()))
    stratified, independent = np.array(losses[True]), np.array(losses[False])
    standard_error = math.hypot(stratified.std(), independent.std()) / math.sqrt(len(stratified))
    assert abs(stratified.mean() - independent.mean()) < 4 * standard_error
    assert independent.std() / stratified.std() > 1.4


# ----------------------------------------------------------------------------- cloze

def blanks_of(windows, k=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.stack([torch.randperm(windows.size(1) - 2, generator=g)[:k] + 1 for _ in range(len(windows))]
                       ).sort(dim=1).values


@pytest.mark.parametrize("rule, expected", [(from_left_neighbour, 1.0), (from_right_neighbour, 1.0)])
def test_bert_cloze_sees_both_sides_of_the_blank(rule, expected):
    windows = counting_windows()
    result = metrics.cloze_accuracy("bert", StandIn("bert", rule), windows, blanks_of(windows), SPECIALS, 0)
    assert result == {"both sides": expected}


def test_bert_cloze_hides_the_blank_itself():
    """A reader of its own position sees [MASK] there and answers uniformly: argmax = id 0, so its accuracy is the
    share of blanks whose character is 0. A blank left visible would give 100%."""
    windows = counting_windows()
    blanks = blanks_of(windows)
    result = metrics.cloze_accuracy("bert", StandIn("bert", own_input), windows, blanks, SPECIALS, 0)
    assert result["both sides"] == pytest.approx((windows.gather(1, blanks) == 0).float().mean().item())


def test_t5_cloze_reads_the_sentinel_from_both_sides():
    """t5's encoder reads the window with <S0> at the blank; a reader of the character right of <S0> is exact."""
    windows = counting_windows()

    def rule(inputs, decoder_inputs):
        sentinel = (inputs == SPECIALS.sentinels[0]).float().argmax(1)
        right = inputs[torch.arange(inputs.size(0)), sentinel + 1]
        out = torch.full(decoder_inputs.shape, -1)
        out[:, 1] = (right - 1) % V
        return out

    assert metrics.cloze_accuracy("t5", StandIn("t5", rule), windows, blanks_of(windows), SPECIALS, 0) == \
        {"both sides": 1.0}


def pairs_windows(n=N, length=T, seed=0):
    """Characters in pairs: x[2j] is uniform, x[2j+1] = x[2j]. A blank at an odd position is given away by its left
    neighbour; at an even one only by its right neighbour."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, V, (n, length // 2), generator=g).repeat_interleave(2, dim=1)


def pairs_markov_model():
    """The exact joint of pairs_windows as a causal model: after an even position (index i even) the next
    character copies it; after an odd one it is uniform. Returns (model, log p(next | x, parity) table)."""
    copy = torch.log(torch.full((V, V), 1e-6) + torch.eye(V))
    copy = copy - torch.logsumexp(copy, dim=1, keepdim=True)

    def rule(inputs, decoder_inputs):
        logits = torch.full((*inputs.shape, VOCAB), -1e4)
        logits[..., :V] = 0.0  # uniform after an odd position
        even = torch.arange(inputs.size(1)) % 2 == 0
        logits[:, even, :V] = copy[inputs[:, even].clamp(max=V - 1)]
        return logits

    return StandIn("gpt", rule), copy


def brute_force_bayes(windows, blanks, copy):
    """argmax over candidates c of log p(window with c at the blank), the pairs joint written out by hand."""
    correct = total = 0
    for row, blank_row in zip(windows.tolist(), blanks.tolist()):
        for b in blank_row:
            scores = []
            for c in range(V):
                x = list(row)
                x[b] = c
                scores.append(sum(copy[x[i], x[i + 1]].item() if i % 2 == 0 else -math.log(V)
                                  for i in range(len(x) - 1)))
            correct += int(np.argmax(scores) == row[b])
            total += 1
    return correct / total


def test_gpt_cloze_left_only_and_exact_bayes_against_a_brute_force_joint():
    """On pairs: from the left, a blank at an odd position is copied (right), at an even one it is a guess; exact
    Bayes scores every candidate by the whole window's likelihood, so the right neighbour gives the even ones
    away too. Both numbers against computations written out here; a Bayes scorer that read only the left context
    would score the left-only number."""
    windows = pairs_windows()
    blanks = blanks_of(windows, k=4)
    model, copy = pairs_markov_model()
    result = metrics.cloze_accuracy("gpt", model, windows, blanks, SPECIALS, bayes_windows=N)
    odd = (blanks % 2 == 1).float()
    truth = windows.gather(1, blanks)
    left_only = (odd + (1 - odd) * (truth == 0).float()).mean().item()  # even: uniform, argmax = id 0
    assert result["left only"] == pytest.approx(left_only)
    assert result["both sides (exact Bayes)"] == pytest.approx(brute_force_bayes(windows, blanks, copy))
    assert result["both sides (exact Bayes)"] == 1.0 and left_only < 0.7


# ----------------------------------------------------------------------------- the plateau, the ranks, NoPE, C2

def test_prefixlm_cloze_reads_only_the_left_of_the_blank():
    """prefixlm's left-only cloze makes everything before the blank its bidirectional prefix, not the blank: a
    reader that copies what its prefix shows has nothing at the blank (uniform logits: it names id 0), one that
    knows the rule from the left is exact."""
    windows = counting_windows()
    blanks = blanks_of(windows)
    peeked = metrics.cloze_accuracy("prefixlm", PrefixPeeker(), windows, blanks, SPECIALS, 0)["left only"]
    assert peeked == pytest.approx((windows.gather(1, blanks) == 0).float().mean().item())
    assert metrics.cloze_accuracy("prefixlm", StandIn("prefixlm", successor), windows, blanks, SPECIALS,
                                  0)["left only"] == 1.0


def test_the_character_frequency_references_by_hand(tmp_path):
    """The floor every model is read against: bits/char of the second halves under add-one smoothed training
    frequencies, and the cloze accuracy of always naming the most frequent training character, computed here from
    the counts with numpy."""
    rng = np.random.default_rng(0)
    train = rng.choice(V, size=5000, p=rng.dirichlet(np.ones(V))).astype(np.uint16)
    train.tofile(tmp_path / "train.bin")
    windows = torch.from_numpy(rng.choice(V, size=(N, T)))
    blanks = blanks_of(windows)
    counts = np.bincount(train, minlength=V)
    p = (counts + 1) / (counts + 1).sum()
    reference = metrics.unigram_reference(str(tmp_path / "train.bin"), windows, blanks, V)
    assert reference["bits_per_char"] == pytest.approx(-np.log2(p[windows[:, T // 2:].numpy()]).mean(), rel=1e-9)
    assert reference["cloze"] == pytest.approx((windows.gather(1, blanks).numpy() == counts.argmax()).mean())


def test_the_correction_probes_rule_is_learned_from_the_training_positions():
    """The rule beside the probe names the most frequent target of the *training* positions: there the next
    character is mostly 2; in the test windows it is 2 in a quarter of the rows and 1 in the rest, so the rule scores
    25% (a rule fitted on the test positions would name 1 and score 75%)."""
    class OneHotStates:  # its "states" are the characters themselves
        def run_stack(self, windows):
            return F.one_hot(windows, V).float()
    train_windows = torch.full((N, T), 2, dtype=torch.long)
    train_windows[:, ::5] = 0
    test_windows = torch.ones(N, T, dtype=torch.long)
    test_windows[:N // 4] = 2
    _, rule = metrics.correction_probe(OneHotStates(), train_windows, test_windows, V, seed=0, task="next character",
                                       steps=5)
    assert rule == pytest.approx(0.25)


def test_the_plateau_check_can_say_no():
    data = {"plateau_control": {"margin": 0.3, "threshold": {"bert": 2.97, "bert-100%-mask": 3.07}},
            "ablation": {"models": {"bert": [{"val_loss": 2.1}, {"val_loss": 2.5}],
                                    "bert-100%-mask": [{"val_loss": 2.4}, {"val_loss": 3.2}]}}}
    assert past_the_plateau(data) == (False, ["bert-100%-mask"])  # 3.2 is not 0.3 under its reference 3.37
    data["ablation"]["models"]["bert-100%-mask"][1]["val_loss"] = 3.0
    assert past_the_plateau(data) == (True, [])
    data["ablation"]["models"]["bert"][0]["val_loss"] = None  # a diverged run did not learn
    assert past_the_plateau(data) == (False, ["bert"])


def test_character_frequencies_are_counted_from_the_data(tmp_path):
    """What character frequencies alone give: the validation text's cross-entropy under the training text's
    add-one-smoothed frequencies, by hand on a 3-letter alphabet."""
    np.array([0] * 6 + [1] * 2, dtype=np.uint16).tofile(tmp_path / "train.bin")
    np.array([0, 1, 2, 2], dtype=np.uint16).tofile(tmp_path / "val.bin")
    p = np.array([7, 3, 1]) / 11  # add-one counts 6+1, 2+1, 0+1
    expected = -(np.log(p[0]) + np.log(p[1]) + 2 * np.log(p[2])) / 4
    nats = metrics.character_frequency_nats(str(tmp_path / "train.bin"), str(tmp_path / "val.bin"), 3)
    assert nats == pytest.approx(expected, rel=1e-12)


def test_the_plateau_control_is_what_a_context_free_predictor_reaches(tmp_path):
    """The control every study run must pass: its own loss 0.3 nats under what a predictor that reads only the
    input token at its position reaches, under the same objective. On a text "abab...": for clm that predictor is
    the bigram, which knows the next character (loss ~0: a gpt has to learn nothing more to reach it); for
    100%-[MASK] MLM it sees only [MASK], so character frequencies (log 2 for two equally frequent letters); a
    control that always passes (a threshold from the wrong predictor, or no margin) fails here."""
    from data.prepare_common import write_dataset
    from infra.dataset import load_dataset
    folder = tmp_path / "abab"
    folder.mkdir()
    write_dataset(str(folder), np.array([0, 1] * 20000, dtype=np.uint16), {"tokenizer": "char", "num_ordinary": 2, "itos": {0: "a", 1: "b"},
                                                "stoi": {"a": 0, "b": 1}})
    splits, meta = load_dataset(str(folder), 16, False)
    s = dict(batch_size=8, block_size=16)
    models = [("gpt", "gpt", "clm", {}), ("all-mask", "bert", "mlm", {"mlm_mask_fraction": 1.0,
                                                                     "mlm_random_fraction": 0.0})]
    control = metrics.plateau_control(splits, meta, s, models)
    assert control["reference"]["gpt"] < 0.01  # the bigram of "abab" is certain
    V = meta["vocab_size"]  # add-one over the whole vocabulary: a little over log 2
    assert math.log(2) < control["reference"]["all-mask"] < math.log(2) + 0.01 * V
    assert control["threshold"] == {k: v - metrics.PLATEAU_MARGIN for k, v in control["reference"].items()}
    assert metrics.PLATEAU_MARGIN == 0.3
    reference = control["reference"]["all-mask"]
    assert metrics.past_plateau(reference - 0.31, control, "all-mask")
    assert not metrics.past_plateau(reference - 0.29, control, "all-mask")
    assert not metrics.past_plateau(reference, control, "all-mask")  # what frequencies alone give: not learned
    assert not metrics.past_plateau(None, control, "all-mask")  # diverged


def test_a_kept_rate_at_the_edge_of_its_grid_gets_the_next_rate_beyond():
    grids = {"a": [1e-3, 2e-3, 4e-3], "b": [1e-3, 2e-3, 4e-3], "c": [1e-3, 2e-3, 4e-3]}
    chosen = {"a": 4e-3, "b": 2e-3, "c": 1e-3}
    assert study.next_rates(grids, chosen, 2) == {"a": [8e-3], "c": [5e-4]}  # b's is inside: nothing to add
    results = {("a", 1e-3, 1): {"val_loss": 2.0}, ("a", 1e-3, 2): {"val_loss": 3.0},
               ("a", 2e-3, 1): {"val_loss": 1.0}, ("a", 2e-3, 2): {"val_loss": None}}
    assert study.mean_loss(results, "a", 1e-3, [1, 2]) == 2.5  # the mean over seeds, not the first seed's
    assert study.mean_loss(results, "a", 2e-3, [1, 2]) == float("inf")  # a seed diverged: never kept


def test_rank_summary_on_matrices_of_known_singular_values():
    """Numerical rank counts the non-zero singular values; effective rank is exp of the entropy of their shares
    (Roy & Vetterli 2007): 2 equal ones -> 2, shares (1/2, 1/4, 1/4) -> 2^1.5."""
    two = torch.diag(torch.tensor([1.0, 1.0, 0.0, 0.0]))[None]
    assert study.rank_summary(two) == {"numerical": 2.0, "effective": pytest.approx(2.0)}
    shares = torch.diag(torch.tensor([2.0, 1.0, 1.0]))[None]
    assert study.rank_summary(shares)["effective"] == pytest.approx(2 ** 1.5)
    assert study.rank_summary(torch.full((1, 5, 5), 0.2))["numerical"] == 1.0  # uniform bidirectional


def test_the_rank_baselines_are_the_models_at_initialisation_and_uniform_attention():
    from model import ModelConfig, Transformer
    trained = {name: Transformer(ModelConfig(arch=arch, vocab_size=VOCAB, block_size=16, n_layer=1, n_head=2,
                                             n_embd=16)) for name, arch in (("gpt", "gpt"), ("bert", "bert"))}
    windows = counting_windows(4, 16)
    baselines = study.attention_rank_baselines(trained, windows, seed=3)
    torch.manual_seed(3)
    fresh = Transformer(trained["gpt"].config).eval()  # what "at initialisation" must be: the seed's fresh weights
    assert baselines["gpt at initialisation"] == study.attention_ranks(fresh, windows)
    assert baselines["uniform causal"]["numerical"] == 16 and baselines["uniform bidirectional"]["numerical"] == 1


def test_the_nope_models_are_causal_and_bidirectional_with_and_without_positions(monkeypatch):
    """Claim D5's comparison: which model has which mask and which positions, as nope_experiment builds them."""
    assert study.NOPE_MODELS == (("causal, NoPE", "gpt", "none"), ("bidirectional, NoPE", "bert", "none"),
                                 ("causal, learned positions", "gpt", "learned"),
                                 ("bidirectional, learned positions", "bert", "learned"))
    built = []
    real = study.Transformer

    def recording(config):
        built.append((config.arch, config.position))
        return real(config)

    monkeypatch.setattr(study, "Transformer", recording)
    results = study.nope_experiment(1, "cpu", [0])
    assert built == [(arch, position) for _, arch, position in study.NOPE_MODELS]
    baselines = study.position_blind_baselines(torch.tensor([[1, 1, 2, 3, 4, 5, 6, 7], [0] * 8]))
    assert baselines["order-blind best (the most frequent digit of the input)"] == pytest.approx((2 / 8 + 1) / 2)
    assert set(results) >= {name for name, _, _ in study.NOPE_MODELS}


def mask_shares(config, specials, rows=1000, length=200):
    """What share of the supervised positions of the batches this config trains on hold [MASK], a random other
    character, or the original character (BERT: 80 / 10 / 10)."""
    g = torch.Generator().manual_seed(0)
    windows = torch.randint(0, specials.num_ordinary, (rows, length + 1), generator=g)
    batch = objectives.batch_for(config, windows, specials, g)
    chosen = batch.targets != -100
    inputs, original = batch.inputs[chosen], windows[:, :-1][chosen]
    return (chosen.float().mean().item(), (inputs == specials.mask).float().mean().item(),
            ((inputs != specials.mask) & (inputs != original)).float().mean().item())


def test_the_c2_ablation_trains_on_80_10_10_against_100_percent_mask(specials, meta):
    """The two models of claim C2 as the study trains them: the same config but the masking."""
    s = study.SCALES["quick"]
    by_name = {m[0]: m for m in study.MODELS}
    shares = {}
    for name in ("bert", "bert-100%-mask"):
        run = study.study_run(by_name[name], 5e-4, 1337, "out", 2)
        extra = {k: v for k, v in run[3].items() if k != "budget_fraction"}
        config = equal_compute.equal_flops_config((run[0], run[1], run[2], extra), 2, s, "shakespeare_char", "out", "cpu",
                                          meta, 1337, True, 1e9)
        shares[name] = mask_shares(config, specials)
    (rate, mask, random), (rate_100, mask_100, random_100) = shares["bert"], shares["bert-100%-mask"]
    assert rate == pytest.approx(0.15, abs=0.01) and rate_100 == pytest.approx(0.15, abs=0.01)
    other = 1 - 1 / specials.num_ordinary  # a random token is sometimes the original one
    assert mask == pytest.approx(0.8, abs=0.02) and random == pytest.approx(0.1 * other, abs=0.02)
    assert mask_100 == 1.0 and random_100 == 0.0


# ----------------------------------------------------------------------------- the training path: published values

def test_train_py_trains_bert_at_15_percent_with_80_10_10(specials):
    """Devlin et al. 2019 (BERT), section 3.1: 15% of the positions chosen; of those 80% [MASK], 10% a random token,
    10% unchanged. As train.py's default config passes them to the objective."""
    rate, mask, random = mask_shares(train.resolve_config(["--arch=bert"]), specials)
    assert rate == pytest.approx(0.15, abs=0.005)
    other = 1 - 1 / specials.num_ordinary
    assert mask == pytest.approx(0.80, abs=0.015) and random == pytest.approx(0.10 * other, abs=0.015)


@pytest.mark.parametrize("arch", ["t5", "prefixlm"])
def test_train_py_corrupts_15_percent_in_spans_of_mean_3(specials, arch):
    """Raffel et al. 2020 (T5), section 3.3: noise density 15%, mean span length 3, each span one sentinel. As
    train.py's default config makes them (t5's default objective; prefixlm's with --objective)."""
    config = train.resolve_config([f"--arch={arch}", "--objective=span_corruption", "--block_size=256"])
    g = torch.Generator().manual_seed(0)
    windows = torch.randint(0, specials.num_ordinary, (64, 257), generator=g)
    batch = objectives.batch_for(config, windows, specials, g)
    targets = batch.targets[batch.targets != -100]
    noise = int((targets < specials.num_ordinary).sum())
    spans = int(torch.isin(targets, torch.tensor(specials.sentinels)).sum())
    source = batch.inputs if arch == "t5" else \
        batch.inputs[torch.arange(batch.inputs.size(1))[None, :] < batch.prefix_length[:, None]]  # prefixlm: its prefix
    text = noise + int((source < specials.num_ordinary).sum())  # the text a span corruption started from
    assert noise / text == pytest.approx(0.15, abs=0.01) and noise / spans == pytest.approx(3.0, abs=0.1)


def test_ul2_denoisers_and_mixture_against_the_published_ones():
    """UL2's seven denoisers as (mode, mean span, noise density), and its mode tokens: R -> [NLU], X -> [NLG],
    S -> [S2S] (Tay et al. 2022, UL2, section 3.1; the tokens as U-PaLM, Tay et al. 2022b, section 2.3, describes the
    UL2 design); S is the prefix LM with a random split point. The default mixture S / R / X = 50 / 25 / 25 is
    U-PaLM's UL2R recipe ("50% PrefixLM, 25% long (extreme) span corruption, and 25% regular span corruption")."""
    assert objectives.UL2_DENOISERS == {
        "R-3": ("R", 3, 0.15), "R-8": ("R", 8, 0.15),
        "X-3": ("X", 3, 0.5), "X-8": ("X", 8, 0.5), "X-64-0.15": ("X", 64, 0.15), "X-64-0.5": ("X", 64, 0.5),
        "S": ("S", None, None)}
    assert train.DEFAULTS["ul2_mixture"] == (0.5, 0.25, 0.25)
    meta = {"specials": {"[NLU]": 1, "[NLG]": 2, "[S2S]": 3, "[PAD]": 0, "[EOS]": 4, "[MASK]": 5},
            "num_ordinary": 0, "num_sentinels": 0}
    assert objectives.Specials.from_meta(meta).modes == {"R": 1, "X": 2, "S": 3}
