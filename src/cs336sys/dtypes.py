"""The dtype names used in configs, settings and results, and what they mean to torch.

Written once: every experiment, the step builder and the analysis read names from here.
`fp32` is float32 with TF32 matrix products off (PyTorch's default); `tf32` is float32 with them
on; `bf16` and `fp16` are either autocast with float32 master weights (`autocast`) or the
parameters' own dtype (`torch_dtype`), as the caller decides.
"""

from __future__ import annotations

import contextlib

import torch

DTYPE_NAMES = ("fp32", "tf32", "bf16", "fp16")
_TORCH = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def check_dtype(name: str) -> str:
    if name not in _TORCH:
        raise ValueError(f"unknown dtype {name!r}; known: {', '.join(DTYPE_NAMES)}")
    return name


def torch_dtype(name: str) -> torch.dtype:
    return _TORCH[check_dtype(name)]


def autocast(name: str, device: str | torch.device):
    """`torch.autocast` to a low-precision dtype, or nothing for fp32/tf32."""
    dtype = torch_dtype(name)
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=torch.device(device).type, dtype=dtype)


@contextlib.contextmanager
def matmul_precision(name: str):
    """TF32 matrix products on for `tf32`, off otherwise; restored afterwards."""
    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = check_dtype(name) == "tf32"
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous
