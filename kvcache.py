"""
KV caching: why decoders are cheap to run and encoders are not (claim D4).

Under a causal mask the keys and values of position i depend only on tokens 0..i, so once computed
they never change: keep them (a KV cache), and each new token costs one position's worth of compute
instead of the whole sequence. The same fact lets several requests share one prompt's
K/V (prefix caching).

    gpt       prefill the prompt (causal, one forward), then decode one token at a time against
              the cache
    prefixlm  the prompt is the bidirectional prefix, computed once; generated tokens are causal
              and append: valid because nothing after the prefix changes the prefix
    t5        the encoder runs once; cross-attention K/V computed once; decoder self-attention
              cached like gpt
    bert      no cache can be correct: appending a token changes every earlier representation
              (`bidirectional_cache_error` measures by how much). Generation needs iterative
              unmasking instead (sample.py's `unmask`).

The cache is preallocated (no torch.cat per token): (layers, B, heads, max_length, head size) for K
and for V. The samplers that use it
(temperature, top-k, the sliding window, the uncached reference) are in sample.py.

    python kvcache.py     # claim D4 in numbers: cached = recomputed for gpt, not for bert
"""

import torch

import masks
from model import ATTENTION_OF_ARCH


class LayerCache:
    """One layer's view of the shared cache; the attention module calls update(k, v)."""

    def __init__(self, cache, index):
        self.cache, self.index = cache, index
        # this layer's part of the shared buffers, (B, nh, max_length, hs): writing through a
        # per-layer view lets torch.compile update it in place (a write into keys[index, ...] makes
        # it copy the whole buffer each step)
        self.keys, self.values = cache.keys[index], cache.values[index]

    def update(self, k, v):
        # k, v: (B, nh, T_new, hs) for the new positions; write them in place, return [cached ; new]
        start = self.cache.length
        end = start + k.size(2)
        if end > self.cache.max_length:
            raise ValueError(f"KV cache full: {start} + {k.size(2)} > {self.cache.max_length}")
        self.keys[:, :, start:end] = k
        self.values[:, :, start:end] = v
        return self.keys[:, :, :end], self.values[:, :, :end]  # views, no copy


class KVCache:
    def __init__(self, model, batch_size, max_length=None, device=None, dtype=None):
        self.model = model
        config = model.config
        parameter = next(model.parameters())
        device, dtype = device or parameter.device, dtype or parameter.dtype
        self.batch_size = batch_size
        self.max_length = max_length or config.block_size
        n_layers = config.n_decoder_layer if config.arch == "t5" else config.n_layer
        shape = (n_layers, batch_size, config.n_head, self.max_length,
                 config.n_embd // config.n_head)
        self.keys = torch.zeros(shape, device=device, dtype=dtype)
        self.values = torch.zeros(shape, device=device, dtype=dtype)
        # what is cached
        self.tokens = torch.zeros(batch_size, self.max_length, dtype=torch.long, device=device)
        self.length = 0           # positions filled so far
        self.prefix_length = None  # prefixlm: (B,) the bidirectional prefix
        # t5: per decoder layer (K, V) of the encoder output, and its padding mask
        self.memory_kv, self.memory_mask = None, None
        self._layers = [LayerCache(self, i) for i in range(n_layers)]

    def layer(self, i):
        return self._layers[i]

    def set_prefix(self, length):
        """prefixlm: the first `length` positions form the bidirectional prefix of every row."""
        self.prefix_length = torch.full((self.batch_size,), length, device=self.tokens.device)

    def advance(self, ids):
        """Record `ids` (B, T) as cached: every layer has stored their K/V (LayerCache.update
        refused what does not fit)."""
        T = ids.size(1)
        self.tokens[:, self.length:self.length + T] = ids
        self.length += T

    def set_encoder_output(self, model, memory, lengths=None):
        """t5: compute every decoder layer's cross-attention K/V once; the encoder
        output never changes."""
        self.memory_kv = [block.cross_attention.keys_and_values(memory)
                          for block in model.decoder_blocks]
        if lengths is not None:
            self.memory_mask, _ = masks.attention_mask("bidirectional", 1, memory.size(1),
                                                       lengths=lengths, device=memory.device)

    def fork(self, batch_size):
        """Prefix caching across samples: a new cache of batch_size rows that all start from row 0's
        K/V, so one prefill serves every continuation (a copy of memory, no recomputation)."""
        other = KVCache(self.model, batch_size, self.max_length, self.keys.device, self.keys.dtype)
        other.keys.copy_(self.keys[:, :1].expand_as(other.keys))  # (layers, B, nh, max_length, hs)
        other.values.copy_(self.values[:, :1].expand_as(other.values))
        other.tokens.copy_(self.tokens[:1].expand_as(other.tokens))
        other.length = self.length
        if self.prefix_length is not None:
            other.prefix_length = self.prefix_length[:1].repeat(batch_size)
        if self.memory_kv is not None:
            # t5: the encoder output is the same for every row; views, not copies
            other.memory_kv = [(k[:1].expand(batch_size, -1, -1, -1),
                                v[:1].expand(batch_size, -1, -1, -1))
                               for k, v in self.memory_kv]
            if self.memory_mask is not None:
                other.memory_mask = self.memory_mask[:1].expand(batch_size, -1, -1, -1)
        return other


# ----------------------------------------------------------------------------- prefill and decode

def forward_with_cache(model, ids, cache):
    """Run new tokens `ids` (B, T_new) on top of what `cache` holds; return logits of every new
    position. T_new > 1 on a non-empty cache is chunked prefill: masks.attention_mask aligns the
    causal mask bottom-right."""
    if model.config.arch == "t5":
        hidden = model.decode(ids, cache=cache)
    else:
        hidden = model.run_stack(ids, prefix_length=cache.prefix_length, cache=cache)
    return model.logits(hidden)  # (B, T_new, V)


def prefill(model, prompt, cache, encoder_inputs=None, lengths=None):
    """Fill the cache with a prompt in one forward; return the logits of its last position (B, V).
    prefixlm: the prompt becomes the bidirectional prefix. t5: `encoder_inputs` go through the
    encoder once and `prompt` is the decoder's start (usually the start token)."""
    arch = model.config.arch
    if arch == "t5":
        memory = model.encode(encoder_inputs, lengths)
        cache.set_encoder_output(model, memory, lengths)
    elif ATTENTION_OF_ARCH[arch] == "prefix":
        cache.set_prefix(cache.length + prompt.size(1))
    return forward_with_cache(model, prompt, cache)[:, -1]


def extend_prompt(model, prompt, cache):
    """Prefix caching for one request stream (gpt): if the cache already holds a prefix of `prompt`,
    compute only the new tokens (a chunked prefill). Returns (logits of the last position, number of
    tokens computed). Only sound for causal attention: in prefixlm or bert, new prompt tokens would
    change the cached prefix."""
    if ATTENTION_OF_ARCH.get(model.config.arch) != "causal":
        raise ValueError("extending a cached prompt is only exact for causal attention (claim D4)")
    n = min(cache.length, prompt.size(1) - 1)  # keep at least one token to compute
                                               # (we need its logits)
    same = (cache.tokens[:, :n] == prompt[:, :n]).all(dim=0)
    common = int(same.long().cumprod(0).sum()) if n > 0 else 0
    cache.length = common  # entries past the common prefix are stale: overwrite them
    new = prompt[:, common:]
    return forward_with_cache(model, new, cache)[:, -1], new.size(1)


# ----------------------------------------------------------------- claim D4's counter-demonstration

@torch.no_grad()
def bidirectional_cache_error(model, ids):
    """Use a KV cache on a bidirectional model anyway: cache ids[:, :-1], append the last token
    attending to the cached K/V, and compare with recomputing the whole sequence. Returns the max
    |logit difference| at the appended position and the max change of the earlier positions' final
    hidden states (which a cache freezes). For gpt both are ~0 (float rounding); for bert they are
    not: every earlier representation changes."""
    was_training = model.training
    model.eval()
    cache = KVCache(model, ids.size(0), ids.size(1))
    stale_hidden = model.run_stack(ids[:, :-1], cache=cache)
    cached_logits = model.logits(model.run_stack(ids[:, -1:], cache=cache))[:, -1]
    full_hidden = model.run_stack(ids)
    full_logits = model.logits(full_hidden)[:, -1]
    model.train(was_training)
    return {"logit_difference": (cached_logits - full_logits).abs().max().item(),
            "earlier_hidden_change": (stale_hidden - full_hidden[:, :-1]).abs().max().item()}


# ----------------------------------------------------------------------------- one cached step

def decode_step(model, token, cache):
    """The hot loop of generation: one new position per row, (B, 1) tokens -> (B, V) logits, against
    the cache. (Compiled, for speed: infra/decode_layout.compiled_decode_step,
    generate(compiled=True).)"""
    return forward_with_cache(model, token, cache)[:, -1]


def demo():
    """What `python kvcache.py` prints: claim D4 in numbers, on random weights, in a second."""
    from model import ModelConfig, Transformer
    ids = torch.randint(0, 50, (1, 32), generator=torch.Generator().manual_seed(0))
    for arch in ("gpt", "bert"):
        torch.manual_seed(0)
        model = Transformer(ModelConfig(arch=arch, vocab_size=50, block_size=32, n_layer=2,
                                        n_head=2, n_embd=32))
        error = bidirectional_cache_error(model, ids)
        print(f"{arch}: a cache of 31 tokens, then token 32 appended: its logits differ from "
              f"recomputing all 32 by {error['logit_difference']:.1e}; the cached states differ "
              f"from recomputed ones by {error['earlier_hidden_change']:.1e}")
    print("gpt: the cache is exact (float rounding). bert: every earlier state changed, so no "
          "cache can be right.")
    # the same fact read the other way (claims E3, X1): two texts that share their first 16 tokens
    endings = torch.randint(0, 50, (2, 16), generator=torch.Generator().manual_seed(1))
    # (2, 32): one beginning, two endings
    texts = torch.cat([ids[:, :16].expand(2, -1), endings], dim=1)
    for arch in ("gpt", "bert"):
        torch.manual_seed(0)
        model = Transformer(ModelConfig(arch=arch, vocab_size=50, block_size=32, n_layer=2,
                                        n_head=2, n_embd=32))
        with torch.no_grad():
            states = model.eval().run_stack(texts)[:, :16]  # (2, 16, C): the shared beginning
        print(f"{arch}: two texts share their first 16 tokens, then differ: the states of the "
              f"shared part differ by {(states[0] - states[1]).abs().max().item():.1e}")
    print("gpt: an embedding pooled over a beginning cannot tell what follows it; bert's (an "
          "encoder's) can")


if __name__ == "__main__":
    masks.run_demo(demo, "kvcache.py")
