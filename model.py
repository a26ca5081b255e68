"""
One Transformer for every architecture in the debate (claims A1, A2).

gpt, bert and prefixlm are literally the same modules: one stack of `Block`s. The only line that differs is
ATTENTION_OF_ARCH below, the mask each query row gets. t5 is two stacks of the same `Block`, the decoder's blocks
adding cross-attention to the encoder's output. Read leaf to root: rotary positions, attention, MLP, block,
config (with size presets), model. Below the banner at the end: the few options that exist only so that published
GPT-2, BERT and T5 weights compute exactly what they were trained to (infra/pretrained.py loads them).

The one attention function (`Attention.forward`) serves self-attention, cross-attention and cached decoding;
nothing else in the project calls scaled_dot_product_attention.
"""
import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

import masks

IGNORE_INDEX = -100  # targets equal to this carry no loss (unsupervised positions)

# The whole difference between the single-stack architectures (claim A1): the attention kind (masks.py) of each
ATTENTION_OF_ARCH = {"gpt": "causal", "bert": "bidirectional", "prefixlm": "prefix"}
ARCHS = ("gpt", "bert", "prefixlm", "t5")  # t5: bidirectional encoder + causal decoder + cross-attention (A1, A2)
POSITION_KINDS = ("learned", "rope", "relative", "none")  # "none" is NoPE (claim D5); "relative" is T5's bias


class RotaryPositions(nn.Module):
    """Rotary position embedding: rotate each (even, odd) pair of q/k features by an angle proportional to the
    position, so q.k depends on the relative offset. No parameters."""

    def __init__(self, head_size, max_length, base=10000.0):
        super().__init__()
        inverse_frequency = 1.0 / (base ** (torch.arange(0, head_size, 2).float() / head_size))
        angles = torch.outer(torch.arange(max_length).float(), inverse_frequency)  # (T, hs/2)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, x, start):
        # x: (B, nh, T, hs); positions start .. start+T-1
        T = x.size(2)
        cos, sin = self.cos[start:start + T].to(x.dtype), self.sin[start:start + T].to(x.dtype)  # (T, hs/2)
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)


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


class Attention(nn.Module):
    """Multi-head attention. Queries come from `x`; keys and values from `context` (= x for self-attention,
    the encoder output for cross-attention). An optional `cache` (kvcache.LayerCache) stores K/V across calls;
    `keys_values`, t5's cross-attention while decoding, are K/V computed once from the encoder output."""

    def __init__(self, config):
        super().__init__()
        self.n_head, self.dropout = config.n_head, config.dropout
        self.scale = None if config.scale_attention else 1.0  # T5 folds 1/sqrt(d) into its initialisation
        self.query = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.key_value = nn.Linear(config.n_embd, 2 * config.n_embd, bias=config.bias)
        self.proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.proj.residual_output = True  # scaled init, as GPT-2
        self.resid_dropout = nn.Dropout(config.dropout)
        self.record_probabilities = False  # set True to keep the attention matrix (analysis, tests)
        self.probabilities = None

    def split_heads(self, t):
        B, T, C = t.shape
        return t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)

    def keys_and_values(self, context):
        """(K, V), each (B, nh, Tk, hs), of a key/value source (B, Tk, C)."""
        k, v = self.key_value(context).split(context.size(-1), dim=2)
        return self.split_heads(k), self.split_heads(v)

    def forward(self, x, context=None, attn_mask=None, is_causal=False, rotary=None, start=0, cache=None,
                keys_values=None, position_bias=None):
        B, T, C = x.shape
        q = self.split_heads(self.query(x))  # (B, nh, T, hs)
        if keys_values is not None:
            k, v = keys_values  # t5 cross-attention while decoding: the encoder output never changes
        else:
            k, v = self.keys_and_values(x if context is None else context)  # (B, nh, Tk, hs)
            if rotary is not None:
                q, k = rotary(q, start), rotary(k, start)
            if cache is not None:
                # claim D4: under a causal mask the K/V of position i depend only on tokens 0..i, so the cache
                # keeps them and the new queries attend to [cached ; new]
                k, v = cache.update(k, v)  # (B, nh, start+T, hs)
        if position_bias is not None:  # (1, nh, T, Tk), T5's relative positions
            attn_mask = add_position_bias(attn_mask, is_causal, position_bias, T, k.size(2), x.device)
            is_causal = False  # the causal mask is inside attn_mask now
        if self.record_probabilities:
            self.probabilities = explicit_attention_probabilities(q, k, attn_mask, is_causal, self.scale).detach()
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal, scale=self.scale,
                                           dropout_p=self.dropout if self.training else 0.0)  # (B, nh, T, hs)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.proj(y))


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.fc = nn.Linear(config.n_embd, config.d_ff, bias=config.bias)
        self.proj = nn.Linear(config.d_ff, config.n_embd, bias=config.bias)
        self.proj.residual_output = True
        self.dropout = nn.Dropout(config.dropout)
        self.activation = Activation(config.activation)

    def forward(self, x):
        return self.dropout(self.proj(self.activation(self.fc(x))))


class Block(nn.Module):
    """Pre-norm Transformer block. With cross_attention=True (t5's decoder) it gains one more sub-layer that
    reads the encoder output (`memory`, or its K/V computed once: `cross_keys_values`); that is the only new
    module encoder-decoder needs (claim A2)."""

    def __init__(self, config, cross_attention=False):
        super().__init__()
        self.post_norm = config.post_norm
        self.norm_1 = make_norm(config)
        self.attention = Attention(config)
        if cross_attention:
            self.norm_cross = make_norm(config)
            self.cross_attention = Attention(config)
        self.norm_2 = make_norm(config)
        self.mlp = MLP(config)

    def forward(self, x, attn_mask=None, is_causal=False, rotary=None, start=0, cache=None, position_bias=None,
                memory=None, cross_mask=None, cross_keys_values=None):
        if self.post_norm:  # BERT's order, for its published weights (the bottom of this file)
            return post_norm_forward(self, x, attn_mask, is_causal, rotary, start, cache, position_bias)
        x = x + self.attention(self.norm_1(x), attn_mask=attn_mask, is_causal=is_causal, rotary=rotary, start=start,
                               cache=cache, position_bias=position_bias)
        if memory is not None or cross_keys_values is not None:
            x = x + self.cross_attention(self.norm_cross(x), context=memory, attn_mask=cross_mask,
                                         keys_values=cross_keys_values)
        return x + self.mlp(self.norm_2(x))


@dataclass
class ModelConfig:
    arch: str = "gpt"           # gpt | bert | prefixlm | t5
    vocab_size: int = 50304
    block_size: int = 1024      # longest sequence (the size of the position table)
    n_layer: int = 12           # t5: layers of the encoder
    n_decoder_layer: int = 0    # t5 only: layers of the decoder (0 = same as n_layer)
    n_head: int = 12
    n_embd: int = 768
    d_ff: int = 0               # MLP hidden size (0 = 4 * n_embd)
    dropout: float = 0.0
    bias: bool = True           # biases in Linear and LayerNorm
    position: str = "learned"   # learned | rope | relative (T5) | none (NoPE, claim D5)
    # Options that exist only so that published checkpoints load exactly (the bottom of this file); defaults = ours
    norm: str = "layernorm"     # layernorm | rmsnorm (T5)
    norm_eps: float = 1e-5      # BERT 1e-12, T5 1e-6
    activation: str = "gelu_tanh"  # gelu_tanh (GPT-2, ours) | gelu (BERT) | relu (T5 v1.0)
    post_norm: bool = False     # BERT: norm after each residual addition, and after the embeddings
    segment_vocab_size: int = 0  # BERT's token-type (segment) embeddings; we always feed segment 0
    mlm_head: bool = False      # BERT's output transform (dense, GELU, norm) and output bias before the logits
    scale_attention: bool = True  # False: T5, whose scores are not divided by sqrt(head size)
    scale_tied_output: bool = False  # T5: hidden states * n_embd**-0.5 before the tied output embedding
    relative_buckets: int = 32  # position="relative": T5's buckets and the offset where the last one starts
    relative_max_distance: int = 128

    def __post_init__(self):
        if self.d_ff == 0:
            self.d_ff = 4 * self.n_embd
        if self.arch == "t5" and self.n_decoder_layer == 0:
            self.n_decoder_layer = self.n_layer

    def validate(self):
        """Raise ValueError with a one-line, actionable message for a config that cannot be built."""
        if self.arch not in ARCHS:
            raise ValueError(f"unknown arch {self.arch!r}: choose one of {', '.join(ARCHS)}")
        if self.position not in POSITION_KINDS:
            raise ValueError(f"unknown position {self.position!r}: choose one of {', '.join(POSITION_KINDS)}")
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd", "d_ff"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.arch == "t5" and self.n_decoder_layer < 1:
            raise ValueError("n_decoder_layer must be at least 1 for t5 (0 = as many as n_layer)")
        if self.arch != "t5" and self.n_decoder_layer:
            raise ValueError(f"n_decoder_layer is for t5 only; {self.arch} has one stack (set n_layer)")
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd={self.n_embd} is not divisible by n_head={self.n_head}: "
                             f"pick n_embd a multiple of n_head")
        if self.position == "rope" and (self.n_embd // self.n_head) % 2:
            raise ValueError("rotary positions need an even head size (n_embd / n_head)")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
        if self.norm not in NORMS:
            raise ValueError(f"unknown norm {self.norm!r}: choose one of {', '.join(NORMS)}")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"unknown activation {self.activation!r}: choose one of {', '.join(ACTIVATIONS)}")
        if self.post_norm and self.arch == "t5":
            raise ValueError("post_norm is BERT's layout, for one stack; t5 is pre-norm")


# Published sizes (parameter counts checked in tests/test_model.py against the reference implementations):
PRESETS = {
    # GPT-2 small: 124,439,808 parameters (HF GPT2LMHeadModel, tied embeddings)
    "gpt2": dict(arch="gpt", vocab_size=50257, block_size=1024, n_layer=12, n_head=12, n_embd=768),
    # BERT-base: 109,482,240 in HF BertModel ("110M"); ours lacks the segment embeddings and pooler
    "bert-base": dict(arch="bert", vocab_size=30522, block_size=512, n_layer=12, n_head=12, n_embd=768),
    # T5-small: 60,506,624 (HF T5Model, shared embeddings, no biases, relative positions: we use rotary, also
    # parameter-free and relative)
    "t5-small": dict(arch="t5", vocab_size=32128, block_size=512, n_layer=6, n_head=8, n_embd=512,
                     d_ff=2048, bias=False, position="rope"),
    # small presets for a CPU
    "cpu-tiny": dict(n_layer=2, n_head=2, n_embd=64, block_size=64),
    "cpu-small": dict(n_layer=4, n_head=4, n_embd=128, block_size=64),
    "cpu-base": dict(n_layer=6, n_head=6, n_embd=384, block_size=256),
}


class Transformer(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        config.validate()
        self.config = config
        self.token_embedding = nn.Embedding(config.vocab_size, config.n_embd)
        if config.position == "learned":
            self.position_embedding = nn.Embedding(config.block_size, config.n_embd)  # shared by both t5 stacks
        self.rotary = (RotaryPositions(config.n_embd // config.n_head, config.block_size)
                       if config.position == "rope" else None)
        if config.position == "relative":  # T5: one bias table per stack; the decoder's sees only the past
            self.relative_bias = RelativePositionBias(config, ATTENTION_OF_ARCH.get(config.arch) != "causal")
            if config.arch == "t5":
                self.decoder_relative_bias = RelativePositionBias(config, bidirectional=False)
        if config.segment_vocab_size:  # BERT
            self.segment_embedding = nn.Embedding(config.segment_vocab_size, config.n_embd)
        self.embedding_norm = make_norm(config) if config.post_norm else nn.Identity()  # BERT normalises here...
        self.dropout = nn.Dropout(config.dropout)
        # ---- the architecture switch: the only place where the four differ in modules ----
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))  # t5: the encoder
        self.final_norm = nn.Identity() if config.post_norm else make_norm(config)  # ...and so not at the end
        if config.arch == "t5":
            self.decoder_blocks = nn.ModuleList(Block(config, cross_attention=True)
                                                for _ in range(config.n_decoder_layer))
            self.decoder_norm = make_norm(config)
        if config.mlm_head:  # BERT: hidden -> dense -> GELU -> norm, then the tied embedding plus a bias
            self.head_transform = nn.Sequential(nn.Linear(config.n_embd, config.n_embd),
                                                Activation(config.activation), make_norm(config))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=config.mlm_head)
        self.lm_head.weight = self.token_embedding.weight  # tied input/output embeddings
        self.apply(self._init_weights)

    def _init_weights(self, module):
        if isinstance(module, nn.Linear):
            std = 0.02
            if getattr(module, "residual_output", False):  # GPT-2: scale by depth of the residual stream
                std = 0.02 / math.sqrt(2 * (self.config.n_layer + self.config.n_decoder_layer))
            nn.init.normal_(module.weight, mean=0.0, std=std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def attention_maps(self, ids, prefix_length=None):
        """Every layer's attention probabilities for ids: a list of (B, nh, T, T), computed explicitly."""
        layers = [block.attention for block in self.blocks]
        for attention in layers:
            attention.record_probabilities = True
        try:
            with torch.no_grad():
                if self.config.arch == "t5":
                    self.encode(ids)
                else:
                    self.run_stack(ids, prefix_length)
            return [attention.probabilities for attention in layers]
        finally:
            for attention in layers:
                attention.record_probabilities, attention.probabilities = False, None

    def num_parameters(self, exclude_positions=False):
        n = sum(p.numel() for p in self.parameters())  # parameters() yields the tied weight once
        if exclude_positions and self.config.position == "learned":
            n -= self.position_embedding.weight.numel()
        return n

    def embed(self, ids, start=0):
        T = ids.size(1)
        if start + T > self.config.block_size:
            raise ValueError(f"sequence of length {start + T} is longer than block_size={self.config.block_size}")
        x = self.token_embedding(ids)  # (B, T, C)
        if self.config.position == "learned":
            x = x + self.position_embedding(torch.arange(start, start + T, device=ids.device))
        if self.config.segment_vocab_size:
            x = x + self.segment_embedding.weight[0]  # every token in segment 0: one text, no sentence pairs
        return self.dropout(self.embedding_norm(x))

    def position_bias(self, stack, query_length, key_length, start):
        """T5's relative position bias (1, nh, Tq, Tk) for "encoder" (or the single stack) or "decoder"; None
        for the other kinds of position."""
        if self.config.position != "relative":
            return None
        table = self.decoder_relative_bias if stack == "decoder" else self.relative_bias
        return table(query_length, key_length, start, self.token_embedding.weight.device)

    def run_stack(self, ids, prefix_length=None, lengths=None, cache=None):
        """gpt / bert / prefixlm: one stack, the mask picked by the arch. Returns the final hidden states.
        lengths (B,): the real length of each row of right-padded ids (padded keys hidden)."""
        start = cache.length if cache is not None else 0
        x = self.embed(ids, start)  # (B, T, C)
        T = ids.size(1)
        attn_mask, is_causal = masks.attention_mask(ATTENTION_OF_ARCH[self.config.arch], T, start + T,
                                                    prefix_length=prefix_length, lengths=lengths, device=ids.device)
        position_bias = self.position_bias("encoder", T, start + T, start)
        for i, block in enumerate(self.blocks):
            x = block(x, attn_mask=attn_mask, is_causal=is_causal, rotary=self.rotary, start=start,
                      cache=cache.layer(i) if cache is not None else None, position_bias=position_bias)
        if cache is not None:
            cache.advance(ids, T)
        return self.final_norm(x)

    def encode(self, ids, lengths=None):
        """t5's encoder: the same blocks, bidirectional (padding hidden when examples have different lengths)."""
        x = self.embed(ids)
        attn_mask, _ = masks.attention_mask("bidirectional", ids.size(1), lengths=lengths, device=ids.device)
        position_bias = self.position_bias("encoder", ids.size(1), ids.size(1), 0)
        for block in self.blocks:
            x = block(x, attn_mask=attn_mask, rotary=self.rotary, position_bias=position_bias)
        return self.final_norm(x)  # (B, T_enc, C), "memory"

    def decode(self, ids, memory=None, lengths=None, cache=None):
        """t5's decoder: causal self-attention plus cross-attention to the encoder output (lengths: its rows' real
        lengths). While decoding with a cache, `memory` may be None: cross-attention K/V were stored once in the
        cache."""
        start = cache.length if cache is not None else 0
        x = self.embed(ids, start)
        T = ids.size(1)
        attn_mask, is_causal = masks.attention_mask("causal", T, start + T, device=ids.device)
        cross_mask = None
        if lengths is not None and memory is not None:
            cross_mask, _ = masks.attention_mask("bidirectional", T, memory.size(1), lengths=lengths, device=ids.device)
        elif cache is not None:
            cross_mask = cache.cross_mask
        position_bias = self.position_bias("decoder", T, start + T, start)
        for i, block in enumerate(self.decoder_blocks):
            x = block(x, attn_mask=attn_mask, is_causal=is_causal, rotary=self.rotary, start=start,
                      cache=cache.layer(i) if cache is not None else None, position_bias=position_bias,
                      memory=memory, cross_mask=cross_mask,
                      cross_keys_values=cache.cross_keys_values(i) if cache is not None else None)
        if cache is not None:
            cache.advance(ids, T)
        return self.decoder_norm(x)

    def forward(self, inputs, targets=None, prefix_length=None, decoder_inputs=None, lengths=None,
                loss_weights=None):
        """Logits for every position (B, T, V) and, with targets, the mean loss over supervised positions.

        inputs: (B, T) token ids (t5: the encoder's input; lengths (B,) when its rows are padded).
        decoder_inputs: (B, T_dec), t5 only. targets: aligned with the positions that produce logits,
        IGNORE_INDEX where there is no loss. loss_weights: optional (B, T) per-position weights (masked
        diffusion's 1/t); the loss is then sum(weight * cross-entropy) / number of positions, an ELBO rather than
        a mean (claim C4)."""
        if self.config.arch == "t5":
            memory = self.encode(inputs, lengths)
            hidden = self.decode(decoder_inputs, memory, lengths)
        else:
            hidden = self.run_stack(inputs, prefix_length, lengths)
        logits = self.logits(hidden)  # (B, T, V): every position, MLM needs them all
        if targets is None:
            return logits, None
        return logits, self.loss(logits, targets, loss_weights)

    def logits(self, hidden):
        """Final hidden states -> logits over the vocabulary, through the tied output embedding."""
        if self.config.mlm_head:
            hidden = self.head_transform(hidden)
        if self.config.scale_tied_output:
            hidden = hidden * self.config.n_embd ** -0.5
        return self.lm_head(hidden)

    @staticmethod
    def loss(logits, targets, loss_weights=None):
        flat_logits, flat_targets = logits.float().view(-1, logits.size(-1)), targets.reshape(-1)
        if loss_weights is None:
            return F.cross_entropy(flat_logits, flat_targets, ignore_index=IGNORE_INDEX)
        per_position = F.cross_entropy(flat_logits, flat_targets, ignore_index=IGNORE_INDEX, reduction="none")
        return (per_position * loss_weights.reshape(-1)).sum() / flat_targets.numel()

    def training_flops(self, batch):
        """Forward + backward FLOPs of one training step on `batch` (an objectives.Batch: inputs (B, T) and, for
        t5, decoder_inputs (B, T_dec)): 6 FLOPs per parameter per token that passes through it, plus attention's
        12 * layers * T_query * T_key * d (nanoGPT/PaLM accounting; the full score matrix is counted, masked or
        not). t5's encoder tokens skip the output head; its decoder also attends to the encoder."""
        c = self.config
        B, T = batch.inputs.shape
        T_dec = batch.decoder_inputs.size(1) if batch.decoder_inputs is not None else 0
        block_params = sum(p.numel() for p in self.blocks.parameters())
        head_params = c.vocab_size * c.n_embd
        if c.arch != "t5":
            return B * (6 * T * (block_params + head_params) + 12 * c.n_layer * T ** 2 * c.n_embd)
        decoder_params = sum(p.numel() for p in self.decoder_blocks.parameters())
        # cross-attention keys/values are projected from the encoder's tokens, not the decoder's
        cross_kv = sum(p.numel() for b in self.decoder_blocks for p in b.cross_attention.key_value.parameters())
        return B * (6 * T * (block_params + cross_kv) + 12 * c.n_layer * T ** 2 * c.n_embd
                    + 6 * T_dec * (decoder_params - cross_kv + head_params)
                    + 12 * c.n_decoder_layer * (T_dec ** 2 + T_dec * T) * c.n_embd)

    def configure_optimizer(self, weight_decay, learning_rate, betas, device_type):
        # decay matrices (2-D), not biases, norms; embeddings are 2-D and decayed, as nanoGPT does
        params = [p for p in self.parameters() if p.requires_grad]
        groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
                  {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
        extra = {"fused": True} if device_type in ("cuda", "cpu") else {}  # one kernel, not a loop over tensors
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas, **extra)


def config_from_preset(name, **overrides):
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}: choose one of {', '.join(PRESETS)}")
    return ModelConfig(**{**PRESETS[name], **overrides})


def describe(model):
    c = model.config
    stacks = f"{c.n_layer} encoder + {c.n_decoder_layer} decoder layers" if c.arch == "t5" else f"{c.n_layer} layers"
    return f"{c.arch}: {stacks}, {c.n_head} heads, {c.n_embd} dims, {model.num_parameters() / 1e6:.2f}M parameters"


# =============================================================================================================
# Published-checkpoint fidelity. Nothing above needs what follows to train from scratch: these are the few
# options (ModelConfig's second group of fields) that let GPT-2's, BERT's and T5's released weights compute in
# these modules exactly what they computed when published (infra/pretrained.py maps their names onto ours).
# =============================================================================================================

NORMS = ("layernorm", "rmsnorm")
# GPT-2's tanh approximation of GELU is our default (docs/reliability.md: why not the exact one); BERT uses the
# exact GELU and T5 (v1.0) a ReLU
ACTIVATIONS = {"gelu_tanh": lambda x: F.gelu(x, approximate="tanh"), "gelu": F.gelu, "relu": F.relu}


class Activation(nn.Module):
    def __init__(self, name):
        super().__init__()
        self.name, self.function = name, ACTIVATIONS[name]

    def forward(self, x):
        return self.function(x)


def make_norm(config):
    """LayerNorm (GPT-2, BERT, ours) or RMSNorm (T5: no mean subtraction, no bias)."""
    if config.norm == "rmsnorm":
        return nn.RMSNorm(config.n_embd, eps=config.norm_eps)
    return nn.LayerNorm(config.n_embd, eps=config.norm_eps, bias=config.bias)


def post_norm_forward(block, x, attn_mask, is_causal, rotary, start, cache, position_bias):
    """The original Transformer's and BERT's order, norm(x + sublayer(x)), for one stack (no cross-attention)."""
    x = block.norm_1(x + block.attention(x, attn_mask=attn_mask, is_causal=is_causal, rotary=rotary, start=start,
                                         cache=cache, position_bias=position_bias))
    return block.norm_2(x + block.mlp(x))


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


def add_position_bias(attn_mask, is_causal, position_bias, query_length, key_length, device):
    """Fold T5's additive position bias and the boolean mask into one float mask for SDPA."""
    if is_causal:
        attn_mask = masks.causal_mask(query_length, key_length, device)
    if attn_mask is None:
        return position_bias
    return position_bias.masked_fill(~attn_mask, float("-inf"))


if __name__ == "__main__":
    for preset in ("gpt2", "bert-base", "t5-small"):  # the published sizes, built without memory (meta device)
        with torch.device("meta"):
            print(f"{preset:10s} {describe(Transformer(config_from_preset(preset)))}", flush=True)
