"""The CPU's frozen compiled decoding step (infra/decode_layout.compiled_step) with max_autotune given Inductor's C++ GEMM
template alone, against the template and the BLAS (MKL's packed linear) both allowed: bench.py's 4c gpt model
(6 x 384), one cached step at context 128, batch 1. Each round compiles both afresh (no autotuning or graph cache
kept between rounds), then times them interleaved: 5 blocks of 20 steps each, the median block per step.

    PYTHONPATH=. python results/logs/frozen_gemm_ab.py > results/logs/frozen_gemm_ab.txt
"""
import platform
import statistics
import sys
import time
import timeit

import torch
from torch._dynamo.utils import counters
from torch._inductor import config

import kvcache
from infra.configurator import run_main
from infra.progress import Progress
from infra.timing import machine_name
from model import ModelConfig, Transformer

torch.manual_seed(0)
model = Transformer(ModelConfig(arch="gpt", vocab_size=65, block_size=256, n_layer=6, n_head=6, n_embd=384,
                                bias=False)).eval()
ids = torch.randint(0, 65, (1, 129))
VARIANTS = {"template alone": "CPP", "template or BLAS": "CPP,ATEN"}
ROUNDS = 3


def compiled(backends):
    """A frozen compiled step of its own (its own code object, so each variant keeps its own graphs)."""
    def step(model, token, cache):
        return kvcache.decode_step(model, token, cache)
    options = {"max_autotune": True, "max_autotune_gemm_backends": backends, "autotune_fallback_to_aten": True,
               "autotune_local_cache": False, "fx_graph_cache": False, "autotune_num_choices_displayed": 0,
               "max_autotune_report_choices_stats": False}
    return torch.compile(step, dynamic=True, options=options)


@torch.inference_mode()
def main():
    progress = Progress("rounds", ROUNDS, log=lambda *a, **k: print(*a, file=sys.stderr, **k))  # ~1 min a round
    cache = kvcache.KVCache(model, 1, model.config.block_size)
    kvcache.prefill(model, ids[:, :128], cache)
    token = ids[:, 128:]
    ms, templates, seconds = {name: [] for name in VARIANTS}, {name: [] for name in VARIANTS}, {}
    for done in range(ROUNDS):
        torch._dynamo.reset()
        steps = {}
        for name, backends in VARIANTS.items():
            steps[name] = compiled(backends)
            before = counters["inductor"]["cpp_templated_kernel_counter"]
            start = time.perf_counter()
            with config.patch(freezing=True):
                cache.length = 128
                steps[name](model, token, cache)
            seconds.setdefault(name, []).append(time.perf_counter() - start)
            templates[name].append(counters["inductor"]["cpp_templated_kernel_counter"] - before)
        blocks = {name: [] for name in VARIANTS}
        for _ in range(5):
            for name, step in steps.items():
                def twenty(step=step):
                    with config.patch(freezing=True):
                        for _ in range(20):
                            cache.length = 128
                            step(model, token, cache)
                blocks[name].append(timeit.timeit(twenty, number=1) / 20 * 1e3)
        for name in VARIANTS:
            ms[name].append(statistics.median(blocks[name]))
        progress.update(done + 1)
    print(f"{machine_name('cpu')}, torch {torch.__version__}, Python {platform.python_version()}")
    print("max_autotune's GEMM choices | ms per step, per round | median | C++ template kernels generated (chosen "
          "or only timed), per round | first call s, per round")
    for name, backends in VARIANTS.items():
        print(f"{name} ({backends}) | " + ", ".join(f"{m:.2f}" for m in ms[name])
              + f" | {statistics.median(ms[name]):.2f} | " + ", ".join(map(str, templates[name]))
              + " | " + ", ".join(f"{s:.0f}" for s in seconds[name]))


if __name__ == "__main__":
    run_main(main, interrupted="nothing written")  # Ctrl-C: one line, status 130
