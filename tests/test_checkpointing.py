"""Activation checkpointing: no gradient changes, the sqrt(N) prediction, the sweep helper."""

import math

import pytest
import torch

from cs336sys.model import TransformerBlock, build_model
from cs336sys.optim import cross_entropy
from cs336sys.profiling.checkpointing import (
    bisection_checkpoint,
    bisection_cost,
    checkpoint_memory,
    checkpointing_sweep,
    optimal_group_size,
    recompute_from_input,
    recompute_from_input_cost,
)
from cs336sys.profiling.saved_tensors import saved_tensor_accounting


def _gradients(size: str, checkpoint_blocks: int) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    model = build_model(size, 16, checkpoint_blocks=checkpoint_blocks)
    tokens = torch.randint(0, 10_000, (2, 16), generator=torch.Generator().manual_seed(1))
    cross_entropy(model(tokens), tokens).backward()
    return {name: p.grad for name, p in model.named_parameters()}


@pytest.mark.parametrize("size, k", [("tiny", 1), ("tiny", 2), ("tiny2", 2), ("tiny2", 3)])
def test_checkpointing_changes_no_gradient(size, k):
    expected = _gradients(size, 0)
    got = _gradients(size, k)
    assert expected.keys() == got.keys()
    for name in expected:
        assert torch.equal(got[name], expected[name]), name  # bitwise, fp32 on the CPU


@pytest.mark.parametrize("scheme", [bisection_checkpoint, recompute_from_input])
def test_nested_schemes_change_no_gradient(scheme):
    torch.manual_seed(0)
    blocks = torch.nn.ModuleList(TransformerBlock(32, 4, 64, 8, 10_000.0) for _ in range(5))
    x = torch.randn(2, 8, 32, requires_grad=True)
    plain = x
    for block in blocks:
        plain = block(plain)
    expected = torch.autograd.grad(plain.square().sum(), [x, *blocks.parameters()])
    got = torch.autograd.grad(scheme(list(blocks), x).square().sum(), [x, *blocks.parameters()])
    for g, e in zip(got, expected, strict=True):
        assert torch.equal(g, e)


def test_nested_schemes_keep_less_for_the_backward():
    torch.manual_seed(0)
    blocks = [TransformerBlock(32, 4, 64, 8, 10_000.0) for _ in range(4)]
    stack = torch.nn.Sequential(*blocks)
    x = torch.randn(2, 8, 32, requires_grad=True)
    plain = saved_tensor_accounting(stack, x)["total_bytes"]
    one_block = saved_tensor_accounting(blocks[0], x)["total_bytes"]
    assert plain > 3 * one_block

    class Scheme(torch.nn.Module):
        def __init__(self, scheme):
            super().__init__()
            self.blocks, self.scheme = torch.nn.ModuleList(blocks), scheme

        def forward(self, x):
            return self.scheme(list(self.blocks), x)

    # the forward keeps only boundaries (and, without a checkpoint around it, the last block's tensors)
    assert saved_tensor_accounting(Scheme(bisection_checkpoint), x)["total_bytes"] <= 2 * x.numel() * 4
    assert saved_tensor_accounting(Scheme(recompute_from_input), x)["total_bytes"] <= one_block + x.numel() * 4


def test_prediction_on_a_worked_example():
    # N = 16 blocks of 4 units of saved tensors, boundaries of 1 unit: M(k) = ceil(16/k) + 4k
    assert [checkpoint_memory(16, k, 4, 1) for k in (1, 2, 3, 4, 8, 16)] == [20, 16, 18, 20, 34, 65]
    best = optimal_group_size(16, 4, 1)
    assert best["best_k"] == 2 and best["best_bytes"] == 16
    assert best["k_continuous"] == 2.0 and best["sqrt_law_bytes"] == 16.0
    assert best["no_checkpoint_bytes"] == 64 == checkpoint_memory(16, 0, 4, 1)
    assert min(best["predicted"].values()) == 16


def test_prediction_for_the_handouts_xl_block():
    # one 2.7B block at batch 4, context 2048 saves ~3651 MiB (handout, compiled); a boundary is 80 MiB
    best = optimal_group_size(32, 3651, 80)
    assert best["best_k"] == 1 and math.isclose(best["k_continuous"], math.sqrt(32 * 80 / 3651))


def test_nested_costs():
    assert bisection_cost(8) == {"peak_boundaries": 4, "block_forwards": 8 * 4}  # log2 N + 1; N (1 + log2 N)
    assert bisection_cost(1) == {"peak_boundaries": 1, "block_forwards": 1}
    assert recompute_from_input_cost(8) == {"peak_boundaries": 1, "block_forwards": 36}


def test_sweep_runs_on_the_cpu():
    def make_step(k):
        model = build_model("tiny", 16, checkpoint_blocks=k)
        tokens = torch.randint(0, 10_000, (2, 16))
        return lambda: cross_entropy(model(tokens), tokens).backward()

    rows = checkpointing_sweep(make_step, [0, 1, 2], "cpu", warmup=1, steps=2)
    assert [r["checkpoint_blocks"] for r in rows] == [0, 1, 2]
    assert all(r["status"] == "ok" and r["peak_memory_bytes"] is None and r["step_ms"]["mean_ms"] > 0 for r in rows)


def test_sweep_records_out_of_memory():
    def make_step(k):
        def step():
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1 GiB\nmore")
        return step

    (row,) = checkpointing_sweep(make_step, [4], "cpu")
    assert row == {"checkpoint_blocks": 4, "status": "oom", "peak_memory_bytes": None, "step_ms": None,
                   "error": "CUDA out of memory. Tried to allocate 1 GiB"}
