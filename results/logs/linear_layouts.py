"""How fast this CPU's BLAS reads a weight in each layout (the figures behind infra/decode_layout.py and
docs/speed.md): the product of a few rows with enough distinct weights to overflow the caches, as a decoding step
reads them; medians of 50 timings. nn.Linear's (out, in) layout through F.linear, the transposed (in, out) layout
through x @ W_t, and oneDNN's prepacked layout, for the 1536 x 384 weights of bench.py's model at batch 1, 8 and 32,
then for weights from 64 x 64 to 3072 x 768 (where prepacking starts to pay: decode_layout.MIN_ELEMENTS).

    PYTHONPATH=. python results/logs/linear_layouts.py > results/logs/linear_layouts.txt
"""
import platform
import sys
import time

import torch
import torch.nn.functional as F

from infra.configurator import run_main
from infra.decode_layout import BATCH_HINT
from infra.timing import machine_name


def median_ms(work, repeats=50):
    for _ in range(5):
        work()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        work()
        times.append(time.perf_counter() - start)
    return sorted(times)[repeats // 2] * 1e3


def layouts(shape, batch, count):
    """ms for `count` products of a (batch, 1, in) input with distinct (out, in) weights, per layout."""
    torch.manual_seed(0)
    weights = [torch.randn(*shape) for _ in range(count)]
    transposed = [w.t().contiguous() for w in weights]
    packed = [torch.ops.mkldnn._reorder_linear_weight(w, BATCH_HINT) for w in weights]
    x = torch.randn(batch, 1, shape[1])
    return {"F.linear": median_ms(lambda: [F.linear(x, w) for w in weights]),
            "x @ W_t": median_ms(lambda: [x @ w for w in transposed]),
            "prepacked": median_ms(lambda: [torch.ops.mkldnn._linear_pointwise(x, p, None, "none", [], "")
                                            for p in packed])}


def main():
    print(f"{machine_name('cpu')}, torch {torch.__version__}, Python {platform.python_version()}")
    megabytes = 24 * 1536 * 384 * 4 / 1e6
    print(f"\n24 distinct 1536 x 384 weights ({megabytes:.0f} MB): ms | GB/s of weights read")
    for batch in (1, 8, 32):
        print(f"  batch {batch}: " + ", ".join(f"{name} {ms:.2f} ms {megabytes / ms:.1f} GB/s" for name, ms in
                                                layouts((1536, 384), batch, 24).items()), flush=True)
    print("\nprepacked against F.linear, by weight shape (distinct weights filling ~60 MB, at most 64)")
    for shape in ((64, 64), (128, 128), (256, 256), (512, 128), (384, 384), (1536, 384), (768, 768), (3072, 768)):
        count = min(64, max(1, int(60e6 / (shape[0] * shape[1] * 4))))
        ratios = []
        for batch in (1, 32):
            ms = layouts(shape, batch, count)
            ratios.append(f"batch {batch} {ms['F.linear'] / ms['prepacked']:.2f}x")
        print(f"  {shape[0]} x {shape[1]}: " + ", ".join(ratios), flush=True)
        print(f"[linear_layouts] {shape[0]} x {shape[1]} done", file=sys.stderr, flush=True)


if __name__ == "__main__":
    run_main(main, interrupted="nothing written")
