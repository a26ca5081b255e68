"""
A decode-time layout of the weights, for cached decoding on a CPU.

A cached decoding step is a handful of vector-matrix products: every weight is read once per token, and the step
takes as long as those reads. How fast a CPU's BLAS reads a weight depends on its layout. Measured on a 2-core AMD
EPYC (torch 2.13.0, MKL 2024.2; docs/speed.md): F.linear on a weight stored (out, in), as nn.Linear stores it,
reads it at about a third of the copy bandwidth, while oneDNN's own blocked layout (a one-off reorder of the
weight, "prepacking") reads it at about two thirds, at batch 1, 8 and 32 alike.

    with prepacked(model):      # every large nn.Linear of the model computes from a prepacked copy of its weight
        ...decode...            # same values; products equal up to float rounding (tests/test_kvcache.py)

Nothing changes in the modules a reader reads: the forward of each nn.Linear is replaced for the duration of the
block and restored after it. Used only where it applies: float32 weights on the CPU, no autocast, a torch built
with oneDNN; anywhere else the block runs the plain layout. sample.generate decodes inside it unless the step is
compiled (the compiler cannot lower a prepacked weight; it has its own freezing path). bench.py's 4c sets
USE_PREPACKED = False for the plain layout's row, beside it.
"""
import contextlib

import torch
import torch.nn as nn

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
