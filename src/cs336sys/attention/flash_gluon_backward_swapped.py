"""Part of the default Gluon backward at d 128: its consumer, with keys on the MMA rows (`swap_ab`).

The plain consumer (`flash_gluon_backward_ws`) computes S_w = Q K_w^T and dP_w = dO V_w^T with the
queries on the rows, so P_w^T and dS_w^T, the A operands of dV += P^T dO and dK += dS^T Q, have to go
through shared memory: P is stored and read back, and dS is read back twice. Shared memory, not the
tensor cores, then bounds the step. Per warpgroup and step at d 128 the five products read 144 KB of
operands from shared memory (a 64 x 64 x 128 product with both operands there reads 32 KB in the 256
cycles the tensor cores take for it: the 128 bytes a cycle an SM's shared memory gives), and P, dS,
the dQ tile and the incoming Q and dO tiles move another 64 KB: about 3,250 cycles of shared memory
for 2,560 of tensor cores per step of the CTA (an estimate from operand sizes, not a measurement).

Here each warpgroup computes the transposes directly, with its 64 keys on the rows of the MMA:

    S_w^T  = K_w Q^T,  dP_w^T = V_w dO^T              (64 keys x 64 queries)
    P_w^T  = exp2(S_w^T * scale * log2 e - L * log2 e)  (L and D per column)
    dV_w  += P_w^T dO,  dK_w += dS_w^T Q               (A operands from registers)
    dQ[:, half w] = dS K[:, half w]                     (dS^T of both halves from shared memory)

so P never leaves registers and dS^T is stored once and read once (by the dQ products, through a
transposed view). That saves 24 KB of shared-memory traffic per warpgroup and step, and the P buffer
(16 KB), which at d 128 makes room for a third ring slot. FlashAttention-3's Hopper backward makes the
same choice at d 64 and 128 (its `SdP_swapAB`).

With STATS_SMEM the step's L and D (one per query column: 16 of each a thread) come from the ring's
shared buffers, which the producer fills by TMA, instead of global memory; at d 128 that also frees the
registers the spills took (notes/flash_attention.md, "L and D in the ring").
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

from cs336sys.attention.flash_gluon_backward_common import KEYS, ROWS, add_dq, row_statistics, staged_lse2, staged_rows


@gluon.jit
def transposed_probabilities(st, lse2, keys, cols, seq_q, seq_k, qk_scale, MASK: gl.constexpr,
                             IS_CAUSAL: gl.constexpr):
    """P^T from S^T (keys on the rows, queries on the columns): as `probabilities`, transposed."""
    p = gl.exp2(st * qk_scale - gl.expand_dims(lse2, 0))
    if MASK:
        keep = (gl.expand_dims(keys, 1) < seq_k) & (gl.expand_dims(cols, 0) < seq_q)
        if IS_CAUSAL:
            keep = keep & (gl.expand_dims(cols, 0) >= gl.expand_dims(keys, 1))
        p = gl.where(keep, p, 0.0)
    return p


@gluon.jit
def swapped_consumer_steps(dk, dv, k_smem, v_smem, q_smem, do_smem, ds_smem, dq_smem, q_bars, do_bars, empty_bars,
                           ds_full, ds_free, dq_desc, LSE, DELTA, q_row0, keys, t_from, t_to, t_lo, seq_q, seq_k,
                           qk_scale, sm_scale, runtime_zero, HEAD_DIM: gl.constexpr, STAGES: gl.constexpr,
                           MASK: gl.constexpr, IS_CAUSAL: gl.constexpr, EARLY_DV: gl.constexpr, BLOCK_M: gl.constexpr,
                           W: gl.constexpr, STATS_SMEM: gl.constexpr = False):
    """Query tiles [t_from, t_to) against this warpgroup's 64 keys (`keys`: along the rows of S^T), as
    `flash_gluon_backward_ws._consumer_steps` with SHARED_DS: ring slot i % STAGES, dS buffer i % 2,
    which holds both warpgroups' dS^T halves ([2 * buffer + warpgroup], 64 keys x BLOCK_M queries). With
    BLOCK_M 64 each warpgroup computes half of dQ's columns, with 128 (FlashAttention-3's d 64 tiles: half
    the steps, products 128 queries wide) half of its rows, every column. EARLY_DV:
    dV's product is issued before dS^T is formed, so it runs under that arithmetic (P^T in 32 and 16 bits,
    dP^T, dK and dV are then live at once: at d 128 more spills); else after it. STATS_SMEM: L and D
    from ring slot i % STAGES of the shared buffers LSE and DELTA (L before S^T's wait, D after dP^T's),
    which the producer fills by TMA, else from global memory."""
    dtype: gl.constexpr = q_smem.dtype
    HALF: gl.constexpr = HEAD_DIM // 2
    DQ_COLS: gl.constexpr = HALF if BLOCK_M == ROWS else HEAD_DIM
    st_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, BLOCK_M, 16])
    kv_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, HEAD_DIM, 16])
    dq_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, DQ_COLS, 16])
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=kv_layout, k_width=2)
    col_layout: gl.constexpr = gl.SliceLayout(0, st_layout)
    for t in range(t_from, t_to):
        i = t - t_lo
        slot = i % STAGES
        phase = (i // STAGES) & 1
        b = i % 2
        b_phase = (i // 2) & 1
        cols = t * BLOCK_M + gl.arange(0, BLOCK_M, layout=col_layout)
        q_slot = q_smem.index(slot)
        do_slot = do_smem.index(slot)
        here = t * runtime_zero  # see `_consumer_steps`: keeps the descriptors out of registers
        k_w = k_smem.index(W + here)
        v_w = v_smem.index(W + here)
        dq_w = dq_smem.index(W + here)
        zero = gl.zeros([KEYS, BLOCK_M], gl.float32, st_layout)

        mbarrier.wait(q_bars.index(slot), phase)
        st = warpgroup_mma(k_w, q_slot.permute((1, 0)), zero, use_acc=False, is_async=True)
        mbarrier.wait(do_bars.index(slot), phase)
        dpt = warpgroup_mma(v_w, do_slot.permute((1, 0)), zero, use_acc=False, is_async=True)
        if STATS_SMEM:
            lse2 = staged_lse2(LSE, slot, col_layout)
        else:
            lse2, delta = row_statistics(LSE, DELTA, q_row0, cols, seq_q, MASK)
        st = warpgroup_mma_wait(num_outstanding=1, deps=(st,))
        pt = transposed_probabilities(st, lse2, keys, cols, seq_q, seq_k, qk_scale, MASK, IS_CAUSAL)
        pt_low = pt.to(dtype)
        if EARLY_DV:
            pt_op = gl.convert_layout(pt_low, a_layout)
            dv = warpgroup_mma(pt_op, do_slot, dv, is_async=True)
            dpt = warpgroup_mma_wait(num_outstanding=1, deps=(dpt,))
            if STATS_SMEM:
                delta = staged_rows(DELTA, slot, col_layout)
            dst = pt * (dpt - gl.expand_dims(delta, 0)) * sm_scale
        else:
            dpt = warpgroup_mma_wait(num_outstanding=0, deps=(dpt,))
            if STATS_SMEM:
                delta = staged_rows(DELTA, slot, col_layout)
            dst = pt * (dpt - gl.expand_dims(delta, 0)) * sm_scale
            dv = warpgroup_mma(gl.convert_layout(pt_low, a_layout), do_slot, dv, is_async=True)

        # dS buffer b was last read by step i - 2's dQ products of both warpgroups.
        mbarrier.wait(ds_free.index(b), b_phase ^ 1, pred=i >= 2)
        ds_w = ds_smem.index(2 * b + W)
        ds_w.store(dst.to(dtype))
        dst_op = gl.convert_layout(dst.to(dtype), a_layout)
        dk = warpgroup_mma(dst_op, q_slot, dk, is_async=True)
        fence_async_shared()
        gl.thread_barrier()
        mbarrier.arrive(ds_full.index(b), count=1)
        mbarrier.wait(ds_full.index(b), b_phase)  # the other half of dS^T is in place too
        dq = gl.zeros([ROWS, DQ_COLS], gl.float32, dq_layout)
        for h in gl.static_range(2):  # the two key halves of dS
            if BLOCK_M == ROWS:  # dQ[:, half W] = dS K[:, half W]
                dq = warpgroup_mma(ds_smem.index(2 * b + h).permute((1, 0)),
                                   k_smem.index(h + here).slice(W * HALF, HALF, dim=1), dq, use_acc=h > 0,
                                   is_async=True)
            else:  # dQ[rows of half W, :] = dS[rows of half W, :] K
                dq = warpgroup_mma(ds_smem.index(2 * b + h).slice(W * ROWS, ROWS, dim=1).permute((1, 0)),
                                   k_smem.index(h + here), dq, use_acc=h > 0, is_async=True)
        dv, dk, dq = warpgroup_mma_wait(num_outstanding=0, deps=(dv, dk, dq))
        gl.thread_barrier()  # every warp's products of this step are done
        mbarrier.arrive(ds_free.index(b), count=1)
        mbarrier.arrive(empty_bars.index(slot), count=1)

        tma.store_wait(0)  # the previous step's reduce-add has read the dQ buffer
        gl.thread_barrier()
        if BLOCK_M == ROWS:
            add_dq(dq_desc, dq_w, dq, q_row0 + t * ROWS, W * HALF, HEAD_DIM)
        else:
            add_dq(dq_desc, dq_w, dq, q_row0 + t * BLOCK_M + W * ROWS, 0, HEAD_DIM)
    return dk, dv
