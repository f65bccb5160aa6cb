"""The optimised step's two hand-written backward kernels (`backward_kernels`), for `projected_block`.

    dprojected = rotary_heads_backward(dq, dk, dv, cos, sin)        # RoPE's backward, into the projection
    dx, dx_low, dw = residual_rms_norm_backward(dh, x, w, rstd, g)  # RMSNorm's with the residual's

Why: timed alone on one H100, Inductor's own kernels for these two backwards ran well below the copy
bandwidth at medium (notes/runs/2026-11-28-h100-contiguous-grad): RoPE's, which gathers the attention's
three gradients into the joined projection's layout, at 1.6 TB/s (its index arithmetic, and two loads
an element for the pair swap); the norms' weight gradients as a third pass over the norms' inputs, a
column sum that Inductor cannot fuse into the row sums of their input gradients. Each kernel here is one
pass: a tile of whole rows, loaded once.

The math is the model's, in fp32 with one rounding at the end. The kernels run on CUDA tensors, or on
any tensors when TRITON_INTERPRET=1 was set before triton was imported (the CPU tests, float32); the
functions otherwise compute the same with torch ops. Plain pointer arithmetic with masks, so the
kernels run on Triton 3.6 and 3.9 alike.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from cs336sys.leaderboard.adamw import _round_to_bf16
from cs336sys.leaderboard.fused_ops import _use_kernels

ROPE_BLOCK_SEQ = 32
NORM_TILE = 4096  # elements of a norm tile: rows of d at a time (whole rows, at least one)
# beside the updates on one H100, 1 and 4 lost to 2 (notes/runs/2026-11-28-h100-backward-kernels)
NORM_PROGRAMS_PER_SM = 2
NORM_WARPS = 8


# ------------------------------------------------------------------------------- RoPE's backward


@triton.jit
def rotary_heads_backward_kernel(DQ, DK, DV, COS, SIN, DX, heads, seq, d, stride_b, stride_h, stride_s,
                                 BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr):
    """BLOCK_S positions of one (batch, head) of q's, k's or v's gradient (grid axis 2: 0, 1, 2), each
    (batch, heads, seq, d) with the strides given (the three's, unit along d), rotated back and stored
    in the joined projection's layout (batch, seq, 3, heads, d). With the joined tables (seq, 3, 1, d)
    of the forward's y = x C + swap(x) S, the gradient is dx = dy C + swap(dy S); v's tables (C 1,
    S 0) give dv itself."""
    bh = tl.program_id(0)
    which = tl.program_id(2)
    b = (bh // heads).to(tl.int64)
    h = (bh % heads).to(tl.int64)
    pos = tl.program_id(1).to(tl.int64) * BLOCK_S + tl.arange(0, BLOCK_S)
    cols = tl.arange(0, BLOCK_D)
    mask = (pos[:, None] < seq) & (cols[None, :] < d)
    src = b * stride_b + h * stride_h + pos[:, None] * stride_s + cols[None, :]
    if which == 0:
        dy = tl.load(DQ + src, mask=mask, other=0.0)
    elif which == 1:
        dy = tl.load(DK + src, mask=mask, other=0.0)
    else:
        dy = tl.load(DV + src, mask=mask, other=0.0)
    dy = dy.to(tl.float32)
    table = (pos[:, None] * 3 + which) * d + cols[None, :]
    c = tl.load(COS + table, mask=mask, other=0.0).to(tl.float32)
    s = tl.load(SIN + table, mask=mask, other=0.0).to(tl.float32)
    even, odd = tl.split(tl.reshape(dy * s, (BLOCK_S, BLOCK_D // 2, 2)))
    dx = dy * c + tl.reshape(tl.join(odd, even), (BLOCK_S, BLOCK_D))
    dst = (((b * seq + pos[:, None]) * 3 + which) * heads + h) * d + cols[None, :]
    tl.store(DX + dst, dx.to(DX.dtype.element_ty), mask=mask)


def rotary_heads_backward_reference(dq: Tensor, dk: Tensor, dv: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """The kernel's result with torch ops, in the gradients' dtype (fp32 inside)."""
    dy = torch.stack((dq, dk, dv)).permute(1, 3, 0, 2, 4).float()  # (batch, seq, 3, heads, d)
    ds = dy * sin.float()
    swapped = ds.unflatten(-1, (-1, 2)).flip(-1).flatten(-2)
    return (dy * cos.float() + swapped).to(dq.dtype)


def _launch_rotary_heads_backward(dq: Tensor, dk: Tensor, dv: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    if dq.stride(-1) != 1 or not dq.stride() == dk.stride() == dv.stride():
        dq, dk, dv = dq.contiguous(), dk.contiguous(), dv.contiguous()
    cos, sin = cos.contiguous(), sin.contiguous()
    batch, heads, seq, d = dq.shape
    dx = torch.empty((batch, seq, 3, heads, d), dtype=dq.dtype, device=dq.device)
    grid = (batch * heads, triton.cdiv(seq, ROPE_BLOCK_SEQ), 3)
    rotary_heads_backward_kernel[grid](dq, dk, dv, cos, sin, dx, heads, seq, d, *dq.stride()[:3],
                                       BLOCK_S=ROPE_BLOCK_SEQ, BLOCK_D=triton.next_power_of_2(d))
    return dx


# For torch.compile each launcher is a custom operator, one opaque node of the backward graph (as the
# flash kernels are: cs336sys.attention.flash_triton); eagerly the launchers are called directly.
@torch.library.custom_op("cs336sys::rotary_heads_backward", mutates_args=())
def _rotary_heads_backward_op(dq: Tensor, dk: Tensor, dv: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    return _launch_rotary_heads_backward(dq, dk, dv, cos, sin)


@_rotary_heads_backward_op.register_fake
def _(dq, dk, dv, cos, sin):
    batch, heads, seq, d = dq.shape
    return dq.new_empty((batch, seq, 3, heads, d))


def rotary_heads_backward(dq: Tensor, dk: Tensor, dv: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """The gradient of the joined projection (batch, seq, 3, heads, d) from q's, k's and v's (each
    (batch, heads, seq, d)) through `step_blocks.rotate_pairs` with the joined tables cos, sin (seq, 3, 1, d)."""
    if not _use_kernels(dq, dk, dv, cos, sin):
        return rotary_heads_backward_reference(dq, dk, dv, cos, sin)
    if torch.compiler.is_compiling():
        return _rotary_heads_backward_op(dq, dk, dv, cos, sin)
    return _launch_rotary_heads_backward(dq, dk, dv, cos, sin)


# ---------------------------------------------------------------------- RMSNorm's, with the residual


@triton.jit
def residual_rms_norm_backward_kernel(DH, X, W, RSTD, G, DX, DX_LOW, DW_PARTIAL, n_rows, d,
                                      ROWS_PER_PROGRAM: tl.constexpr, BLOCK_R: tl.constexpr,
                                      BLOCK_D: tl.constexpr, HAS_G: tl.constexpr):
    """The backward of h = x rstd w (rstd = 1 / rms(x), x fp32) for ROWS_PER_PROGRAM rows, BLOCK_R rows
    a tile: dx = (dh w - xhat mean(dh w xhat)) rstd, plus g (the residual's own gradient) with HAS_G;
    dx stored in fp32 and rounded to bf16 (what the product that made the residual's branch takes),
    and this program's part of dw = sum over rows of dh xhat (summed over programs after)."""
    program = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_D)
    col_ok = cols < d
    w = tl.load(W + cols, mask=col_ok, other=0.0).to(tl.float32)
    dw = tl.zeros((BLOCK_R, BLOCK_D), dtype=tl.float32)
    for start in range(0, ROWS_PER_PROGRAM, BLOCK_R):
        rows = program * ROWS_PER_PROGRAM + start + tl.arange(0, BLOCK_R)
        row_ok = rows < n_rows
        mask = row_ok[:, None] & col_ok[None, :]
        at = rows[:, None] * d + cols[None, :]
        x = tl.load(X + at, mask=mask, other=0.0)
        dh = tl.load(DH + at, mask=mask, other=0.0).to(tl.float32)
        rstd = tl.load(RSTD + rows, mask=row_ok, other=0.0)
        xhat = x * rstd[:, None]
        dhw = dh * w[None, :]
        dx = (dhw - xhat * (tl.sum(dhw * xhat, axis=1) / d)[:, None]) * rstd[:, None]
        if HAS_G:
            dx += tl.load(G + at, mask=mask, other=0.0)
        tl.store(DX + at, dx, mask=mask)
        tl.store(DX_LOW + at, _round_to_bf16(dx), mask=mask)
        dw += dh * xhat
    tl.store(DW_PARTIAL + program * d + cols, tl.sum(dw, axis=0), mask=col_ok)


def residual_rms_norm_backward_reference(dh: Tensor, x: Tensor, weight: Tensor, rstd: Tensor,
                                         g: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
    """The kernel's results with torch ops."""
    xhat = x * rstd.unsqueeze(-1)
    dhw = dh.float() * weight
    dx = (dhw - xhat * (dhw * xhat).mean(-1, keepdim=True)) * rstd.unsqueeze(-1)
    if g is not None:
        dx = dx + g
    return dx, dx.to(torch.bfloat16), (dh.float() * xhat).flatten(0, -2).sum(0)


def _norm_grid(n_rows: int, d: int, device: torch.device) -> tuple[int, int, int, int]:
    """(BLOCK_D, BLOCK_R, rows a program, programs): tiles of NORM_TILE elements, and several programs an
    SM (NORM_PROGRAMS_PER_SM), each writing one (d,) partial of dw; the interpreter: a few programs."""
    block_d = triton.next_power_of_2(d)
    block_r = max(1, NORM_TILE // block_d)
    sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 1
    programs = max(1, min(NORM_PROGRAMS_PER_SM * sms, triton.cdiv(n_rows, block_r)))
    rows_per_program = triton.cdiv(triton.cdiv(n_rows, programs), block_r) * block_r
    return block_d, block_r, rows_per_program, triton.cdiv(n_rows, rows_per_program)


def _launch_residual_rms_norm_backward(dh: Tensor, x: Tensor, weight: Tensor, rstd: Tensor,
                                       g: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
    """dx, dx in bf16, and the programs' partial sums of dw (programs, d)."""
    d = x.shape[-1]
    dh, x, rstd = dh.contiguous(), x.contiguous(), rstd.contiguous()
    has_g = g is not None
    n_rows = x.numel() // d
    block_d, block_r, rows_per_program, programs = _norm_grid(n_rows, d, x.device)
    dx = torch.empty_like(x)
    dx_low = torch.empty(x.shape, dtype=torch.bfloat16, device=x.device)
    partial = torch.empty((programs, d), dtype=torch.float32, device=x.device)
    residual_rms_norm_backward_kernel[(programs,)](dh, x, weight, rstd, g.contiguous() if has_g else x, dx,
                                                   dx_low, partial, n_rows, d, ROWS_PER_PROGRAM=rows_per_program,
                                                   BLOCK_R=block_r, BLOCK_D=block_d, HAS_G=has_g,
                                                   num_warps=NORM_WARPS)
    return dx, dx_low, partial


@torch.library.custom_op("cs336sys::residual_rms_norm_backward", mutates_args=())
def _residual_rms_norm_backward_op(dh: Tensor, x: Tensor, weight: Tensor, rstd: Tensor,
                                   g: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
    return _launch_residual_rms_norm_backward(dh, x, weight, rstd, g)


@_residual_rms_norm_backward_op.register_fake
def _(dh, x, weight, rstd, g):
    programs = _norm_grid(x.numel() // x.shape[-1], x.shape[-1], x.device)[3]
    return (x.new_empty(x.shape), x.new_empty(x.shape, dtype=torch.bfloat16),
            x.new_empty((programs, x.shape[-1])))


def residual_rms_norm_backward(dh: Tensor, x: Tensor, weight: Tensor, rstd: Tensor,
                               g: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
    """x's gradient (fp32; plus g, the gradient x gets from elsewhere, when given), the same rounded to
    bf16, and the weight's gradient (fp32), from h's gradient dh (bf16 or fp32) for h = x rstd w, where
    x is fp32 (..., d) and rstd (...) is 1 / sqrt(mean(x^2) + eps) as the forward computed it."""
    if not _use_kernels(dh, x, weight, rstd, *(() if g is None else (g,))):
        return residual_rms_norm_backward_reference(dh, x, weight, rstd, g)
    # the partial sums are summed outside the kernel's operator: compiled, that is Inductor's own reduction
    launch = _residual_rms_norm_backward_op if torch.compiler.is_compiling() else _launch_residual_rms_norm_backward
    dx, dx_low, partial = launch(dh, x, weight, rstd, g)
    return dx, dx_low, partial.sum(0)
