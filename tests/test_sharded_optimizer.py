"""ShardedOptimizer against the unsharded optimizer, on 2 and 3 gloo ranks on the CPU.

Every rank trains the same model on the same data (the sharded optimizer is independent of how
gradients were averaged), so sharded and unsharded steps do the same arithmetic on the same
tensors: parameters must agree to float rounding at every step. A parameter group is added after
construction, with its own learning rate, after a scheduler has changed the learning rates. One spawn per
world size runs every optimizer three times with fresh data; the tests read its results.
"""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import spawn_checks
from torch import nn

from cs336sys import adapters
from cs336sys.distributed.sharded_optimizer import ShardedOptimizer, assign_to_ranks

ITERATIONS = 3
STEPS = 5
LATE_GROUP_STEP = 2  # the step before which the late parameter group is added

# name -> (optimizer class path, kwargs); classes are resolved inside the ranks
OPTIMIZERS: dict[str, tuple[str, dict]] = {
    "ours_adamw": ("cs336sys.optim.AdamW", dict(lr=1e-2, weight_decay=0.1)),
    "torch_adamw": ("torch.optim.AdamW", dict(lr=1e-2, weight_decay=0.1)),
    "sgd_momentum": ("torch.optim.SGD", dict(lr=5e-2, momentum=0.9)),
}
STATE_TENSORS = {"ours_adamw": 2, "torch_adamw": 2, "sgd_momentum": 1}  # per parameter, besides `step`


def _optimizer_class(path: str) -> type[torch.optim.Optimizer]:
    module, name = path.rsplit(".", 1)
    return getattr(__import__(module, fromlist=[name]), name)


def _model() -> nn.Module:
    """Parameters of many sizes (weights, biases) so placement has something to balance."""
    return nn.Sequential(nn.Linear(8, 24), nn.ReLU(), nn.Linear(24, 16), nn.ReLU(), nn.Linear(16, 4, bias=False),
                         nn.Linear(4, 3))


def _loss(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return model(x).pow(2).mean()


def _train_one(rank: int, world: int, name: str, seed: int) -> dict:
    cls_path, kwargs = OPTIMIZERS[name]
    cls = _optimizer_class(cls_path)
    torch.manual_seed(seed)  # the same model and data on every rank
    model = _model()
    reference = copy.deepcopy(model)
    early = lambda m: [p for layer in list(m)[:-1] for p in layer.parameters()]
    late = lambda m: list(m[-1].parameters())

    sharded = ShardedOptimizer(early(model), cls, **kwargs)
    unsharded = cls(early(reference), **kwargs)
    schedulers = [torch.optim.lr_scheduler.LambdaLR(o, lambda s: 1 / (1 + s)) for o in (sharded, unsharded)]
    param_err = 0.0
    for step in range(STEPS):
        if step == LATE_GROUP_STEP:
            sharded.add_param_group({"params": late(model), "lr": 2e-2})
            unsharded.add_param_group({"params": late(reference), "lr": 2e-2})
        x = torch.randn(16, 8)
        for m, opt in ((model, sharded), (reference, unsharded)):
            opt.zero_grad()
            _loss(m, x).backward()
            opt.step()
        if step < LATE_GROUP_STEP:  # torch's schedulers refuse groups added after them
            for s in schedulers:
                s.step()
        for p, q in zip(model.parameters(), reference.parameters(), strict=True):
            param_err = max(param_err, (p - q).abs().max().item())

    owned = sharded.local_parameters()
    state_numel = sum(v.numel() for s in sharded.local_optimizer.state.values()
                      for k, v in s.items() if isinstance(v, torch.Tensor) and k != "step")
    result = {
        "param_err": param_err,
        "owned_numel": sum(p.numel() for p in owned),
        "state_numel": state_numel,
        "expected_state_numel": STATE_TENSORS[name] * sum(p.numel() for p in owned),
        "state_is_ours_only": set(sharded.local_optimizer.state) == set(owned),
        "wrapper_state_is_local": sharded.state is sharded.local_optimizer.state,
        "owners": [sharded.owner[p] for p in model.parameters()],
        "lrs": [g["lr"] for g in sharded.param_groups] == [g["lr"] for g in unsharded.param_groups],
    }

    # Consolidation onto the last rank (not always 0), compared with the unsharded state_dict.
    to = world - 1
    sharded.consolidate_state_dict(to=to)
    if rank == to:
        result["consolidated"] = _state_dict_diff(sharded.state_dict(), unsharded.state_dict())
    else:
        with pytest.raises(RuntimeError, match="consolidate_state_dict"):
            sharded.state_dict()

    # Loading the full format on every rank, then one more step on both: still equal.
    fresh_model = copy.deepcopy(model)
    fresh = ShardedOptimizer(early(fresh_model), cls, **kwargs)
    fresh.add_param_group({"params": late(fresh_model), "lr": 2e-2})
    fresh.load_state_dict(copy.deepcopy(unsharded.state_dict()))  # as from a file: no shared tensors
    x = torch.randn(16, 8)
    for m, opt in ((fresh_model, fresh), (reference, unsharded)):
        opt.zero_grad()
        _loss(m, x).backward()
        opt.step()
    result["loaded_err"] = max((p - q).abs().max().item()
                               for p, q in zip(fresh_model.parameters(), reference.parameters(), strict=True))
    result["loaded_state_is_ours_only"] = set(fresh.local_optimizer.state) == set(fresh.local_parameters())
    return result


def _state_dict_diff(got: dict, want: dict) -> list[str]:
    """Differences between two optimizer state dicts (empty when equal)."""
    diffs = []
    if len(got["param_groups"]) != len(want["param_groups"]):
        return ["number of param groups"]
    for i, (g, w) in enumerate(zip(got["param_groups"], want["param_groups"], strict=True)):
        if g != w:
            diffs.append(f"group {i}: {g} != {w}")
    if sorted(got["state"]) != sorted(want["state"]):
        diffs.append(f"state indices {sorted(got['state'])} != {sorted(want['state'])}")
    for i in set(got["state"]) & set(want["state"]):
        g, w = got["state"][i], want["state"][i]
        if set(g) != set(w):
            diffs.append(f"state {i} keys {sorted(g)} != {sorted(w)}")
            continue
        for key in g:
            a, b = g[key], w[key]
            same = (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype
                    and a.shape == b.shape and torch.allclose(a, b, rtol=1e-6, atol=1e-7)) or a == b
            if not same:
                diffs.append(f"state {i} {key}")
    return diffs


def _all_checks(info, seed: int) -> dict:
    return {f"{name}/{it}": _train_one(info.rank, info.world_size, name, seed + it)
            for it in range(ITERATIONS) for name in OPTIMIZERS}


@pytest.fixture(scope="module", params=[2, 3], ids=lambda n: f"world{n}")
def spawned(request):
    return spawn_checks(_all_checks, request.param)


CONFIGS = [f"{name}/{it}" for it in range(ITERATIONS) for name in OPTIMIZERS]


@pytest.mark.parametrize("config", CONFIGS)
def test_matches_unsharded_training(spawned, config):
    _, per_rank = spawned
    for rank, results in enumerate(per_rank):
        r = results[config]
        assert r["param_err"] < 1e-6, f"rank {rank}: parameters off by {r['param_err']:.3g}"
        assert r["lrs"], "the scheduler's learning rates reach our param_groups"
        assert r["loaded_err"] < 1e-6, f"rank {rank}: after load_state_dict, off by {r['loaded_err']:.3g}"


@pytest.mark.parametrize("config", CONFIGS)
def test_each_rank_keeps_state_for_its_share_only(spawned, config):
    world, per_rank = spawned
    owners = per_rank[0][config]["owners"]
    assert all(r[config]["owners"] == owners for r in per_rank), "placement differs between ranks"
    assert set(owners) == set(range(world)), "every rank owns something"
    total = sum(r[config]["owned_numel"] for r in per_rank)
    assert total == sum(p.numel() for p in _model().parameters())
    for rank, results in enumerate(per_rank):
        r = results[config]
        assert r["state_is_ours_only"] and r["loaded_state_is_ours_only"] and r["wrapper_state_is_local"]
        assert r["state_numel"] == r["expected_state_numel"], (rank, r["state_numel"], r["expected_state_numel"])
        assert r["owned_numel"] < total / world + 24 * 16, "placement is balanced to within one large tensor"


@pytest.mark.parametrize("config", CONFIGS)
def test_consolidated_state_dict_is_the_unsharded_one(spawned, config):
    world, per_rank = spawned
    assert per_rank[world - 1][config]["consolidated"] == []


def test_placement_is_greedy_largest_first_and_continues_across_groups():
    loads = [0, 0]
    # 100 -> 0, 60 -> 1, 40 -> 1, 7 -> 0 (tie: lowest rank), 5 -> 1
    assert assign_to_ranks([5, 100, 7, 60, 40], loads) == [1, 0, 0, 1, 1]
    assert loads == [107, 105]
    assert assign_to_ranks([3, 3], loads) == [1, 0]  # a later group starts on the lighter rank
    assert loads == [110, 108]


def test_single_process_matches_the_wrapped_optimizer():
    """Without a process group the wrapper (made by the course adapter) owns everything and steps
    like the optimizer it wraps."""
    torch.manual_seed(0)
    model = _model()
    reference = copy.deepcopy(model)
    sharded = adapters.get_sharded_optimizer(model.parameters(), torch.optim.AdamW, lr=1e-2)
    unsharded = torch.optim.AdamW(reference.parameters(), lr=1e-2)
    assert isinstance(sharded, ShardedOptimizer)
    for _ in range(3):
        x = torch.randn(4, 8)
        for m, opt in ((model, sharded), (reference, unsharded)):
            opt.zero_grad()
            _loss(m, x).backward()
            opt.step()
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=0, atol=0)
    sharded.consolidate_state_dict()
    assert _state_dict_diff(sharded.state_dict(), unsharded.state_dict()) == []
    assert sharded.param_groups[0]["betas"] == (0.9, 0.999), "the wrapped class's defaults show in param_groups"
