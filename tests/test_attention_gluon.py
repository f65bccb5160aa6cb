"""The Gluon FlashAttention forward (Hopper): selection and refusal on any machine, float64 checks on a GPU.

On the CPU (CI's Triton may differ from the GPU hosts' 3.6) the modules must import and every input the
kernels cannot take must be refused with a message saying why. On a Hopper GPU: O and L of the forward,
and the gradients through `FlashAttentionGluon` (whose backward is the `tl` one), against float64.
"""

from __future__ import annotations

import os

import pytest
import torch
from conftest import reference_attention, rel_err

from cs336sys.attention import flash_gluon
from cs336sys.attention.flash_gluon import (
    FlashAttentionGluon,
    GluonUnsupported,
    capability_refusal,
    flash_attention_gluon_forward,
    gluon_import_error,
    gluon_refusal,
)


def test_kernel_module_imports():
    """The kernels are only decorated at import (compiled at the first launch), so this Triton suffices."""
    if gluon_import_error() is not None:
        pytest.skip(f"no Gluon here: {gluon_import_error()}")
    from cs336sys.attention import flash_gluon_forward

    assert callable(flash_gluon_forward.flash_forward_gluon_kernel)


def cpu_qkv(d=64, dtype=torch.bfloat16, lead=(2,), seq=16):
    return tuple(torch.randn(*lead, seq, d, dtype=dtype) for _ in range(3))


@pytest.mark.parametrize("dtype,d,needle", [
    (torch.float32, 64, "bfloat16 or float16"),
    (torch.bfloat16, 32, "head dimension"),
    (torch.float16, 96, "head dimension"),
    (torch.bfloat16, 64, "CUDA"),
    (torch.float16, 128, "CUDA"),
])
def test_refusals_say_why(dtype, d, needle):
    q, k, v = cpu_qkv(d, dtype)
    assert needle in gluon_refusal(q, k, v, True)
    with pytest.raises(GluonUnsupported, match=needle):
        flash_attention_gluon_forward(q, k, v, True)
    with pytest.raises(GluonUnsupported, match=needle):
        FlashAttentionGluon.apply(q, k, v, False)


def test_malformed_inputs_fail_as_for_every_implementation():
    q, k, v = cpu_qkv()
    with pytest.raises(ValueError, match="same shape"):
        gluon_refusal(q, k[:, :8], v, True)
    with pytest.raises(TypeError, match="is_causal"):
        gluon_refusal(q, k, v, 1)


@pytest.mark.parametrize("capability,ok", [((9, 0), True), ((8, 0), False), ((10, 0), False), ((12, 0), False)])
def test_only_hopper_is_selected(capability, ok):
    reason = capability_refusal(capability, "some GPU")
    assert (reason is None) == ok
    if not ok:
        assert "compute capability 9.0" in reason and f"{capability[0]}.{capability[1]}" in reason


def test_forward_tiles_cover_the_head_dims():
    assert set(flash_gluon.FORWARD_TILES) == set(flash_gluon.GLUON_HEAD_DIMS)
    for tiles in flash_gluon.FORWARD_TILES.values():
        assert tiles.num_warps % 4 == 0 and tiles.block_m % (16 * tiles.num_warps) == 0  # 16 rows a warp
        assert str(tiles).startswith(f"{tiles.block_m}x{tiles.block_n}/")


def hopper() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


def on_hopper(test):
    """GPU tests: marked `gpu`, skipped (saying they need a CUDA GPU) off a compiled Hopper."""
    for mark in (
        pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1", reason="needs a CUDA GPU: TRITON_INTERPRET=1"),
        pytest.mark.skipif(torch.cuda.is_available() and not hopper(), reason="needs a CUDA GPU of the Hopper kind"),
        pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (none visible)"),
        pytest.mark.gpu,
    ):
        test = mark(test)
    return test


TOLERANCE = {torch.bfloat16: 2e-2, torch.float16: 5e-3}
SHAPES = [  # (leading dims, seq_q, seq_k, d, causal)
    ((2,), 512, 512, 64, True),  # (batch, seq, d)
    ((1, 3), 1000, 1000, 128, True),  # ragged: not a multiple of any tile
    ((2, 2), 1000, 1000, 64, False),
    ((3,), 300, 700, 128, False),  # different query and key lengths
    ((1, 2), 700, 300, 64, True),
    ((2, 1), 257, 900, 128, True),
]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("lead,seq_q,seq_k,d,causal", SHAPES)
@on_hopper
def test_gluon_matches_float64(lead, seq_q, seq_k, d, causal, dtype, fresh_seed):
    make = lambda n: torch.randn(*lead, n, d, device="cuda", dtype=dtype, requires_grad=True)
    q, k, v = make(seq_q), make(seq_k), make(seq_k)
    out = FlashAttentionGluon.apply(q, k, v, causal)
    lse = next(t for t in out.grad_fn.saved_tensors if t.shape == q.shape[:-1])
    grad_out = torch.randn_like(out)
    out.backward(grad_out)
    ref_out, ref_lse, ref_dq, ref_dk, ref_dv = reference_attention(q, k, v, grad_out, causal)
    assert out.dtype == dtype and out.shape == q.shape and torch.isfinite(out).all()
    errors = {"O": rel_err(out, ref_out), "L": rel_err(lse, ref_lse), "dQ": rel_err(q.grad, ref_dq),
              "dK": rel_err(k.grad, ref_dk), "dV": rel_err(v.grad, ref_dv)}
    assert all(e < TOLERANCE[dtype] for e in errors.values()), errors


@on_hopper
def test_gluon_writes_every_output(fresh_seed):
    """A ragged causal call must overwrite every element of O and L, wherever the allocator puts them:
    memory just freed is filled with NaN first, so that an unwritten element is caught."""
    q, k, v = (torch.randn(2, 3, 333, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    poison = torch.full((2 * 3 * 333 * 64 * 4,), float("nan"), device="cuda")
    del poison  # the caching allocator hands these bytes to the outputs below
    out, lse = flash_attention_gluon_forward(q, k, v, True)
    assert torch.isfinite(out).all() and torch.isfinite(lse).all()


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("lead,seq_q,seq_k,causal", [((1, 3), 1000, 1000, True), ((2,), 300, 700, False),
                                                      ((1, 2), 700, 300, True)])
@on_hopper
def test_warp_specialised_forward_matches_float64(lead, seq_q, seq_k, causal, d, fresh_seed):
    tiles = flash_gluon.GluonTiles(128, 128, 2, 4, True, consumer_regs=240)
    q, k, v = (torch.randn(*lead, n, d, device="cuda", dtype=torch.bfloat16) for n in (seq_q, seq_k, seq_k))
    out, lse = flash_attention_gluon_forward(q, k, v, causal, tiles)
    ref_out, ref_lse, *_ = reference_attention(q, k, v, torch.zeros_like(q), causal)
    assert rel_err(out, ref_out) < 2e-2 and rel_err(lse, ref_lse) < 2e-2
