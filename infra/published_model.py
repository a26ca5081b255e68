"""
What published BERT and T5 weights compute differently from model.py's Transformer, built on its modules so that
their released weights compute here exactly what they computed when published (infra/pretrained.py maps their
names onto ours and checks the logits against transformers'). GPT-2 needs nothing: model.py's defaults are its.

    BERT  post-norm blocks (norm after each residual addition), a norm after the embeddings and none at the end,
          segment embeddings (always segment 0 here), the exact GELU, and an output transform plus bias
    T5    RMSNorm, a relative position bias added to the scores (one table per stack), scores not divided by
          sqrt(head size), ReLU, and the decoder output scaled by n_embd**-0.5 before the tied embedding

`published_model(config)` builds the right class from a PublishedConfig; a checkpoint of a fine-tuned published
model stores that config, so infra/checkpoint.py rebuilds the same class.
"""
import math
from dataclasses import dataclass, replace

import torch
import torch.nn as nn

import masks
from model import Attention, Block, ModelConfig, Transformer

FAMILIES = ("gpt2", "bert", "t5")
ACTIVATIONS = {"gelu_tanh": lambda: nn.GELU(approximate="tanh"), "gelu": nn.GELU, "relu": nn.ReLU}


@dataclass
class PublishedConfig(ModelConfig):
    """ModelConfig plus what a published family needs; the defaults are ours."""
    family: str = "gpt2"        # gpt2 | bert | t5
    norm_eps: float = 1e-5      # GPT-2 1e-5, BERT 1e-12, T5 1e-6
    activation: str = "gelu_tanh"  # gelu_tanh (GPT-2) | gelu (BERT) | relu (BERT variants, T5 v1.0)
    segment_vocab_size: int = 0  # BERT's token types
    relative_buckets: int = 32  # T5's relative positions: buckets, and the offset where the last one starts
    relative_max_distance: int = 128

    def validate(self):
        if self.family not in FAMILIES:
            raise ValueError(f"unknown published family {self.family!r}: choose one of {', '.join(FAMILIES)}")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"unknown activation {self.activation!r}: choose one of {', '.join(ACTIVATIONS)}")
        if self.family == "t5" and (self.arch != "t5" or self.position != "relative"):
            raise ValueError("a published t5 is arch t5 with position 'relative'")
        if self.family == "bert" and (self.position != "learned" or self.segment_vocab_size < 1):
            raise ValueError("a published bert has learned positions and segment embeddings")
        # T5's positions are its relative bias: to the modules of model.py that is no embedding and no rotation
        ModelConfig.validate(replace(self, position="none") if self.family == "t5" else self)


def swap_norms(model, eps, rms=False):
    """Every LayerNorm of the model with the family's epsilon, or an RMSNorm (T5) in its place."""
    for module in list(model.modules()):
        for name, child in module.named_children():
            if isinstance(child, nn.LayerNorm):
                setattr(module, name, nn.RMSNorm(child.normalized_shape, eps=eps) if rms else
                        nn.LayerNorm(child.normalized_shape, eps=eps, bias=child.bias is not None))


def swap_activations(model, name):
    for module in model.modules():
        if hasattr(module, "activation") and isinstance(module.activation, nn.Module):
            module.activation = ACTIVATIONS[name]()


class GPT2(Transformer):
    """GPT-2 is model.py's Transformer; only a LayerNorm epsilon may differ from ours."""

    def __init__(self, config):
        super().__init__(config)
        swap_norms(self, config.norm_eps)
        swap_activations(self, config.activation)


# ----------------------------------------------------------------------------- BERT

class PostNormBlock(Block):
    """The original Transformer's and BERT's order, norm(x + sublayer(x)), for one stack."""

    def forward(self, x, mask=(None, False), rotary=None, start=0, cache=None, cross=None):
        x = self.norm_1(x + self.attention(x, mask, rotary, start, cache))
        return self.norm_2(x + self.mlp(x))


class Bert(Transformer):
    def __init__(self, config):
        super().__init__(config)
        self.blocks = nn.ModuleList(PostNormBlock(config) for _ in range(config.n_layer))
        self.blocks.apply(self._init_weights)
        self.segment_embedding = nn.Embedding(config.segment_vocab_size, config.n_embd)
        self.embedding_norm = nn.LayerNorm(config.n_embd)  # BERT normalises here...
        self.final_norm = nn.Identity()  # ...and so not at the end
        # the output transform (dense, activation, norm), then the tied embedding plus a bias
        self.head_transform = nn.Sequential(nn.Linear(config.n_embd, config.n_embd), ACTIVATIONS[config.activation](),
                                            nn.LayerNorm(config.n_embd))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size)
        self.lm_head.weight = self.token_embedding.weight
        swap_norms(self, config.norm_eps)
        swap_activations(self, config.activation)

    def embed(self, ids, start=0):
        T = ids.size(1)
        if start + T > self.config.block_size:
            raise ValueError(f"sequence of length {start + T} is longer than block_size={self.config.block_size}")
        x = self.token_embedding(ids) + self.position_embedding(torch.arange(start, start + T, device=ids.device))
        x = x + self.segment_embedding.weight[0]  # every token in segment 0: one text, no sentence pairs
        return self.dropout(self.embedding_norm(x))

    def logits(self, hidden):
        return self.lm_head(self.head_transform(hidden))


# ----------------------------------------------------------------------------- T5

class RelativePositionBias(nn.Module):
    """T5's positions: a learned scalar per head added to each attention score, looked up by the bucket of the
    offset (key - query). Small offsets get a bucket each, larger ones share log-spaced buckets up to max_distance.
    bidirectional=False (t5's decoder) buckets only offsets into the past. One table per stack, used by every
    layer of that stack (as T5 does)."""

    def __init__(self, config, bidirectional):
        super().__init__()
        self.bidirectional, self.num_buckets = bidirectional, config.relative_buckets
        self.max_distance = config.relative_max_distance
        self.bias = nn.Embedding(config.relative_buckets, config.n_head)

    def bucket(self, offset):
        num_buckets, bucket = self.num_buckets, torch.zeros_like(offset)
        if self.bidirectional:  # half the buckets for keys after the query
            num_buckets //= 2
            bucket = (offset > 0).long() * num_buckets
            distance = offset.abs()
        else:
            distance = (-offset).clamp(min=0)
        exact = num_buckets // 2
        log_bucket = exact + (torch.log(distance.float().clamp(min=1) / exact) / math.log(self.max_distance / exact)
                              * (num_buckets - exact)).long()
        log_bucket = log_bucket.clamp(max=num_buckets - 1)
        return bucket + torch.where(distance < exact, distance, log_bucket)

    def forward(self, query_length, key_length, start, device):
        queries = torch.arange(start, start + query_length, device=device)[:, None]
        keys = torch.arange(key_length, device=device)[None, :]
        return self.bias(self.bucket(keys - queries)).permute(2, 0, 1).unsqueeze(0)  # (1, nh, Tq, Tk)


def with_bias(mask, bias):
    """Fold an additive score bias (1, nh, Tq, Tk) into a mask (attn_mask, is_causal): one float mask, -inf where
    the mask hides a key."""
    attn_mask, is_causal = mask
    if is_causal:
        attn_mask = masks.causal_mask(bias.size(-2), bias.size(-1), bias.device)
    if attn_mask is None:
        return bias, False
    return bias.masked_fill(~attn_mask, float("-inf")), False


def with_relative_bias(table):
    """A forward pre-hook for one self-attention layer: T5's relative position bias (`table`, its stack's) folded
    into the layer's mask. Block.forward calls the attention with (x, mask, rotary, start, cache); the keys are the
    cached ones and the new: start + T. Returns two hooks: the stack's first layer computes the biased mask (every
    forward of the stack starts there), the later layers reuse it (as T5 computes its bias once per stack)."""
    last = {}

    def first(attention, args):
        x, mask, rotary, start, cache = args
        T = x.size(1)
        last["biased"] = with_bias(mask, table(T, start + T, start, x.device))
        return x, last["biased"], rotary, start, cache

    def later(attention, args):
        x, _, rotary, start, cache = args
        return x, last["biased"], rotary, start, cache
    return first, later


class T5(Transformer):
    def __init__(self, config):
        super().__init__(config)
        self.relative_bias = RelativePositionBias(config, bidirectional=True)
        self.decoder_relative_bias = RelativePositionBias(config, bidirectional=False)
        # T5 folds 1/sqrt(head size) into its initialisation and does not divide its scores by it: its queries
        # are multiplied by sqrt(head size) here, which SDPA's division undoes (exactly in the fused kernels for a
        # head size that is a power of 4, t5-small's 64; to float rounding otherwise)
        factor = math.sqrt(config.n_embd // config.n_head)
        for module in self.modules():
            if isinstance(module, Attention):
                module.query.register_forward_hook(lambda linear, inputs, output: output * factor)
        # its positions: the relative bias of each stack, added to the scores of every self-attention layer
        for blocks, table in ((self.blocks, self.relative_bias), (self.decoder_blocks, self.decoder_relative_bias)):
            first, later = with_relative_bias(table)  # one pair per stack: its layers share the biased mask
            for number, block in enumerate(blocks):
                block.attention.register_forward_pre_hook(later if number else first)
        swap_norms(self, config.norm_eps, rms=True)
        swap_activations(self, config.activation)

    def logits(self, hidden):
        return self.lm_head(hidden * self.config.n_embd ** -0.5)


def published_model(config):
    """The model a PublishedConfig describes (random weights, to be overwritten)."""
    return {"gpt2": GPT2, "bert": Bert, "t5": T5}[config.family](config)
