"""
Attention recorded, kept out of model.py's forward: every layer's attention probabilities, the (T, Tk) matrices SDPA
computes without ever writing them out. The claim D3 analysis reads them (experiments/attention.py, study.py,
incontext.py; tests/test_claims.py), and so do exercises 1 and 4.

    maps = attention_maps(model, ids)     # per layer of gpt / bert / prefixlm's stack (t5: its encoder), (B, nh, T, T)

For the duration of the call each layer's `Attention.attend` is wrapped (and restored after): the wrapper computes
softmax(q k^T * scale + mask) explicitly from the layer's own q, k and mask, then attends as always.
`explicit_attention_probabilities` is that plain reference; tests check SDPA against it.
"""
import math

import torch

import masks


def explicit_attention_probabilities(q, k, attn_mask=None, is_causal=False, scale=None):
    """The plain reference: softmax(q k^T * scale + mask), (B, nh, Tq, Tk), scale = 1/sqrt(d) unless given. SDPA
    computes the same thing without materialising it; tests check the two agree, and the claim D3 analysis reads
    these matrices. A boolean mask hides keys; a float mask is added to the scores (T5's position bias)."""
    scores = q @ k.transpose(-2, -1) * (1 / math.sqrt(q.size(-1)) if scale is None else scale)
    if is_causal:  # only used with Tq == Tk (masks.attention_mask guarantees it)
        attn_mask = masks.causal_mask(q.size(-2), k.size(-2), q.device)
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        scores = scores.masked_fill(~attn_mask, float("-inf"))
    elif attn_mask is not None:
        scores = scores + attn_mask
    return torch.softmax(scores.float(), dim=-1)


def attention_maps(model, ids, prefix_length=None):
    """Every layer's attention probabilities for ids (prefix_length: prefixlm's, as run_stack takes it): a list of
    (B, nh, T, T), computed explicitly, without gradients."""
    layers = [block.attention for block in model.blocks]
    maps = [None] * len(layers)

    def recording(number, attention):
        def attend(q, k, v, mask):
            maps[number] = explicit_attention_probabilities(q, k, *mask).detach()
            return type(attention).attend(attention, q, k, v, mask)
        return attend

    for number, attention in enumerate(layers):
        attention.attend = recording(number, attention)  # this module only, until the finally below
    try:
        with torch.no_grad():
            if model.config.arch == "t5":
                model.encode(ids)
            else:
                model.run_stack(ids, prefix_length)
        return maps
    finally:
        for attention in layers:
            del attention.attend  # back to Attention.attend
