"""
One Transformer for every architecture in the debate (claims A1, A2).

gpt, bert and prefixlm are literally the same modules: one stack of `Block`s. The only line that
differs is ATTENTION_OF_ARCH below, the mask each query row gets. t5 is two stacks of the same
`Block`, the decoder's blocks adding cross-attention to the encoder's output. Read leaf to root:
rotary positions, attention, MLP, block, config (with size presets), model. What published BERT and
T5 weights compute differently (post-norm, RMSNorm, T5's relative position bias, ...) is built on
these modules in infra/published_model.py; GPT-2 needs nothing more.

One attention function (`Attention.forward`: project, rotate, attend, merge) serves
self-attention, cross-attention and cached decoding. Beside the chapter, on these modules: the
attention matrices recorded (infra/attention_maps.py), a gpt made into a diffusion model
(infra/adaptation.py).

    python model.py     # claims B3 (the published sizes), A1 (one set of modules) and D5 (NoPE)
"""
import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

import masks

IGNORE_INDEX = -100  # targets equal to this carry no loss (unsupervised positions)

# The whole difference between the single-stack architectures (claim A1): their masks (masks.py)
ATTENTION_OF_ARCH = {"gpt": "causal", "bert": "bidirectional", "prefixlm": "prefix"}
ARCHS = ("gpt", "bert", "prefixlm", "t5")  # t5: encoder, decoder, cross-attention (A1, A2)
POSITION_KINDS = ("learned", "rope", "none")  # "none" is NoPE (claim D5)


class RotaryPositions(nn.Module):
    """Rotary position embedding: rotate each (even, odd) pair of q/k features by an angle
    proportional to the position, so q.k depends on the relative offset. No parameters."""

    def __init__(self, head_size, max_length, base=10000.0):
        super().__init__()
        inverse_frequency = 1.0 / (base ** (torch.arange(0, head_size, 2).float() / head_size))
        angles = torch.outer(torch.arange(max_length).float(), inverse_frequency)  # (T, hs/2)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, x, start):
        # x: (B, nh, T, hs); positions start .. start+T-1
        T = x.size(2)
        # (T, hs/2)
        cos, sin = self.cos[start:start + T].to(x.dtype), self.sin[start:start + T].to(x.dtype)
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)


class Attention(nn.Module):
    """Multi-head attention: project, rotate, attend, merge. Queries, keys and values come from `x`
    (self-attention), or the keys and values are given: `memory_kv`, t5's cross-attention, the K/V
    of the encoder output computed once. An optional `cache` (kvcache.LayerCache) keeps the K/V of
    self-attention across calls; `mask` is (attn_mask, is_causal) from masks.attention_mask."""

    def __init__(self, config):
        super().__init__()
        self.n_head, self.dropout = config.n_head, config.dropout
        self.query = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.key_value = nn.Linear(config.n_embd, 2 * config.n_embd, bias=config.bias)
        self.proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.proj.residual_output = True  # scaled init, as GPT-2
        self.resid_dropout = nn.Dropout(config.dropout)

    def split_heads(self, t):
        B, T, C = t.shape
        return t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)

    def keys_and_values(self, source):
        """(K, V), each (B, nh, Tk, hs), of a key/value source (B, Tk, C)."""
        k, v = self.key_value(source).split(source.size(-1), dim=2)
        return self.split_heads(k), self.split_heads(v)

    def attend(self, q, k, v, mask):
        """softmax(q k^T / sqrt(hs) + mask) v, (B, nh, T, hs), by SDPA: the (T, Tk) matrix is never
        written out (infra/attention_maps.py records it, computed explicitly)."""
        attn_mask, is_causal = mask
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal,
                                              dropout_p=self.dropout if self.training else 0.0)

    def forward(self, x, mask=(None, False), rotary=None, start=0, cache=None, memory_kv=None):
        B, T, C = x.shape
        q = self.split_heads(self.query(x))  # (B, nh, T, hs)
        if memory_kv is not None:
            k, v = memory_kv  # t5's cross-attention: the encoder output never changes
        else:
            k, v = self.keys_and_values(x)  # (B, nh, T, hs)
            if rotary is not None:  # rotary positions turn q and k by their positions
                q, k = rotary(q, start), rotary(k, start)
            if cache is not None:
                # claim D4: under a causal mask the K/V of position i depend only on tokens 0..i, so
                # the cache keeps them and the new queries attend to [cached ; new]
                k, v = cache.update(k, v)  # (B, nh, start+T, hs)
        y = self.attend(q, k, v, mask)  # (B, nh, T, hs)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # merge the heads: (B, T, C)
        return self.resid_dropout(self.proj(y))


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.fc = nn.Linear(config.n_embd, config.d_ff, bias=config.bias)
        self.activation = nn.GELU(approximate="tanh")  # GPT-2's (docs/reliability.md: why not the
                                                       # exact one)
        self.proj = nn.Linear(config.d_ff, config.n_embd, bias=config.bias)
        self.proj.residual_output = True
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        return self.dropout(self.proj(self.activation(self.fc(x))))


class Block(nn.Module):
    """Pre-norm Transformer block. With cross_attention=True (t5's decoder) it gains one more
    sub-layer that reads the encoder output, `cross` = (its K/V, its padding mask); that is the only
    new module encoder-decoder needs (claim A2)."""

    def __init__(self, config, cross_attention=False):
        super().__init__()
        self.norm_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attention = Attention(config)
        if cross_attention:
            self.norm_cross = nn.LayerNorm(config.n_embd, bias=config.bias)
            self.cross_attention = Attention(config)
        self.norm_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x, mask=(None, False), rotary=None, start=0, cache=None, cross=None):
        x = x + self.attention(self.norm_1(x), mask, rotary, start, cache)
        if cross is not None:
            memory_kv, memory_mask = cross
            x = x + self.cross_attention(self.norm_cross(x), (memory_mask, False),
                                         memory_kv=memory_kv)
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
    position: str = "learned"   # learned | rope | none (NoPE, claim D5)
    init_std: float = 0.02      # GPT-2's N(0, 0.02), every weight (experiments/plateau.py: others)
    shift_logits: bool = False  # a diffusion model adapted from gpt: position i - 1's output
                                # scores token i (infra/adaptation.py's DiffusionFromGpt)

    def __post_init__(self):
        if self.d_ff == 0:
            self.d_ff = 4 * self.n_embd
        if self.arch == "t5" and self.n_decoder_layer == 0:
            self.n_decoder_layer = self.n_layer

    def validate(self):
        """Raise ValueError, one actionable line, for a config that cannot be built."""
        if self.arch not in ARCHS:
            raise ValueError(f"unknown arch {self.arch!r}: choose one of {', '.join(ARCHS)}")
        if self.position not in POSITION_KINDS:
            raise ValueError(f"unknown position {self.position!r}: choose one of "
                             f"{', '.join(POSITION_KINDS)}")
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd", "d_ff"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.arch == "t5" and self.n_decoder_layer < 1:
            raise ValueError("n_decoder_layer must be at least 1 for t5 (0 = as many as n_layer)")
        if self.arch != "t5" and self.n_decoder_layer:
            raise ValueError(f"n_decoder_layer is for t5 only; {self.arch} has one stack (set "
                             "n_layer)")
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd={self.n_embd} is not divisible by n_head={self.n_head}: "
                             f"pick n_embd a multiple of n_head")
        if self.position == "rope" and (self.n_embd // self.n_head) % 2:
            raise ValueError("rotary positions need an even head size (n_embd / n_head)")
        if not self.init_std > 0.0:
            raise ValueError(f"init_std must be above 0, got {self.init_std}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")


# Published sizes (parameter counts checked in tests/test_model.py against the references):
PRESETS = {
    # GPT-2 small: 124,439,808 parameters (HF GPT2LMHeadModel, tied embeddings)
    "gpt2": dict(arch="gpt", vocab_size=50257, block_size=1024, n_layer=12, n_head=12, n_embd=768),
    # BERT-base: 109,482,240 in HF BertModel ("110M"); ours lacks the segment embeddings and pooler
    "bert-base": dict(arch="bert", vocab_size=30522, block_size=512, n_layer=12, n_head=12,
                      n_embd=768),
    # T5-small: 60,506,624 (HF T5Model, shared embeddings, no biases, relative positions: we use
    # rotary, also parameter-free and relative)
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
        if config.position == "learned":  # one table, shared by both t5 stacks
            self.position_embedding = nn.Embedding(config.block_size, config.n_embd)
        self.rotary = (RotaryPositions(config.n_embd // config.n_head, config.block_size)
                       if config.position == "rope" else None)
        self.dropout = nn.Dropout(config.dropout)
        # ---- the architecture switch: the only place where the four differ in modules ----
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))  # t5: the encoder
        self.final_norm = nn.LayerNorm(config.n_embd, bias=config.bias)
        if config.arch == "t5":
            self.decoder_blocks = nn.ModuleList(Block(config, cross_attention=True)
                                                for _ in range(config.n_decoder_layer))
            self.decoder_norm = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.lm_head.weight = self.token_embedding.weight  # tied input/output embeddings
        self.apply(self._init_weights)

    def _init_weights(self, module):
        if isinstance(module, nn.Linear):
            # GPT-2: outputs into the residual stream scaled by its depth
            depth = 2 * (self.config.n_layer + self.config.n_decoder_layer)
            std = self.config.init_std
            std = std / math.sqrt(depth) if getattr(module, "residual_output", False) else std
            nn.init.normal_(module.weight, mean=0.0, std=std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=self.config.init_std)

    def num_parameters(self, exclude_positions=False):
        n = sum(p.numel() for p in self.parameters())  # parameters() yields the tied weight once
        if exclude_positions and self.config.position == "learned":
            n -= self.position_embedding.weight.numel()
        return n

    def embed(self, ids, start=0):
        T = ids.size(1)
        if start + T > self.config.block_size:
            raise ValueError(f"sequence of length {start + T} is longer than "
                             f"block_size={self.config.block_size}")
        x = self.token_embedding(ids)  # (B, T, C)
        if self.config.position == "learned":
            x = x + self.position_embedding(torch.arange(start, start + T, device=ids.device))
        return self.dropout(x)

    def run_stack(self, ids, prefix_length=None, lengths=None, cache=None, attention=None):
        """gpt / bert / prefixlm: one stack, the mask picked by the arch. Returns the final hidden
        states. lengths (B,): the real length of each row of right-padded ids (padded keys hidden).
        attention: a (T, T) boolean mask used instead of the arch's (claim A1: the arch is only its
        mask; a gpt opened step by step into a diffusion model, infra/adaptation.py)."""
        start = cache.length if cache is not None else 0
        x = self.embed(ids, start)  # (B, T, C)
        T = ids.size(1)
        # the one line where gpt, bert and prefixlm differ (claim A1): the arch's attention kind
        mask = masks.attention_mask(ATTENTION_OF_ARCH[self.config.arch], T, start + T,
                                    prefix_length=prefix_length, lengths=lengths, device=ids.device)
        if attention is not None:  # a mask given instead (training windows: no padding to hide)
            mask = (attention, False)
        for i, block in enumerate(self.blocks):
            x = block(x, mask, self.rotary, start, cache.layer(i) if cache is not None else None)
        if cache is not None:
            cache.advance(ids)
        return self.final_norm(x)

    def encode(self, ids, lengths=None):
        """t5's encoder: the same blocks, bidirectional
        (padding hidden when examples have different lengths)."""
        x = self.embed(ids)
        mask = masks.attention_mask("bidirectional", ids.size(1), ids.size(1), lengths=lengths,
                                    device=ids.device)
        for block in self.blocks:
            x = block(x, mask, self.rotary)
        return self.final_norm(x)  # (B, T_enc, C), "memory"

    def decode(self, ids, memory=None, lengths=None, cache=None):
        """t5's decoder: causal self-attention plus cross-attention to the encoder output `memory`
        (lengths: its rows' real lengths). With a cache, `memory` is not needed: its K/V were stored
        once in the cache."""
        start = cache.length if cache is not None else 0
        x = self.embed(ids, start)
        T = ids.size(1)
        mask = masks.attention_mask("causal", T, start + T, device=ids.device)
        if cache is not None:
            memory_kv, memory_mask = cache.memory_kv, cache.memory_mask
        else:
            memory_kv = [block.cross_attention.keys_and_values(memory)
                         for block in self.decoder_blocks]
            memory_mask = None if lengths is None else masks.attention_mask(
                "bidirectional", T, memory.size(1), lengths=lengths, device=ids.device)[0]
        for i, block in enumerate(self.decoder_blocks):
            x = block(x, mask, self.rotary, start, cache.layer(i) if cache is not None else None,
                      cross=(memory_kv[i], memory_mask))
        if cache is not None:
            cache.advance(ids)
        return self.decoder_norm(x)

    def forward(self, inputs, targets=None, prefix_length=None, decoder_inputs=None, lengths=None,
                loss_weights=None, attention=None):
        """Logits for every position (B, T, V) and, with targets, the mean loss over
        supervised positions.

        inputs: (B, T) token ids (t5: the encoder's input; lengths (B,) when its rows are padded).
        decoder_inputs: (B, T_dec), t5 only. targets: aligned with the positions that produce
        logits, IGNORE_INDEX where there is no loss. loss_weights: optional (B, T) per-position
        weights (masked diffusion's 1/t); the loss is then sum(weight * cross-entropy) / number of
        positions, an ELBO rather than a mean (claim C4). attention: see run_stack."""
        if self.config.arch == "t5":
            memory = self.encode(inputs, lengths)
            hidden = self.decode(decoder_inputs, memory, lengths)
        else:
            hidden = self.run_stack(inputs, prefix_length, lengths, attention=attention)
        logits = self.logits(hidden)  # (B, T, V): every position, MLM needs them all
        if targets is None:
            return logits, None
        return logits, self.loss(logits, targets, loss_weights)

    def logits(self, hidden):
        """Final hidden states -> logits over the vocabulary, through the tied output embedding."""
        return self.lm_head(hidden)

    @staticmethod
    def loss(logits, targets, loss_weights=None):
        flat_logits, flat_targets = logits.float().view(-1, logits.size(-1)), targets.reshape(-1)
        if loss_weights is None:
            return F.cross_entropy(flat_logits, flat_targets, ignore_index=IGNORE_INDEX)
        per_position = F.cross_entropy(flat_logits, flat_targets, ignore_index=IGNORE_INDEX,
                                       reduction="none")
        return (per_position * loss_weights.reshape(-1)).sum() / flat_targets.numel()

    def training_flops(self, batch):
        """Forward + backward FLOPs of one training step on `batch` (an objectives.Batch: inputs (B,
        T) and, for t5, decoder_inputs (B, T_dec)): 6 FLOPs per parameter per token that passes
        through it, plus attention's 12 * layers * T_query * T_key * d (nanoGPT/PaLM accounting; the
        full score matrix is counted, masked or not). t5's encoder tokens skip the output head; its
        decoder also attends to the encoder."""
        config = self.config
        B, T = batch.inputs.shape
        T_dec = batch.decoder_inputs.size(1) if batch.decoder_inputs is not None else 0
        block_params = sum(p.numel() for p in self.blocks.parameters())
        head_params = config.vocab_size * config.n_embd
        if config.arch != "t5":
            return B * (6 * T * (block_params + head_params)
                        + 12 * config.n_layer * T ** 2 * config.n_embd)
        decoder_params = sum(p.numel() for p in self.decoder_blocks.parameters())
        # cross-attention keys/values are projected from the encoder's tokens, not the decoder's
        cross_kv = sum(p.numel() for b in self.decoder_blocks
                       for p in b.cross_attention.key_value.parameters())
        return B * (6 * T * (block_params + cross_kv) + 12 * config.n_layer * T ** 2 * config.n_embd
                    + 6 * T_dec * (decoder_params - cross_kv + head_params)
                    + 12 * config.n_decoder_layer * (T_dec ** 2 + T_dec * T) * config.n_embd)

    def configure_optimizer(self, weight_decay, learning_rate, betas, device_type):
        # decay matrices (2-D), not biases, norms; embeddings are 2-D and decayed, as nanoGPT does
        params = [p for p in self.parameters() if p.requires_grad]
        groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
                  {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
        # one kernel, not a loop over tensors
        extra = {"fused": True} if device_type in ("cuda", "cpu") else {}
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas, **extra)


def config_from_preset(name, **overrides):
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}: choose one of {', '.join(PRESETS)}")
    return ModelConfig(**{**PRESETS[name], **overrides})


def describe(model):
    c = model.config
    stacks = f"{c.n_layer} layers"
    if c.arch == "t5":
        stacks = f"{c.n_layer} encoder + {c.n_decoder_layer} decoder layers"
    millions = model.num_parameters() / 1e6
    return f"{c.arch}: {stacks}, {c.n_head} heads, {c.n_embd} dims, {millions:.2f}M parameters"


def demo():
    """What `python model.py` prints: claims B3, A1 and D5 in a few seconds, on random weights."""
    for preset in ("gpt2", "bert-base", "t5-small"):
        # the published sizes, built without memory (meta device)
        with torch.device("meta"):
            print(f"B3: {preset:10s} {describe(Transformer(config_from_preset(preset)))}",
                  flush=True)
    torch.manual_seed(0)
    small = {arch: Transformer(ModelConfig(arch=arch, vocab_size=65, block_size=16, n_layer=2,
                                           n_head=2, n_embd=32, position="none")).eval()
             for arch in ARCHS}
    print("A1: the same 2 layers x 32 dims: "
          + ", ".join(f"{a} {m.num_parameters():,}" for a, m in small.items())
          + " parameters (gpt, bert, prefixlm: one set of modules, only the mask differs; t5: two "
          "stacks and cross-attention)")
    ids = torch.arange(8)[None]  # eight different tokens, then the same eight in reverse order
    with torch.no_grad():
        for arch in ("bert", "gpt"):
            # no position embedding at all (NoPE): can the model tell the order? The reversed
            # run's outputs flipped back, compared token by token
            forward, backward = small[arch](ids)[0][0], small[arch](ids.flip(1))[0][0].flip(0)
            print(f"D5: {arch} without positions, the sequence reversed: each token's output "
                  f"changes by up to {(forward - backward).abs().max().item():.1e}")
    print("D5: bert reads a bag of tokens and cannot tell the order; under the causal mask a "
          "position sees itself and the tokens before it, so how much it sees tells it where it "
          "is")


if __name__ == "__main__":
    masks.run_demo(demo, "model.py")
