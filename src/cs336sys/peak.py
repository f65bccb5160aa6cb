"""The two ceilings MFU is measured against: dense matmul throughput per dtype, on this GPU.

A square product large enough to fill the chip, timed by CUDA events over many repeats (median), in
`rounds` rounds with the GPU's SM clock and power sampled over each (`gpu_clocks.ClockSampler`): the
ceiling is the median round's, and the rounds' range and clocks say how far it moves within one job.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch

from cs336sys.dtypes import matmul_precision, torch_dtype
from cs336sys.gpu_clocks import ClockSampler
from cs336sys.jobs import Run

PEAK_DTYPES = ("bf16", "tf32", "fp32")


@dataclass(frozen=True)
class PeakSettings:
    dtype: str
    """Matmul dtype: bf16 | tf32 | fp32 (float32 with TF32 off)."""
    n: int = 8192
    """Matrix side: an n x n by n x n product (2 n^3 FLOPs)."""
    repeats: int = 50
    """Timed products a round, after 5 untimed ones; a round's TFLOP/s is computed from their median time."""
    rounds: int = 5
    """Rounds, each with the SM clock sampled over it; the ceiling is the median round's TFLOP/s."""
    device: str = "cuda"
    """Device kind: cuda | cpu (the grid's `device`); the job runner picks this rank's GPU."""


def matmul_tflops(dtype_name: str, n: int, device: str, repeats: int = 50) -> float:
    dtype = torch_dtype(dtype_name)
    with matmul_precision(dtype_name):
        a = torch.randn(n, n, device=device, dtype=dtype)
        b = torch.randn(n, n, device=device, dtype=dtype)
        for _ in range(5):
            a @ b
        times = []
        for _ in range(repeats):
            if device.startswith("cuda"):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                a @ b
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) * 1e-3)
            else:
                t0 = time.perf_counter()
                a @ b
                times.append(time.perf_counter() - t0)
        return 2 * n**3 / statistics.median(times) / 1e12


def run_point(settings: PeakSettings, run: Run) -> dict:
    if settings.dtype not in PEAK_DTYPES:
        raise ValueError(f"unknown dtype {settings.dtype!r}; known: {', '.join(PEAK_DTYPES)}")
    if settings.rounds < 1:
        raise ValueError(f"rounds must be positive, got {settings.rounds}")
    rates, clocks = [], []
    with ClockSampler(run.device, interval_ms=20) as sampler:
        for _ in range(settings.rounds):
            began = time.perf_counter()
            rates.append(matmul_tflops(settings.dtype, settings.n, run.device, settings.repeats))
            clocks.append(sampler.summary(began, time.perf_counter()))
    return {"tflops": statistics.median(rates), "tflops_rounds": rates, "round_clocks": clocks}
