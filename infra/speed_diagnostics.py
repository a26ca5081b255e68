"""
bench.py's diagnostics: how fast our cached decoding is next to another implementation of the same model (and our
masks next to FlexAttention's block masks), what compiling the decoding step buys against the bandwidth floor, and
where a decoding or training step's time goes, with the machine's steadiness over the run. bench.py keeps the
chapter's measurements; its section 3 (the FlexAttention rows), 4c, 4d and 6 come from here, as tables.

    against_hugging_face(generate, size, prompt, ...) tokens/s of our generate and of transformers' generate
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
import atexit
import os
import shutil
import tempfile
from contextlib import nullcontext

import torch
import torch.nn.functional as F

import kvcache
import masks
from infra import decode_layout
from infra.progress import Progress
from infra.configurator import QUICK_OUTPUT, UserError
from infra.progress import check_writable
from infra.timing import matmul_flops_per_second, median_time, mfu_text, of_floor_text, time_once
from infra.plots import pyplot, save


# ----------------------------------------------------------------------------- tables

def table(title, header, rows):
    lines = [f"\n### {title}\n", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    text = "\n".join(lines)
    print(text, flush=True)
    return text


# ----------------------------------------------------------------------------- against transformers' generate

def against_hugging_face(generate, size, prompt, new, device, repeats, autocast=nullcontext, compiled=True):
    """Our cached greedy decoding (`generate(model, rows, new, compiled)`: bench.greedy, sample.py's, passed in) against Hugging Face transformers' `generate` on the same model: a GPT-2 built by
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
    samplers = {"ours, KV cache (sample.generate)": lambda: generate(ours, prompt, new),
                reference: lambda: theirs.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=new,
                                                   min_new_tokens=new, do_sample=False, use_cache=True)}
    if compiled:
        samplers["ours, KV cache, compiled step"] = lambda: generate(ours, prompt, new, compiled=True)
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

def flex_attention_rows(device, q, k, v, T, repeats, quick=False):
    """FlexAttention (compiled; CUDA and, forward only, CPU): the masks as block masks, so that blocks a mask
    hides entirely are skipped rather than computed and thrown away. Each row is checked against SDPA with the
    same mask before it is timed. Whether the backward pass (training) runs is reported too (not on a CPU so far:
    docs/speed.md). quick: the causal block mask alone (each mask compiles for seconds)."""
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
    if quick:
        rules = {"FlexAttention, causal block mask": rules["FlexAttention, causal block mask"]}

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
    cache rewound before each, as bench.py's 4a does), at batch 1 and 32: eager with nn.Linear's weights, eager with
    the weights prepacked as sample.py decodes (infra/decode_layout.py), and compiled: {case: figures}."""
    T = ids.size(1)
    modes = (("eager", kvcache.decode_step), ("eager, prepacked weights", kvcache.decode_step)) + \
        ((("compiled", decode_layout.compiled_decode_step(model)),) if compiled else ())
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

            with decode_layout.prepacked(model) if "prepacked" in mode else nullcontext():  # sample.py's eager
                data[f"batch {batch}, {mode}"] = profile_steps(decode_one, device, steps, top, warmup=3 * steps)
    return data


# ----------------------------------------------------------------------------- bench.py's sections 4c, 4d and 6, and the machine's steadiness

def compiled_training_row(model, step, batch, eager_seconds, figures, peak, device, repeats):
    """bench.py's section 2, compiled (train.py --compile=True): the same step through torch.compile (forward and
    backward compiled; the optimizer stays the fused AdamW). What compiling can remove is the non-matmul share of
    the step. Adds figures["compiled"]; returns the table row."""
    flops, arch = model.training_flops(batch), model.config.arch
    processed, supervised = batch.processed_positions(), batch.supervised_positions()
    compiled = torch.compile(model)
    first = time_once(lambda: step(compiled), device)
    seconds = median_time(lambda: step(compiled), device, repeats, warmup=1)
    figures["compiled"] = after = {"ms_per_step": seconds * 1e3, "mfu": flops / seconds / peak,
                                   "compile_s": max(0.0, first - seconds), "speedup": eager_seconds / seconds}
    return [arch, figures["objective"], "compiled", "", f"{after['ms_per_step']:.1f}", f"{processed / seconds:,.0f}",
            mfu_text(flops / seconds, peak), "", f"{supervised / seconds:,.0f}", "", f"{after['compile_s']:.0f}",
            f"{after['speedup']:.2f}x"]


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


def hugging_face_section(generate, device, size, repeats, results, prompt, new, autocast, compiled_rows):
    """bench.py's 4d: our cached greedy decoding (`generate`, sample.py's) against Hugging Face transformers'
    `generate` on the same GPT-2-layout model (their random weights loaded into our modules), batch 1. The two
    must write the same tokens (greedy), else the row says so. Skipped where transformers is not installed."""
    compiled_rows = compiled_rows and not size["quick"]  # --quick: 4c compiled this step
    data = against_hugging_face(generate, size, prompt, new, device, max(1, repeats // 2), autocast, compiled_rows)
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




MODES = (("eager, nn.Linear's layout", False), ("eager", False), ("compiled", True))  # 4c's steps, in this order


def steps_to_repay(compile_seconds, eager_tokens_per_s, compiled_tokens_per_s, rows):
    """Decoding steps of `rows` rows after which compiling has paid for itself: its first call's extra time over
    what each step saves; None where the compiled step saves nothing (the figures behind decode_layout.compile_pays)."""
    saved = rows / eager_tokens_per_s - rows / compiled_tokens_per_s  # seconds a step
    return compile_seconds / saved if saved > 0 else None


def compiled_decoding_section(generate, decoding_floor, decoding_cost, device, size, repeats, results, models,
                              prompt, new, autocast):
    """bench.py's 4c: eager vs torch.compile'd decoding step (decode_layout.compiled_decode_step), gpt at batch 1, 8 and
    32 from one shared prefill (sample.py --num_samples), prefixlm and t5 at batch 1, each against bench.py's
    `decoding_floor`. Compilation is paid once per process and per batch-size regime (1, then any larger): the
    first generation's extra time is reported as compile time."""
    bandwidth, matmul_rate = results["ceilings"]["copy_bandwidth"], results["ceilings"]["matmul_flops"]
    weights_sized = results["ceilings"]["weights_sized_copy_bandwidth"]  # (bench_report.floor_bandwidths, 4b)
    cases = [("gpt", 1), ("gpt", 8), ("gpt", 32), ("prefixlm", 1), ("t5", 1)]
    if size["quick"]:  # the rows run, the figures mean nothing (batch > 1 compiles again: tests/test_kvcache.py)
        cases = [("gpt", 1), ("t5", 1)]
    t5_inputs = prompt[:, :8]
    rows, data = [], {}
    max_rows = decode_layout.COMPILED_MAX_ROWS  # sample.py's, restored after each measurement
    compile_seconds = {}  # (arch, more than one row) -> the first call's extra time of that graph
    progress = Progress("[bench] compiled decoding", len(MODES) * len(cases))
    with torch.no_grad(), autocast():
        for done, (arch, batch) in enumerate(cases):
            model = models[arch]
            # one prompt a row (t5: its encoder's input)
            prompts = t5_inputs.expand(batch, -1) if arch == "t5" else prompt.expand(batch, -1)
            context = (1 if arch == "t5" else prompt.size(1)) + new / 2  # average context of the generation
            encoder_length = t5_inputs.size(1) if arch == "t5" else 0
            floor = decoding_floor(model, bandwidth, batch, context, encoder_length)
            cached_floor = decoding_floor(model, weights_sized, batch, context, encoder_length)
            compute_bound = matmul_rate / decoding_cost(model, context, encoder_length)[2]  # each row's matmuls, peak
            if done == 0 or cases[done - 1][0] != arch:
                torch._dynamo.reset()  # a new model: its own graphs (compiled graphs per code object are limited)
            for step, (mode, compiled) in enumerate(MODES):
                progress.update(len(MODES) * done + step)

                def generation():
                    generate(model, prompts, new, compiled=compiled)

                decode_layout.USE_PREPACKED = mode != "eager, nn.Linear's layout"
                decode_layout.COMPILED_MAX_ROWS = None  # the compiled step at every batch, where sample.py would not
                try:
                    first = time_once(generation, device)  # compiles on its first call (for a new batch regime)
                    seconds = median_time(generation, device, max(1, repeats // 2), warmup=0)
                finally:
                    decode_layout.USE_PREPACKED, decode_layout.COMPILED_MAX_ROWS = True, max_rows
                tokens_per_s = batch * new / seconds
                data[f"{arch}, batch {batch}, {mode}"] = figures = {
                    "tokens_per_s": tokens_per_s, "floor_tokens_per_s": floor, "of_floor": tokens_per_s / floor,
                    "weights_sized_floor_tokens_per_s": cached_floor,
                    "compute_bound_tokens_per_s": compute_bound, "first_call_extra_s": max(0.0, first - seconds)}
                rows.append([arch, batch, mode, f"{tokens_per_s:,.1f}", f"{floor:,.1f}",
                             of_floor_text(tokens_per_s, floor, cached_floor), f"{cached_floor:,.1f}",
                             f"{compute_bound:,.0f}",
                             f"{figures['first_call_extra_s']:.1f}"])
            plain = data[f"{arch}, batch {batch}, {MODES[0][0]}"]
            eager_figures, compiled_figures = (data[f"{arch}, batch {batch}, {mode}"] for mode in ("eager", "compiled"))
            # batch 32 reuses batch 8's graph: the compile it is charged is batch 8's. (A generation past the
            # context compiles one more graph, for its last position, which these never reach: compiled_rows.txt)
            compile_s = compile_seconds.setdefault((arch, batch > 1), compiled_figures["first_call_extra_s"])
            repaid = steps_to_repay(compile_s, eager_figures["tokens_per_s"], compiled_figures["tokens_per_s"], batch)
            compiled_figures["compile_repaid_after_steps"] = repaid
            for back, (mode, _) in enumerate(MODES):
                figures = data[f"{arch}, batch {batch}, {mode}"]
                figures["speedup_over_plain_eager"] = figures["tokens_per_s"] / plain["tokens_per_s"]
                rows[back - len(MODES)].append(f"{figures['speedup_over_plain_eager']:.2f}x")
                rows[back - len(MODES)].append("-" if mode != "compiled" else "never: slower than eager"
                                               if repaid is None else f"{repaid:,.0f}")
    results["compiled_decoding"] = data
    return table(f"4c. Compiled decoding: {new} greedy tokens per row from a {prompt.size(1)}-token prompt (t5: an "
                 f"8-token encoder input): eager with nn.Linear's weight layout, eager as sample.py decodes (the "
                 f"weights prepacked for the CPU's BLAS, infra/decode_layout.py) and the torch.compile'd step "
                 f"(decode_layout.compiled_decode_step); floor = weights once per step + each row's KV cache, at the "
                 f"copy bandwidth of 4b (from memory), and at the bandwidth of a copy the size of gpt's weights (the "
                 f"CPU's caches serving them); the compiled step is measured at every batch, also where sample.py "
                 f"decodes eagerly (on a CPU, more than {max_rows} rows: decode_layout.COMPILED_MAX_ROWS); its "
                 f"compile is repaid after (first-call extra s) / (s a step saved against eager) steps (batch 32 "
                 f"reuses batch 8's graph)",
                 ["arch", "batch", "step", "tokens/s", "floor tokens/s", "of floor", "floor, weights-sized copy",
                  "compute bound tokens/s",
                  "first-call extra s (compile)", "vs nn.Linear's layout", "compile repaid after (steps)"], rows)




def profile_section(model, training_step, device, size, results, autocast, compiled_rows=True):
    """bench.py's 6: where a step's time goes (what it showed: docs/speed.md): torch.profiler around 32 cached gpt
    decoding steps of `model` at the middle of the context, batch 1 and 32, and around 3 gpt training steps
    (`training_step()` -> (model, step, batch), bench.py's), eager and compiled; the operators by their own time."""
    compiled_rows = compiled_rows and not size["quick"]  # --quick: sections 2 and 4c compiled these steps
    generator = torch.Generator(device=device).manual_seed(0)
    ids = torch.randint(0, 60, (1, size["block_size"]), device=device, generator=generator)
    data = {f"decoding, {case}": figures for case, figures in
            profile_decoding(model, ids, device, autocast, compiled_rows, label="bench profile").items()}
    model, step, _ = training_step()
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




def steadiness(device, size, results):
    """The matmul rate again, at the end: every figure above is read against the first measurement, so a machine
    whose speed changed during the run (other work on it) makes them unreliable, and the file says so."""
    quick = size["quick"]
    before = results["ceilings"]["matmul_flops"]
    after = matmul_flops_per_second(device, size["dtype"], size=512 if quick else None, seconds=0.2 if quick else 1.0)
    results["ceilings"]["matmul_flops_at_end"] = after
    line = f"matmul rate at the start {before / 1e12:.3f}, at the end {after / 1e12:.3f} TFLOP/s"
    copies = results["ceilings"]["copy_bandwidth_measured"]
    if len(copies) > 1:  # (bench_report.floor_bandwidths: the decoding floors read the higher)
        line += f"; copy bandwidth at the start {copies[0] / 1e9:.1f}, before the floors {copies[-1] / 1e9:.1f} GB/s"
    if abs(after / before - 1) > 0.3:
        line = f"**Unsteady machine: {line}; the figures above are not reliable (other work was running).**"
    else:
        line = f"Steady machine: {line}."
    print("\n" + line, flush=True)
    return "\n" + line


def fresh_kernel_cache():
    """Compile times as a user's first run pays them: an empty cache of compiled kernels, removed at exit (unless
    TORCHINDUCTOR_CACHE_DIR names one already)."""
    if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = kernel_cache = tempfile.mkdtemp(prefix="bench-inductor-")
        atexit.register(shutil.rmtree, kernel_cache, ignore_errors=True)


def plot(results, path):
    plt = pyplot()
    if plt is None:
        return None
    decoding = results["decoding"]
    fig, ax = plt.subplots(figsize=(6, 4))
    for k, (name, values) in enumerate(decoding["ms_per_token"].items()):  # each its marker and dash: lines
        ax.plot(decoding["lengths"], values, marker="os^Dv"[k % 5], linestyle=("-", "--", "-.", ":")[k % 4],
                markersize=5, label=name, alpha=0.85)  # that share values both show (gpt and prefixlm cached)
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("ms per new token")
    ax.set_title("Decoding cost against context (claim D4)")
    ax.legend()
    fig.tight_layout()
    save(fig, path, dpi=120)
    return path


def chosen_sections(text, sections):
    """bench.py --sections: "all", or a comma-separated list of section names; one line for anything else."""
    names = [x.strip() for x in text.split(",")]
    chosen = sections if names == ["all"] else tuple(names)
    if "" in chosen:
        raise UserError(f"--sections={text!r} has an empty name: give all, or a comma-separated list of "
                        f"{', '.join(sections)}")
    if "all" in chosen:
        raise UserError(f"--sections={text}: all means every section, give it alone or list sections")
    unknown = [repr(x) for x in chosen if x not in sections]
    if unknown:
        raise UserError(f"--sections={text}: unknown section {', '.join(unknown)}: give all, or a comma-separated "
                        f"list of {', '.join(sections)}")
    return chosen


def check_out_path(out, device, machine, quick):
    """--out is the JSON file (by default results/bench/bench-<device>.json, one file per CPU kind: bench-cpu-amd on
    an AMD CPU; --quick: in out-quick/bench/, not committed); the markdown and PNG go beside it. Find out now, not
    after the run, if one of them cannot be written. Returns the JSON path."""
    if not out:
        name = "cuda" if device.startswith("cuda") else "cpu-amd" if "AMD" in machine else device
        folder = os.path.join(QUICK_OUTPUT, "bench") if quick else os.path.join("results", "bench")
        out = os.path.join(folder, f"bench-{name}{'-quick' if quick else ''}.json")
    if not out.endswith(".json"):
        raise UserError(f"--out={out} must name a .json file (the markdown and PNG are written beside it)")
    base = os.path.splitext(out)[0]
    check_writable([out, base + ".md", base + ".png"], "--out")
    return out
