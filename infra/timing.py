"""
Timing on any device, and the two ceilings every speed figure is read against (nanoGPT reports MFU against a
datasheet peak; we measure the machine we are on, because a CPU's datasheet says little about what torch reaches).

    median_time(fn, device)            seconds, after warm-up, the device synchronised before reading the clock
    matmul_flops_per_second(device)    the dense matmul rate: the ceiling MFU is reported against
    copy_bandwidth(device)             bytes per second of a device copy: the floor of batch-1 decoding

Imported by train.py (MFU in the log line) and bench.py; it imports nothing of the project.
"""
import time

import torch


def synchronize(device):
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()
    elif str(device) == "mps":
        torch.mps.synchronize()


def time_once(fn, device):
    synchronize(device)
    t = time.perf_counter()
    fn()
    synchronize(device)
    return time.perf_counter() - t


def median_time(fn, device, repeats=5, warmup=2):
    """Median seconds of fn() over repeats, after warm-up, synchronising the device before reading the clock."""
    for _ in range(warmup):
        fn()
    times = sorted(time_once(fn, device) for _ in range(repeats))
    return times[len(times) // 2]


def matmul_flops_per_second(device, dtype=torch.float32, size=None, seconds=1.0):
    """The machine's measured dense matmul rate, in bounded time (about `seconds`, whatever the dtype): the
    square size grows from 256 while one product stays short (up to 2048 on a CPU, 8192 on CUDA), then products
    are timed until the budget is spent and the median is kept (a CPU's clock wanders; one sample is not enough).
    Bounded, because a dtype the CPU has no fast kernel for (bfloat16 on most CPUs) can take a minute for one
    2048^2 product."""
    largest = size or (8192 if str(device).startswith("cuda") else 2048)
    generator = torch.Generator(device=device).manual_seed(0)  # private: never disturb the global RNG

    def operands(n):
        return (torch.randn(n, n, device=device, dtype=dtype, generator=generator) for _ in range(2))

    n = min(256, largest)
    a, b = operands(n)
    one = time_once(lambda: a @ b, device)  # also the warm-up
    while n < largest and 8 * one < seconds / 10:  # the next size costs 8x: grow while it stays under 10%
        n *= 2
        a, b = operands(n)
        time_once(lambda: a @ b, device)  # warm-up at the new size
        one = time_once(lambda: a @ b, device)
    times, deadline = [one], time.perf_counter() + seconds
    while len(times) < 3 or time.perf_counter() < deadline:
        times.append(time_once(lambda: a @ b, device))
    return 2 * n ** 3 / sorted(times)[len(times) // 2]


def copy_bandwidth(device, megabytes=256, repeats=5):
    """Bytes per second of a device-to-device copy (each byte read once and written once)."""
    n = megabytes * 2 ** 20 // 4
    a = torch.rand(n, device=device)
    b = torch.empty_like(a)
    return 2 * a.numel() * 4 / median_time(lambda: b.copy_(a), device, repeats=repeats)
