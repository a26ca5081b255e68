"""The chapter's mathematical claims as tests. Each docstring quotes the claim id (../shared/CHAPTER.md)."""
import functools
import itertools

import torch

import masks
import objectives
from experiments import published_claims
from infra.attention_maps import attention_maps, explicit_attention_probabilities
from model import ModelConfig, Transformer

SYMBOLS, LENGTH = 3, 4
ALL_SEQUENCES = torch.tensor(list(itertools.product(range(SYMBOLS), repeat=LENGTH)))  # all 81


def tiny(arch, vocab, position="learned", block=LENGTH + 1, seed=0):
    torch.manual_seed(seed)
    return Transformer(ModelConfig(arch=arch, vocab_size=vocab, block_size=block, n_layer=2, n_head=2, n_embd=16,
                                   position=position, dropout=0.0))


def fit(model, make_batch, steps=100):
    """A few optimizer steps on a Markov chain (each symbol repeats the previous one with probability 0.8), so the
    conditionals are far from uniform and depend on the neighbours."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-2)
    g = torch.Generator().manual_seed(0)
    for _ in range(steps):
        x = torch.randint(0, SYMBOLS, (32, LENGTH), generator=g)
        for i in range(1, LENGTH):
            x[:, i] = torch.where(torch.rand(32, generator=g) < 0.8, x[:, i - 1], x[:, i])
        inputs, targets = make_batch(x, g)
        _, loss = model(inputs, targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return model.eval()


BOS, MASK = SYMBOLS, SYMBOLS


def next_symbol_batch(x, g):
    """GPT's task on these tiny sequences: BOS x1 x2 x3 -> x1 x2 x3 x4."""
    return torch.cat([torch.full((x.size(0), 1), BOS), x[:, :-1]], dim=1), x


@functools.cache
def trained_gpt():
    """The fitted gpt of the C4 tests, trained once (the tests only read it)."""
    with torch.enable_grad():
        return fit(tiny("gpt", SYMBOLS + 1), next_symbol_batch)


def mask_one_position(x, g):
    """BERT's task on these tiny sequences: one position masked, predicted from the others."""
    chosen = torch.arange(LENGTH) == torch.randint(0, LENGTH, (x.size(0), 1), generator=g)
    return torch.where(chosen, MASK, x), torch.where(chosen, x, -100)


def gpt_log_probability(model, x):
    """log p(x) = sum_i log p(x_i | BOS, x_<i), normalised over the symbols (chain rule)."""
    inputs = torch.cat([torch.full((x.size(0), 1), BOS), x[:, :-1]], dim=1)
    logp = torch.log_softmax(model(inputs)[0][..., :SYMBOLS].double(), dim=-1)
    return logp.gather(-1, x[..., None])[..., 0].sum(-1)


def bert_conditionals(model, x):
    """p(x_i = v | x_-i) for every sequence, position and symbol: (N, LENGTH, SYMBOLS), each position masked in turn."""
    out = []
    for i in range(LENGTH):
        masked = x.clone()
        masked[:, i] = MASK
        out.append(torch.softmax(model(masked)[0][:, i, :SYMBOLS].double(), dim=-1))
    return torch.stack(out, dim=1)


def conditionals_of_joint(joint):
    """The full conditionals p(x_i = v | x_-i) that a joint distribution over ALL_SEQUENCES implies."""
    table = joint.view((SYMBOLS,) * LENGTH)
    out = torch.empty(len(ALL_SEQUENCES), LENGTH, SYMBOLS, dtype=torch.double)
    for n, x in enumerate(ALL_SEQUENCES.tolist()):
        for i in range(LENGTH):
            row = torch.stack([table[tuple(x[:i] + [v] + x[i + 1:])] for v in range(SYMBOLS)])
            out[n, i] = row / row.sum()
    return out


def worst_cycle_inconsistency(conditionals):
    """Full conditionals come from one joint distribution only if, for any two positions i, j and any fixed rest of
    the sequence, the pair p(x_i | x_j, rest), p(x_j | x_i, rest) comes from one joint over (x_i, x_j): every cycle
    (a,b) -> (a',b) -> (a',b') -> (a,b') -> (a,b) of conditional ratios multiplies to 1. The pair check is the
    project's own (published_claims.worst_cycle_inconsistency, run there on GPT-2 and BERT); this takes the worst
    |log| of the cycle product over every pair of positions and every rest (0 for a joint)."""
    log_c = conditionals.log().view((SYMBOLS,) * LENGTH + (LENGTH, SYMBOLS))
    worst = 0.0
    for i, j in itertools.combinations(range(LENGTH), 2):
        for rest in itertools.product(range(SYMBOLS), repeat=LENGTH - 2):
            def at(a, b):  # the sequence with a at position i, b at position j and `rest` elsewhere (i < j)
                y = list(rest)
                y.insert(i, a)
                y.insert(j, b)
                return tuple(y)
            values = range(SYMBOLS)
            log_i_given_j = torch.tensor([[log_c[at(a, b)][i, a] for b in values] for a in values])  # [a, b]
            log_j_given_i = torch.tensor([[log_c[at(a, b)][j, b] for b in values] for a in values])  # [a, b]
            worst = max(worst, published_claims.worst_cycle_inconsistency(log_i_given_j, log_j_given_i))
    return worst


def sharpened(model, scale=4.0):
    """Random weights made larger: conditionals far from uniform, as any set of weights may give."""
    for p in model.parameters():
        p.data.mul_(scale)
    return model.eval()


def markov_chain_joint():
    """The exact joint of fit()'s data: x1 uniform, then each symbol repeats the previous one with p = 0.8."""
    stay = 0.8 + 0.2 / SYMBOLS
    step = torch.where(ALL_SEQUENCES[:, 1:] == ALL_SEQUENCES[:, :-1], stay, (1 - stay) / (SYMBOLS - 1))
    return step.prod(1).double() / SYMBOLS


@torch.no_grad()
def test_a_causal_lms_conditionals_always_form_a_joint_and_an_mlms_need_not():
    """Claim C4, the structural statement. A joint's full conditionals multiply to 1 around every cycle of
    single-position changes (worst_cycle_inconsistency = 0). The conditionals a causal LM implies come from its
    chain-rule joint, so they pass for *any* weights (five random, sharpened initialisations here); an MLM's
    network outputs each conditional with its own softmax, and nothing in it ties them together: for the same five
    random weight settings they are the conditionals of no joint. The checker itself is checked on the exact
    conditionals of the data's own Markov chain (0 to rounding)."""
    data = worst_cycle_inconsistency(conditionals_of_joint(markov_chain_joint()))
    assert data < 1e-9
    gpt_worst, bert_worst = [], []
    for seed in range(5):
        gpt = sharpened(tiny("gpt", SYMBOLS + 1, seed=seed))
        bert = sharpened(tiny("bert", SYMBOLS + 1, seed=seed))
        joint = gpt_log_probability(gpt, ALL_SEQUENCES).exp()
        gpt_worst.append(worst_cycle_inconsistency(conditionals_of_joint(joint)))
        bert_worst.append(worst_cycle_inconsistency(bert_conditionals(bert, ALL_SEQUENCES)))
    print(f"worst |log cycle product| over five random weights: gpt's {max(gpt_worst):.1e}, bert's "
          f"{min(bert_worst):.2f}-{max(bert_worst):.2f}; the data's own conditionals {data:.1e}")
    assert all(w < 1e-9 for w in gpt_worst) and all(w > 0.1 for w in bert_worst)  # (a NaN fails both)


@torch.no_grad()
def test_a_trained_mlms_conditionals_are_those_of_no_joint():
    """Claim C4, a measurement of one imperfect fit (not a property of MLM): BERT's conditionals after 100 steps
    on the Markov chain fail the cycle test by a wide margin, while those derived from a gpt trained the same way
    pass it to rounding. An MLM that fitted the chain's conditionals exactly would pass (they are a joint's: the
    previous test's control), so this says what training gives at this size, nothing more. (A product of a joint's
    own conditionals does not sum to 1 either, so "BERT's pseudo-likelihood does not sum to 1" would prove
    nothing.)"""
    with torch.enable_grad():
        bert = fit(tiny("bert", SYMBOLS + 1), mask_one_position)
    from_joint = conditionals_of_joint(gpt_log_probability(trained_gpt(), ALL_SEQUENCES).exp())
    consistent, bert_inconsistency = worst_cycle_inconsistency(from_joint), worst_cycle_inconsistency(
        bert_conditionals(bert, ALL_SEQUENCES))
    print(f"worst |log cycle product|: conditionals of gpt's joint {consistent:.2e}, bert's {bert_inconsistency:.3f}")
    assert consistent < 1e-9
    assert bert_inconsistency > 0.1


@torch.no_grad()
def test_causal_lm_probabilities_sum_to_one():
    """Claim C4, illustration (holds by construction: a softmax per position chained by the product rule): gpt's
    p(x) = prod p(x_i | x_<i) sums to 1 over all 81 sequences, with random and with trained weights. This cannot
    fail for any causal model with a softmax output; it shows what "a density" means, it does not test the claim."""
    for model in (tiny("gpt", SYMBOLS + 1), trained_gpt()):  # random and trained weights
        total = gpt_log_probability(model, ALL_SEQUENCES).exp().sum().item()
        print(f"gpt: sum over all 81 sequences of p(x) = {total:.8f}")
        assert abs(total - 1) < 1e-5


@torch.no_grad()
def test_position_from_the_mask():
    """Claim D5: without positional encoding a bidirectional model is exactly permutation-equivariant (it cannot
    tell order); a causal model is not (how many tokens a position sees tells it where it is)."""
    ids = torch.randint(0, 20, (3, 12), generator=torch.Generator().manual_seed(0))
    permutation = torch.randperm(12, generator=torch.Generator().manual_seed(1))
    bert = tiny("bert", 20, position="none", block=12).eval()
    gpt = tiny("gpt", 20, position="none", block=12).eval()
    out, out_permuted = bert(ids)[0], bert(ids[:, permutation])[0]
    assert (out[:, permutation] - out_permuted).abs().max() < 1e-5
    out, out_permuted = gpt(ids)[0], gpt(ids[:, permutation])[0]
    difference = (out[:, permutation] - out_permuted).abs().max().item()
    print(f"causal NoPE: outputs move by {difference:.3f} under a permutation")
    assert difference > 1e-2
    learned = tiny("bert", 20, position="learned", block=12).eval()  # with positions bert is not symmetric
    assert (learned(ids)[0][:, permutation] - learned(ids[:, permutation])[0]).abs().max() > 1e-3


@torch.no_grad()
def test_causal_attention_is_full_rank_and_bidirectional_can_collapse():
    """Claim D3: a causal attention matrix is lower triangular with a strictly positive diagonal, so its
    determinant is positive and it has full rank; a bidirectional NoPE head can have rank 1."""
    ids = torch.randint(0, 20, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.enable_grad():
        trained = fit(tiny("gpt", SYMBOLS + 1, block=12), lambda x, g: (x, x), steps=20)
    for model, tokens in ((tiny("gpt", 20, block=12), ids), (trained, ids % SYMBOLS)):
        for probabilities in attention_maps(model.eval(), tokens):  # (B, nh, T, T) per layer
            P = probabilities.double()
            assert (P.triu(1) == 0).all() and (P.diagonal(dim1=-2, dim2=-1) > 0).all()
            assert (torch.linalg.det(P) > 0).all()
            assert (torch.linalg.matrix_rank(P) == 12).all()
    same_token = torch.full((1, 12), 7)  # every query and key identical: uniform rows
    bert = tiny("bert", 20, position="none", block=12).eval()
    for probabilities in attention_maps(bert, same_token):
        assert (torch.linalg.matrix_rank(probabilities.double()) == 1).all()
    causal = tiny("gpt", 20, position="none", block=12).eval()
    assert all((torch.linalg.matrix_rank(p.double()) == 12).all() for p in attention_maps(causal, same_token))


def test_sdpa_equals_the_explicit_softmax_reference():
    """The fast kernel against the plain formula, for every mask kind (tolerance 1e-5, fp32)."""
    q, k, v = torch.randn(3, 2, 4, 10, 16).unbind(0)
    cases = [("causal", 10, 10), ("causal", 4, 10), ("bidirectional", 10, 10), ("prefix", 10, 10), ("prefix", 3, 10)]
    for kind, Tq, Tk in cases:
        mask, is_causal = masks.attention_mask(kind, Tq, Tk, prefix_length=torch.tensor([3, 6]))
        qq, kk, vv = q[:, :, :Tq], k[:, :, :Tk], v[:, :, :Tk]
        fast = torch.nn.functional.scaled_dot_product_attention(qq, kk, vv, attn_mask=mask, is_causal=is_causal)
        reference = explicit_attention_probabilities(qq, kk, mask, is_causal) @ vv
        assert (fast - reference).abs().max() < 1e-5, kind


def test_supervision_density():
    """Claim C1: on a 100-token window next-token prediction supervises every position, MLM 15%, T5's span
    corruption what its formulas give; the gpt/bert ratio is the chapter's 6-7x."""
    specials = objectives.Specials(65, 65, 66, 67, list(range(71, 171)), {"R": 68, "X": 69, "S": 70})
    w = torch.randint(0, 65, (16, 101), generator=torch.Generator().manual_seed(0))
    g = torch.Generator().manual_seed(0)
    clm, mlm = objectives.clm(w).supervised_fraction(), objectives.mlm(w, specials, g).supervised_fraction()
    span = objectives.span_corruption(w, specials, g, "t5").supervised_fraction()
    noise, spans = objectives.span_counts(101)
    expected_span = (noise + spans + 1) / ((101 - noise + spans + 1) + (noise + spans + 1))
    print(f"supervised fraction: clm {clm:.0%}, mlm {mlm:.0%}, span corruption {span:.1%}; clm/mlm {clm / mlm:.2f}x")
    assert clm == 1.0 and abs(mlm - 0.15) < 1e-9 and abs(span - expected_span) < 1e-9
    assert 6 <= clm / mlm <= 7


def test_prefix_lm_flattened_is_encoder_decoder_and_the_difference_is_parameters():
    """Claim A2: flattened, the prefix-LM mask and the encoder-decoder pattern have the same shape; the real
    difference is the second set of weights (encoder) and the cross-attention that reads it."""
    for P, S in [(1, 1), (3, 5), (6, 2)]:
        assert torch.equal(masks.prefix_lm_mask(torch.tensor([P]), P + S)[0, 0],
                           masks.flattened_encoder_decoder_mask(P, S))
    c = dict(vocab_size=50, block_size=16, n_layer=2, n_head=2, n_embd=16)
    prefixlm, t5 = Transformer(ModelConfig(arch="prefixlm", **c)), Transformer(ModelConfig(arch="t5", **c))
    one_block = sum(p.numel() for p in prefixlm.blocks[0].parameters())
    cross = sum(p.numel() for p in t5.decoder_blocks[0].cross_attention.parameters()) + \
        sum(p.numel() for p in t5.decoder_blocks[0].norm_cross.parameters())
    print(f"prefixlm {prefixlm.num_parameters():,} vs t5 {t5.num_parameters():,} parameters: a second stack "
          f"({2 * one_block:,}), cross-attention ({2 * cross:,}) and a norm ({2 * 16})")
    assert t5.num_parameters() - prefixlm.num_parameters() == 2 * one_block + 2 * cross + 2 * 16
    assert type(t5.decoder_blocks[0]) is type(prefixlm.blocks[0])


def test_mlm_predicts_masked_positions_independently():
    """Claim C3: BERT scores the masked positions with independent softmaxes, i.e. it approximates
    p(masked | visible) by a product. Data where two positions are always equal ("a a" or "b b"): masking both,
    the product puts ~1/4 of the mass on each of the impossible pairs "a b" and "b a"; a causal model does not."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    bert, gpt = tiny("bert", 4, block=2), tiny("gpt", 4, block=3)
    optimizer = torch.optim.AdamW(list(bert.parameters()) + list(gpt.parameters()), lr=2e-2)
    for _ in range(150):
        x = torch.randint(0, 2, (32, 1), generator=g).repeat(1, 2)  # (a, a) or (b, b)
        _, bert_loss = bert(torch.full_like(x, MASK), x)  # both masked
        _, gpt_loss = gpt(torch.cat([torch.full((32, 1), BOS), x[:, :1]], 1), x)  # BOS a -> a a
        (bert_loss + gpt_loss).backward()
        optimizer.step()
        optimizer.zero_grad()
    with torch.no_grad():
        marginals = torch.softmax(bert.eval()(torch.full((1, 2), MASK))[0][0, :, :2], dim=-1)  # (2 positions, 2)
        impossible_bert = (marginals[0, 0] * marginals[1, 1] + marginals[0, 1] * marginals[1, 0]).item()
        pairs = torch.tensor([[0, 1], [1, 0]])
        inputs = torch.cat([torch.full((2, 1), BOS), pairs[:, :1]], 1)
        log_p = torch.log_softmax(gpt.eval()(inputs)[0][..., :2], dim=-1).gather(-1, pairs[..., None])[..., 0]
        impossible_gpt = log_p.sum(-1).exp().sum().item()  # p("a b") + p("b a") by the chain rule
    print(f"mass on impossible pairs: bert (product of marginals) {impossible_bert:.3f}, gpt (chain rule) "
          f"{impossible_gpt:.4f}")
    assert impossible_bert > 0.4  # ~0.5: the factorised prediction cannot represent "equal"
    assert impossible_gpt < 0.05
