"""
The single-device benchmark: the chapter's engineering claims as numbers.

    python bench.py            # CUDA if present (GPT-2-small-sized), else MPS/CPU (6 x 384)
    python bench.py --quick    # a tiny smoke run, under a minute on 2 CPU cores

Sections, in the order they run (one markdown table each, numbered as in the tables; the same
figures go to a JSON file, and PNG plots when matplotlib is there):
  1. ceilings     measured matmul rate (bf16 on CUDA, fp32 on CPU) and device copy bandwidth
  2. training     one training step per arch at equal size and tokens: MFU and supervised
                  tokens/s (claim C1)
  3. attention    SDPA with is_causal=True vs the same mask written out, prefix mask, no mask,
                  FlexAttention block masks (compiled; forward only on the CPU), and which
                  kernel ran (claim E2)
  4. decoding     4a per-token latency against context length: KV cache vs recomputation (claim
                  D4); 4b a 240-token generation against the memory-bandwidth floor; 4c, 4d
  5. prefix       16 requests sharing a long prompt: one shared prefill vs 16 separate ones
                  (claim D4)
  7. turns        a chat of 8 turns: gpt extends one cache, prefixlm recomputes its prefix and
                  t5 re-encodes the history every turn (claim D4)
  6. profile      where a step's time goes (torch.profiler), decoding and training, eager and
                  compiled
  and last the steadiness line: the matmul rate measured again, against the first
Diagnostics beside the claims (infra/speed_diagnostics.py): the compiled rows of 2 and 3
(FlexAttention), 4c (compiled decoding at batch 1, 8 and 32 against the floor of each), 4d (against
transformers' generate), 6, and the steadiness line. --compile=False skips the compiled rows and
their compile time. Every timing: warm-up first, device synchronisation before reading the clock,
median of repeats, random inputs; the timing loops, tables and files are infra/bench_report.py.
"""
import contextlib
import sys

# before torch: a Ctrl-C while it loads ends quietly
import infra.quiet_interrupts  # noqa: E402,F401

import torch
import torch.nn.functional as F

import kvcache
import masks
import objectives
import sample  # its samplers: generate (KV cache) and iterative_unmask (bert)
from infra import bench_report as report  # the timing loops, tables and files of the sections
from infra.configurator import run_main
from infra.progress import Progress
from infra.speed_diagnostics import (compiled_decoding_section, compiled_training_row,
                                     flex_attention_rows, hugging_face_section, profile_section,
                                     which_backend)
from infra.timing import copy_bandwidth, matmul_flops_per_second, median_time
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
    return report.ceilings_table(results["ceilings"])


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
        rows.append(report.training_row(arch, data[arch], flops / seconds, peak))
        if compiled_rows and (arch == "gpt" or not size["quick"]):
            # --quick: gpt's row only, to keep it quick
            rows.append(compiled_training_row(model, step, batch, seconds, data[arch], peak,
                                              device, repeats))
    results["training"] = data
    # gpt over bert: supervised tokens/s timed (only where their step times agree: the same size
    # must take about the same time, else the machine was busy) and the supervised share counted
    return report.training_table(data, rows, size)


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
    data = {}
    for name, (mask, is_causal) in variants.items():
        attend = lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask,  # noqa: E731
                                                        is_causal=is_causal)
        seconds = median_time(attend, device, repeats * 4)
        data[name] = {"ms": seconds * 1e3, "backend": which_backend(q, k, v, mask, is_causal)}
    if compiled_rows:
        data.update(flex_attention_rows(device, q, k, v, T, repeats, quick=size["quick"]))
    results["attention"] = data
    return report.attention_table(data, f"B={B}, heads={H}, T={T}, head size={hs}, "
                                        f"{str(size['dtype']).replace('torch.', '')}")


def bench_decoding(device, size, repeats, results, compiled_rows=True):
    """4: what a new token costs. 4a: one decoding step against the context length, against a
    KV cache (gpt, prefixlm, t5: only the new position is computed) and recomputed (gpt: the whole
    context again; bert, which cannot cache, one pass of it): the cache wins as soon as the context
    outgrows the step's fixed cost (claim D4). Then 4b (bench_generation) and the diagnostics 4c,
    4d (infra/speed_diagnostics.py)."""
    T = size["block_size"]
    lengths = [L for L in (32, 64, 128, 256, 512, 1024) if L < T] + [T - 1]
    if T < 64:
        lengths = [16, T // 2, T - 1]
    models = {arch: build(arch, size, device).eval() for arch in ("gpt", "prefixlm", "t5", "bert")}
    generator = torch.Generator(device=device).manual_seed(0)
    ids = torch.randint(0, 60, (1, T), device=device, generator=generator)

    def cached(arch):
        def step_at(L):  # a cache holding the context before position L, then position L alone
            model, cache = models[arch], kvcache.KVCache(models[arch], 1, T)
            if arch == "t5":  # context L: half read by the encoder, half already decoded
                kvcache.prefill(model, ids[:, :L - L // 2], cache, encoder_inputs=ids[:, :L // 2])
            else:
                kvcache.prefill(model, ids[:, :L], cache)
            token, start = ids[:, L:L + 1], cache.length

            def one_step():
                cache.length = start  # rewind: every repeat decodes the same position
                kvcache.forward_with_cache(model, token, cache)
            return one_step
        return step_at

    def recomputed(arch):  # the whole context again; the output head only where a token is read
        model = models[arch]
        return lambda L: lambda: model.logits(model.run_stack(ids[:, :L + 1])[:, -1])

    steps = {"gpt cached": cached("gpt"), "prefixlm cached": cached("prefixlm"),
             "t5 cached": cached("t5"), "gpt recomputed": recomputed("gpt"),
             "bert recomputed (1 pass)": recomputed("bert")}  # timed in this order
    columns = ["gpt cached", "gpt recomputed", "prefixlm cached", "t5 cached",
               "bert recomputed (1 pass)"]  # the table's (and the JSON's) order
    autocast = lambda: autocast_for(device, size["dtype"])  # noqa: E731
    curves = report.time_against_context(steps, lengths, columns, device, repeats, autocast)
    text, crossover = report.latency_table(lengths, curves, size)
    results["decoding"] = {"lengths": lengths, "ms_per_token": curves, "crossover": crossover}
    prompt, new = ids[:, :16], min(240, T - 16)  # batch 1, 16-token prompt, 240 new tokens (fewer
                                                 # in --quick)
    text += bench_generation(models, prompt, new, device, size, repeats, results, autocast)
    if compiled_rows:  # 4c and 4d: diagnostics (infra/speed_diagnostics.py)
        text += compiled_decoding_section(greedy, decoding_floor, decoding_cost, device, size,
                                          repeats, results, models, prompt, new, autocast)
    return text + hugging_face_section(greedy, device, size, repeats, results, prompt, new,
                                       autocast, compiled_rows)


def bench_generation(models, prompt, new, device, size, repeats, results, autocast):
    """4b: whole generations of `new` tokens after `prompt`, batch 1: gpt with the KV cache and
    recomputing (sample.generate, generate_uncached), bert by mask-predict in 16 and 64 passes. Each
    cached token reads every weight and the KV cache once: bandwidth / those bytes bounds tokens/s
    at batch 1 (the floor), unless the CPU's caches hold much of a small model. Token by token
    only: mask-predict reads them once a pass."""
    gpt, mask_id = models["gpt"], objectives.synthetic_specials(size["vocab"]).mask

    def mask_predict(steps):
        x = torch.cat([prompt, torch.full((1, new), mask_id, device=prompt.device)], dim=1)
        sample.iterative_unmask(models["bert"], x, x == mask_id, steps, sample.GREEDY)

    generations = {
        "gpt, KV cache": (lambda: sample.generate(gpt, prompt, new, sample.GREEDY), new),
        "gpt, recomputed": (lambda: sample.generate_uncached(gpt, prompt, new, sample.GREEDY), new),
        **{f"bert mask-predict, {steps} steps": (lambda steps=steps: mask_predict(steps), steps)
           for steps in (16, 64)}}
    run = report.time_generations(generations, new, device, repeats, autocast)
    bandwidth, weights_sized = report.floor_bandwidths(device, size, repeats, results, gpt)
    context = prompt.size(1) + new / 2
    floor = decoding_floor(gpt, bandwidth, 1, context)
    cached_floor = decoding_floor(gpt, weights_sized, 1, context)
    text, speedup = report.generation_table(run, floor, cached_floor, new, prompt.size(1),
                                            results, weights_sized)
    results["decoding"].update(generation=run, bandwidth_floor_tokens_per_s=floor,
                               cache_speedup=speedup)
    return text


def greedy(model, rows, new, compiled=False):
    """sample.generate, greedy, as the diagnostics in infra/ call it (they import no command):
    `rows` (B, P) one prompt per row; t5's: its encoder's input, the decoder starting from 0."""
    prompt = sample.T5Prompt(rows, None, 0) if model.config.arch == "t5" else rows
    return sample.generate(model, prompt, new, sample.GREEDY, compiled=compiled)


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
    return report.prefix_table(results["prefix"])


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
    pad = objectives.synthetic_specials(size["vocab"]).pad

    def cache_for(arch, cache):
        """The cache a turn starts from, made before the clock starts: gpt's one cache of the whole
        conversation; for the others a fresh one each turn."""
        return cache if arch == "gpt" and cache is not None else kvcache.KVCache(models[arch], 1, T)

    def turn(arch, history, message, cache):
        """One turn: the message, then a `user`-token answer, greedy, one token at a time from the
        cache. Returns (the history after it, the tokens it computed)."""
        model, prompt = models[arch], torch.cat([history, message], dim=1)
        if arch == "gpt":
            # only what the cache does not hold yet: the last answer token and the message
            logits, computed = kvcache.extend_prompt(model, prompt, cache)
        else:  # the whole history again: prefixlm's prefix, t5's encoder input
            start = torch.full((1, 1), pad, device=device)  # t5's decoder starts from [PAD]
            logits = kvcache.prefill(model, prompt, cache) if arch == "prefixlm" else \
                kvcache.prefill(model, start, cache, encoder_inputs=prompt)
            computed = prompt.size(1) + (1 if arch == "t5" else 0)
        answer = []
        for _ in range(user):
            answer.append(logits.argmax(-1, keepdim=True))
            if len(answer) < user:
                logits = kvcache.forward_with_cache(model, answer[-1], cache)[:, -1]
        return torch.cat([prompt] + answer, dim=1), computed + user - 1

    per_turn = report.time_conversations(models, messages, turn, cache_for, device, repeats,
                                         lambda: autocast_for(device, size["dtype"]))
    results["turns"] = {"turns": turns, "message_tokens": user, "answer_tokens": user, **per_turn}
    return report.turns_table(per_turn, turns, user, size)


def bench_profile(device, size, repeats, results, compiled_rows=True):
    """6: where a step's time goes, decoding and training (a diagnostic; what it showed:
    docs/speed.md)."""
    specials = objectives.synthetic_specials(size["vocab"])
    return profile_section(build("gpt", size, device).eval(),
                           lambda: training_step("gpt", size, device, specials), device, size,
                           results, lambda: autocast_for(device, size["dtype"]), compiled_rows)


def main():
    # the options, refused in one line where they cannot be honoured; the output path checked now
    config, chosen, device, machine, out = report.options(sys.argv[1:], DEFAULTS, SECTIONS)
    size = sizes(device, config["quick"])
    repeats = 2 if config["quick"] else config["repeats"]
    results = report.begin(device, machine, size, repeats)  # the first line; the JSON's header
    compiled_rows = config["compile"]
    if compiled_rows:  # a C++ compiler on a CPU; compile times as a user's first run pays them
        report.prepare_compiled_rows(device, size)
    sections = {"ceilings": bench_ceilings, "prefix": bench_prefix, "turns": bench_turns,
                "profile": lambda *a: bench_profile(*a, compiled_rows=compiled_rows),
                "training": lambda *a: bench_training(*a, compiled_rows=compiled_rows),
                "attention": lambda *a: bench_attention(*a, compiled_rows=compiled_rows),
                "decoding": lambda *a: bench_decoding(*a, compiled_rows=compiled_rows)}
    # every other section is read against ceilings
    todo = ["ceilings"] + [x for x in chosen if x != "ceilings"]
    # Ctrl-C or SIGTERM: the sections already finished are written, the message names the others
    texts, finished = report.run_sections(todo, sections, device, size, repeats, results)
    report.write(out, results, texts, finished, device, machine, size, config["plots"])


if __name__ == "__main__":
    run_main(main)
