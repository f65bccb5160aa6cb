"""The Gluon backward's dQ workspace in register order (`flash_gluon_backward_common`): the layout the
consumers store in (`dq_fragment_layout`) and the kernel that reads it back (`dq_from_fragments_kernel`)
agree, for every tile width the backward uses.

The kernel is a `tl` one, so it runs where Triton kernels run: in a TRITON_INTERPRET=1 subprocess
(float32, on the CPU) and on a GPU. That the layout is the accumulators' register order is checked where
it matters, on a Hopper GPU: the backward variants with `dq_fragments` against float64
(test_attention_gluon.py).
"""

from __future__ import annotations

import os

import pytest
import torch
from conftest import rerun_under_the_interpreter

from cs336sys.attention.flash_gluon import gluon_import_error

pytestmark = pytest.mark.skipif(gluon_import_error() is not None, reason=f"no Gluon here: {gluon_import_error()}")

IN_INTERPRETER = os.environ.get("TRITON_INTERPRET") == "1"
ON_GPU = torch.cuda.is_available() and not IN_INTERPRETER
kernels_run = pytest.mark.skipif(not (IN_INTERPRETER or ON_GPU), reason="runs where the kernels run: in the "
                                 "TRITON_INTERPRET=1 subprocess of test_kernels_in_an_interpreter_process, or on "
                                 "a CUDA GPU")


def test_kernels_in_an_interpreter_process():
    if IN_INTERPRETER:
        pytest.skip("this process already interprets; the tests below run here")
    rerun_under_the_interpreter(__file__, "not in_an_interpreter_process and not bases", timeout_s=600)


def tile_coordinates(cols: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The [row, column] of each offset of a 64 x `cols` tile in fragment order: the sum (XOR) of the
    layout's bases of the offset's set bits."""
    from cs336sys.attention.flash_gluon_backward_common import dq_fragment_layout

    offsets = torch.arange(64 * cols)
    rows, columns = torch.zeros_like(offsets), torch.zeros_like(offsets)
    for bit, (row, column) in enumerate(dq_fragment_layout.fn(cols).offset_bases):
        on = (offsets >> bit) & 1
        rows ^= on * row
        columns ^= on * column
    return rows, columns


def in_fragment_order(dq: torch.Tensor, cols: int) -> torch.Tensor:
    """`dq` (rows, d), rows a multiple of 64, as the workspace holds it: tile by tile (64 rows x `cols`
    columns, row-major over the tiles), each in fragment order."""
    rows, columns = tile_coordinates(cols)
    n, d = dq.shape
    tiles = dq.view(n // 64, 64, d // cols, cols).permute(0, 2, 1, 3)  # (row tile, column block, 64, cols)
    return tiles[:, :, rows, columns].reshape(-1).contiguous()


@pytest.mark.parametrize("cols", [32, 64, 128])
def test_the_bases_place_each_element_of_a_tile_once(cols):
    rows, columns = tile_coordinates(cols)
    assert ((rows < 64) & (columns < cols)).all()
    assert torch.equal(torch.sort(rows * cols + columns).values, torch.arange(64 * cols))
    # 16 contiguous bytes a thread (registers 0-3: columns c, c + 1 of rows r, r + 8), 512 a warp
    assert rows[:4].tolist() == [0, 0, 8, 8] and columns[:4].tolist() == [0, 1, 0, 1]
    assert set(rows[:128].tolist()) == set(range(16))


@kernels_run
@pytest.mark.gpu
@pytest.mark.parametrize("tiles,d,cols", [(2, 64, 32), (3, 64, 64), (2, 128, 64), (1, 128, 128)])
def test_dq_comes_back_in_order(tiles, d, cols, fresh_seed):
    """dQ written in fragment order comes back as it was, every column block (float32 in, float32 out:
    the interpreter's bfloat16 is not the GPU's)."""
    from cs336sys.attention.flash_gluon_backward_common import dq_from_fragments_kernel

    device = "cuda" if ON_GPU else "cpu"
    dq = torch.randn(tiles * 64, d, device=device)
    workspace = in_fragment_order(dq.cpu(), cols).to(device)
    out = torch.full_like(dq, float("nan"))
    dq_from_fragments_kernel[(tiles, d // cols)](workspace, out, HEAD_DIM=d, COLS=cols)
    assert torch.equal(out, dq)
