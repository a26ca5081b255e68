"""
The four architectures as four attention masks (claim A1). True = "this query may
attend to this key".

    bert      bidirectional   every position sees every position
    gpt       causal          a position sees itself and the past (lower triangle)
    prefixlm  prefix          the prefix sees itself bidirectionally, the rest is causal
    t5        encoder-decoder bidirectional encoder, causal decoder, full cross-attention
                              decoder -> encoder

One more, between two of them: a trained gpt made into a masked-diffusion model opens its causal
mask towards the bidirectional one a little more at each training step (`annealed_mask`, DiffuGPT),
instead of all at once.

Everything here is plain boolean data; model.py turns an "attention kind" into what
torch.nn.functional.scaled_dot_product_attention (SDPA) takes through
`attention_mask` at the bottom.

Run `python masks.py` to see the masks as ASCII grids, and claim A2: flattened, the prefix-LM mask
and the encoder-decoder pattern have the same shape.
"""
import errno
import os
import sys

import torch

ATTENTION_KINDS = ("causal", "bidirectional", "prefix")


def _query_positions(query_length, key_length, device):
    # Queries are the *last* query_length positions of the key sequence (bottom-right alignment).
    # With a KV cache holding key_length - query_length earlier tokens, query i sits at absolute
    # position key_length - query_length + i.
    return torch.arange(key_length - query_length, key_length, device=device)


def causal_mask(query_length, key_length=None, device=None):
    """(Tq, Tk) lower triangle, aligned bottom-right: query i may see keys 0..(Tk - Tq + i)."""
    key_length = query_length if key_length is None else key_length
    q = _query_positions(query_length, key_length, device)
    k = torch.arange(key_length, device=device)
    return k[None, :] <= q[:, None]  # (Tq, Tk)


def bidirectional_mask(query_length, key_length=None, device=None):
    """(Tq, Tk) all True: the encoder's view, every position sees every position."""
    key_length = query_length if key_length is None else key_length
    return torch.ones(query_length, key_length, dtype=torch.bool, device=device)


def prefix_lm_mask(prefix_length, query_length, key_length=None):
    """(B, 1, Tq, Tk): key j is visible to query i if j is in the prefix
    (j < prefix_length[b]) or j <= i.

    prefix_length is a (B,) tensor: every example has its own split point."""
    key_length = query_length if key_length is None else key_length
    device = prefix_length.device
    causal = causal_mask(query_length, key_length, device)  # (Tq, Tk)
    in_prefix = torch.arange(key_length, device=device)[None, :] < prefix_length[:, None]  # (B, Tk)
    return (causal[None, :, :] | in_prefix[:, None, :])[:, None, :, :]  # (B, 1, Tq, Tk)


def padding_mask(lengths, key_length):
    """(B, 1, 1, Tk): hide padded keys (positions >= lengths[b], the real length of row b)
    from every query."""
    positions = torch.arange(key_length, device=lengths.device)
    return (positions[None, :] < lengths[:, None])[:, None, None, :]


def encoder_decoder_masks(encoder_length, decoder_length, device=None):
    """The t5 trio: encoder self-attention (bidirectional), decoder self-attention (causal),
    cross-attention (every decoder position sees every encoder position)."""
    return {
        "encoder_self": bidirectional_mask(encoder_length, device=device),
        "decoder_self": causal_mask(decoder_length, device=device),
        "cross": bidirectional_mask(decoder_length, encoder_length, device=device),
    }


def flattened_encoder_decoder_mask(encoder_length, decoder_length, device=None):
    """The t5 pattern drawn as one (P+S, P+S) grid over [encoder tokens ; decoder tokens] (claim
    A2). Encoder rows see the encoder block only; decoder rows see the whole encoder plus
    their own past."""
    masks = encoder_decoder_masks(encoder_length, decoder_length, device)
    top = torch.cat([masks["encoder_self"],
                     torch.zeros(encoder_length, decoder_length, dtype=torch.bool, device=device)],
                    dim=1)
    bottom = torch.cat([masks["cross"], masks["decoder_self"]], dim=1)
    return torch.cat([top, bottom], dim=0)


def attention_mask(kind, query_length, key_length=None, prefix_length=None, lengths=None,
                   device=None):
    """Turn an attention kind into SDPA's two arguments: (attn_mask or None, is_causal).

    The causal case takes SDPA's `is_causal=True` fast path whenever it is exact: a square query/key
    block (no KV cache in front of the queries) and no padding. Why only then: SDPA's is_causal
    builds the triangle aligned *top-left* (query i sees keys 0..i). When the query is shorter than
    the keys (chunked prefill on top of a KV cache) the queries are the last positions, so query i
    must see keys 0..(Tk - Tq + i): bottom-right. With is_causal=True they would see too little,
    silently. There we pass the explicit bottom-right mask instead.
    """
    key_length = query_length if key_length is None else key_length
    if kind not in ATTENTION_KINDS:
        raise ValueError(f"unknown attention kind {kind!r}, expected one of {ATTENTION_KINDS}")
    mask = None
    if kind == "causal" and query_length > 1:
        if query_length == key_length and lengths is None:
            return None, True  # the fast path: no mask tensor is built or read (claim E2)
        mask = causal_mask(query_length, key_length, device)
    elif kind == "prefix" and query_length > 1:
        if prefix_length is None:
            raise ValueError("attention kind 'prefix' needs prefix_length")
        mask = prefix_lm_mask(prefix_length.to(device), query_length, key_length)
    # bidirectional, or a single query at the end of the keys (decoding): every key is
    # visible, no mask needed
    if lengths is not None:  # right-padded rows: keys past each row's real length are hidden
        padding = padding_mask(lengths.to(device), key_length)
        mask = padding if mask is None else mask & padding
    return mask, False


def annealed_fraction(step, anneal_steps):
    """The share of future keys opened at training step `step` (counted from 0): 0 at the first
    step, exactly gpt's mask, rising linearly to 1 (bert's) at step anneal_steps - 1 and after.
    (DiffuGPT's code opens min(1, (step + 1) / anneal_steps), so its first step is not quite
    causal.)"""
    return 1.0 if anneal_steps <= 1 else min(1.0, step / (anneal_steps - 1))


def annealed_mask(length, opened, generator=None, device=None):
    """(T, T): the causal mask plus each key above the diagonal opened with probability `opened` (0:
    causal, 1: bidirectional). Gong et al. 2024 adapt a trained gpt into a masked-diffusion model
    this way, so that the gpt's weights meet the right context gradually. One draw per call
    (train.py: per micro-step), shared by the batch, heads and layers."""
    # rand < 0 never, rand < 1 always
    future = torch.rand(length, length, generator=generator) < opened
    return causal_mask(length, device=device) | future.to(device)


def show(mask, name):
    """ASCII grid: rows are queries, columns keys, '#' = may attend."""
    rows = ["".join("#" if allowed else "." for allowed in row) for row in mask.tolist()]
    return [name] + rows


def side_by_side(blocks, gap=4):
    height = max(len(b) for b in blocks)
    width = [max(len(line) for line in b) for b in blocks]
    lines = []
    for i in range(height):
        lines.append((" " * gap).join((b[i] if i < len(b) else "").ljust(w)
                                      for b, w in zip(blocks, width)))
    return "\n".join(line.rstrip() for line in lines)


def demo():
    """What `python masks.py` prints: the masks as grids, and claim A2."""
    T, P = 8, 3
    print(f"The four masks for T={T} (rows = queries, columns = keys, # = may attend), prefix "
          f"length {P}:\n")
    decoder = encoder_decoder_masks(P, T - P)
    print(side_by_side([
        show(bidirectional_mask(T), "bert"),
        show(causal_mask(T), "gpt"),
        show(prefix_lm_mask(torch.tensor([P]), T)[0, 0], "prefixlm"),
        show(decoder["decoder_self"], "t5 decoder self"),
        show(decoder["cross"], "t5 cross"),
    ]))
    flat_prefix = prefix_lm_mask(torch.tensor([P]), T)[0, 0]
    flat_t5 = flattened_encoder_decoder_mask(P, T - P)
    print("\nClaim A2: flattened, the prefix-LM mask and the encoder-decoder pattern have the "
          "same shape.")
    print("(Encoder rows of t5 do not see the decoder; neither do prefix rows of prefixlm.)\n")
    print(side_by_side([show(flat_prefix, "prefixlm, one stack"),
                        show(flat_t5, "t5, [encoder ; decoder]")]))
    print(f"\nidentical: {torch.equal(flat_prefix, flat_t5)}. The difference is in the weights: t5 "
          "computes the prefix with a separate stack (the encoder) and reads it through "
          "cross-attention.")
    print("\nChunked prefill: 3 new queries on top of 5 cached keys need a bottom-right causal "
          "mask (is_causal=True would align top-left):\n")
    print(side_by_side([show(causal_mask(3, 8), "bottom-right (correct)"),
                        show(torch.ones(3, 8, dtype=torch.bool).tril(),
                             "top-left (is_causal=True)")]))


def run_demo(demo, script):
    """`python <script>` for every chapter file (masks, model, objectives, kvcache): run its demo.
    It takes no arguments: --help says what it shows, anything else is one line and status 2. Under
    `| head` it ends quietly; on a full disk, one line and status 1."""
    arguments = sys.argv[1:]
    if arguments in (["--help"], ["-h"]):
        print(sys.modules["__main__"].__doc__.strip().split("\n\n")[0]
              + f"\n\npython {script} takes no arguments: "
              "it prints its demo.")
        return
    if arguments:
        print(f"{script}: error: unrecognized argument {arguments[0]!r}: python {script} takes no "
              "arguments (it prints its demo; --help says what it shows)", file=sys.stderr)
        sys.exit(2)
    try:
        demo()
        if sys.stdout is not None:
            # (None: started with stdout closed, `>&-`; print() wrote nothing)
            sys.stdout.flush()
    except KeyboardInterrupt:
        # Ctrl-C: a demo keeps nothing, so it just ends, with the usual status
        sys.exit(130)
    except BrokenPipeError:  # python masks.py | head: the reader has seen enough
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except OSError as e:  # python masks.py > /dev/full: only a failed write is this one line
        if e.errno not in (errno.ENOSPC, errno.EIO, errno.EDQUOT, errno.EFBIG):
            raise
        print(f"{script}: error: cannot write to standard output ({e.strerror})", file=sys.stderr)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)


if __name__ == "__main__":
    run_demo(demo, "masks.py")
