"""
KV caching: why decoders are cheap to run and encoders are not (claim D4).

Under a causal mask the keys and values of position i depend only on tokens 0..i, so once computed they never
change: keep them (a KV cache), and each new token costs one position's worth of compute instead of the whole
sequence. The same fact lets several requests share one prompt's K/V (prefix caching).

    gpt       prefill the prompt (causal, one forward), then decode one token at a time against the cache
    prefixlm  the prompt is the bidirectional prefix, computed once; generated tokens are causal and append:
              valid because nothing after the prefix changes the prefix
    t5        the encoder runs once; cross-attention K/V computed once; decoder self-attention cached like gpt
    bert      no cache can be correct: appending a token changes every earlier representation
              (`bidirectional_cache_error` measures by how much). Generation needs iterative mask-predict, see
              sample.py.

The cache is preallocated (no torch.cat per token): (layers, B, heads, max_length, head size) for K and for V.
"""
import functools
import math

import torch

import masks
from model import ATTENTION_OF_ARCH


class LayerCache:
    """One layer's view of the shared cache; the attention module calls update(k, v)."""

    def __init__(self, cache, index):
        self.cache, self.index = cache, index
        # this layer's part of the shared buffers, (B, nh, max_length, hs): writing through a per-layer view lets
        # torch.compile update it in place (a write into keys[index, ...] makes it copy the whole buffer each step)
        self.keys, self.values = cache.keys[index], cache.values[index]

    def update(self, k, v):
        # k, v: (B, nh, T_new, hs) for the new positions; write them in place, return [cached ; new]
        c, start = self.cache, self.cache.length
        end = start + k.size(2)
        if end > c.max_length:
            raise ValueError(f"KV cache full: {start} + {k.size(2)} > {c.max_length}")
        self.keys[:, :, start:end] = k
        self.values[:, :, start:end] = v
        return self.keys[:, :, :end], self.values[:, :, :end]  # views, no copy


class KVCache:
    def __init__(self, model, batch_size, max_length=None, device=None, dtype=None):
        self.model = model
        c = model.config
        parameter = next(model.parameters())
        device, dtype = device or parameter.device, dtype or parameter.dtype
        self.batch_size = batch_size
        self.max_length = max_length or c.block_size
        n_layers = c.n_decoder_layer if c.arch == "t5" else c.n_layer
        shape = (n_layers, batch_size, c.n_head, self.max_length, c.n_embd // c.n_head)
        self.keys = torch.zeros(shape, device=device, dtype=dtype)
        self.values = torch.zeros(shape, device=device, dtype=dtype)
        self.tokens = torch.zeros(batch_size, self.max_length, dtype=torch.long, device=device)  # what is cached
        self.length = 0           # positions filled so far
        self.prefix_length = None  # prefixlm: (B,) the bidirectional prefix
        self.cross, self.cross_mask = None, None  # t5: per decoder layer (K, V) of the encoder output; its padding
        self._layers = [LayerCache(self, i) for i in range(n_layers)]

    def layer(self, i):
        return self._layers[i]

    def cross_keys_values(self, i):
        """t5: decoder layer i's cross-attention (K, V), computed once from the encoder output (None before)."""
        return self.cross[i] if self.cross is not None else None

    def set_prefix(self, length):
        """prefixlm: the first `length` positions form the bidirectional prefix of every row."""
        self.prefix_length = torch.full((self.batch_size,), length, device=self.tokens.device)

    def advance(self, ids, T):
        # (LayerCache.update has already refused anything that does not fit)
        self.tokens[:, self.length:self.length + T] = ids
        self.length += T

    def set_encoder_output(self, model, memory, lengths=None):
        """t5: compute every decoder layer's cross-attention K/V once; the encoder output never changes."""
        self.cross = [block.cross_attention.keys_and_values(memory) for block in model.decoder_blocks]
        if lengths is not None:
            self.cross_mask, _ = masks.attention_mask("bidirectional", 1, memory.size(1), lengths=lengths,
                                                      device=memory.device)

    def fork(self, batch_size):
        """Prefix caching across samples: a new cache of batch_size rows that all start from row 0's K/V, so
        one prefill serves every continuation (a copy of memory, no recomputation)."""
        other = KVCache(self.model, batch_size, self.max_length, self.keys.device, self.keys.dtype)
        other.keys.copy_(self.keys[:, :1].expand_as(other.keys))  # (layers, B, nh, max_length, hs)
        other.values.copy_(self.values[:, :1].expand_as(other.values))
        other.tokens.copy_(self.tokens[:1].expand_as(other.tokens))
        other.length = self.length
        if self.prefix_length is not None:
            other.prefix_length = self.prefix_length[:1].repeat(batch_size)
        if self.cross is not None:  # t5: the encoder output is the same for every row; views, not copies
            other.cross = [(k[:1].expand(batch_size, -1, -1, -1), v[:1].expand(batch_size, -1, -1, -1))
                           for k, v in self.cross]
            if self.cross_mask is not None:
                other.cross_mask = self.cross_mask[:1].expand(batch_size, -1, -1, -1)
        return other


# ----------------------------------------------------------------------------- prefill and decode

def forward_with_cache(model, ids, cache):
    """Run new tokens `ids` (B, T_new) on top of what `cache` holds; return logits of every new position.
    T_new > 1 on a non-empty cache is chunked prefill: masks.attention_mask aligns the causal mask bottom-right."""
    if model.config.arch == "t5":
        hidden = model.decode(ids, cache=cache)
    else:
        hidden = model.run_stack(ids, prefix_length=cache.prefix_length, cache=cache)
    return model.logits(hidden)  # (B, T_new, V)


def prefill(model, prompt, cache, encoder_inputs=None, lengths=None):
    """Fill the cache with a prompt in one forward; return the logits of its last position (B, V).
    prefixlm: the prompt becomes the bidirectional prefix. t5: `encoder_inputs` go through the encoder once and
    `prompt` is the decoder's start (usually the start token)."""
    arch = model.config.arch
    if arch == "t5":
        memory = model.encode(encoder_inputs, lengths)
        cache.set_encoder_output(model, memory, lengths)
    elif ATTENTION_OF_ARCH[arch] == "prefix":
        cache.set_prefix(cache.length + prompt.size(1))
    return forward_with_cache(model, prompt, cache)[:, -1]


def extend_prompt(model, prompt, cache):
    """Prefix caching for one request stream (gpt): if the cache already holds a prefix of `prompt`, compute
    only the new tokens (a chunked prefill). Returns (logits of the last position, number of tokens computed).
    Only sound for causal attention: in prefixlm or bert, new prompt tokens would change the cached prefix."""
    if ATTENTION_OF_ARCH.get(model.config.arch) != "causal":
        raise ValueError("extending a cached prompt is only exact for causal attention (claim D4)")
    n = min(cache.length, prompt.size(1) - 1)  # keep at least one token to compute (we need its logits)
    same = (cache.tokens[:, :n] == prompt[:, :n]).all(dim=0)
    common = int(same.long().cumprod(0).sum()) if n > 0 else 0
    cache.length = common  # entries past the common prefix are stale: overwrite them
    new = prompt[:, common:]
    return forward_with_cache(model, new, cache)[:, -1], new.size(1)


# ----------------------------------------------------------------------------- claim D4's counter-demonstration

@torch.no_grad()
def bidirectional_cache_error(model, ids):
    """Use a KV cache on a bidirectional model anyway: cache ids[:, :-1], append the last token attending to the
    cached K/V, and compare with recomputing the whole sequence. Returns the max |logit difference| at the
    appended position and the max change of the earlier positions' final hidden states (which a cache freezes).
    For gpt both are ~0 (float rounding); for bert they are not: every earlier representation changes."""
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


# ----------------------------------------------------------------------------- sampling loop

def sample_next(logits, temperature=1.0, top_k=None, generator=None, banned=None):
    """(B, V) logits -> (B, 1) token ids. temperature 0 = greedy."""
    logits = logits.float()
    if banned is not None:
        logits = logits.index_fill(-1, banned, float("-inf"))
    if temperature == 0:
        return logits.argmax(dim=-1, keepdim=True)
    logits = logits / temperature
    if top_k:
        kth = torch.topk(logits, min(top_k, logits.size(-1))).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=generator)


def start_sequence(model, prompt, num_samples, start_token):
    """What generation continues: the prompt (gpt, prefixlm), or t5's decoder start token; one row per sample."""
    if model.config.arch == "t5":
        device = next(model.parameters()).device
        return torch.full((num_samples, 1), start_token, dtype=torch.long, device=device)
    if prompt.size(1) > model.config.block_size:
        raise ValueError(f"the prompt has {prompt.size(1)} tokens, more than block_size={model.config.block_size}")
    return prompt.expand(num_samples, -1)


def slide_window(length, window_start, block_size):
    """The context is sequence[window_start:length]. When it no longer fits, both samplers slide the same way:
    keep the last block_size // 2 tokens (for prefixlm they become the new prefix; one at least), so that the cached
    and the recomputing sampler see identical contexts and must pick identical tokens. Returns the new window
    start."""
    return length - max(1, block_size // 2) if length - window_start > block_size else window_start


def encoder_rows(encoder_inputs, lengths, rows):
    """t5: the one encoder input (1, S) and its length, repeated for `rows` rows."""
    return encoder_inputs.expand(rows, -1), lengths.expand(rows) if lengths is not None else None


@torch.inference_mode()
def generate_uncached(model, prompt, max_new_tokens, num_samples=1, temperature=1.0, top_k=None, generator=None,
                      banned=None, encoder_inputs=None, lengths=None, start_token=None, stop=None):
    """The plain reference, nanoGPT's generate: for every new token, the whole context (and t5's encoder) runs
    again. Returns the sequences, (num_samples, P + max_new_tokens); t5: decoder tokens (num_samples, 1 + new)."""
    model.eval()
    block_size = model.config.block_size
    sequence = start_sequence(model, prompt, num_samples, start_token)
    prefix_length, window_start = sequence.size(1), 0  # prefixlm's prefix: the prompt, after a slide the kept tokens
    for _ in range(max_new_tokens):
        if stop:  # a signal (progress.StopSignals): return what is done
            break
        new_start = slide_window(sequence.size(1), window_start, block_size)
        if new_start != window_start:
            window_start, prefix_length = new_start, sequence.size(1) - new_start
        context = sequence[:, window_start:]
        if model.config.arch == "t5":
            inputs, row_lengths = encoder_rows(encoder_inputs, lengths, num_samples)
            hidden = model.decode(context, model.encode(inputs, row_lengths), row_lengths)
        else:
            prefix = None
            if ATTENTION_OF_ARCH[model.config.arch] == "prefix":
                prefix = torch.full((num_samples,), prefix_length, device=sequence.device)
            hidden = model.run_stack(context, prefix_length=prefix)
        logits = model.logits(hidden[:, -1])  # the output head on the last position only
        token = sample_next(logits, temperature, top_k, generator, banned)
        sequence = torch.cat([sequence, token], dim=1)
    return sequence


def prefill_window(model, context, encoder_inputs=None, lengths=None):
    """A new cache holding `context` (B, T) (t5: and the encoder's output); returns (cache, last logits)."""
    cache = KVCache(model, context.size(0), model.config.block_size)
    if model.config.arch == "t5":
        inputs, row_lengths = encoder_rows(encoder_inputs, lengths, context.size(0))
        return cache, prefill(model, context, cache, inputs, row_lengths)
    return cache, prefill(model, context, cache)


def decode_step(model, token, cache):
    """The hot loop of generation: one new position per row, (B, 1) tokens -> (B, V) logits, against the cache."""
    return forward_with_cache(model, token, cache)[:, -1]


# The same step compiled (generate(compiled=True), sample.py --compile=True). Where a small model's batch-1 step is
# mostly Python and per-op overhead (dozens of small kernels per layer), compiling fuses the element-wise ops and
# drops the Python around them, leaving the matmuls, i.e. reading the weights (how much that buys depends on the
# CPU: docs/speed.md). No recompilation per token: dynamic=True compiles the cache length (and a batch size above 1)
# as symbolic sizes, so one graph serves every position; batch 1 and the context's last position get graphs of
# their own. The prefill stays eager: it runs once per generation. Compiled graphs are kept per code object, up to
# torch._dynamo.config.recompile_limit (8) sets of guards: a process that decodes with several models in turn may
# need torch._dynamo.reset() between them (bench.py).
@functools.cache
def compiled_decode_step():
    """decode_step through torch.compile, built on first use: importing the compiler costs ~1 s, which a script
    that never compiles should not pay."""
    return torch.compile(decode_step, dynamic=True)


@torch.inference_mode()  # like no_grad, minus autograd's version counters: less overhead per token
def generate(model, prompt, max_new_tokens, num_samples=1, temperature=1.0, top_k=None, generator=None,
             banned=None, encoder_inputs=None, lengths=None, start_token=None, use_cache=True, stop=None,
             compiled=False):
    """Sample continuations with the KV cache: prefill the prompt once, fork the cache to every sample (prefix
    caching), then one position per step. gpt / prefixlm: `prompt` (1, P) is the text so far. t5:
    `encoder_inputs` (1, S) go through the encoder once and the decoder starts from `start_token`. Identical
    tokens to generate_uncached (tests/test_kvcache.py); use_cache=False runs that reference instead.
    compiled=True runs each decoding step through torch.compile (same tokens as eager, tests/test_kvcache.py)."""
    if not use_cache:
        return generate_uncached(model, prompt, max_new_tokens, num_samples, temperature, top_k, generator, banned,
                                 encoder_inputs, lengths, start_token, stop)
    model.eval()
    one_position = compiled_decode_step() if compiled else decode_step
    block_size = model.config.block_size
    sequence = start_sequence(model, prompt, num_samples, start_token)
    cache, logits = prefill_window(model, sequence[:1], encoder_inputs, lengths)
    cache, logits = cache.fork(num_samples), logits.expand(num_samples, -1)  # one prefill serves every sample
    window_start = 0
    for step in range(max_new_tokens):
        token = sample_next(logits, temperature, top_k, generator, banned)  # (S, 1), stays on the device
        sequence = torch.cat([sequence, token], dim=1)
        if step == max_new_tokens - 1 or stop:  # stop: a signal (progress.StopSignals), return what is done
            break
        new_start = slide_window(sequence.size(1), window_start, block_size)
        if new_start != window_start:  # the context is full: prefill the kept tokens again, as the reference
            window_start = new_start
            cache, logits = prefill_window(model, sequence[:, window_start:], encoder_inputs, lengths)
        else:
            logits = one_position(model, token, cache)  # against the cache
    return sequence


# ----------------------------------------------------------------------------- bert: no cache, iterative unmasking instead

UNMASK_ORDERS = ("confident", "margin", "random")


@torch.inference_mode()
def unmask(model, x, steps, mask_id, temperature=1.0, top_k=None, order="confident", generator=None, banned=None,
           stop=None, region=None):
    """Fill every [MASK] of x (B, L) (inside region = (start, end) when given) over `steps` bidirectional forward
    passes: each pass predicts every masked position and reveals an even share of what is left, the rest staying
    masked for the next pass; revealed tokens stay fixed. Which positions go first (`order`): "confident", the
    highest probability of the chosen token; "margin", the largest gap between the two most probable tokens (Kim et
    al. 2025); "random". Returns the number of forward passes; x is filled in place."""
    if steps < 1:
        raise ValueError("steps must be at least 1")
    if order not in UNMASK_ORDERS:
        raise ValueError(f"unknown unmasking order {order!r}: choose one of {', '.join(UNMASK_ORDERS)}")
    model.eval()
    start, end = region or (0, x.size(1))
    passes = 0
    for step in range(steps):
        masked = x[:, start:end] == mask_id  # (B, n)
        remaining = int(masked.sum(dim=1).max())
        if remaining == 0 or stop:
            break
        logits = model(x)[0][:, start:end].float()  # (B, n, V)
        passes += 1
        B, n, V = logits.shape
        candidates = sample_next(logits.reshape(B * n, V), temperature, top_k, generator, banned).view(B, n)
        if order == "random":
            score = torch.rand(B, n, generator=generator, device=logits.device)
        elif order == "confident":
            score = torch.softmax(logits, dim=-1).gather(-1, candidates[..., None])[..., 0]
        else:  # margin: between the two most probable tokens that may be chosen at all
            allowed = logits.index_fill(-1, banned, float("-inf")) if banned is not None else logits
            top2 = torch.softmax(allowed, dim=-1).topk(2, dim=-1).values
            score = top2[..., 0] - top2[..., 1]
        score = score.masked_fill(~masked, float("-inf"))  # only masked positions compete, whatever the scale
        reveal = math.ceil(remaining / (steps - step))  # an even share of what is left; everything on the last step
        chosen = torch.zeros_like(masked)
        chosen.scatter_(1, score.topk(min(reveal, n), dim=1).indices, True)
        chosen &= masked
        x[:, start:end] = torch.where(chosen, candidates, x[:, start:end])
    return passes


@torch.inference_mode()
def iterative_unmask(model, prompt, num_new, steps, mask_id, num_samples=1, temperature=1.0, top_k=None,
                     order="confident", block_length=0, generator=None, banned=None, stop=None):
    """bert's generation (mask-predict; the standard sampler of masked diffusion): append num_new [MASK]s after the
    prompt and fill them with `unmask` over `steps` passes. With block_length > 0 the masks are filled block by
    block, left to right (semi-autoregressive), the steps split between blocks as evenly as they go (the first
    blocks take the remainder; a block takes one pass at least: at most max(steps, blocks) passes, fewer where a
    block has fewer masks than passes).
    Returns (tokens, passes)."""
    if steps < 1:
        raise ValueError("steps must be at least 1")
    P = prompt.size(1)
    x = torch.cat([prompt, torch.full((1, num_new), mask_id, device=prompt.device)], dim=1).repeat(num_samples, 1)
    block_length = block_length or num_new
    blocks = [(s, min(s + block_length, P + num_new)) for s in range(P, P + num_new, block_length)]
    passes, (share, remainder) = 0, divmod(steps, len(blocks))
    for number, region in enumerate(blocks):
        passes += unmask(model, x, max(1, share + (number < remainder)), mask_id, temperature, top_k, order,
                         generator, banned, stop, region)
    return x, passes
