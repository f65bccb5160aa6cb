"""Implementation for problems 9a and 10: FlashAttention-2 in plain PyTorch (the assignment's adapter).

A tiled forward with an online softmax, and a backward that recomputes the probabilities from the
saved log-sum-exp L.

The forward never holds more than one (block_q, block_k) tile of scores per query tile. The
backward is the assignment's "recompute, then use D = rowsum(O * dO)" version; it materialises
the scores of the whole sequence, so it is for checking and teaching, not for long contexts.
On CUDA it runs through `torch.compile`; elsewhere (or if compilation fails) eagerly.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable

import torch

from cs336sys.attention.inputs import check_attention_inputs
from cs336sys.attention.naive import MASKED_SCORE

DEFAULT_BLOCK = 32  # the assignment asks for tiles of at least 16 x 16


def flash_forward_pytorch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False,
                          block_q: int = DEFAULT_BLOCK, block_k: int = DEFAULT_BLOCK,
                          ) -> tuple[torch.Tensor, torch.Tensor]:
    """Tiled forward over (..., seq, d) tensors; returns O (q's dtype) and L (float32 or float64)."""
    if block_q < 16 or block_k < 16:
        raise ValueError(f"tiles must be at least 16 x 16, got {block_q} x {block_k}")
    # Accumulate in float32 at least (float64 stays float64, for the reference tests).
    acc_dtype = torch.promote_types(q.dtype, torch.float32)
    seq_q, seq_k, d = q.shape[-2], k.shape[-2], q.shape[-1]
    scale = 1.0 / math.sqrt(d)
    out = torch.empty_like(q)
    lse = torch.empty(q.shape[:-1], dtype=acc_dtype, device=q.device)
    for q0 in range(0, seq_q, block_q):
        q_tile = q[..., q0:q0 + block_q, :].to(acc_dtype)
        rows = torch.arange(q0, q0 + q_tile.shape[-2], device=q.device)
        m = torch.full(q_tile.shape[:-1], -math.inf, dtype=acc_dtype, device=q.device)
        denom = torch.zeros_like(m)
        acc = torch.zeros_like(q_tile)
        # Causal: key tiles that start after this query tile's last row are entirely masked.
        k_end = min(seq_k, q0 + q_tile.shape[-2]) if is_causal else seq_k
        for k0 in range(0, k_end, block_k):
            k_tile = k[..., k0:k0 + block_k, :].to(acc_dtype)
            v_tile = v[..., k0:k0 + block_k, :].to(acc_dtype)
            scores = q_tile @ k_tile.transpose(-1, -2) * scale
            if is_causal and k0 + k_tile.shape[-2] - 1 > q0:  # only tiles crossing the diagonal
                cols = torch.arange(k0, k0 + k_tile.shape[-2], device=q.device)
                scores = scores.masked_fill(cols[None, :] > rows[:, None], MASKED_SCORE)
            m_new = torch.maximum(m, scores.amax(dim=-1))
            p = torch.exp(scores - m_new[..., None])
            correction = torch.exp(m - m_new)
            denom = correction * denom + p.sum(dim=-1)
            acc = correction[..., None] * acc + p @ v_tile
            m = m_new
        out[..., q0:q0 + block_q, :] = (acc / denom[..., None]).to(q.dtype)
        lse[..., q0:q0 + block_q] = m + torch.log(denom)
    return out, lse


def flash_backward_recompute(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                             lse: torch.Tensor, grad_out: torch.Tensor, is_causal: bool,
                             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dQ, dK, dV from P = exp(S - L) and dS = P * (dP - D), D = rowsum(O * dO)."""
    acc_dtype = torch.promote_types(q.dtype, torch.float32)
    qf, kf, vf = q.to(acc_dtype), k.to(acc_dtype), v.to(acc_dtype)
    dof = grad_out.to(acc_dtype)
    scale = 1.0 / math.sqrt(q.shape[-1])
    scores = qf @ kf.transpose(-1, -2) * scale
    if is_causal:
        rows = torch.arange(q.shape[-2], device=q.device)[:, None]
        cols = torch.arange(k.shape[-2], device=q.device)[None, :]
        scores = scores.masked_fill(cols > rows, MASKED_SCORE)
    p = torch.exp(scores - lse.to(acc_dtype)[..., None])
    dv = p.transpose(-1, -2) @ dof
    dp = dof @ vf.transpose(-1, -2)
    delta = (out.to(acc_dtype) * dof).sum(dim=-1, keepdim=True)
    ds = p * (dp - delta)
    dq = ds @ kf * scale
    dk = ds.transpose(-1, -2) @ qf * scale
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


_compiled_backward: Callable | None = None
_compile_failed = False


def _run_backward(*args) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The compiled backward on CUDA; eager on CPU (compiling there buys nothing) or if it fails."""
    global _compiled_backward, _compile_failed
    if args[0].device.type != "cuda" or _compile_failed:
        return flash_backward_recompute(*args)
    if _compiled_backward is None:
        _compiled_backward = torch.compile(flash_backward_recompute, dynamic=None)
    try:
        return _compiled_backward(*args)
    except Exception as exc:  # a missing compiler must not make the gradient unavailable
        _compile_failed = True
        warnings.warn(f"torch.compile of the FlashAttention backward failed ({type(exc).__name__}: "
                      f"{exc}); using the eager backward", stacklevel=2)
        return flash_backward_recompute(*args)


class FlashAttention2PyTorch(torch.autograd.Function):
    """`FlashAttention2PyTorch.apply(q, k, v, is_causal=False)`; saves L, Q, K, V, O."""

    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False):
        check_attention_inputs(q, k, v, is_causal)
        out, lse = flash_forward_pytorch(q, k, v, is_causal)
        ctx.save_for_backward(lse, q, k, v, out)
        ctx.is_causal = is_causal
        return out

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        lse, q, k, v, out = ctx.saved_tensors
        dq, dk, dv = _run_backward(q, k, v, out, lse, grad_out, ctx.is_causal)
        return dq, dk, dv, None
