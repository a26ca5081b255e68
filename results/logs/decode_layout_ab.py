"""Cached decoding with nn.Linear's weight layout against the prepacked one (infra/decode_layout.py), interleaved
in one process so that a noisy machine slows both alike: bench.py's 4c gpt model (6 x 384, 65 tokens), 120 greedy
tokens per row from a 16-token prompt (kvcache's prefill and decode_step, as sample.generate runs
them), batch 1, 8 and 32, five rounds.

    PYTHONPATH=. python results/logs/decode_layout_ab.py > results/logs/decode_layout_ab.txt
"""
import contextlib
import platform
import statistics
import sys
import time

import torch

import kvcache
from infra import decode_layout
from infra.configurator import run_main
from infra.progress import Progress
from infra.timing import machine_name
from model import ModelConfig, Transformer

torch.manual_seed(0)
model = Transformer(ModelConfig(arch="gpt", vocab_size=65, block_size=256, n_layer=6, n_head=6, n_embd=384,
                                bias=False)).eval()
prompt = torch.randint(0, 65, (1, 16))


@torch.inference_mode()
def greedy(batch, packed):
    """120 greedy tokens per row with the KV cache, as sample.generate decodes them."""
    with decode_layout.prepacked(model) if packed else contextlib.nullcontext():
        cache = kvcache.KVCache(model, batch, model.config.block_size)
        token = kvcache.prefill(model, prompt.expand(batch, -1), cache).argmax(-1, keepdim=True)
        for _ in range(119):
            token = kvcache.decode_step(model, token, cache).argmax(-1, keepdim=True)


def main():
    rates, progress = {}, Progress("rounds", 5, log=lambda *a, **k: print(*a, file=sys.stderr, **k))  # ~1-2 min
    for done in range(5):
        for packed in (False, True):
            for batch in (1, 8, 32):
                start = time.perf_counter()
                greedy(batch, packed)
                rates.setdefault((batch, packed), []).append(120 * batch / (time.perf_counter() - start))
        progress.update(done + 1)
    print(f"{machine_name('cpu')}, torch {torch.__version__}, Python {platform.python_version()}")
    print("batch | nn.Linear's layout tokens/s | prepacked tokens/s | ratio of medians | ratio per round")
    for batch in (1, 8, 32):
        plain, packed = rates[(batch, False)], rates[(batch, True)]
        print(f"{batch} | {statistics.median(plain):.0f} | {statistics.median(packed):.0f} | "
              f"{statistics.median(packed) / statistics.median(plain):.2f}x | "
              + ", ".join(f"{b / a:.2f}" for a, b in zip(plain, packed)))


if __name__ == "__main__":
    run_main(main, interrupted="nothing written")  # Ctrl-C: one line, status 130
