"""FlashAttention-2 in PyTorch and the naive baseline against a float64 reference (CPU, fast)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import random_qkv, reference_attention, rel_err, run_experiment

from cs336sys import adapters
from cs336sys.attention.bench_common import attended_pairs
from cs336sys.attention.bench_flash import run_baseline_point
from cs336sys.attention.bench_flash_triton import run_triton_point
from cs336sys.attention.bench_naive import run_pytorch_attention_point
from cs336sys.attention.flash_pytorch import FlashAttention2PyTorch, flash_backward_recompute, flash_forward_pytorch
from cs336sys.attention.naive import attention_logsumexp, naive_attention
from cs336sys.jobs import Unsupported

reference = reference_attention


CASES = [  # (leading dims, seq_q, seq_k, d, causal)
    ((2,), 64, 64, 32, False),
    ((2,), 64, 64, 32, True),
    ((3,), 77, 77, 16, True),  # not a multiple of the tile
    ((2, 3), 50, 90, 24, False),  # heads; fewer queries than keys; d not a power of two
    ((1, 2), 90, 50, 32, True),  # more queries than keys, causal (top-left aligned)
    ((1, 2), 33, 100, 16, True),
]


@pytest.mark.parametrize("lead,seq_q,seq_k,d,causal", CASES)
def test_flash_pytorch_matches_float64(lead, seq_q, seq_k, d, causal):
    q, k, v = random_qkv(lead, seq_q, seq_k, d)
    out = FlashAttention2PyTorch.apply(q, k, v, causal)
    saved = out.grad_fn.saved_tensors
    lse = next(t for t in saved if t.shape == q.shape[:-1])
    grad_out = torch.randn_like(out)
    out.backward(grad_out)
    o_ref, lse_ref, dq_ref, dk_ref, dv_ref = reference(q, k, v, grad_out, causal)
    assert out.shape == q.shape and out.dtype == q.dtype
    assert rel_err(out, o_ref) < 1e-5
    assert rel_err(lse, lse_ref) < 1e-5
    assert rel_err(q.grad, dq_ref) < 1e-5
    assert rel_err(k.grad, dk_ref) < 1e-5
    assert rel_err(v.grad, dv_ref) < 1e-5


@pytest.mark.parametrize("block_q,block_k", [(16, 16), (16, 48), (64, 16)])
def test_flash_forward_tiles_do_not_change_the_result(block_q, block_k):
    q, k, v = (torch.randn(2, 3, 100, 32, dtype=torch.float64) for _ in range(3))
    out, lse = flash_forward_pytorch(q, k, v, True, block_q, block_k)
    assert lse.dtype == torch.float64
    assert rel_err(out, naive_attention(q, k, v, True)) < 1e-12
    assert rel_err(lse, attention_logsumexp(q, k, True)) < 1e-12


def test_tiles_smaller_than_16_are_refused():
    q = torch.randn(1, 32, 16)
    with pytest.raises(ValueError, match="at least 16"):
        flash_forward_pytorch(q, q, q, False, 8, 16)


def test_half_precision_accumulates_in_float32():
    q, k, v = random_qkv((2,), 64, 64, 32, dtype=torch.bfloat16)
    out = FlashAttention2PyTorch.apply(q, k, v, True)
    assert out.dtype == torch.bfloat16
    assert rel_err(out, naive_attention(q.double(), k.double(), v.double(), True)) < 1e-2


def test_backward_recompute_uses_the_saved_statistics():
    q, k, v = (torch.randn(2, 40, 16, dtype=torch.float64) for _ in range(3))
    out, lse = flash_forward_pytorch(q, k, v, True)
    grad_out = torch.randn_like(out)
    _, _, dq_ref, dk_ref, dv_ref = reference(q, k, v, grad_out, True)
    dq, dk, dv = flash_backward_recompute(q, k, v, out, lse, grad_out, True)
    for got, want in ((dq, dq_ref), (dk, dk_ref), (dv, dv_ref)):
        assert rel_err(got, want) < 1e-12


def test_naive_attention_matches_sdpa():
    q, k, v = (torch.randn(2, 3, 70, 32, dtype=torch.float64) for _ in range(3))
    for causal in (False, True):
        want = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        assert rel_err(naive_attention(q, k, v, causal), want) < 1e-12


@pytest.mark.parametrize("make,error,match", [
    (lambda: (torch.randn(2, 8, 16), torch.randn(2, 9, 16), torch.randn(2, 8, 16)), ValueError, "same shape"),
    (lambda: (torch.randn(2, 8, 16), torch.randn(3, 8, 16), torch.randn(3, 8, 16)), ValueError, "leading"),
    (lambda: (torch.randn(2, 8, 16), torch.randn(2, 8, 32), torch.randn(2, 8, 32)), ValueError, "head dim"),
    (lambda: (torch.randn(8, 16), torch.randn(8, 16), torch.randn(8, 16)), ValueError, "batch"),
    (lambda: (torch.randn(2, 8, 16), torch.randn(2, 8, 16).double(), torch.randn(2, 8, 16)), TypeError, "dtype"),
    (lambda: (torch.ones(2, 8, 16, dtype=torch.int32),) * 3, TypeError, "floating"),
])
def test_bad_inputs_raise_clear_errors(make, error, match):
    q, k, v = make()
    with pytest.raises(error, match=match):
        FlashAttention2PyTorch.apply(q, k, v, False)


def test_is_causal_must_be_a_bool():
    q = torch.randn(1, 8, 16)
    with pytest.raises(TypeError, match="is_causal"):
        FlashAttention2PyTorch.apply(q, q, q, 1)


def test_adapters_return_the_autograd_functions():
    cls = adapters.get_flashattention_autograd_function_pytorch()
    assert cls is FlashAttention2PyTorch
    assert issubclass(adapters.get_flashattention_autograd_function_triton(), torch.autograd.Function)


def test_attended_pairs_counts_the_causal_triangle():
    assert attended_pairs(4, 4, False) == 16
    assert attended_pairs(4, 4, True) == 10
    assert attended_pairs(6, 3, True) == 1 + 2 + 3 + 3 * 3
    assert attended_pairs(3, 6, True) == 1 + 2 + 3


def test_pytorch_attention_point_on_cpu():
    metrics = run_experiment(run_pytorch_attention_point, d=16, seq=32, batch=2, passes=3, warmup=1, impl="eager")
    assert metrics["forward_ms"] > 0 and metrics["backward_ms"] > 0
    assert "memory_before_backward_bytes" not in metrics  # no allocator statistics on the CPU


@pytest.mark.parametrize("impl", ["naive", "sdpa"])
def test_flash_point_on_cpu(impl):
    metrics = run_experiment(run_baseline_point, **{"device": "cpu", "impl": impl, "seq": 64, "d": 16, "dtype": "fp32"})
    for part in ("forward", "backward", "fwd_bwd"):
        assert metrics[f"{part}_ms"] > 0 and metrics[f"{part}_tflops"] > 0
    assert metrics["backward_flops"] == 2.5 * metrics["forward_flops"] == 2.5 * 4 * 16 * (64 * 65 // 2)
    if impl == "sdpa":
        assert metrics["sdpa_backend"] in ("flash", "efficient", "cudnn", "math")


def test_each_family_of_the_flash_grid_refuses_the_others_impl():
    point = {"device": "cpu", "seq": 32, "d": 16, "dtype": "fp32"}
    with pytest.raises(ValueError, match="bench_flash_triton"):
        run_experiment(run_baseline_point, impl="triton", **point)
    with pytest.raises(ValueError, match="run_baseline_point"):
        run_experiment(run_triton_point, impl="naive", **point)


def test_unavailable_sdpa_backend_is_unsupported():
    with pytest.raises(Unsupported, match="cudnn"):
        run_experiment(run_baseline_point, **{"device": "cpu", "impl": "sdpa", "sdpa_backend": "cudnn", "seq": 32,
                                              "d": 16, "dtype": "fp32"})
