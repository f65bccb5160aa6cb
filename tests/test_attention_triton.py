"""The Triton FlashAttention kernels through Triton's CPU interpreter (float32, small shapes).

Triton chooses between its interpreter and its compiler when functions are decorated, i.e. when
triton is first imported, from TRITON_INTERPRET. So that these tests work in any process (a
full `pytest` run that also compiles kernels on a GPU, in any order), the first test starts one
subprocess with TRITON_INTERPRET=1 that runs the rest of this file; in a process without the
variable the rest are skipped with that reason, and their failures fail the first test.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

pytest.importorskip("triton")

from conftest import (  # noqa: E402
    random_qkv,
    reference_attention,
    rel_err,
    rerun_under_the_interpreter,
    run_experiment,
)

from cs336sys.attention.bench import run_leaderboard_point  # noqa: E402
from cs336sys.attention.bench_flash_triton import run_triton_point  # noqa: E402
from cs336sys.attention.flash_configs import BackwardConfig, Tiles  # noqa: E402
from cs336sys.attention.flash_triton import (  # noqa: E402
    FlashAttention2Triton,
    flash_attention_triton_backward,
    flash_attention_triton_forward,
    kernels_interpreted,
)
from cs336sys.attention.naive import attention_logsumexp, naive_attention  # noqa: E402
from cs336sys.jobs import Unsupported  # noqa: E402

IN_INTERPRETER = os.environ.get("TRITON_INTERPRET") == "1" and kernels_interpreted()
interpreted = pytest.mark.skipif(not IN_INTERPRETER, reason="runs in the TRITON_INTERPRET=1 subprocess "
                                 "of test_kernels_in_an_interpreter_process")


def _interpreter_cannot_take_tensor_loop_bounds() -> bool:
    """Triton before 3.7 interprets `range(a, b)` over tensor bounds with int() of a 1-element array,
    which NumPy 2.4 refuses (Triton 3.9 squeezes it first); the flash kernels' key loops have such
    bounds (the causal split), so there the interpreter cannot run them at all."""
    import numpy
    import triton

    major_minor = lambda v: tuple(int(x) for x in v.split(".")[:2])  # noqa: E731
    return major_minor(triton.__version__) < (3, 7) and major_minor(numpy.__version__) >= (2, 4)


@pytest.mark.slow(seconds=45)
def test_kernels_in_an_interpreter_process():
    if IN_INTERPRETER:
        pytest.skip("this process already interprets; the tests below run here")
    if _interpreter_cannot_take_tensor_loop_bounds():
        pytest.skip("Triton < 3.7's interpreter with NumPy >= 2.4 cannot take the flash kernels' tensor loop "
                    "bounds; here the compiled kernels are tested instead (pytest -m gpu)")
    rerun_under_the_interpreter(__file__, "not in_an_interpreter_process and not need_the_interpreter")


def reference_grads(q, k, v, grad_out, is_causal):
    return reference_attention(q, k, v, grad_out, is_causal)[2:]


# The interpreter's tiles are 32 query rows x 16 keys (forward, dQ) and 16 x 32 (dK/dV), so
# these lengths give several tiles per program, partial last tiles and the causal diagonal split.
CASES = [  # (leading dims, seq_q, seq_k, d, causal)
    ((2,), 64, 64, 16, True),
    ((2,), 70, 70, 32, True),
    ((1, 2), 45, 45, 16, False),
    ((1, 2), 40, 100, 16, False),  # different query and key lengths
    ((2, 1), 90, 50, 16, True),  # causal with more queries than keys
    ((1, 1), 20, 75, 16, True),  # causal with more keys than queries
]


@interpreted
@pytest.mark.parametrize("lead,seq_q,seq_k,d,causal", CASES)
def test_triton_forward_backward_matches_float64(lead, seq_q, seq_k, d, causal):
    q, k, v = random_qkv(lead, seq_q, seq_k, d)
    out = FlashAttention2Triton.apply(q, k, v, causal)
    lse = next(t for t in out.grad_fn.saved_tensors if t.shape == q.shape[:-1])
    grad_out = torch.randn_like(out)
    out.backward(grad_out)
    q64, k64 = q.detach().double(), k.detach().double()
    assert rel_err(out, naive_attention(q64, k64, v.detach().double(), causal)) < 1e-5
    assert rel_err(lse, attention_logsumexp(q64, k64, causal)) < 1e-5
    for got, want in zip((q.grad, k.grad, v.grad), reference_grads(q, k, v, grad_out, causal), strict=True):
        assert rel_err(got, want) < 1e-5


@interpreted
def test_explicit_tile_configs_match():
    q, k, v = random_qkv((2,), 70, 45, 16)
    grad_out = torch.randn_like(q)
    forward = Tiles(block_m=16, block_n=16, num_warps=4, num_stages=1)
    backward = BackwardConfig(block_m_kv=16, block_n_kv=16, block_m_q=16, block_n_q=16, num_warps=4,
                              num_stages=1, fused=False)  # one launch per kind of program
    with torch.no_grad():
        out, lse = flash_attention_triton_forward(q, k, v, True, forward)
        grads = flash_attention_triton_backward(q, k, v, out, lse, grad_out, True, backward)
    assert rel_err(out, naive_attention(q.double(), k.double(), v.double(), True)) < 1e-5
    for got, want in zip(grads, reference_grads(q, k, v, grad_out, True), strict=True):
        assert rel_err(got, want) < 1e-5


@interpreted
def test_ieee_float32_products_match_float64_and_a_bad_precision_is_named():
    q, k, v = random_qkv((2,), 70, 70, 32)
    out = FlashAttention2Triton.apply(q, k, v, True, "ieee")
    grad_out = torch.randn_like(out)
    out.backward(grad_out)
    assert rel_err(out, naive_attention(q.detach().double(), k.detach().double(), v.detach().double(), True)) < 1e-5
    for got, want in zip((q.grad, k.grad, v.grad), reference_grads(q, k, v, grad_out, True), strict=True):
        assert rel_err(got, want) < 1e-5
    with pytest.raises(ValueError, match="unknown float32 precision 'tf16'"):
        FlashAttention2Triton.apply(q, k, v, True, "tf16")


@interpreted
def test_non_contiguous_inputs():
    # (batch, seq, heads, d) viewed as (batch, heads, seq, d): rows are strided
    q, k, v = (torch.randn(1, 48, 2, 16).transpose(1, 2) for _ in range(3))
    out = FlashAttention2Triton.apply(q, k, v, True)
    assert rel_err(out, naive_attention(q.double(), k.double(), v.double(), True)) < 1e-5


def test_cpu_tensors_need_the_interpreter():
    code = ("import torch\n"
            "from cs336sys.attention.flash_triton import FlashAttention2Triton\n"
            "q = torch.randn(1, 32, 16)\n"
            "try:\n"
            "    FlashAttention2Triton.apply(q, q, q, False)\n"
            "except ValueError as exc:\n"
            "    print('ValueError:', exc)\n")
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert "ValueError: the Triton kernels need CUDA tensors" in result.stdout, result.stdout + result.stderr
    assert "TRITON_INTERPRET=1" in result.stdout


@interpreted
@pytest.mark.parametrize("make,error,match", [
    (lambda: (torch.randn(1, 32, 48),) * 3, ValueError, "head dimension"),
    (lambda: (torch.randn(1, 32, 16, dtype=torch.float64),) * 3, TypeError, "float32"),
    (lambda: (torch.randn(1, 32, 16), torch.randn(1, 32, 16), torch.randn(1, 31, 16)), ValueError, "shape"),
])
def test_bad_inputs(make, error, match):
    q, k, v = make()
    with pytest.raises(error, match=match):
        FlashAttention2Triton.apply(q, k, v, False)


@interpreted
def test_compiled_apply_matches_eager():
    q, k, v = random_qkv((1, 2), 32, 32, 16)
    out = torch.compile(FlashAttention2Triton.apply)(q, k, v, True)
    out.sum().backward()
    assert rel_err(out, naive_attention(q.double(), k.double(), v.double(), True)) < 1e-5
    want = reference_grads(q, k, v, torch.ones_like(out), True)
    assert rel_err(q.grad, want[0]) < 1e-5


@interpreted
def test_triton_point_runs_through_the_interpreter_on_cpu():
    metrics = run_experiment(run_triton_point, impl="triton", seq=32, d=16, dtype="fp32")
    assert metrics["fwd_bwd_ms"] > 0
    with pytest.raises(Unsupported, match="float32 only"):
        run_experiment(run_triton_point, **{"device": "cpu", "impl": "triton", "seq": 32, "d": 16, "dtype": "bf16"})
    ieee = run_experiment(run_triton_point, impl="triton_ieee", seq=32, d=16, dtype="fp32")
    assert ieee["fwd_bwd_ms"] > 0
    with pytest.raises(Unsupported, match="triton_ieee sets how float32 products run"):
        run_experiment(run_triton_point, **{"device": "cpu", "impl": "triton_ieee", "seq": 32, "d": 16,
                                            "dtype": "bf16"})


@interpreted
def test_leaderboard_point_smoke_on_cpu():
    metrics = run_experiment(run_leaderboard_point, **{"device": "cpu", "impl": "ours", "heads": 2, "seq": 32, "d": 16,
                                     "dtype": "fp32"})
    assert metrics["fwd_bwd_ms"] > 0 and metrics["fwd_bwd_tflops"] > 0 and metrics["fwd_ms"] > 0
    assert metrics["bwd_ms"] == metrics["fwd_bwd_ms"] - metrics["fwd_ms"]
    assert metrics["bwd_flops"] == 2.5 * metrics["fwd_flops"]


@interpreted
@pytest.mark.parametrize("impl", ["ours", "sdpa_flash"])
def test_leaderboard_point_in_the_2025_harness_layout(impl):
    """(batch, seq, d) with heads folded into the batch, as the 2025 harness builds q, k, v; ours with
    explicit tiles."""
    tiles = {"forward_tiles": "32x16/w4/s1", "backward_tiles": "kv16x32/q32x16/w4/s1/split"} if impl == "ours" else {}
    metrics = run_experiment(run_leaderboard_point, **{"device": "cpu", "impl": impl, "batch": 3, "seq": 40, "d": 16,
                                                       "dtype": "fp32", "layout": "bsd", **tiles})
    assert metrics["fwd_flops"] == 4.0 * 3 * 16 * (40 * 41 // 2)
    assert metrics["fwd_ms"] > 0 and metrics["fwd_bwd_ms"] > 0


@interpreted
def test_explicit_tile_strings_match_the_table_and_bad_ones_are_named():
    q, k, v = random_qkv((2,), 70, 70, 16)
    grad_out = torch.randn_like(q)
    out = FlashAttention2Triton.apply(q, k, v, True, "tf32", "16x16/w4/s1", "kv16x16/q16x16/w4/s1/split")
    out.backward(grad_out)
    assert rel_err(out, naive_attention(q.detach().double(), k.detach().double(), v.detach().double(), True)) < 1e-5
    for got, want in zip((q.grad, k.grad, v.grad), reference_grads(q, k, v, grad_out, True), strict=True):
        assert rel_err(got, want) < 1e-5
    with pytest.raises(ValueError, match="not of the form MxN/wW/sS"):
        FlashAttention2Triton.apply(q, k, v, True, "tf32", "16by16")
    with pytest.raises(ValueError, match="not of the form kvMxN"):
        FlashAttention2Triton.apply(q, k, v, True, "tf32", None, "kv16x16")
