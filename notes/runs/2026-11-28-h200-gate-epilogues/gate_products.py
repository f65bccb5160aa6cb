"""The SwiGLU gate computed in the epilogues of the two products around it: this run's kernels (probe.py).

Not part of the package: in the optimised step they made it slower at every size tried on one H200 (README.md
here). They were the step's `gate_epilogues` option at d228be2 (with tests/test_gate_products.py there).

    y = gated_mlp(h, w13, w2)       # = (silu(a) * b) @ w2.T with a, b = (h @ w13.T).chunk(2, dim=-1)

In the optimised step the gate was Inductor's: one elementwise pass in the forward (read a and b,
write the gate) and one in the backward (read a, b and the gate's gradient, write a's and b's), each
at the copy bandwidth and together about 1.2 ms of medium's step on one H100
(notes/runs/2026-11-28-h100-inductor-kernels). Here the products do it on the tiles they have just
computed, before those leave the SM:

- `gate_forward`: (a, b) = h @ w13.T with each program computing the same columns of a and of b (two
  accumulators), then g = silu(a) b from them; it writes a, b (kept for the backward) and g.
- `gate_backward`: dg = dy @ w2, and on each tile of it da = dg b sig(a) (1 + a (1 - sig(a))) and
  db = dg silu(a), from a and b loaded in the epilogue; it writes da and db, and dg never exists.

The other products (y = g @ w2.T and the three of the backward) stay cuBLAS's. g is kept for w2's
gradient (Inductor recomputed it in the backward's pass). The mainloops read their tiles through
host-built tensor descriptors (TMA on Hopper, as in `cs336sys.attention.flash_triton_tma`) and store
through them; a, b (and da, db) are the two column halves of one (rows, 2 d_ff) tensor, each half its
own descriptor, so a tile never runs into the other half.

Rounding is the compiled model's: a, b and dg rounded to the inputs' dtype as the products return
them, the gate's arithmetic in fp32, each result rounded once. The kernels run on CUDA tensors, or on
any tensors when TRITON_INTERPRET=1 was set before triton was imported (the CPU tests, float32); the
functions otherwise compute the same with torch ops.
"""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from torch import Tensor
from torch.nn.functional import silu
from triton.tools.tensor_descriptor import TensorDescriptor

from cs336sys.leaderboard.fused_ops import _use_kernels


@dataclass(frozen=True)
class GateTiles:
    """A launch's tiles: block_m rows by block_n columns of the output (of each half in the forward), block_k
    of the reduction a step, tiles ordered in groups of group_m row blocks (for L2), stages of the mainloop's
    pipeline, warps a program."""

    block_m: int
    block_n: int
    block_k: int
    group_m: int = 8
    stages: int = 3
    warps: int = 8
    specialize: bool = False  # Triton's automatic warp specialisation of the mainloop (a producer warp for the TMA)


# the fastest of those tried at medium on one H200 (notes/runs/2026-11-28-h200-gate-epilogues); without warp
# specialisation the same tiles ran at about 60 % of that rate
FORWARD_TILES = GateTiles(128, 128, 64, stages=3, warps=8, specialize=True)   # two 128x128 accumulators
BACKWARD_TILES = GateTiles(128, 256, 64, stages=3, warps=8, specialize=True)
INTERPRETED_TILES = GateTiles(32, 32, 32, group_m=2, stages=1, warps=4)  # the CPU tests' small shapes


@triton.jit
def _tile_origin(M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """This program's output tile (first row, first column): row blocks taken GROUP_M at a time, so that
    programs running together share their tiles of both operands in L2."""
    pid = tl.program_id(0)
    blocks_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * blocks_n
    first_m = (pid // per_group) * GROUP_M
    group_size = tl.minimum(tl.cdiv(M, BLOCK_M) - first_m, GROUP_M)
    within = pid % per_group
    return (first_m + within % group_size) * BLOCK_M, (within // group_size) * BLOCK_N


@triton.jit
def gate_forward_kernel(x_desc, w1_desc, w3_desc, a_desc, b_desc, g_desc, M, N, K: tl.constexpr,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                        GROUP_M: tl.constexpr, STAGES: tl.constexpr, SPECIALIZE: tl.constexpr):
    """a = x w1^T and b = x w3^T on one (BLOCK_M, BLOCK_N) tile each, then g = silu(a) b from them rounded."""
    m0, n0 = _tile_origin(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    acc_a = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_b = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in tl.range(0, K, BLOCK_K, num_stages=STAGES, warp_specialize=SPECIALIZE):
        x = x_desc.load([m0, k])
        acc_a = tl.dot(x, tl.trans(w1_desc.load([n0, k])), acc_a)
        acc_b = tl.dot(x, tl.trans(w3_desc.load([n0, k])), acc_b)
    a = acc_a.to(g_desc.dtype)
    b = acc_b.to(g_desc.dtype)
    a_desc.store([m0, n0], a)
    b_desc.store([m0, n0], b)
    a32 = a.to(tl.float32)
    g_desc.store([m0, n0], (a32 * tl.sigmoid(a32) * b.to(tl.float32)).to(g_desc.dtype))


@triton.jit
def gate_backward_kernel(dy_desc, w2_desc, a_desc, b_desc, da_desc, db_desc, M, N, K: tl.constexpr,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                         GROUP_M: tl.constexpr, STAGES: tl.constexpr, SPECIALIZE: tl.constexpr):
    """dg = dy w2 on one (BLOCK_M, BLOCK_N) tile, rounded, then the gate's backward into da and db."""
    m0, n0 = _tile_origin(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in tl.range(0, K, BLOCK_K, num_stages=STAGES, warp_specialize=SPECIALIZE):
        acc = tl.dot(dy_desc.load([m0, k]), w2_desc.load([k, n0]), acc)
    dg = acc.to(da_desc.dtype).to(tl.float32)
    a = a_desc.load([m0, n0]).to(tl.float32)
    b = b_desc.load([m0, n0]).to(tl.float32)
    sig = tl.sigmoid(a)
    da_desc.store([m0, n0], (dg * b * sig * (1.0 + a * (1.0 - sig))).to(da_desc.dtype))
    db_desc.store([m0, n0], (dg * a * sig).to(db_desc.dtype))


# ----------------------------------------------------------------------------------- launches


def _tiles(tiles: GateTiles, t: Tensor) -> GateTiles:
    return tiles if t.device.type == "cuda" else INTERPRETED_TILES


@functools.cache
def _libcuda() -> ctypes.CDLL:
    return ctypes.CDLL("libcuda.so.1")


def _bind_context(t: Tensor) -> None:
    """Make t's device's primary context current on this thread, if none is: a host-built tensor descriptor is
    encoded by the driver in the current context, and autograd's device thread may have none until its first
    kernel launch (Triton's launcher binds one then; a backward's first descriptor comes before it)."""
    if t.device.type != "cuda":
        return
    cuda, context = _libcuda(), ctypes.c_void_p()
    if cuda.cuCtxGetCurrent(ctypes.byref(context)) == 0 and context.value:
        return
    device = ctypes.c_int()
    index = t.device.index if t.device.index is not None else torch.cuda.current_device()
    for status in (cuda.cuDeviceGet(ctypes.byref(device), index),
                   cuda.cuDevicePrimaryCtxRetain(ctypes.byref(context), device), cuda.cuCtxSetCurrent(context)):
        if status:
            raise RuntimeError(f"CUDA driver error {status} binding the context of {t.device}")


def _descriptor(t: Tensor, block: list[int]) -> TensorDescriptor:
    """A descriptor of 2-D t (its last dimension contiguous) read and written in tiles of `block`."""
    if t.data_ptr() % 16 or (t.stride(0) * t.element_size()) % 16:
        raise ValueError(f"a tensor descriptor needs a 16-byte aligned start and rows: {tuple(t.shape)} "
                         f"{t.dtype} with row stride {t.stride(0)}")
    return TensorDescriptor(t, list(t.shape), list(t.stride()), block)


def _halves(joined: Tensor) -> tuple[Tensor, Tensor]:
    """The two column halves of a (rows, 2 n) tensor, as strided views."""
    return joined.chunk(2, dim=-1)


def _check(x: Tensor, w: Tensor) -> None:
    if x.dtype != w.dtype:
        raise TypeError(f"the products take one dtype: {x.dtype} and {w.dtype}")
    _bind_context(x)


def _launch_gate_forward(x: Tensor, w13: Tensor, tiles: GateTiles | None = None) -> tuple[Tensor, Tensor]:
    _check(x, w13)
    tiles = _tiles(tiles or FORWARD_TILES, x)
    x, w13 = x.contiguous(), w13.contiguous()
    (rows, k), n = x.shape, w13.shape[0] // 2
    ab = torch.empty((rows, 2 * n), dtype=x.dtype, device=x.device)
    g = torch.empty((rows, n), dtype=x.dtype, device=x.device)
    tile, operand = [tiles.block_m, tiles.block_n], [tiles.block_n, tiles.block_k]
    w1, w3 = w13[:n], w13[n:]
    a, b = _halves(ab)
    grid = (triton.cdiv(rows, tiles.block_m) * triton.cdiv(n, tiles.block_n),)
    gate_forward_kernel[grid](
        _descriptor(x, [tiles.block_m, tiles.block_k]), _descriptor(w1, operand), _descriptor(w3, operand),
        _descriptor(a, tile), _descriptor(b, tile), _descriptor(g, tile), rows, n, k,
        BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n, BLOCK_K=tiles.block_k, GROUP_M=tiles.group_m,
        STAGES=tiles.stages, SPECIALIZE=tiles.specialize, num_warps=tiles.warps)
    return ab, g


def _launch_gate_backward(dy: Tensor, w2: Tensor, ab: Tensor, tiles: GateTiles | None = None) -> Tensor:
    _check(dy, w2)
    tiles = _tiles(tiles or BACKWARD_TILES, dy)
    dy, w2, ab = dy.contiguous(), w2.contiguous(), ab.contiguous()
    (rows, k), n = dy.shape, w2.shape[1]
    dab = torch.empty_like(ab)
    tile = [tiles.block_m, tiles.block_n]
    (a, b), (da, db) = _halves(ab), _halves(dab)
    grid = (triton.cdiv(rows, tiles.block_m) * triton.cdiv(n, tiles.block_n),)
    gate_backward_kernel[grid](
        _descriptor(dy, [tiles.block_m, tiles.block_k]), _descriptor(w2, [tiles.block_k, tiles.block_n]),
        _descriptor(a, tile), _descriptor(b, tile), _descriptor(da, tile), _descriptor(db, tile), rows, n, k,
        BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n, BLOCK_K=tiles.block_k, GROUP_M=tiles.group_m,
        STAGES=tiles.stages, SPECIALIZE=tiles.specialize, num_warps=tiles.warps)
    return dab


# For torch.compile each launcher is a custom operator, one opaque node of the graph
# (as `cs336sys.training.step_kernels`' are); eagerly the launchers are called directly.
@torch.library.custom_op("cs336sys::gate_forward", mutates_args=())
def _gate_forward_op(x: Tensor, w13: Tensor) -> tuple[Tensor, Tensor]:
    return _launch_gate_forward(x, w13)


@_gate_forward_op.register_fake
def _(x, w13):
    n = w13.shape[0] // 2
    return x.new_empty((x.shape[0], 2 * n)), x.new_empty((x.shape[0], n))


@torch.library.custom_op("cs336sys::gate_backward", mutates_args=())
def _gate_backward_op(dy: Tensor, w2: Tensor, ab: Tensor) -> Tensor:
    return _launch_gate_backward(dy, w2, ab)


@_gate_backward_op.register_fake
def _(dy, w2, ab):
    return torch.empty_like(ab)


def gate_forward_reference(x: Tensor, w13: Tensor) -> tuple[Tensor, Tensor]:
    """The kernel's results with torch ops: ab = x w13^T (rows, 2 n) and g = silu(a) b (rows, n)."""
    ab = x @ w13.T
    a, b = ab.float().chunk(2, dim=-1)
    return ab, (silu(a) * b).to(x.dtype)


def gate_backward_reference(dy: Tensor, w2: Tensor, ab: Tensor) -> Tensor:
    """The kernel's result with torch ops: (da, db) joined as ab is, for dg = dy w2."""
    dg = (dy @ w2).float()
    a, b = ab.float().chunk(2, dim=-1)
    sig = torch.sigmoid(a)
    return torch.cat((dg * b * sig * (1 + a * (1 - sig)), dg * a * sig), dim=-1).to(ab.dtype)


def gate_forward(x: Tensor, w13: Tensor) -> tuple[Tensor, Tensor]:
    """(ab, g) for x (rows, d_model) and w13 (2 d_ff, d_model), w1's rows then w3's: ab = x w13^T, whose
    halves are a and b, and the gate g = silu(a) b (rows, d_ff)."""
    if not _use_kernels(x, w13):
        return gate_forward_reference(x, w13)
    return (_gate_forward_op if torch.compiler.is_compiling() else _launch_gate_forward)(x, w13)


def gate_backward(dy: Tensor, w2: Tensor, ab: Tensor) -> Tensor:
    """The gradient of ab (a's then b's, as ab) from the gradient dy (rows, d_model) of y = g w2^T, for w2
    (d_model, d_ff) and ab `gate_forward`'s."""
    if not _use_kernels(dy, w2, ab):
        return gate_backward_reference(dy, w2, ab)
    return (_gate_backward_op if torch.compiler.is_compiling() else _launch_gate_backward)(dy, w2, ab)


class _GatedMLP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h: Tensor, w13: Tensor, w2: Tensor) -> Tensor:
        ab, g = gate_forward(h, w13)
        ctx.save_for_backward(h, w13, w2, ab, g)
        return g @ w2.T

    @staticmethod
    def backward(ctx, dy: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        h, w13, w2, ab, g = ctx.saved_tensors
        dy = dy.to(h.dtype)
        dab = gate_backward(dy, w2, ab)
        return dab @ w13, dab.T @ h, dy.T @ g


def gated_mlp(h: Tensor, w13: Tensor, w2: Tensor) -> Tensor:
    """(silu(a) * b) @ w2.T for a, b = (h @ w13.T).chunk(2, dim=-1), h (..., d_model) in the weights' dtype,
    with the gate in the products' epilogues (`gate_forward`, `gate_backward`)."""
    return _GatedMLP.apply(h.flatten(0, -2), w13, w2).view(*h.shape[:-1], w2.shape[0])
