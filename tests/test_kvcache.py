"""Claim D4: cached decoding equals full recomputation for gpt, prefixlm and t5, and cannot for bert."""
import pytest
import torch

import kvcache
import sample
from infra import decode_layout
from model import ModelConfig, Transformer

BLOCK = 48
TOL = 1e-5


def make_model(arch, trained=False, position="learned"):
    torch.manual_seed(0)
    model = Transformer(ModelConfig(arch=arch, vocab_size=40, block_size=BLOCK, n_layer=2, n_head=2, n_embd=32,
                                    position=position))
    if trained:  # a few optimizer steps so weights are not at their init
        with torch.enable_grad():  # the cache tests run under no_grad
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
            for _ in range(5):
                ids = torch.randint(0, 40, (4, 20))
                kwargs = {"decoder_inputs": ids[:, :10]} if arch == "t5" else {}
                if arch == "prefixlm":
                    kwargs["prefix_length"] = torch.tensor([5, 7, 1, 19])
                logits, loss = model(ids, ids[:, :10] if arch == "t5" else ids, **kwargs)
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()
    return model.eval()


def full_logits(model, sequence, prompt_length, encoder_inputs=None):
    """The reference: the whole sequence through the model, last position's logits."""
    if model.config.arch == "t5":
        return model(encoder_inputs.expand(sequence.size(0), -1), decoder_inputs=sequence)[0][:, -1]
    prefix = torch.full((sequence.size(0),), prompt_length) if model.config.arch == "prefixlm" else None
    return model(sequence, prefix_length=prefix)[0][:, -1]


@pytest.mark.parametrize("arch", ["gpt", "prefixlm", "t5"])
@pytest.mark.parametrize("prompt_length", [1, 7, BLOCK - 10])
@pytest.mark.parametrize("trained", [False, True])
@pytest.mark.parametrize("position", ["learned", "rope"])
@torch.no_grad()
def test_cached_logits_equal_full_recomputation_at_every_step(arch, prompt_length, trained, position):
    model = make_model(arch, trained, position)
    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, 40, (2, prompt_length), generator=g)
    encoder_inputs = torch.randint(0, 40, (1, 11), generator=g) if arch == "t5" else None
    cache = kvcache.KVCache(model, 2, BLOCK)
    logits = kvcache.prefill(model, prompt, cache, encoder_inputs=encoder_inputs.expand(2, -1) if arch == "t5" else None)
    sequence = prompt
    worst = 0.0
    for step in range(BLOCK - prompt_length):
        reference = full_logits(model, sequence, prompt_length, encoder_inputs)
        worst = max(worst, (logits - reference).abs().max().item())
        token = torch.randint(0, 40, (2, 1), generator=g)
        sequence = torch.cat([sequence, token], dim=1)
        if sequence.size(1) > BLOCK:
            break
        logits = kvcache.forward_with_cache(model, token, cache)[:, -1]
    assert worst < TOL, worst


@pytest.mark.parametrize("arch", ["gpt", "prefixlm", "t5"])
def test_greedy_generation_identical_with_and_without_cache(arch):
    model = make_model(arch, trained=True)
    prompt = torch.randint(0, 40, (1, 5), generator=torch.Generator().manual_seed(0))
    if arch == "t5":
        prompt = sample.T5Prompt(torch.randint(0, 40, (1, 9)), None, 0)
    cached = sample.generate(model, prompt, 120, sample.GREEDY)  # 120 > block: the window slides twice
    full = sample.generate_uncached(model, prompt, 120, sample.GREEDY)
    assert cached.size(1) >= 120 and torch.equal(cached, full)


@pytest.mark.parametrize("block_size", [1, 2, 3])
def test_the_window_slides_at_the_smallest_block_sizes(block_size):
    """A window of one token still keeps one token when it slides (half of it, rounded down, would be none)."""
    model = Transformer(ModelConfig(arch="prefixlm", vocab_size=20, block_size=block_size, n_layer=1, n_head=1,
                                    n_embd=8)).eval()
    prompt = torch.tensor([[3]])
    cached = sample.generate(model, prompt, 6, sample.GREEDY)
    assert cached.shape == (1, 7) and torch.equal(cached, sample.generate_uncached(model, prompt, 6, sample.GREEDY))


COMPILED_TOL = 1e-4  # compiled kernels fuse and reorder float32 arithmetic: equal up to rounding, not bitwise


@pytest.mark.parametrize("arch", ["gpt", "prefixlm", "t5"])
def test_compiled_decoding_equals_eager_decoding(arch):
    """The compiled decoding step (generate(compiled=True), sample.py --compile=True) is an optimisation, not a
    different model: the same logits within COMPILED_TOL at every position of two rows, and the same 200 greedy
    tokens (200 > block: the window slides and the prefill reruns, and the cache length takes every value)."""
    model = make_model(arch, trained=True, position="rope" if arch == "t5" else "learned")
    torch._dynamo.reset()  # compile afresh for this model (the other archs' graphs count against a limit)
    torch._dynamo.utils.counters.clear()
    g = torch.Generator().manual_seed(6)
    prompt = torch.randint(0, 40, (2, 7), generator=g)
    encoder_inputs = torch.randint(0, 40, (2, 11), generator=g) if arch == "t5" else None
    with torch.inference_mode():
        caches = [kvcache.KVCache(model, 2, BLOCK), kvcache.KVCache(model, 2, BLOCK)]
        for cache in caches:
            kvcache.prefill(model, prompt, cache, encoder_inputs=encoder_inputs)
        worst = 0.0
        for _ in range(BLOCK - 7):
            token = torch.randint(0, 40, (2, 1), generator=g)
            eager = kvcache.decode_step(model, token, caches[0])
            compiled = decode_layout.compiled_decode_step(model)(model, token, caches[1])
            worst = max(worst, (compiled - eager).abs().max().item())
    assert worst < COMPILED_TOL, worst
    start = sample.T5Prompt(encoder_inputs[:1], None, 0) if arch == "t5" else prompt[:1]
    eager = sample.generate(model, start, 200, sample.GREEDY)
    compiled = sample.generate(model, start, 200, sample.GREEDY, compiled=True)
    assert compiled.size(1) >= 200 and torch.equal(compiled, eager)
    # compiled, not run eagerly, and not once per token: batch 2 and batch 1, each with one more graph for the
    # context's last position (a full cache slice); every other position reuses a graph with a symbolic length
    assert 1 <= torch._dynamo.utils.counters["stats"]["unique_graphs"] <= 4, torch._dynamo.utils.counters["stats"]


def test_chunked_prefill_uses_bottom_right_alignment():
    model = make_model("gpt", trained=True)
    ids = torch.randint(0, 40, (2, 20), generator=torch.Generator().manual_seed(3))
    cache = kvcache.KVCache(model, 2, BLOCK)
    kvcache.prefill(model, ids[:, :12], cache)
    chunk = kvcache.forward_with_cache(model, ids[:, 12:], cache)  # 8 new queries on 12 cached keys
    assert (chunk - model(ids)[0][:, 12:]).abs().max() < TOL


def test_prefix_caching_shared_prefill_equals_separate_prefills():
    model = make_model("gpt", trained=True)
    g = torch.Generator().manual_seed(4)
    prompt = torch.randint(0, 40, (1, 16), generator=g)
    continuations = torch.randint(0, 40, (4, 6), generator=g)
    shared = kvcache.KVCache(model, 1, BLOCK)
    kvcache.prefill(model, prompt, shared)
    forked = shared.fork(4)  # one prefill serves four requests
    from_shared = kvcache.forward_with_cache(model, continuations, forked)
    separate = []
    for row in continuations:
        cache = kvcache.KVCache(model, 1, BLOCK)
        kvcache.prefill(model, prompt, cache)
        separate.append(kvcache.forward_with_cache(model, row[None], cache))
    assert (from_shared - torch.cat(separate)).abs().max() < TOL


def test_prefix_caching_for_t5_and_prefixlm_samples():
    for arch in ("prefixlm", "t5"):
        model = make_model(arch, trained=True)
        prompt = torch.randint(0, 40, (1, 6)).expand(3, -1)  # three samples of one prompt: one prefill, forked
        if arch == "t5":
            prompt = sample.T5Prompt(torch.randint(0, 40, (1, 9)).expand(3, -1), None, 0)
        a = sample.generate(model, prompt, 20, sample.Sampling(generator=torch.Generator().manual_seed(0)))
        b = sample.generate_uncached(model, prompt, 20, sample.Sampling(generator=torch.Generator().manual_seed(0)))
        assert torch.equal(a, b)


@pytest.mark.parametrize("arch", ["gpt", "t5"])
def test_rows_with_different_prompts_are_prefilled_each_and_equal_the_reference(arch):
    """Rows that do not share their prompt get a prefill each (no fork): still the reference's tokens."""
    model = make_model(arch, trained=True)
    ids = torch.randint(0, 40, (3, 6), generator=torch.Generator().manual_seed(4))
    prompt = (lambda rows: sample.T5Prompt(rows, None, 0)) if arch == "t5" else (lambda rows: rows)
    cached = sample.generate(model, prompt(ids), 20, sample.GREEDY)
    assert torch.equal(cached, sample.generate_uncached(model, prompt(ids), 20, sample.GREEDY))
    for row in range(3):  # each row from its own prompt (not the first row's, forked)
        assert torch.equal(cached[row:row + 1], sample.generate(model, prompt(ids[row:row + 1]), 20, sample.GREEDY))
    if arch == "gpt":
        assert not torch.equal(cached[0, 6:], cached[1, 6:])


def test_extending_a_cached_prompt_computes_only_the_new_tokens():
    model = make_model("gpt", trained=True)
    ids = torch.randint(0, 40, (1, 30), generator=torch.Generator().manual_seed(5))
    cache = kvcache.KVCache(model, 1, BLOCK)
    _, computed = kvcache.extend_prompt(model, ids[:, :20], cache)
    assert computed == 20
    logits, computed = kvcache.extend_prompt(model, ids, cache)  # the first 20 are cached
    assert computed == 10 and (logits - model(ids)[0][:, -1]).abs().max() < TOL
    other = ids.clone()
    other[0, 25:] = (other[0, 25:] + 1) % 40  # diverges at 25: 25 reused, 5 recomputed
    logits, computed = kvcache.extend_prompt(model, other, cache)
    assert computed == 5 and (logits - model(other)[0][:, -1]).abs().max() < TOL
    with pytest.raises(ValueError, match="causal"):
        kvcache.extend_prompt(make_model("bert"), ids, kvcache.KVCache(make_model("bert"), 1, BLOCK))


@pytest.mark.parametrize("trained", [False, True])
def test_bert_cannot_be_cached(trained):
    """The counter-demonstration (claim D4): reuse cached K/V in a bidirectional model, append one token, and the
    result is wrong; the same procedure in gpt is exact."""
    ids = torch.randint(0, 40, (2, 24), generator=torch.Generator().manual_seed(6))
    bert = kvcache.bidirectional_cache_error(make_model("bert", trained), ids)
    gpt = kvcache.bidirectional_cache_error(make_model("gpt", trained), ids)
    print(f"bert: max logit difference {bert['logit_difference']:.3e}, earlier hidden states changed by "
          f"{bert['earlier_hidden_change']:.3e}; gpt: {gpt['logit_difference']:.1e}")
    assert gpt["logit_difference"] < TOL and gpt["earlier_hidden_change"] < TOL
    # fails the very tolerance that gpt's cache meets, by more than an order of magnitude
    assert bert["logit_difference"] > 10 * TOL and bert["earlier_hidden_change"] > 10 * TOL


def test_mask_predict_fills_every_mask():
    model = make_model("bert", trained=True)
    prompt = torch.randint(0, 39, (1, 8))
    for order in ("confident", "random"):
        for block_length in (0, 5):
            tokens = torch.cat([prompt, torch.full((1, 20), 39)], dim=1).repeat(3, 1)
            passes = sample.iterative_unmask(model, tokens, tokens == 39, 8, sample.Sampling(
                banned=torch.tensor([39]), order=order, block_length=block_length))
            assert (tokens != 39).all() and torch.equal(tokens[:, :8], prompt.expand(3, -1))
            assert passes == 8
    for steps, passes_made in ((7, 7), (2, 4)):  # 4 blocks of 5: 2, 2, 2, 1 passes; one each when too few
        tokens = torch.cat([prompt, torch.full((1, 20), 39)], dim=1)
        assert sample.iterative_unmask(model, tokens, tokens == 39, steps,
                                       sample.Sampling(block_length=5)) == passes_made


def test_the_cache_is_static_and_decoding_never_reallocates_it():
    """The decode loop writes into preallocated K/V (no torch.cat growth): the storage never moves."""
    model = make_model("gpt")
    cache = kvcache.KVCache(model, 2, 40)
    keys, values = cache.keys.data_ptr(), cache.values.data_ptr()
    kvcache.prefill(model, torch.randint(0, 40, (2, 5)), cache)
    for _ in range(30):
        kvcache.forward_with_cache(model, torch.randint(0, 40, (2, 1)), cache)
    assert cache.length == 35 and cache.keys.shape[3] == 40
    assert (cache.keys.data_ptr(), cache.values.data_ptr()) == (keys, values)
    with pytest.raises(ValueError, match="KV cache full"):
        kvcache.forward_with_cache(model, torch.randint(0, 40, (2, 6)), cache)


def test_python_kvcache_shows_claim_d4():
    """`python kvcache.py`, the chapter's demonstration (docs/chapter.md, questions 8 and 10): gpt's cached logits
    equal recomputation to float rounding, bert's earlier states change when a token is appended, and two texts
    with one beginning have bit-identical gpt states over it (a broken cache, or a bidirectional mask leaking into
    gpt, would show here)."""
    import re
    from conftest import run_script
    result = run_script("kvcache.py")
    assert result.returncode == 0, result.stderr
    found = {arch: (float(a), float(b)) for arch, a, b in
             re.findall(r"^(gpt|bert): .* by ([\d.e+-]+); .* by ([\d.e+-]+)$", result.stdout, flags=re.M)}
    assert found["gpt"][0] < 1e-5 and found["gpt"][1] < 1e-5, found
    assert found["bert"][1] > 1e-3, found
    # the same fact, read as embeddings: a shared beginning has bit-identical causal states, not bidirectional ones
    shared = dict(re.findall(r"^(gpt|bert): two texts share .* by ([\d.e+-]+)$", result.stdout, flags=re.M))
    assert float(shared["gpt"]) == 0.0 and float(shared["bert"]) > 1e-3, shared


def test_each_unmasking_order_reveals_what_its_name_says():
    """A hand-made table of predictions over three masked positions, where the three orders must disagree:
    position 0 puts 0.4 on its best token and 0.1 on six others (top 0.4, margin 0.3); position 1 0.45 on two
    tokens (top 0.45, margin 0); position 2 0.3, 0.3, 0.2, 0.2 (top 0.3, margin 0). "confident" reveals position 1
    first (the highest top probability), "margin" position 0 (the largest gap between the best two), and "random"
    each of the three first under some seed (claim X5's orders, Kim et al. 2025)."""
    import math
    table = torch.full((3, 12), -60.0)
    table[0, :7] = torch.log(torch.tensor([0.4] + [0.1] * 6))
    table[1, :3] = torch.log(torch.tensor([0.45, 0.45, 0.1]))
    table[2, :4] = torch.log(torch.tensor([0.3, 0.3, 0.2, 0.2]))
    assert all(abs(row.exp().sum().item() - 1) < 1e-5 for row in table) and math.isclose(0.4 - 0.1, 0.3)

    class StandIn:
        config = type("Config", (), {"arch": "bert", "vocab_size": 12})()

        def __init__(self):
            self.seen = []

        def eval(self):
            return self

        def __call__(self, x, **_):
            self.seen.append(x.clone())
            return table[None].expand(x.size(0), -1, -1).clone(), None

    def first_revealed(order, seed=0):
        model, x = StandIn(), torch.full((1, 3), 11)
        sample.unmask(model, x, x == 11, 3, sample.Sampling(0, order=order, generator=torch.Generator().manual_seed(seed)))
        assert bool((x != 11).all()) and len(model.seen) == 3  # one position a pass, every mask filled
        return (model.seen[1][0] != 11).nonzero()[:, 0].tolist()

    assert first_revealed("confident") == [1]
    assert first_revealed("margin") == [0]
    assert {first_revealed("random", seed)[0] for seed in range(40)} == {0, 1, 2}


@pytest.mark.parametrize("arch", ["gpt", "prefixlm", "t5"])
def test_decoding_with_prepacked_weights_equals_the_plain_layout(arch):
    """sample.generate decodes with the large weights prepacked for the CPU's BLAS (infra/decode_layout.py): each
    product equals nn.Linear's to float rounding, the greedy tokens equal the uncached reference's, and after the
    block every module computes as nn.Linear again. A width of 256 makes every block's weights large enough to be
    prepacked (the small ones are left as they are: they are faster so)."""
    torch.manual_seed(0)
    model = Transformer(ModelConfig(arch=arch, vocab_size=300, block_size=48, n_layer=2, n_head=4, n_embd=256)).eval()
    with torch.no_grad():  # biases away from their zero initialisation, so that a dropped bias shows
        for parameter in model.parameters():
            parameter.add_(0.02 * torch.randn_like(parameter))
    if not decode_layout.applies(model):
        pytest.skip("this torch has no oneDNN: the plain layout is the only one")
    linears = {name: module for name, module in model.named_modules() if isinstance(module, torch.nn.Linear)}
    inputs = {name: torch.randn(3, 1, module.in_features) for name, module in linears.items()}
    with torch.no_grad():
        plain = {name: module(inputs[name]) for name, module in linears.items()}
        with decode_layout.prepacked(model):
            packed = [m for m in model.modules() if "forward" in vars(m)]
            # five weights a block, three more for t5's cross-attention, and the output head
            assert len(packed) == len(linears) == 2 * 5 + (2 * 8 if arch == "t5" else 0) + 1
            for name, module in linears.items():
                assert torch.allclose(module(inputs[name]), plain[name], rtol=1e-5, atol=1e-5), name
    assert not any("forward" in vars(m) for m in model.modules())  # restored
    prompt = torch.randint(0, 300, (1, 6), generator=torch.Generator().manual_seed(1))
    start = sample.T5Prompt(prompt, None, 0) if arch == "t5" else prompt
    cached = sample.generate(model, start, 30, sample.GREEDY)
    assert torch.equal(cached, sample.generate_uncached(model, start, 30, sample.GREEDY))


@pytest.mark.parametrize("arch", ["gpt", "t5"])
@pytest.mark.slow
def test_the_frozen_compiled_step_of_a_wide_model_is_its_own_model_and_refuses_changed_weights(arch):
    """At decode_layout.FROZEN_MIN_WIDTH and above, the CPU's compiled step freezes the weights into Inductor's C++ GEMM
    kernels: the same logits as eager (COMPILED_TOL) and the same greedy tokens, at batch 1 (gpt) and 2 (t5, its
    encoder's keys in the cache); a second model of the same shape gets its own weights' logits, not the first's;
    weights changed in place or replaced after freezing are refused."""
    def wide(seed):
        torch.manual_seed(seed)
        layers = dict(n_layer=1, n_decoder_layer=1) if arch == "t5" else dict(n_layer=1)
        return Transformer(ModelConfig(arch=arch, vocab_size=40, block_size=32, n_head=2,
                                       n_embd=decode_layout.FROZEN_MIN_WIDTH, **layers)).eval()
    first, second = wide(0), wide(1)
    torch._dynamo.reset()
    decode_layout.FROZEN_WEIGHTS.clear()
    torch._dynamo.utils.counters.clear()
    rows = 2 if arch == "t5" else 1
    g = torch.Generator().manual_seed(2)
    prompt = torch.randint(0, 40, (rows, 5), generator=g)
    encoder_inputs = torch.randint(0, 40, (rows, 7), generator=g) if arch == "t5" else None
    with torch.inference_mode():
        for model in (first, second, first) if arch == "gpt" else (first,):
            caches = [kvcache.KVCache(model, rows, 32), kvcache.KVCache(model, rows, 32)]
            for cache in caches:
                kvcache.prefill(model, prompt, cache, encoder_inputs=encoder_inputs)
            for token in torch.arange(8).view(-1, 1, 1).expand(-1, rows, 1):
                eager = kvcache.decode_step(model, token, caches[0])
                compiled = decode_layout.compiled_decode_step(model)(model, token, caches[1])
                assert (compiled - eager).abs().max() < COMPILED_TOL
    assert torch._dynamo.utils.counters["inductor"]["cpp_templated_kernel_counter"] > 0  # Inductor's own GEMM
    start = sample.T5Prompt(encoder_inputs[:1].expand(2, -1), None, 0) if arch == "t5" else prompt[:1]
    assert torch.equal(sample.generate(first, start, 20, sample.GREEDY, compiled=True),
                       sample.generate(first, start, 20, sample.GREEDY))
    with torch.no_grad():
        second.lm_head.weight.mul_(2.0)  # in place, as an optimizer step
    first.lm_head.weight = torch.nn.Parameter(first.lm_head.weight.detach().clone())  # replaced
    for model in (first, second) if arch == "gpt" else (first,):
        with pytest.raises(RuntimeError, match="weights changed since"):
            sample.generate(model, start, 2, sample.GREEDY, compiled=True)


def test_a_compiled_generation_of_many_rows_on_a_cpu_runs_the_eager_step():
    """On a CPU, with more than decode_layout.COMPILED_MAX_ROWS rows the frozen compiled step is the slower
    (results/logs/compiled_rows.txt), so generate(compiled=True) runs the eager step there: nothing is compiled and
    the tokens are the eager ones. Up to that many rows, and for a model narrower than FROZEN_MIN_WIDTH (not
    measured by rows), the compiled step runs."""
    torch.manual_seed(0)
    wide = Transformer(ModelConfig(arch="gpt", vocab_size=40, block_size=32, n_layer=1, n_head=2,
                                   n_embd=decode_layout.FROZEN_MIN_WIDTH)).eval()
    rows = decode_layout.COMPILED_MAX_ROWS + 1
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    prompt = torch.randint(0, 40, (rows, 5), generator=torch.Generator().manual_seed(3))
    assert torch.equal(sample.generate(wide, prompt, 10, sample.GREEDY, compiled=True),
                       sample.generate(wide, prompt, 10, sample.GREEDY))
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 0  # not one graph compiled
    try:
        assert decode_layout.decoding_step(wide, True, rows)[0] is kvcache.decode_step
        assert decode_layout.decoding_step(wide, True, rows - 1)[0] is not kvcache.decode_step
        assert decode_layout.decoding_step(make_model("gpt"), True, rows)[0] is not kvcache.decode_step  # narrow
    finally:
        decode_layout.FROZEN_WEIGHTS.clear()  # (the step of rows - 1 recorded `wide`'s weights)
