"""What the Gluon backward kernels share: the warp-specialised kernel's tile sizes, the TMA reduce-add,
the query tiles a key tile visits, a tile's L and D, P from S, and the dK/dV stores.

Triton 3.6's Gluon has no Python wrapper for the TMA reduction (`cp.reduce.async.bulk.tensor`) that its
builder offers (`GluonOpBuilder.create_async_tma_reduce`), so `tma_reduce_add` calls the builder.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
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
