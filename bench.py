"""
The single-device benchmark: the chapter's engineering claims as numbers.

    python bench.py            # CUDA if present (GPT-2-small-sized), else MPS/CPU (6 x 384)
    python bench.py --quick    # a tiny smoke run, under a minute on 2 CPU cores

Sections (one markdown table each; the same figures go to a JSON file, and PNG plots when matplotlib
is there):
  1. ceilings     measured matmul rate (bf16 on CUDA, fp32 on CPU) and device copy bandwidth
  2. training     one training step per arch at equal size and tokens: MFU and supervised
                  tokens/s (claim C1)
  3. attention    SDPA with is_causal=True vs the same mask written out, prefix mask, no mask,
                  FlexAttention block masks (compiled; forward only on the CPU), and which
                  kernel ran (claim E2)
  4. decoding     per-token latency against context length: KV cache vs recomputation (claim D4),
                  and a 240-token generation against the memory-bandwidth floor
  5. prefix       16 requests sharing a long prompt: one shared prefill vs 16 separate ones
                  (claim D4)
  6. profile      where a step's time goes (torch.profiler), decoding and training, eager and
                  compiled
Diagnostics beside the claims (infra/speed_diagnostics.py): the compiled rows of 2 and 3
(FlexAttention), 4c (compiled decoding at batch 1, 8 and 32 against the floor of each), 4d (against
transformers' generate), 6, and the steadiness line. --compile=False skips the compiled rows and
their compile time. Every timing: warm-up first, device synchronisation before reading the clock,
median of repeats, random inputs.
"""
import contextlib
import json
import os
import sys
import time

# before torch: a Ctrl-C while it loads ends quietly
import infra.quiet_interrupts  # noqa: E402,F401

import torch
import torch.nn.functional as F

import kvcache
import masks
import objectives
import sample  # its samplers: generate (KV cache) and iterative_unmask (bert)
from infra.configurator import (QUICK_NOTE, UserError, apply_overrides, check_compiler, pick_device,
                                run_main)
from infra.speed_diagnostics import (check_out_path, chosen_sections, compiled_decoding_section,
                                     compiled_training_row, flex_attention_rows, fresh_kernel_cache,
                                     hugging_face_section, plot, profile_section, steadiness, table,
                                     which_backend)
from infra.progress import Progress, StopSignals, format_duration, write_atomically
from infra.timing import (copy_bandwidth, machine_name, matmul_flops_per_second, median_time,
                          mfu_text, of_floor_text)
from model import ModelConfig, Transformer

SECTIONS = ("ceilings", "training", "attention", "decoding", "prefix", "turns", "profile")
DEFAULTS = dict(
    device="auto",
    quick=False,           # tiny sizes, few repeats: checks that everything runs, not how fast
    sections="all",        # "all" or some of:
                           # ceilings,training,attention,decoding,prefix,turns,profile
    repeats=5,             # timings are medians over this many runs
    out="",                # JSON path; "" = results/bench/bench-<device>.json (--quick:
                           # out-quick/bench/, not committed)
    plots=True,            # write PNGs next to the JSON when matplotlib is installed
    compile=True,          # the torch.compile rows (training, FlexAttention, decoding);
                           # they cost compile time
)


# ----------------------------------------------------------------------------- sizes

def sizes(device, quick):
    """The benchmark's model and batch; quick: tiny, so that every row runs in seconds
    (its figures mean nothing)."""
    if quick:
        return dict(quick=True, n_layer=2, n_head=2, n_embd=64, block_size=64, vocab=171, batch=4,
                    dtype=torch.float32)
    if device.startswith("cuda"):  # GPT-2 small
        return dict(quick=False, n_layer=12, n_head=12, n_embd=768, block_size=1024, vocab=50363,
                    batch=16, dtype=torch.bfloat16)
    return dict(quick=False, n_layer=6, n_head=6, n_embd=384, block_size=256, vocab=171, batch=8,
                dtype=torch.float32)


def build(arch, size, device):
    # equal size: t5 splits the layers between its encoder and decoder
    layers = dict(n_layer=size["n_layer"] // 2,
                  n_decoder_layer=size["n_layer"] // 2) if arch == "t5" else \
        dict(n_layer=size["n_layer"])
    torch.manual_seed(0)
    config = ModelConfig(arch=arch, vocab_size=size["vocab"], block_size=size["block_size"],
                         n_head=size["n_head"], n_embd=size["n_embd"], bias=False, dropout=0.0,
                         **layers)
    return Transformer(config).to(device)


def autocast_for(device, dtype):
    on_gpu = str(device).startswith("cuda") and dtype != torch.float32
    return torch.autocast("cuda", dtype=dtype) if on_gpu else contextlib.nullcontext()


# ----------------------------------------------------------------------------- sections

def bench_ceilings(device, size, repeats, results):
    quick = size["quick"]
    flops = matmul_flops_per_second(device, size["dtype"], size=512 if quick else None,
                                    seconds=0.2 if quick else 1.0)
    # far larger than a CPU's last cache
    bandwidth = copy_bandwidth(device, 32 if quick else 256, repeats)
    results["ceilings"] = {"matmul_flops": flops, "dtype": str(size["dtype"]),
                           "copy_bandwidth": bandwidth, "copy_bandwidth_measured": [bandwidth]}
    return table("1. Ceilings of this machine", ["measure", "value"],
                 [[f"matmul ({str(size['dtype']).replace('torch.', '')})",
                   f"{flops / 1e12:.3f} TFLOP/s"],
                  ["device copy bandwidth", f"{bandwidth / 1e9:.1f} GB/s"]])


def training_step(arch, size, device, specials):
    """One arch's training step at the benchmark's size, on a fixed batch of its default objective:
    (model, step(module): forward, backward and the optimizer's step through `module` (the model or
    its compiled form), the batch)."""
    model = build(arch, size, device)
    optimizer = model.configure_optimizer(0.1, 1e-4, (0.9, 0.95),
                                          "cuda" if device.startswith("cuda") else device)
    generator = torch.Generator().manual_seed(0)
    windows = torch.randint(0, specials.num_ordinary, (size["batch"], size["block_size"] + 1),
                            generator=generator)
    objective = objectives.OBJECTIVES_FOR_ARCH[arch][0]
    batch = objectives.batch_for({"objective": objective, "arch": arch}, windows, specials,
                                 generator)
    inputs = batch.to(device).model_inputs()

    def step(module):
        with autocast_for(device, size["dtype"]):
            _, loss = module(**inputs)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return model, step, batch


def bench_training(device, size, repeats, results, compiled_rows=True):
    specials = objectives.synthetic_specials(size["vocab"])
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
        data[arch] = {"objective": objective, "ms_per_step": seconds * 1e3,
                      "tokens_per_s": processed / seconds, "supervised_per_s": supervised / seconds,
                      "mfu": flops / seconds / peak,
                      "supervised_per_tflop": supervised / (flops / 1e12),
                      "supervised_fraction": supervised / processed,
                      "parameters": model.num_parameters()}
        figures = data[arch]
        rows.append([arch, objective, "eager", f"{figures['parameters'] / 1e6:.2f}M",
                     f"{figures['ms_per_step']:.1f}", f"{figures['tokens_per_s']:,.0f}",
                     mfu_text(flops / seconds, peak),
                     f"{100 * figures['supervised_fraction']:.1f}%",
                     f"{figures['supervised_per_s']:,.0f}",
                     f"{figures['supervised_per_tflop']:,.0f}", "-", "1.00x"])
        if compiled_rows and (arch == "gpt" or not size["quick"]):
            # --quick: gpt's row only, to keep it quick
            rows.append(compiled_training_row(model, step, batch, seconds, figures, peak, device,
                                              repeats))
    ratio = data["gpt"]["supervised_per_s"] / data["bert"]["supervised_per_s"]
    # from the batches: exact
    share = data["gpt"]["supervised_fraction"] / data["bert"]["supervised_fraction"]
    step_ratio = data["bert"]["ms_per_step"] / data["gpt"]["ms_per_step"]
    data.update(gpt_over_bert_supervised=ratio, gpt_over_bert_supervised_share=share,
                bert_over_gpt_step=step_ratio)
    results["training"] = data
    # the same model size must take about the same time per step; if not, the machine was busy and
    # the timed ratio says more about the load than about claim C1 (the supervised share, counted,
    # does not depend on it)
    steady = abs(step_ratio - 1) <= 0.3
    c1 = f"gpt / bert supervised tokens/s = {ratio:.2f}x"
    if not steady:
        c1 = (f"gpt / bert supervised tokens/s not measured: their step times differ "
              f"{step_ratio:.2f}x, a busy machine")
    return table(f"2. Training step per architecture (batch {size['batch']} x {size['block_size']} "
                 f"tokens; {c1}; supervised share {share:.2f}x, claim C1)",
                 ["arch", "objective", "step", "params", "ms/step", "tokens/s", "MFU", "supervised",
                  "supervised tok/s", "supervised tok/TFLOP", "compile s", "vs eager"], rows)


def bench_attention(device, size, repeats, results, compiled_rows=True):
    B, H, T = size["batch"], size["n_head"], size["block_size"]
    hs = size["n_embd"] // H
    generator = torch.Generator(device=device).manual_seed(0)
    q, k, v = (torch.randn(B, H, T, hs, device=device, dtype=size["dtype"], generator=generator)
               for _ in range(3))
    prefix = torch.full((B,), T // 2, device=device)
    variants = {
        "causal, is_causal=True (fast path)": (None, True),
        "causal, explicit boolean mask": (masks.causal_mask(T, device=device), False),
        "prefix-LM boolean mask (half prefix)": (masks.prefix_lm_mask(prefix, T), False),
        "bidirectional, no mask": (None, False),
    }
    rows, data = [], {}
    for name, (mask, is_causal) in variants.items():
        attend = lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask,  # noqa: E731
                                                        is_causal=is_causal)
        seconds = median_time(attend, device, repeats * 4)
        data[name] = {"ms": seconds * 1e3, "backend": which_backend(q, k, v, mask, is_causal)}
    if compiled_rows:
        data.update(flex_attention_rows(device, q, k, v, T, repeats, quick=size["quick"]))
    fast = data["causal, is_causal=True (fast path)"]["ms"]
    for name, figures in data.items():
        timed = figures["ms"] == figures["ms"]  # not NaN
        rows.append([name, f"{figures['ms']:.3f}" if timed else "-",
                     f"{figures['ms'] / fast:.2f}x" if timed else "-", figures["backend"]])
    results["attention"] = data
    return table(f"3. Attention kernels (B={B}, heads={H}, T={T}, head size={hs}, "
                 f"{str(size['dtype']).replace('torch.', '')}; claim E2)",
                 ["variant", "ms/call", "vs is_causal", "backend"], rows)


def bench_decoding(device, size, repeats, results, compiled_rows=True):
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
                    kvcache.prefill(model, ids[:, :L - L // 2], cache,
                                    encoder_inputs=ids[:, :L // 2])
                else:
                    kvcache.prefill(model, ids[:, :L], cache)
                token, start = ids[:, L:L + 1], cache.length

                def one_step():
                    cache.length = start  # rewind: every repeat decodes the same position
                    kvcache.forward_with_cache(model, token, cache)

                curves[f"{arch} cached"].append(median_time(one_step, device, repeats) * 1e3)
            for arch, name in (("gpt", "gpt recomputed"), ("bert", "bert recomputed (1 pass)")):
                model = models[arch]  # the whole context again; the output head only
                                      # where a token is read
                def recompute():
                    return model.logits(model.run_stack(ids[:, :L + 1])[:, -1])
                curves[name].append(median_time(recompute, device, repeats) * 1e3)
    cached, full = curves["gpt cached"], curves["gpt recomputed"]
    crossover = next((L for L, cached_ms, full_ms in zip(lengths, cached, full)
                      if cached_ms < full_ms), None)
    where = f"from context {crossover}" if crossover else "nowhere in the measured range"
    if crossover == lengths[0]:
        where = f"at every measured context (the crossover lies below {lengths[0]})"
    rows = [[L] + [f"{curves[name][i]:.2f}" for name in curves] for i, L in enumerate(lengths)]
    text = table("4a. Decoding: ms per new token against context length (cached gpt is faster "
                 f"{where}; {full[-1] / cached[-1]:.1f}x at {lengths[-1]}; t5 has "
                 f"{size['n_layer'] // 2} decoder layers, the others {size['n_layer']}; "
                 "claim D4)",
                 ["context"] + list(curves), rows)

    # a whole generation: batch 1, 16-token prompt, 240 new tokens (fewer in --quick)
    new = min(240, T - 16)
    mask_id = objectives.synthetic_specials(size["vocab"]).mask
    prompt = ids[:, :16]
    gpt = models["gpt"]
    run = {}
    with torch.no_grad(), autocast_for(device, size["dtype"]):
        for name, sampler in (("gpt, KV cache", sample.generate),
                              ("gpt, recomputed", sample.generate_uncached)):
            seconds = median_time(lambda: sampler(gpt, prompt, new, sample.GREEDY),
                                  device, max(1, repeats // 2), warmup=1)
            run[name] = {"tokens_per_s": new / seconds, "forward_passes": new}
        for steps in (16, 64):
            def mask_predict():
                x = torch.cat([prompt, torch.full((1, new), mask_id, device=prompt.device)], dim=1)
                sample.iterative_unmask(models["bert"], x, x == mask_id, steps, sample.GREEDY)
            seconds = median_time(mask_predict, device, max(1, repeats // 2), warmup=1)
            run[f"bert mask-predict, {steps} steps"] = {"tokens_per_s": new / seconds,
                                                        "forward_passes": steps}
    # each token reads every weight and the KV cache once: bandwidth / those bytes bounds tokens/s
    # at batch 1, unless the CPU's caches hold much of a small model. Token by token only:
    # mask-predict reads them once a step
    bandwidth, weights_sized = floor_bandwidths(device, size, repeats, results, gpt)
    context = prompt.size(1) + new / 2
    floor = decoding_floor(gpt, bandwidth, 1, context)
    cached_floor = decoding_floor(gpt, weights_sized, 1, context)
    speedup = run["gpt, KV cache"]["tokens_per_s"] / run["gpt, recomputed"]["tokens_per_s"]
    rows = [[name, f"{figures['tokens_per_s']:,.1f}", figures["forward_passes"],
             of_floor_text(figures["tokens_per_s"], floor, cached_floor) if name.startswith("gpt")
             else "-"]
            for name, figures in run.items()]
    rows.append(["bandwidth floor (weights and KV cache read once per token from memory)",
                 f"{floor:,.1f}", "-", "100%"])
    rows.append(["the same at a weights-sized copy's bandwidth (what the CPU's caches can serve)",
                 f"{cached_floor:,.1f}", "-", f"{100 * cached_floor / floor:.1f}%"])
    measured = ", ".join(f"{b / 1e9:.1f}" for b in results["ceilings"]["copy_bandwidth_measured"])
    text += table(f"4b. Generating {new} tokens from a 16-token prompt, batch 1 (cache speedup "
                  f"{speedup:.1f}x); floors at the copy bandwidth measured at the start and before "
                  f"these rows ({measured} GB/s: the higher kept), and at a copy of a buffer the "
                  f"size of gpt's weights ({weights_sized / 1e9:.1f} GB/s)",
                  ["sampler", "tokens/s", "forward passes", "of bandwidth floor"], rows)
    results["decoding"] = {"lengths": lengths, "ms_per_token": curves, "crossover": crossover,
                           "generation": run, "bandwidth_floor_tokens_per_s": floor,
                           "cache_speedup": speedup}
    autocast = lambda: autocast_for(device, size["dtype"])  # noqa: E731
    if compiled_rows:  # 4c and 4d: diagnostics (infra/speed_diagnostics.py)
        text += compiled_decoding_section(greedy, decoding_floor, decoding_cost, device, size,
                                          repeats, results, models, prompt, new, autocast)
    return text + hugging_face_section(greedy, device, size, repeats, results, prompt, new,
                                       autocast, compiled_rows)


def greedy(model, rows, new, compiled=False):
    """sample.generate, greedy, as the diagnostics in infra/ call it (they import no command):
    `rows` (B, P) one prompt per row; t5's rows are its encoder's input, the decoder
    starting from token 0."""
    prompt = sample.T5Prompt(rows, None, 0) if model.config.arch == "t5" else rows
    return sample.generate(model, prompt, new, sample.GREEDY, compiled=compiled)


def floor_bandwidths(device, size, repeats, results, model):
    """The two bandwidths the decoding floors are read at: a copy far larger than the CPU's caches,
    measured again here (the higher of this and the start's is kept: a busy moment cannot lower a
    floor), and a copy of a buffer the size of `model`'s weights (a CPU whose caches hold much of
    them reads them faster than from memory)."""
    ceilings = results["ceilings"]
    ceilings["copy_bandwidth_measured"].append(copy_bandwidth(device, 32 if size["quick"] else 256,
                                                              repeats))
    ceilings["copy_bandwidth"] = max(ceilings["copy_bandwidth_measured"])
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    ceilings["weights_sized_copy_bandwidth"] = copy_bandwidth(device,
                                                              max(1, round(weight_bytes / 2 ** 20)),
                                                              repeats)
    ceilings["weights_sized_copy_megabytes"] = weight_bytes / 2 ** 20
    return ceilings["copy_bandwidth"], ceilings["weights_sized_copy_bandwidth"]


def decoding_cost(model, average_context, encoder_length=0):
    """What one decoding step must move and compute: (weight numbers read once per step, cache
    numbers read per row, matmul FLOPs per row). The weights a step uses are all but the position
    table and, for t5, the encoder (it ran once); each row reads keys and values of every layer over
    its context (t5: plus the cross-attention K/V over the encoder's output); FLOPs: 2 per weight of
    a matmul, plus 4 * layers * context * width for q.k and the weighted sum of v."""
    config = model.config
    # the tied embedding counts once: its matmul is the output head
    weights = model.num_parameters(exclude_positions=True)
    layers = config.n_layer
    if config.arch == "t5":
        # the encoder, its final norm and the cross-attention K/V projections ran once (prefill)
        once = [model.blocks, model.final_norm]
        once += [block.cross_attention.key_value for block in model.decoder_blocks]
        weights -= sum(p.numel() for module in once for p in module.parameters())
        layers = config.n_decoder_layer
    keys = average_context + encoder_length
    cache_values = layers * 2 * keys * config.n_embd  # K and V of every layer and key
    return weights, cache_values, 2 * weights + 2 * cache_values


def decoding_floor(model, bandwidth, batch, average_context, encoder_length=0):
    """tokens/s if a step cost only its memory traffic: its weights read once (shared by the batch's
    rows) and each row's cache, at `bandwidth` bytes/s. The models stay in float32 (autocast casts
    on the fly on a GPU), and the cache takes their dtype, so that is what a step reads."""
    weights, cache_per_row, _ = decoding_cost(model, average_context, encoder_length)
    bytes_per_number = next(model.parameters()).element_size()
    return batch * bandwidth / ((weights + batch * cache_per_row) * bytes_per_number)


def bench_prefix(device, size, repeats, results):
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
            logits = kvcache.prefill(model,
                                     torch.cat([prompt.expand(requests, -1), suffixes], dim=1),
                                     cache)
        for _ in range(new):
            token = logits.argmax(-1, keepdim=True)
            logits = kvcache.forward_with_cache(model, token, cache)[:, -1]

    with torch.no_grad(), autocast_for(device, size["dtype"]):
        separate = median_time(lambda: serve(False), device, repeats)
        shared = median_time(lambda: serve(True), device, repeats)
    results["prefix"] = {"requests": requests, "shared_prompt": shared_length, "own_tokens": own,
                         "new_tokens": new, "separate_ms": separate * 1e3,
                         "shared_ms": shared * 1e3, "speedup": separate / shared}
    return table(f"5. Prefix caching: {requests} requests sharing a {shared_length}-token prompt, "
                 f"each adding {own} tokens and generating {new} (claim D4)",
                 ["serving", "total ms", "speedup"],
                 [["16 separate prefills", f"{separate * 1e3:.1f}", "1.00x"],
                  ["one shared prefill, forked cache", f"{shared * 1e3:.1f}",
                   f"{separate / shared:.2f}x"]])


def bench_turns(device, size, repeats, results):
    """7: a chat, the engineering argument of claim D4 for prefixlm and t5 too. Each of `turns`
    turns adds a user message, then an answer decoded token by token. gpt keeps one cache all
    conversation: a turn computes only its own tokens (kvcache.extend_prompt). prefixlm's history is
    its bidirectional prefix, and a new message changes every state of it: each turn recomputes the
    whole history. t5's encoder reads the history the same way, each turn again; its decoder then
    writes the answer with a fresh cache. ms per turn (medians over repeats of the whole
    conversation) and the tokens each turn pushes through the model."""
    T = size["block_size"]
    turns, user = 8, max(3, T // 20)  # 8 turns of a message and an answer, user tokens each:
                                      # up to 0.8 T in all
    models = {arch: build(arch, size, device).eval() for arch in ("gpt", "prefixlm", "t5")}
    generator = torch.Generator(device=device).manual_seed(3)
    messages = torch.randint(0, 60, (turns, user), device=device, generator=generator)
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    pad = objectives.synthetic_specials(size["vocab"]).pad

    def conversation(arch):
        """One chat; returns [(seconds, tokens computed)] per turn."""
        model, history, out = models[arch], messages[:0].view(1, 0), []
        cache = kvcache.KVCache(model, 1, T)  # gpt: the one cache of the whole conversation
        for k in range(turns):
            if arch != "gpt":
                # a fresh cache each turn, made before the clock starts (as gpt's was)
                cache = kvcache.KVCache(model, 1, T)
            sync()
            t0 = time.perf_counter()
            prompt = torch.cat([history, messages[k:k + 1]], dim=1)
            if arch == "gpt":
                # only what the cache does not hold yet: the last answer token and the message
                logits, computed = kvcache.extend_prompt(model, prompt, cache)
            else:  # the whole history again: prefixlm's prefix, t5's encoder input
                start = torch.full((1, 1), pad, device=device)  # t5's decoder starts from [PAD]
                logits = kvcache.prefill(model, prompt, cache) if arch == "prefixlm" else \
                    kvcache.prefill(model, start, cache, encoder_inputs=prompt)
                computed = prompt.size(1) + (1 if arch == "t5" else 0)
            answer = []
            for _ in range(user):  # the answer, greedy, one token at a time from the cache
                answer.append(logits.argmax(-1, keepdim=True))
                if len(answer) < user:
                    logits = kvcache.forward_with_cache(model, answer[-1], cache)[:, -1]
            computed += user - 1
            history = torch.cat([prompt] + answer, dim=1)
            sync()
            out.append((time.perf_counter() - t0, computed))
        return out

    per_turn = {}
    with torch.no_grad(), autocast_for(device, size["dtype"]):
        for arch in models:
            conversation(arch)  # warm-up
            runs = [conversation(arch) for _ in range(repeats)]
            per_turn[arch] = {"ms": [1e3 * sorted(run[k][0] for run in runs)[len(runs) // 2]
                                     for k in range(turns)],
                              "tokens": [runs[0][k][1] for k in range(turns)]}
    results["turns"] = {"turns": turns, "message_tokens": user, "answer_tokens": user, **per_turn}
    last = {arch: per_turn[arch]["ms"][-1] for arch in per_turn}
    rows = [[k + 1]
            + [f"{per_turn[arch]['ms'][k]:.1f} ({per_turn[arch]['tokens'][k]})"
               for arch in per_turn]
            for k in range(turns)]
    rows.append(["all turns"]
                + [f"{sum(per_turn[arch]['ms']):.1f} ({sum(per_turn[arch]['tokens'])})"
                   for arch in per_turn])
    return table(f"7. A chat of {turns} turns, each a {user}-token message and a {user}-token "
                 "answer: ms per turn (tokens computed). gpt extends one cache; prefixlm "
                 "recomputes its bidirectional prefix and t5 re-encodes the history every turn "
                 f"(claim D4). At turn {turns}: prefixlm {last['prefixlm'] / last['gpt']:.1f}x and "
                 f"t5 {last['t5'] / last['gpt']:.1f}x gpt's time; t5 has {size['n_layer'] // 2} + "
                 f"{size['n_layer'] // 2} layers, the others {size['n_layer']}",
                 ["turn", "gpt, one cache", "prefixlm, prefix recomputed",
                  "t5, history re-encoded"], rows)


def bench_profile(device, size, repeats, results, compiled_rows=True):
    """6: where a step's time goes, decoding and training (a diagnostic; what it showed:
    docs/speed.md)."""
    specials = objectives.synthetic_specials(size["vocab"])
    return profile_section(build("gpt", size, device).eval(),
                           lambda: training_step("gpt", size, device, specials), device, size,
                           results, lambda: autocast_for(device, size["dtype"]), compiled_rows)


def main():
    config = apply_overrides(DEFAULTS, sys.argv[1:])
    chosen = chosen_sections(config["sections"], SECTIONS)
    if config["repeats"] < 1:
        raise UserError("--repeats must be at least 1")
    device = pick_device(config["device"])
    size = sizes(device, config["quick"])
    machine = machine_name(device)
    out = check_out_path(config["out"], device, machine, config["quick"])
    repeats = 2 if config["quick"] else config["repeats"]
    print(f"## bench.py on {device} ({machine}), torch {torch.__version__}; model "
          f"{size['n_layer']} layers x {size['n_embd']} dims, block {size['block_size']}; medians "
          f"of {repeats}")
    results = {"device": device, "machine": machine, "torch": torch.__version__,
               "sizes": {k: str(v) for k, v in size.items()}}
    compiled_rows = config["compile"]
    if compiled_rows:
        check_compiler(device, "the compiled rows (--compile=False skips them)")
        # first-compile times as a user pays them; --quick's times mean nothing, and with torch's
        # own kernel cache a second --quick run takes a third of the first's time
        if not size["quick"]:
            fresh_kernel_cache()
    sections = {"ceilings": bench_ceilings, "prefix": bench_prefix, "turns": bench_turns,
                "profile": lambda *a: bench_profile(*a, compiled_rows=compiled_rows),
                "training": lambda *a: bench_training(*a, compiled_rows=compiled_rows),
                "attention": lambda *a: bench_attention(*a, compiled_rows=compiled_rows),
                "decoding": lambda *a: bench_decoding(*a, compiled_rows=compiled_rows)}
    # every other section is read against ceilings
    todo = ["ceilings"] + [x for x in chosen if x != "ceilings"]
    t0 = time.perf_counter()
    texts, finished = [], []
    try:
        # Ctrl-C or SIGTERM: the sections already finished are written, the message names the others
        with StopSignals(immediate=True):
            for i, section in enumerate(todo):
                elapsed = time.perf_counter() - t0
                print(f"\n[bench] section {i + 1}/{len(todo)}: {section}, "
                      f"{format_duration(elapsed)} so far", flush=True)
                texts.append(sections[section](device, size, repeats, results))
                finished.append(section)
    except KeyboardInterrupt:
        results["not_done"] = not_done = [x for x in todo if x not in finished]
        print(f"\ninterrupted: sections not done: {', '.join(not_done)}", flush=True)
    if "ceilings" in finished and len(finished) > 1:
        texts.append(steadiness(device, size, results))
    results["seconds"] = time.perf_counter() - t0
    header = f"bench.py on {device} ({machine}), torch {torch.__version__}\n"
    if size["quick"]:
        header += f"\n{QUICK_NOTE}\n"
    write_atomically(out, json.dumps(results, indent=1), os.path.splitext(out)[0] + ".md",
                     header + "\n".join(texts) + "\n")
    picture = None
    if config["plots"] and "decoding" in finished:
        picture = plot(results, os.path.splitext(out)[0] + ".png")
    print(f"\nwrote {out}{' and ' + picture if picture else ''} in {results['seconds']:.0f} s")
    if "not_done" in results:
        # stopped: what finished is written, and the exit status says it was a stop
        sys.exit(130)


if __name__ == "__main__":
    run_main(main)
