"""FlashAttention-2 forward as one fused Triton kernel (problem 9b/9c).

Grid: (query tiles, batch * heads). Each program keeps its query tile in registers and walks the
key/value tiles once with an online softmax in base 2 (log2(e) is folded into the score scale, so
the exponentials are exp2). With `is_causal` the walk has two parts: key tiles wholly at or below
the diagonal, with no masking, then the tiles that cross it, where masked scores get -1e6; tiles
wholly above the diagonal are never loaded. Loads use plain pointer arithmetic (no block
pointers), so the module works from Triton 3.2 to 3.9. All tensors are contiguous
(..., seq, d): row stride d, head stride seq * d, with batch and heads flattened into one grid axis.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from cs336sys.attention.flash_configs import Tiles

LOG2E = 1.4426950408889634


@triton.jit
def _attend_key_tiles(acc, row_sum, row_max, q, k_base, v_base, rows, n_start, n_end, seq_k, qk_scale,
                      HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
                      CAUSAL_MASK: tl.constexpr, KEY_MASK: tl.constexpr, DOT: tl.constexpr):
    """Fold key tiles [n_start, n_end) into the running (acc, row_sum, row_max), base-2 units."""
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    for n0 in range(n_start, n_end, BLOCK_N):
        cols = n0 + offs_n
        offs = cols[:, None] * HEAD_DIM + offs_d[None, :]
        if KEY_MASK:
            k = tl.load(k_base + offs, mask=cols[:, None] < seq_k, other=0.0)
        else:
            k = tl.load(k_base + offs)
        scores = tl.dot(q, tl.trans(k), input_precision=DOT)
        if CAUSAL_MASK:
            scores = tl.where(rows[:, None] >= cols[None, :], scores, -1.0e6)
        if KEY_MASK:  # keys past the end do not exist: weight exactly zero
            scores = tl.where(cols[None, :] < seq_k, scores, float("-inf"))
        new_max = tl.maximum(row_max, tl.max(scores, 1) * qk_scale)
        p = tl.math.exp2(scores * qk_scale - new_max[:, None])
        correction = tl.math.exp2(row_max - new_max)
        row_sum = row_sum * correction + tl.sum(p, 1)
        if KEY_MASK:
            v = tl.load(v_base + offs, mask=cols[:, None] < seq_k, other=0.0)
        else:
            v = tl.load(v_base + offs)
        acc = tl.dot(p.to(v.dtype), v, acc * correction[:, None], input_precision=DOT)
        row_max = new_max
    return acc, row_sum, row_max


@triton.jit
def flash_forward_kernel(Q, K, V, O, LSE, seq_q, seq_k, qk_scale,
                         HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                         IS_CAUSAL: tl.constexpr, EVEN_M: tl.constexpr, EVEN_N: tl.constexpr,
                         DOT: tl.constexpr = "tf32"):
    pid_m = tl.program_id(0)
    if IS_CAUSAL:  # the last query tiles have the most keys to visit: start them first
        pid_m = tl.num_programs(0) - 1 - pid_m
    bh = tl.program_id(1).to(tl.int64)
    m0 = pid_m * BLOCK_M
    rows = m0 + tl.arange(0, BLOCK_M)
    q_offs = bh * seq_q * HEAD_DIM + rows[:, None] * HEAD_DIM + tl.arange(0, HEAD_DIM)[None, :]
    if EVEN_M:
        q = tl.load(Q + q_offs)
    else:
        q = tl.load(Q + q_offs, mask=rows[:, None] < seq_q, other=0.0)
    k_base = K + bh * seq_k * HEAD_DIM
    v_base = V + bh * seq_k * HEAD_DIM

    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    row_sum = tl.zeros([BLOCK_M], dtype=tl.float32)
    row_max = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    if IS_CAUSAL:
        # BLOCK_M is a multiple of BLOCK_N, so m0 is a tile boundary between the two parts.
        below_end = tl.minimum(m0, seq_k)
        acc, row_sum, row_max = _attend_key_tiles(acc, row_sum, row_max, q, k_base, v_base, rows, 0,
                                                  below_end, seq_k, qk_scale, HEAD_DIM, BLOCK_N, False,
                                                  not EVEN_N, DOT)
        acc, row_sum, row_max = _attend_key_tiles(acc, row_sum, row_max, q, k_base, v_base, rows,
                                                  below_end, tl.minimum(m0 + BLOCK_M, seq_k), seq_k,
                                                  qk_scale, HEAD_DIM, BLOCK_N, True, not EVEN_N, DOT)
    else:
        acc, row_sum, row_max = _attend_key_tiles(acc, row_sum, row_max, q, k_base, v_base, rows, 0,
                                                  seq_k, seq_k, qk_scale, HEAD_DIM, BLOCK_N, False,
                                                  not EVEN_N, DOT)

    out = acc / row_sum[:, None]
    lse = (row_max + tl.math.log2(row_sum)) * 0.6931471805599453  # natural-log L, as saved
    lse_ptrs = LSE + bh * seq_q + rows
    if EVEN_M:
        tl.store(O + q_offs, out.to(O.dtype.element_ty))
        tl.store(lse_ptrs, lse)
    else:
        tl.store(O + q_offs, out.to(O.dtype.element_ty), mask=rows[:, None] < seq_q)
        tl.store(lse_ptrs, lse, mask=rows < seq_q)


def flash_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool,
                  config: Tiles, precision: str = "tf32") -> tuple[torch.Tensor, torch.Tensor]:
    """O (q's shape) and natural-log L (q.shape[:-1], float32) for contiguous (..., seq, d) tensors
    whose leading dimensions (batch, or batch and heads) flatten to one. `precision`: how float32
    products run, "tf32" (Triton's default on tensor cores) or "ieee"; other dtypes ignore it."""
    *lead, seq_q, d = q.shape
    seq_k = k.shape[-2]
    if config.block_m % config.block_n:
        raise ValueError(f"block_m {config.block_m} must be a multiple of block_n {config.block_n}")
    out = torch.empty_like(q)
    lse = torch.empty(lead + [seq_q], dtype=torch.float32, device=q.device)
    flash_forward_kernel[(triton.cdiv(seq_q, config.block_m), math.prod(lead))](
        q, k, v, out, lse, seq_q, seq_k, LOG2E / math.sqrt(d),
        HEAD_DIM=d, BLOCK_M=config.block_m, BLOCK_N=config.block_n, IS_CAUSAL=is_causal,
        EVEN_M=seq_q % config.block_m == 0, EVEN_N=seq_k % config.block_n == 0, DOT=precision,
        num_warps=config.num_warps, num_stages=config.num_stages)
    return out, lse
