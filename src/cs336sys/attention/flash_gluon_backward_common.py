"""Part of the Gluon backwards: what the default one and the options share.

The warp-specialised kernel's tile sizes, the TMA reduce-add and the dQ workspace's two orders, the
query tiles a key tile visits, a tile's L and D, P from S, and the dK/dV stores.

Triton 3.6's Gluon has no Python wrapper for the TMA reduction (`cp.reduce.async.bulk.tensor`) that its
builder offers (`GluonOpBuilder.create_async_tma_reduce`), so `tma_reduce_add` calls the builder.

The fp32 dQ workspace is either dQ itself, row-major (batch*heads*seq_q, d), which the TMA reads from a
128-byte-swizzled tile, or, with `dq_fragments`, the same bytes in tiles of 64 rows x `cols` columns,
each tile in the order of the warpgroup MMA's accumulator registers (FlashAttention-3 lays its dQ
accumulator out the same way). Storing the accumulator into the swizzled tile takes 8-byte stores, which
Nsight Compute found conflicting (545 M bank conflicts in the 2026 backward; by our reading of the
addresses rows r and r ^ 1 meet in the same banks); in register order every warp stores 512 contiguous
bytes at a time, 16 per thread (7.6 M conflicts left: notes/flash_attention.md, "dQ in register order").
`dq_from_fragments_kernel` puts the tiles back in dQ's order (and its dtype).
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared
from triton.language.core import builtin

KEYS = gl.constexpr(64)  # keys per consumer warpgroup; a CTA owns two such halves
ROWS = gl.constexpr(64)  # query rows per step: one warpgroup MMA high


@builtin
def tma_reduce_add(tensor_desc, coord, src, _semantic=None):
    """Add the shared-memory tile `src` into the tensor of `tensor_desc` at `coord` (TMA reduce-add,
    asynchronous: `tma.store_wait` before `src` is written again)."""
    from triton._C.libtriton import ir

    coord = _semantic._convert_to_ir_values(coord, require_i64=False)
    _semantic.builder.create_async_tma_reduce(ir.DESCRIPTOR_REDUCE_KIND.ADD, tensor_desc.handle, coord, src.handle)


@gluon.constexpr_function
def dq_fragment_layout(cols):
    """The shared layout of a 64 x `cols` fp32 tile in register order: offset bits (low to high) are
    register bits 0-1, lane bits 0-4, warp bits 0-1, then the remaining register bits, as a warpgroup
    MMA's accumulator places them (register bit 0: column 1, bit 1: row 8, bits 2...: columns 8, 16, ...;
    lane bits: columns 2, 4, rows 1, 2, 4; warp bits: rows 16, 32). A [row, column] basis per offset bit."""
    wide = [[0, 8 << k] for k in range((cols // 8).bit_length() - 1)]
    return gl.SharedLinearLayout([[0, 1], [8, 0], [0, 2], [0, 4], [1, 0], [2, 0], [4, 0], [16, 0], [32, 0]] + wide)


@gluon.jit
def add_dq(dq_desc, dq_w, dq, row, col, HEAD_DIM: gl.constexpr):
    """Add a warpgroup's dQ tile (dQ rows [row, row + 64) and columns [col, col + cols) of the flattened
    (batch*heads*seq_q, HEAD_DIM) dQ) to the workspace: store it to `dq_w`, then TMA reduce-add. In
    fragment order (a workspace descriptor without swizzle: (rows * HEAD_DIM / 64, 64) in blocks of
    cols x 64) the tile's block starts at float row * HEAD_DIM + col * 64, where `row` is a multiple
    of 64."""
    if dq_desc.layout.swizzle_byte_width == 0:
        dq_w._reinterpret(gl.float32, dq.type.shape, dq_fragment_layout(dq.type.shape[1])).store(dq)
        fence_async_shared()
        gl.thread_barrier()
        tma_reduce_add(dq_desc, [row * (HEAD_DIM // 64) + col, 0], dq_w)
    else:
        dq_w.store(dq)
        fence_async_shared()
        gl.thread_barrier()
        tma_reduce_add(dq_desc, [row, col], dq_w)


@triton.jit
def dq_from_fragments_kernel(WS, DQ, HEAD_DIM: tl.constexpr, COLS: tl.constexpr):
    """dQ[rows of tile 64 * program 0, columns of block program 1] from the fragment-ordered workspace
    (`dq_fragment_layout`), converted to DQ's dtype; both (rows, HEAD_DIM), rows a multiple of 64."""
    r0 = tl.program_id(0).to(tl.int64) * 64
    c0 = tl.program_id(1) * COLS
    rows = tl.arange(0, 64)[:, None]
    cols = tl.arange(0, COLS)[None, :]
    offset = ((cols & 1) | (((rows >> 3) & 1) << 1) | (((cols >> 1) & 3) << 2) | ((rows & 7) << 4)
              | ((rows >> 4) << 7) | ((cols >> 3) << 9))
    dq = tl.load(WS + r0 * HEAD_DIM + c0 * 64 + offset)
    tl.store(DQ + (r0 + rows) * HEAD_DIM + c0 + cols, dq.to(DQ.dtype.element_ty))


@gluon.jit
def query_tile_range(n0, seq_q, seq_k, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, IS_CAUSAL: gl.constexpr):
    """The query tiles (BLOCK_M rows) that see the key tile [n0, n0 + BLOCK_N): [t_lo, t_hi), of which
    [t_lo, t_diag) cross the causal diagonal and [t_free, t_hi) are ragged (the last query tile; every
    tile when the key tile is ragged): those are masked, [t_diag, t_free) not."""
    t_hi = (seq_q + BLOCK_M - 1) // BLOCK_M
    if IS_CAUSAL:
        t_lo = gl.minimum(n0 // BLOCK_M, t_hi)
        t_diag = gl.minimum(t_lo + BLOCK_N // BLOCK_M, t_hi)
    else:
        t_lo = 0
        t_diag = 0
    whole_keys = (n0 + BLOCK_N <= seq_k).to(gl.int32)  # 0: a ragged key tile, every step masked
    t_free = gl.maximum((seq_q // BLOCK_M) * whole_keys, t_diag)
    return t_lo, t_diag, t_free, t_hi


@gluon.jit
def row_statistics(LSE, DELTA, q_row0, rows, seq_q, MASK: gl.constexpr):
    """A query tile's base-2 L (L * log2 e) and D, rows past seq_q read as 0 where MASK."""
    if MASK:
        lse2 = gl.load(LSE + q_row0 + rows, mask=rows < seq_q, other=0.0) * 1.4426950408889634
        delta = gl.load(DELTA + q_row0 + rows, mask=rows < seq_q, other=0.0)
    else:
        lse2 = gl.load(LSE + q_row0 + rows) * 1.4426950408889634
        delta = gl.load(DELTA + q_row0 + rows)
    return lse2, delta


@gluon.jit
def staged_rows(stats_smem, slot, layout: gl.constexpr):
    """A query tile's L or D from ring slot `slot` of a shared buffer ([STAGES, 1, rows]) the producer
    fills by TMA (rows past seq_q hold TMA's zeros)."""
    flat: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[0])
    return stats_smem.index(slot)._reinterpret(gl.float32, [stats_smem.type.shape[2]], flat).load(layout)


@gluon.jit
def staged_lse2(lse_smem, slot, layout: gl.constexpr):
    """A query tile's base-2 L (L * log2 e, as `row_statistics` gives it) from ring slot `slot`."""
    return staged_rows(lse_smem, slot, layout) * 1.4426950408889634


@gluon.jit
def probabilities(s, lse2, rows, keys, seq_q, seq_k, qk_scale, MASK: gl.constexpr, IS_CAUSAL: gl.constexpr):
    """P = exp2(S * scale * log2 e - L * log2 e), set to 0 where MASK says a query row is past seq_q, a key
    past seq_k or (causal) the key after the query."""
    p = gl.exp2(s * qk_scale - gl.expand_dims(lse2, 1))
    if MASK:
        keep = (gl.expand_dims(rows, 1) < seq_q) & (gl.expand_dims(keys, 0) < seq_k)
        if IS_CAUSAL:
            keep = keep & (gl.expand_dims(rows, 1) >= gl.expand_dims(keys, 0))
        p = gl.where(keep, p, 0.0)
    return p


@gluon.jit
def store_dk_dv(DK, DV, dk, dv, bh, k0, seq_k, ROWS: gl.constexpr, HEAD_DIM: gl.constexpr):
    """dK (the softmax scale already in dS) and dV of keys [k0, k0 + ROWS) of head `bh`, in dK's layout,
    masked to the head's keys; zeros where no query saw them."""
    layout: gl.constexpr = dk.type.layout
    rows = k0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, layout))
    cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, layout))
    offs = (bh.to(gl.int64) * seq_k + gl.expand_dims(rows, 1)) * HEAD_DIM + gl.expand_dims(cols, 0)
    in_head = gl.expand_dims(rows, 1) < seq_k
    gl.store(DK + offs, dk.to(DK.dtype.element_ty), mask=in_head)
    gl.store(DV + offs, dv.to(DV.dtype.element_ty), mask=in_head)
