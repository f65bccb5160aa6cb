"""All-reduce benchmark (problem distributed_communication_single_node) as library functions.

    times = time_all_reduce(100 * 10**6, device=info.device)     # this rank's seconds per call
    slowest = max_across_ranks(times)                           # the number to report, per call
    algorithm_bandwidth(100 * 10**6, statistics.median(slowest)) # bytes / s
    bus_bandwidth(100 * 10**6, statistics.median(slowest), world_size)

Sizes are bytes of float32 data per rank; callers choose their own MB convention. Every rank of
the default process group must call these together (they are collectives).
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

FLOAT32_BYTES = 4


def time_all_reduce(size_bytes: int, *, warmup: int = 5, iters: int = 10, device: str | torch.device = "cpu",
                    ) -> list[float]:
    """Seconds of each of `iters` timed `dist.all_reduce` calls (sum) of a float32 tensor of
    `size_bytes`, on this rank, after `warmup` untimed calls.

    Each call starts after a barrier, so a rank does not time its wait for a late peer. On CUDA the
    time is the GPU's (events around the collective on the current stream); on the CPU, wall
    time around the blocking call.
    """
    if size_bytes <= 0 or size_bytes % FLOAT32_BYTES:
        raise ValueError(f"size_bytes must be a positive multiple of {FLOAT32_BYTES}, got {size_bytes}")
    if iters < 1 or warmup < 0:
        raise ValueError(f"need iters >= 1 and warmup >= 0, got iters={iters}, warmup={warmup}")
    device = torch.device(device)
    on_cuda = device.type == "cuda"
    # Zeros stay zeros under repeated summing: no overflow to inf, no denormals, over any number of calls.
    data = torch.zeros(size_bytes // FLOAT32_BYTES, dtype=torch.float32, device=device)
    for _ in range(warmup):
        dist.all_reduce(data)
    _synchronize(device)
    if on_cuda:
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
        for start, end in events:
            dist.barrier()
            torch.cuda.synchronize(device)
            start.record()
            dist.all_reduce(data)
            end.record()
        torch.cuda.synchronize(device)
        return [start.elapsed_time(end) / 1e3 for start, end in events]
    times = []
    for _ in range(iters):
        dist.barrier()
        t0 = time.perf_counter()
        dist.all_reduce(data)
        times.append(time.perf_counter() - t0)
    return times


def max_across_ranks(times: list[float], device: str | torch.device = "cpu") -> list[float]:
    """Element-wise maximum of every rank's `times` (same length on every rank), on every rank:
    a collective is as slow as its slowest participant. `device` must suit the backend (a CUDA
    device for NCCL)."""
    local = torch.tensor(times, dtype=torch.float64, device=device)
    gathered = [torch.empty_like(local) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, local)
    return torch.stack(gathered).amax(dim=0).tolist()


def algorithm_bandwidth(size_bytes: float, seconds: float) -> float:
    """Bytes per second as the caller sees it: the size of each rank's data over the time."""
    if seconds <= 0:
        raise ValueError(f"time must be positive, got {seconds}")
    return size_bytes / seconds


def bus_bandwidth(size_bytes: float, seconds: float, world_size: int) -> float:
    """Algorithm bandwidth times 2(n-1)/n (the nccl-tests convention for all-reduce): the rate each
    link moves data in a ring all-reduce, where every rank sends and receives 2(n-1)/n of its data.
    Comparable with the hardware's link bandwidth, whatever the number of ranks; 0 for one rank."""
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1, got {world_size}")
    return algorithm_bandwidth(size_bytes, seconds) * 2 * (world_size - 1) / world_size


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
