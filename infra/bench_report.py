"""
bench.py's measurement plumbing, kept out of the chapter file: the timing loops behind its sections, the tables they
print, and the run of the sections with the files it writes. bench.py keeps what each section measures and why;
here is how the clock is read around it and how the figures are laid out.

    ceilings_table(ceilings)                    1's table
    training_row, training_table                2's rows and table, with claim C1's ratios
    attention_table(data, shapes)               3's table
    time_against_context(steps, lengths, ...)   4a: ms per call of each step at each context length
    latency_table(lengths, curves, size)        4a's table: where the cache starts to win (claim D4)
    time_generations(generations, new, ...)     4b: tokens/s of whole generations
    floor_bandwidths(device, size, ...)         4b's bandwidths: the copy measured again, a weights-sized copy
    generation_table(run, floors, ...)          4b's table, gpt's samplers against the bandwidth floor
    prefix_table(data)                          5's table
    time_conversations(archs, messages, ...)    7: ms and tokens computed per turn of a chat, medians over repeats
    turns_table(per_turn, turns, user, size)    7's table
    options(argv, DEFAULTS, SECTIONS)           the command line, each refusal one line
    begin(device, machine, size, repeats)       the run's first line, and the results dict the sections fill
    prepare_compiled_rows(device, size)         a C++ compiler where needed, an empty kernel cache
    run_sections(todo, sections, ...)           the sections in turn; Ctrl-C or SIGTERM keeps the finished ones
    write(out, results, texts, ...)             the JSON, the markdown beside it and the plot

Every timing as in bench.py: warm-up first, the device synchronised before the clock is read, medians of repeats.
"""
import json
import os
import sys
import time

import torch

from infra.configurator import QUICK_NOTE, UserError, apply_overrides, check_compiler, pick_device
from infra.progress import Progress, StopSignals, format_duration, write_atomically
from infra.speed_diagnostics import check_out_path, chosen_sections, fresh_kernel_cache, plot, steadiness, table
from infra.timing import copy_bandwidth, machine_name, median_time, mfu_text, of_floor_text


# ------------------------------------------------------------------- 1, 2 and 3: ceilings, training, attention

def ceilings_table(ceilings):
    """1's table: the matmul rate and the copy bandwidth every later figure is read against."""
    return table("1. Ceilings of this machine", ["measure", "value"],
                 [[f"matmul ({ceilings['dtype'].replace('torch.', '')})",
                   f"{ceilings['matmul_flops'] / 1e12:.3f} TFLOP/s"],
                  ["device copy bandwidth", f"{ceilings['copy_bandwidth'] / 1e9:.1f} GB/s"]])


def training_row(arch, figures, flops_per_second, peak):
    """2's row of one arch's eager step (figures: bench_training's)."""
    return [arch, figures["objective"], "eager", f"{figures['parameters'] / 1e6:.2f}M", f"{figures['ms_per_step']:.1f}",
            f"{figures['tokens_per_s']:,.0f}", mfu_text(flops_per_second, peak),
            f"{100 * figures['supervised_fraction']:.1f}%", f"{figures['supervised_per_s']:,.0f}",
            f"{figures['supervised_per_tflop']:,.0f}", "-", "1.00x"]


def training_table(data, rows, size):
    """2's table, titled with claim C1's ratios of gpt over bert, which `data` gains: supervised tokens/s (timed),
    the supervised share (counted from the batches: exact) and bert's step time over gpt's. The same model size must
    take about the same time per step; if not, the machine was busy and the timed ratio says more about the load than
    about claim C1 (the counted share does not depend on it), and the title says so."""
    ratio = data["gpt"]["supervised_per_s"] / data["bert"]["supervised_per_s"]
    share = data["gpt"]["supervised_fraction"] / data["bert"]["supervised_fraction"]
    step_ratio = data["bert"]["ms_per_step"] / data["gpt"]["ms_per_step"]
    data.update(gpt_over_bert_supervised=ratio, gpt_over_bert_supervised_share=share, bert_over_gpt_step=step_ratio)
    steady = abs(step_ratio - 1) <= 0.3
    c1 = f"gpt / bert supervised tokens/s = {ratio:.2f}x"
    if not steady:
        c1 = f"gpt / bert supervised tokens/s not measured: their step times differ {step_ratio:.2f}x, a busy machine"
    return table(f"2. Training step per architecture (batch {size['batch']} x {size['block_size']} "
                 f"tokens; {c1}; supervised share {share:.2f}x, claim C1)",
                 ["arch", "objective", "step", "params", "ms/step", "tokens/s", "MFU", "supervised",
                  "supervised tok/s", "supervised tok/TFLOP", "compile s", "vs eager"], rows)


def attention_table(data, shapes):
    """3's table: ms per call of each variant (a NaN: not timed) and its ratio to the is_causal fast path, and the
    SDPA kernel that ran."""
    fast = data["causal, is_causal=True (fast path)"]["ms"]
    rows = []
    for name, figures in data.items():
        timed = figures["ms"] == figures["ms"]  # not NaN
        rows.append([name, f"{figures['ms']:.3f}" if timed else "-", f"{figures['ms'] / fast:.2f}x" if timed else "-",
                     figures["backend"]])
    return table(f"3. Attention kernels ({shapes}; claim E2)", ["variant", "ms/call", "vs is_causal", "backend"], rows)


# ----------------------------------------------------------------------------- 4a and 4b: decoding

def time_against_context(steps, lengths, columns, device, repeats, autocast):
    """4a's clock: for each context length L (in order), each of `steps` ({name: step_at(L)}, timed in that order;
    step_at(L) prepares and returns the call to time) timed as a median of repeats, without gradients and under the
    benchmark's precision. Returns {name: [ms at each length]}, in the order of `columns`."""
    curves = {name: [] for name in steps}
    with torch.no_grad(), autocast():
        progress = Progress("[bench] decoding, context lengths", len(lengths))
        for done, L in enumerate(lengths):
            progress.update(done)
            for name, step_at in steps.items():
                curves[name].append(median_time(step_at(L), device, repeats) * 1e3)
    return {name: curves[name] for name in columns}


def latency_table(lengths, curves, size):
    """4a's table, and where the cached gpt first beats the recomputing one (the crossover, None if nowhere).
    Returns (text, crossover)."""
    cached, full = curves["gpt cached"], curves["gpt recomputed"]
    crossover = next((L for L, cached_ms, full_ms in zip(lengths, cached, full) if cached_ms < full_ms), None)
    where = f"from context {crossover}" if crossover else "nowhere in the measured range"
    if crossover == lengths[0]:
        where = f"at every measured context (the crossover lies below {lengths[0]})"
    rows = [[L] + [f"{curves[name][i]:.2f}" for name in curves] for i, L in enumerate(lengths)]
    text = table("4a. Decoding: ms per new token against context length (cached gpt is faster "
                 f"{where}; {full[-1] / cached[-1]:.1f}x at {lengths[-1]}; t5 has "
                 f"{size['n_layer'] // 2} decoder layers, the others {size['n_layer']}; "
                 "claim D4)",
                 ["context"] + list(curves), rows)
    return text, crossover


def time_generations(generations, new, device, repeats, autocast):
    """4b's clock: each of `generations` ({name: (generate(), forward passes)}) timed whole, a median of
    max(1, repeats // 2) after one warm-up. Returns {name: {"tokens_per_s", "forward_passes"}} for `new` tokens."""
    run = {}
    with torch.no_grad(), autocast():
        for name, (generate, passes) in generations.items():
            seconds = median_time(generate, device, max(1, repeats // 2), warmup=1)
            run[name] = {"tokens_per_s": new / seconds, "forward_passes": passes}
    return run


def floor_bandwidths(device, size, repeats, results, model):
    """The two bandwidths 4b's and 4c's decoding floors are read at: a copy far larger than the CPU's caches,
    measured again here (the higher of this and the start's is kept: a busy moment cannot lower a floor), and a copy
    of a buffer the size of `model`'s weights (a CPU whose caches hold much of them reads them faster than from
    memory)."""
    ceilings = results["ceilings"]
    ceilings["copy_bandwidth_measured"].append(copy_bandwidth(device, 32 if size["quick"] else 256, repeats))
    ceilings["copy_bandwidth"] = max(ceilings["copy_bandwidth_measured"])
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    ceilings["weights_sized_copy_bandwidth"] = copy_bandwidth(device, max(1, round(weight_bytes / 2 ** 20)), repeats)
    ceilings["weights_sized_copy_megabytes"] = weight_bytes / 2 ** 20
    return ceilings["copy_bandwidth"], ceilings["weights_sized_copy_bandwidth"]


def generation_table(run, floor, cached_floor, new, prompt_length, results, weights_sized):
    """4b's table: each generation's tokens/s and forward passes, gpt's against the bandwidth floors. Returns
    (text, the cache's speedup)."""
    speedup = run["gpt, KV cache"]["tokens_per_s"] / run["gpt, recomputed"]["tokens_per_s"]
    rows = [[name, f"{figures['tokens_per_s']:,.1f}", figures["forward_passes"],
             of_floor_text(figures["tokens_per_s"], floor, cached_floor) if name.startswith("gpt") else "-"]
            for name, figures in run.items()]
    rows.append(["bandwidth floor (weights and KV cache read once per token from memory)", f"{floor:,.1f}", "-",
                 "100%"])
    rows.append(["the same at a weights-sized copy's bandwidth (what the CPU's caches can serve)",
                 f"{cached_floor:,.1f}", "-", f"{100 * cached_floor / floor:.1f}%"])
    measured = ", ".join(f"{b / 1e9:.1f}" for b in results["ceilings"]["copy_bandwidth_measured"])
    text = table(f"4b. Generating {new} tokens from a {prompt_length}-token prompt, batch 1 (cache speedup "
                 f"{speedup:.1f}x); floors at the copy bandwidth measured at the start and before "
                 f"these rows ({measured} GB/s: the higher kept), and at a copy of a buffer the "
                 f"size of gpt's weights ({weights_sized / 1e9:.1f} GB/s)",
                 ["sampler", "tokens/s", "forward passes", "of bandwidth floor"], rows)
    return text, speedup


# ----------------------------------------------------------------------------- 5 and 7: prefix caching, a chat

def prefix_table(data):
    """5's table: 16 separate prefills against one shared prefill, forked."""
    separate, shared, speedup = data["separate_ms"], data["shared_ms"], data["speedup"]
    return table(f"5. Prefix caching: {data['requests']} requests sharing a {data['shared_prompt']}-token prompt, "
                 f"each adding {data['own_tokens']} tokens and generating {data['new_tokens']} (claim D4)",
                 ["serving", "total ms", "speedup"],
                 [["16 separate prefills", f"{separate:.1f}", "1.00x"],
                  ["one shared prefill, forked cache", f"{shared:.1f}", f"{speedup:.2f}x"]])


def time_conversations(archs, messages, turn, cache_for, device, repeats, autocast):
    """7's clock: for each arch a warm-up chat, then `repeats` chats of len(messages) turns. turn(arch, history,
    message, cache) runs one turn and returns (the history after it, tokens computed); cache_for(arch, cache) gives
    the cache a turn starts from (made before the clock starts). Each turn is timed on its own, the device
    synchronised around it. Returns {arch: {"ms": the median of each turn, "tokens": each turn's tokens}}."""
    sync = torch.cuda.synchronize if str(device).startswith("cuda") else (lambda: None)
    turns = len(messages)

    def conversation(arch):
        """One chat; returns [(seconds, tokens computed)] per turn."""
        history, cache, out = messages[:0].view(1, 0), None, []
        for k in range(turns):
            cache = cache_for(arch, cache)
            sync()
            t0 = time.perf_counter()
            history, computed = turn(arch, history, messages[k:k + 1], cache)
            sync()
            out.append((time.perf_counter() - t0, computed))
        return out

    per_turn = {}
    with torch.no_grad(), autocast():
        for arch in archs:
            conversation(arch)  # warm-up
            runs = [conversation(arch) for _ in range(repeats)]
            per_turn[arch] = {"ms": [1e3 * sorted(run[k][0] for run in runs)[len(runs) // 2] for k in range(turns)],
                              "tokens": [runs[0][k][1] for k in range(turns)]}
    return per_turn


def turns_table(per_turn, turns, user, size):
    """7's table: ms per turn (tokens computed) of each arch, and the whole chat."""
    last = {arch: per_turn[arch]["ms"][-1] for arch in per_turn}
    rows = [[k + 1] + [f"{per_turn[arch]['ms'][k]:.1f} ({per_turn[arch]['tokens'][k]})" for arch in per_turn]
            for k in range(turns)]
    rows.append(["all turns"]
                + [f"{sum(per_turn[arch]['ms']):.1f} ({sum(per_turn[arch]['tokens'])})" for arch in per_turn])
    return table(f"7. A chat of {turns} turns, each a {user}-token message and a {user}-token "
                 "answer: ms per turn (tokens computed). gpt extends one cache; prefixlm "
                 "recomputes its bidirectional prefix and t5 re-encodes the history every turn "
                 f"(claim D4). At turn {turns}: prefixlm {last['prefixlm'] / last['gpt']:.1f}x and "
                 f"t5 {last['t5'] / last['gpt']:.1f}x gpt's time; t5 has {size['n_layer'] // 2} + "
                 f"{size['n_layer'] // 2} layers, the others {size['n_layer']}",
                 ["turn", "gpt, one cache", "prefixlm, prefix recomputed", "t5, history re-encoded"], rows)


# ----------------------------------------------------------------------------- the run and its files

def options(argv, defaults, sections):
    """bench.py's command line: (config, the chosen sections, device, machine name, the JSON path, checked writable
    now rather than after the run). Each refusal is one line."""
    config = apply_overrides(defaults, argv)
    chosen = chosen_sections(config["sections"], sections)
    if config["repeats"] < 1:
        raise UserError("--repeats must be at least 1")
    device = pick_device(config["device"])
    machine = machine_name(device)
    return config, chosen, device, machine, check_out_path(config["out"], device, machine, config["quick"])


def begin(device, machine, size, repeats):
    """Print the run's first line; returns the results dict the sections fill (its header: the machine, the sizes)."""
    print(f"## bench.py on {device} ({machine}), torch {torch.__version__}; model "
          f"{size['n_layer']} layers x {size['n_embd']} dims, block {size['block_size']}; medians "
          f"of {repeats}")
    return {"device": device, "machine": machine, "torch": torch.__version__,
            "sizes": {k: str(v) for k, v in size.items()}}


def prepare_compiled_rows(device, size):
    """Before the compiled rows: a C++ compiler where the CPU needs one (else one line now), and first-compile times
    as a user pays them: an empty kernel cache (not for --quick: its times mean nothing, and with torch's own kernel
    cache a second --quick run takes a third of the first's time)."""
    check_compiler(device, "the compiled rows (--compile=False skips them)")
    if not size["quick"]:
        fresh_kernel_cache()


def run_sections(todo, sections, device, size, repeats, results):
    """Each section of `todo` in turn (sections[name](device, size, repeats, results) returns its text), then the
    steadiness line. Ctrl-C or SIGTERM: the sections already finished are kept, results["not_done"] names the
    others. Returns (texts, the names of the finished sections); results["seconds"] is the run's time."""
    t0 = time.perf_counter()
    texts, finished = [], []
    try:
        with StopSignals(immediate=True):
            for i, section in enumerate(todo):
                elapsed = time.perf_counter() - t0
                print(f"\n[bench] section {i + 1}/{len(todo)}: {section}, {format_duration(elapsed)} so far",
                      flush=True)
                texts.append(sections[section](device, size, repeats, results))
                finished.append(section)
    except KeyboardInterrupt:
        results["not_done"] = not_done = [x for x in todo if x not in finished]
        print(f"\ninterrupted: sections not done: {', '.join(not_done)}", flush=True)
    if "ceilings" in finished and len(finished) > 1:
        texts.append(steadiness(device, size, results))
    results["seconds"] = time.perf_counter() - t0
    return texts, finished


def write(out, results, texts, finished, device, machine, size, plots):
    """The JSON at `out` and the markdown beside it, both or neither; the plot of 4a when decoding finished (and
    matplotlib is there). A stopped run (results["not_done"]) ends with status 130 after writing."""
    header = f"bench.py on {device} ({machine}), torch {torch.__version__}\n"
    if size["quick"]:
        header += f"\n{QUICK_NOTE}\n"
    write_atomically(out, json.dumps(results, indent=1), os.path.splitext(out)[0] + ".md",
                     header + "\n".join(texts) + "\n")
    picture = None
    if plots and "decoding" in finished:
        picture = plot(results, os.path.splitext(out)[0] + ".png")
    print(f"\nwrote {out}{' and ' + picture if picture else ''} in {results['seconds']:.0f} s")
    if "not_done" in results:
        # stopped: what finished is written, and the exit status says it was a stop
        sys.exit(130)
