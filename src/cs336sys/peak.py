"""The two ceilings MFU is measured against: dense matmul throughput per dtype, on this GPU.

A square product large enough to fill the chip, timed by CUDA events over many repeats (median).
"""

from __future__ import annotations

import statistics

import torch

PEAK_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32, "tf32": torch.float32}


def matmul_tflops(dtype_name: str, n: int, device: str, repeats: int = 50) -> float:
    dtype = PEAK_DTYPES[dtype_name]
    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = dtype_name == "tf32"
    try:
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
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous


def run_point(settings: dict) -> dict:
    """settings: device, dtype (bf16 | fp32 | tf32), n (matrix side)."""
    if settings["dtype"] not in PEAK_DTYPES:
        raise ValueError(f"unknown dtype {settings['dtype']!r}; known: {', '.join(PEAK_DTYPES)}")
    return {"tflops": matmul_tflops(settings["dtype"], int(settings["n"]), settings["device"])}
