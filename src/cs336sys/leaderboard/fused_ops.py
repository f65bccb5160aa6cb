"""RMSNorm, the SwiGLU gate and RoPE as Triton kernels with their backwards, for the leaderboard block.

    y = rms_norm(x, weight, eps)        # the model's RMSNorm: fp32 inside, x's dtype out
    h = silu_gate(a, b)                 # silu(a) * b, the SwiGLU's elementwise middle
    q = rotary(q, cos[:seq], sin[:seq]) # the model's RoPE on (batch, heads, seq, d_head)

Why: in the 8B step's profile (notes/leaderboard.md) "other compute" takes 1.10 s of our 7.48 s.
The model computes each of these as several torch ops, one pass over memory each: RMSNorm in
fp32 is a cast, a square, a mean, a square root, a division, a scale and a cast back; the gate
a sigmoid and two products; RoPE four products on strided halves, a stack and a copy. Their
backwards add as many again, and a checkpointed block runs its forward twice. Each function here
is one kernel in the forward and one in the backward.

The math is the model's (`cs336sys.model`), in fp32 with one rounding to the output dtype at the
end; the model rounds bf16 after every op, so in bf16 the two differ by about one rounding, not
more. The kernels run on CUDA tensors, or on any tensors when TRITON_INTERPRET=1 was set before
triton was imported (the CPU tests: float32 only, the interpreter's bf16 is not the GPU's).
Elsewhere each function is the model's own torch ops. Plain pointer arithmetic with masks (no
block pointers), so the kernels run on Triton 3.6 and 3.9 alike.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

ELEMENTWISE_BLOCK = 1024
ROPE_BLOCK_SEQ = 32


def kernels_interpreted() -> bool:
    """Was triton imported with TRITON_INTERPRET=1 (so the kernels run on CPU tensors)?"""
    from triton.runtime.jit import JITFunction

    return not isinstance(rms_norm_forward_kernel, JITFunction)


def _use_kernels(*tensors: Tensor) -> bool:
    return all(t.device.type == "cuda" for t in tensors) or kernels_interpreted()


# ---------------------------------------------------------------------------------------- RMSNorm


@triton.jit
def rms_norm_forward_kernel(X, W, Y, RSTD, d, stride_x, stride_y, eps, BLOCK_D: tl.constexpr):
    """One row: y = x / sqrt(mean(x^2) + eps) * w, in fp32; keeps 1 / rms for the backward."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_D)
    mask = cols < d
    x = tl.load(X + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    rms = tl.sqrt_rn(tl.sum(x * x, axis=0) / d + eps)  # sqrt_rn, div_rn: IEEE-rounded, as torch computes them
    y = tl.div_rn(x, rms) * w
    tl.store(Y + row * stride_y + cols, y.to(Y.dtype.element_ty), mask=mask)
    tl.store(RSTD + row, 1.0 / rms)  # for the backward only: an ulp or two does not matter there


@triton.jit
def rms_norm_backward_kernel(DY, X, W, RSTD, DX, DW_PARTIAL, n_rows, d, stride_dy, stride_x, stride_dx,
                             ROWS_PER_PROGRAM: tl.constexpr, BLOCK_D: tl.constexpr):
    """dx for `ROWS_PER_PROGRAM` consecutive rows, and their part of dw (summed over programs later).

    With xhat = x / rms and g = dy * w: dx = (g - xhat * mean(g * xhat)) / rms, dw = sum_rows dy * xhat.
    The row count is a constexpr because Triton 3.6's interpreter cannot take a tensor as a `range`
    bound (it converts the 1-element array with int(), which NumPy >= 2.4 refuses); compiled, a constant
    trip count costs one compile per distinct count (one per batch shape in a run).
    """
    program = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_D)
    col_ok = cols < d
    w = tl.load(W + cols, mask=col_ok, other=0.0).to(tl.float32)
    dw = tl.zeros((BLOCK_D,), dtype=tl.float32)
    for i in range(ROWS_PER_PROGRAM):
        row = program * ROWS_PER_PROGRAM + i
        mask = col_ok & ((cols * 0 + row) < n_rows)  # a block mask: the interpreter rejects scalar ones
        x = tl.load(X + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(DY + row * stride_dy + cols, mask=mask, other=0.0).to(tl.float32)
        rstd = tl.load(RSTD + tl.minimum(row, n_rows - 1))  # past the last row x and dy load as 0
        xhat = x * rstd
        g = dy * w
        dx = (g - xhat * (tl.sum(g * xhat, axis=0) / d)) * rstd
        tl.store(DX + row * stride_dx + cols, dx.to(DX.dtype.element_ty), mask=mask)
        dw += dy * xhat
    tl.store(DW_PARTIAL + program * d + cols, dw, mask=col_ok)


def _rows(t: Tensor) -> Tensor:
    """t as (rows, d) with unit stride along d (a view when t allows it)."""
    t = t.reshape(-1, t.shape[-1])
    return t if t.stride(-1) == 1 else t.contiguous()


def _warps(block: int) -> int:
    return 8 if block >= 2048 else 4


def _backward_programs(n_rows: int, device: torch.device) -> int:
    """Enough programs to fill the GPU several times over; each writes one (d,) partial dw."""
    if device.type == "cuda":
        return max(1, min(n_rows, 8 * torch.cuda.get_device_properties(device).multi_processor_count))
    return max(1, min(n_rows, 3))  # interpreter: several rows per program, and a ragged last one


class _RMSNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, eps: float) -> Tensor:
        rows = _rows(x)
        n_rows, d = rows.shape
        y = torch.empty((n_rows, d), dtype=x.dtype, device=x.device)
        rstd = torch.empty(n_rows, dtype=torch.float32, device=x.device)
        block = triton.next_power_of_2(d)
        rms_norm_forward_kernel[(n_rows,)](rows, weight, y, rstd, d, rows.stride(0), y.stride(0), eps,
                                           BLOCK_D=block, num_warps=_warps(block))
        ctx.save_for_backward(rows, weight, rstd)
        ctx.x_shape = x.shape
        return y.view(x.shape)

    @staticmethod
    def backward(ctx, dy: Tensor) -> tuple[Tensor, Tensor, None]:
        rows, weight, rstd = ctx.saved_tensors
        n_rows, d = rows.shape
        dy = _rows(dy)
        dx = torch.empty((n_rows, d), dtype=rows.dtype, device=rows.device)
        programs = _backward_programs(n_rows, rows.device)
        partial = torch.empty((programs, d), dtype=torch.float32, device=rows.device)
        block = triton.next_power_of_2(d)
        rms_norm_backward_kernel[(programs,)](dy, rows, weight, rstd, dx, partial, n_rows, d, dy.stride(0),
                                              rows.stride(0), dx.stride(0),
                                              ROWS_PER_PROGRAM=triton.cdiv(n_rows, programs), BLOCK_D=block,
                                              num_warps=_warps(block))
        return dx.view(ctx.x_shape), partial.sum(0).to(weight.dtype), None


def rms_norm_reference(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """`cs336sys.model.RMSNorm.forward`'s ops."""
    in_dtype = x.dtype
    x = x.to(torch.float32)
    rms = torch.sqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)
    return (x / rms * weight).to(in_dtype)


def rms_norm(x: Tensor, weight: Tensor, eps: float = 1e-5) -> Tensor:
    """RMSNorm over the last dimension, as `cs336sys.model.RMSNorm` computes it (fp32 inside)."""
    if weight.shape != x.shape[-1:]:
        raise ValueError(f"weight has shape {tuple(weight.shape)}, the last dimension of x is {x.shape[-1]}")
    if not _use_kernels(x, weight):
        return rms_norm_reference(x, weight, eps)
    return _RMSNormFunction.apply(x, weight, eps)


# ------------------------------------------------------------------------------------ SwiGLU gate


@triton.jit
def silu_gate_forward_kernel(A, B, H, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    a = tl.load(A + offs, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(B + offs, mask=mask, other=0.0).to(tl.float32)
    h = a / (1.0 + tl.exp(-a)) * b
    tl.store(H + offs, h.to(H.dtype.element_ty), mask=mask)


@triton.jit
def silu_gate_backward_kernel(A, B, DH, DA, DB, n, BLOCK: tl.constexpr):
    """With s = sigmoid(a): d silu(a) / da = s (1 + a (1 - s))."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    a = tl.load(A + offs, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(B + offs, mask=mask, other=0.0).to(tl.float32)
    dh = tl.load(DH + offs, mask=mask, other=0.0).to(tl.float32)
    s = 1.0 / (1.0 + tl.exp(-a))
    tl.store(DA + offs, (dh * b * s * (1.0 + a * (1.0 - s))).to(DA.dtype.element_ty), mask=mask)
    tl.store(DB + offs, (dh * a * s).to(DB.dtype.element_ty), mask=mask)


class _SiluGateFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a: Tensor, b: Tensor) -> Tensor:
        a, b = a.contiguous(), b.contiguous()
        h = torch.empty_like(a)
        n = a.numel()
        silu_gate_forward_kernel[(triton.cdiv(n, ELEMENTWISE_BLOCK),)](a, b, h, n, BLOCK=ELEMENTWISE_BLOCK)
        ctx.save_for_backward(a, b)
        return h

    @staticmethod
    def backward(ctx, dh: Tensor) -> tuple[Tensor, Tensor]:
        a, b = ctx.saved_tensors
        dh = dh.contiguous()
        da, db = torch.empty_like(a), torch.empty_like(b)
        n = a.numel()
        silu_gate_backward_kernel[(triton.cdiv(n, ELEMENTWISE_BLOCK),)](a, b, dh, da, db, n, BLOCK=ELEMENTWISE_BLOCK)
        return da, db


def silu_gate_reference(a: Tensor, b: Tensor) -> Tensor:
    """`cs336sys.model.SwiGLU`'s middle: silu(a) * b with silu(a) = a * sigmoid(a)."""
    return a * torch.sigmoid(a) * b


def silu_gate(a: Tensor, b: Tensor) -> Tensor:
    """silu(a) * b, elementwise, for a and b of one shape and dtype."""
    if a.shape != b.shape or a.dtype != b.dtype:
        raise ValueError(f"silu_gate needs a and b of one shape and dtype, got {tuple(a.shape)} {a.dtype} "
                         f"and {tuple(b.shape)} {b.dtype}")
    if not _use_kernels(a, b):
        return silu_gate_reference(a, b)
    return _SiluGateFunction.apply(a, b)


# ------------------------------------------------------------------------------------------- RoPE


@triton.jit
def rotary_kernel(X, COS, SIN, Y, heads, seq, half, sx_b, sx_h, sx_s, sx_d, sy_b, sy_h, sy_s, sy_d, sign,
                  BLOCK_S: tl.constexpr, BLOCK_HALF: tl.constexpr):
    """Rotate the pairs (x[2i], x[2i+1]) of BLOCK_S positions of one (batch, head) by `sign` times
    their angle (+1: the forward; -1: the backward, whose gradient is the inverse rotation).

    Whole rows of d_head are loaded and stored (contiguous, vectorised when x's last stride is 1),
    split into even and odd elements in registers. The heads of one block of positions are
    neighbouring programs, so the cos and sin rows they share are read from L2.
    """
    bh = tl.program_id(0)
    b = (bh // heads).to(tl.int64)
    h = (bh % heads).to(tl.int64)
    pos = tl.program_id(1).to(tl.int64) * BLOCK_S + tl.arange(0, BLOCK_S)
    pair = tl.arange(0, BLOCK_HALF)
    cols = tl.arange(0, 2 * BLOCK_HALF)
    in_seq = pos[:, None] < seq
    table = pos[:, None] * half + pair[None, :]
    cos = tl.load(COS + table, mask=in_seq & (pair[None, :] < half), other=0.0)
    sin = tl.load(SIN + table, mask=in_seq & (pair[None, :] < half), other=0.0) * sign
    mask = in_seq & (cols[None, :] < 2 * half)
    x = tl.load(X + b * sx_b + h * sx_h + pos[:, None] * sx_s + cols[None, :] * sx_d, mask=mask, other=0.0)
    x_even, x_odd = tl.split(tl.reshape(x.to(tl.float32), (BLOCK_S, BLOCK_HALF, 2)))
    y = tl.reshape(tl.join(x_even * cos - x_odd * sin, x_even * sin + x_odd * cos), (BLOCK_S, 2 * BLOCK_HALF))
    tl.store(Y + b * sy_b + h * sy_h + pos[:, None] * sy_s + cols[None, :] * sy_d, y.to(Y.dtype.element_ty),
             mask=mask)


def _rotate(x: Tensor, cos: Tensor, sin: Tensor, out: Tensor, sign: float) -> Tensor:
    batch, heads, seq, d = x.shape
    half = d // 2
    grid = (batch * heads, triton.cdiv(seq, ROPE_BLOCK_SEQ))
    rotary_kernel[grid](x, cos, sin, out, heads, seq, half, *x.stride(), *out.stride(), sign,
                        BLOCK_S=ROPE_BLOCK_SEQ, BLOCK_HALF=triton.next_power_of_2(half))
    return out


def _dense_strides(x: Tensor) -> tuple[int, ...] | None:
    """x's strides if x covers its storage densely in some order of its dimensions (a transposed
    view, say), else None."""
    expected = 1
    for i in sorted(range(x.ndim), key=lambda i: x.stride(i)):
        if x.shape[i] != 1 and x.stride(i) != expected:
            return None
        expected *= x.shape[i]
    return x.stride()


class _RotaryFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        ctx.save_for_backward(cos, sin)
        ctx.x_strides = _dense_strides(x)
        # contiguous (batch, heads, seq, d), as the model's stack-and-flatten returns it
        return _rotate(x, cos, sin, torch.empty(x.shape, dtype=x.dtype, device=x.device), 1.0)

    @staticmethod
    def backward(ctx, dy: Tensor) -> tuple[Tensor, None, None]:
        cos, sin = ctx.saved_tensors
        # dx in x's own layout: for the head split of a projection's output, the gradient then
        # flows back into the projection without a copy
        dx = (torch.empty_strided(dy.shape, ctx.x_strides, dtype=dy.dtype, device=dy.device)
              if ctx.x_strides is not None else torch.empty_like(dy, memory_format=torch.contiguous_format))
        return _rotate(dy, cos, sin, dx, -1.0), None, None


def rotary_reference(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """`cs336sys.model.RotaryEmbedding.forward`'s ops, for positions 0..seq-1."""
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    x_even, x_odd = x[..., 0::2], x[..., 1::2]
    return torch.stack((x_even * cos - x_odd * sin, x_even * sin + x_odd * cos), dim=-1).flatten(-2)


def rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """RoPE of x (batch, heads, seq, d_head) at positions 0..seq-1; cos and sin are float32 tables of
    shape (seq, d_head / 2), e.g. `RotaryEmbedding.cos[:seq]`."""
    if x.ndim != 4 or x.shape[-1] % 2:
        raise ValueError(f"rotary needs (batch, heads, seq, d_head) with an even d_head, got {tuple(x.shape)}")
    want = (x.shape[2], x.shape[3] // 2)
    if cos.shape != want or sin.shape != want:
        raise ValueError(f"cos and sin must have shape {want}, got {tuple(cos.shape)} and {tuple(sin.shape)}")
    if not _use_kernels(x, cos, sin):
        return rotary_reference(x, cos, sin)
    return _RotaryFunction.apply(x, cos.float().contiguous(), sin.float().contiguous())
