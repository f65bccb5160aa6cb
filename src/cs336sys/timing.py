"""Timing and memory helpers shared by every benchmark: written once, used everywhere."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch


def synchronize(device: str | torch.device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def time_steps(step: Callable[[], object], warmup: int, steps: int, device: str | torch.device) -> list[float]:
    """Run `warmup` untimed then `steps` timed calls; each timed call is bracketed by a device
    synchronisation and timed with the monotonic high-resolution clock. Returns milliseconds."""
    for _ in range(warmup):
        step()
    synchronize(device)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        synchronize(device)
        times.append((time.perf_counter() - start) * 1e3)
    return times


def summarize_ms(times_ms: list[float]) -> dict[str, float]:
    return {
        "mean_ms": statistics.fmean(times_ms),
        "std_ms": statistics.stdev(times_ms) if len(times_ms) > 1 else 0.0,
        "median_ms": statistics.median(times_ms),
        "min_ms": min(times_ms),
        "max_ms": max(times_ms),
    }


def peak_memory_bytes(device: str | torch.device) -> int | None:
    if torch.device(device).type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    return None


def peak_rss_bytes() -> int:
    """The process's resident-set high-water mark (CPU memory; it cannot be reset)."""
    import resource
    import sys

    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss if sys.platform == "darwin" else rss * 1024  # bytes on macOS, KiB on Linux


def reset_peak_memory(device: str | torch.device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
