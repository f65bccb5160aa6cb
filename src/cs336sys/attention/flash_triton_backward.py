"""FlashAttention-2 backward in Triton (problem 10): recomputation with D = rowsum(O * dO).

Three launches, no atomics by default:
  1. `backward_delta_kernel`: D = rowsum(O * dO) per query row (fp32).
  2. `backward_dkdv_kernel`: one program per key tile; it walks the query tiles that can see it,
     recomputes P = exp(S - L) and accumulates dV += P^T dO and dK += dS^T Q in registers.
  3. `backward_dq_kernel`: one program per query tile; it walks the key tiles it can see and
     accumulates dQ += dS K.
Splitting dQ from dK/dV recomputes S and dP once more (7 tile products per tile pair instead
of 5), but every program owns its output and nothing is reduced across programs. The
`atomic_dq` variant instead adds each dS K product into an fp32 dQ buffer from the dK/dV kernel
with relaxed atomics; benchmarks/flash_tune.py measures both.
Causal tile skipping as in the forward: tiles wholly above the diagonal are never visited and
only tiles that cross it compare indices.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from cs336sys.attention.flash_configs import BackwardConfig, Tiles

LOG2E = 1.4426950408889634


@triton.jit
def backward_delta_kernel(O, DO, DELTA, stride_ob, stride_om, stride_dob, stride_dom, seq_q,
                          HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr):
    bh = tl.program_id(1).to(tl.int64)
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    mask = rows[:, None] < seq_q
    o = tl.load(O + bh * stride_ob + rows[:, None] * stride_om + offs_d[None, :], mask=mask, other=0.0)
    do = tl.load(DO + bh * stride_dob + rows[:, None] * stride_dom + offs_d[None, :], mask=mask,
                 other=0.0)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
    tl.store(DELTA + bh * seq_q + rows, delta, mask=rows < seq_q)


@triton.jit
def _dkdv_query_tiles(dk, dv, k, v, q_base, do_base, dq_base, lse_base, delta_base, stride_qm,
                      stride_dom, stride_dqm, cols, m_start, m_end, seq_q, qk_scale, sm_scale,
                      HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, CAUSAL_MASK: tl.constexpr,
                      ROW_MASK: tl.constexpr, ATOMIC_DQ: tl.constexpr):
    """Accumulate this key tile's dK, dV over query tiles [m_start, m_end) (transposed tiles)."""
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    for m0 in range(m_start, m_end, BLOCK_M):
        rows = m0 + offs_m
        q_ptrs = q_base + rows[:, None] * stride_qm + offs_d[None, :]
        do_ptrs = do_base + rows[:, None] * stride_dom + offs_d[None, :]
        if ROW_MASK:
            q = tl.load(q_ptrs, mask=rows[:, None] < seq_q, other=0.0)
            do = tl.load(do_ptrs, mask=rows[:, None] < seq_q, other=0.0)
            # L = +inf for rows past the end makes their P exactly zero.
            lse2 = tl.load(lse_base + rows, mask=rows < seq_q, other=float("inf")) * 1.4426950408889634
            delta = tl.load(delta_base + rows, mask=rows < seq_q, other=0.0)
        else:
            q = tl.load(q_ptrs)
            do = tl.load(do_ptrs)
            lse2 = tl.load(lse_base + rows) * 1.4426950408889634
            delta = tl.load(delta_base + rows)
        scores_t = tl.dot(k, tl.trans(q))  # S^T: (keys, queries)
        p_t = tl.math.exp2(scores_t * qk_scale - lse2[None, :])
        if CAUSAL_MASK:
            p_t = tl.where(rows[None, :] >= cols[:, None], p_t, 0.0)
        dv = tl.dot(p_t.to(do.dtype), do, dv)
        dp_t = tl.dot(v, tl.trans(do))
        ds_t = p_t * (dp_t - delta[None, :])
        dk = tl.dot(ds_t.to(q.dtype), q, dk)
        if ATOMIC_DQ:
            dq = tl.dot(tl.trans(ds_t.to(k.dtype)), k) * sm_scale
            dq_ptrs = dq_base + rows[:, None] * stride_dqm + offs_d[None, :]
            tl.atomic_add(dq_ptrs, dq, mask=rows[:, None] < seq_q, sem="relaxed")
    return dk, dv


@triton.jit
def backward_dkdv_kernel(Q, K, V, DO, LSE, DELTA, DK, DV, DQ_ACC,
                         stride_qb, stride_qm, stride_kb, stride_kn, stride_vb, stride_vn,
                         stride_dob, stride_dom, stride_dkb, stride_dkn, stride_dvb, stride_dvn,
                         stride_dqb, stride_dqm, seq_q, seq_k, qk_scale, sm_scale,
                         HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                         IS_CAUSAL: tl.constexpr, EVEN_M: tl.constexpr, EVEN_N: tl.constexpr,
                         ATOMIC_DQ: tl.constexpr):
    pid_n = tl.program_id(0)  # causal: the first key tiles are seen by the most queries; they go first
    bh = tl.program_id(1).to(tl.int64)
    n0 = pid_n * BLOCK_N
    cols = n0 + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    k_ptrs = K + bh * stride_kb + cols[:, None] * stride_kn + offs_d[None, :]
    v_ptrs = V + bh * stride_vb + cols[:, None] * stride_vn + offs_d[None, :]
    if EVEN_N:
        k = tl.load(k_ptrs)
        v = tl.load(v_ptrs)
    else:  # zero keys/values past the end contribute nothing to dQ and are not stored
        k = tl.load(k_ptrs, mask=cols[:, None] < seq_k, other=0.0)
        v = tl.load(v_ptrs, mask=cols[:, None] < seq_k, other=0.0)
    q_base = Q + bh * stride_qb
    do_base = DO + bh * stride_dob
    dq_base = DQ_ACC + bh * stride_dqb
    lse_base = LSE + bh * seq_q
    delta_base = DELTA + bh * seq_q
    dk = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    if IS_CAUSAL:
        # BLOCK_N is a multiple of BLOCK_M: queries in [n0, n0 + BLOCK_N) cross the diagonal,
        # later ones see the whole tile, earlier ones see none of it.
        diag_end = tl.minimum(n0 + BLOCK_N, seq_q)
        dk, dv = _dkdv_query_tiles(dk, dv, k, v, q_base, do_base, dq_base, lse_base, delta_base,
                                   stride_qm, stride_dom, stride_dqm, cols, n0, diag_end, seq_q,
                                   qk_scale, sm_scale, HEAD_DIM, BLOCK_M, True, not EVEN_M, ATOMIC_DQ)
        dk, dv = _dkdv_query_tiles(dk, dv, k, v, q_base, do_base, dq_base, lse_base, delta_base,
                                   stride_qm, stride_dom, stride_dqm, cols, diag_end, seq_q, seq_q,
                                   qk_scale, sm_scale, HEAD_DIM, BLOCK_M, False, not EVEN_M, ATOMIC_DQ)
    else:
        dk, dv = _dkdv_query_tiles(dk, dv, k, v, q_base, do_base, dq_base, lse_base, delta_base,
                                   stride_qm, stride_dom, stride_dqm, cols, 0, seq_q, seq_q,
                                   qk_scale, sm_scale, HEAD_DIM, BLOCK_M, False, not EVEN_M, ATOMIC_DQ)
    dk_ptrs = DK + bh * stride_dkb + cols[:, None] * stride_dkn + offs_d[None, :]
    dv_ptrs = DV + bh * stride_dvb + cols[:, None] * stride_dvn + offs_d[None, :]
    if EVEN_N:
        tl.store(dk_ptrs, (dk * sm_scale).to(DK.dtype.element_ty))
        tl.store(dv_ptrs, dv.to(DV.dtype.element_ty))
    else:
        tl.store(dk_ptrs, (dk * sm_scale).to(DK.dtype.element_ty), mask=cols[:, None] < seq_k)
        tl.store(dv_ptrs, dv.to(DV.dtype.element_ty), mask=cols[:, None] < seq_k)


@triton.jit
def _dq_key_tiles(dq, q, do, lse2, delta, k_base, v_base, stride_kn, stride_vn, rows,
                  n_start, n_end, seq_k, qk_scale,
                  HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL_MASK: tl.constexpr,
                  KEY_MASK: tl.constexpr):
    """Accumulate this query tile's dQ (unscaled) over key tiles [n_start, n_end)."""
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    for n0 in range(n_start, n_end, BLOCK_N):
        cols = n0 + offs_n
        k_ptrs = k_base + cols[:, None] * stride_kn + offs_d[None, :]
        v_ptrs = v_base + cols[:, None] * stride_vn + offs_d[None, :]
        if KEY_MASK:
            k = tl.load(k_ptrs, mask=cols[:, None] < seq_k, other=0.0)
            v = tl.load(v_ptrs, mask=cols[:, None] < seq_k, other=0.0)
        else:
            k = tl.load(k_ptrs)
            v = tl.load(v_ptrs)
        p = tl.math.exp2(tl.dot(q, tl.trans(k)) * qk_scale - lse2[:, None])
        if CAUSAL_MASK:
            p = tl.where(rows[:, None] >= cols[None, :], p, 0.0)
        dp = tl.dot(do, tl.trans(v))
        ds = p * (dp - delta[:, None])
        dq = tl.dot(ds.to(k.dtype), k, dq)
    return dq


@triton.jit
def backward_dq_kernel(Q, K, V, DO, LSE, DELTA, DQ,
                       stride_qb, stride_qm, stride_kb, stride_kn, stride_vb, stride_vn,
                       stride_dob, stride_dom, stride_dqb, stride_dqm, seq_q, seq_k, qk_scale, sm_scale,
                       HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       IS_CAUSAL: tl.constexpr, EVEN_M: tl.constexpr, EVEN_N: tl.constexpr):
    pid_m = tl.program_id(0)
    if IS_CAUSAL:  # longest rows first, as in the forward
        pid_m = tl.num_programs(0) - 1 - pid_m
    bh = tl.program_id(1).to(tl.int64)
    m0 = pid_m * BLOCK_M
    rows = m0 + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    q_ptrs = Q + bh * stride_qb + rows[:, None] * stride_qm + offs_d[None, :]
    do_ptrs = DO + bh * stride_dob + rows[:, None] * stride_dom + offs_d[None, :]
    if EVEN_M:
        q = tl.load(q_ptrs)
        do = tl.load(do_ptrs)
        lse2 = tl.load(LSE + bh * seq_q + rows) * 1.4426950408889634
        delta = tl.load(DELTA + bh * seq_q + rows)
    else:
        q = tl.load(q_ptrs, mask=rows[:, None] < seq_q, other=0.0)
        do = tl.load(do_ptrs, mask=rows[:, None] < seq_q, other=0.0)
        lse2 = tl.load(LSE + bh * seq_q + rows, mask=rows < seq_q, other=float("inf")) * 1.4426950408889634
        delta = tl.load(DELTA + bh * seq_q + rows, mask=rows < seq_q, other=0.0)
    k_base = K + bh * stride_kb
    v_base = V + bh * stride_vb
    dq = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    if IS_CAUSAL:
        below_end = tl.minimum(m0, seq_k)  # BLOCK_M is a multiple of BLOCK_N
        dq = _dq_key_tiles(dq, q, do, lse2, delta, k_base, v_base, stride_kn, stride_vn, rows, 0,
                           below_end, seq_k, qk_scale, HEAD_DIM, BLOCK_N, False, not EVEN_N)
        dq = _dq_key_tiles(dq, q, do, lse2, delta, k_base, v_base, stride_kn, stride_vn, rows,
                           below_end, tl.minimum(m0 + BLOCK_M, seq_k), seq_k, qk_scale,
                           HEAD_DIM, BLOCK_N, True, not EVEN_N)
    else:
        dq = _dq_key_tiles(dq, q, do, lse2, delta, k_base, v_base, stride_kn, stride_vn, rows, 0,
                           seq_k, seq_k, qk_scale, HEAD_DIM, BLOCK_N, False, not EVEN_N)
    dq_ptrs = DQ + bh * stride_dqb + rows[:, None] * stride_dqm + offs_d[None, :]
    if EVEN_M:
        tl.store(dq_ptrs, (dq * sm_scale).to(DQ.dtype.element_ty))
    else:
        tl.store(dq_ptrs, (dq * sm_scale).to(DQ.dtype.element_ty), mask=rows[:, None] < seq_q)


def backward_delta(out: torch.Tensor, grad_out: torch.Tensor) -> torch.Tensor:
    """D = rowsum(O * dO) in float32, (batch*heads, seq_q)."""
    bh, seq_q, d = out.shape
    delta = torch.empty((bh, seq_q), dtype=torch.float32, device=out.device)
    backward_delta_kernel[(triton.cdiv(seq_q, 64), bh)](
        out, grad_out, delta, out.stride(0), out.stride(1), grad_out.stride(0), grad_out.stride(1),
        seq_q, HEAD_DIM=d, BLOCK_M=64)
    return delta


def backward_dkdv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lse: torch.Tensor,
                  delta: torch.Tensor, grad_out: torch.Tensor, is_causal: bool, tiles: Tiles,
                  dq_acc: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """dK, dV; with `dq_acc` (float32, zeroed) the kernel also adds dQ into it atomically."""
    bh, seq_q, d = q.shape
    seq_k = k.shape[1]
    if tiles.block_n % tiles.block_m:
        raise ValueError(f"dK/dV tiles must line up on the diagonal: {tiles}")
    sm_scale = 1.0 / math.sqrt(d)
    dk = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    dv = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    atomic = dq_acc is not None
    dq_ref = dq_acc if atomic else q  # an unused pointer when not atomic
    backward_dkdv_kernel[(triton.cdiv(seq_k, tiles.block_n), bh)](
        q, k, v, grad_out, lse, delta, dk, dv, dq_ref,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        grad_out.stride(0), grad_out.stride(1), dk.stride(0), dk.stride(1), dv.stride(0), dv.stride(1),
        dq_ref.stride(0), dq_ref.stride(1), seq_q, seq_k, sm_scale * LOG2E, sm_scale,
        HEAD_DIM=d, BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n, IS_CAUSAL=is_causal,
        EVEN_M=seq_q % tiles.block_m == 0, EVEN_N=seq_k % tiles.block_n == 0, ATOMIC_DQ=atomic,
        num_warps=tiles.num_warps, num_stages=tiles.num_stages)
    return dk, dv


def backward_dq(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lse: torch.Tensor,
                delta: torch.Tensor, grad_out: torch.Tensor, is_causal: bool, tiles: Tiles) -> torch.Tensor:
    bh, seq_q, d = q.shape
    seq_k = k.shape[1]
    if tiles.block_m % tiles.block_n:
        raise ValueError(f"dQ tiles must line up on the diagonal: {tiles}")
    sm_scale = 1.0 / math.sqrt(d)
    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    backward_dq_kernel[(triton.cdiv(seq_q, tiles.block_m), bh)](
        q, k, v, grad_out, lse, delta, dq,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        grad_out.stride(0), grad_out.stride(1), dq.stride(0), dq.stride(1),
        seq_q, seq_k, sm_scale * LOG2E, sm_scale,
        HEAD_DIM=d, BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n, IS_CAUSAL=is_causal,
        EVEN_M=seq_q % tiles.block_m == 0, EVEN_N=seq_k % tiles.block_n == 0,
        num_warps=tiles.num_warps, num_stages=tiles.num_stages)
    return dq


def flash_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                   lse: torch.Tensor, grad_out: torch.Tensor, is_causal: bool,
                   config: BackwardConfig) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dQ, dK, dV for (batch*heads, seq, d) tensors; `lse` is the forward's (batch*heads, seq_q)."""
    delta = backward_delta(out, grad_out)
    if config.atomic_dq:
        dq_acc = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        dk, dv = backward_dkdv(q, k, v, lse, delta, grad_out, is_causal, config.dkdv, dq_acc)
        return dq_acc.to(q.dtype), dk, dv
    dk, dv = backward_dkdv(q, k, v, lse, delta, grad_out, is_causal, config.dkdv)
    dq = backward_dq(q, k, v, lse, delta, grad_out, is_causal, config.dq)
    return dq, dk, dv
