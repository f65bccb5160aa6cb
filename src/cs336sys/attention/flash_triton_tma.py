"""FlashAttention-2 forward and backward whose inner loops load tiles through tensor descriptors.

The same algorithm as `flash_triton_forward` / `flash_triton_backward` (online softmax in base 2,
causal tiles above the diagonal skipped and only the diagonal tiles masked; backward by
recomputation with D = rowsum(O * dO), one launch of dQ programs then one of dK/dV programs, no
atomics), but every tile that the inner loop walks (K and V in the forward and in the dQ programs,
Q and dO in the dK/dV programs) is read through a host-built `TensorDescriptor`. On Hopper a
descriptor load is a TMA copy: the address arithmetic and bounds checks leave the loop, the copy
runs asynchronously into shared memory, and the compiler can hand the loads to a producer warp
(`tl.range(..., warp_specialize=True)`, Triton's automatic warp specialisation, which on sm_90
only splits loops whose loads are descriptor loads). The rest is the pointer kernels' own
helpers where it is the same code: the forward's query tile, score masks, online-softmax step and
output, the backward's tile offsets, loads of L, store of D and the step of each inner loop, and
the launches' buffers and scales.

Descriptors are 2-D over the flattened (batch * heads * seq, d) tensor. A tile that runs past the
end of one head's sequence reads the next head's first rows (or zeros past the end of the
tensor); those keys get score -inf, so their weights are exactly zero, and those query rows are
computed but never stored (the per-program loads and stores of Q, O, L, dQ, dK, dV use pointers
and masks, once per program). So any sequence length works.

Tile shapes: `TmaConfig`; the launch chooses nothing itself. Under TRITON_INTERPRET=1 the kernels
run on the CPU in float32 (the interpreter reads descriptors), which the tests use.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from cs336sys.attention.flash_triton_backward import (
    backward_scales,
    dkdv_step,
    dq_step,
    load_lse2,
    store_delta,
)
from cs336sys.attention.flash_triton_forward import (
    forward_buffers,
    mask_scores,
    online_softmax,
    query_tile,
    softmax_finish,
    softmax_scale,
    softmax_start,
    store_rows,
    tile_offsets,
)

# The compiled kernel of each kind's last launch, for inspecting its TTGIR/PTX
# (tools/flash_hopper_probe.py reads what the compiler did with warp specialisation and TMA).
LAUNCHED: dict[str, object] = {}


@dataclass(frozen=True)
class TmaConfig:
    """Forward: block_m query rows per program, block_n keys per step. Backward: dQ programs of
    q_m rows stepping q_n keys, dK/dV programs of kv_n keys stepping kv_m rows. warp_specialize:
    ask Triton to split the inner loops into producer (loads) and consumer (products) warps; on
    Hopper with Triton 3.6 the forward compiles without any specialised region and the backward
    kernels stop the compiler (an assertion in its warp-specialisation pass): kept for
    tools/flash_hopper_probe.py, which records what a Triton version does with it."""

    block_m: int = 128
    block_n: int = 64
    num_warps: int = 8
    num_stages: int = 3
    warp_specialize: bool = False
    prefetch: bool = False  # forward: issue the next tile's scores before this tile's softmax (causal, even keys)
    ws_diagonal: bool = False  # also the loop over the diagonal tiles (with warp_specialize)
    q_m: int = 64
    q_n: int = 64
    q_warps: int = 4
    q_stages: int = 3
    kv_m: int = 64
    kv_n: int = 64
    kv_warps: int = 4
    kv_stages: int = 3

    def __str__(self) -> str:
        ws = ("/ws+diag" if self.ws_diagonal else "/ws") if self.warp_specialize else ""
        ws += "/prefetch" if self.prefetch else ""
        return (f"fwd {self.block_m}x{self.block_n}/w{self.num_warps}/s{self.num_stages}, "
                f"dq {self.q_m}x{self.q_n}/w{self.q_warps}/s{self.q_stages}, "
                f"dkdv {self.kv_m}x{self.kv_n}/w{self.kv_warps}/s{self.kv_stages}{ws}")


def _descriptor(t: torch.Tensor, rows: int) -> TensorDescriptor:
    """A 2-D descriptor over a contiguous (..., seq, d) tensor, tiles of `rows` x d."""
    d = t.shape[-1]
    return TensorDescriptor(t, [t.numel() // d, d], [d, 1], [rows, d])


@triton.jit
def _fold(acc, row_sum, row_max, scores, v, qk_scale, DOT: tl.constexpr):
    """One online-softmax step: fold a tile of unmasked scores and its values into the state."""
    p, correction, row_sum, row_max = online_softmax(row_sum, row_max, scores, qk_scale)
    acc = tl.dot(p.to(v.dtype), v, acc * correction[:, None], input_precision=DOT)
    return acc, row_sum, row_max


@triton.jit
def _fwd_key_tiles(acc, row_sum, row_max, q, desc_k, desc_v, kv_row0, rows, n_start, n_end, seq_k, qk_scale,
                   BLOCK_N: tl.constexpr, CAUSAL_MASK: tl.constexpr, KEY_MASK: tl.constexpr,
                   WARP_SPECIALIZE: tl.constexpr, DOT: tl.constexpr):
    offs_n = tl.arange(0, BLOCK_N)
    for n0 in tl.range(n_start, n_end, BLOCK_N, warp_specialize=WARP_SPECIALIZE):
        scores = tl.dot(q, tl.trans(desc_k.load([kv_row0 + n0, 0])), input_precision=DOT)
        scores = mask_scores(scores, rows, n0 + offs_n, seq_k, CAUSAL_MASK, KEY_MASK)
        acc, row_sum, row_max = _fold(acc, row_sum, row_max, scores, desc_v.load([kv_row0 + n0, 0]), qk_scale, DOT)
    return acc, row_sum, row_max


@triton.jit
def _fwd_key_tiles_prefetched(acc, row_sum, row_max, q, desc_k, desc_v, kv_row0, n_start, n_end, qk_scale,
                              BLOCK_N: tl.constexpr, DOT: tl.constexpr):
    """Unmasked key tiles [n_start, n_end) (at least one), with the next tile's scores issued before
    this tile's softmax: the product QK^T of tile i+1 has no dependence on the softmax of tile i, so
    the tensor cores can run it while the softmax runs (FlashAttention-3's intra-warpgroup overlap,
    by hand: whether it overlaps is the compiler's and the hardware's affair)."""
    scores = tl.dot(q, tl.trans(desc_k.load([kv_row0 + n_start, 0])), input_precision=DOT)
    for n0 in range(n_start, n_end - BLOCK_N, BLOCK_N):
        following = tl.dot(q, tl.trans(desc_k.load([kv_row0 + n0 + BLOCK_N, 0])), input_precision=DOT)
        acc, row_sum, row_max = _fold(acc, row_sum, row_max, scores, desc_v.load([kv_row0 + n0, 0]), qk_scale, DOT)
        scores = following
    return _fold(acc, row_sum, row_max, scores, desc_v.load([kv_row0 + n_end - BLOCK_N, 0]), qk_scale, DOT)


@triton.jit
def tma_forward_kernel(Q, desc_k, desc_v, O, LSE, seq_q, seq_k, qk_scale,
                       HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       IS_CAUSAL: tl.constexpr, EVEN_M: tl.constexpr, EVEN_N: tl.constexpr,
                       WARP_SPECIALIZE: tl.constexpr, WS_DIAGONAL: tl.constexpr, PREFETCH: tl.constexpr,
                       DOT: tl.constexpr):
    bh, m0, rows, q_offs, q = query_tile(Q, seq_q, HEAD_DIM, BLOCK_M, IS_CAUSAL, EVEN_M)
    kv_row0 = (bh * seq_k).to(tl.int32)
    acc, row_sum, row_max = softmax_start(BLOCK_M, HEAD_DIM)
    if IS_CAUSAL:
        below_end = tl.minimum(m0, seq_k)
        if PREFETCH and EVEN_N:  # tiles below the diagonal are whole: no key mask
            if below_end > 0:
                acc, row_sum, row_max = _fwd_key_tiles_prefetched(acc, row_sum, row_max, q, desc_k, desc_v,
                                                                  kv_row0, 0, below_end, qk_scale, BLOCK_N, DOT)
        else:
            acc, row_sum, row_max = _fwd_key_tiles(acc, row_sum, row_max, q, desc_k, desc_v, kv_row0, rows, 0,
                                                   below_end, seq_k, qk_scale, BLOCK_N, False, not EVEN_N,
                                                   WARP_SPECIALIZE, DOT)
        acc, row_sum, row_max = _fwd_key_tiles(acc, row_sum, row_max, q, desc_k, desc_v, kv_row0, rows,
                                               below_end, tl.minimum(m0 + BLOCK_M, seq_k), seq_k, qk_scale,
                                               BLOCK_N, True, not EVEN_N, WS_DIAGONAL, DOT)
    else:
        acc, row_sum, row_max = _fwd_key_tiles(acc, row_sum, row_max, q, desc_k, desc_v, kv_row0, rows, 0,
                                               seq_k, seq_k, qk_scale, BLOCK_N, False, not EVEN_N,
                                               WARP_SPECIALIZE, DOT)
    out, lse = softmax_finish(acc, row_sum, row_max)
    store_rows(O, q_offs, out, rows, seq_q, not EVEN_M)
    if EVEN_M:
        tl.store(LSE + bh * seq_q + rows, lse)
    else:
        tl.store(LSE + bh * seq_q + rows, lse, mask=rows < seq_q)


def tma_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool, config: TmaConfig,
                precision: str = "tf32") -> tuple[torch.Tensor, torch.Tensor]:
    """O and natural-log L for contiguous (..., seq, d) q, k, v (leading dimensions flattened)."""
    *lead, seq_q, d = q.shape
    seq_k = k.shape[-2]
    c = config
    out, lse = forward_buffers(q, c.block_m, c.block_n)
    LAUNCHED["forward"] = tma_forward_kernel[(triton.cdiv(seq_q, c.block_m), math.prod(lead))](
        q, _descriptor(k, c.block_n), _descriptor(v, c.block_n), out, lse, seq_q, seq_k, softmax_scale(d),
        HEAD_DIM=d, BLOCK_M=c.block_m, BLOCK_N=c.block_n, IS_CAUSAL=is_causal,
        EVEN_M=seq_q % c.block_m == 0, EVEN_N=seq_k % c.block_n == 0, WARP_SPECIALIZE=c.warp_specialize,
        WS_DIAGONAL=c.warp_specialize and c.ws_diagonal, PREFETCH=c.prefetch,
        DOT=precision, num_warps=c.num_warps, num_stages=c.num_stages)
    return out, lse


@triton.jit
def _dq_key_tiles(dq, q, do, lse2, delta, desc_k, desc_v, kv_row0, rows, n_start, n_end, seq_k, qk_scale,
                  BLOCK_N: tl.constexpr, CAUSAL_MASK: tl.constexpr, KEY_MASK: tl.constexpr,
                  WARP_SPECIALIZE: tl.constexpr, DOT: tl.constexpr):
    offs_n = tl.arange(0, BLOCK_N)
    for n0 in tl.range(n_start, n_end, BLOCK_N, warp_specialize=WARP_SPECIALIZE):
        k = desc_k.load([kv_row0 + n0, 0])
        v = desc_v.load([kv_row0 + n0, 0])
        dq = dq_step(dq, q, do, k, v, lse2, delta, rows, n0, offs_n, seq_k, qk_scale, CAUSAL_MASK, KEY_MASK, DOT)
    return dq


@triton.jit
def tma_dq_kernel(Q, desc_k, desc_v, O, DO, LSE, DELTA, DQ, seq_q, seq_k, qk_scale, sm_scale,
                  HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  IS_CAUSAL: tl.constexpr, EVEN_M: tl.constexpr, EVEN_N: tl.constexpr,
                  WARP_SPECIALIZE: tl.constexpr, WS_DIAGONAL: tl.constexpr, DOT: tl.constexpr):
    """One query tile's dQ; also computes and stores D = rowsum(O * dO) for the dK/dV launch."""
    pid_m = tl.num_programs(0) - 1 - tl.program_id(0)  # longest first
    bh = tl.program_id(1).to(tl.int64)
    m0 = pid_m * BLOCK_M
    rows = m0 + tl.arange(0, BLOCK_M)
    offs = tile_offsets(bh, seq_q, rows, HEAD_DIM)
    row_ok = rows < seq_q
    q = tl.load(Q + offs, mask=row_ok[:, None], other=0.0)
    do = tl.load(DO + offs, mask=row_ok[:, None], other=0.0)
    delta = store_delta(DELTA, tl.load(O + offs, mask=row_ok[:, None], other=0.0), do, bh, rows, seq_q)
    lse2 = load_lse2(LSE, bh, rows, seq_q, True)
    kv_row0 = (bh * seq_k).to(tl.int32)
    dq = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    if IS_CAUSAL:
        below_end = tl.minimum(m0, seq_k)
        dq = _dq_key_tiles(dq, q, do, lse2, delta, desc_k, desc_v, kv_row0, rows, 0, below_end, seq_k,
                           qk_scale, BLOCK_N, False, not EVEN_N, WARP_SPECIALIZE, DOT)
        dq = _dq_key_tiles(dq, q, do, lse2, delta, desc_k, desc_v, kv_row0, rows, below_end,
                           tl.minimum(m0 + BLOCK_M, seq_k), seq_k, qk_scale, BLOCK_N, True, not EVEN_N,
                           WS_DIAGONAL, DOT)
    else:
        dq = _dq_key_tiles(dq, q, do, lse2, delta, desc_k, desc_v, kv_row0, rows, 0, seq_k, seq_k, qk_scale,
                           BLOCK_N, False, not EVEN_N, WARP_SPECIALIZE, DOT)
    if EVEN_M:
        tl.store(DQ + offs, (dq * sm_scale).to(DQ.dtype.element_ty))
    else:
        tl.store(DQ + offs, (dq * sm_scale).to(DQ.dtype.element_ty), mask=row_ok[:, None])


@triton.jit
def _dkdv_query_tiles(dk, dv, k, v, desc_q, desc_do, LSE, DELTA, lse_row0, q_row0, cols, m_start, m_end,
                      seq_q, qk_scale, BLOCK_M: tl.constexpr, CAUSAL_MASK: tl.constexpr,
                      ROW_MASK: tl.constexpr, WARP_SPECIALIZE: tl.constexpr, DOT: tl.constexpr):
    offs_m = tl.arange(0, BLOCK_M)
    for m0 in tl.range(m_start, m_end, BLOCK_M, warp_specialize=WARP_SPECIALIZE):
        q = desc_q.load([q_row0 + m0, 0])
        do = desc_do.load([q_row0 + m0, 0])
        rows = m0 + offs_m
        if ROW_MASK:  # L = +inf past the end: P exactly zero there
            lse2 = tl.load(LSE + lse_row0 + rows, mask=rows < seq_q, other=float("inf")) * 1.4426950408889634
            delta = tl.load(DELTA + lse_row0 + rows, mask=rows < seq_q, other=0.0)
        else:
            lse2 = tl.load(LSE + lse_row0 + rows) * 1.4426950408889634
            delta = tl.load(DELTA + lse_row0 + rows)
        dk, dv = dkdv_step(dk, dv, k, v, q, do, lse2, delta, rows, cols, qk_scale, CAUSAL_MASK, DOT)
    return dk, dv


@triton.jit
def tma_dkdv_kernel(desc_q, K, V, desc_do, LSE, DELTA, DK, DV, seq_q, seq_k, qk_scale, sm_scale,
                    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                    IS_CAUSAL: tl.constexpr, EVEN_M: tl.constexpr, EVEN_N: tl.constexpr,
                    WARP_SPECIALIZE: tl.constexpr, WS_DIAGONAL: tl.constexpr, DOT: tl.constexpr):
    """One key tile's dK and dV over the query tiles that see it."""
    pid_n = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    n0 = pid_n * BLOCK_N
    cols = n0 + tl.arange(0, BLOCK_N)
    offs = tile_offsets(bh, seq_k, cols, HEAD_DIM)
    col_ok = cols < seq_k
    k = tl.load(K + offs, mask=col_ok[:, None], other=0.0)
    v = tl.load(V + offs, mask=col_ok[:, None], other=0.0)
    q_row0 = (bh * seq_q).to(tl.int32)
    lse_row0 = bh * seq_q
    dk = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    if IS_CAUSAL:
        diag_end = tl.minimum(n0 + BLOCK_N, seq_q)
        dk, dv = _dkdv_query_tiles(dk, dv, k, v, desc_q, desc_do, LSE, DELTA, lse_row0, q_row0, cols, n0,
                                   diag_end, seq_q, qk_scale, BLOCK_M, True, not EVEN_M, WS_DIAGONAL, DOT)
        dk, dv = _dkdv_query_tiles(dk, dv, k, v, desc_q, desc_do, LSE, DELTA, lse_row0, q_row0, cols,
                                   diag_end, seq_q, seq_q, qk_scale, BLOCK_M, False, not EVEN_M,
                                   WARP_SPECIALIZE, DOT)
    else:
        dk, dv = _dkdv_query_tiles(dk, dv, k, v, desc_q, desc_do, LSE, DELTA, lse_row0, q_row0, cols, 0,
                                   seq_q, seq_q, qk_scale, BLOCK_M, False, not EVEN_M, WARP_SPECIALIZE, DOT)
    if EVEN_N:
        tl.store(DK + offs, (dk * sm_scale).to(DK.dtype.element_ty))
        tl.store(DV + offs, dv.to(DV.dtype.element_ty))
    else:
        tl.store(DK + offs, (dk * sm_scale).to(DK.dtype.element_ty), mask=col_ok[:, None])
        tl.store(DV + offs, dv.to(DV.dtype.element_ty), mask=col_ok[:, None])


def tma_dq(q, k, v, out, lse, grad_out, is_causal: bool, config: TmaConfig, precision: str = "tf32"):
    """dQ, and D = rowsum(O * dO) for `tma_dkdv`: the first launch of the backward."""
    *lead, seq_q, d = q.shape
    seq_k = k.shape[-2]
    c = config
    if c.q_m % c.q_n:
        raise ValueError(f"q_m {c.q_m} must be a multiple of q_n {c.q_n}")
    delta = torch.empty_like(lse)
    dq = torch.empty_like(q)
    LAUNCHED["dq"] = tma_dq_kernel[(triton.cdiv(seq_q, c.q_m), math.prod(lead))](
        q, _descriptor(k, c.q_n), _descriptor(v, c.q_n), out, grad_out, lse, delta, dq, seq_q, seq_k,
        *backward_scales(d), HEAD_DIM=d, BLOCK_M=c.q_m, BLOCK_N=c.q_n, IS_CAUSAL=is_causal,
        EVEN_M=seq_q % c.q_m == 0, EVEN_N=seq_k % c.q_n == 0, WARP_SPECIALIZE=c.warp_specialize,
        WS_DIAGONAL=c.warp_specialize and c.ws_diagonal,
        DOT=precision, num_warps=c.q_warps, num_stages=c.q_stages)
    return dq, delta


def tma_dkdv(q, k, v, lse, delta, grad_out, is_causal: bool, config: TmaConfig, precision: str = "tf32"):
    """dK and dV: the second launch of the backward (D from `tma_dq`)."""
    *lead, seq_q, d = q.shape
    seq_k = k.shape[-2]
    c = config
    if c.kv_n % c.kv_m:
        raise ValueError(f"kv_n {c.kv_n} must be a multiple of kv_m {c.kv_m}")
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    LAUNCHED["dkdv"] = tma_dkdv_kernel[(triton.cdiv(seq_k, c.kv_n), math.prod(lead))](
        _descriptor(q, c.kv_m), k, v, _descriptor(grad_out, c.kv_m), lse, delta, dk, dv, seq_q, seq_k,
        *backward_scales(d), HEAD_DIM=d, BLOCK_M=c.kv_m, BLOCK_N=c.kv_n, IS_CAUSAL=is_causal,
        EVEN_M=seq_q % c.kv_m == 0, EVEN_N=seq_k % c.kv_n == 0, WARP_SPECIALIZE=c.warp_specialize,
        WS_DIAGONAL=c.warp_specialize and c.ws_diagonal,
        DOT=precision, num_warps=c.kv_warps, num_stages=c.kv_stages)
    return dk, dv


def tma_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
                 grad_out: torch.Tensor, is_causal: bool, config: TmaConfig, precision: str = "tf32",
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dQ, dK, dV for contiguous (..., seq, d) tensors, from the forward's O and L."""
    dq, delta = tma_dq(q, k, v, out, lse, grad_out, is_causal, config, precision)
    dk, dv = tma_dkdv(q, k, v, lse, delta, grad_out, is_causal, config, precision)
    return dq, dk, dv
