"""Part of the default Gluon forward (its tile loads, scores, softmax step) and the single-partition kernel that lost.

`flash_gluon_forward_ws` composes `_load_kv`, `_issue_scores` and `_softmax_tile` from here. The kernel
itself (`flash_forward_gluon_kernel`) runs only for `GluonTiles` without consumer_regs, which no tile
table, test or result uses since the warp-specialised forward won (notes/flash_attention.md). It stays
while `flash_gluon.flash_attention_gluon_forward` names it: taking it out changes the code hash of every
experiment that reaches the Gluon kernels, so it leaves with their next re-run.

One program per (batch*head, query tile), grid axis 0 the batch*heads so that every head's longest
causal tile starts first. Q is loaded once by TMA into shared memory; K and V tiles stream through a
ring of STAGES shared-memory slots, each slot with its own K and V mbarrier, so QK^T of a tile can
start before its V has landed. S = QK^T and O += PV run as asynchronous warpgroup MMAs (A = Q from
shared memory for S, A = P from registers for PV); the online softmax is in base 2 (log2(e) folded
into the score scale) with fp32 statistics and accumulator, as in `flash_triton_forward`.

Causal masking is top-left aligned (query i sees keys j <= i). The key tiles a query tile visits are
consecutive from 0, so the ring position of a tile is its key-tile index: unmasked tiles first, then
the few that cross the diagonal or the end of the keys, where scores are masked to -inf.

Two loop schedules (constexpr OVERLAP):
- False: S_j, wait, softmax_j, O += P_j V_j, wait; the tensor cores idle during the softmax.
- True (FlashAttention-3's intra-warpgroup overlap): S_j is issued, then P_{j-1} V_{j-1}; the
  softmax of S_j runs while the PV product is still on the tensor cores.

TMA reads of K/V use a 2-D view (batch*heads*seq_k, d): rows past a head's end belong to the next head
(or are zero-filled past the tensor) and are masked out by the key mask. O and L are written with
masked stores, so a ragged query tail never touches the next head. L is the natural-log logsumexp, as
`flash_triton_forward` returns it, so that module's backward consumes it unchanged.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait


@gluon.jit
def _load_kv(k_desc, v_desc, k_smem, v_smem, k_bars, v_bars, kv_row0, j, n_tiles,
             BLOCK_N: gl.constexpr, STAGES: gl.constexpr):
    """Start the TMA loads of key/value tile j into ring slot j % STAGES (nothing if j >= n_tiles)."""
    slot = j % STAGES
    live = j < n_tiles
    row = kv_row0 + j * BLOCK_N
    mbarrier.expect(k_bars.index(slot), k_desc.block_type.nbytes, pred=live)
    tma.async_copy_global_to_shared(k_desc, [row, 0], k_bars.index(slot), k_smem.index(slot), pred=live)
    mbarrier.expect(v_bars.index(slot), v_desc.block_type.nbytes, pred=live)
    tma.async_copy_global_to_shared(v_desc, [row, 0], v_bars.index(slot), v_smem.index(slot), pred=live)


@gluon.jit
def _issue_scores(q_smem, k_smem, k_bars, j, s_layout: gl.constexpr,
                  BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr):
    """Wait for K tile j, then start S = Q K^T asynchronously (an accumulator token)."""
    slot = j % STAGES
    mbarrier.wait(k_bars.index(slot), (j // STAGES) & 1)
    zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)
    return warpgroup_mma(q_smem, k_smem.index(slot).permute((1, 0)), zero, use_acc=False, is_async=True)


@gluon.jit
def _softmax_tile(s, m_i, l_i, rows, j, seq_k, qk_scale, s_layout: gl.constexpr,
                  BLOCK_N: gl.constexpr, MASK: gl.constexpr, IS_CAUSAL: gl.constexpr):
    """Fold score tile j into the base-2 running max and sum; P (fp32) and the rescale factor."""
    if MASK:
        cols = j * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
        keep = gl.expand_dims(cols, 0) < seq_k
        if IS_CAUSAL:
            keep = keep & (gl.expand_dims(rows, 1) >= gl.expand_dims(cols, 0))
        s = gl.where(keep, s, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(s, axis=1) * qk_scale)
    p = gl.exp2(s * qk_scale - gl.expand_dims(m_new, 1))
    alpha = gl.exp2(m_i - m_new)
    l_i = l_i * alpha + gl.sum(p, axis=1)
    return p, alpha, m_new, l_i


@gluon.jit
def _release_slot(k_desc, v_desc, k_smem, v_smem, k_bars, v_bars, kv_row0, j, n_tiles,
                  BLOCK_N: gl.constexpr, STAGES: gl.constexpr):
    """Tile j's slot is read by every warpgroup's MMAs (each waited on): refill it with tile j+STAGES.
    The CTA barrier keeps one warpgroup's TMA from overwriting a slot the other is still reading."""
    gl.thread_barrier()
    _load_kv(k_desc, v_desc, k_smem, v_smem, k_bars, v_bars, kv_row0, j + STAGES, n_tiles, BLOCK_N, STAGES)


@gluon.jit
def _tiles_serial(acc, m_i, l_i, q_smem, k_smem, v_smem, k_bars, v_bars, k_desc, v_desc, kv_row0, rows,
                  j_lo, j_hi, n_tiles, seq_k, qk_scale, s_layout: gl.constexpr, o_layout: gl.constexpr,
                  BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                  MASK: gl.constexpr, IS_CAUSAL: gl.constexpr):
    """Key tiles [j_lo, j_hi) one after the other: S, softmax, PV, each waited on."""
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    for j in range(j_lo, j_hi):
        s = _issue_scores(q_smem, k_smem, k_bars, j, s_layout, BLOCK_M, BLOCK_N, STAGES)
        s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
        p, alpha, m_i, l_i = _softmax_tile(s, m_i, l_i, rows, j, seq_k, qk_scale, s_layout, BLOCK_N, MASK,
                                           IS_CAUSAL)
        acc = acc * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, o_layout)), 1)
        p_op = gl.convert_layout(p.to(k_smem.dtype), p_layout)
        slot = j % STAGES
        mbarrier.wait(v_bars.index(slot), (j // STAGES) & 1)
        acc = warpgroup_mma(p_op, v_smem.index(slot), acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        _release_slot(k_desc, v_desc, k_smem, v_smem, k_bars, v_bars, kv_row0, j, n_tiles, BLOCK_N, STAGES)
    return acc, m_i, l_i


@gluon.jit
def _tiles_overlapped(acc, m_i, l_i, p_op, q_smem, k_smem, v_smem, k_bars, v_bars, k_desc, v_desc, kv_row0,
                      rows, j_lo, j_hi, n_tiles, seq_k, qk_scale, s_layout: gl.constexpr, o_layout: gl.constexpr,
                      BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                      MASK: gl.constexpr, IS_CAUSAL: gl.constexpr):
    """Key tiles [j_lo, j_hi), j_lo >= 1, with tile j-1's P (p_op) pending: S_j is issued before
    P_{j-1} V_{j-1}, so the softmax of S_j overlaps that product. Returns tile j_hi-1's P, pending."""
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    for j in range(j_lo, j_hi):
        s = _issue_scores(q_smem, k_smem, k_bars, j, s_layout, BLOCK_M, BLOCK_N, STAGES)
        prev = (j - 1) % STAGES
        mbarrier.wait(v_bars.index(prev), ((j - 1) // STAGES) & 1)
        acc = warpgroup_mma(p_op, v_smem.index(prev), acc, is_async=True)
        s = warpgroup_mma_wait(num_outstanding=1, deps=(s,))
        p, alpha, m_i, l_i = _softmax_tile(s, m_i, l_i, rows, j, seq_k, qk_scale, s_layout, BLOCK_N, MASK,
                                           IS_CAUSAL)
        p_op = gl.convert_layout(p.to(k_smem.dtype), p_layout)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        acc = acc * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, o_layout)), 1)
        _release_slot(k_desc, v_desc, k_smem, v_smem, k_bars, v_bars, kv_row0, j - 1, n_tiles, BLOCK_N, STAGES)
    return acc, m_i, l_i, p_op


@gluon.jit
def flash_forward_gluon_kernel(q_desc, k_desc, v_desc, O, LSE, seq_q, seq_k, qk_scale,
                               HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                               STAGES: gl.constexpr, IS_CAUSAL: gl.constexpr, OVERLAP: gl.constexpr,
                               num_warps: gl.constexpr):
    bh = gl.program_id(0)
    pid_m = gl.program_id(1)
    if IS_CAUSAL:  # the last query tiles visit the most keys: start them first
        pid_m = gl.num_programs(1) - 1 - pid_m
    m0 = pid_m * BLOCK_M
    kv_row0 = bh * seq_k
    dtype: gl.constexpr = q_desc.dtype

    # Warps stacked along the rows: each warpgroup owns BLOCK_M / (num_warps / 4) query rows.
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, HEAD_DIM, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)

    q_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, HEAD_DIM], q_desc.layout)
    k_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], v_desc.layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_bars.index(i), count=1)
        mbarrier.init(v_bars.index(i), count=1)

    # Key tiles to visit: [0, n_free) need no mask, [n_free, n_tiles) cross the diagonal or the end.
    if IS_CAUSAL:
        hi = gl.minimum(m0 + BLOCK_M, seq_k)
        n_free = gl.minimum(m0 + 1, seq_k) // BLOCK_N
    else:
        hi = seq_k
        n_free = seq_k // BLOCK_N
    n_tiles = (hi + BLOCK_N - 1) // BLOCK_N

    mbarrier.expect(q_bar, q_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(q_desc, [bh * seq_q + m0, 0], q_bar, q_smem)
    for i in gl.static_range(STAGES):
        _load_kv(k_desc, v_desc, k_smem, v_smem, k_bars, v_bars, kv_row0, i, n_tiles, BLOCK_N, STAGES)
    mbarrier.wait(q_bar, 0)

    rows = m0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, s_layout))
    m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, gl.SliceLayout(1, s_layout))
    l_i = gl.zeros([BLOCK_M], gl.float32, gl.SliceLayout(1, s_layout))
    acc = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, o_layout)
    if OVERLAP:
        # Tile 0 alone (masked: it may be the diagonal tile), then tiles 1.. one step behind.
        s = _issue_scores(q_smem, k_smem, k_bars, 0, s_layout, BLOCK_M, BLOCK_N, STAGES)
        s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
        p, alpha, m_i, l_i = _softmax_tile(s, m_i, l_i, rows, 0, seq_k, qk_scale, s_layout, BLOCK_N, True,
                                           IS_CAUSAL)
        p_op = gl.convert_layout(p.to(dtype), p_layout)
        acc, m_i, l_i, p_op = _tiles_overlapped(acc, m_i, l_i, p_op, q_smem, k_smem, v_smem, k_bars, v_bars,
                                                k_desc, v_desc, kv_row0, rows, 1, n_free, n_tiles, seq_k,
                                                qk_scale, s_layout, o_layout, BLOCK_M, BLOCK_N, STAGES, False,
                                                IS_CAUSAL)
        acc, m_i, l_i, p_op = _tiles_overlapped(acc, m_i, l_i, p_op, q_smem, k_smem, v_smem, k_bars, v_bars,
                                                k_desc, v_desc, kv_row0, rows, gl.maximum(n_free, 1), n_tiles,
                                                n_tiles, seq_k, qk_scale, s_layout, o_layout, BLOCK_M, BLOCK_N,
                                                STAGES, True, IS_CAUSAL)
        last = n_tiles - 1
        mbarrier.wait(v_bars.index(last % STAGES), (last // STAGES) & 1)
        acc = warpgroup_mma(p_op, v_smem.index(last % STAGES), acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    else:
        acc, m_i, l_i = _tiles_serial(acc, m_i, l_i, q_smem, k_smem, v_smem, k_bars, v_bars, k_desc, v_desc,
                                      kv_row0, rows, 0, n_free, n_tiles, seq_k, qk_scale, s_layout, o_layout,
                                      BLOCK_M, BLOCK_N, STAGES, False, IS_CAUSAL)
        acc, m_i, l_i = _tiles_serial(acc, m_i, l_i, q_smem, k_smem, v_smem, k_bars, v_bars, k_desc, v_desc,
                                      kv_row0, rows, n_free, n_tiles, n_tiles, seq_k, qk_scale, s_layout, o_layout,
                                      BLOCK_M, BLOCK_N, STAGES, True, IS_CAUSAL)

    mbarrier.invalidate(q_bar)
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(k_bars.index(i))
        mbarrier.invalidate(v_bars.index(i))

    # Epilogue: O = acc / l and natural-log L, masked to this head's rows.
    l_o = gl.convert_layout(l_i, gl.SliceLayout(1, o_layout))
    out = (acc / gl.expand_dims(l_o, 1)).to(dtype)
    lse = (m_i + gl.log2(l_i)) * 0.6931471805599453  # natural-log L, as saved
    o_rows = m0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, o_layout))
    o_cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, o_layout))
    base = bh.to(gl.int64) * seq_q
    o_offs = (base + gl.expand_dims(o_rows, 1)) * HEAD_DIM + gl.expand_dims(o_cols, 0)
    gl.store(O + o_offs, out, mask=gl.expand_dims(o_rows, 1) < seq_q)
    gl.store(LSE + base + rows, lse, mask=rows < seq_q)
