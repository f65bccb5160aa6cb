"""Part of `flash_triton`: the FlashAttention-2 forward as one fused Triton kernel (problem 9b/9c).

Grid: (query tiles, batch * heads). Each program keeps its query tile in registers and walks the
key/value tiles once with an online softmax in base 2 (log2(e) is folded into the score scale, so
the exponentials are exp2). With `is_causal` the walk has two parts: key tiles wholly at or below
the diagonal, with no masking, then the tiles that cross it, where masked scores get -1e6; tiles
wholly above the diagonal are never loaded. Loads use plain pointer arithmetic (no block
pointers), so the module works from Triton 3.2 to 3.9. All tensors are contiguous
(..., seq, d): row stride d, head stride seq * d, with batch and heads flattened into one grid axis.

The program's setup (its query tile and tile offsets, the score masks, the online-softmax step and
its result, the output store, the launch's buffers and scale) is written as helpers: the descriptor
(TMA) kernels that lost to these called them too (notes/flash_attention.md; removed after commit 1a6ada3).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from cs336sys.attention.flash_configs import Tiles

LOG2E = 1.4426950408889634


@triton.jit
def tile_offsets(bh, seq, idx, HEAD_DIM: tl.constexpr):
    """Element offsets of rows `idx` of head `bh` in a contiguous (..., seq, HEAD_DIM) tensor."""
    return bh * seq * HEAD_DIM + idx[:, None] * HEAD_DIM + tl.arange(0, HEAD_DIM)[None, :]


@triton.jit
def store_rows(base, offs, tile, idx, n, MASKED: tl.constexpr):
    """Store a tile at `base + offs` in base's dtype, rows `idx`; with MASKED, none at or past `n`."""
    if MASKED:
        tl.store(base + offs, tile.to(base.dtype.element_ty), mask=idx[:, None] < n)
    else:
        tl.store(base + offs, tile.to(base.dtype.element_ty))


@triton.jit
def query_tile(Q, seq_q, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, IS_CAUSAL: tl.constexpr,
               EVEN_M: tl.constexpr):
    """A forward program's query tile: (batch * head, first row, rows, offsets, Q). Grid (query
    tiles, batch * heads); causal grids start the last tiles first, which have the most keys to visit."""
    pid_m = tl.program_id(0)
    if IS_CAUSAL:
        pid_m = tl.num_programs(0) - 1 - pid_m
    bh = tl.program_id(1).to(tl.int64)
    m0 = pid_m * BLOCK_M
    rows = m0 + tl.arange(0, BLOCK_M)
    q_offs = tile_offsets(bh, seq_q, rows, HEAD_DIM)
    if EVEN_M:
        q = tl.load(Q + q_offs)
    else:
        q = tl.load(Q + q_offs, mask=rows[:, None] < seq_q, other=0.0)
    return bh, m0, rows, q_offs, q


@triton.jit
def softmax_start(BLOCK_M: tl.constexpr, HEAD_DIM: tl.constexpr):
    """The online softmax's empty state: (acc, row_sum, row_max)."""
    return (tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32), tl.zeros([BLOCK_M], dtype=tl.float32),
            tl.full([BLOCK_M], float("-inf"), dtype=tl.float32))


@triton.jit
def mask_scores(scores, rows, cols, seq_k, CAUSAL_MASK: tl.constexpr, KEY_MASK: tl.constexpr):
    """Scores above the diagonal get -1e6 (CAUSAL_MASK); keys past the end, which do not exist,
    get -inf, so their weight is exactly zero (KEY_MASK)."""
    if CAUSAL_MASK:
        scores = tl.where(rows[:, None] >= cols[None, :], scores, -1.0e6)
    if KEY_MASK:
        scores = tl.where(cols[None, :] < seq_k, scores, float("-inf"))
    return scores


@triton.jit
def online_softmax(row_sum, row_max, scores, qk_scale):
    """One online-softmax step over a tile of scores, base 2: (P, the factor for the running
    accumulator, new row_sum, new row_max)."""
    new_max = tl.maximum(row_max, tl.max(scores, 1) * qk_scale)
    p = tl.math.exp2(scores * qk_scale - new_max[:, None])
    correction = tl.math.exp2(row_max - new_max)
    return p, correction, row_sum * correction + tl.sum(p, 1), new_max


@triton.jit
def softmax_finish(acc, row_sum, row_max):
    """The online softmax's result: O = acc / row_sum, and the natural-log L (as saved) of its rows."""
    return acc / row_sum[:, None], (row_max + tl.math.log2(row_sum)) * 0.6931471805599453


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
        scores = mask_scores(tl.dot(q, tl.trans(k), input_precision=DOT), rows, cols, seq_k, CAUSAL_MASK, KEY_MASK)
        p, correction, row_sum, new_max = online_softmax(row_sum, row_max, scores, qk_scale)
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
    bh, m0, rows, q_offs, q = query_tile(Q, seq_q, HEAD_DIM, BLOCK_M, IS_CAUSAL, EVEN_M)
    k_base = K + bh * seq_k * HEAD_DIM
    v_base = V + bh * seq_k * HEAD_DIM
    acc, row_sum, row_max = softmax_start(BLOCK_M, HEAD_DIM)
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
    out, lse = softmax_finish(acc, row_sum, row_max)
    lse_ptrs = LSE + bh * seq_q + rows
    store_rows(O, q_offs, out, rows, seq_q, not EVEN_M)
    if EVEN_M:
        tl.store(lse_ptrs, lse)
    else:
        tl.store(lse_ptrs, lse, mask=rows < seq_q)


def softmax_scale(d: int) -> float:
    """The scores' scale in base 2, log2(e) / sqrt(d): the kernels' exponentials are exp2."""
    return LOG2E / math.sqrt(d)


def forward_buffers(q: torch.Tensor, block_m: int, block_n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Empty O and L (float32, q.shape[:-1]) for a forward whose tiles of block_m query rows step
    block_n keys; block_m must be a multiple of block_n, so that causal tiles meet on the diagonal."""
    if block_m % block_n:
        raise ValueError(f"block_m {block_m} must be a multiple of block_n {block_n}")
    return torch.empty_like(q), torch.empty(q.shape[:-1], dtype=torch.float32, device=q.device)


def flash_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool,
                  config: Tiles, precision: str = "tf32") -> tuple[torch.Tensor, torch.Tensor]:
    """O (q's shape) and natural-log L (q.shape[:-1], float32) for contiguous (..., seq, d) tensors
    whose leading dimensions (batch, or batch and heads) flatten to one. `precision`: how float32
    products run, "tf32" (Triton's default on tensor cores) or "ieee"; other dtypes ignore it."""
    *lead, seq_q, d = q.shape
    seq_k = k.shape[-2]
    out, lse = forward_buffers(q, config.block_m, config.block_n)
    flash_forward_kernel[(triton.cdiv(seq_q, config.block_m), math.prod(lead))](
        q, k, v, out, lse, seq_q, seq_k, softmax_scale(d),
        HEAD_DIM=d, BLOCK_M=config.block_m, BLOCK_N=config.block_n, IS_CAUSAL=is_causal,
        EVEN_M=seq_q % config.block_m == 0, EVEN_N=seq_k % config.block_n == 0, DOT=precision,
        num_warps=config.num_warps, num_stages=config.num_stages)
    return out, lse
