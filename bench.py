"""bench.py (work in progress): measured ceilings of this machine."""
import time

import torch


def synchronize(device):
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()
    elif str(device) == "mps":
        torch.mps.synchronize()


def median_time(fn, device, repeats=5, warmup=2):
    """Median seconds of fn() over repeats, after warm-up, synchronising the device before reading the clock."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        synchronize(device)
        t = time.perf_counter()
        fn()
        synchronize(device)
        times.append(time.perf_counter() - t)
    return sorted(times)[len(times) // 2]


def matmul_flops_per_second(device, dtype=torch.float32, size=None, repeats=5):
    """The machine's measured dense matmul rate: the ceiling MFU is reported against."""
    size = size or (8192 if str(device).startswith("cuda") else 2048)
    generator = torch.Generator(device=device).manual_seed(0)  # private: never disturb the global RNG
    a = torch.randn(size, size, device=device, dtype=dtype, generator=generator)
    b = torch.randn(size, size, device=device, dtype=dtype, generator=generator)
    return 2 * size ** 3 / median_time(lambda: a @ b, device, repeats=repeats)
