"""Claim A1: the architectures differ only in the mask. Exact patterns, the SDPA fast path, and no leakage."""
import pytest
import torch

import masks
from model import ModelConfig, Transformer


def test_exact_patterns_small_T():
    T = 4
    assert masks.bidirectional_mask(T).all()
    assert masks.causal_mask(T).tolist() == [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]]
    prefix = masks.prefix_lm_mask(torch.tensor([2, 3]), T)
    assert prefix.shape == (2, 1, T, T)
    assert prefix[0, 0].int().tolist() == [[1, 1, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]]
    assert prefix[1, 0].int().tolist() == [[1, 1, 1, 0], [1, 1, 1, 0], [1, 1, 1, 0], [1, 1, 1, 1]]
    trio = masks.encoder_decoder_masks(3, 2)
    assert trio["encoder_self"].all() and trio["cross"].shape == (2, 3) and trio["cross"].all()
    assert trio["decoder_self"].int().tolist() == [[1, 0], [1, 1]]
    assert masks.padding_mask(torch.tensor([2]), 4).int().flatten().tolist() == [1, 1, 0, 0]


def test_prefix_rows_see_prefix_plus_own_past():
    T, P = 9, 4
    m = masks.prefix_lm_mask(torch.tensor([P]), T)[0, 0]
    for i in range(T):
        visible = set(torch.nonzero(m[i]).flatten().tolist())
        assert visible == set(range(P)) | set(range(i + 1))


def test_causal_takes_the_fast_path_only_when_exact():
    assert masks.attention_mask("causal", 8) == (None, True)
    mask, is_causal = masks.attention_mask("causal", 3, 8)  # chunked prefill on a cache: bottom-right
    assert not is_causal and mask.tolist() == masks.causal_mask(3, 8).tolist()
    assert mask[0].tolist() == [True] * 6 + [False] * 2
    assert masks.attention_mask("causal", 1, 8) == (None, False)  # one query at the end sees all keys
    assert masks.attention_mask("bidirectional", 8) == (None, False)
    mask, is_causal = masks.attention_mask("causal", 4, lengths=torch.tensor([4, 2]))
    assert not is_causal and mask.shape == (2, 1, 4, 4) and not mask[1, 0, 3, 2]
    with pytest.raises(ValueError):
        masks.attention_mask("diagonal", 4)


def test_is_causal_aligns_top_left_which_is_why_chunks_need_the_explicit_mask():
    q, k, v = torch.randn(3, 1, 1, 3, 8).unbind(0)
    kk, vv = torch.randn(2, 1, 1, 8, 8).unbind(0)
    kk[:, :, 5:], vv[:, :, 5:] = k, v
    explicit = torch.nn.functional.scaled_dot_product_attention(q, kk, vv, attn_mask=masks.causal_mask(3, 8))
    top_left = torch.nn.functional.scaled_dot_product_attention(q, kk, vv, is_causal=True)
    assert not torch.allclose(explicit, top_left)


def embedding_gradients(arch, T=8):
    """|d(logits at position t) / d(token embeddings)| through the model's own forward: a (T, T) grid."""
    torch.manual_seed(0)
    model = Transformer(ModelConfig(arch=arch, vocab_size=20, block_size=T, n_layer=2, n_head=2, n_embd=16))
    ids = torch.randint(0, 20, (1, T))
    captured = {}

    def keep(module, inputs, output):
        output.retain_grad()
        captured["embeddings"] = output

    model.token_embedding.register_forward_hook(keep)
    grid = torch.zeros(T, T)
    prefix = torch.tensor([3]) if arch == "prefixlm" else None
    for t in range(T):
        logits, _ = model(ids, prefix_length=prefix)
        logits[0, t].sum().backward()
        grid[t] = captured["embeddings"].grad[0].abs().sum(-1)
        model.zero_grad()
    return grid


def test_no_leakage_in_gpt_and_full_mixing_in_bert():
    gpt = embedding_gradients("gpt")
    T = gpt.size(0)
    future = torch.ones(T, T, dtype=torch.bool).triu(1)
    assert (gpt[future] == 0).all()  # exactly zero: position t never sees t+1..
    assert (gpt[~future] > 0).all()
    assert (embedding_gradients("bert") > 0).all()
    prefix = embedding_gradients("prefixlm")
    allowed = masks.prefix_lm_mask(torch.tensor([3]), T)[0, 0]
    assert (prefix[~allowed] == 0).all() and (prefix[allowed] > 0).all()


def test_t5_decoder_cannot_see_future_targets():
    torch.manual_seed(0)
    model = Transformer(ModelConfig(arch="t5", vocab_size=20, block_size=16, n_layer=1, n_head=2, n_embd=16))
    enc, dec = torch.randint(0, 20, (1, 5)), torch.randint(0, 20, (1, 6))
    base, _ = model(enc, decoder_inputs=dec)
    for t in range(5):
        changed = dec.clone()
        changed[0, t + 1:] = (changed[0, t + 1:] + 1) % 20
        logits, _ = model(enc, decoder_inputs=changed)
        assert torch.equal(logits[0, :t + 1], base[0, :t + 1])  # unchanged up to t
        assert not torch.allclose(logits[0, t + 1:], base[0, t + 1:])
    changed_enc = enc.clone()
    changed_enc[0, -1] = (enc[0, -1] + 1) % 20
    assert not torch.allclose(model(changed_enc, decoder_inputs=dec)[0][0, 0], base[0, 0])  # cross-attention sees all


def test_masks_script_prints_the_grids():
    from conftest import run_script
    out = run_script("masks.py")
    assert out.returncode == 0 and "identical: True" in out.stdout and "########" in out.stdout
