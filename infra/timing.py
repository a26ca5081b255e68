"""
Timing on any device, and the two ceilings every speed figure is read against (nanoGPT reports MFU against a
datasheet peak; we measure the machine we are on, because a CPU's datasheet says little about what torch reaches).

    median_time(fn, device)            seconds, after warm-up, the device synchronised before reading the clock
    matmul_flops_per_second(device)    the dense matmul rate: the ceiling MFU is reported against (matmul_peak:
                                       the same, measured once per process)
    copy_bandwidth(device)             bytes per second of a device copy: the floor of batch-1 decoding
    of_floor_text(rate, floor, other)  a decoding rate as a share of its floor, flagged when above it
    machine_name(device)               the GPU, or the CPU model and thread count: what a results file names

Imported by train.py (MFU in the log line) and bench.py; it imports nothing of the project.
"""
import functools
import platform
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
    are timed until the budget is spent and the fastest is kept: a ceiling is the best the machine reached (other
    work on a busy machine only slows products down; a median would put the ceiling too low and an MFU above
    100%). Bounded, because a dtype the CPU has no fast kernel for (bfloat16 on most CPUs) can take a minute for
    one 2048^2 product."""
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
    return 2 * n ** 3 / min(times)


@functools.cache
def matmul_peak(device, dtype=torch.float32):
    """matmul_flops_per_second, measured once per process and device: what MFU is reported against (a study that
    trains dozens of models measures it once, not once per run)."""
    return matmul_flops_per_second(device, dtype)


def copy_bandwidth(device, megabytes=256, repeats=5):
    """Bytes per second of a device-to-device copy (each byte read once and written once)."""
    n = megabytes * 2 ** 20 // 4
    a = torch.rand(n, device=device)
    b = torch.empty_like(a)
    return 2 * a.numel() * 4 / median_time(lambda: b.copy_(a), device, repeats=repeats)


def mfu_text(flops_per_second, peak):
    """A model-FLOPs utilisation against a measured peak, "73.7%"; above 100% the peak's measurement failed (a
    machine busy while it was measured reports too low a rate), and no figure is printed as a fact."""
    mfu = flops_per_second / peak
    if mfu > 1.0:
        return f"? ({100 * mfu:.0f}% of a peak measured too low: busy machine)"
    return f"{100 * mfu:.1f}%"


def of_floor_text(tokens_per_s, memory_floor, weights_sized_floor):
    """A decoding rate as a share of its bandwidth floor (weights and cache read from memory once per token):
    "93.1%". Above 100% the floor did not hold, and the figure is flagged with the reason the second floor (the
    copy bandwidth of a buffer the size of the weights) gives: under it, the CPU's caches serve part of the weights
    (the main-memory floor is not this model's bound); above it too, a bandwidth measured too low (a busy
    machine)."""
    share = tokens_per_s / memory_floor
    if share <= 1.0:
        return f"{100 * share:.1f}%"
    if tokens_per_s <= weights_sized_floor:
        return f"{100 * share:.1f}% (! above: weights partly in the CPU's caches)"
    return f"{100 * share:.1f}% (! above both floors: bandwidth measured too low, busy machine)"


def cpu_name():
    """The processor's model name (Linux: /proc/cpuinfo), else what platform knows: figures need the machine."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_name(device):
    """What every results file names once: the GPU, or the CPU's model and the threads torch uses."""
    if str(device).startswith("cuda"):
        return torch.cuda.get_device_name(device)
    return f"{cpu_name()}, {torch.get_num_threads()} threads"
