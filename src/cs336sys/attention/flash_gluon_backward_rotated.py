"""Part of the default Gluon backward at d 64: its consumer, with the products rotated across steps.

`flash_gluon_backward_ws._consumer_steps` waits for all five products of a step before the next
step's first product is issued, so each consumer warpgroup leaves the tensor cores idle while it
stores its dQ tile and starts the next step. Here a step's last two products (dK += dS^T Q and
dQ = dS K, whose operands are in shared memory) are issued in the *next* step, right after that
step's S and dP, so they run while the warpgroup computes the next P and dS (FlashAttention-3's
intra-warpgroup overlap applied to the backward). Step i, for this warpgroup's 64 keys:

    issue S_i = Q_i K_w^T, dP_i = dO_i V_w^T
    issue dK += dS_{i-1}^T Q_{i-1}, dQ_{i-1} = dS_{i-1} K[:, half w]    (after both halves of dS_{i-1})
    P_i = exp2(...), to shared memory; issue dV += P_i^T dO_i
    dS_i = P_i (dP_i - D) * scale
    wait for dQ_{i-1}: release Q/dO slot i-1 and dS buffer i-1, add dQ_{i-1} to the workspace (TMA)
    dS_i to shared memory (once step i-2's dQ products have read its buffer)
    wait for dV

Nothing is in flight across a loop iteration (every product issued in step i is waited in step i), so
no accumulator crosses the loop's back edge while a warpgroup MMA writes it. The first step is
issued before the loop (masked: correct for any tile), the last step's dK and dQ after it. Ring slot
i - 1 is released only in step i, so the producer loads step i + 1 while step i runs: a ring of 2 slots
holds steps i - 1 and i, which leaves the load of step i + 1 to the second half of step i.

With LATE_DQ (the kernel's ROTATE == 2) only dK_{i-1} is issued beside S_i and dP_i; dQ_{i-1} follows
once dS_i is computed, and dS_i is stored while it runs: fewer accumulators in flight at once (d 128's
registers do not hold dK, dV, S, dP and dQ together without spilling).

With DS_FIRST (ROTATE == 3) dS_i is stored before step i - 1 is finished, not after. In the SASS of the
plain order (Triton 3.6's ptxas) the wait for dK_{i-1} and dQ_{i-1} comes straight after the wait for
dP_i, so dS_i is computed only once those two products are done; with the store of dS_i before that
wait, ptxas leaves the wait after it (as the forward's `pin` does), and dS_i is computed under them.

Loading L and D a step ahead in the consumers instead (after a step's last fence) was measured slower
(2.5 %: ptxas scales L right after its load, so the wait only moved; notes/flash_attention.md) and
removed; STATS_SMEM is what took those loads off the consumers' steps.

With STATS_SMEM the producer loads each step's L and D by TMA into the ring, on the barriers of Q and
dO, and the consumers read them from shared memory (L before S's wait, D after dP's), as cuDNN and
FlashAttention-3 do: no global load is left in a consumer's step for a fence to wait on.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from cs336sys.attention.flash_gluon_backward_common import (
    KEYS,
    ROWS,
    add_dq,
    probabilities,
    row_statistics,
    staged_lse2,
    staged_rows,
)


@gluon.jit
def _issue_scores(k_smem, v_smem, q_smem, do_smem, q_bars, do_bars, i, here, STAGES: gl.constexpr,
                  W: gl.constexpr):
    """Wait for step i's Q and dO, then issue S = Q K_w^T and dP = dO V_w^T (asynchronous)."""
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, KEYS, 16])
    slot = i % STAGES
    phase = (i // STAGES) & 1
    zero = gl.zeros([ROWS, KEYS], gl.float32, s_layout)
    mbarrier.wait(q_bars.index(slot), phase)
    s = warpgroup_mma(q_smem.index(slot), k_smem.index(W + here).permute((1, 0)), zero, use_acc=False,
                      is_async=True)
    mbarrier.wait(do_bars.index(slot), phase)
    dp = warpgroup_mma(do_smem.index(slot), v_smem.index(W + here).permute((1, 0)), zero, use_acc=False,
                       is_async=True)
    return s, dp


@gluon.jit
def _issue_previous_dk(dk, q_smem, ds_smem, ds_full, i, STAGES: gl.constexpr, W: gl.constexpr):
    """Once both halves of step i's dS are stored, issue its dK += dS_w^T Q (asynchronous)."""
    b = i % 2
    mbarrier.wait(ds_full.index(b), (i // 2) & 1)
    return warpgroup_mma(ds_smem.index(2 * b + W).permute((1, 0)), q_smem.index(i % STAGES), dk, is_async=True)


@gluon.jit
def _issue_previous_dq(k_smem, ds_smem, i, here, HEAD_DIM: gl.constexpr, W: gl.constexpr,
                       DQ_FULL: gl.constexpr = False):
    """Step i's dQ half, dS K[:, half w] over both halves of its dS (stored: `_issue_previous_dk` waited);
    with DQ_FULL this warpgroup's share at full width, dS_w K_w over its own 64 keys."""
    b = i % 2
    if DQ_FULL:
        full_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                              instr_shape=[16, HEAD_DIM, 16])
        dq = warpgroup_mma(ds_smem.index(2 * b + W), k_smem.index(W + here),
                           gl.zeros([ROWS, HEAD_DIM], gl.float32, full_layout), use_acc=False, is_async=True)
    else:
        HALF: gl.constexpr = HEAD_DIM // 2
        dq_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                            instr_shape=[16, HALF, 16])
        dq = warpgroup_mma(ds_smem.index(2 * b), k_smem.index(here).slice(W * HALF, HALF, dim=1),
                           gl.zeros([ROWS, HALF], gl.float32, dq_layout), use_acc=False, is_async=True)
        dq = warpgroup_mma(ds_smem.index(2 * b + 1), k_smem.index(1 + here).slice(W * HALF, HALF, dim=1), dq,
                           is_async=True)
    return dq


@gluon.jit
def _softmax_grads(s, dp, dv, p_smem, do_smem, LSE, DELTA, q_row0, keys, t, i, seq_q, seq_k, qk_scale, sm_scale,
                   here, STAGES: gl.constexpr, MASK: gl.constexpr, IS_CAUSAL: gl.constexpr, EXTRA: gl.constexpr,
                   W: gl.constexpr, STATS_SMEM: gl.constexpr = False):
    """P from S (to shared memory), dV += P^T dO issued, dS from dP: (dV in flight, dS). EXTRA: products
    issued between dP and dV (the previous step's dK and dQ). L and D from LSE and DELTA, or with
    STATS_SMEM from ring slot i % STAGES of the shared buffers LSE and DELTA."""
    dtype: gl.constexpr = do_smem.dtype
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, KEYS, 16])
    rows = t * ROWS + gl.arange(0, ROWS, layout=gl.SliceLayout(1, s_layout))
    if STATS_SMEM:  # D read once dP is done, below
        lse2 = staged_lse2(LSE, i % STAGES, gl.SliceLayout(1, s_layout))
    else:
        lse2, delta = row_statistics(LSE, DELTA, q_row0, rows, seq_q, MASK)
    s = warpgroup_mma_wait(num_outstanding=1 + EXTRA, deps=(s,))
    p = probabilities(s, lse2, rows, keys, seq_q, seq_k, qk_scale, MASK, IS_CAUSAL)
    p_w = p_smem.index(W + here)
    p_w.store(p.to(dtype))
    fence_async_shared()
    gl.thread_barrier()  # this warpgroup's P is in place before its MMA reads it
    dv = warpgroup_mma(p_w.permute((1, 0)), do_smem.index(i % STAGES), dv, is_async=True)
    dp = warpgroup_mma_wait(num_outstanding=EXTRA + 1, deps=(dp,))
    if STATS_SMEM:
        delta = staged_rows(DELTA, i % STAGES, gl.SliceLayout(1, s_layout))
    ds = p * (dp - gl.expand_dims(delta, 1)) * sm_scale
    return dv, ds


@gluon.jit
def _finish_previous(dk, dq, dq_smem, ds_free, empty_bars, dq_desc, q_row0, t, i, runtime_zero,
                     HEAD_DIM: gl.constexpr, STAGES: gl.constexpr, AFTER: gl.constexpr, W: gl.constexpr,
                     DQ_FULL: gl.constexpr = False):
    """Wait for step i's dK and dQ (AFTER products issued since may still run), release its Q/dO slot
    and its dS buffer, and add its dQ half (query tile t; DQ_FULL: its full-width share) to the
    workspace by TMA reduce-add."""
    HALF: gl.constexpr = 0 if DQ_FULL else HEAD_DIM // 2
    dk, dq = warpgroup_mma_wait(num_outstanding=AFTER, deps=(dk, dq))
    gl.thread_barrier()  # every warp's products of step i are done
    mbarrier.arrive(ds_free.index(i % 2), count=1)
    mbarrier.arrive(empty_bars.index(i % STAGES), count=1)
    dq_w = dq_smem.index(W + t * runtime_zero)
    tma.store_wait(0)  # the previous reduce-add has read the buffer
    gl.thread_barrier()
    add_dq(dq_desc, dq_w, dq, q_row0 + t * ROWS, W * HALF, HEAD_DIM)
    return dk


@gluon.jit
def _store_ds(ds, ds_smem, ds_full, ds_free, i, W: gl.constexpr):
    """Step i's dS half to buffer i % 2, once step i - 2's dQ products (both warpgroups) have read it."""
    b = i % 2
    mbarrier.wait(ds_free.index(b), ((i // 2) & 1) ^ 1, pred=i >= 2)
    ds_w = ds_smem.index(2 * b + W)
    ds_w.store(ds.to(ds_smem.dtype))
    fence_async_shared()
    gl.thread_barrier()
    mbarrier.arrive(ds_full.index(b), count=1)


@gluon.jit
def _rotated_steps(dk, dv, k_smem, v_smem, q_smem, do_smem, p_smem, ds_smem, dq_smem, q_bars, do_bars, empty_bars,
                   ds_full, ds_free, dq_desc, LSE, DELTA, q_row0, keys, t_from, t_to, t_lo, seq_q, seq_k, qk_scale,
                   sm_scale, runtime_zero, HEAD_DIM: gl.constexpr, STAGES: gl.constexpr, MASK: gl.constexpr,
                   IS_CAUSAL: gl.constexpr, LATE_DQ: gl.constexpr, W: gl.constexpr, DS_FIRST: gl.constexpr = False,
                   STATS_SMEM: gl.constexpr = False, DQ_FULL: gl.constexpr = False):
    """Steps [t_from, t_to), each after a step already begun (t_from > t_lo): see the module docstring.
    LATE_DQ: the previous step's dQ is issued only once this step's dS is computed (fewer accumulators
    in flight at once: what d 128's registers allow), and this step's dS is stored under it."""
    for t in range(t_from, t_to):
        i = t - t_lo
        here = t * runtime_zero
        s, dp = _issue_scores(k_smem, v_smem, q_smem, do_smem, q_bars, do_bars, i, here, STAGES, W)
        dk = _issue_previous_dk(dk, q_smem, ds_smem, ds_full, i - 1, STAGES, W)
        if LATE_DQ:
            dv, ds = _softmax_grads(s, dp, dv, p_smem, do_smem, LSE, DELTA, q_row0, keys, t, i, seq_q, seq_k,
                                    qk_scale, sm_scale, here, STAGES, MASK, IS_CAUSAL, 1, W,
                                    STATS_SMEM=STATS_SMEM)
            dq = _issue_previous_dq(k_smem, ds_smem, i - 1, here, HEAD_DIM, W, DQ_FULL)
            _store_ds(ds, ds_smem, ds_full, ds_free, i, W)
            dk, dv, dq = warpgroup_mma_wait(num_outstanding=0, deps=(dk, dv, dq))
            dk = _finish_previous(dk, dq, dq_smem, ds_free, empty_bars, dq_desc, q_row0, t - 1, i - 1, runtime_zero,
                                  HEAD_DIM, STAGES, 0, W, DQ_FULL)
        else:
            dq = _issue_previous_dq(k_smem, ds_smem, i - 1, here, HEAD_DIM, W, DQ_FULL)
            dv, ds = _softmax_grads(s, dp, dv, p_smem, do_smem, LSE, DELTA, q_row0, keys, t, i, seq_q, seq_k,
                                    qk_scale, sm_scale, here, STAGES, MASK, IS_CAUSAL, 3, W, STATS_SMEM)
            if DS_FIRST:
                _store_ds(ds, ds_smem, ds_full, ds_free, i, W)
            dk = _finish_previous(dk, dq, dq_smem, ds_free, empty_bars, dq_desc, q_row0, t - 1, i - 1, runtime_zero,
                                  HEAD_DIM, STAGES, 1, W, DQ_FULL)
            if not DS_FIRST:
                _store_ds(ds, ds_smem, ds_full, ds_free, i, W)
            dv = warpgroup_mma_wait(num_outstanding=0, deps=(dv,))
    return dk, dv


@gluon.jit
def rotated_consumer_steps(dk, dv, k_smem, v_smem, q_smem, do_smem, p_smem, ds_smem, dq_smem, q_bars, do_bars,
                           empty_bars, ds_full, ds_free, dq_desc, LSE, DELTA, q_row0, keys, t_lo, t_diag, t_free, t_hi,
                           seq_q, seq_k, qk_scale, sm_scale, runtime_zero, HEAD_DIM: gl.constexpr,
                           STAGES: gl.constexpr, IS_CAUSAL: gl.constexpr, LATE_DQ: gl.constexpr, W: gl.constexpr,
                           DS_FIRST: gl.constexpr = False, STATS_SMEM: gl.constexpr = False, i0=0,
                           DQ_FULL: gl.constexpr = False):
    """Every step of this warpgroup's keys (query tiles [t_lo, t_hi); masked: [t_lo, t_diag) and
    [t_free, t_hi)): dK_w and dV_w, the dQ halves added to the workspace. Tile t is ring step
    i0 + t - t_lo (i0: the steps of the persistent kernel's earlier tiles)."""
    if t_hi > t_lo:
        here = t_lo * runtime_zero
        s, dp = _issue_scores(k_smem, v_smem, q_smem, do_smem, q_bars, do_bars, i0, here, STAGES, W)
        dv, ds = _softmax_grads(s, dp, dv, p_smem, do_smem, LSE, DELTA, q_row0, keys, t_lo, i0, seq_q, seq_k,
                                qk_scale, sm_scale, here, STAGES, True, IS_CAUSAL, 0, W, STATS_SMEM=STATS_SMEM)
        _store_ds(ds, ds_smem, ds_full, ds_free, i0, W)
        dv = warpgroup_mma_wait(num_outstanding=0, deps=(dv,))
        first = t_lo + 1
        origin = t_lo - i0
        dk, dv = _rotated_steps(dk, dv, k_smem, v_smem, q_smem, do_smem, p_smem, ds_smem, dq_smem, q_bars,
                                do_bars, empty_bars, ds_full, ds_free, dq_desc, LSE, DELTA, q_row0, keys, first,
                                gl.maximum(t_diag, first), origin, seq_q, seq_k, qk_scale, sm_scale, runtime_zero,
                                HEAD_DIM, STAGES, True, IS_CAUSAL, LATE_DQ, W, DS_FIRST,
                                STATS_SMEM=STATS_SMEM, DQ_FULL=DQ_FULL)
        dk, dv = _rotated_steps(dk, dv, k_smem, v_smem, q_smem, do_smem, p_smem, ds_smem, dq_smem, q_bars,
                                do_bars, empty_bars, ds_full, ds_free, dq_desc, LSE, DELTA, q_row0, keys,
                                gl.maximum(t_diag, first), gl.maximum(t_free, first), origin, seq_q, seq_k, qk_scale,
                                sm_scale, runtime_zero, HEAD_DIM, STAGES, False, IS_CAUSAL, LATE_DQ, W, DS_FIRST,
                                STATS_SMEM=STATS_SMEM, DQ_FULL=DQ_FULL)
        dk, dv = _rotated_steps(dk, dv, k_smem, v_smem, q_smem, do_smem, p_smem, ds_smem, dq_smem, q_bars,
                                do_bars, empty_bars, ds_full, ds_free, dq_desc, LSE, DELTA, q_row0, keys,
                                gl.maximum(t_free, first), t_hi, origin, seq_q, seq_k, qk_scale, sm_scale,
                                runtime_zero, HEAD_DIM, STAGES, True, IS_CAUSAL, LATE_DQ, W, DS_FIRST,
                                STATS_SMEM=STATS_SMEM, DQ_FULL=DQ_FULL)
        last = t_hi - 1 - t_lo + i0
        here = t_hi * runtime_zero
        dk = _issue_previous_dk(dk, q_smem, ds_smem, ds_full, last, STAGES, W)
        dq = _issue_previous_dq(k_smem, ds_smem, last, here, HEAD_DIM, W, DQ_FULL)
        dk = _finish_previous(dk, dq, dq_smem, ds_free, empty_bars, dq_desc, q_row0, t_hi - 1, last, runtime_zero,
                              HEAD_DIM, STAGES, 0, W, DQ_FULL)
    return dk, dv
