"""Part of `flash_triton`: the FlashAttention-2 backward kernels (problem 10), recomputing with D = rowsum(O * dO).

`backward_kernel` has two kinds of program:
  - dK/dV programs, one per key tile: walk the query tiles that can see the tile, recompute
    P = exp(S - L), accumulate dV += P^T dO and dK += dS^T Q in registers, dS = P (dP - D);
  - dQ programs, one per query tile: walk the key tiles it can see, accumulate dQ += dS K.
Both need D = rowsum(O * dO) per query row (fp32). Either one launch per kind, dQ first, whose
programs compute D and store it for the dK/dV launch (each kind gets its own register
allocation; faster at d <= 64 with many heads), or `backward_delta_kernel` for D and then one
launch running both kinds, interleaved, which fills the GPU when one head of a long sequence
gives too few programs of each kind (flash_configs chooses).
No atomics: every program owns its output, at the price of recomputing S and dP for dQ (7 tile
products per tile pair instead of 5). Measured on an H100 (notes/flash_attention.md), that beat
adding dQ from the dK/dV programs with fp32 atomics.
Causal tile skipping as in the forward: tiles wholly above the diagonal are never visited and
only tiles that cross it compare indices.

All tensors are contiguous (..., seq, d): row stride d, head stride seq * d, with batch and heads
flattened into one grid axis. The step of each inner loop (`dq_step`, `dkdv_step`), the loads of L
and the store of D, and the launch's scales are helpers, which the descriptor (TMA) kernels that
lost to these called too (notes/flash_attention.md; removed after commit 1a6ada3).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from cs336sys.attention.flash_configs import BackwardConfig
from cs336sys.attention.flash_triton_forward import LOG2E, tile_offsets


@triton.jit
def backward_delta_kernel(O, DO, DELTA, seq_q, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr):
    bh = tl.program_id(1).to(tl.int64)
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs = tile_offsets(bh, seq_q, rows, HEAD_DIM)
    mask = rows[:, None] < seq_q
    o = tl.load(O + offs, mask=mask, other=0.0).to(tl.float32)
    do = tl.load(DO + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(DELTA + bh * seq_q + rows, tl.sum(o * do, 1), mask=rows < seq_q)


@triton.jit
def store_delta(DELTA, o, do, bh, rows, seq_q):
    """D = rowsum(O * dO) of a query tile's rows, stored for the dK/dV programs."""
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
    tl.store(DELTA + bh * seq_q + rows, delta, mask=rows < seq_q)
    return delta


@triton.jit
def load_lse2(LSE, bh, rows, seq_q, MASKED: tl.constexpr):
    """The forward's natural-log L of a query tile's rows, in base 2; with MASKED, +inf for rows at
    or past `seq_q`, which makes their P exactly zero."""
    if MASKED:
        lse = tl.load(LSE + bh * seq_q + rows, mask=rows < seq_q, other=float("inf"))
    else:
        lse = tl.load(LSE + bh * seq_q + rows)
    return lse * 1.4426950408889634


@triton.jit
def dkdv_step(dk, dv, k, v, q, do, lse2, delta, rows, cols, qk_scale, CAUSAL_MASK: tl.constexpr, DOT: tl.constexpr):
    """Accumulate one key tile's dK, dV over one query tile, in transposed tiles: P^T is (keys, queries)."""
    p_t = tl.math.exp2(tl.dot(k, tl.trans(q), input_precision=DOT) * qk_scale - lse2[None, :])
    if CAUSAL_MASK:
        p_t = tl.where(rows[None, :] >= cols[:, None], p_t, 0.0)
    dv = tl.dot(p_t.to(do.dtype), do, dv, input_precision=DOT)
    ds_t = p_t * (tl.dot(v, tl.trans(do), input_precision=DOT) - delta[None, :])
    dk = tl.dot(ds_t.to(q.dtype), q, dk, input_precision=DOT)
    return dk, dv


@triton.jit
def dq_step(dq, q, do, k, v, lse2, delta, rows, n0, offs_n, seq_k, qk_scale, CAUSAL_MASK: tl.constexpr,
            KEY_MASK: tl.constexpr, DOT: tl.constexpr):
    """Accumulate one query tile's dQ (unscaled) over the key tile at n0; with KEY_MASK, keys at or
    past `seq_k` get P = 0."""
    p = tl.math.exp2(tl.dot(q, tl.trans(k), input_precision=DOT) * qk_scale - lse2[:, None])
    cols = n0 + offs_n
    if CAUSAL_MASK:
        p = tl.where(rows[:, None] >= cols[None, :], p, 0.0)
    if KEY_MASK:
        p = tl.where(cols[None, :] < seq_k, p, 0.0)
    ds = p * (tl.dot(do, tl.trans(v), input_precision=DOT) - delta[:, None])
    return tl.dot(ds.to(k.dtype), k, dq, input_precision=DOT)


@triton.jit
def _dkdv_over_query_tiles(dk, dv, k, v, q_base, do_base, lse_base, delta_base, cols, m_start, m_end,
                           seq_q, qk_scale, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                           CAUSAL_MASK: tl.constexpr, ROW_MASK: tl.constexpr, DOT: tl.constexpr):
    """Accumulate one key tile's dK, dV over query tiles [m_start, m_end)."""
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    for m0 in range(m_start, m_end, BLOCK_M):
        rows = m0 + offs_m
        offs = rows[:, None] * HEAD_DIM + offs_d[None, :]
        if ROW_MASK:
            q = tl.load(q_base + offs, mask=rows[:, None] < seq_q, other=0.0)
            do = tl.load(do_base + offs, mask=rows[:, None] < seq_q, other=0.0)
            # L = +inf for rows past the end makes their P exactly zero.
            lse2 = tl.load(lse_base + rows, mask=rows < seq_q, other=float("inf")) * 1.4426950408889634
            delta = tl.load(delta_base + rows, mask=rows < seq_q, other=0.0)
        else:
            q = tl.load(q_base + offs)
            do = tl.load(do_base + offs)
            lse2 = tl.load(lse_base + rows) * 1.4426950408889634
            delta = tl.load(delta_base + rows)
        dk, dv = dkdv_step(dk, dv, k, v, q, do, lse2, delta, rows, cols, qk_scale, CAUSAL_MASK, DOT)
    return dk, dv


@triton.jit
def _dkdv_program(Q, K, V, DO, LSE, DELTA, DK, DV, bh, pid_n, seq_q, seq_k, qk_scale, sm_scale,
                  HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  IS_CAUSAL: tl.constexpr, EVEN_M: tl.constexpr, EVEN_N: tl.constexpr, DOT: tl.constexpr):
    n0 = pid_n * BLOCK_N
    cols = n0 + tl.arange(0, BLOCK_N)
    kv_offs = tile_offsets(bh, seq_k, cols, HEAD_DIM)
    if EVEN_N:
        k = tl.load(K + kv_offs)
        v = tl.load(V + kv_offs)
    else:  # zero keys/values past the end contribute nothing and are not stored
        k = tl.load(K + kv_offs, mask=cols[:, None] < seq_k, other=0.0)
        v = tl.load(V + kv_offs, mask=cols[:, None] < seq_k, other=0.0)
    q_base = Q + bh * seq_q * HEAD_DIM
    do_base = DO + bh * seq_q * HEAD_DIM
    lse_base = LSE + bh * seq_q
    delta_base = DELTA + bh * seq_q
    dk = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    if IS_CAUSAL:
        # BLOCK_N is a multiple of BLOCK_M: queries in [n0, n0 + BLOCK_N) cross the diagonal,
        # later ones see the whole tile, earlier ones none of it.
        diag_end = tl.minimum(n0 + BLOCK_N, seq_q)
        dk, dv = _dkdv_over_query_tiles(dk, dv, k, v, q_base, do_base, lse_base, delta_base, cols, n0,
                                        diag_end, seq_q, qk_scale, HEAD_DIM, BLOCK_M, True, not EVEN_M, DOT)
        dk, dv = _dkdv_over_query_tiles(dk, dv, k, v, q_base, do_base, lse_base, delta_base, cols,
                                        diag_end, seq_q, seq_q, qk_scale, HEAD_DIM, BLOCK_M, False,
                                        not EVEN_M, DOT)
    else:
        dk, dv = _dkdv_over_query_tiles(dk, dv, k, v, q_base, do_base, lse_base, delta_base, cols, 0,
                                        seq_q, seq_q, qk_scale, HEAD_DIM, BLOCK_M, False, not EVEN_M, DOT)
    if EVEN_N:
        tl.store(DK + kv_offs, (dk * sm_scale).to(DK.dtype.element_ty))
        tl.store(DV + kv_offs, dv.to(DV.dtype.element_ty))
    else:
        tl.store(DK + kv_offs, (dk * sm_scale).to(DK.dtype.element_ty), mask=cols[:, None] < seq_k)
        tl.store(DV + kv_offs, dv.to(DV.dtype.element_ty), mask=cols[:, None] < seq_k)


@triton.jit
def _dq_over_key_tiles(dq, q, do, lse2, delta, k_base, v_base, rows, n_start, n_end, seq_k, qk_scale,
                       HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL_MASK: tl.constexpr,
                       KEY_MASK: tl.constexpr, DOT: tl.constexpr):
    """Accumulate one query tile's dQ (unscaled) over key tiles [n_start, n_end). Keys past the end
    load as zeros, so they add nothing (dS K with K = 0): no mask on P."""
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    for n0 in range(n_start, n_end, BLOCK_N):
        cols = n0 + offs_n
        offs = cols[:, None] * HEAD_DIM + offs_d[None, :]
        if KEY_MASK:
            k = tl.load(k_base + offs, mask=cols[:, None] < seq_k, other=0.0)
            v = tl.load(v_base + offs, mask=cols[:, None] < seq_k, other=0.0)
        else:
            k = tl.load(k_base + offs)
            v = tl.load(v_base + offs)
        dq = dq_step(dq, q, do, k, v, lse2, delta, rows, n0, offs_n, seq_k, qk_scale, CAUSAL_MASK, False, DOT)
    return dq


@triton.jit
def _dq_program(Q, K, V, O, DO, LSE, DELTA, DQ, bh, pid_m, seq_q, seq_k, qk_scale, sm_scale,
                HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                IS_CAUSAL: tl.constexpr, EVEN_M: tl.constexpr, EVEN_N: tl.constexpr,
                DELTA_FROM_O: tl.constexpr, DOT: tl.constexpr):
    m0 = pid_m * BLOCK_M
    rows = m0 + tl.arange(0, BLOCK_M)
    q_offs = tile_offsets(bh, seq_q, rows, HEAD_DIM)
    if EVEN_M:
        q = tl.load(Q + q_offs)
        do = tl.load(DO + q_offs)
    else:
        q = tl.load(Q + q_offs, mask=rows[:, None] < seq_q, other=0.0)
        do = tl.load(DO + q_offs, mask=rows[:, None] < seq_q, other=0.0)
    lse2 = load_lse2(LSE, bh, rows, seq_q, not EVEN_M)
    if DELTA_FROM_O:  # D = rowsum(O * dO) here, stored for the dK/dV programs launched next
        delta = store_delta(DELTA, tl.load(O + q_offs, mask=rows[:, None] < seq_q, other=0.0), do, bh, rows, seq_q)
    else:
        delta = tl.load(DELTA + bh * seq_q + rows, mask=rows < seq_q, other=0.0)
    k_base = K + bh * seq_k * HEAD_DIM
    v_base = V + bh * seq_k * HEAD_DIM
    dq = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    if IS_CAUSAL:
        below_end = tl.minimum(m0, seq_k)  # BLOCK_M is a multiple of BLOCK_N
        dq = _dq_over_key_tiles(dq, q, do, lse2, delta, k_base, v_base, rows, 0, below_end, seq_k,
                                qk_scale, HEAD_DIM, BLOCK_N, False, not EVEN_N, DOT)
        dq = _dq_over_key_tiles(dq, q, do, lse2, delta, k_base, v_base, rows, below_end,
                                tl.minimum(m0 + BLOCK_M, seq_k), seq_k, qk_scale, HEAD_DIM, BLOCK_N,
                                True, not EVEN_N, DOT)
    else:
        dq = _dq_over_key_tiles(dq, q, do, lse2, delta, k_base, v_base, rows, 0, seq_k, seq_k,
                                qk_scale, HEAD_DIM, BLOCK_N, False, not EVEN_N, DOT)
    if EVEN_M:
        tl.store(DQ + q_offs, (dq * sm_scale).to(DQ.dtype.element_ty))
    else:
        tl.store(DQ + q_offs, (dq * sm_scale).to(DQ.dtype.element_ty), mask=rows[:, None] < seq_q)


@triton.jit
def backward_kernel(Q, K, V, O, DO, LSE, DELTA, DQ, DK, DV, seq_q, seq_k, qk_scale, sm_scale,
                    HEAD_DIM: tl.constexpr, IS_CAUSAL: tl.constexpr, PROGRAMS: tl.constexpr,
                    BLOCK_M_KV: tl.constexpr, BLOCK_N_KV: tl.constexpr,
                    BLOCK_M_Q: tl.constexpr, BLOCK_N_Q: tl.constexpr,
                    EVEN_M_KV: tl.constexpr, EVEN_N_KV: tl.constexpr,
                    EVEN_M_Q: tl.constexpr, EVEN_N_Q: tl.constexpr, DELTA_FROM_O: tl.constexpr,
                    DOT: tl.constexpr = "tf32"):
    """Grid (programs, batch*heads). PROGRAMS = "dkdv" or "dq": one kind, longest first;
    "both": key tiles + query tiles programs, where pairs (dK/dV of key tile i, dQ of query tile
    n_q - 1 - i) alternate, so that with a causal mask the longest of both kinds go first.
    DELTA_FROM_O: the dQ programs compute D = rowsum(O * dO) and store it (else they read it)."""
    pid = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    n_q = tl.cdiv(seq_q, BLOCK_M_Q)
    if PROGRAMS == "dkdv":
        _dkdv_program(Q, K, V, DO, LSE, DELTA, DK, DV, bh, pid, seq_q, seq_k, qk_scale, sm_scale,
                      HEAD_DIM, BLOCK_M_KV, BLOCK_N_KV, IS_CAUSAL, EVEN_M_KV, EVEN_N_KV, DOT)
    elif PROGRAMS == "dq":
        _dq_program(Q, K, V, O, DO, LSE, DELTA, DQ, bh, n_q - 1 - pid, seq_q, seq_k, qk_scale, sm_scale,
                    HEAD_DIM, BLOCK_M_Q, BLOCK_N_Q, IS_CAUSAL, EVEN_M_Q, EVEN_N_Q, DELTA_FROM_O, DOT)
    else:
        n_kv = tl.cdiv(seq_k, BLOCK_N_KV)
        both = tl.minimum(n_kv, n_q)
        if pid < 2 * both:
            is_dkdv = pid % 2 == 0
            kv_tile = pid // 2
            q_tile = n_q - 1 - pid // 2
        else:  # the longer kind's remaining programs
            is_dkdv = n_kv > n_q
            kv_tile = pid - both
            q_tile = n_q - 1 - (pid - both)
        if is_dkdv:
            _dkdv_program(Q, K, V, DO, LSE, DELTA, DK, DV, bh, kv_tile, seq_q, seq_k, qk_scale, sm_scale,
                          HEAD_DIM, BLOCK_M_KV, BLOCK_N_KV, IS_CAUSAL, EVEN_M_KV, EVEN_N_KV, DOT)
        else:
            _dq_program(Q, K, V, O, DO, LSE, DELTA, DQ, bh, q_tile, seq_q, seq_k, qk_scale, sm_scale,
                        HEAD_DIM, BLOCK_M_Q, BLOCK_N_Q, IS_CAUSAL, EVEN_M_Q, EVEN_N_Q, False, DOT)


def backward_scales(d: int) -> tuple[float, float]:
    """(qk_scale, sm_scale): the scores' scale in base 2 (exponentials are exp2) and 1/sqrt(d)."""
    sm_scale = 1.0 / math.sqrt(d)
    return sm_scale * LOG2E, sm_scale


def flash_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                   lse: torch.Tensor, grad_out: torch.Tensor, is_causal: bool,
                   config: BackwardConfig, precision: str = "tf32") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dQ, dK, dV for contiguous (..., seq, d) tensors; `lse`: the forward's L (q.shape[:-1]).
    `precision`: how float32 products run (flash_triton.PRECISIONS); other dtypes ignore it."""
    *lead, seq_q, d = q.shape
    seq_k = k.shape[-2]
    c = config
    if c.block_n_kv % c.block_m_kv or c.block_m_q % c.block_n_q:
        raise ValueError(f"causal tiles must line up on the diagonal: {config}")
    batch_heads = math.prod(lead)
    delta = torch.empty_like(lse)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    args = (q, k, v, out, grad_out, lse, delta, dq, dk, dv, seq_q, seq_k, *backward_scales(d))
    n_kv, n_q = triton.cdiv(seq_k, c.block_n_kv), triton.cdiv(seq_q, c.block_m_q)
    if c.fused:  # both kinds run at once, so D comes first, from its own kernel
        backward_delta_kernel[(triton.cdiv(seq_q, 64), batch_heads)](out, grad_out, delta, seq_q, HEAD_DIM=d,
                                                                     BLOCK_M=64)
        launches = [("both", n_kv + n_q, False)]
    else:  # the dQ programs compute D for the dK/dV launch after them
        launches = [("dq", n_q, True), ("dkdv", n_kv, False)]
    for programs, count, delta_from_o in launches:
        backward_kernel[(count, batch_heads)](
            *args, HEAD_DIM=d, IS_CAUSAL=is_causal, PROGRAMS=programs, BLOCK_M_KV=c.block_m_kv,
            BLOCK_N_KV=c.block_n_kv, BLOCK_M_Q=c.block_m_q, BLOCK_N_Q=c.block_n_q,
            EVEN_M_KV=seq_q % c.block_m_kv == 0, EVEN_N_KV=seq_k % c.block_n_kv == 0,
            EVEN_M_Q=seq_q % c.block_m_q == 0, EVEN_N_Q=seq_k % c.block_n_q == 0,
            DELTA_FROM_O=delta_from_o, DOT=precision, num_warps=c.num_warps, num_stages=c.num_stages)
    return dq, dk, dv
