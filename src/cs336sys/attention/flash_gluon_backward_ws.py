"""Default Gluon backward, warp-specialised (FlashAttention-3's layout of a backward CTA, on Hopper).

Its kernel and launcher; the consumer steps that run by default are `flash_gluon_backward_rotated`'s
(d 64) and `flash_gluon_backward_swapped`'s (d 128). The plain steps here are an option the tests run.

One CTA owns 128 keys of one batch*head (K and V in shared memory as two 64-key halves) and visits
the query tiles (64 rows; BLOCK_M 128 with the swapped consumer) that can see them. Three partitions:
- a producer warp with few registers loads K and V once, then streams each step's Q and dO tiles
  (with STATS_SMEM also its rows of L and D) through a ring of STAGES slots by TMA, refilling a slot
  once both consumers have released it;
- two consumer warpgroups, one per 64-key half, with most of the registers. Each runs, per query
  tile, the five products of `flash_gluon_backward` on its own keys:
    S_w  = Q K_w^T, dP_w = dO V_w^T  (64 queries x 64 keys; dP issued before the exponentials)
    P_w  = exp2(S_w * scale * log2 e - L * log2 e) (masked to 0), to its own shared buffer
    dV_w += P_w^T dO, dS_w = P_w (dP_w - D) * scale, to its half of a shared dS buffer
    dK_w += dS_w^T Q
    dQ[:, half w] = dS K[:, half w]   (both halves of dS: the one cross-warpgroup dependency)
  and adds its dQ half (fp32) to the workspace by TMA reduce-add (`cp.reduce.async.bulk.tensor`)
  from shared memory: the reduction is the TMA unit's, not the consumers' instructions, and it runs
  under the next step's products.
The consumers never meet at a CTA barrier. They hand each other dS through two mbarriers per dS
buffer (two buffers, alternate steps): "full" (both halves stored) and "free" (both dQ products that
read it are done). So one warpgroup's exponentials can run while the other's products hold the
tensor cores, as in the warp-specialised forward.

With PERSISTENT the grid is at most one CTA an SM, and each CTA takes the work items (key tile, head)
w, w + grid, ... in turn, every head's first key tile first (causal: the longest first), as cuDNN's
backward does with its 132 CTAs. The partitions walk the same items: the producer loads the next
item's K and V once both consumers have released the last's (a `kv_free` mbarrier) and numbers the
ring's steps on across items, so every slot and dS buffer phase carries over.

Masking, L and D, the 2-D TMA views and the fp32 dQ workspace are those of `flash_gluon_backward`
(its docstring says why the rows a TMA read takes from the next head contribute nothing: their P is
0, so are their dS and their dQ rows, which the reduce-add adds as zeros).

Triton 3.6's Gluon has no Python wrapper for the TMA reduction its builder offers, so
`flash_gluon_backward_common.tma_reduce_add` calls the builder directly. `ROTATE` selects the consumer
of `flash_gluon_backward_rotated` (a step's dK and dQ products issued in the next step; 2 and 3 its
variants), `SWAP_AB` that
of `flash_gluon_backward_swapped` (keys on the MMA rows: P and dS^T stay in registers for dV and dK).
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
    query_tile_range,
    row_statistics,
    store_dk_dv,
)
from cs336sys.attention.flash_gluon_backward_rotated import rotated_consumer_steps
from cs336sys.attention.flash_gluon_backward_swapped import swapped_consumer_steps


@gluon.jit
def _producer(q_desc, k_desc, v_desc, do_desc, k_smem, v_smem, q_smem, do_smem, kv_bar, q_bars, do_bars,
              empty_bars, kv_row0, q_row0, n0, t_lo, n_steps, STAGES: gl.constexpr, BLOCK_M: gl.constexpr,
              bh=None, lse_desc=None, delta_desc=None, lse_smem=None, delta_smem=None, i0=0):
    """K and V once, then each step's Q and dO tiles (with lse_desc, also its L on Q's barrier and its
    D on dO's: BLOCK_M rows of head bh from the (batch*heads, seq_q) views into the slot's buffers).
    i0: the ring steps this CTA took before (the persistent kernel's earlier tiles)."""
    mbarrier.expect(kv_bar, 2 * k_desc.block_type.nbytes + 2 * v_desc.block_type.nbytes)
    for w in gl.static_range(2):
        tma.async_copy_global_to_shared(k_desc, [kv_row0 + n0 + w * KEYS, 0], kv_bar, k_smem.index(w))
        tma.async_copy_global_to_shared(v_desc, [kv_row0 + n0 + w * KEYS, 0], kv_bar, v_smem.index(w))
    for j in range(n_steps):
        i = i0 + j
        slot = i % STAGES
        # Step i reuses the slot of step i - STAGES: wait until both consumers have released it.
        mbarrier.wait(empty_bars.index(slot), ((i // STAGES) & 1) ^ 1, pred=i >= STAGES)
        row = q_row0 + (t_lo + j) * BLOCK_M
        if lse_desc is None:
            mbarrier.expect(q_bars.index(slot), q_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(q_desc, [row, 0], q_bars.index(slot), q_smem.index(slot))
            mbarrier.expect(do_bars.index(slot), do_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(do_desc, [row, 0], do_bars.index(slot), do_smem.index(slot))
        else:
            mbarrier.expect(q_bars.index(slot), q_desc.block_type.nbytes + lse_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(q_desc, [row, 0], q_bars.index(slot), q_smem.index(slot))
            tma.async_copy_global_to_shared(lse_desc, [bh, (t_lo + j) * BLOCK_M], q_bars.index(slot),
                                            lse_smem.index(slot))
            mbarrier.expect(do_bars.index(slot), do_desc.block_type.nbytes + delta_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(do_desc, [row, 0], do_bars.index(slot), do_smem.index(slot))
            tma.async_copy_global_to_shared(delta_desc, [bh, (t_lo + j) * BLOCK_M], do_bars.index(slot),
                                            delta_smem.index(slot))


@gluon.jit
def _consumer_steps(dk, dv, k_smem, v_smem, q_smem, do_smem, p_smem, ds_smem, dq_smem, q_bars, do_bars, empty_bars,
                    ds_full, ds_free, dq_desc, LSE, DELTA, q_row0, keys, t_from, t_to, t_lo, seq_q, seq_k,
                    qk_scale, sm_scale, runtime_zero, HEAD_DIM: gl.constexpr, STAGES: gl.constexpr,
                    MASK: gl.constexpr, IS_CAUSAL: gl.constexpr, SHARED_DS: gl.constexpr, W: gl.constexpr):
    """Query tiles [t_from, t_to) against this warpgroup's 64 keys: accumulate dK_w, dV_w (returned) and
    add its half of each tile's dQ to the workspace. Step i = t - t_lo: ring slot i % STAGES, dS buffer
    i % 2."""
    dtype: gl.constexpr = q_smem.dtype
    HALF: gl.constexpr = HEAD_DIM // 2
    DQ_COLS: gl.constexpr = HALF if SHARED_DS else HEAD_DIM
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, KEYS, 16])
    dq_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, DQ_COLS, 16])
    row_layout: gl.constexpr = gl.SliceLayout(1, s_layout)
    for t in range(t_from, t_to):
        i = t - t_lo
        slot = i % STAGES
        phase = (i // STAGES) & 1
        b = i % 2
        b_phase = (i // 2) & 1
        rows = t * ROWS + gl.arange(0, ROWS, layout=row_layout)
        q_slot = q_smem.index(slot)
        do_slot = do_smem.index(slot)
        # Views through a runtime zero that varies with t, so that the compiler cannot hoist these
        # buffers' 64-bit MMA descriptors out of the loop and hold them in registers (as in
        # `flash_gluon_backward`).
        here = t * runtime_zero
        k_w = k_smem.index(W + here)
        v_w = v_smem.index(W + here)
        p_w = p_smem.index(W + here)
        dq_w = dq_smem.index(W + here)
        zero = gl.zeros([ROWS, KEYS], gl.float32, s_layout)

        mbarrier.wait(q_bars.index(slot), phase)
        s = warpgroup_mma(q_slot, k_w.permute((1, 0)), zero, use_acc=False, is_async=True)
        mbarrier.wait(do_bars.index(slot), phase)
        dp = warpgroup_mma(do_slot, v_w.permute((1, 0)), zero, use_acc=False, is_async=True)
        lse2, delta = row_statistics(LSE, DELTA, q_row0, rows, seq_q, MASK)
        s = warpgroup_mma_wait(num_outstanding=1, deps=(s,))
        p = probabilities(s, lse2, rows, keys, seq_q, seq_k, qk_scale, MASK, IS_CAUSAL)
        p_w.store(p.to(dtype))
        fence_async_shared()
        gl.thread_barrier()  # this warpgroup's P is in place before its MMA reads it
        dv = warpgroup_mma(p_w.permute((1, 0)), do_slot, dv, is_async=True)
        dp = warpgroup_mma_wait(num_outstanding=1, deps=(dp,))
        ds = p * (dp - gl.expand_dims(delta, 1)) * sm_scale

        if SHARED_DS:
            # dS buffer b was last read by step i - 2's dQ products of both warpgroups.
            mbarrier.wait(ds_free.index(b), b_phase ^ 1, pred=i >= 2)
            ds_w = ds_smem.index(2 * b + W)
            ds_w.store(ds.to(dtype))
            fence_async_shared()
            gl.thread_barrier()
            mbarrier.arrive(ds_full.index(b), count=1)
            dk = warpgroup_mma(ds_w.permute((1, 0)), q_slot, dk, is_async=True)
            mbarrier.wait(ds_full.index(b), b_phase)  # the other half of dS is in place too
            dq = warpgroup_mma(ds_smem.index(2 * b), k_smem.index(here).slice(W * HALF, HALF, dim=1),
                               gl.zeros([ROWS, HALF], gl.float32, dq_layout), use_acc=False, is_async=True)
            dq = warpgroup_mma(ds_smem.index(2 * b + 1), k_smem.index(1 + here).slice(W * HALF, HALF, dim=1), dq,
                               is_async=True)
        else:  # this warpgroup's keys only, every column of dQ: no wait on the other warpgroup
            ds_w = ds_smem.index(W + here)
            ds_w.store(ds.to(dtype))
            fence_async_shared()
            gl.thread_barrier()
            dk = warpgroup_mma(ds_w.permute((1, 0)), q_slot, dk, is_async=True)
            dq = warpgroup_mma(ds_w, k_w, gl.zeros([ROWS, HEAD_DIM], gl.float32, dq_layout), use_acc=False,
                               is_async=True)
        dv, dk, dq = warpgroup_mma_wait(num_outstanding=0, deps=(dv, dk, dq))
        gl.thread_barrier()  # every warp's products of this step are done
        if SHARED_DS:
            mbarrier.arrive(ds_free.index(b), count=1)
        mbarrier.arrive(empty_bars.index(slot), count=1)

        tma.store_wait(0)  # the previous step's reduce-add has read the dQ buffer
        gl.thread_barrier()
        add_dq(dq_desc, dq_w, dq, q_row0 + t * ROWS, W * HALF if SHARED_DS else 0, HEAD_DIM)
    return dk, dv


@gluon.jit
def _steps(dk, dv, k_smem, v_smem, q_smem, do_smem, p_smem, ds_smem, dq_smem, q_bars, do_bars, empty_bars, ds_full,
           ds_free, dq_desc, LSE, DELTA, q_row0, keys, t_from, t_to, t_lo, seq_q, seq_k, qk_scale, sm_scale,
           runtime_zero, HEAD_DIM: gl.constexpr, STAGES: gl.constexpr, MASK: gl.constexpr, IS_CAUSAL: gl.constexpr,
           SHARED_DS: gl.constexpr, SWAP_AB: gl.constexpr, BLOCK_M: gl.constexpr, W: gl.constexpr,
           STATS_SMEM: gl.constexpr = False):
    if SWAP_AB:
        dk, dv = swapped_consumer_steps(dk, dv, k_smem, v_smem, q_smem, do_smem, ds_smem, dq_smem, q_bars, do_bars,
                                        empty_bars, ds_full, ds_free, dq_desc, LSE, DELTA, q_row0, keys, t_from, t_to,
                                        t_lo, seq_q, seq_k, qk_scale, sm_scale, runtime_zero, HEAD_DIM, STAGES, MASK,
                                        IS_CAUSAL, SWAP_AB == 1, BLOCK_M, W, STATS_SMEM)
    else:
        dk, dv = _consumer_steps(dk, dv, k_smem, v_smem, q_smem, do_smem, p_smem, ds_smem, dq_smem, q_bars, do_bars,
                                 empty_bars, ds_full, ds_free, dq_desc, LSE, DELTA, q_row0, keys, t_from, t_to, t_lo,
                                 seq_q, seq_k, qk_scale, sm_scale, runtime_zero, HEAD_DIM, STAGES, MASK, IS_CAUSAL,
                                 SHARED_DS, W)
    return dk, dv


@gluon.jit
def _plain_consumer_steps(dk, dv, k_smem, v_smem, q_smem, do_smem, p_smem, ds_smem, dq_smem, q_bars, do_bars,
                          empty_bars, ds_full, ds_free, dq_desc, LSE, DELTA, q_row0, keys, t_lo, t_diag, t_free, t_hi,
                          seq_q, seq_k, qk_scale, sm_scale, runtime_zero, HEAD_DIM: gl.constexpr,
                          STAGES: gl.constexpr, IS_CAUSAL: gl.constexpr, SHARED_DS: gl.constexpr,
                          SWAP_AB: gl.constexpr, BLOCK_M: gl.constexpr, W: gl.constexpr,
                          STATS_SMEM: gl.constexpr = False, i0=0):
    """Every step, masked [t_lo, t_diag), unmasked [t_diag, t_free), masked [t_free, t_hi); step t is
    ring step i0 + t - t_lo."""
    origin = t_lo - i0
    dk, dv = _steps(dk, dv, k_smem, v_smem, q_smem, do_smem, p_smem, ds_smem, dq_smem, q_bars, do_bars, empty_bars,
                    ds_full, ds_free, dq_desc, LSE, DELTA, q_row0, keys, t_lo, t_diag, origin, seq_q, seq_k, qk_scale,
                    sm_scale, runtime_zero, HEAD_DIM, STAGES, True, IS_CAUSAL, SHARED_DS, SWAP_AB, BLOCK_M, W,
                    STATS_SMEM)
    dk, dv = _steps(dk, dv, k_smem, v_smem, q_smem, do_smem, p_smem, ds_smem, dq_smem, q_bars, do_bars, empty_bars,
                    ds_full, ds_free, dq_desc, LSE, DELTA, q_row0, keys, t_diag, t_free, origin, seq_q, seq_k, qk_scale,
                    sm_scale, runtime_zero, HEAD_DIM, STAGES, False, IS_CAUSAL, SHARED_DS, SWAP_AB, BLOCK_M, W,
                    STATS_SMEM)
    dk, dv = _steps(dk, dv, k_smem, v_smem, q_smem, do_smem, p_smem, ds_smem, dq_smem, q_bars, do_bars, empty_bars,
                    ds_full, ds_free, dq_desc, LSE, DELTA, q_row0, keys, t_free, t_hi, origin, seq_q, seq_k, qk_scale,
                    sm_scale, runtime_zero, HEAD_DIM, STAGES, True, IS_CAUSAL, SHARED_DS, SWAP_AB, BLOCK_M, W,
                    STATS_SMEM)
    return dk, dv


@gluon.jit
def _consumer(k_smem, v_smem, q_smem, do_smem, p_smem, ds_smem, dq_smem, kv_bar, q_bars, do_bars, empty_bars,
              ds_full, ds_free, dq_desc, DK, DV, LSE, DELTA, bh, n0, t_lo, t_diag, t_free, t_hi, seq_q, seq_k,
              qk_scale, sm_scale, runtime_zero, HEAD_DIM: gl.constexpr, STAGES: gl.constexpr, IS_CAUSAL: gl.constexpr,
              SHARED_DS: gl.constexpr, ROTATE: gl.constexpr, SWAP_AB: gl.constexpr, BLOCK_M: gl.constexpr,
              W: gl.constexpr, STATS_SMEM: gl.constexpr = False, DQ_FULL: gl.constexpr = False, i0=0, kv_phase=0,
              kv_free=None):
    """This warpgroup's dK and dV (dQ halves to the workspace; with DQ_FULL, rotated steps only, its own
    keys' share of dQ at full width). LSE and DELTA: pointers, or with
    STATS_SMEM the shared buffers the producer fills. The persistent kernel's tiles after the first give
    i0 (the ring steps taken before), kv_phase (of K and V's barrier) and kv_free, the barrier on which
    the consumers release K and V once their last product has read them."""
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, KEYS, 16])
    kv_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, HEAD_DIM, 16])
    q_row0 = bh * seq_q
    k0 = n0 + W * KEYS
    if SWAP_AB:  # keys on the rows of S^T (BLOCK_M queries on its columns)
        st_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                            instr_shape=[16, BLOCK_M, 16])
        keys = k0 + gl.arange(0, KEYS, layout=gl.SliceLayout(1, st_layout))
    else:
        keys = k0 + gl.arange(0, KEYS, layout=gl.SliceLayout(0, s_layout))
    dk = gl.zeros([KEYS, HEAD_DIM], gl.float32, kv_layout)
    dv = gl.zeros([KEYS, HEAD_DIM], gl.float32, kv_layout)
    mbarrier.wait(kv_bar, kv_phase)
    if ROTATE:
        dk, dv = rotated_consumer_steps(dk, dv, k_smem, v_smem, q_smem, do_smem, p_smem, ds_smem, dq_smem, q_bars,
                                        do_bars, empty_bars, ds_full, ds_free, dq_desc, LSE, DELTA, q_row0, keys, t_lo,
                                        t_diag, t_free, t_hi, seq_q, seq_k, qk_scale, sm_scale, runtime_zero, HEAD_DIM,
                                        STAGES, IS_CAUSAL, ROTATE == 2, W, ROTATE == 3, STATS_SMEM, i0,
                                        DQ_FULL=DQ_FULL)
    else:
        dk, dv = _plain_consumer_steps(dk, dv, k_smem, v_smem, q_smem, do_smem, p_smem, ds_smem, dq_smem, q_bars,
                                       do_bars, empty_bars, ds_full, ds_free, dq_desc, LSE, DELTA, q_row0, keys, t_lo,
                                       t_diag, t_free, t_hi, seq_q, seq_k, qk_scale, sm_scale, runtime_zero, HEAD_DIM,
                                       STAGES, IS_CAUSAL, SHARED_DS, SWAP_AB, BLOCK_M, W, STATS_SMEM, i0)
    if kv_free is not None:  # every warp's products are done (the steps end at a CTA barrier)
        gl.thread_barrier()
        mbarrier.arrive(kv_free, count=1)
    tma.store_wait(0)  # the last reduce-add has read the dQ buffer before the CTA's memory goes

    store_dk_dv(DK, DV, dk, dv, bh, k0, seq_k, KEYS, HEAD_DIM)  # this warpgroup's keys


@gluon.jit
def _tile_of(w, n_heads, seq_q, seq_k, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, IS_CAUSAL: gl.constexpr):
    """The persistent kernel's work item w: key tile w % (key tiles) of head w // (key tiles), the plain
    grid's order (key tiles first, each head's longest first when causal). Heads first instead (every
    head's key tile 0, then every head's key tile 1, ...) ran 1.9x slower at 32 heads of 32768 (d 128),
    H100 (our reading: the 132 CTAs at work then read Q and dO and reduce-add dQ across all heads,
    where in this order they share one head's, 16 MiB of Q and dO at that shape, within L2)."""
    n_tiles = gl.cdiv(seq_k, BLOCK_N)
    bh = w // n_tiles
    n0 = (w % n_tiles) * BLOCK_N
    t_lo, t_diag, t_free, t_hi = query_tile_range(n0, seq_q, seq_k, BLOCK_M, BLOCK_N, IS_CAUSAL)
    return bh, n0, t_lo, t_diag, t_free, t_hi


@gluon.jit
def _persistent_producer(q_desc, k_desc, v_desc, do_desc, k_smem, v_smem, q_smem, do_smem, kv_bar, kv_free, q_bars,
                         do_bars, empty_bars, n_heads, seq_q, seq_k, STAGES: gl.constexpr, BLOCK_M: gl.constexpr,
                         IS_CAUSAL: gl.constexpr, lse_desc=None, delta_desc=None, lse_smem=None, delta_smem=None):
    """`_producer` for each of this CTA's work items in turn, K and V of the next once both consumers
    have released the last's (kv_free); the ring's steps numbered on across items."""
    BLOCK_N: gl.constexpr = 2 * KEYS
    i0 = 0
    count = 0
    for w in range(gl.program_id(0), gl.cdiv(seq_k, BLOCK_N) * n_heads, gl.num_programs(0)):
        bh, n0, t_lo, t_diag, t_free, t_hi = _tile_of(w, n_heads, seq_q, seq_k, BLOCK_M, BLOCK_N, IS_CAUSAL)
        mbarrier.wait(kv_free, (count & 1) ^ 1, pred=count > 0)
        _producer(q_desc, k_desc, v_desc, do_desc, k_smem, v_smem, q_smem, do_smem, kv_bar, q_bars, do_bars,
                  empty_bars, bh * seq_k, bh * seq_q, n0, t_lo, t_hi - t_lo, STAGES, BLOCK_M, bh, lse_desc,
                  delta_desc, lse_smem, delta_smem, i0)
        i0 += t_hi - t_lo
        count += 1


@gluon.jit
def _persistent_consumer(k_smem, v_smem, q_smem, do_smem, p_smem, ds_smem, dq_smem, kv_bar, kv_free, q_bars, do_bars,
                         empty_bars, ds_full, ds_free, dq_desc, DK, DV, LSE, DELTA, n_heads, seq_q, seq_k, qk_scale,
                         sm_scale, runtime_zero, HEAD_DIM: gl.constexpr, STAGES: gl.constexpr,
                         IS_CAUSAL: gl.constexpr, SHARED_DS: gl.constexpr, ROTATE: gl.constexpr,
                         SWAP_AB: gl.constexpr, BLOCK_M: gl.constexpr, W: gl.constexpr, STATS_SMEM: gl.constexpr):
    """`_consumer` for each of this CTA's work items in turn (the producer's order)."""
    BLOCK_N: gl.constexpr = 2 * KEYS
    i0 = 0
    count = 0
    for w in range(gl.program_id(0), gl.cdiv(seq_k, BLOCK_N) * n_heads, gl.num_programs(0)):
        bh, n0, t_lo, t_diag, t_free, t_hi = _tile_of(w, n_heads, seq_q, seq_k, BLOCK_M, BLOCK_N, IS_CAUSAL)
        _consumer(k_smem, v_smem, q_smem, do_smem, p_smem, ds_smem, dq_smem, kv_bar, q_bars, do_bars, empty_bars,
                  ds_full, ds_free, dq_desc, DK, DV, LSE, DELTA, bh, n0, t_lo, t_diag, t_free, t_hi, seq_q, seq_k,
                  qk_scale, sm_scale, runtime_zero, HEAD_DIM, STAGES, IS_CAUSAL, SHARED_DS, ROTATE, SWAP_AB, BLOCK_M,
                  W, STATS_SMEM, False, i0, count & 1, kv_free)
        i0 += t_hi - t_lo
        count += 1


@gluon.jit
def flash_backward_gluon_ws_kernel(q_desc, k_desc, v_desc, do_desc, dq_desc, DK, DV, LSE, DELTA, seq_q, seq_k,
                                   qk_scale, sm_scale, runtime_zero, HEAD_DIM: gl.constexpr, STAGES: gl.constexpr,
                                   IS_CAUSAL: gl.constexpr, SHARED_DS: gl.constexpr, PRODUCER_REGS: gl.constexpr,
                                   CONSUMER_REGS: gl.constexpr, TILES_FIRST: gl.constexpr, ROTATE: gl.constexpr,
                                   SWAP_AB: gl.constexpr, BLOCK_M: gl.constexpr, num_warps: gl.constexpr,
                                   STATS_SMEM: gl.constexpr = False, PERSISTENT: gl.constexpr = False,
                                   DQ_FULL: gl.constexpr = False):
    """Grid (key tiles of 128, batch*heads) with TILES_FIRST, else (batch*heads, key tiles). dq_desc: the
    zeroed fp32 workspace (batch*heads*seq_q, HEAD_DIM) in blocks of 64 rows x HEAD_DIM / 2 (or
    HEAD_DIM without SHARED_DS, or with BLOCK_M 128, where each warpgroup adds 64 rows of dQ), or, not
    swizzled, the same workspace in fragment order (`flash_gluon_backward_common.add_dq`): a
    (batch*heads*seq_q*HEAD_DIM/64, 64) view in blocks of (those columns) x 64. LSE and DELTA: pointers
    to the (batch*heads*seq_q) L and D, or with STATS_SMEM TMA descriptors of (batch*heads, seq_q)
    views of them in blocks of 1 x BLOCK_M (the producer loads each step's rows into the ring beside Q
    and dO; rows past seq_q read as 0). PERSISTENT: a 1-D grid of at most one CTA an SM, each taking the
    work items (key tile, head) w, w + grid, ... (`_tile_of`). DQ_FULL (rotated steps, not persistent):
    each warpgroup adds its own keys' share of dQ at full width (dq_desc's blocks HEAD_DIM wide)."""
    gl.static_assert(num_warps == 4, "the default partition is one consumer warpgroup")
    gl.static_assert(SHARED_DS or not ROTATE, "the rotated steps share dS between the warpgroups")
    gl.static_assert(not (SWAP_AB and (ROTATE or not SHARED_DS)), "the swapped steps share dS and are not rotated")
    gl.static_assert((BLOCK_M == 64) or (SWAP_AB != 0), "steps of 128 queries take the swapped consumer")
    gl.static_assert(not STATS_SMEM or ROTATE != 0 or SWAP_AB != 0, "L and D in the ring: rotated or swapped steps")
    gl.static_assert(not DQ_FULL or (ROTATE != 0 and not PERSISTENT), "dQ at full width: rotated, not persistent")
    BLOCK_N: gl.constexpr = 2 * KEYS
    N_AXIS: gl.constexpr = 0 if TILES_FIRST else 1
    bh = gl.program_id(1 - N_AXIS)
    n0 = gl.program_id(N_AXIS) * BLOCK_N  # causal: key tile 0 sees the most query tiles, and starts first
    dtype: gl.constexpr = q_desc.dtype
    pds_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([KEYS, BLOCK_M], dtype)

    k_smem = gl.allocate_shared_memory(dtype, [2, KEYS, HEAD_DIM], k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [2, KEYS, HEAD_DIM], v_desc.layout)
    q_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, HEAD_DIM], q_desc.layout)
    do_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, HEAD_DIM], do_desc.layout)
    if SHARED_DS:  # two buffers (alternate steps), each with both warpgroups' halves: [buffer * 2 + warpgroup]
        ds_smem = gl.allocate_shared_memory(dtype, [4, KEYS, BLOCK_M], pds_layout)
    else:
        ds_smem = gl.allocate_shared_memory(dtype, [2, ROWS, KEYS], pds_layout)
    dq_smem = gl.allocate_shared_memory(gl.float32, [2, dq_desc.block_type.shape[0], dq_desc.block_type.shape[1]],
                                        dq_desc.layout)
    if SWAP_AB:  # P stays in registers
        p_smem = ds_smem
    else:
        p_smem = gl.allocate_shared_memory(dtype, [2, ROWS, KEYS], pds_layout)  # one per warpgroup
    kv_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    q_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    do_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    ds_full = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    ds_free = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    mbarrier.init(kv_bar, count=1)
    for s in gl.static_range(STAGES):
        mbarrier.init(q_bars.index(s), count=1)
        mbarrier.init(do_bars.index(s), count=1)
        mbarrier.init(empty_bars.index(s), count=2)  # one arrive per consumer warpgroup
    for b in gl.static_range(2):
        mbarrier.init(ds_full.index(b), count=2)
        mbarrier.init(ds_free.index(b), count=2)

    t_lo, t_diag, t_free, t_hi = query_tile_range(n0, seq_q, seq_k, BLOCK_M, BLOCK_N, IS_CAUSAL)

    if STATS_SMEM:  # the consumers read L and D from the ring, the producer loads them (descriptors)
        lse_smem = gl.allocate_shared_memory(gl.float32, [STAGES, 1, BLOCK_M], LSE.layout)
        delta_smem = gl.allocate_shared_memory(gl.float32, [STAGES, 1, BLOCK_M], DELTA.layout)
        lse_in = lse_smem
        delta_in = delta_smem
        stats_loads = (q_desc, k_desc, v_desc, do_desc, k_smem, v_smem, q_smem, do_smem, kv_bar, q_bars, do_bars,
                       empty_bars, bh * seq_k, bh * seq_q, n0, t_lo, t_hi - t_lo, STAGES, BLOCK_M, bh, LSE, DELTA,
                       lse_smem, delta_smem)
    else:
        lse_in = LSE
        delta_in = DELTA
    if PERSISTENT:
        kv_free = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        mbarrier.init(kv_free, count=2)  # one arrive per consumer warpgroup
        n_heads = q_desc.shape[0] // seq_q
        if STATS_SMEM:
            stats_args = (LSE, DELTA, lse_smem, delta_smem)
        else:
            stats_args = ()
        gl.warp_specialize([
            (_persistent_consumer, (k_smem, v_smem, q_smem, do_smem, p_smem, ds_smem, dq_smem, kv_bar, kv_free,
                                    q_bars, do_bars, empty_bars, ds_full, ds_free, dq_desc, DK, DV, lse_in, delta_in,
                                    n_heads, seq_q, seq_k, qk_scale, sm_scale, runtime_zero, HEAD_DIM, STAGES,
                                    IS_CAUSAL, SHARED_DS, ROTATE, SWAP_AB, BLOCK_M, 0, STATS_SMEM)),
            (_persistent_producer, (q_desc, k_desc, v_desc, do_desc, k_smem, v_smem, q_smem, do_smem, kv_bar, kv_free,
                                    q_bars, do_bars, empty_bars, n_heads, seq_q, seq_k, STAGES, BLOCK_M, IS_CAUSAL)
             + stats_args),
            (_persistent_consumer, (k_smem, v_smem, q_smem, do_smem, p_smem, ds_smem, dq_smem, kv_bar, kv_free,
                                    q_bars, do_bars, empty_bars, ds_full, ds_free, dq_desc, DK, DV, lse_in, delta_in,
                                    n_heads, seq_q, seq_k, qk_scale, sm_scale, runtime_zero, HEAD_DIM, STAGES,
                                    IS_CAUSAL, SHARED_DS, ROTATE, SWAP_AB, BLOCK_M, 1, STATS_SMEM)),
        ], [1, 4], [PRODUCER_REGS, CONSUMER_REGS])
    else:
        # Without STATS_SMEM the producer's arguments are formed after the consumers', as before the option:
        # where these products are formed moves the partitions' captures in shared memory, and the SASS.
        gl.warp_specialize([
            (_consumer, (k_smem, v_smem, q_smem, do_smem, p_smem, ds_smem, dq_smem, kv_bar, q_bars, do_bars,
                         empty_bars, ds_full, ds_free, dq_desc, DK, DV, lse_in, delta_in, bh, n0, t_lo, t_diag,
                         t_free, t_hi, seq_q, seq_k, qk_scale, sm_scale, runtime_zero, HEAD_DIM, STAGES, IS_CAUSAL,
                         SHARED_DS, ROTATE, SWAP_AB, BLOCK_M, 0, STATS_SMEM, DQ_FULL)),
            (_producer, stats_loads if STATS_SMEM else (
                q_desc, k_desc, v_desc, do_desc, k_smem, v_smem, q_smem, do_smem, kv_bar, q_bars, do_bars,
                empty_bars, bh * seq_k, bh * seq_q, n0, t_lo, t_hi - t_lo, STAGES, BLOCK_M)),
            (_consumer, (k_smem, v_smem, q_smem, do_smem, p_smem, ds_smem, dq_smem, kv_bar, q_bars, do_bars,
                         empty_bars, ds_full, ds_free, dq_desc, DK, DV, lse_in, delta_in, bh, n0, t_lo, t_diag,
                         t_free, t_hi, seq_q, seq_k, qk_scale, sm_scale, runtime_zero, HEAD_DIM, STAGES, IS_CAUSAL,
                         SHARED_DS, ROTATE, SWAP_AB, BLOCK_M, 1, STATS_SMEM, DQ_FULL)),
        ], [1, 4], [PRODUCER_REGS, CONSUMER_REGS])


def _aligned_rows(rows):
    """`rows` (a 2-D fp32 tensor), or a copy whose rows start at 16-byte aligned addresses, as a TMA
    descriptor's rows must (a row's length padded to a multiple of 4 floats)."""
    import torch

    if rows.stride(0) % 4 == 0 and rows.stride(1) == 1 and rows.data_ptr() % 16 == 0:
        return rows
    padded = torch.zeros(rows.shape[0], -(-rows.shape[1] // 4) * 4, dtype=rows.dtype, device=rows.device)
    padded[:, :rows.shape[1]] = rows
    return padded


def flash_backward_gluon_ws(q, k, v, out, lse, grad_out, is_causal: bool, stages: int, producer_regs: int,
                            consumer_regs: int, shared_ds: bool = True, tiles_first: bool = True,
                            rotate: int = 0, swap_ab: int = 0, block_m: int = 64, dq_fragments: bool = False,
                            stats_smem: bool = False, persistent: bool = False, dq_full: bool = False):
    """dQ, dK, dV by the warp-specialised kernel, for contiguous, 16-byte aligned (..., seq, d) tensors
    (as `flash_gluon_backward.flash_backward_gluon` takes them); the gradients and the kernel's handle.
    `dq_fragments`: the dQ workspace in the accumulators' register order, where seq_q is a multiple of 64
    (else row-major). `stats_smem`: L and D loaded by the producer (TMA) into the ring with Q and dO,
    where the dQ workspace is in fragment order (else each consumer loads them from global memory: with
    the row-major workspace's stores, ptxas serialises the causal kernel's products, "insufficient
    register resources for the wgmma pipeline", Triton 3.6). `persistent`: one CTA an SM (at most), each
    taking (key tile, head) work items in turn, in the plain grid's order. `dq_full` (rotated steps): each
    warpgroup's share of dQ over its own keys at full width, not half the columns over both halves' dS."""
    import math

    import torch
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from cs336sys.attention.flash_gluon_backward import LOG2E
    from cs336sys.attention.flash_gluon_backward_common import dq_from_fragments_kernel
    from cs336sys.attention.flash_triton_backward import backward_delta_kernel

    *lead, seq_q, d = q.shape
    seq_k = k.shape[-2]
    bh = math.prod(lead)
    element = {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16}[q.dtype]

    def descriptor(t: torch.Tensor, rows: int, block: list[int], dtype):
        layout = gl.NVMMASharedLayout.get_default_for(block, dtype)
        return TensorDescriptor(t.view(-1, d), [bh * rows, d], [d, 1], block, layout)

    delta = torch.empty_like(lse)
    backward_delta_kernel[(math.ceil(seq_q / 64), bh)](out, grad_out, delta, seq_q, HEAD_DIM=d, BLOCK_M=64)
    dq_acc = torch.zeros((bh * seq_q, d), dtype=torch.float32, device=q.device)
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    sm_scale = 1.0 / math.sqrt(d)
    key_tiles = math.ceil(seq_k / (2 * KEYS.value))
    # each warpgroup's dQ tile: 64 rows x dq_cols
    dq_cols = d // 2 if shared_ds and block_m == ROWS.value and not dq_full else d
    fragments = dq_fragments and seq_q % ROWS.value == 0
    stats_smem = stats_smem and fragments
    if fragments:
        dq_view = TensorDescriptor(dq_acc.view(-1, 64), [bh * seq_q * d // 64, 64], [64, 1], [dq_cols, 64],
                                   gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2))
    else:
        dq_view = descriptor(dq_acc, seq_q, [ROWS.value, dq_cols], gl.float32)
    if stats_smem:  # (batch*heads, seq_q) views, rows 16-byte aligned (TMA): copies where they are not
        row_layout = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2)
        lse_at, delta_at = (TensorDescriptor(t, [bh, seq_q], [t.stride(0), 1], [1, block_m], row_layout)
                            for t in (_aligned_rows(lse.view(bh, seq_q)), _aligned_rows(delta.view(bh, seq_q))))
    else:
        lse_at, delta_at = lse, delta
    if persistent:
        sms = torch.cuda.get_device_properties(q.device).multi_processor_count if q.is_cuda else 132
        grid = (min(sms, key_tiles * bh),)
    else:
        grid = (key_tiles, bh) if tiles_first else (bh, key_tiles)
    handle = flash_backward_gluon_ws_kernel[grid](
        descriptor(q, seq_q, [block_m, d], element), descriptor(k, seq_k, [KEYS.value, d], element),
        descriptor(v, seq_k, [KEYS.value, d], element), descriptor(grad_out, seq_q, [block_m, d], element),
        dq_view, dk, dv, lse_at, delta_at, seq_q, seq_k, sm_scale * LOG2E, sm_scale, 0, HEAD_DIM=d, STAGES=stages,
        IS_CAUSAL=is_causal, SHARED_DS=shared_ds, PRODUCER_REGS=producer_regs, CONSUMER_REGS=consumer_regs,
        TILES_FIRST=tiles_first, ROTATE=rotate, SWAP_AB=swap_ab, BLOCK_M=block_m, num_warps=4,
        STATS_SMEM=stats_smem, **({"PERSISTENT": True} if persistent else {}), **({"DQ_FULL": True} if dq_full else {}))
    if fragments:
        dq = torch.empty_like(q)
        dq_from_fragments_kernel[(bh * seq_q // ROWS.value, d // dq_cols)](dq_acc, dq, HEAD_DIM=d, COLS=dq_cols)
        return dq, dk, dv, handle
    return dq_acc.view(q.shape).to(q.dtype), dk, dv, handle
