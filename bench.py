"""
The single-device benchmark: the chapter's engineering claims as numbers.

    python bench.py            # CUDA if present (GPT-2-small-sized), else MPS/CPU (6 layers x 384 dims)
    python bench.py --quick    # a tiny smoke run, under a minute on 2 CPU cores

Sections (one markdown table each; the same figures go to a JSON file, and PNG plots when matplotlib is there):
  1. ceilings     measured matmul rate (bf16 on CUDA, fp32 on CPU) and device copy bandwidth
  2. training     one training step per arch at equal size and tokens: MFU and supervised tokens/s (claim C1)
  3. attention    SDPA with is_causal=True vs the same mask written out, prefix mask, no mask, FlexAttention
                  block masks (compiled; forward only on the CPU), and which kernel ran (claim E2)
  4. decoding     per-token latency against context length: KV cache vs recomputation (claim D4), a
                  240-token generation against the memory-bandwidth floor, and eager vs compiled decoding at
                  batch 1, 8 and 32 against the floor of each, and our cached decoding against
                  Hugging Face transformers' generate on the same model (where transformers is installed)
  (--compile=False skips the compiled rows of sections 2, 3 and 4, and their compile time)
  5. prefix       16 requests sharing a long prompt: one shared prefill vs 16 separate ones (claim D4)
  6. profile      where a step's time goes: torch.profiler's operators by self time, a cached gpt decoding step
                  at batch 1 and 32 and a gpt training step, eager and compiled
(3's FlexAttention rows, 4d and 6 measure with infra/speed_diagnostics.py; this file prints their tables)
Every timing: warm-up first, device synchronisation before reading the clock, median of repeats, random inputs.
"""
import atexit
import json
import os
import shutil
import sys
import tempfile
import time

import infra.quiet_interrupts  # noqa: E402,F401  (before torch: a Ctrl-C while it loads ends quietly)

import torch
import torch.nn.functional as F

from infra.configurator import (QUICK_NOTE, QUICK_OUTPUT, UserError, apply_overrides, check_compiler, pick_device,
                                run_main)
from infra.speed_diagnostics import against_hugging_face, flex_attention_rows, profile_decoding, profile_steps
from infra.progress import Progress, StopSignals, check_writable, format_duration, write_atomically
from infra.timing import copy_bandwidth, machine_name, matmul_flops_per_second, median_time, mfu_text, time_once

SECTIONS = ("ceilings", "training", "attention", "decoding", "prefix", "profile")
DEFAULTS = dict(
    device="auto",
    quick=False,           # tiny sizes, few repeats: checks that everything runs, not how fast
    sections="all",        # "all" or a comma-separated subset of: ceilings,training,attention,decoding,prefix,profile
    repeats=5,             # timings are medians over this many runs
    out="",                # JSON path; "" = results/bench/bench-<device>.json (--quick: out-quick/bench/, not committed)
    plots=True,            # write PNGs next to the JSON when matplotlib is installed
    compile=True,          # the torch.compile rows (training, FlexAttention, decoding); they cost compile time
)


def table(title, header, rows):
    lines = [f"\n### {title}\n", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    text = "\n".join(lines)
    print(text, flush=True)
    return text


# ----------------------------------------------------------------------------- sizes

def sizes(device, quick):
    """The benchmark's model and batch; quick: tiny, so that every row runs in seconds (its figures mean nothing)."""
    if quick:
        return dict(quick=True, n_layer=2, n_head=2, n_embd=64, block_size=64, vocab=171, batch=4, dtype=torch.float32)
    if device.startswith("cuda"):  # GPT-2 small
        return dict(quick=False, n_layer=12, n_head=12, n_embd=768, block_size=1024, vocab=50363, batch=16,
                    dtype=torch.bfloat16)
    return dict(quick=False, n_layer=6, n_head=6, n_embd=384, block_size=256, vocab=171, batch=8, dtype=torch.float32)


def build(arch, size, device):
    from model import ModelConfig, Transformer
    # equal size: t5 splits the layers between its encoder and decoder
    layers = dict(n_layer=size["n_layer"] // 2, n_decoder_layer=size["n_layer"] // 2) if arch == "t5" else \
        dict(n_layer=size["n_layer"])
    torch.manual_seed(0)
    config = ModelConfig(arch=arch, vocab_size=size["vocab"], block_size=size["block_size"], n_head=size["n_head"],
                         n_embd=size["n_embd"], bias=False, dropout=0.0, **layers)
    return Transformer(config).to(device)


def synthetic_specials(vocab):
    from data.prepare_common import SPECIAL_TOKENS, special_token_ids, NUM_SENTINELS
    from objectives import Specials
    ordinary = vocab - len(SPECIAL_TOKENS)
    return Specials.from_meta({"specials": special_token_ids(ordinary), "num_ordinary": ordinary,
                               "num_sentinels": NUM_SENTINELS})


def autocast_for(device, dtype):
    if str(device).startswith("cuda") and dtype != torch.float32:
        return torch.autocast("cuda", dtype=dtype)
    from contextlib import nullcontext
    return nullcontext()


# ----------------------------------------------------------------------------- sections

def bench_ceilings(device, size, repeats, results):
    quick = size["quick"]
    flops = matmul_flops_per_second(device, size["dtype"], size=512 if quick else None, seconds=0.2 if quick else 1.0)
    bandwidth = copy_bandwidth(device, 32 if quick else 256, repeats)
    results["ceilings"] = {"matmul_flops": flops, "dtype": str(size["dtype"]), "copy_bandwidth": bandwidth}
    return table("1. Ceilings of this machine", ["measure", "value"],
                 [[f"matmul ({str(size['dtype']).replace('torch.', '')})", f"{flops / 1e12:.3f} TFLOP/s"],
                  ["device copy bandwidth", f"{bandwidth / 1e9:.1f} GB/s"]])


def training_step(arch, size, device, specials):
    """One arch's training step at the benchmark's size, on a fixed batch of its default objective: (model,
    step(module): forward, backward and the optimizer's step through `module` (the model or its compiled form),
    the batch)."""
    import objectives
    model = build(arch, size, device)
    optimizer = model.configure_optimizer(0.1, 1e-4, (0.9, 0.95), "cuda" if device.startswith("cuda") else device)
    generator = torch.Generator().manual_seed(0)
    windows = torch.randint(0, specials.num_ordinary, (size["batch"], size["block_size"] + 1), generator=generator)
    objective = objectives.OBJECTIVES_FOR_ARCH[arch][0]
    batch = objectives.batch_for({"objective": objective, "arch": arch}, windows, specials, generator)
    inputs = batch.to(device).model_inputs()

    def step(module):
        with autocast_for(device, size["dtype"]):
            _, loss = module(**inputs)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return model, step, batch


def bench_training(device, size, repeats, results, compiled_rows=True):
    import objectives
    specials = synthetic_specials(size["vocab"])
    peak = results["ceilings"]["matmul_flops"]
    rows, data = [], {}
    progress = Progress("[bench] training", 4)
    for done, arch in enumerate(("gpt", "bert", "prefixlm", "t5")):
        progress.update(done)
        model, step, batch = training_step(arch, size, device, specials)
        objective = objectives.OBJECTIVES_FOR_ARCH[arch][0]
        flops = model.training_flops(batch)
        supervised, processed = batch.supervised_positions(), batch.processed_positions()
        seconds = median_time(lambda: step(model), device, repeats)
        data[arch] = {"objective": objective, "ms_per_step": seconds * 1e3, "tokens_per_s": processed / seconds,
                      "supervised_per_s": supervised / seconds, "mfu": flops / seconds / peak,
                      "supervised_per_tflop": supervised / (flops / 1e12), "supervised_fraction": supervised / processed,
                      "parameters": model.num_parameters()}
        figures = data[arch]
        rows.append([arch, objective, "eager", f"{figures['parameters'] / 1e6:.2f}M",
                     f"{figures['ms_per_step']:.1f}", f"{figures['tokens_per_s']:,.0f}", mfu_text(flops / seconds, peak),
                     f"{100 * figures['supervised_fraction']:.1f}%", f"{figures['supervised_per_s']:,.0f}",
                     f"{figures['supervised_per_tflop']:,.0f}", "-", "1.00x"])
        if compiled_rows and (arch == "gpt" or not size["quick"]):  # --quick: gpt's row only, to keep it quick
            # train.py --compile=True: the same step through torch.compile (forward and backward compiled; the
            # optimizer stays the fused AdamW). What compiling can remove is the non-matmul share of the step
            compiled = torch.compile(model)
            first = time_once(lambda: step(compiled), device)
            compiled_seconds = median_time(lambda: step(compiled), device, repeats, warmup=1)
            figures["compiled"] = after = {"ms_per_step": compiled_seconds * 1e3, "mfu": flops / compiled_seconds / peak,
                                           "compile_s": max(0.0, first - compiled_seconds),
                                           "speedup": seconds / compiled_seconds}
            rows.append([arch, objective, "compiled", "", f"{after['ms_per_step']:.1f}",
                         f"{processed / compiled_seconds:,.0f}", mfu_text(flops / compiled_seconds, peak), "",
                         f"{supervised / compiled_seconds:,.0f}", "", f"{after['compile_s']:.0f}",
                         f"{after['speedup']:.2f}x"])
    ratio = data["gpt"]["supervised_per_s"] / data["bert"]["supervised_per_s"]
    share = data["gpt"]["supervised_fraction"] / data["bert"]["supervised_fraction"]  # from the batches: exact
    step_ratio = data["bert"]["ms_per_step"] / data["gpt"]["ms_per_step"]
    data.update(gpt_over_bert_supervised=ratio, gpt_over_bert_supervised_share=share, bert_over_gpt_step=step_ratio)
    results["training"] = data
    # the same model size must take about the same time per step; if not, the machine was busy and the timed
    # ratio says more about the load than about claim C1 (the supervised share, counted, does not depend on it)
    steady = abs(step_ratio - 1) <= 0.3
    c1 = f"gpt / bert supervised tokens/s = {ratio:.2f}x" if steady else \
        f"gpt / bert supervised tokens/s not measured: their step times differ {step_ratio:.2f}x, a busy machine"
    return table(f"2. Training step per architecture (batch {size['batch']} x {size['block_size']} tokens; "
                 f"{c1}; supervised share {share:.2f}x, claim C1)",
                 ["arch", "objective", "step", "params", "ms/step", "tokens/s", "MFU", "supervised",
                  "supervised tok/s", "supervised tok/TFLOP", "compile s", "vs eager"], rows)


def which_backend(q, k, v, attn_mask, is_causal):
    """The first SDPA backend, in PyTorch's order of preference, that accepts these inputs."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
                    SDPBackend.MATH):
        try:
            with sdpa_kernel([backend]):
                F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal)
            return backend.name.lower()
        except RuntimeError:
            continue
    return "none"


def bench_attention(device, size, repeats, results, compiled_rows=True):
    import masks
    B, H, T, hs = size["batch"], size["n_head"], size["block_size"], size["n_embd"] // size["n_head"]
    generator = torch.Generator(device=device).manual_seed(0)
    q, k, v = (torch.randn(B, H, T, hs, device=device, dtype=size["dtype"], generator=generator) for _ in range(3))
    prefix = torch.full((B,), T // 2, device=device)
    variants = {
        "causal, is_causal=True (fast path)": (None, True),
        "causal, explicit boolean mask": (masks.causal_mask(T, device=device), False),
        "prefix-LM boolean mask (half prefix)": (masks.prefix_lm_mask(prefix, T), False),
        "bidirectional, no mask": (None, False),
    }
    rows, data = [], {}
    for name, (mask, is_causal) in variants.items():
        seconds = median_time(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal),
                              device, repeats * 4)
        data[name] = {"ms": seconds * 1e3, "backend": which_backend(q, k, v, mask, is_causal)}
    if compiled_rows:
        data.update(flex_attention_rows(device, q, k, v, T, repeats))
    fast = data["causal, is_causal=True (fast path)"]["ms"]
    for name, figures in data.items():
        timed = figures["ms"] == figures["ms"]  # not NaN
        rows.append([name, f"{figures['ms']:.3f}" if timed else "-", f"{figures['ms'] / fast:.2f}x" if timed else "-",
                     figures["backend"]])
    results["attention"] = data
    return table(f"3. Attention kernels (B={B}, heads={H}, T={T}, head size={hs}, "
                 f"{str(size['dtype']).replace('torch.', '')}; claim E2)",
                 ["variant", "ms/call", "vs is_causal", "backend"], rows)


def bench_decoding(device, size, repeats, results, compiled_rows=True):
    import kvcache
    T = size["block_size"]
    lengths = [L for L in (32, 64, 128, 256, 512, 1024) if L < T] + [T - 1]
    if T < 64:
        lengths = [16, T // 2, T - 1]
    models = {arch: build(arch, size, device).eval() for arch in ("gpt", "prefixlm", "t5", "bert")}
    generator = torch.Generator(device=device).manual_seed(0)
    ids = torch.randint(0, 60, (1, T), device=device, generator=generator)
    curves = {"gpt cached": [], "gpt recomputed": [], "prefixlm cached": [], "t5 cached": [],
              "bert recomputed (1 pass)": []}
    with torch.no_grad(), autocast_for(device, size["dtype"]):
        progress = Progress("[bench] decoding, context lengths", len(lengths))
        for done, L in enumerate(lengths):
            progress.update(done)
            for arch in ("gpt", "prefixlm", "t5"):
                model = models[arch]
                cache = kvcache.KVCache(model, 1, T)
                if arch == "t5":  # context L: half read by the encoder, half already decoded
                    kvcache.prefill(model, ids[:, :L - L // 2], cache, encoder_inputs=ids[:, :L // 2])
                else:
                    kvcache.prefill(model, ids[:, :L], cache)
                token, start = ids[:, L:L + 1], cache.length

                def one_step():
                    cache.length = start  # rewind: every repeat decodes the same position
                    kvcache.forward_with_cache(model, token, cache)

                curves[f"{arch} cached"].append(median_time(one_step, device, repeats) * 1e3)
            for arch, name in (("gpt", "gpt recomputed"), ("bert", "bert recomputed (1 pass)")):
                model = models[arch]  # the whole context again; the output head only where a token is read
                curves[name].append(median_time(lambda: model.logits(model.run_stack(ids[:, :L + 1])[:, -1]),
                                                device, repeats) * 1e3)
    cached, full = curves["gpt cached"], curves["gpt recomputed"]
    crossover = next((L for L, cached_ms, full_ms in zip(lengths, cached, full) if cached_ms < full_ms), None)
    if crossover == lengths[0]:
        where = f"at every measured context (the crossover lies below {lengths[0]})"
    else:
        where = f"from context {crossover}" if crossover else "nowhere in the measured range"
    rows = [[L] + [f"{curves[name][i]:.2f}" for name in curves] for i, L in enumerate(lengths)]
    text = table(f"4a. Decoding: ms per new token against context length (cached gpt is faster {where}; "
                 f"{full[-1] / cached[-1]:.1f}x at {lengths[-1]}; t5 has {size['n_layer'] // 2} decoder layers, the "
                 f"others {size['n_layer']}; claim D4)", ["context"] + list(curves), rows)

    # a whole generation: batch 1, 16-token prompt, 240 new tokens (fewer in --quick)
    new = min(240, T - 16)
    mask_id = synthetic_specials(size["vocab"]).mask
    prompt = ids[:, :16]
    gpt = models["gpt"]
    run = {}
    with torch.no_grad(), autocast_for(device, size["dtype"]):
        for name, use_cache in (("gpt, KV cache", True), ("gpt, recomputed", False)):
            seconds = median_time(lambda: kvcache.generate(gpt, prompt, new, temperature=0, use_cache=use_cache), device,
                                  max(1, repeats // 2), warmup=1)
            run[name] = {"tokens_per_s": new / seconds, "forward_passes": new}
        for steps in (16, 64):
            seconds = median_time(lambda: kvcache.iterative_unmask(models["bert"], prompt, new, steps, mask_id=mask_id,
                                                           temperature=0), device, max(1, repeats // 2), warmup=1)
            run[f"bert mask-predict, {steps} steps"] = {"tokens_per_s": new / seconds, "forward_passes": steps}
    # each token must read every weight once, and the KV cache: bandwidth / those bytes bounds tokens/s (at batch 1).
    # On a CPU whose caches hold much of a small model the bound can be beaten: then the model is too small to be
    # bound
    floor = decoding_floor(gpt, results["ceilings"]["copy_bandwidth"], 1, prompt.size(1) + new / 2)
    speedup = run["gpt, KV cache"]["tokens_per_s"] / run["gpt, recomputed"]["tokens_per_s"]
    # the floor assumes one read of the weights per token: it applies to token-by-token decoding, not to
    # mask-predict, which reads them once per step for many tokens at a time
    rows = [[name, f"{figures['tokens_per_s']:,.1f}", figures["forward_passes"],
             f"{100 * figures['tokens_per_s'] / floor:.1f}%" if name.startswith("gpt") else "-"] for name, figures in run.items()]
    rows.append(["bandwidth floor (weights and KV cache read once per token)", f"{floor:,.1f}", "-", "100%"])
    text += table(f"4b. Generating {new} tokens from a 16-token prompt, batch 1 (cache speedup {speedup:.1f}x)",
                  ["sampler", "tokens/s", "forward passes", "of bandwidth floor"], rows)
    results["decoding"] = {"lengths": lengths, "ms_per_token": curves, "crossover": crossover,
                           "generation": run, "bandwidth_floor_tokens_per_s": floor, "cache_speedup": speedup}
    if compiled_rows:
        text += bench_compiled_decoding(device, size, repeats, results, models, prompt, new)
    return text + bench_hugging_face(device, size, repeats, results, prompt, new, compiled_rows)


def bench_hugging_face(device, size, repeats, results, prompt, new, compiled_rows):
    """4d: our cached greedy decoding against Hugging Face transformers' `generate` on the same GPT-2-layout model
    (their random weights loaded into our modules), batch 1 (infra/speed_diagnostics.py). The two must write the
    same tokens (greedy), else the row says so. Skipped where transformers is not installed."""
    data = against_hugging_face(size, prompt, new, device, max(1, repeats // 2),
                                lambda: autocast_for(device, size["dtype"]), compiled_rows)
    if data is None:
        text = "\n### 4d. Against Hugging Face transformers: skipped (not installed; pip install transformers)\n"
        print(text, flush=True)
        return text
    results["hugging_face_decoding"] = data
    reference = data["samplers"][data["reference"]]["tokens_per_s"]
    rows = [[name, f"{figures['tokens_per_s']:,.1f}", f"{figures['tokens_per_s'] / reference:.2f}x",
             "yes" if data["same_tokens"][name] else "NO"] for name, figures in data["samplers"].items()]
    return table(f"4d. Against Hugging Face transformers {data['transformers']}: {new} greedy tokens from a "
                 f"{prompt.size(1)}-token prompt, batch 1, the same GPT-2-layout model (their random weights in our "
                 f"modules); same tokens: checked in float32; our cache keeps float32 keys and values",
                 ["sampler", "tokens/s", "vs transformers", "same tokens"], rows)


def decoding_cost(model, average_context, encoder_length=0):
    """What one decoding step must move and compute: (weight numbers read once per step, cache numbers read per
    row, matmul FLOPs per row). The weights a step uses are all but the position table and, for t5, the encoder
    (it ran once); each row reads keys and values of every layer over its context (t5: plus the cross-attention
    K/V over the encoder's output); FLOPs: 2 per weight of a matmul, plus 4 * layers * context * width for q.k
    and the weighted sum of v."""
    config = model.config
    weights = model.num_parameters(exclude_positions=True)
    layers = config.n_layer
    if config.arch == "t5":  # the encoder, its final norm and the cross-attention K/V projections ran once (prefill)
        once = [model.blocks, model.final_norm] + [block.cross_attention.key_value for block in model.decoder_blocks]
        weights -= sum(p.numel() for module in once for p in module.parameters())
        layers = config.n_decoder_layer
    keys = average_context + encoder_length  # (the tied embedding counts once: its matmul is the output head)
    return weights, layers * 2 * keys * config.n_embd, 2 * weights + 4 * layers * keys * config.n_embd


def decoding_floor(model, bandwidth, batch, average_context, encoder_length=0):
    """tokens/s if a step cost only its memory traffic: its weights read once (shared by the batch's rows) and each
    row's cache, at `bandwidth` bytes/s. The models stay in float32 (autocast casts on the fly on a GPU), and the
    cache takes their dtype, so that is what a step reads."""
    weights, cache_per_row, _ = decoding_cost(model, average_context, encoder_length)
    return batch * bandwidth / ((weights + batch * cache_per_row) * next(model.parameters()).element_size())


def bench_compiled_decoding(device, size, repeats, results, models, prompt, new):
    """4c: eager vs torch.compile'd decoding step (kvcache.compiled_decode_step), gpt at batch 1, 8 and 32 from one
    shared prefill (sample.py --num_samples), prefixlm and t5 at batch 1. Compilation is paid once per process and
    per batch-size regime (1, then any larger): the first generation's extra time is reported as compile time."""
    import kvcache
    bandwidth, matmul_rate = results["ceilings"]["copy_bandwidth"], results["ceilings"]["matmul_flops"]
    cases = [("gpt", 1), ("gpt", 8), ("gpt", 32), ("prefixlm", 1), ("t5", 1)]
    if size["quick"]:  # the rows run, the figures mean nothing
        cases = [("gpt", 1), ("gpt", 8), ("t5", 1)]
    t5_inputs = prompt[:, :8]
    rows, data = [], {}
    progress = Progress("[bench] compiled decoding", 2 * len(cases))
    with torch.no_grad(), autocast_for(device, size["dtype"]):
        for done, (arch, batch) in enumerate(cases):
            model = models[arch]
            extra = dict(encoder_inputs=t5_inputs, start_token=0) if arch == "t5" else {}
            start = prompt[:, :1] if arch == "t5" else prompt
            context = start.size(1) + new / 2  # average context of the generation
            encoder_length = t5_inputs.size(1) if arch == "t5" else 0
            floor = decoding_floor(model, bandwidth, batch, context, encoder_length)
            compute_bound = matmul_rate / decoding_cost(model, context, encoder_length)[2]  # each row's matmuls, peak
            if done == 0 or cases[done - 1][0] != arch:
                torch._dynamo.reset()  # a new model: its own graphs (compiled graphs per code object are limited)
            for mode, compiled in (("eager", False), ("compiled", True)):
                progress.update(2 * done + compiled)

                def generation():
                    kvcache.generate(model, start, new, num_samples=batch, temperature=0, compiled=compiled, **extra)

                first = time_once(generation, device)  # compiles on its first call (for a new batch regime)
                seconds = median_time(generation, device, max(1, repeats // 2), warmup=0)
                tokens_per_s = batch * new / seconds
                data[f"{arch}, batch {batch}, {mode}"] = figures = {
                    "tokens_per_s": tokens_per_s, "floor_tokens_per_s": floor, "of_floor": tokens_per_s / floor,
                    "compute_bound_tokens_per_s": compute_bound, "first_call_extra_s": max(0.0, first - seconds)}
                rows.append([arch, batch, mode, f"{tokens_per_s:,.1f}", f"{floor:,.1f}",
                             f"{100 * figures['of_floor']:.1f}%", f"{compute_bound:,.0f}",
                             f"{figures['first_call_extra_s']:.1f}"])
            eager = data[f"{arch}, batch {batch}, eager"]
            figures["speedup_over_eager"] = figures["tokens_per_s"] / eager["tokens_per_s"]
            rows[-1].append(f"{figures['speedup_over_eager']:.2f}x")
            rows[-2].append("1.00x")
    results["compiled_decoding"] = data
    return table(f"4c. Compiled decoding: {new} greedy tokens per row from a {prompt.size(1)}-token prompt (t5: an "
                 f"8-token encoder input), eager vs torch.compile'd step (kvcache.compiled_decode_step); floor = "
                 f"weights once per step + each row's KV cache, at the measured copy bandwidth",
                 ["arch", "batch", "step", "tokens/s", "floor tokens/s", "of floor", "compute bound tokens/s",
                  "first-call extra s (compile)", "vs eager"], rows)


def bench_prefix(device, size, repeats, results):
    import kvcache
    T = size["block_size"]
    requests, own, new = 16, max(4, T // 16), max(4, T // 16)
    shared_length = T - own - new
    model = build("gpt", size, device).eval()
    generator = torch.Generator(device=device).manual_seed(1)
    prompt = torch.randint(0, 60, (1, shared_length), device=device, generator=generator)
    suffixes = torch.randint(0, 60, (requests, own), device=device, generator=generator)

    def serve(shared):
        if shared:  # one prefill of the common prompt, forked to every request
            cache = kvcache.KVCache(model, 1, T)
            kvcache.prefill(model, prompt, cache)
            cache = cache.fork(requests)
            logits = kvcache.forward_with_cache(model, suffixes, cache)[:, -1]
        else:  # every request prefills the whole prompt itself (batched, as a server would)
            cache = kvcache.KVCache(model, requests, T)
            logits = kvcache.prefill(model, torch.cat([prompt.expand(requests, -1), suffixes], dim=1), cache)
        for _ in range(new):
            token = logits.argmax(-1, keepdim=True)
            logits = kvcache.forward_with_cache(model, token, cache)[:, -1]

    with torch.no_grad(), autocast_for(device, size["dtype"]):
        separate = median_time(lambda: serve(False), device, repeats)
        shared = median_time(lambda: serve(True), device, repeats)
    results["prefix"] = {"requests": requests, "shared_prompt": shared_length, "own_tokens": own,
                         "new_tokens": new, "separate_ms": separate * 1e3, "shared_ms": shared * 1e3,
                         "speedup": separate / shared}
    return table(f"5. Prefix caching: {requests} requests sharing a {shared_length}-token prompt, each adding {own} "
                 f"tokens and generating {new} (claim D4)", ["serving", "total ms", "speedup"],
                 [["16 separate prefills", f"{separate * 1e3:.1f}", "1.00x"],
                  ["one shared prefill, forked cache", f"{shared * 1e3:.1f}", f"{separate / shared:.2f}x"]])


def bench_profile(device, size, repeats, results, compiled_rows=True):
    """6: where a step's time goes (infra/speed_diagnostics.py; what it showed: docs/speed.md): torch.profiler
    around 32 cached gpt decoding steps at the middle of the context, batch 1 and 32, and around 3 gpt training
    steps (bench_training's), eager and compiled; the operators by their own time."""
    model = build("gpt", size, device).eval()
    generator = torch.Generator(device=device).manual_seed(0)
    ids = torch.randint(0, 60, (1, size["block_size"]), device=device, generator=generator)
    data = {f"decoding, {case}": figures for case, figures in
            profile_decoding(model, ids, device, lambda: autocast_for(device, size["dtype"]), compiled_rows,
                             label="bench profile").items()}
    model, step, _ = training_step("gpt", size, device, synthetic_specials(size["vocab"]))
    torch._dynamo.reset()  # graphs of its own (as in 2), compiled in the warm-up
    for mode, module in (("eager", model),) + ((("compiled", torch.compile(model)),) if compiled_rows else ()):
        data[f"training, {mode}"] = profile_steps(lambda: step(module), device, steps=3)
    results["profile"] = data
    outside = "(GPU waiting for the host)" if device.startswith("cuda") else "(outside every operator: Python, dispatch)"
    text = ""
    for case, figures in data.items():
        rows = [[o["name"][:60], f"{100 * o['share']:.1f}%", f"{o['calls_per_step']:.0f}", f"{o['us_per_call']:.1f}"]
                for o in figures["top"]]
        inside = figures["in_operators"]  # above 100%, self times overlapped (threads of their own): not additive
        rows.append([outside, f"{100 * (1 - inside):.1f}%" + (" (overlap: not additive)" if inside > 1 else ""),
                     "-", "-"])
        what, batch_and_mode = case.split(", ", 1)
        text += table(f"6. Profile of a {what} step: gpt, {batch_and_mode}: {figures['ms_per_step']:.2f} ms per step "
                      f"under the profiler, {figures['calls_per_step']:.0f} profiled calls per step (nested ones "
                      f"included)", ["operator (self time)", "of wall time", "calls per step", "us per call"], rows)
    return text


def plot(results, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    decoding = results["decoding"]
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, values in decoding["ms_per_token"].items():
        ax.plot(decoding["lengths"], values, marker="o", label=name)
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("ms per new token")
    ax.set_title("Decoding cost against context (claim D4)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return path


def steadiness(device, size, results):
    """The matmul rate again, at the end: every figure above is read against the first measurement, so a machine
    whose speed changed during the run (other work on it) makes them unreliable, and the file says so."""
    quick = size["quick"]
    before = results["ceilings"]["matmul_flops"]
    after = matmul_flops_per_second(device, size["dtype"], size=512 if quick else None, seconds=0.2 if quick else 1.0)
    results["ceilings"]["matmul_flops_at_end"] = after
    line = f"matmul rate at the start {before / 1e12:.3f}, at the end {after / 1e12:.3f} TFLOP/s"
    if abs(after / before - 1) > 0.3:
        line = f"**Unsteady machine: {line}; the figures above are not reliable (other work was running).**"
    else:
        line = f"Steady machine: {line}."
    print("\n" + line, flush=True)
    return "\n" + line


def check_out_path(out):
    """--out is the JSON file; the markdown and PNG go beside it. Find out now, not after the run, if one of them
    cannot be written."""
    if not out.endswith(".json"):
        raise UserError(f"--out={out} must name a .json file (the markdown and PNG are written beside it)")
    base = os.path.splitext(out)[0]
    check_writable([out, base + ".md", base + ".png"], "--out")


def main():
    config = apply_overrides(DEFAULTS, sys.argv[1:])
    chosen = SECTIONS if config["sections"] == "all" else tuple(x.strip() for x in config["sections"].split(","))
    if "" in chosen:
        raise UserError(f"--sections={config['sections']!r} has an empty name: a comma-separated list of "
                        f"{', '.join(SECTIONS)}, or all")
    unknown = [x for x in chosen if x not in SECTIONS]
    if unknown:
        raise UserError(f"unknown section(s) {', '.join(unknown)}: choose from {', '.join(SECTIONS)} or all")
    if config["repeats"] < 1:
        raise UserError("--repeats must be at least 1")
    device = pick_device(config["device"])
    size = sizes(device, config["quick"])
    name = "cuda" if device.startswith("cuda") else device
    folder = os.path.join(QUICK_OUTPUT, "bench") if config["quick"] else os.path.join("results", "bench")
    out = config["out"] or os.path.join(folder, f"bench-{name}{'-quick' if config['quick'] else ''}.json")
    check_out_path(out)
    repeats = 2 if config["quick"] else config["repeats"]
    machine = machine_name(device)
    print(f"## bench.py on {device} ({machine}), torch {torch.__version__}; model {size['n_layer']} layers x "
          f"{size['n_embd']} dims, block {size['block_size']}; medians of {repeats}")
    results = {"device": device, "machine": machine, "torch": torch.__version__,
               "sizes": {k: str(v) for k, v in size.items()}}
    compiled_rows = config["compile"]
    if compiled_rows:
        check_compiler(device, "the compiled rows (--compile=False skips them)")
    if compiled_rows and "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
        # compile times as a user's first run pays them: an empty cache of compiled kernels, removed at the end
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = kernel_cache = tempfile.mkdtemp(prefix="bench-inductor-")
        atexit.register(shutil.rmtree, kernel_cache, ignore_errors=True)
    sections = {"ceilings": bench_ceilings, "prefix": bench_prefix,
                "profile": lambda *a: bench_profile(*a, compiled_rows=compiled_rows),
                "training": lambda *a: bench_training(*a, compiled_rows=compiled_rows),
                "attention": lambda *a: bench_attention(*a, compiled_rows=compiled_rows),
                "decoding": lambda *a: bench_decoding(*a, compiled_rows=compiled_rows)}
    todo = ["ceilings"] + [x for x in chosen if x != "ceilings"]  # every other section is read against ceilings
    t0 = time.perf_counter()
    texts, finished = [], []
    try:  # Ctrl-C or SIGTERM: the sections already finished are written, the message names the others
        with StopSignals(immediate=True):
            for i, section in enumerate(todo):
                elapsed = time.perf_counter() - t0
                print(f"\n[bench] section {i + 1}/{len(todo)}: {section}, {format_duration(elapsed)} so far", flush=True)
                texts.append(sections[section](device, size, repeats, results))
                finished.append(section)
    except KeyboardInterrupt:
        not_done = [x for x in todo if x not in finished]
        results["not_done"] = not_done
        print(f"\ninterrupted: sections not done: {', '.join(not_done)}", flush=True)
    if "ceilings" in finished and len(finished) > 1:
        texts.append(steadiness(device, size, results))
    results["seconds"] = time.perf_counter() - t0
    write_atomically(out, json.dumps(results, indent=1))
    header = f"bench.py on {device} ({machine}), torch {torch.__version__}\n" + (f"\n{QUICK_NOTE}\n" if size["quick"] else "")
    write_atomically(os.path.splitext(out)[0] + ".md", header + "\n".join(texts) + "\n")
    picture = None
    if config["plots"] and "decoding" in finished:
        picture = plot(results, os.path.splitext(out)[0] + ".png")
    print(f"\nwrote {out}{' and ' + picture if picture else ''} in {results['seconds']:.0f} s")


if __name__ == "__main__":
    run_main(main)
