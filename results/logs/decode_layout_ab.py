"""Cached decoding with nn.Linear's weight layout against the prepacked one (infra/decode_layout.py), interleaved
in one process so that a noisy machine slows both alike: bench.py's 4c gpt model (6 x 384, 65 tokens), 120 greedy
tokens per row from a 16-token prompt, batch 1, 8 and 32, five rounds.

    PYTHONPATH=. python results/logs/decode_layout_ab.py > results/logs/decode_layout_ab.txt
"""
import platform
import statistics
import time

import torch

import sample
from infra import decode_layout
from infra.timing import machine_name
from model import ModelConfig, Transformer

torch.manual_seed(0)
model = Transformer(ModelConfig(arch="gpt", vocab_size=65, block_size=256, n_layer=6, n_head=6, n_embd=384,
                                bias=False)).eval()
prompt = torch.randint(0, 65, (1, 16))
rates = {}
for _ in range(5):
    for packed in (False, True):
        decode_layout.USE_PREPACKED = packed
        for batch in (1, 8, 32):
            start = time.perf_counter()
            sample.generate(model, prompt, 120, num_samples=batch, temperature=0)
            rates.setdefault((batch, packed), []).append(120 * batch / (time.perf_counter() - start))
print(f"{machine_name('cpu')}, torch {torch.__version__}, Python {platform.python_version()}")
print("batch | nn.Linear's layout tokens/s | prepacked tokens/s | ratio of medians | ratio per round")
for batch in (1, 8, 32):
    plain, packed = rates[(batch, False)], rates[(batch, True)]
    print(f"{batch} | {statistics.median(plain):.0f} | {statistics.median(packed):.0f} | "
          f"{statistics.median(packed) / statistics.median(plain):.2f}x | "
          + ", ".join(f"{b / a:.2f}" for a, b in zip(plain, packed)))
