"""What the warp-specialised Gluon backward's modules share: its tile sizes and the TMA reduce-add.

Triton 3.6's Gluon has no Python wrapper for the TMA reduction (`cp.reduce.async.bulk.tensor`) that its
builder offers (`GluonOpBuilder.create_async_tma_reduce`), so `tma_reduce_add` calls the builder.
"""

from __future__ import annotations

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
