"""Part of every implementation: attention inputs checked once, with errors that say what is wrong.

Layout: queries (..., seq_q, d), keys and values (..., seq_k, d) with the same leading dimensions:
(batch, seq, d) or (batch, heads, seq, d). Causal masking is top-left aligned (query i sees
keys j <= i), as in the assignment, so it is defined for seq_q != seq_k too.
"""

from __future__ import annotations

import torch

TRITON_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
TRITON_HEAD_DIMS = (16, 32, 64, 128)


def check_attention_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool,
                           *, for_triton: bool = False) -> None:
    """Raise TypeError/ValueError for inputs no implementation here can handle."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if not isinstance(is_causal, bool):
        raise TypeError(f"is_causal must be a bool, got {type(is_causal).__name__}")
    if q.dim() not in (3, 4):
        raise ValueError(f"q must be (batch, seq, d) or (batch, heads, seq, d); got shape {tuple(q.shape)}")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape; got {tuple(k.shape)} and {tuple(v.shape)}")
    if k.dim() != q.dim() or k.shape[:-2] != q.shape[:-2] or k.shape[-1] != q.shape[-1]:
        raise ValueError("k/v must be (..., seq_k, d) with q's leading dimensions and head dimension; "
                         f"got q {tuple(q.shape)} and k {tuple(k.shape)}")
    if q.shape[-2] == 0 or k.shape[-2] == 0:
        raise ValueError("sequence lengths must be positive")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v must share one dtype; got {q.dtype}, {k.dtype}, {v.dtype}")
    if not q.dtype.is_floating_point:
        raise TypeError(f"attention needs floating-point inputs, got {q.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must be on one device; got {q.device}, {k.device}, {v.device}")
    if not for_triton:
        return
    if q.dtype not in TRITON_DTYPES:
        raise TypeError(f"the Triton kernels take float32, float16 or bfloat16, got {q.dtype}")
    if q.shape[-1] not in TRITON_HEAD_DIMS:
        raise ValueError(f"the Triton kernels support head dimension d in {TRITON_HEAD_DIMS}, "
                         f"got d={q.shape[-1]}")
