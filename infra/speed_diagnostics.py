"""
Looks at a step's speed from outside the chapter's code: how fast our cached decoding is next to another
implementation of the same model (and our masks next to FlexAttention's block masks), and where a decoding or
training step's time goes. bench.py's section 3 (its FlexAttention rows), 4d and 6 print them.

    against_hugging_face(size, prompt, new, ...)      tokens/s of kvcache.generate and of transformers' generate
                                                       on one GPT-2-layout model, and whether both wrote the same
                                                       greedy tokens (None where transformers is not installed)
    flex_attention_rows(device, q, k, v, T, ...)       ms per call of FlexAttention with the causal, prefix-LM and
                                                       packed-documents block masks, each checked against SDPA, and
                                                       whether its backward pass runs
    profile_steps(step, device)                        torch.profiler around a few calls of step(): the operators
                                                       by their own time, and what is left of the wall time
    profile_decoding(model, ids, ...)                  that, for cached gpt steps at batch 1 and 32, eager and
                                                       compiled

Every timing as in bench.py: warm-up first, the device synchronised before the clock is read; speeds are medians of
repeats, a profile's shares come from one profiled stretch of steps. What the profiles showed on the machines
measured so far is written in docs/speed.md.
"""
import os
from contextlib import nullcontext

import torch
import torch.nn.functional as F

import kvcache
import masks
from infra.progress import Progress
from infra.timing import median_time, time_once


# ----------------------------------------------------------------------------- against transformers' generate

def against_hugging_face(size, prompt, new, device, repeats, autocast=nullcontext, compiled=True):
    """Our cached greedy decoding against Hugging Face transformers' `generate` on the same model: a GPT-2 built by
    transformers of `size` (bench.py's: n_layer, n_head, n_embd, block_size, vocab; random weights, GPT-2's own layout:
    biases, tied head), the same weights loaded into our Transformer (infra/pretrained.py). Batch 1, the same
    prompt and number of tokens. Returns {"transformers": version, "new_tokens", "samplers": {name: {"tokens_per_s"}},
    "same_tokens": {name: bool}, "reference": the transformers row's name}, or None without transformers."""
    try:
        import transformers
    except ImportError:
        return None
    from infra.pretrained import build as build_published
    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    theirs = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=size["vocab"], n_positions=size["block_size"], n_embd=size["n_embd"],
        n_layer=size["n_layer"], n_head=size["n_head"], resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
        bos_token_id=None, eos_token_id=None, pad_token_id=0)).to(device).eval()
    ours, _ = build_published(theirs.config, theirs.state_dict(), "transformers' GPT2LMHeadModel", device)
    reference = "transformers generate (use_cache=True, greedy)"
    samplers = {"ours, KV cache (kvcache.generate)": lambda: kvcache.generate(ours, prompt, new, temperature=0),
                reference: lambda: theirs.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=new,
                                                   min_new_tokens=new, do_sample=False, use_cache=True)}
    if compiled:
        samplers["ours, KV cache, compiled step"] = lambda: kvcache.generate(ours, prompt, new, temperature=0,
                                                                             compiled=True)
    speeds, tokens = {}, {}
    torch._dynamo.reset()  # a new model: graphs of its own
    with torch.no_grad():
        for name, sample in samplers.items():
            # the tokens in float32 (in bfloat16 the two implementations' roundings could flip a near-tie of
            # random weights), also the warm-up and the compilation; then the timing in the benchmark's dtype
            tokens[name] = sample()[0, prompt.size(1):].tolist()
            with autocast():
                sample()
                speeds[name] = {"tokens_per_s": new / median_time(sample, device, repeats, warmup=0)}
    if any(len(written) != new for written in tokens.values()):
        raise RuntimeError(f"against transformers: a sampler did not write {new} tokens: {[len(t) for t in tokens.values()]}")
    return {"transformers": transformers.__version__, "new_tokens": new, "samplers": speeds, "reference": reference,
            "same_tokens": {name: tokens[name] == tokens[reference] for name in tokens}}


# ----------------------------------------------------------------------------- FlexAttention: masks as block masks

def flex_attention_rows(device, q, k, v, T, repeats):
    """FlexAttention (compiled; CUDA and, forward only, CPU): the masks as block masks, so that blocks a mask
    hides entirely are skipped rather than computed and thrown away. Each row is checked against SDPA with the
    same mask before it is timed. Whether the backward pass (training) runs is reported too (not on a CPU so far:
    docs/speed.md)."""
    data = {}
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    except ImportError as e:
        return {"FlexAttention": {"ms": float("nan"), "backend": f"unavailable: {e}"}}
    flex = torch.compile(flex_attention)
    document = torch.arange(T, device=device) // max(1, T // 4)  # four packed documents
    rules = {"FlexAttention, causal block mask": (lambda b, h, i, j: j <= i, None, True),
             "FlexAttention, prefix-LM block mask": (lambda b, h, i, j: (j <= i) | (j < T // 2),
                                                     masks.prefix_lm_mask(torch.full((1,), T // 2, device=device), T),
                                                     False),
             "FlexAttention, causal within 4 documents": (
                 lambda b, h, i, j: (j <= i) & (document[i] == document[j]),
                 masks.causal_mask(T, device=device) & (document[:, None] == document[None, :]), False)}

    def cannot_run(e):  # needs a recent PyTorch (and Triton on CUDA); the first line of why, for the table
        detail = str(e).strip().splitlines()[0][:200] if str(e).strip() else ""
        return {"ms": float("nan"), "backend": f"cannot run here: {type(e).__name__}: {detail}"}

    for name, (rule, mask, is_causal) in rules.items():
        torch._dynamo.reset()  # static shapes for each mask: recompiling with dynamic sizes can break the CPU template
        try:
            block_mask = create_block_mask(rule, B=None, H=None, Q_LEN=T, KV_LEN=T, device=device)
            reference = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask,
                                                       is_causal=is_causal)
            error = (flex(q, k, v, block_mask=block_mask).float() - reference).abs().max().item()
            seconds = median_time(lambda: flex(q, k, v, block_mask=block_mask), device, repeats * 4)
            data[name] = {"ms": seconds * 1e3, "max_error_vs_sdpa": error,
                          "backend": f"flex (compiled), max error vs SDPA {error:.1e}"}
        except Exception as e:
            data[name] = cannot_run(e)
    try:  # training needs the backward pass: tried on the causal block mask
        block_mask = create_block_mask(rules["FlexAttention, causal block mask"][0], B=None, H=None, Q_LEN=T,
                                       KV_LEN=T, device=device)
        grad_q = q.detach().clone().requires_grad_()
        flex(grad_q, k, v, block_mask=block_mask).sum().backward()
        data["FlexAttention backward (training)"] = {"ms": float("nan"), "backend": "runs"}
    except Exception as e:
        data["FlexAttention backward (training)"] = cannot_run(e)
    return data


# ----------------------------------------------------------------------------- where a step's time goes

def profile_steps(step, device, steps, top=8, warmup=2):
    """torch.profiler around `steps` calls of step(), after `warmup` calls (and, for a compiled step, its
    compilation): {"ms_per_step", "in_operators": the share of the wall time inside operators, "calls_per_step",
    "top": the `top` operators by self time, each {"name", "share", "calls_per_step", "us_per_call"}}.

    On the CPU self time is the host's; on a GPU it is the time of each operator's kernels, and what is left of the
    wall time is time the GPU waits for the host. Compiled, the top rows include the compiled region's wrappers
    (guards, the graph call): their self time is overhead around the kernels. The profiler adds a few microseconds
    per operator, so the shares are what to read; the speeds are bench.py's own rows."""
    os.environ.setdefault("KINETO_LOG_LEVEL", "99")  # the profiler's library would print two lines per profile
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile
    on_gpu = str(device).startswith("cuda")
    key = "self_device_time_total" if on_gpu else "self_cpu_time_total"  # microseconds

    def run():
        for _ in range(steps):
            step()

    for _ in range(warmup):
        step()
    with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])) as prof:
        wall = time_once(run, device)  # the wall time of the same steps, profiled
    # the host's operators only: on a GPU each also carries its kernels' time, which the profiler lists a second
    # time as kernel events (counting both would count every kernel twice)
    events = sorted((e for e in prof.key_averages() if e.device_type == DeviceType.CPU and getattr(e, key)),
                    key=lambda e: getattr(e, key), reverse=True)
    return {"ms_per_step": 1e3 * wall / steps,
            "in_operators": sum(getattr(e, key) for e in events) / 1e6 / wall,
            "calls_per_step": sum(e.count for e in events) / steps,
            "top": [{"name": e.key, "share": getattr(e, key) / 1e6 / wall, "calls_per_step": e.count / steps,
                     "us_per_call": getattr(e, key) / max(1, e.count)} for e in events[:top]]}


def profile_decoding(model, ids, device, autocast=nullcontext, compiled=True, steps=32, top=8, label="profile"):
    """profile_steps around `steps` cached steps of `model` at the middle of the context of `ids` (1, T) (the
    cache rewound before each, as bench.py's 4a does), at batch 1 and 32, eager and compiled: {case: figures}."""
    T = ids.size(1)
    modes = (("eager", kvcache.decode_step),) + ((("compiled", kvcache.compiled_decode_step()),) if compiled else ())
    cases = [(batch, mode, step) for batch in (1, 32) for mode, step in modes]
    data = {}
    progress = Progress(f"[{label}] decoding", len(cases))
    torch._dynamo.reset()
    with torch.inference_mode(), autocast():
        for done, (batch, mode, step) in enumerate(cases):
            progress.update(done)
            cache = kvcache.KVCache(model, batch, T)
            kvcache.prefill(model, ids[:, :T // 2].expand(batch, -1), cache)
            token, start = ids[:, T // 2:T // 2 + 1].expand(batch, -1), cache.length

            def decode_one(step=step, cache=cache, token=token, start=start):
                cache.length = start
                step(model, token, cache)

            data[f"batch {batch}, {mode}"] = profile_steps(decode_one, device, steps, top, warmup=3 * steps)
    return data
