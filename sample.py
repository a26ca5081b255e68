"""
Generate from a checkpoint written by train.py.

    python sample.py --out_dir=out-gpt --start="ROMEO:" --max_new_tokens=240
    python sample.py --out_dir=out-gpt --no_cache     # full recomputation each token, to compare
    python sample.py --out_dir=out-bert --steps=16    # mask-predict: N [MASK]s over 16 passes
    python sample.py --init_from=gpt2 --start="The king"
        # published weights (pretrained.py; transformers, the hub)
    python sample.py --out_dir=out-gpt --compile=True --num_samples=8
        # compiled decoding, 8 streams, one prefill

gpt, prefixlm and t5 decode left to right with a KV cache (kvcache.py): `generate`, against its
plain reference `generate_uncached` (the whole context again for every token; both write identical
tokens). bert cannot (claim D4). Its conditionals can be chained in any order, and each order gives
a normalised distribution (python objectives.py chains two), but the orders disagree: they belong to
no single joint (claim C4), so there is no one p(x) to sample left to right. bert fills [MASK]
placeholders by iterative unmasking instead (`unmask`, `iterative_unmask`), which is also the
sampler of a masked-diffusion model (--objective=diffusion). Read top to bottom: one token from
logits, the left-to-right samplers, the unmasking samplers, then the command (what it reads, refuses
and chooses before a sampler runs: infra/sample_options.py). Every run prints the text, the number
of forward passes and the decode speed.
"""
import math
import sys
import time
from dataclasses import dataclass
from typing import NamedTuple

# before torch: a Ctrl-C while it loads ends quietly
import infra.quiet_interrupts  # noqa: E402,F401

import torch

from infra.configurator import run_main
from infra.decode_layout import fastest_decoding_step
from infra.progress import StopSignalsWithProgress
from infra.sample_options import (check_request, compile_choice, decoding_note, load_weights,
                                  prompt_ids, resolve_options)
import kvcache
from model import ATTENTION_OF_ARCH

DEFAULTS = dict(
    init_from="",             # "" = the checkpoint in out_dir; or gpt2, bert-base-uncased,
                              # t5-small, a folder (HF)
    out_dir="out-gpt",
    checkpoint="ckpt.pt",     # or best.pt
    start="\n",               # prompt text, or FILE:path to read it from a file
    num_samples=3,
    max_new_tokens=200,
    temperature=0.8,          # 0 = greedy
    top_k=200,                # 0 = no top-k
    seed=1337,
    device="auto",
    no_cache=False,           # recompute the whole sequence for every new token
    steps=32,                 # bert / diffusion: forward passes of iterative unmasking
    order="confident",        # bert / diffusion: reveal the most confident positions first, the
                              # largest top-2 margin (margin), or random ones
    block_length=0,           # bert / diffusion: > 0 = semi-autoregressive blocks left to right
    compile="auto",           # gpt / prefixlm / t5: torch.compile the one-token decoding step, True
                              # or False; auto: where this generation repays the compile (on a CPU a
                              # 256-wide model compiles for 30-50 s, then decodes one row 1.4-2.3x
                              # faster: auto compiles from ~35,000 tokens of one row; docs/speed.md)
)


# ---------------------------------------------------------------------------- one token from logits

@dataclass(frozen=True)
class Sampling:
    """How a sampler chooses: the token at a position (temperature, 0 = greedy; top_k, None = all;
    the ids never chosen; the random generator) and, when unmasking (bert), which positions go first
    and in blocks of what length."""
    temperature: float = 1.0
    top_k: int | None = None
    banned: torch.Tensor | None = None   # ids never sampled: [PAD], [MASK], ...
                                         # (objectives.Specials.banned)
    generator: torch.Generator | None = None
    order: str = "confident"             # unmasking: which positions first, one of
                                         # UNMASK_ORDERS (unmask)
    block_length: int = 0                # unmasking: > 0 = semi-autoregressive
                                         # blocks, left to right

    def allowed(self, logits):
        """The logits with the banned ids at -inf."""
        return logits if self.banned is None else logits.index_fill(-1, self.banned, float("-inf"))

    def pick(self, logits):
        """(B, V) logits -> (B, 1) token ids."""
        logits = self.allowed(logits.float())
        if self.temperature == 0:
            return logits.argmax(dim=-1, keepdim=True)
        logits = logits / self.temperature
        if self.top_k:
            kth = torch.topk(logits, min(self.top_k, logits.size(-1))).values[:, -1:]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        return torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=self.generator)


GREEDY = Sampling(temperature=0)


class T5Prompt(NamedTuple):
    """t5's prompt: what the encoder reads, (N, S) one row per sample (lengths (N,) when rows are
    padded), and the token the decoder starts from."""
    encoder_inputs: torch.Tensor
    lengths: torch.Tensor | None
    start_token: int


# ----------------------------------------------------------------------------- left to right

def start_sequence(model, prompt):
    """What generation continues, one row per sample: the prompt (gpt, prefixlm), or t5's
    decoder start token."""
    if model.config.arch == "t5":
        rows, device = prompt.encoder_inputs.size(0), prompt.encoder_inputs.device
        return torch.full((rows, 1), prompt.start_token, dtype=torch.long, device=device)
    if prompt.size(1) > model.config.block_size:
        raise ValueError(f"the prompt has {prompt.size(1)} tokens, more than "
                         f"block_size={model.config.block_size}")
    return prompt


def slide_window(length, window_start, block_size):
    """The context is sequence[window_start:length]. When it no longer fits, both samplers slide the
    same way: keep the last block_size // 2 tokens (for prefixlm they become the new prefix; one at
    least), so that the cached and the recomputing sampler see identical contexts and must pick
    identical tokens. Returns the new window start."""
    return length - max(1, block_size // 2) if length - window_start > block_size else window_start


@torch.inference_mode()
def generate_uncached(model, prompt, max_new_tokens, sampling=Sampling(), stop=None):
    """The plain reference, nanoGPT's generate: for every new token, the whole context (and t5's
    encoder) runs again. prompt: gpt / prefixlm, the tokens so far (N, P), one row per sample; t5, a
    T5Prompt. Returns the sequences (N, P + max_new_tokens); t5: its decoder's tokens (N, 1 +
    max_new_tokens)."""
    model.eval()
    block_size = model.config.block_size
    sequence = start_sequence(model, prompt)
    prefix_length, window_start = sequence.size(1), 0  # prefixlm's prefix: the prompt, after a
                                                       # slide the kept tokens
    for _ in range(max_new_tokens):
        if stop:  # a signal (progress.StopSignals): return what is done
            break
        new_start = slide_window(sequence.size(1), window_start, block_size)
        if new_start != window_start:
            window_start, prefix_length = new_start, sequence.size(1) - new_start
        context = sequence[:, window_start:]
        if model.config.arch == "t5":
            hidden = model.decode(context, model.encode(prompt.encoder_inputs, prompt.lengths),
                                  prompt.lengths)
        else:
            prefix = None
            if ATTENTION_OF_ARCH[model.config.arch] == "prefix":
                prefix = torch.full((sequence.size(0),), prefix_length, device=sequence.device)
            hidden = model.run_stack(context, prefix_length=prefix)
        token = sampling.pick(model.logits(hidden[:, -1]))  # the output head on the
                                                            # last position only
        sequence = torch.cat([sequence, token], dim=1)
    return sequence


def prefill_window(model, context, prompt):
    """A new cache holding `context` (B, T) (t5: and the encoder's output of the prompt's first B
    rows); returns (cache, last logits)."""
    cache = kvcache.KVCache(model, context.size(0), model.config.block_size)
    if model.config.arch == "t5":
        lengths = prompt.lengths[:context.size(0)] if prompt.lengths is not None else None
        return cache, kvcache.prefill(model, context, cache,
                                      prompt.encoder_inputs[:context.size(0)], lengths)
    return cache, kvcache.prefill(model, context, cache)


def one_prompt(model, prompt, sequence):
    """Whether every row starts from the same prompt
    (then one prefill serves them all: prefix caching)."""
    if model.config.arch != "t5":
        return bool((sequence == sequence[:1]).all())
    lengths = prompt.lengths
    return bool((prompt.encoder_inputs == prompt.encoder_inputs[:1]).all()) and \
        (lengths is None or bool((lengths == lengths[:1]).all()))


@torch.inference_mode()  # like no_grad, minus autograd's version counters: less overhead per token
def generate(model, prompt, max_new_tokens, sampling=Sampling(), stop=None, compiled=False):
    """Sample continuations with the KV cache: prefill the prompt once (when every row holds the
    same prompt, once for all of them: the cache is forked, prefix caching), then one position per
    step. prompt: gpt / prefixlm, the tokens so far (N, P), one row per sample; t5, a T5Prompt,
    whose encoder input is encoded once. Identical tokens to generate_uncached
    (tests/test_kvcache.py). compiled=True runs each decoding step through torch.compile where
    that is the faster for this many rows (same tokens as eager, tests/test_kvcache.py)."""
    model.eval()
    sequence = start_sequence(model, prompt)
    rows = sequence.size(0)
    # kvcache.decode_step, run where it is fastest: its weights prepacked for this CPU, or the step
    # compiled (infra/decode_layout.py: speed only, the same tokens)
    with fastest_decoding_step(model, compiled, rows) as one_position:
        block_size = model.config.block_size
        if one_prompt(model, prompt, sequence):
            cache, logits = prefill_window(model, sequence[:1], prompt)
            # one prefill serves every sample
            cache, logits = cache.fork(rows), logits.expand(rows, -1)
        else:
            cache, logits = prefill_window(model, sequence, prompt)
        window_start = 0
        for step in range(max_new_tokens):
            token = sampling.pick(logits)  # (N, 1), stays on the device
            sequence = torch.cat([sequence, token], dim=1)
            if step == max_new_tokens - 1 or stop:
                # stop: a signal (progress.StopSignals), return what is done
                break
            new_start = slide_window(sequence.size(1), window_start, block_size)
            if new_start != window_start:
                # the context is full: prefill the kept tokens again, as the reference
                window_start = new_start
                cache, logits = prefill_window(model, sequence[:, window_start:], prompt)
            else:
                logits = one_position(model, token, cache)  # against the cache
    return sequence


# ------------------------------------------------------ bert: no cache, iterative unmasking instead

UNMASK_ORDERS = ("confident", "margin", "random")


@torch.inference_mode()
def unmask(model, x, to_fill, steps, sampling=Sampling(), stop=None):
    """Fill the positions of x (B, L) where to_fill (B, L) is True (x holds [MASK] there) over
    `steps` bidirectional forward passes: each pass predicts every open position and reveals an even
    share of what is left, the rest staying open for the next pass; revealed tokens stay fixed.
    Which positions go first (sampling.order): "confident", the highest probability of the chosen
    token; "margin", the largest gap between the two most probable tokens (Kim et al. 2025);
    "random". Returns the number of forward passes; x is filled in place."""
    if steps < 1:
        raise ValueError("steps must be at least 1")
    if sampling.order not in UNMASK_ORDERS:
        raise ValueError(f"unknown unmasking order {sampling.order!r}: choose one of "
                         f"{', '.join(UNMASK_ORDERS)}")
    model.eval()
    if not to_fill.any():
        return 0
    begin, end = column_span(to_fill)  # the model reads all of x, predicts these columns only
    open_ = to_fill[:, begin:end].bool()  # (B, n), a copy
    passes = 0
    for step in range(steps):
        remaining = int(open_.sum(dim=1).max())
        if remaining == 0 or stop:
            break
        logits = model(x)[0][:, begin:end].float()  # (B, n, V)
        passes += 1
        B, n, V = logits.shape
        candidates = sampling.pick(logits.reshape(B * n, V)).view(B, n)
        if sampling.order == "random":
            score = torch.rand(B, n, generator=sampling.generator, device=logits.device)
        elif sampling.order == "confident":
            score = torch.softmax(logits, dim=-1).gather(-1, candidates[..., None])[..., 0]
        else:  # margin: between the two most probable tokens that may be chosen at all
            top2 = torch.softmax(sampling.allowed(logits), dim=-1).topk(2, dim=-1).values
            score = top2[..., 0] - top2[..., 1]
        score = score.masked_fill(~open_, float("-inf"))  # only open positions compete,
                                                          # whatever the scale
        reveal = math.ceil(remaining / (steps - step))  # an even share of what is left;
                                                        # everything on the last step
        chosen = torch.zeros_like(open_)
        chosen.scatter_(1, score.topk(min(reveal, n), dim=1).indices, True)
        chosen &= open_
        x[:, begin:end] = torch.where(chosen, candidates, x[:, begin:end])
        open_ &= ~chosen
    return passes


def column_span(to_fill):
    """(begin, end): the first and one past the last column of to_fill (B, L) that holds a True."""
    columns = to_fill.any(dim=0).nonzero()[:, 0]
    return int(columns[0]), int(columns[-1]) + 1


def iterative_unmask(model, x, to_fill, steps, sampling=Sampling(), stop=None):
    """bert's generation (mask-predict; the standard sampler of masked diffusion): fill the [MASK]s
    of x where to_fill is True with `unmask` over `steps` passes. With sampling.block_length > 0 the
    columns to fill are taken block by block, left to right (semi-autoregressive), the steps split
    between blocks as evenly as they go (the first blocks take the remainder; a block takes one pass
    at least: at most max(steps, blocks) passes, fewer where a block has fewer masks than passes).
    Returns the number of forward passes; x is filled in place."""
    if steps < 1:
        raise ValueError("steps must be at least 1")
    if not to_fill.any():
        return 0
    begin, end = column_span(to_fill)
    length = sampling.block_length or end - begin
    passes, (share, remainder) = 0, divmod(steps, len(range(begin, end, length)))
    for number, block in enumerate(range(begin, end, length)):
        in_block = torch.zeros_like(to_fill)
        in_block[:, block:block + length] = to_fill[:, block:block + length]
        passes += unmask(model, x, in_block, max(1, share + (number < remainder)), sampling, stop)
    return passes


# ----------------------------------------------------------------------------- the command

def generate_left_to_right(model, ids, objective, specials, config, generator, stop):
    """gpt / prefixlm / t5: one new token per forward pass, with the KV cache (or recomputing,
    --no_cache). Returns (texts' token lists, what ran)."""
    device, rows = next(model.parameters()).device, config["num_samples"]
    # what the model reads first is laid out as in training: after span corruption (t5, or
    # prefixlm's flattened copy of it, claim A2) the text ends in a masked span, <S0> [EOS], which
    # the model fills (its sentinels allowed); UL2's sequential denoiser reads [S2S] first;
    # otherwise the text itself
    source, banned = ids, specials.banned(model.config.vocab_size, device)
    if objective == "span_corruption":
        source = ids + [specials.sentinels[0], specials.eos]
        banned = torch.tensor([specials.pad, specials.mask, *specials.modes.values()],
                              device=device)
    elif objective == "ul2":
        source = [specials.modes["S"]] + ids
    sampling = Sampling(config["temperature"], config["top_k"] or None, banned, generator)
    prompt = torch.tensor([source], device=device).expand(rows, -1)  # one row per sample
    if model.config.arch == "t5":  # the decoder starts from [PAD] (T5's convention)
        prompt = T5Prompt(prompt, None, specials.pad)
    t5 = model.config.arch == "t5"
    if config["no_cache"]:
        tokens = generate_uncached(model, prompt, config["max_new_tokens"], sampling, stop)
        how = "encoder + decoder recomputed per token" if t5 else "full recomputation per token"
    else:
        # --compile: True, False or auto (infra/sample_options.py)
        compiled = compile_choice(config, model, device)
        tokens = generate(model, prompt, config["max_new_tokens"], sampling, stop, compiled)
        how = "encoder once, cached decoder" if t5 else \
            "KV cache (one shared prefill, one position per step)"
        how += decoding_note(model, rows, compiled)  # which step decoded, if compiled
    return [row[1 if t5 else len(source):] for row in tokens.tolist()], how


def generate_by_unmasking(model, ids, specials, config, generator, stop):
    """bert (mlm or diffusion): [MASK] placeholders after the prompt, filled over --steps
    bidirectional passes."""
    device = next(model.parameters()).device
    masks = [specials.mask] * config["max_new_tokens"]  # the placeholders after the prompt
    tokens = torch.tensor([ids + masks], device=device).repeat(config["num_samples"], 1)
    sampling = Sampling(config["temperature"], config["top_k"] or None,
                        specials.banned(model.config.vocab_size, device), generator,
                        config["order"], config["block_length"])
    to_fill = torch.zeros_like(tokens, dtype=torch.bool)
    to_fill[:, len(ids):] = True  # (not a [MASK] the prompt itself holds)
    passes = iterative_unmask(model, tokens, to_fill, config["steps"], sampling, stop)
    how = (f"iterative unmasking ({config['order']}, {passes} full forward passes for "
           f"{config['max_new_tokens']} tokens)")
    return [row[len(ids):] for row in tokens.tolist()], how, passes


def report(text, new_tokens, tokenizer, arch, objective, config, seconds, how, passes,
           interrupted):
    """What a run prints after generating: each sample, then the speed line (tokens/s, how they
    were made, forward passes per sample), and what an interruption left undone."""
    for row in new_tokens:
        if arch == "t5" or objective == "span_corruption":  # what fills the span, up to its [EOS]
            print(text + " => " + tokenizer.decode(row).split("[EOS]")[0])
        else:
            print(text + tokenizer.decode(row))
        print("---------------")
    num_samples, max_new_tokens = config["num_samples"], config["max_new_tokens"]
    made = len(new_tokens[0]) if arch != "bert" else max_new_tokens
    print(f"{arch} ({objective}): {num_samples} x {made} tokens in {seconds:.2f} s = "
          f"{num_samples * made / seconds:,.1f} tokens/s; {how}; {passes} forward passes per "
          "sample")
    if arch == "bert" and objective == "mlm":
        # claims A3, C4: no next-token exit, conditionals that need not agree
        print("note: expect near-noise text from an MLM at this size: trained with 15% of a "
              "window masked, it now reads a window whose new part is all [MASK], and each pass "
              "fills several positions from separate per-position guesses that need not agree "
              "(masked diffusion trains on every masking rate: --objective=diffusion; "
              "docs/chapter.md, question 6)")
    if interrupted and arch == "bert":
        print(f"interrupted after {passes} passes: the [MASK]s shown were not filled")
    elif interrupted:
        print(f"interrupted: {made} of {max_new_tokens} new tokens generated; the rest were not")


def main():
    # the options (one line refuses what cannot be honoured), the weights (train.py's checkpoint,
    # or published ones: --init_from) and the prompt, in infra/sample_options.py
    config, device = resolve_options(sys.argv[1:], DEFAULTS)
    weights = load_weights(config, device)
    model, specials, objective = weights.model, weights.specials, weights.objective
    arch = model.config.arch
    text, ids = prompt_ids(config["start"], weights.tokenizer)
    check_request(config, DEFAULTS, UNMASK_ORDERS, model, len(ids), objective)
    if weights.trained:  # (after every refusal: a refused command prints only its one line)
        print(weights.trained, flush=True)
    torch.manual_seed(config["seed"])
    generator = torch.Generator(device=device).manual_seed(config["seed"])

    t0 = time.perf_counter()
    # (a line every 5 s says how far it is)
    steps = config["steps"] if arch == "bert" else config["max_new_tokens"]
    what = "unmasking passes" if arch == "bert" else f"tokens of {config['num_samples']} sample(s)"
    with StopSignalsWithProgress("stopping: printing what was generated so far", what,
                                 steps) as stop:
        if arch == "bert":
            new_tokens, how, passes = generate_by_unmasking(model, ids, specials, config,
                                                            generator, stop)
        else:
            new_tokens, how = generate_left_to_right(model, ids, objective, specials, config,
                                                     generator, stop)
            passes = len(new_tokens[0])
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    report(text, new_tokens, weights.tokenizer, arch, objective, config, seconds, how, passes,
           stop.requested)  # (.requested: asking `if stop:` would count a step)
    if stop.requested:
        sys.exit(130)  # a stop, after printing what it had: every command's stop status
                       # (docs/reliability.md)


if __name__ == "__main__":
    run_main(main)
