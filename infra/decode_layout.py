"""
Decoding speed, kept out of the chapter files: a decode-time layout of the weights for the eager cached step on a
CPU (`prepacked`), and the same step compiled (`compiled_decode_step`, below).

A cached decoding step is a handful of vector-matrix products: every weight is read once per token, and the step
takes as long as those reads. How fast a CPU's BLAS reads a weight depends on its layout. Measured on a 2-core AMD
EPYC (torch 2.13.0, MKL 2024.2; docs/speed.md): F.linear on a weight stored (out, in), as nn.Linear stores it,
reads it at about a third of the copy bandwidth, while oneDNN's own blocked layout (a one-off reorder of the
weight, "prepacking") reads it at about two thirds, at batch 1, 8 and 32 alike.

    with prepacked(model):      # every large nn.Linear of the model computes from a prepacked copy of its weight
        ...decode...            # same values; products equal up to float rounding (tests/test_kvcache.py)

Nothing changes in the modules a reader reads: the forward of each nn.Linear is replaced for the duration of the
block and restored after it. Used only where it applies: float32 weights on the CPU, no autocast, a torch built
with oneDNN; anywhere else the block runs the plain layout. sample.generate decodes inside it (its one call for
speed, `fastest_decoding_step`) unless the compiled step runs (the compiler cannot lower a prepacked weight; it has
its own freezing path); with more than COMPILED_MAX_ROWS rows on a CPU a compiled generation decodes inside it too.
bench.py's 4c sets USE_PREPACKED = False for the plain layout's row, beside it.
"""
import contextlib
import functools
import warnings
import weakref

import torch
import torch.nn as nn

from kvcache import decode_step

USE_PREPACKED = True
BATCH_HINT = 8  # the reorder asks the batch size it will serve; 8 measured best for batch 1, 8 and 32 alike
# Below this many weight elements oneDNN's call costs more than the read it saves: measured on the AMD EPYC, a
# 128 x 128 weight 0.26x as fast prepacked at batch 1 (0.66x at 32), 256 x 256 1.27x (1.50x), 1536 x 384 2.26x
# (1.97x), 3072 x 768 2.48x (1.80x), each with enough distinct weights to overflow the caches
MIN_ELEMENTS = 256 * 256


def applies(model):
    """Whether the prepacked layout can serve this model here (see the module's docstring)."""
    weight = model.lm_head.weight
    return (USE_PREPACKED and weight.device.type == "cpu" and weight.dtype == torch.float32
            and not torch.is_autocast_enabled("cpu") and torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_reorder_linear_weight"))


@contextlib.contextmanager
def prepacked(model):
    """Within the block, every nn.Linear of `model` with at least MIN_ELEMENTS weights multiplies by a prepacked
    copy of its weight (for inference: no gradient reaches the weights)."""
    if not applies(model):
        yield
        return
    linears = [module for module in model.modules()
               if isinstance(module, nn.Linear) and module.weight.numel() >= MIN_ELEMENTS]
    for module in linears:
        packed = torch.ops.mkldnn._reorder_linear_weight(module.weight.detach(), BATCH_HINT)
        module.forward = lambda x, packed=packed, bias=module.bias: torch.ops.mkldnn._linear_pointwise(
            x, packed, bias, "none", [], "")
    try:
        yield
    finally:
        for module in linears:
            del module.forward  # back to nn.Linear.forward


# The same step compiled (generate(compiled=True), sample.py --compile=True). Where a small model's batch-1 step is
# mostly Python and per-op overhead (dozens of small kernels per layer), compiling fuses the element-wise ops and
# drops the Python around them, leaving the matmuls, i.e. reading the weights. On a CPU, for a model at least
# FROZEN_MIN_WIDTH wide, the matmuls are Inductor's own C++ GEMM kernels: freezing makes the weights constants of the
# graph, which the kernels pack once into their blocked layout, and max_autotune is given that template alone (its
# timing runs with each weight in the caches, where the BLAS call can look faster to it than it is for a step that
# streams the weights from memory). On an AMD EPYC a batch-1 step then takes 35-41% of the time of an eager step with
# nn.Linear's layout and 44-69% of the prepacked one's, after a first call that compiles for 30-50 s (docs/speed.md).
# Frozen weights cannot follow training: a model whose parameters were changed in place or replaced since its step was
# built is refused (a change through .data is not seen). No recompilation per token: dynamic=True compiles the cache
# length (and a batch size above 1) as symbolic sizes, so one graph serves every position; batch 1 and the context's
# last position get graphs of their own. The prefill stays eager: it runs once, and again each time the window slides.
# Compiled graphs are kept per code object, up to torch._dynamo.config.recompile_limit (8) sets of guards, and a
# frozen graph guards on its model's weights: a process that decodes with several models in turn needs
# torch._dynamo.reset() between them (bench.py), or past the limit the step quietly runs eager.
FROZEN_MIN_WIDTH = 256  # narrower models stay in the CPU's caches: C++ GEMM kernels would not pay their compile
FROZEN_WEIGHTS = weakref.WeakKeyDictionary()  # model -> [(parameter, its version counter)] when its step was built

# Which step runs, by the number of rows. On the AMD EPYC (results/logs/compiled_rows.txt: interleaved, three rounds,
# in two processes, each with an empty kernel cache, the graph for more than one row first compiled at 8 rows in one
# and at 32 in the other) the frozen step is 1.84-1.95x the prepacked eager step at 1 row and 1.19-1.25x at 8, but
# 0.90-0.97x at 16 and 0.81-0.83x at 32 in both: not the size its kernels were tuned at. bench.py's profile puts the
# difference in the compiled graph (likely its products, where several rows share each weight read; docs/speed.md). So
# with more rows than this, a compiled generation of a model FROZEN_MIN_WIDTH wide or wider on a CPU runs the eager
# step; bench.py's 4c sets it to None to keep measuring the compiled step there. Measured on the AMD EPYC only,
# applied on every CPU; elsewhere (a GPU) the compiled step runs.
COMPILED_MAX_ROWS = 8
# sample.py's default (--compile=auto) compiles where the compile is repaid within the generation. Measured on the AMD
# EPYC, gpt 6 layers x 384, one row: a generation past the context compiles for 47.2-48.4 s with an empty kernel cache
# and 31.6 s with a kept one (results/logs/compiled_rows.txt; Inductor's graph cache cannot store the frozen weights'
# oneDNN tensors, only the kernels are reused); each step then takes 1.39 ms less (bench.py's 4c,
# results/bench/bench-cpu-amd.md: 271.7 -> 435.7 tokens/s; 1.5-2.7 ms in compiled_rows.txt, 1.09 ms in the run
# before). compiled_rows.txt's longer compile over bench 4c's saving: repaid after about 35,000 steps (about 44,000
# with the run before's 1.09 ms). One row only: at 8 rows a step saved 0.9-1.2 ms interleaved (compiled_rows.txt) but
# 0.08 ms in that bench run, 2.7 ms in the run before and nothing in the decoding rerun
# (results/bench/bench-cpu-amd-decoding-rerun.md). Nothing measured a GPU or a model of another size: a wider one
# (gpt2 from --init_from) is decided by this one's figures, a narrower one (not frozen) stays eager.
COMPILE_SECONDS, SECONDS_SAVED_PER_STEP = 48.4, 1.39e-3


def frozen(model):
    """Whether this model's compiled step freezes its weights (a CPU, FROZEN_MIN_WIDTH wide or wider)."""
    return model.lm_head.weight.device.type == "cpu" and model.config.n_embd >= FROZEN_MIN_WIDTH


def runs_compiled_step(model, rows):
    """Whether a compiled generation of `rows` rows runs the compiled step (see COMPILED_MAX_ROWS)."""
    return not frozen(model) or COMPILED_MAX_ROWS is None or rows <= COMPILED_MAX_ROWS


def compile_pays(model, rows, steps):
    """--compile=auto: whether compiling the decoding step is repaid within `steps` steps of `rows` rows, by the
    figures above (where they were measured: the frozen step on a CPU, one row)."""
    return frozen(model) and rows == 1 and steps * SECONDS_SAVED_PER_STEP >= COMPILE_SECONDS


def compiled_decode_step(model):
    """decode_step through torch.compile for this model's device and width, built on first use: importing the
    compiler costs ~1 s, which a script that never compiles should not pay."""
    device, freeze = model.lm_head.weight.device.type, frozen(model)
    if freeze:
        weights = [(p, p._version) for p in model.parameters()]  # an in-place change bumps the counter
        before = FROZEN_WEIGHTS.setdefault(model, weights)
        if len(before) != len(weights) or any(p is not q or v != w for (p, v), (q, w) in zip(before, weights)):
            raise RuntimeError("the model's weights changed since its compiled decoding step froze them: call "
                               "torch._dynamo.reset() and decode_layout.FROZEN_WEIGHTS.clear() to compile anew")
    return compiled_step(device, freeze)


def decoding_step(model, compiled, rows):
    """What sample.generate decodes `rows` rows with: (the one-position step, the context it runs in). Eager:
    kvcache's step with the weights prepacked (where that applies); compiled: the compiled step, whose frozen weights
    have a layout of their own, unless more than COMPILED_MAX_ROWS rows make the eager step the faster. The same
    tokens either way (tests/test_kvcache.py)."""
    if compiled and runs_compiled_step(model, rows):
        return compiled_decode_step(model), contextlib.nullcontext()
    return decode_step, prepacked(model)


@contextlib.contextmanager
def fastest_decoding_step(model, compiled, rows):
    """sample.generate's one call for its speed: `with fastest_decoding_step(model, compiled, rows) as step:` the
    whole generation (prefills included) runs in the context decoding_step picks, and decodes with its step."""
    step, layout = decoding_step(model, compiled, rows)
    with layout:
        yield step


@functools.cache
def compiled_step(device, freeze):
    if not freeze:
        return torch.compile(decode_step, dynamic=True)
    from torch._inductor import config
    warnings.filterwarnings("ignore", "TypedStorage is deprecated")  # the autotuner's own, once per process
    step = torch.compile(decode_step, dynamic=True,
                         options={"max_autotune": True, "max_autotune_gemm_backends": "CPP",  # (see above)
                                  "autotune_fallback_to_aten": True, "autotune_num_choices_displayed": 0,
                                  "max_autotune_report_choices_stats": False})

    def frozen_step(model, token, cache):
        with config.patch(freezing=True):  # read while tracing: the weights become constants of the graph
            return step(model, token, cache)
    return frozen_step
