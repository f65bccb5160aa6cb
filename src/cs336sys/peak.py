"""The two ceilings MFU is measured against: dense matmul throughput per dtype, on this GPU.

A square product large enough to fill the chip, timed by CUDA events over many repeats (median).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import torch

from cs336sys.dtypes import matmul_precision, torch_dtype
from cs336sys.jobs import Run

PEAK_DTYPES = ("bf16", "tf32", "fp32")


@dataclass(frozen=True)
class PeakSettings:
    dtype: str
    """Matmul dtype: bf16 | tf32 | fp32 (float32 with TF32 off)."""
    n: int = 8192
    """Matrix side: an n x n by n x n product (2 n^3 FLOPs)."""
    repeats: int = 50
    """Timed products after 5 untimed ones; TFLOP/s is computed from their median time."""
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
                import time

                t0 = time.perf_counter()
                a @ b
                times.append(time.perf_counter() - t0)
        return 2 * n**3 / statistics.median(times) / 1e12


def run_point(settings: PeakSettings, run: Run) -> dict:
    if settings.dtype not in PEAK_DTYPES:
        raise ValueError(f"unknown dtype {settings.dtype!r}; known: {', '.join(PEAK_DTYPES)}")
    return {"tflops": matmul_tflops(settings.dtype, settings.n, run.device, settings.repeats)}
