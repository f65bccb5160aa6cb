"""The Gluon FlashAttention kernels (Hopper): selection and refusal on any machine, float64 checks on a GPU.

On the CPU (CI's Triton may differ from the GPU hosts' 3.6) the modules must import, every input the
kernels cannot take must be refused with a message saying why, and the backward switch (Gluon or `tl`)
must resolve as documented; with Triton 3.6 installed, the backward kernel is compiled for sm_90. On a
Hopper GPU: O and L of the forward, dQ, dK, dV of the Gluon backward, and the gradients through
`FlashAttentionGluon` with either backward, against float64.
"""

from __future__ import annotations

import json
import os
from dataclasses import replace

import pytest
import torch
from conftest import reference_attention, rel_err

from cs336sys.attention import flash_gluon
from cs336sys.attention.flash_gluon import (
    BACKWARD_ENV,
    FlashAttentionGluon,
    GluonBackwardTiles,
    GluonUnsupported,
    backward_choice,
    capability_refusal,
    flash_attention_gluon_backward,
    flash_attention_gluon_forward,
    gluon_import_error,
    gluon_refusal,
)


def test_kernel_module_imports():
    """The kernels are only decorated at import (compiled at the first launch), so this Triton suffices."""
    if gluon_import_error() is not None:
        pytest.skip(f"no Gluon here: {gluon_import_error()}")
    from cs336sys.attention import flash_gluon_backward, flash_gluon_forward

    assert callable(flash_gluon_forward.flash_forward_gluon_kernel)
    assert callable(flash_gluon_backward.flash_backward_gluon_kernel)


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
    lse = torch.zeros(q.shape[:-1])
    with pytest.raises(GluonUnsupported, match=needle):
        flash_attention_gluon_backward(q, k, v, q, lse, q, True)


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


# the default forward tiles without the schedule options (the default until they were measured)
PLAIN_TILES = {d: replace(t, p_late=False, pingpong=False, pin=False) for d, t in flash_gluon.FORWARD_TILES.items()}


def test_forward_tiles_cover_the_head_dims():
    assert set(flash_gluon.FORWARD_TILES) == set(flash_gluon.GLUON_HEAD_DIMS)
    for tiles in flash_gluon.FORWARD_TILES.values():
        assert tiles.num_warps % 4 == 0 and tiles.block_m % (16 * tiles.num_warps) == 0  # 16 rows a warp
        assert str(tiles).startswith(f"{tiles.block_m}x{tiles.block_n}/")


@pytest.mark.parametrize("extra,kwargs", [({}, {}), ({"p_late": True}, {"P_LATE": True}),
                                          ({"pingpong": True, "pin": True}, {"PINGPONG": True, "PIN": True}),
                                          ({"max_regs": 80}, {"maxnreg": 80})])
def test_forward_options_reach_the_launch_only_when_set(monkeypatch, extra, kwargs):
    # an option left off is not passed, so a launch without options compiles as before they existed
    from cs336sys.attention import flash_gluon_forward_ws

    launches = []

    class Caught:
        def __getitem__(self, grid):
            return lambda *args, **kw: launches.append(kw)

    monkeypatch.setattr(flash_gluon_forward_ws, "flash_forward_gluon_ws_kernel", Caught())
    monkeypatch.setattr(flash_gluon, "check_gluon_inputs", lambda *a: None)  # CPU tensors stand in for CUDA
    q = torch.randn(1, 2, 256, 64, dtype=torch.bfloat16)
    tiles = replace(PLAIN_TILES[64], **extra)
    flash_attention_gluon_forward(q, q, q, True, tiles)
    (kw,) = launches
    assert {k: kw[k] for k in ("P_LATE", "PINGPONG", "PIN", "maxnreg") if k in kw} == kwargs
    for option, label in (("p_late", "/p-late"), ("pingpong", "/pingpong"), ("pin", "/pin"), ("max_regs", "/max80")):
        assert (label in str(tiles)) == (option in extra)


def test_backward_choice(monkeypatch):
    monkeypatch.delenv(BACKWARD_ENV, raising=False)
    assert backward_choice() == "gluon"  # the default: the warp-specialised Gluon backward, the faster one
    assert backward_choice("tl") == "tl"
    monkeypatch.setenv(BACKWARD_ENV, "tl")
    assert backward_choice() == "tl"
    assert backward_choice("gluon") == "gluon"
    monkeypatch.setenv(BACKWARD_ENV, "cudnn")
    with pytest.raises(ValueError, match=BACKWARD_ENV):
        backward_choice()


def test_unknown_backward_fails_before_the_forward():
    q, k, v = cpu_qkv()
    with pytest.raises(ValueError, match="unknown Gluon backward 'fast'"):
        FlashAttentionGluon.apply(q, k, v, True, "fast")


def test_backward_tiles_cover_the_head_dims():
    assert set(flash_gluon.BACKWARD_TILES) == set(flash_gluon.GLUON_HEAD_DIMS)
    for d, variants in flash_gluon.BACKWARD_VARIANTS.items():
        assert variants[0] == flash_gluon.BACKWARD_TILES[d]
        for tiles in variants:
            assert tiles.refusal(d) is None, tiles
            assert str(tiles).startswith(f"bwd q{tiles.block_m}/kv{tiles.block_n}/")


@pytest.mark.parametrize("tiles,needle", [
    (GluonBackwardTiles(64, 128, 2, 6), "whole warpgroups"),
    (GluonBackwardTiles(64, 64, 2, 8), "16 keys per warp"),
    (GluonBackwardTiles(32, 64, 2, 4), "query tiles of 64 rows"),
    (GluonBackwardTiles(128, 128, 2, 8), "query tiles of 64 rows"),
    (GluonBackwardTiles(64, 64, 2, 4, consumer_regs=240), "warp-specialised backward takes q64 or q128, kv128"),
    (GluonBackwardTiles(64, 128, 2, 8, consumer_regs=240), "warp-specialised backward takes q64 or q128, kv128"),
    (GluonBackwardTiles(128, 128, 2, 4, consumer_regs=240), "steps of 128 queries take the swapped consumer"),
    (GluonBackwardTiles(64, 128, 2, 4, consumer_regs=240, shared_ds=False, rotate=1), "share dS"),
    (GluonBackwardTiles(64, 128, 3, 4, consumer_regs=240, rotate=4), "rotate is 0 (off), 1, 2"),
    (GluonBackwardTiles(64, 128, 3, 4, consumer_regs=240, swap_ab=3), "swap_ab is 0 (off), 1 or 2"),
    (GluonBackwardTiles(64, 128, 3, 4, consumer_regs=240, swap_ab=2, rotate=1), "are not rotated"),
    (GluonBackwardTiles(64, 128, 3, 4, consumer_regs=240, swap_ab=1, shared_ds=False), "are not rotated"),
    (GluonBackwardTiles(64, 128, 3, 4, consumer_regs=240, stats_smem=True), "take the rotated or the swapped"),
    (GluonBackwardTiles(64, 128, 3, 4, consumer_regs=240, swap_ab=2, stats_smem=True), "in fragment order"),
    (GluonBackwardTiles(64, 128, 3, 4, consumer_regs=240, rotate=1, stats_smem=True), "in fragment order"),
    (GluonBackwardTiles(64, 128, 2, 4, stats_smem=True), "take the warp-specialised kernel"),
    (GluonBackwardTiles(64, 128, 2, 4, persistent=True), "take the warp-specialised kernel"),
    (GluonBackwardTiles(64, 128, 2, 4, dq_full=True), "take the warp-specialised kernel"),
    (GluonBackwardTiles(64, 128, 3, 4, consumer_regs=240, dq_full=True), "takes the rotated steps"),
    (GluonBackwardTiles(64, 128, 3, 4, consumer_regs=240, rotate=1, dq_fragments=True, stats_smem=True,
                        persistent=True, dq_full=True), "and the plain grid"),
])
def test_bad_backward_tiles_are_refused(tiles, needle):
    assert needle in tiles.refusal(64)


def test_aligned_rows_gives_tma_ready_rows_of_the_same_values():
    """L and D's TMA views need rows at 16-byte aligned addresses: a ragged row length or a view off an
    aligned start is copied (zeros after each row), an aligned tensor is taken as it is."""
    from cs336sys.attention.flash_gluon_backward_ws import _aligned_rows

    aligned = torch.randn(3, 64)
    assert _aligned_rows(aligned) is aligned
    for rows in (torch.randn(3, 257), torch.randn(3 * 64 + 1)[1:].view(3, 64)):
        ready = _aligned_rows(rows)
        assert ready.stride(0) % 4 == 0 and ready.data_ptr() % 16 == 0
        assert torch.equal(ready[:, :rows.shape[1]], rows) and not ready[:, rows.shape[1]:].any()


def _compile_check_tool():
    """tools/gluon_compile_check.py as a module; the test skips unless Triton is the GPU hosts' 3.6 (later
    Gluon renamed the TMA copies): install it beside the project's with `pip install --no-deps --target
    DIR triton==3.6.0` and put DIR first on PYTHONPATH."""
    import importlib.util
    import sys
    from pathlib import Path

    import triton

    if not triton.__version__.startswith("3.6."):
        pytest.skip(f"the Gluon kernels are written for Triton 3.6 (the GPU hosts'); this is {triton.__version__}")
    path = Path(__file__).resolve().parent.parent / "tools" / "gluon_compile_check.py"
    spec = importlib.util.spec_from_file_location("gluon_compile_check", path)
    tool = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = tool
    spec.loader.exec_module(tool)
    return tool


def test_backward_compiles_for_hopper():
    """The backward kernel through Triton's whole sm_90 pipeline (ptxas included) on this machine."""
    tool = _compile_check_tool()
    assert tool.main(["--only", "backward", "--d", "64", "--dtypes", "bf16", "--seqs", "300",
                      "--causal", "1"]) == 0


@pytest.mark.parametrize("pin", [False, True])
def test_pin_keeps_the_forward_softmax_under_the_pv_product(pin, monkeypatch, tmp_path):
    """In the SASS of Triton 3.6's ptxas, without `pin` the forward's PV wait comes before the step's
    exponentials; with it (the default) after them (notes/flash_attention.md, "The forward's PV wait")."""
    tool = _compile_check_tool()
    monkeypatch.setitem(flash_gluon.FORWARD_TILES, 64, replace(flash_gluon.FORWARD_TILES[64], pin=pin))
    assert tool.main(["--only", "forward", "--d", "64", "--dtypes", "bf16", "--seqs", "256", "--causal", "1",
                      "--sass", "--json", str(tmp_path / "report.json")]) == 0
    (launch,) = json.loads((tmp_path / "report.json").read_text())
    assert len(launch["loops"]) == 4  # two consumers, each a loop without masks and one with
    for loop in launch["loops"]:
        events = loop.split(": ")[1].split()
        assert (events.index("MUFUx66") < events.index("wait<=0")) == pin, loop


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


@pytest.mark.parametrize("backward", ["gluon", "tl"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("lead,seq_q,seq_k,d,causal", SHAPES)
@on_hopper
def test_gluon_matches_float64(lead, seq_q, seq_k, d, causal, dtype, backward, fresh_seed):
    make = lambda n: torch.randn(*lead, n, d, device="cuda", dtype=dtype, requires_grad=True)
    q, k, v = make(seq_q), make(seq_k), make(seq_k)
    out = FlashAttentionGluon.apply(q, k, v, causal, backward)
    lse = next(t for t in out.grad_fn.saved_tensors if t.shape == q.shape[:-1])
    grad_out = torch.randn_like(out)
    out.backward(grad_out)
    ref_out, ref_lse, ref_dq, ref_dk, ref_dv = reference_attention(q, k, v, grad_out, causal)
    assert out.dtype == dtype and out.shape == q.shape and torch.isfinite(out).all()
    errors = {"O": rel_err(out, ref_out), "L": rel_err(lse, ref_lse), "dQ": rel_err(q.grad, ref_dq),
              "dK": rel_err(k.grad, ref_dk), "dV": rel_err(v.grad, ref_dv)}
    assert all(e < TOLERANCE[dtype] for e in errors.values()), errors


@pytest.mark.parametrize("backward", ["gluon", "tl"])
@pytest.mark.parametrize("causal", [False, True])
@on_hopper
def test_the_course_attention_checks_hold_for_the_gluon_kernels(causal, backward, fresh_seed):
    """What the course's FlashAttention tests check of the Triton implementation, asked of
    `FlashAttentionGluon`: batch 4, 128 queries and keys, d 64 in the (batch, seq, d) layout; exactly one
    saved tensor shaped (batch, queries), the natural-log L; O, L, then dQ, dK, dV within rtol = atol =
    1e-2 of attention computed directly (scores masked to -1e6, as the course masks). The course feeds
    float32, which the Gluon kernels refuse by name; here the inputs are bf16, and the reference runs
    in float32 on the same values."""
    batch, seq, d = 4, 128, 64
    q, k, v = (torch.randn(batch, seq, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    grad_out = torch.randn(batch, seq, d, device="cuda", dtype=torch.bfloat16)
    out = FlashAttentionGluon.apply(q, k, v, causal, backward)
    saved = [t for t in out.grad_fn.saved_tensors if t.shape == (batch, seq)]
    assert len(saved) == 1

    q32, k32, v32 = (t.detach().float().requires_grad_() for t in (q, k, v))
    scores = q32 @ k32.transpose(-1, -2) / d**0.5
    if causal:
        position = torch.arange(seq, device="cuda")
        scores = torch.where(position[:, None] >= position[None, :], scores, -1e6)
    ref_out = torch.softmax(scores, dim=-1) @ v32
    torch.testing.assert_close(out.float(), ref_out, rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(saved[0], torch.logsumexp(scores, dim=-1), rtol=1e-2, atol=1e-2)
    out.backward(grad_out)
    ref_out.backward(grad_out.float())
    for got, want in zip((q.grad, k.grad, v.grad), (q32.grad, k32.grad, v32.grad), strict=True):
        torch.testing.assert_close(got.float(), want, rtol=1e-2, atol=1e-2)
    with pytest.raises(GluonUnsupported, match="bfloat16 or float16"):
        FlashAttentionGluon.apply(q32, k32, v32, causal, backward)


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


FORWARD_OPTIONS = [{"p_late": True}, {"pingpong": True}, {"pin": True}, {"pin": True, "p_late": True},
                   {"pin": True, "pingpong": True, "p_late": True}]


@pytest.mark.parametrize("options", FORWARD_OPTIONS, ids=lambda o: "+".join(o))
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("lead,seq_q,seq_k,causal", [((1, 3), 1000, 1000, True), ((2,), 300, 700, False)])
@on_hopper
def test_forward_schedule_options_give_the_same_bits(lead, seq_q, seq_k, causal, d, options, fresh_seed):
    # each option moves work in time (P's cast, whose turn it is to issue, where the PV wait falls), not
    # what is computed: the output must be that of the tiles without options to the bit, and a race
    # would show here (pin + p_late is the default)
    q, k, v = (torch.randn(*lead, n, d, device="cuda", dtype=torch.bfloat16) for n in (seq_q, seq_k, seq_k))
    out, lse = flash_attention_gluon_forward(q, k, v, causal, PLAIN_TILES[d])
    got, got_lse = flash_attention_gluon_forward(q, k, v, causal, replace(PLAIN_TILES[d], **options))
    assert torch.equal(got, out) and torch.equal(got_lse, lse)
    ref_out, ref_lse, *_ = reference_attention(q, k, v, torch.zeros_like(q), causal)
    assert rel_err(got, ref_out) < 2e-2 and rel_err(got_lse, ref_lse) < 2e-2


@pytest.mark.parametrize("lead,seq_q,seq_k,causal", [((1, 3), 1000, 1000, True), ((2,), 300, 700, False),
                                                      ((1, 2), 700, 300, True)])
@on_hopper
def test_two_ctas_an_sm_forward_matches_float64(lead, seq_q, seq_k, causal, fresh_seed):
    tiles = flash_gluon.GluonTiles(128, 64, 3, 4, True, consumer_regs=104, tiles_first=True, max_regs=80)
    q, k, v = (torch.randn(*lead, n, 64, device="cuda", dtype=torch.bfloat16) for n in (seq_q, seq_k, seq_k))
    out, lse = flash_attention_gluon_forward(q, k, v, causal, tiles)
    ref_out, ref_lse, *_ = reference_attention(q, k, v, torch.zeros_like(q), causal)
    assert rel_err(out, ref_out) < 2e-2 and rel_err(lse, ref_lse) < 2e-2


BACKWARD_SHAPES = [  # (leading dims, seq_q, seq_k, d, causal): ragged lengths 1, 127, 200, 513
    ((2,), 1, 1, 64, True),
    ((1, 2), 1, 1, 128, False),
    ((1, 2), 127, 127, 128, True),
    ((2,), 200, 200, 64, False),
    ((2, 2), 513, 513, 64, True),
    ((1, 3), 513, 513, 128, False),
    ((3,), 200, 513, 128, True),  # causal, more keys than queries: the last keys get no gradient
    ((1, 2), 513, 127, 64, True),  # causal, more queries than keys
    ((2,), 256, 256, 128, True),  # whole tiles: the unmasked loop only past the diagonal
]


def gluon_backward_errors(lead, seq_q, seq_k, d, causal, dtype, tiles=None) -> dict:
    """Relative errors of dQ, dK, dV from the Gluon backward (given the Gluon forward's O and L) against
    float64, and whether each came out finite."""
    q, k, v = (torch.randn(*lead, n, d, device="cuda", dtype=dtype) for n in (seq_q, seq_k, seq_k))
    grad_out = torch.randn_like(q)
    out, lse = flash_attention_gluon_forward(q, k, v, causal)
    dq, dk, dv = flash_attention_gluon_backward(q, k, v, out, lse, grad_out, causal, tiles)
    assert (dq.shape, dk.shape, dv.shape) == (q.shape, k.shape, v.shape)
    assert dq.dtype == dk.dtype == dv.dtype == dtype
    assert all(torch.isfinite(g).all() for g in (dq, dk, dv))
    _, _, ref_dq, ref_dk, ref_dv = reference_attention(q, k, v, grad_out, causal)

    def err(ours, ref):  # a gradient that is exactly zero (one key: softmax is constant) against dV's size
        return rel_err(ours, ref) if ref.norm() > 0 else (ours.double().norm() / ref_dv.double().norm()).item()

    return {"dQ": err(dq, ref_dq), "dK": err(dk, ref_dk), "dV": rel_err(dv, ref_dv)}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("lead,seq_q,seq_k,d,causal", BACKWARD_SHAPES)
@on_hopper
def test_gluon_backward_matches_float64(lead, seq_q, seq_k, d, causal, dtype, fresh_seed):
    errors = gluon_backward_errors(lead, seq_q, seq_k, d, causal, dtype)
    assert all(e < TOLERANCE[dtype] for e in errors.values()), errors


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("lead,seq_q,seq_k,causal", [((1, 2), 513, 513, True), ((2,), 200, 513, False)])
@on_hopper
def test_every_backward_variant_matches_float64(lead, seq_q, seq_k, causal, d, fresh_seed):
    for tiles in flash_gluon.BACKWARD_VARIANTS[d]:
        errors = gluon_backward_errors(lead, seq_q, seq_k, d, causal, torch.bfloat16, tiles)
        assert all(e < TOLERANCE[torch.bfloat16] for e in errors.values()), (str(tiles), errors)


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("lead,seq_q,seq_k,causal", [((1, 2), 512, 512, True), ((2,), 192, 448, False),
                                                     ((2,), 320, 200, True)])
@on_hopper
def test_dq_in_register_order_matches_float64(lead, seq_q, seq_k, causal, d, fresh_seed):
    """Every warp-specialised variant with its dQ workspace in the accumulators' register order (which
    the launcher takes where seq_q is a multiple of 64, as here)."""
    for tiles in dict.fromkeys(replace(t, dq_fragments=True) for t in flash_gluon.BACKWARD_VARIANTS[d]
                               if t.consumer_regs):
        errors = gluon_backward_errors(lead, seq_q, seq_k, d, causal, torch.bfloat16, tiles)
        assert all(e < TOLERANCE[torch.bfloat16] for e in errors.values()), (str(tiles), errors)


@pytest.mark.parametrize("d,option", [
    (64, {"rotate": 3}), (64, {"stats_smem": True}), (128, {"stats_smem": True}), (64, {"persistent": True}),
    (64, {"stats_smem": True, "persistent": True}), (128, {"stats_smem": True, "persistent": True}),
    (64, {"stats_smem": True, "dq_full": True}), (64, {"rotate": 2, "stats_smem": True, "dq_full": True}),
], ids=["ds_first", "stats_smem", "swapped_stats_smem", "persistent", "stats_smem_persistent",
        "swapped_stats_smem_persistent", "dq_full", "late_dq_full"])
@pytest.mark.parametrize("lead,seq_q,seq_k,causal", [((1, 2), 512, 512, True), ((2,), 320, 200, True),
                                                     ((2,), 192, 448, False), ((3,), 208, 336, True),
                                                     ((3,), 257, 300, True), ((40, 4), 256, 256, True),
                                                     ((2,), 192, 448, True)])
@on_hopper
def test_rotation_variants_give_the_same_dk_and_dv_bits(lead, seq_q, seq_k, causal, d, option, fresh_seed):
    # rotate=3 stores dS before finishing the previous step,
    # stats_smem has the producer load L and D into the ring (where seq_q is a multiple of 64; else, 208
    # and 257 here, the launcher loads them as the plain rotation does; at d 128 beside the default
    # swapped steps); the persistent grid runs each (key tile, head) as the plain grid does, in turn
    # (160 heads: more work items than SMs; 448 keys, causal, against 192 queries: key tiles no query
    # sees); dq_full adds each warpgroup's own keys' share of dQ at full width (dQ late, or not):
    # the same products in the same order per key tile, so dK and dV are the plain rotation's to the
    # bit (dQ is summed across CTAs in no fixed order)
    q, k, v = (torch.randn(*lead, n, d, device="cuda", dtype=torch.bfloat16) for n in (seq_q, seq_k, seq_k))
    grad_out = torch.randn_like(q)
    out, lse = flash_attention_gluon_forward(q, k, v, causal)
    plain = {64: GluonBackwardTiles(64, 128, 4, 4, consumer_regs=240, rotate=1, dq_fragments=True),
             128: GluonBackwardTiles(64, 128, 3, 4, consumer_regs=240, swap_ab=2, dq_fragments=True)}[d]
    dq, dk, dv = flash_attention_gluon_backward(q, k, v, out, lse, grad_out, causal, plain)
    dq_r, dk_r, dv_r = flash_attention_gluon_backward(q, k, v, out, lse, grad_out, causal,
                                                      replace(plain, **option))
    assert torch.equal(dk_r, dk) and torch.equal(dv_r, dv)
    assert rel_err(dq_r, dq) < 1e-2


@on_hopper
def test_gluon_backward_writes_every_gradient(fresh_seed):
    """Key tiles no query sees (causal, more keys than queries) must still get their zeros written:
    memory just freed is filled with NaN first, so that an unwritten element is caught."""
    q = torch.randn(2, 3, 100, 64, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(2, 3, 333, 64, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    out, lse = flash_attention_gluon_forward(q, k, v, True)
    poison = torch.full((4 * 2 * 3 * 333 * 64,), float("nan"), device="cuda")
    del poison
    dq, dk, dv = flash_attention_gluon_backward(q, k, v, out, lse, torch.randn_like(q), True)
    assert all(torch.isfinite(g).all() for g in (dq, dk, dv))
    assert (dk[..., 100:, :] == 0).all() and (dv[..., 100:, :] == 0).all()


def test_the_gluon_leaderboard_point_is_unsupported_off_a_gpu():
    from cs336sys.attention.bench import LeaderboardSettings
    from cs336sys.attention.bench_gluon import run_point
    from cs336sys.jobs import Run, Unsupported

    with pytest.raises(Unsupported, match="Hopper"):
        run_point(LeaderboardSettings(impl="gluon", batch=1, heads=1, seq=64, d=64, device="cpu"), Run(device="cpu"))
    with pytest.raises(ValueError, match="unknown Gluon implementation 'tl'"):
        run_point(LeaderboardSettings(impl="tl", device="cpu"), Run(device="cpu"))


def test_the_section_sets_each_gluon_configuration_against_its_own_cudnn(tmp_path):
    import pandas as pd

    from cs336sys.analysis.attention_leaderboard import gluon

    assert gluon(pd.DataFrame(), tmp_path) is None
    rows = [{"impl": impl, "edition": "2026", "status": "ok", "env.gpu": "NVIDIA H100 80GB HBM3", "fwd_ms": fwd,
             "bwd_ms": bwd, "fwd_bwd_ms": fwd + bwd} for impl, fwd, bwd in
            [("sdpa_cudnn", 10.0, 40.0), ("gluon", 9.0, 60.0), ("gluon_bwd", 9.0, 80.0)]]
    ctx = gluon(pd.DataFrame(rows), tmp_path)
    [edition] = ctx["editions"]
    assert edition["gpu"] == "H100" and edition["ratios"]["gluon"] == {"fwd": 0.9, "bwd": 1.5, "fwd_bwd": 1.38}
    assert edition["ratios"]["gluon_bwd"]["bwd"] == 2.0 and "sdpa_cudnn" not in edition["ratios"]
    assert "Gluon forward, tl backward" in ctx["table"] and ctx["gpus"] == ["H100"]
