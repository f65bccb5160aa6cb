"""Option, not the default: the single-partition Gluon backward (5 tile products per tile pair).

Kept because its tiles are entries of `flash_gluon.BACKWARD_VARIANTS`, which the tests compile and
run; the default is `flash_gluon_backward_ws`, which takes its LOG2E from here.

FlashAttention-2's backward laid out as FlashAttention-3 does on Hopper, kept simple (one partition,
no warp specialisation):
- D = rowsum(dO * O) (fp32) first, by the `tl` preprocess kernel (`flash_triton_backward`).
- One program per (batch*head, key tile of BLOCK_N keys). K and V are loaded once by TMA into shared
  memory; the query tiles (BLOCK_M rows) that can see the key tile stream through a ring of STAGES
  shared-memory slots of Q and dO (one mbarrier per tensor and slot); L and D of a query tile are
  plain vector loads. Per query tile, all as asynchronous warpgroup MMAs, queries on the rows (the
  64 rows of a tile are one warpgroup MMA high; with two warpgroups each takes half the columns):
    S    = Q K^T            (A = the Q slot, B = the permuted K buffer)
    dP   = dO V^T           (issued right after S, so it runs under the exponentials)
    P    = exp2(S * scale * log2(e) - L * log2(e)), masked to 0 where a mask applies; to shared memory
    dV  += P^T dO           (A = the permuted P buffer; each warpgroup owns 64 keys of dK, dV)
    dS   = P (dP - D) * scale, to shared memory (bf16/fp16)
    dK  += dS^T Q           (A = the permuted dS buffer)
    dQ_t = dS K             (A = the dS buffer; each warpgroup half of the head dimension)
  and dQ_t is added with fp32 atomics (relaxed) into an fp32 workspace (batch*heads*seq_q, d), which
  the launcher converts to the output dtype in one pass. The softmax scale is folded into dS, so dK
  and the workspace need no scaling.
- L is the forward's natural-log logsumexp (as `flash_gluon_forward` and `flash_triton_forward` save
  it); the kernel multiplies it by log2(e) and works in base 2.

Causal masking is top-left aligned (query i sees keys j <= i), as in the forwards. A key tile
[n0, n0 + BLOCK_N) is seen by the query tiles from n0 on (BLOCK_N is a multiple of BLOCK_M): the first
BLOCK_N / BLOCK_M of them cross the diagonal and are masked; the rest see the whole tile. A ragged last
query tile, and every step of a ragged last key tile, are masked too (the score tile is set to P = 0
where a query row is past seq_q, a key row past seq_k or the key is after the query).

TMA reads use 2-D views (batch*heads*seq, d): rows past a head's end belong to the next head (or are
zero-filled past the tensor). Those rows are masked in P (hence in dS), so they contribute to nothing;
dQ atomics, dK and dV stores are masked to this head's rows.

Barriers in a step: the P and dS buffers are written by every warp and read across warpgroups by the
MMAs, so each store is followed by `fence_async_shared` (generic to async proxy) and a CTA barrier; at
the end of a step, after every product of the step has been waited on, a CTA barrier precedes the TMA
refill of the step's ring slot (and the next step's P and dS stores).

Register pressure: the K, V, P and dS buffers are viewed through `index(t * runtime_zero)`, a kernel
argument that is always 0 but unknown to the compiler. Without it the ~40 loop-invariant 64-bit wgmma
shared-memory descriptors of those buffers were hoisted out of the query loop and held in registers,
which spilled at d 128 (tools/gluon_compile_check.py reports registers and spills per variant).
"""

from __future__ import annotations

import math

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from cs336sys.attention.flash_gluon_backward_common import (
    probabilities,
    query_tile_range,
    row_statistics,
    store_dk_dv,
)

LOG2E = 1.4426950408889634


@gluon.jit
def _load_q_do(q_desc, do_desc, q_smem, do_smem, q_bars, do_bars, q_row0, t_lo, i, n_steps,
               BLOCK_M: gl.constexpr, STAGES: gl.constexpr):
    """Start the TMA loads of step i's Q and dO tiles (query tile t_lo + i) into ring slot i % STAGES;
    nothing if i >= n_steps."""
    slot = i % STAGES
    live = i < n_steps
    row = q_row0 + (t_lo + i) * BLOCK_M
    mbarrier.expect(q_bars.index(slot), q_desc.block_type.nbytes, pred=live)
    tma.async_copy_global_to_shared(q_desc, [row, 0], q_bars.index(slot), q_smem.index(slot), pred=live)
    mbarrier.expect(do_bars.index(slot), do_desc.block_type.nbytes, pred=live)
    tma.async_copy_global_to_shared(do_desc, [row, 0], do_bars.index(slot), do_smem.index(slot), pred=live)


@gluon.jit
def _query_steps(dk, dv, k_smem, v_smem, q_smem, do_smem, p_smem, ds_smem, q_bars, do_bars, q_desc, do_desc,
                 LSE, DELTA, DQ, q_row0, keys, t_from, t_to, t_lo, n_steps, seq_q, seq_k, qk_scale, sm_scale,
                 runtime_zero, s_layout: gl.constexpr, dq_layout: gl.constexpr, HEAD_DIM: gl.constexpr,
                 BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, MASK: gl.constexpr,
                 IS_CAUSAL: gl.constexpr):
    """Query tiles [t_from, t_to) against this program's key tile: accumulate dK, dV (returned) and add
    each tile's dQ into the workspace. Step i = t - t_lo uses ring slot i % STAGES."""
    dtype: gl.constexpr = q_smem.dtype
    row_layout: gl.constexpr = gl.SliceLayout(1, s_layout)
    # dQ's element offsets within the head (32-bit), from the head's 64-bit base.
    dq_rows = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, dq_layout))
    dq_cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, dq_layout))
    dq_head = DQ + q_row0.to(gl.int64) * HEAD_DIM
    for t in range(t_from, t_to):
        i = t - t_lo
        slot = i % STAGES
        phase = (i // STAGES) & 1
        m0 = t * BLOCK_M
        rows = m0 + gl.arange(0, BLOCK_M, layout=row_layout)
        lse2, delta = row_statistics(LSE, DELTA, q_row0, rows, seq_q, MASK)
        q_slot = q_smem.index(slot)
        # Views through a runtime zero that varies with t: without it the compiler hoists the ~40
        # loop-invariant 64-bit MMA descriptors of these buffers out of the loop (spills at d 128).
        here = t * runtime_zero
        k_buf = k_smem.index(here)
        v_buf = v_smem.index(here)
        p_buf = p_smem.index(here)
        ds_buf = ds_smem.index(here)
        do_slot = do_smem.index(slot)
        zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)

        mbarrier.wait(q_bars.index(slot), phase)
        s = warpgroup_mma(q_slot, k_buf.permute((1, 0)), zero, use_acc=False, is_async=True)
        mbarrier.wait(do_bars.index(slot), phase)
        dp = warpgroup_mma(do_slot, v_buf.permute((1, 0)), zero, use_acc=False, is_async=True)
        s = warpgroup_mma_wait(num_outstanding=1, deps=(s,))
        p = probabilities(s, lse2, rows, keys, seq_q, seq_k, qk_scale, MASK, IS_CAUSAL)
        p_buf.store(p.to(dtype))
        fence_async_shared()
        gl.thread_barrier()  # all of P is in place: each warpgroup's dV rows need every warp's columns
        dv = warpgroup_mma(p_buf.permute((1, 0)), do_slot, dv, is_async=True)
        dp = warpgroup_mma_wait(num_outstanding=1, deps=(dp,))  # dV may still run under dS
        ds = p * (dp - gl.expand_dims(delta, 1)) * sm_scale
        ds_buf.store(ds.to(dtype))
        fence_async_shared()
        gl.thread_barrier()  # all of dS is in place before dK and dQ read it
        dk = warpgroup_mma(ds_buf.permute((1, 0)), q_slot, dk, is_async=True)
        dq = warpgroup_mma(ds_buf, k_buf, gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, dq_layout), use_acc=False,
                           is_async=True)
        dv, dk, dq = warpgroup_mma_wait(num_outstanding=0, deps=(dv, dk, dq))

        dq_r = m0 + dq_rows
        dq_ptrs = dq_head + (gl.expand_dims(dq_r, 1) * HEAD_DIM + gl.expand_dims(dq_cols, 0))
        if MASK:
            gl.atomic_add(dq_ptrs, dq, mask=gl.expand_dims(dq_r, 1) < seq_q, sem="relaxed")
        else:
            gl.atomic_add(dq_ptrs, dq, sem="relaxed")
        # Every warpgroup has waited on its products of this step: the slot, P and dS may be reused.
        gl.thread_barrier()
        _load_q_do(q_desc, do_desc, q_smem, do_smem, q_bars, do_bars, q_row0, t_lo, i + STAGES, n_steps,
                   BLOCK_M, STAGES)
    return dk, dv


@gluon.jit
def flash_backward_gluon_kernel(q_desc, k_desc, v_desc, do_desc, DK, DV, DQ, LSE, DELTA, seq_q, seq_k,
                                qk_scale, sm_scale, runtime_zero, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr,
                                BLOCK_N: gl.constexpr, STAGES: gl.constexpr, IS_CAUSAL: gl.constexpr,
                                num_warps: gl.constexpr):
    """Grid (batch*heads, key tiles). DQ: the fp32 workspace (zeroed), (batch*heads*seq_q, HEAD_DIM)."""
    gl.static_assert(num_warps % 4 == 0, "warpgroup MMAs: whole warpgroups")
    gl.static_assert(BLOCK_M == 64, "query tiles of one warpgroup MMA's height")
    gl.static_assert(BLOCK_N % (16 * num_warps) == 0, "16 key rows per warp for dK, dV")
    gl.static_assert(BLOCK_N % BLOCK_M == 0, "causal tiles line up on the diagonal")
    bh = gl.program_id(0)
    pid_n = gl.program_id(1)  # causal: key tile 0 sees the most query tiles, and starts first
    n0 = pid_n * BLOCK_N
    dtype: gl.constexpr = q_desc.dtype
    GROUPS: gl.constexpr = num_warps // 4

    # Products with query rows (S, dP, dQ: 64 rows, one warpgroup MMA high) split their columns between
    # the warpgroups; products with key rows (dK, dV) give each warp 16 keys.
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, GROUPS],
                                                       instr_shape=[16, BLOCK_N // GROUPS, 16])
    dq_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, GROUPS],
                                                        instr_shape=[16, HEAD_DIM // GROUPS, 16])
    kv_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                        instr_shape=[16, HEAD_DIM, 16])
    pds_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, BLOCK_N], dtype)

    k_smem = gl.allocate_shared_memory(dtype, [1, BLOCK_N, HEAD_DIM], k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [1, BLOCK_N, HEAD_DIM], v_desc.layout)
    q_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, HEAD_DIM], q_desc.layout)
    do_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, HEAD_DIM], do_desc.layout)
    p_smem = gl.allocate_shared_memory(dtype, [1, BLOCK_M, BLOCK_N], pds_layout)
    ds_smem = gl.allocate_shared_memory(dtype, [1, BLOCK_M, BLOCK_N], pds_layout)
    kv_bars = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    q_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    do_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for c in gl.static_range(2):
        mbarrier.init(kv_bars.index(c), count=1)
    for s in gl.static_range(STAGES):
        mbarrier.init(q_bars.index(s), count=1)
        mbarrier.init(do_bars.index(s), count=1)

    t_lo, t_diag, t_free, t_hi = query_tile_range(n0, seq_q, seq_k, BLOCK_M, BLOCK_N, IS_CAUSAL)
    n_steps = t_hi - t_lo

    kv_row0 = bh * seq_k
    q_row0 = bh * seq_q
    mbarrier.expect(kv_bars.index(0), k_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(k_desc, [kv_row0 + n0, 0], kv_bars.index(0), k_smem.index(0))
    mbarrier.expect(kv_bars.index(1), v_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(v_desc, [kv_row0 + n0, 0], kv_bars.index(1), v_smem.index(0))
    for s in gl.static_range(STAGES):
        _load_q_do(q_desc, do_desc, q_smem, do_smem, q_bars, do_bars, q_row0, t_lo, s, n_steps, BLOCK_M, STAGES)
    mbarrier.wait(kv_bars.index(0), 0)
    mbarrier.wait(kv_bars.index(1), 0)

    keys = n0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
    dk = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, kv_layout)
    dv = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, kv_layout)
    dk, dv = _query_steps(dk, dv, k_smem, v_smem, q_smem, do_smem, p_smem, ds_smem, q_bars, do_bars, q_desc,
                          do_desc, LSE, DELTA, DQ, q_row0, keys, t_lo, t_diag, t_lo, n_steps, seq_q, seq_k,
                          qk_scale, sm_scale, runtime_zero, s_layout, dq_layout, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES,
                          True, IS_CAUSAL)
    dk, dv = _query_steps(dk, dv, k_smem, v_smem, q_smem, do_smem, p_smem, ds_smem, q_bars, do_bars, q_desc,
                          do_desc, LSE, DELTA, DQ, q_row0, keys, t_diag, t_free, t_lo, n_steps, seq_q, seq_k,
                          qk_scale, sm_scale, runtime_zero, s_layout, dq_layout, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES,
                          False, IS_CAUSAL)
    dk, dv = _query_steps(dk, dv, k_smem, v_smem, q_smem, do_smem, p_smem, ds_smem, q_bars, do_bars, q_desc,
                          do_desc, LSE, DELTA, DQ, q_row0, keys, t_free, t_hi, t_lo, n_steps, seq_q, seq_k,
                          qk_scale, sm_scale, runtime_zero, s_layout, dq_layout, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES,
                          True, IS_CAUSAL)

    mbarrier.invalidate(kv_bars.index(0))
    mbarrier.invalidate(kv_bars.index(1))
    for s in gl.static_range(STAGES):
        mbarrier.invalidate(q_bars.index(s))
        mbarrier.invalidate(do_bars.index(s))

    store_dk_dv(DK, DV, dk, dv, bh, n0, seq_k, BLOCK_N, HEAD_DIM)


def flash_backward_gluon(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                         lse: torch.Tensor, grad_out: torch.Tensor, is_causal: bool, block_m: int, block_n: int,
                         stages: int, num_warps: int):
    """dQ, dK, dV for contiguous, 16-byte aligned (..., seq, d) tensors (q's leading dims flattened into
    batch*heads); `lse`: the forward's natural-log L. Returns the three gradients and the compiled
    main kernel's handle."""
    from cs336sys.attention.flash_triton_backward import backward_delta_kernel

    *lead, seq_q, d = q.shape
    seq_k = k.shape[-2]
    bh = math.prod(lead)
    element = {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16}[q.dtype]

    def descriptor(t: torch.Tensor, rows: int, block_rows: int):
        layout = gl.NVMMASharedLayout.get_default_for([block_rows, d], element)
        return TensorDescriptor(t.view(-1, d), [bh * rows, d], [d, 1], [block_rows, d], layout)

    delta = torch.empty_like(lse)
    backward_delta_kernel[(math.ceil(seq_q / 64), bh)](out, grad_out, delta, seq_q, HEAD_DIM=d, BLOCK_M=64)
    dq_acc = torch.zeros((bh * seq_q, d), dtype=torch.float32, device=q.device)
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    sm_scale = 1.0 / math.sqrt(d)
    handle = flash_backward_gluon_kernel[(bh, math.ceil(seq_k / block_n))](
        descriptor(q, seq_q, block_m), descriptor(k, seq_k, block_n), descriptor(v, seq_k, block_n),
        descriptor(grad_out, seq_q, block_m), dk, dv, dq_acc, lse, delta, seq_q, seq_k, sm_scale * LOG2E, sm_scale, 0,
        HEAD_DIM=d, BLOCK_M=block_m, BLOCK_N=block_n, STAGES=stages, IS_CAUSAL=is_causal, num_warps=num_warps)
    return dq_acc.view(q.shape).to(q.dtype), dk, dv, handle
