"""The leaderboard step (block-wise FSDP, fused head + loss, fused AdamW) and its PyTorch-parts
baseline against single-process training of the plain model, on 1 and 2 gloo ranks on the CPU.

A tiny model (vocab 64, d_model 32, d_ff 64, 3 layers, 4 heads, context 16) in fp32. Each rank
builds its model from its own seed (seed + 7 * rank), so a match also shows that every rank
starts from rank 0's parameters. The reference is `build_model` with rank 0's seed, trained on
the whole global batch with `cs336sys.optim.AdamW`; each rank trains on its slice. Every check
runs on fresh random data (a new seed per test session, printed).
"""

from __future__ import annotations

import time
import weakref

import pytest
import torch
import torch.distributed as dist
from conftest import spawn_checks

from cs336sys.distributed.spawn import spawn
from cs336sys.jobs import Run
from cs336sys.leaderboard.baseline import build_pytorch_parts_step
from cs336sys.leaderboard.experiments import LeaderboardSettings, run_leaderboard_point
from cs336sys.leaderboard.step import LeaderboardSpec, build_leaderboard_step, checkpointed_blocks
from cs336sys.model import build_model
from cs336sys.optim import AdamW, cross_entropy
from cs336sys.sizes import ModelSize

TINY = ModelSize("leaderboard-test", d_model=32, d_ff=64, num_layers=3, num_heads=4, vocab_size=64, batch_size=2)
SEQ, BATCH_PER_RANK, STEPS = 16, 2, 3
CHUNK = 8  # 32 tokens per rank: the fused loss runs 4 chunks
LR, EPS, WD = 1e-3, 1e-6, 0.1
# (checkpoint policy, reshard_after_forward): all, none, the first k, a set of blocks.
CONFIGS = [("all", True), ("all", False), ("none", True), ("none", False), (1, True), (1, False), ((0, 2), True)]
# (checkpoint policy, reshard_after_forward, offload_blocks): the first k checkpointed blocks offloaded
OFFLOADED = [("all", True, 2), (1, False, 1), ((0, 2), True, 1)]
# fp32 everywhere: the differences from the reference are the order of summation (gradients averaged
# over ranks, the loss summed in chunks). Measured over 16 runs (8 seeds x 1 and 2 ranks, all
# configurations): losses 2.2e-7 relative, gradients 1.7e-6 of their tensor's largest, parameters
# 2.4e-7 absolute after 3 AdamW steps; the bounds are 20-45x that, as in test_fsdp.py (where
# AdamW's eps 1e-6 is explained). A real error (a missing average, a wrong shard) is off by O(1).
FP32_LOSS_TOL = 1e-5
FP32_GRAD_TOL = 5e-5
FP32_PARAM_TOL = 1e-5
# bf16 compute (fp32 masters, fp32 reduction): bf16 keeps 8 significant bits; through a few matmuls
# and roundings the loss differs from fp32 by ~1e-3 relative, the whole gradient by a percent or two.
# Measured over the same 16 runs: loss 7.2e-4, gradient (whole vector, relative norm) 1.45e-2.
BF16_LOSS_REL_TOL = 5e-3
BF16_GRAD_REL_TOL = 8e-2


def _spec(rank: int, seed: int, policy="all", reshard: bool = True, dtype: str = "fp32", **options) -> LeaderboardSpec:
    """`options`: the spec's other settings (attention "naive" unless given)."""
    return LeaderboardSpec(size=TINY, context_length=SEQ, batch_per_rank=BATCH_PER_RANK, compute_dtype=dtype,
                           checkpoint_blocks=policy, reshard_after_forward=reshard, ce_chunk_tokens=CHUNK,
                           seed=seed + 7 * rank, lr=LR, eps=EPS, weight_decay=WD, **{"attention": "naive", **options})


def _reference(seed: int):
    torch.manual_seed(seed)
    model = build_model(TINY, SEQ)
    return model, AdamW(model.parameters(), lr=LR, eps=EPS, weight_decay=WD)


def _global_batches(seed: int, world: int):
    gen = torch.Generator().manual_seed(seed + 100)  # the same global batches on every rank
    for _ in range(STEPS):
        yield tuple(torch.randint(0, TINY.vocab_size, (BATCH_PER_RANK * world, SEQ), generator=gen) for _ in range(2))


def _mean_over_ranks(loss: torch.Tensor, world: int) -> float:
    loss = loss.detach().clone()
    if world > 1:
        dist.all_reduce(loss)
    return loss.item() / world


def _count_alive(refs: list[weakref.ref], patience_s: float = 2.0) -> int:
    """Alive tensors, allowing gloo's worker thread a moment to drop a finished collective's."""
    deadline = time.monotonic() + patience_s
    while (alive := sum(r() is not None for r in refs)) and time.monotonic() < deadline:
        time.sleep(0.01)
    return alive


def _track_gathers(step) -> list[weakref.ref]:
    refs: list[weakref.ref] = []
    for unit in step.fsdp.units:
        def start_gather(unit=unit, original=unit.start_gather):
            fresh = not unit.gather_in_flight
            original()
            if fresh:
                refs.append(weakref.ref(unit._inflight[0]))
        unit.start_gather = start_gather
    return refs


def _train_ours(rank: int, world: int, seed: int, policy, reshard: bool, **options) -> dict:
    reference, opt_ref = _reference(seed)
    step = build_leaderboard_step(_spec(rank, seed, policy, reshard, **options), "cpu")
    if step.offload is not None:
        step.offload.min_bytes = 0  # the tiny model's tensors are all under the step's 1 MiB threshold
    initial = step.fsdp.gather_full_params()
    result = {"initial_err": max((initial[n] - p).abs().max().item() for n, p in reference.named_parameters()),
              "loss_err": 0.0, "grad_err": 0.0, "alive_after_step": 0, "gathers": []}
    refs = _track_gathers(step)
    mine = slice(rank * BATCH_PER_RANK, (rank + 1) * BATCH_PER_RANK)
    for tokens, targets in _global_batches(seed, world):
        opt_ref.zero_grad()
        ref_loss = cross_entropy(reference(tokens), targets)
        ref_loss.backward()
        step.tokens, step.targets = tokens[mine], targets[mine]
        before = [u.gathers_issued for u in step.fsdp.units]
        loss = _mean_over_ranks(step.run(), world)
        result["gathers"].append(sum(u.gathers_issued for u in step.fsdp.units) - sum(before))
        result["loss_err"] = max(result["loss_err"], abs(loss - ref_loss.item()) / ref_loss.item())
        grads = step.fsdp.gather_full_grads()  # this step's (the optimizer does not clear them)
        result["grad_err"] = max(result["grad_err"], *(
            ((grads[n] - p.grad).abs().max() / p.grad.abs().max().clamp_min(1e-30)).item()
            for n, p in reference.named_parameters()))
        opt_ref.step()
        result["alive_after_step"] = max(result["alive_after_step"], _count_alive(refs))
        refs.clear()
    full = step.fsdp.gather_full_params()
    result["param_err"] = max((full[n] - p).abs().max().item() for n, p in reference.named_parameters())
    result["names"] = sorted(full) == sorted(n for n, _ in reference.named_parameters())
    result["shard_numels"] = [u.shard.numel() for u in step.fsdp.units]
    result["model_params_on_meta"] = all(p.is_meta for p in step.model.parameters())
    result["final"] = full
    result["offloaded"] = sorted(step.offloaded)
    result["copies_to_host"] = step.offload.copies_to_host if step.offload is not None else 0
    return result


def _train_bf16(rank: int, world: int, seed: int) -> dict:
    reference, opt_ref = _reference(seed)
    step = build_leaderboard_step(_spec(rank, seed, 1, True, dtype="bf16"), "cpu")
    mine = slice(rank * BATCH_PER_RANK, (rank + 1) * BATCH_PER_RANK)
    result = {"loss_rel_err": 0.0, "grad_rel_err": 0.0}
    for tokens, targets in _global_batches(seed, world):
        opt_ref.zero_grad()
        ref_loss = cross_entropy(reference(tokens), targets)
        ref_loss.backward()
        step.tokens, step.targets = tokens[mine], targets[mine]
        loss = _mean_over_ranks(step.run(), world)
        result["loss_rel_err"] = max(result["loss_rel_err"], abs(loss - ref_loss.item()) / ref_loss.item())
        grads = step.fsdp.gather_full_grads()
        got = torch.cat([grads[n].flatten() for n, _ in reference.named_parameters()])
        want = torch.cat([p.grad.flatten() for _, p in reference.named_parameters()])
        result["grad_rel_err"] = max(result["grad_rel_err"], ((got - want).norm() / want.norm()).item())
        opt_ref.step()
    result["lowp_dtypes"] = sorted({str(u.lowp.dtype) for u in step.fsdp.units})
    result["grad_dtypes"] = sorted({str(u.shard.grad.dtype) for u in step.fsdp.units})
    result["lowp_is_cast_of_shard"] = all(torch.equal(u.lowp, u.shard.detach().to(torch.bfloat16))
                                          for u in step.fsdp.units)
    return result


def _baseline_losses(rank: int, world: int, seed: int) -> dict:
    # torch's AdamW, as the baseline's: it decays before the update and adds eps after the bias
    # correction, so after one step cs336sys.optim.AdamW's model gives losses ~2e-5 apart; with
    # torch's the baseline's losses were within 1.1e-7 over the 8 seeds.
    torch.manual_seed(seed)
    reference = build_model(TINY, SEQ)
    opt_ref = torch.optim.AdamW(reference.parameters(), lr=LR, eps=EPS, weight_decay=WD, foreach=True)
    step = build_pytorch_parts_step(_spec(0, seed), "cpu")  # FSDP2 does not broadcast: rank 0's seed everywhere
    mine = slice(rank * BATCH_PER_RANK, (rank + 1) * BATCH_PER_RANK)
    errors = []
    for tokens, targets in _global_batches(seed, world):
        opt_ref.zero_grad()
        ref_loss = cross_entropy(reference(tokens), targets)
        ref_loss.backward()
        opt_ref.step()
        step.tokens, step.targets = tokens[mine], targets[mine]
        errors.append(abs(_mean_over_ranks(step.run(), world) - ref_loss.item()) / ref_loss.item())
    return {"loss_errs": errors}


def _alive_after_drop(rank: int, world: int, seed: int) -> dict:
    """Build each variant, run a step, drop it: its parameters and optimizer state must go with it.
    The leaderboard job runs its configs one after another in one process; anything a dropped step
    leaves alive (a hook held in C++, a cycle through a collective's handle) is taken from the next
    config's memory, which at 8B is a false out-of-memory."""
    import gc

    builders = {"ours": lambda: build_leaderboard_step(_spec(rank, seed), "cpu")}
    if world > 1:
        builders["baseline"] = lambda: build_pytorch_parts_step(_spec(0, seed), "cpu")
    alive = {}
    for name, build in builders.items():
        step = build()
        step.run()
        tensors = [p for group in step.optimizer.param_groups for p in group["params"]]
        tensors += [t for state in step.optimizer.state.values() for t in state.values() if torch.is_tensor(t)]
        refs = [weakref.ref(t) for t in tensors]
        del step, tensors
        gc.collect()
        alive[name] = (len(refs), sum(r() is not None for r in refs))
    return alive


def _all_checks(info, seed: int) -> dict:
    rank, world = info.rank, info.world_size
    results = {f"{policy}/{reshard}": _train_ours(rank, world, seed, policy, reshard) for policy, reshard in CONFIGS}
    for policy, reshard, k in OFFLOADED:
        results[f"{policy}/{reshard}/offload{k}"] = _train_ours(rank, world, seed, policy, reshard, offload_blocks=k)
    results["bf16"] = _train_bf16(rank, world, seed)
    if world > 1:
        results["baseline"] = _baseline_losses(rank, world, seed)
    results["alive_after_drop"] = _alive_after_drop(rank, world, seed)
    return results


@pytest.fixture(scope="module", params=[1, 2], ids=lambda n: f"world{n}")
def spawned(request):
    return spawn_checks(_all_checks, request.param)


@pytest.mark.parametrize("policy,reshard", CONFIGS, ids=[f"{p}-{'reshard' if r else 'keep'}" for p, r in CONFIGS])
def test_fp32_step_matches_single_process_training(spawned, policy, reshard):
    world, per_rank = spawned
    for rank, results in enumerate(per_rank):
        r = results[f"{policy}/{reshard}"]
        assert r["initial_err"] == 0, f"rank {rank}: the shards do not hold rank 0's initial model"
        assert r["names"] and r["model_params_on_meta"], "every parameter sharded; the model keeps no full copy"
        assert r["loss_err"] < FP32_LOSS_TOL, f"rank {rank}: loss off by {r['loss_err']:.3g} (relative)"
        assert r["grad_err"] < FP32_GRAD_TOL, f"rank {rank}: gradients off by {r['grad_err']:.3g} (relative)"
        assert r["param_err"] < FP32_PARAM_TOL, f"rank {rank}: parameters off by {r['param_err']:.3g}"
        assert r["alive_after_step"] == 0, "a gathered buffer outlived the step"


@pytest.mark.parametrize("policy,reshard", CONFIGS, ids=[f"{p}-{'reshard' if r else 'keep'}" for p, r in CONFIGS])
def test_gathers_per_step(spawned, policy, reshard):
    """Every unit once in the forward; with resharding each block once more in the backward (its
    recompute, or the weights its matmuls saved), never the embedding (a lookup saves no weight)
    nor the head (the fused loss saves gradients, ln_final's small weight is copied)."""
    world, per_rank = spawned
    units = TINY.num_layers + 2
    expected = units + (TINY.num_layers if reshard else 0)
    for results in per_rank:
        assert results[f"{policy}/{reshard}"]["gathers"] == [expected] * STEPS


def test_shards_are_even_and_padded(spawned):
    world, per_rank = spawned
    embed = TINY.vocab_size * TINY.d_model
    block = 4 * TINY.d_model**2 + 3 * TINY.d_model * TINY.d_ff + 2 * TINY.d_model
    head = TINY.vocab_size * TINY.d_model + TINY.d_model
    expected = [-(-n // world) for n in [embed] + [block] * TINY.num_layers + [head]]
    assert per_rank[0]["all/True"]["shard_numels"] == expected


def test_bf16_compute_close_to_fp32(spawned):
    _, per_rank = spawned
    for rank, results in enumerate(per_rank):
        r = results["bf16"]
        assert r["lowp_dtypes"] == ["torch.bfloat16"] and r["grad_dtypes"] == ["torch.float32"]
        assert r["lowp_is_cast_of_shard"], "FusedAdamW refreshes each bf16 copy with the updated shard"
        assert r["loss_rel_err"] < BF16_LOSS_REL_TOL, f"rank {rank}: loss off by {r['loss_rel_err']:.3g}"
        assert r["grad_rel_err"] < BF16_GRAD_REL_TOL, f"rank {rank}: gradient off by {r['grad_rel_err']:.3g}"


def test_pytorch_parts_baseline_matches_plain_model(spawned):
    world, per_rank = spawned
    if world == 1:
        pytest.skip("FSDP2 needs a process group; the baseline is checked on 2 ranks")
    for rank, results in enumerate(per_rank):
        errors = results["baseline"]["loss_errs"]
        assert max(errors) < FP32_LOSS_TOL, f"rank {rank}: baseline losses off by {errors} (relative)"


# --- bad input ------------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs,match", [
    ({"attention": "flashy"}, "unknown attention"),
    ({"batch_per_rank": 0}, "batch_per_rank must be a positive"),
    ({"compute_dtype": "fp8"}, "compute_dtype"),
    ({"checkpoint_blocks": 4}, "first k blocks"),
    ({"checkpoint_blocks": (0, 3)}, "outside"),
    ({"checkpoint_blocks": "some"}, "checkpoint_blocks must be"),
    ({"size": "enormous"}, "unknown model size"),
])
def test_bad_spec_is_a_clear_error(kwargs, match):
    with pytest.raises(ValueError, match=match):
        LeaderboardSpec(**{"size": TINY, "context_length": SEQ, **kwargs})


def test_policies():
    assert checkpointed_blocks("all", 3) == {0, 1, 2} and checkpointed_blocks("none", 3) == set()
    assert checkpointed_blocks(2, 3) == {0, 1} and checkpointed_blocks((2,), 3) == {2}


def test_world_size_that_does_not_match():
    spec = LeaderboardSpec(size=TINY, context_length=SEQ, attention="naive", compute_dtype="fp32", world_size=2)
    with pytest.raises(ValueError, match="asks for 2 ranks but the process group has 1"):
        build_leaderboard_step(spec, "cpu")


def test_baseline_without_process_group():
    with pytest.raises(ValueError, match="needs a process group"):
        build_pytorch_parts_step(LeaderboardSpec(size=TINY, context_length=SEQ, compute_dtype="fp32"), "cpu")


def _point_on_cpu(info, variant: str) -> dict:
    settings = LeaderboardSettings(size="tiny", context_length=SEQ, variant=variant, compute_dtype="fp32",
                                   attention="naive", checkpoint_blocks=1, warmup=1, device="cpu")
    return run_leaderboard_point(settings, Run(device="cpu", rank=info.rank, world_size=info.world_size,
                                               backend=info.backend))


@pytest.mark.parametrize("variant", ["ours", "pytorch_parts"])
def test_leaderboard_point_runs_on_two_gloo_ranks(variant):
    """The point's code path end to end on the CPU (no do_bench, no allocator readings there)."""
    per_rank = spawn(_point_on_cpu, 2, variant, timeout_s=120, pg_timeout_s=30)
    for r in per_rank:
        assert len(r["step_ms"]) == 5 and r["mean_ms"] > 0 and r["world_size"] == 2
        assert r["step_ms"] == per_rank[0]["step_ms"], "a step's time is the slowest rank's"
        assert {"forward", "backward", "optimizer_step"} <= set(r["phases"])
        assert r["communication_not_overlapped_ms"] >= 0 and r["wall_s_to_end_of_timing"] > 0
        assert "do_bench_ms" not in r and "mfu" not in r


def test_leaderboard_point_needs_two_ranks():
    with pytest.raises(ValueError, match="needs a process group of 2 ranks"):
        run_leaderboard_point(LeaderboardSettings(size="tiny", context_length=SEQ, device="cpu"), Run())
    with pytest.raises(ValueError, match="steps must be at least 5"):
        LeaderboardSettings(steps=3)


def test_a_dropped_step_frees_its_parameters_and_optimizer_state(spawned):
    world, per_rank = spawned
    for rank, results in enumerate(per_rank):
        for variant, (tracked, alive) in results["alive_after_drop"].items():
            assert tracked > 0 and alive == 0, f"rank {rank}, {variant}: {alive} of {tracked} tensors outlive the step"


@pytest.mark.parametrize("policy,reshard,k", OFFLOADED, ids=[f"{p}-{'reshard' if r else 'keep'}-offload{k}"
                                                             for p, r, k in OFFLOADED])
def test_offloaded_blocks_train_exactly_as_recomputed_ones(spawned, policy, reshard, k):
    """A block whose saved tensors wait in host memory computes what it computes when it is recomputed:
    the parameters after 3 steps are bitwise those of the same policy without offloading, and match the
    single-process reference. Its weights stay views of the gathered buffer (the unit's own hook runs
    first), so the gathers per step are unchanged."""
    world, per_rank = spawned
    units = TINY.num_layers + 2
    for rank, results in enumerate(per_rank):
        r, plain = results[f"{policy}/{reshard}/offload{k}"], results[f"{policy}/{reshard}"]
        assert r["offloaded"] == sorted(checkpointed_blocks(policy, TINY.num_layers))[:k]
        assert r["copies_to_host"] > 0, "nothing was sent to host memory"
        assert r["loss_err"] < FP32_LOSS_TOL and r["grad_err"] < FP32_GRAD_TOL and r["param_err"] < FP32_PARAM_TOL
        for name, value in plain["final"].items():
            assert torch.equal(r["final"][name], value), f"rank {rank}: {name} differs from the recomputed run's"
        assert r["gathers"] == [units + (TINY.num_layers if reshard else 0)] * STEPS
        assert r["alive_after_step"] == 0, "a gathered buffer outlived the step"


@pytest.mark.parametrize("kwargs,match", [({"checkpoint_blocks": 1, "offload_blocks": 2}, "offload_blocks=2"),
                                         ({"checkpoint_blocks": "none", "offload_blocks": 1}, "offload_blocks=1"),
                                         ({"offload_blocks": -1}, "offload_blocks=-1"),
                                         ({"offload_blocks": True}, "offload_blocks=True")])
def test_offloading_more_blocks_than_are_checkpointed_is_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        LeaderboardSpec(size=TINY, context_length=SEQ, **kwargs)


def test_the_first_checkpointed_blocks_are_the_offloaded_ones():
    spec = LeaderboardSpec(size=TINY, context_length=SEQ, checkpoint_blocks=(1, 2), offload_blocks=1)
    assert spec.block_policy() == (frozenset({2}), frozenset({1}))
    assert LeaderboardSpec(size=TINY, context_length=SEQ).block_policy() == (frozenset({0, 1, 2}), frozenset())
