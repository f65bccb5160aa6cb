"""Default Gluon forward, warp-specialised (FlashAttention-3's layout of a CTA, on Hopper).

Three partitions of one CTA, which owns 128 query rows of one batch*head:
- a producer warp with few registers issues every TMA load: the two 64-row halves of Q, then the
  key/value tiles into a ring of STAGES slots, waiting on a slot's "empty" mbarrier before refilling it;
- two consumer warpgroups, each owning 64 query rows, with most of the registers: each runs the
  overlapped schedule of `flash_gluon_forward` (S_j issued before P_{j-1} V_{j-1}, the softmax of S_j
  under that product) and arrives on the slot's empty barrier once its products have read it.
The warpgroups never wait for each other (no CTA barrier in the loop): the ring is released when both
have arrived, so one warpgroup's softmax can run while the other's products use the tensor cores.
Both consumers visit the same key tiles (the CTA's), so that every slot is released by both; the
first warpgroup's extra causal tile is masked. Each consumer writes its own O and L rows (in Triton
3.6 the default partition cannot return tensors).

Schedule options (constexpr, off by default; `GluonTiles` sets them), none of which changes what is computed:
- P_LATE: the loop carries P in fp32 and casts it just before its PV product (else the bf16 operand is
  carried, and ptxas packs it in the other half order and swaps the halves with a PRMT each pair).
- PIN: each step stores its row sums to a scratch buffer just before the PV product's wait. Without it,
  ptxas (Triton 3.6) schedules that wait straight after the wait for S, so the softmax runs after the PV
  product instead of under it. With the store before it ptxas leaves the wait after the store (so we
  read the SASS), and the row sums are the softmax's last result.
- PINGPONG: the consumers take turns to issue their products (an mbarrier each, `_take_turn`), so that
  one's products run while the other computes its softmax.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait

from cs336sys.attention.flash_gluon_forward import _issue_scores, _load_kv, _softmax_tile


@gluon.jit
def _producer(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bars, k_bars, v_bars, empty_bars,
              bh, m0, seq_q, seq_k, n_tiles, ROWS: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr):
    for c in gl.static_range(2):
        mbarrier.expect(q_bars.index(c), q_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(q_desc, [bh * seq_q + m0 + c * ROWS, 0], q_bars.index(c), q_smem.index(c))
    kv_row0 = bh * seq_k
    for j in range(n_tiles):
        # Tile j reuses the slot of tile j - STAGES: wait until both consumers have released it.
        mbarrier.wait(empty_bars.index(j % STAGES), ((j // STAGES) & 1) ^ 1, pred=j >= STAGES)
        _load_kv(k_desc, v_desc, k_smem, v_smem, k_bars, v_bars, kv_row0, j, n_tiles, BLOCK_N, STAGES)


@gluon.jit
def _carried_p(p, dtype: gl.constexpr, o_layout: gl.constexpr, P_LATE: gl.constexpr):
    """What the loop carries of tile j's P to the next step's PV product: P in fp32 with P_LATE, else
    the product's bf16/fp16 operand."""
    if P_LATE:
        return p
    else:
        return gl.convert_layout(p.to(dtype), gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2))


@gluon.jit
def _pv_operand(p_op, dtype: gl.constexpr, o_layout: gl.constexpr, P_LATE: gl.constexpr):
    """The PV product's A operand from what the loop carried (`_carried_p`)."""
    if P_LATE:
        return gl.convert_layout(p_op.to(dtype), gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2))
    else:
        return p_op


@gluon.jit
def _take_turn(turn_bars, n, TURN: gl.constexpr):
    """Ping-pong (TURN: this consumer's index, 0 or 1; -1: off): before issuing its products of step n,
    consumer 0 waits until consumer 1 has issued those of step n - 1, consumer 1 until consumer 0 has
    issued those of step n. Consumer 0's first wait (parity 1 of a fresh barrier) passes at once."""
    if TURN >= 0:
        mbarrier.wait(turn_bars.index(TURN), (n & 1) ^ (1 - TURN))


@gluon.jit
def _pass_turn(turn_bars, TURN: gl.constexpr):
    """Ping-pong: this consumer's products of the step are issued; the other consumer's turn."""
    if TURN >= 0:
        mbarrier.arrive(turn_bars.index(1 - TURN), count=1)


@gluon.jit
def _consumer_tiles(acc, m_i, l_i, p_op, q_smem, k_smem, v_smem, k_bars, v_bars, empty_bars, turn_bars, pin_smem,
                    rows, j_lo, j_hi, seq_k, qk_scale, s_layout: gl.constexpr, o_layout: gl.constexpr,
                    ROWS: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                    MASK: gl.constexpr, IS_CAUSAL: gl.constexpr, P_LATE: gl.constexpr, TURN: gl.constexpr,
                    PIN: gl.constexpr):
    for j in range(j_lo, j_hi):
        _take_turn(turn_bars, j, TURN)
        s = _issue_scores(q_smem, k_smem, k_bars, j, s_layout, ROWS, BLOCK_N, STAGES)
        prev = (j - 1) % STAGES
        mbarrier.wait(v_bars.index(prev), ((j - 1) // STAGES) & 1)
        acc = warpgroup_mma(_pv_operand(p_op, k_smem.dtype, o_layout, P_LATE), v_smem.index(prev), acc,
                            is_async=True)
        _pass_turn(turn_bars, TURN)
        s = warpgroup_mma_wait(num_outstanding=1, deps=(s,))
        p, alpha, m_i, l_i = _softmax_tile(s, m_i, l_i, rows, j, seq_k, qk_scale, s_layout, BLOCK_N, MASK,
                                           IS_CAUSAL)
        p_op = _carried_p(p, k_smem.dtype, o_layout, P_LATE)
        if PIN:  # ptxas leaves the PV wait after this store, so after the softmax (the row sums end it)
            pin_smem.store(l_i)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        mbarrier.arrive(empty_bars.index(prev), count=1)
        acc = acc * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, o_layout)), 1)
    return acc, m_i, l_i, p_op


@gluon.jit
def _consumer(q_smem, k_smem, v_smem, q_bar, k_bars, v_bars, empty_bars, turn_bars, pin_smem, O, LSE, bh, m0,
              seq_q, seq_k, qk_scale, n_tiles, HEAD_DIM: gl.constexpr, ROWS: gl.constexpr, BLOCK_N: gl.constexpr,
              STAGES: gl.constexpr, IS_CAUSAL: gl.constexpr, ROW_OFF: gl.constexpr, P_LATE: gl.constexpr,
              PINGPONG: gl.constexpr, PIN: gl.constexpr):
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, HEAD_DIM, 16])
    dtype: gl.constexpr = k_smem.dtype
    r0 = m0 + ROW_OFF
    if IS_CAUSAL:
        n_free = gl.minimum(gl.minimum(r0 + 1, seq_k) // BLOCK_N, n_tiles)
    else:
        n_free = seq_k // BLOCK_N
    rows = r0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, s_layout))
    m_i = gl.full([ROWS], float("-inf"), gl.float32, gl.SliceLayout(1, s_layout))
    l_i = gl.zeros([ROWS], gl.float32, gl.SliceLayout(1, s_layout))
    acc = gl.zeros([ROWS, HEAD_DIM], gl.float32, o_layout)

    TURN: gl.constexpr = ROW_OFF // ROWS if PINGPONG else -1
    mbarrier.wait(q_bar, 0)
    _take_turn(turn_bars, 0, TURN)
    s = _issue_scores(q_smem, k_smem, k_bars, 0, s_layout, ROWS, BLOCK_N, STAGES)
    _pass_turn(turn_bars, TURN)
    s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
    p, alpha, m_i, l_i = _softmax_tile(s, m_i, l_i, rows, 0, seq_k, qk_scale, s_layout, BLOCK_N, True, IS_CAUSAL)
    p_op = _carried_p(p, dtype, o_layout, P_LATE)
    acc, m_i, l_i, p_op = _consumer_tiles(acc, m_i, l_i, p_op, q_smem, k_smem, v_smem, k_bars, v_bars, empty_bars,
                                          turn_bars, pin_smem, rows, 1, n_free, seq_k, qk_scale, s_layout, o_layout,
                                          ROWS, BLOCK_N, STAGES, False, IS_CAUSAL, P_LATE, TURN, PIN)
    acc, m_i, l_i, p_op = _consumer_tiles(acc, m_i, l_i, p_op, q_smem, k_smem, v_smem, k_bars, v_bars, empty_bars,
                                          turn_bars, pin_smem, rows, gl.maximum(n_free, 1), n_tiles, seq_k, qk_scale,
                                          s_layout, o_layout, ROWS, BLOCK_N, STAGES, True, IS_CAUSAL, P_LATE, TURN,
                                          PIN)
    last = n_tiles - 1
    mbarrier.wait(v_bars.index(last % STAGES), (last // STAGES) & 1)
    _take_turn(turn_bars, n_tiles, TURN)
    acc = warpgroup_mma(_pv_operand(p_op, dtype, o_layout, P_LATE), v_smem.index(last % STAGES), acc, is_async=True)
    _pass_turn(turn_bars, TURN)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))

    l_o = gl.convert_layout(l_i, gl.SliceLayout(1, o_layout))
    out = (acc / gl.expand_dims(l_o, 1)).to(dtype)
    lse = (m_i + gl.log2(l_i)) * 0.6931471805599453  # natural-log L, as saved
    o_rows = r0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, o_layout))
    o_cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, o_layout))
    base = bh.to(gl.int64) * seq_q
    o_offs = (base + gl.expand_dims(o_rows, 1)) * HEAD_DIM + gl.expand_dims(o_cols, 0)
    gl.store(O + o_offs, out, mask=gl.expand_dims(o_rows, 1) < seq_q)
    gl.store(LSE + base + rows, lse, mask=rows < seq_q)


@gluon.jit
def flash_forward_gluon_ws_kernel(q_desc, k_desc, v_desc, O, LSE, seq_q, seq_k, qk_scale,
                                  HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                                  IS_CAUSAL: gl.constexpr, PRODUCER_REGS: gl.constexpr,
                                  CONSUMER_REGS: gl.constexpr, TILES_FIRST: gl.constexpr = False,
                                  P_LATE: gl.constexpr = False, PINGPONG: gl.constexpr = False,
                                  PIN: gl.constexpr = False, num_warps: gl.constexpr = 4):
    """Grid (batch*heads, query tiles), or with TILES_FIRST (query tiles, batch*heads): then the CTAs
    that run together share one head's K and V in L2."""
    gl.static_assert(num_warps == 4, "the default partition is one consumer warpgroup")
    ROWS: gl.constexpr = 64
    BLOCK_M: gl.constexpr = 2 * ROWS
    M_AXIS: gl.constexpr = 0 if TILES_FIRST else 1
    bh = gl.program_id(1 - M_AXIS)
    pid_m = gl.program_id(M_AXIS)
    if IS_CAUSAL:  # the last query tiles visit the most keys: start them first
        pid_m = gl.num_programs(M_AXIS) - 1 - pid_m
    m0 = pid_m * BLOCK_M
    dtype: gl.constexpr = q_desc.dtype

    q_smem = gl.allocate_shared_memory(dtype, [2, ROWS, HEAD_DIM], q_desc.layout)
    k_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], v_desc.layout)
    q_bars = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    k_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for c in gl.static_range(2):
        mbarrier.init(q_bars.index(c), count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_bars.index(i), count=1)
        mbarrier.init(v_bars.index(i), count=1)
        mbarrier.init(empty_bars.index(i), count=2)  # one arrive per consumer warpgroup
    if PINGPONG:  # turn_bars.index(c): consumer c may issue (one arrive by the other consumer)
        turn_bars = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        for c in gl.static_range(2):
            mbarrier.init(turn_bars.index(c), count=1)
    else:
        turn_bars = empty_bars  # not used
    if PIN:  # scratch for each consumer's row sums, written and never read (see `_consumer_tiles`)
        pin_layout: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[0])
        pin0 = gl.allocate_shared_memory(gl.float32, [ROWS], pin_layout)
        pin1 = gl.allocate_shared_memory(gl.float32, [ROWS], pin_layout)
    else:
        pin0 = empty_bars  # not used
        pin1 = empty_bars

    if IS_CAUSAL:
        hi = gl.minimum(m0 + BLOCK_M, seq_k)
    else:
        hi = seq_k
    n_tiles = (hi + BLOCK_N - 1) // BLOCK_N

    gl.warp_specialize([
        (_consumer, (q_smem.index(0), k_smem, v_smem, q_bars.index(0), k_bars, v_bars, empty_bars, turn_bars,
                     pin0, O, LSE, bh, m0, seq_q, seq_k, qk_scale, n_tiles, HEAD_DIM, ROWS, BLOCK_N, STAGES,
                     IS_CAUSAL, 0, P_LATE, PINGPONG, PIN)),
        (_producer, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bars, k_bars, v_bars, empty_bars, bh, m0,
                     seq_q, seq_k, n_tiles, ROWS, BLOCK_N, STAGES)),
        (_consumer, (q_smem.index(1), k_smem, v_smem, q_bars.index(1), k_bars, v_bars, empty_bars, turn_bars,
                     pin1, O, LSE, bh, m0, seq_q, seq_k, qk_scale, n_tiles, HEAD_DIM, ROWS, BLOCK_N, STAGES,
                     IS_CAUSAL, ROWS, P_LATE, PINGPONG, PIN)),
    ], [1, 4], [PRODUCER_REGS, CONSUMER_REGS])
