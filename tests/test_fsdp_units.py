"""FSDP's unit of gathering: a layer, a block, or k blocks, on 2 gloo ranks against single-process
training (the helpers and bounds of test_fsdp.py), and the collectives each unit costs.

The model is "tiny2" (3 blocks, so 2 blocks per unit leaves one unit of a single block). Per
forward every unit is all-gathered once; per backward every unit whose weights autograd saved is
gathered again (all but the embedding) and every unit's gradient is reduce-scattered once. The
collectives are counted at `fsdp_unit`'s all-gather and reduce-scatter calls.
"""

from __future__ import annotations

import weakref

import pytest
import torch
from conftest import spawn_checks
from test_fsdp import (
    BATCH_PER_RANK,
    BF16_MODEL_UPDATE_REL_TOL,
    BF16_TENSOR_UPDATE_REL_TOL,
    FP32_FIRST_GRAD_TOL,
    FP32_GRAD_TOL,
    FP32_PARAM_TOL,
    SEQ,
    ToyNet,
    _build,
    _count_alive,
    _train_against_reference,
)

from cs336sys.distributed import fsdp_unit
from cs336sys.distributed.fsdp import FSDP, unit_modules
from cs336sys.optim import AdamW, cross_entropy

UNITS = ("layer", "block", 2)
BLOCKS = 3  # tiny2
# The unit paths of tiny2: per layer, 7 Linear layers per block (q, k, v, output, w1, w2, w3)
EXPECTED_UNITS = {"layer": 2 + 7 * BLOCKS, "block": 2 + BLOCKS, 2: 2 + 2}


class _Counted:
    """Wraps a flat collective: counts its calls and keeps a weak reference to each output."""

    def __init__(self, collective):
        self.collective, self.calls, self.outputs = collective, 0, []

    def __call__(self, out, *args, **kwargs):
        self.calls += 1
        self.outputs.append(weakref.ref(out))
        return self.collective(out, *args, **kwargs)


def _collectives_per_step(rank: int, world: int, seed: int, unit) -> dict:
    """All-gathers in the forward and in the backward, reduce-scatters, of a second training step
    (the first has recorded the call order); whether any gathered buffer outlives the step."""
    gathers, reductions = _Counted(fsdp_unit._all_gather_flat), _Counted(fsdp_unit._reduce_scatter_flat)
    fsdp_unit._all_gather_flat, fsdp_unit._reduce_scatter_flat = gathers, reductions
    try:
        model, vocab = _build("tiny2", seed)
        fsdp = FSDP(model, unit=unit)
        gen = torch.Generator().manual_seed(seed)
        result = {"units": len(fsdp.units), "paths": fsdp.unit_paths()}
        for _ in range(2):
            tokens = torch.randint(0, vocab, (BATCH_PER_RANK, SEQ + 1), generator=gen)
            gathers.calls = reductions.calls = 0
            gathers.outputs.clear()
            loss = cross_entropy(fsdp(tokens[:, :-1]), tokens[:, 1:])
            result["forward_gathers"] = gathers.calls
            loss.backward()
            fsdp.finish_gradient_synchronization()
            result["backward_gathers"] = gathers.calls - result["forward_gathers"]
            result["reduce_scatters"] = reductions.calls
            del loss
            result["alive_after_step"] = _count_alive(gathers.outputs)
        result["attributes_removed"] = not any(hasattr(m, "weight") and "weight" not in m._parameters
                                               for m in model.modules())
        return result
    finally:
        fsdp_unit._all_gather_flat, fsdp_unit._reduce_scatter_flat = gathers.collective, reductions.collective


def _all_checks(info, seed: int) -> dict:
    results = {}
    for unit in UNITS:
        for dtype_name, dtype in (("fp32", None), ("bf16", torch.bfloat16)):
            results[f"{unit}/{dtype_name}"] = _train_against_reference(info.rank, info.world_size, "tiny2", dtype,
                                                                       seed, unit=unit)
        results[f"{unit}/collectives"] = _collectives_per_step(info.rank, info.world_size, seed, unit)
    return results


@pytest.fixture(scope="module")
def spawned():
    return spawn_checks(_all_checks, 2, timeout_s=180)


@pytest.mark.parametrize("unit", UNITS)
def test_fp32_matches_single_process_training(spawned, unit):
    _, per_rank = spawned
    for rank, results in enumerate(per_rank):
        r = results[f"{unit}/fp32"]
        assert r["initial_err"] == 0, f"rank {rank}: gathered initial parameters are not rank 0's model"
        assert r["names_match"] and r["shapes_match"]
        assert r["grad_dtypes"] == ["torch.float32"]
        assert r["first_grad_err"] < FP32_FIRST_GRAD_TOL, f"rank {rank}: first gradients {r['first_grad_err']:.3g}"
        assert r["grad_err"] < FP32_GRAD_TOL, f"rank {rank}: gradients off by {r['grad_err']:.3g} (relative)"
        assert r["param_err"] < FP32_PARAM_TOL, f"rank {rank}: parameters off by {r['param_err']:.3g}"


@pytest.mark.parametrize("unit", UNITS)
def test_bf16_compute_matches_within_tolerance(spawned, unit):
    _, per_rank = spawned
    for rank, results in enumerate(per_rank):
        r = results[f"{unit}/bf16"]
        assert r["initial_err"] == 0 and r["names_match"] and r["shapes_match"]
        assert r["logits_dtype"] == "torch.bfloat16"
        assert r["model_update_rel_err"] < BF16_MODEL_UPDATE_REL_TOL, \
            f"rank {rank}: the model's update off by {r['model_update_rel_err']:.3g} (relative)"
        assert r["update_rel_err"] < BF16_TENSOR_UPDATE_REL_TOL, \
            f"rank {rank}: a tensor's update off by {r['update_rel_err']:.3g} (relative)"


@pytest.mark.parametrize("unit", UNITS)
def test_one_all_gather_per_unit_and_forward(spawned, unit):
    _, per_rank = spawned
    for results in per_rank:
        r = results[f"{unit}/collectives"]
        assert r["units"] == EXPECTED_UNITS[unit], r["paths"]
        assert r["forward_gathers"] == r["units"], "each unit gathered once per forward"
        assert r["backward_gathers"] == r["units"] - 1, "gathered again for the backward, the embedding not"
        assert r["reduce_scatters"] == r["units"], "each unit's gradient reduce-scattered once"
        assert r["alive_after_step"] == 0, "no gathered buffer outlives the step"
        assert r["attributes_removed"], "full parameters exist as attributes only while their unit runs"


def test_block_units_are_the_blocks_and_the_layers_outside_them(spawned):
    _, per_rank = spawned
    paths = {unit: per_rank[0][f"{unit}/collectives"]["paths"] for unit in UNITS}
    assert paths["block"] == [["token_embeddings"], ["layers.0"], ["layers.1"], ["layers.2"], ["lm_head"]]
    assert paths[2] == [["token_embeddings"], ["layers.0", "layers.1"], ["layers.2"], ["lm_head"]]
    sizes = per_rank[0]["block/fp32"]["shard_sizes"]
    block = sum(p.numel() for p in _build("tiny2", 0)[0].layers[0].parameters())
    assert sizes["layers.0"] == (block // 2, block), "a block's norms are sharded with its matrices"


def test_unit_must_be_layer_block_or_a_number_of_blocks():
    for bad in ("blocks", 0, -1, True, 1.5):
        with pytest.raises(ValueError, match="unit must be"):
            unit_modules(ToyNet(), bad)


def test_a_model_without_blocks_has_per_layer_units():
    model = ToyNet()
    assert unit_modules(model, "block") == unit_modules(model, "layer")


def test_block_units_at_world_size_one_train_like_the_model():
    """Without a process group (the world-size-1 proxy's setting) block units train as the model."""
    reference, vocab = _build("tiny2", 0)
    model, _ = _build("tiny2", 0)
    fsdp = FSDP(model, unit="block")
    opt_ref, opt = AdamW(reference.parameters(), lr=1e-2), AdamW(fsdp.parameters(), lr=1e-2)
    for _ in range(2):
        tokens = torch.randint(0, vocab, (2, SEQ + 1))
        for m, o in ((reference, opt_ref), (fsdp, opt)):
            o.zero_grad()
            cross_entropy(m(tokens[:, :-1]), tokens[:, 1:]).backward()
            if m is fsdp:
                fsdp.finish_gradient_synchronization()
            o.step()
    full = fsdp.gather_full_params()
    for name, p in reference.named_parameters():
        torch.testing.assert_close(full[name], p.detach(), rtol=1e-6, atol=1e-6)
