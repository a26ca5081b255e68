"""Objectives: BERT's 15% / 80 / 10 / 10, T5's span corruption exactly, CLM's shift, prefix LM; and property tests
over random lengths, rates and seeds (claims C1, C2, F1)."""
import random

import pytest
import torch

import objectives
from model import IGNORE_INDEX


def windows_of(n_rows, T, specials, seed=0, with_specials=False):
    g = torch.Generator().manual_seed(seed)
    w = torch.randint(0, specials.num_ordinary, (n_rows, T + 1), generator=g)
    if with_specials:  # sprinkle special tokens that must never be corrupted
        where = torch.rand(n_rows, T + 1, generator=g) < 0.05
        w[where] = specials.eos
    return w


def test_clm_targets_are_inputs_shifted_by_one(specials):
    w = windows_of(3, 16, specials)
    b = objectives.clm(w)
    assert torch.equal(b.targets[:, :-1], b.inputs[:, 1:]) and torch.equal(b.targets[:, -1], w[:, -1])
    assert b.supervised_fraction() == 1.0


def test_mlm_proportions_on_a_million_tokens(specials):
    w = windows_of(4000, 250, specials, with_specials=True)  # 10^6 positions
    g = torch.Generator().manual_seed(1)
    b = objectives.mlm(w, specials, g)
    x = w[:, :-1]
    eligible = x < specials.num_ordinary
    chosen = b.targets != IGNORE_INDEX
    assert not (chosen & ~eligible).any(), "special tokens are never chosen"
    assert torch.equal(b.inputs[~eligible], x[~eligible])
    rate = chosen.sum().item() / eligible.sum().item()
    masked = (b.inputs == specials.mask) & chosen
    unchanged = (b.inputs == x) & chosen
    random_ = chosen & ~masked & ~unchanged
    n = chosen.sum().item()
    assert abs(rate - 0.15) < 0.005
    assert abs(masked.sum().item() / n - 0.80) < 0.005
    # a random replacement can draw the original token (1 in 65 here): count those among "unchanged"
    p_same = 1 / specials.num_ordinary
    assert abs(random_.sum().item() / n - 0.10 * (1 - p_same)) < 0.005
    assert abs(unchanged.sum().item() / n - (0.10 + 0.10 * p_same)) < 0.005
    assert torch.equal(b.targets[chosen], x[chosen])


def test_mlm_rate_and_split_are_configurable(specials):
    w = windows_of(500, 200, specials)
    b = objectives.mlm(w, specials, torch.Generator().manual_seed(0), rate=0.4, mask_fraction=1.0, random_fraction=0.0)
    chosen = b.targets != IGNORE_INDEX
    assert abs(chosen.float().mean().item() - 0.4) < 0.005
    assert (b.inputs[chosen] == specials.mask).all()


def test_span_counts_follow_t5s_formulas():
    for L in range(2, 600):
        num_noise, num_spans = objectives.span_counts(L)
        expected_noise = min(max(round(L * 0.15), 1), L - 1)
        assert num_noise == expected_noise
        assert num_spans == min(max(1, round(expected_noise / 3)), expected_noise, L - expected_noise)


def reconstruct(source, target, specials):
    """Put the spans back: each sentinel in the source is replaced by the tokens after it in the target. Both end
    with the EOS that span corruption appends (the text itself may contain EOS tokens too)."""
    assert source[-1] == specials.eos and target[-1] == specials.eos
    spans, current = {}, None
    for t in target[:-1].tolist():
        if t in specials.sentinels:
            current = t
            spans[current] = []
        else:
            spans[current].append(t)
    out = []
    for t in source[:-1].tolist():
        out += spans[t] if t in spans else [t]
    return out


def test_span_corruption_counts_sentinels_and_reconstruction(specials):
    g = torch.Generator().manual_seed(0)
    for L in [2, 3, 5, 10, 20, 33, 64, 100, 255, 256]:
        for _ in range(5):
            tokens = torch.randint(0, specials.num_ordinary, (L,), generator=g)
            source, target = objectives.corrupt_spans(tokens, specials, g)
            num_noise, num_spans = objectives.span_counts(L)
            assert len(source) == L - num_noise + num_spans + 1 and len(target) == num_noise + num_spans + 1
            assert source[-1] == specials.eos and target[-1] == specials.eos
            sentinels_in_source = [t for t in source.tolist() if t in specials.sentinels]
            assert sentinels_in_source == specials.sentinels[:num_spans]  # numbered in order
            assert [t for t in target.tolist() if t in specials.sentinels] == specials.sentinels[:num_spans]
            assert target[0] == specials.sentinels[0] and source[0] != specials.sentinels[0]  # starts non-noise
            assert reconstruct(source, target, specials) == tokens.tolist()


def test_span_corruption_mean_span_length(specials):
    g = torch.Generator().manual_seed(0)
    lengths = []
    for _ in range(200):
        source, target = objectives.corrupt_spans(torch.randint(0, 60, (200,), generator=g), specials, g)
        n_spans = sum(1 for t in target.tolist() if t in specials.sentinels)
        lengths.append((len(target) - 1 - n_spans) / n_spans)
    assert abs(sum(lengths) / len(lengths) - 3.0) < 0.1


@pytest.mark.parametrize("arch", ["t5", "prefixlm"])
def test_span_corruption_batches_fit_the_block(specials, arch):
    T = 64
    b = objectives.span_corruption(windows_of(4, T, specials), specials, torch.Generator().manual_seed(0), arch)
    assert b.inputs.size(1) <= T and b.targets.size(1) <= T
    if arch == "t5":
        assert torch.equal(b.decoder_inputs[:, 1:], b.targets[:, :-1]) and (b.decoder_inputs[:, 0] == specials.pad).all()
    else:
        assert b.prefix_length is not None and b.decoder_inputs is None


@pytest.mark.parametrize("arch", ["t5", "prefixlm"])
def test_sampling_after_span_corruption_asks_in_the_layout_training_wrote(specials, meta, arch, monkeypatch):
    """Claim F1 (and A2: prefixlm trains on t5's layout flattened): what a span-corruption model reads ends with
    a sentinel and [EOS] (t5's encoder input, prefixlm's prefix), and what it writes first is <S0>. sample.py asks
    it to continue a text in that layout, the text followed by <S0> [EOS], with the sentinels it writes allowed."""
    import sample
    from model import ModelConfig, Transformer
    b = objectives.span_corruption(windows_of(8, 32, specials), specials, torch.Generator().manual_seed(0), arch)
    ends = (b.lengths if b.lengths is not None else torch.full((8,), b.inputs.size(1))) if arch == "t5" \
        else b.prefix_length
    last = b.inputs[torch.arange(8), ends - 1]
    first_written = b.targets[:, 0] if arch == "t5" else b.targets[torch.arange(8), ends - 1]
    assert (last == specials.eos).all() and (first_written == specials.sentinels[0]).all()
    asked = {}

    def generate(model, prompt, max_new_tokens, sampling, *_, **__):
        asked.update(source=(prompt.encoder_inputs if arch == "t5" else prompt)[0].tolist(),
                     banned=sampling.banned.tolist())
        return torch.zeros((1, 4), dtype=torch.long)

    monkeypatch.setattr(sample, "generate", generate)
    model = Transformer(ModelConfig(arch=arch, vocab_size=meta["vocab_size"], block_size=32, n_layer=1,
                                    n_decoder_layer=int(arch == "t5"), n_head=2, n_embd=16))
    sample.generate_left_to_right(model, [5, 6, 7], "span_corruption", specials, dict(sample.DEFAULTS), None, None)
    assert asked["source"] == [5, 6, 7, specials.sentinels[0], specials.eos]
    assert not set(specials.sentinels) & set(asked["banned"]) and specials.mask in asked["banned"]


def test_prefix_lm_supervises_the_suffix_only(specials):
    T = 32
    w = windows_of(64, T, specials)
    b = objectives.prefix_lm(w, specials, torch.Generator().manual_seed(0), "prefixlm")
    assert b.inputs.shape == (64, T) and torch.equal(b.inputs, w[:, :-1])
    P = b.prefix_length
    assert P.min() >= 1 and P.max() <= T - 1
    for row in range(64):
        supervised = (b.targets[row] != IGNORE_INDEX).nonzero().flatten()
        assert supervised.tolist() == list(range(P[row] - 1, T))
        assert torch.equal(b.targets[row, P[row] - 1:], w[row, P[row]:])
    t5 = objectives.prefix_lm(w, specials, torch.Generator().manual_seed(0), "t5")
    for row in range(64):  # t5: prefix to the encoder, suffix from the decoder; together the window
        source = t5.inputs[row, :t5.lengths[row]] if t5.lengths is not None else t5.inputs[row]
        target = t5.targets[row][t5.targets[row] != IGNORE_INDEX]
        assert torch.equal(torch.cat([source, target]), w[row])


# ----------------------------------------------------------------------------- property tests

def recovered_text(b, row, arch, specials, continuation):
    """The text a seq2seq batch row encodes: source (minus its mode token) with the target put back."""
    target = b.targets[row][b.targets[row] != IGNORE_INDEX]
    if arch == "t5":
        source = b.inputs[row, :b.lengths[row]] if b.lengths is not None else b.inputs[row]
        # decoder inputs are the targets shifted right behind the start token
        assert b.decoder_inputs[row, 0] == specials.pad
        assert torch.equal(b.decoder_inputs[row, 1:len(target)], target[:-1])
    else:
        P = int(b.prefix_length[row])
        source = b.inputs[row, :P]
        # ignore-index placement: the loss starts at the last source position and follows the inputs
        assert (b.targets[row, :P - 1] == IGNORE_INDEX).all()
        assert torch.equal(b.targets[row, P - 1:P - 1 + len(target)], target)
        assert torch.equal(b.inputs[row, P:P - 1 + len(target)], target[:-1])
    if len(source) and int(source[0]) in specials.modes.values():
        continuation = int(source[0]) == specials.modes["S"]
        source = source[1:]
    if continuation:
        return torch.cat([source, target]).tolist()
    return reconstruct(source, target, specials)


@pytest.mark.parametrize("seed", range(6))
def test_every_objective_on_random_lengths_rates_and_seeds(specials, seed):
    rng = random.Random(seed)
    for _ in range(8):
        T = rng.choice([2, 3, 4, 5, rng.randint(2, 96)])
        w = windows_of(rng.randint(1, 5), T, specials, seed=rng.randint(0, 10 ** 6), with_specials=True)
        g = torch.Generator().manual_seed(rng.randint(0, 10 ** 6))
        rate = rng.uniform(0.05, 0.9)
        mask_fraction = rng.uniform(0, 1)
        knobs = dict(mlm_rate=rate, mlm_mask_fraction=mask_fraction,
                        mlm_random_fraction=rng.uniform(0, 1 - mask_fraction), noise_density=min(rate, 0.5),
                        mean_span=rng.choice([1.0, 3.0, 8.0]),
                        ul2_mixture=tuple(rng.choice([0.0, 0.2, 1.0]) for _ in range(2)) + (0.5,))
        for arch, names in objectives.OBJECTIVES_FOR_ARCH.items():
            for name in names:
                if name == "span_corruption" and T < (5 if arch == "prefixlm" else 3):  # 2 tokens: 1 kept, 1 noise
                    with pytest.raises(ValueError, match="longer block"):  # nothing fits: a clear error
                        objectives.batch_for(dict(knobs, objective=name, arch=arch), w, specials, g)
                    continue
                b = objectives.batch_for(dict(knobs, objective=name, arch=arch), w, specials, g)
                assert b.inputs.size(0) == w.size(0)
                assert b.inputs.size(1) <= T and b.targets.size(1) <= T
                assert b.supervised_positions() >= (0 if name == "diffusion" else 1)  # t can mask nothing
                ids = b.targets[b.targets != IGNORE_INDEX]
                assert (ids >= 0).all() and (ids < specials.num_ordinary + 106).all()
                if arch == "t5":
                    assert b.decoder_inputs.shape == b.targets.shape
                else:
                    assert b.targets.shape == b.inputs.shape
                if name in ("mlm", "diffusion"):  # specials stay where they were, never supervised
                    x = w[:, :-1]
                    special = x >= specials.num_ordinary
                    assert torch.equal(b.inputs[special], x[special])
                    assert (b.targets[special] == IGNORE_INDEX).all()
                    supervised = b.targets != IGNORE_INDEX
                    assert torch.equal(b.targets[supervised], x[supervised])  # the original token
                    assert torch.equal(b.inputs[~supervised], x[~supervised])  # unsupervised: untouched
                elif name == "clm":
                    assert torch.equal(b.targets, w[:, 1:])
                elif name in ("span_corruption", "prefix_lm", "ul2"):  # inputs + targets give back the window
                    for row in range(w.size(0)):
                        text = recovered_text(b, row, arch, specials, continuation=name == "prefix_lm")
                        assert len(text) >= 2 and text == w[row, :len(text)].tolist(), (name, arch, T)


def test_wrong_objective_for_arch_is_refused(specials):
    with pytest.raises(ValueError, match="does not fit"):
        objectives.batch_for({"objective": "mlm", "arch": "gpt"}, windows_of(2, 8, specials), specials, torch.Generator())


def test_the_synthetic_specials_are_the_layout_prepare_writes():
    """objectives.synthetic_specials (the demo's and bench.py's random tokens) restates data/prepare_common.py's
    layout, which the chapter core may not import: the two must not drift apart."""
    from data.prepare_common import NUM_SENTINELS, SPECIAL_TOKENS, special_token_ids
    ordinary = 65
    written = objectives.Specials.from_meta({"specials": special_token_ids(ordinary), "num_ordinary": ordinary,
                                             "num_sentinels": NUM_SENTINELS})
    assert objectives.synthetic_specials(ordinary + len(SPECIAL_TOKENS)) == written
