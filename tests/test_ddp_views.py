"""The gradient-as-bucket-view DDP wrapper (issue 24) against single-process training on 2 gloo ranks,
with the toy of tests/test_ddp.py (unused, frozen, tied and sometimes-used parameters, no_sync), and
its promise of no tensor work per step beyond the all-reduces: gradients stay in the buckets."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
from conftest import spawn_checks
from test_ddp import (
    BATCH_PER_RANK,
    BF16_REL_TOL,
    GRAD_TOL,
    IN,
    MATRIX_BYTES,
    PARAM_TOL,
    TRAINABLE,
    ToyNet,
    train_against_reference,
    train_transformer_against_reference,
)
from torch.utils._python_dispatch import TorchDispatchMode

from cs336sys.distributed.ddp_views import BucketViewDDP
from cs336sys.units import MIB

BUCKETS = {"per_param": 0.0, "mid": 2.5 * MATRIX_BYTES / MIB, "huge": 100.0}


def _wrapper(mb: float):
    return lambda m: BucketViewDDP(m, bucket_size_mb=mb)


class OpLog(TorchDispatchMode):
    """Names of the tensor operations run inside the block."""

    def __init__(self):
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func.overloadpacket.__name__))
        return func(*args, **(kwargs or {}))


class _LoggedHooks(BucketViewDDP):
    """The wrapper with every hook call's tensor operations logged (autograd's own work is not)."""

    hook_ops: list[str]

    def _on_gradient_ready(self, index, param):
        log = OpLog()
        with log:
            super()._on_gradient_ready(index, param)
        self.hook_ops.extend(log.ops)


def _steady_state(info, seed: int) -> dict:
    """Train a few steps zeroing gradients in place (set_to_none=False); record the gradients' storage
    after each step and the tensor operations the hooks and finish_gradient_synchronization() run."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(IN, 8), torch.nn.ReLU(), torch.nn.Linear(8, 8),
                                torch.nn.ReLU(), torch.nn.Linear(8, 3))
    ddp = _LoggedHooks(model, bucket_size_mb=200 / MIB)  # several buckets of a few parameters
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    pointers, hook_ops, finish_ops = [], [], []
    for _ in range(4):
        ddp.hook_ops = []
        ddp(torch.randn(BATCH_PER_RANK, IN)).square().mean().backward()
        log = OpLog()
        with log:
            ddp.finish_gradient_synchronization()
        hook_ops.append(ddp.hook_ops)
        finish_ops.append(log.ops)
        pointers.append([p.grad.data_ptr() for p in model.parameters()])
        opt.step()
        opt.zero_grad(set_to_none=False)
    return {"pointers": pointers, "hook_ops": hook_ops, "finish_ops": finish_ops,
            "buckets": len(ddp.gradient_groups),
            "views": all(p.grad.data_ptr() == v.data_ptr() for p, v in zip(ddp._params, ddp._views, strict=True))}


def _all_checks(info, seed: int) -> dict:
    rank, world = info.rank, info.world_size
    results: dict = {}

    def synchronise(ddp, opt):
        ddp.finish_gradient_synchronization()

    for name, mb in BUCKETS.items():
        results[f"{name}/adamw"] = train_against_reference(_wrapper(mb), "adamw", rank, world, seed,
                                                           after_backward=synchronise)
        results[f"{name}/no_sync"] = train_against_reference(_wrapper(mb), "adamw", rank, world, seed, micro=3,
                                                             after_backward=synchronise)
    results["mid/sgd"] = train_against_reference(_wrapper(BUCKETS["mid"]), "sgd", rank, world, seed,
                                                 after_backward=synchronise)
    results["mid/bf16"] = train_against_reference(_wrapper(BUCKETS["mid"]), "sgd", rank, world, seed, autocast=True,
                                                  after_backward=synchronise)
    results["mid/transformer"] = train_transformer_against_reference(_wrapper(BUCKETS["mid"]), rank, world, seed)
    results["steady"] = _steady_state(info, seed)

    # Two backward passes without synchronising in between is a usage error, said at once.
    ddp = BucketViewDDP(ToyNet(), bucket_size_mb=BUCKETS["mid"])
    x = torch.randn(BATCH_PER_RANK, IN)
    ddp(x).sum().backward()
    try:
        ddp(x).sum().backward()
        results["double_backward"] = None
    except RuntimeError as exc:
        results["double_backward"] = str(exc)
    ddp.finish_gradient_synchronization()

    # The hooks hold the wrapper weakly: a dropped wrapper frees its model.
    model = ToyNet()
    ddp = BucketViewDDP(model, bucket_size_mb=BUCKETS["mid"])
    ddp(x).sum().backward()
    ddp.finish_gradient_synchronization()
    ref = weakref.ref(model)
    del model, ddp
    gc.collect()
    results["model_freed"] = ref() is None
    return results


@pytest.fixture(scope="module")
def spawned():
    return spawn_checks(_all_checks, 2)


@pytest.mark.parametrize("config", [f"{b}/{o}" for b in BUCKETS for o in ("adamw", "no_sync")] + ["mid/sgd"])
def test_matches_single_process_training(spawned, config):
    _, per_rank = spawned
    for rank, results in enumerate(per_rank):
        r = results[config]
        assert r["none_mismatch"] == [], f"rank {rank}: grad None-ness differs: {r['none_mismatch']}"
        assert r["grad_err"] < GRAD_TOL, f"rank {rank}: gradients off by {r['grad_err']:.3g}"
        assert r["param_err"] < PARAM_TOL, f"rank {rank}: parameters off by {r['param_err']:.3g}"
        assert r["tied"]


def test_all_reduces_per_step_and_none_under_no_sync(spawned):
    _, per_rank = spawned
    for results in per_rank:
        # buckets + the counts; nothing under no_sync()
        assert results["per_param/adamw"]["all_reduces"] == {TRAINABLE + 1}
        assert results["huge/adamw"]["all_reduces"] == {2}
        assert results["per_param/no_sync"]["all_reduces"] == {0, TRAINABLE + 1}
        assert results["mid/adamw"]["overlapped"] > 0, "no bucket started during backward"


def test_transformer_matches_single_process_training(spawned):
    _, per_rank = spawned
    for rank, results in enumerate(per_rank):
        r = results["mid/transformer"]
        assert r["param_err"] < PARAM_TOL, (rank, r)
        assert r["overlapped"] > r["groups"] // 2, (rank, r)


def test_bf16_autocast_matches_within_tolerance(spawned):
    _, per_rank = spawned
    for rank, results in enumerate(per_rank):
        r = results["mid/bf16"]
        assert r["none_mismatch"] == [] and r["grad_dtypes"] == {"torch.float32"}
        assert r["grad_err"] < BF16_REL_TOL and r["param_err"] < BF16_REL_TOL, (rank, r)


def test_gradients_stay_in_the_buckets_and_steps_allocate_nothing(spawned):
    _, per_rank = spawned
    for results in per_rank:
        s = results["steady"]
        assert s["buckets"] > 1
        assert s["views"], "a synchronised gradient is not its bucket view"
        assert all(p == s["pointers"][0] for p in s["pointers"]), "gradient storage moved between steps"
        # the first step copies autograd's fresh gradients into the buckets; after that the hooks do no
        # tensor work but start the all-reduces
        assert "copy_" in s["hook_ops"][0]
        for ops in s["hook_ops"][1:]:
            assert set(ops) <= {"allreduce_"}, ops
        for ops in s["finish_ops"]:
            # the counts' fill and the in-place average: no empty/cat/clone/copy
            assert set(ops) <= {"allreduce_", "wait", "fill_", "_foreach_div_"}, ops


def test_double_backward_is_refused_and_a_dropped_wrapper_frees_its_model(spawned):
    _, per_rank = spawned
    for results in per_rank:
        assert results["double_backward"] is not None and "became ready twice" in results["double_backward"]
        assert results["model_freed"]


def test_bad_arguments_and_no_group():
    with pytest.raises(ValueError, match="bucket_size_mb"):
        BucketViewDDP(ToyNet(), bucket_size_mb=-1)
    model = ToyNet()
    ddp = BucketViewDDP(model, bucket_size_mb=1.0)  # no process group: the wrapper changes nothing
    assert "module.scale" in ddp.state_dict()  # nn.Module's own registries left alone
    ddp(torch.randn(BATCH_PER_RANK, IN)).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    ddp.finish_gradient_synchronization()
    for n, p in model.named_parameters():
        if p.grad is not None:
            torch.testing.assert_close(p.grad, grads[n], rtol=0, atol=0)


def test_single_rank_proxy_runs_the_wrapper_in_a_group_of_one():
    """World size 1 (the one-GPU proxy; here gloo): the experiment makes a group of one, so the hooks
    and all-reduces run as on several ranks; without the proxy flag one rank is refused."""
    import torch.distributed as dist
    from conftest import run_experiment

    from cs336sys.distributed.experiments import run_ddp_step_point
    from cs336sys.jobs import Unsupported

    point = dict(size="tiny", variant="bucket_view", bucket_size_mb=0.01, context_length=16, batch_size=2, warmup=1,
                 steps=2, series="host")
    m = run_experiment(run_ddp_step_point, **point, single_rank_proxy=True)
    assert m["world_size"] == 1 and m["backend"] == "gloo" and not dist.is_initialized()
    assert m["all_reduces_per_step"] == m["launched_in_backward"] > 1
    with pytest.raises(Unsupported, match="at least 2 ranks"):
        run_experiment(run_ddp_step_point, **point)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("variant, mb", [("bucket_view", 0.0), ("bucket_view", 25.0), ("overlap", None),
                                         ("torch_ddp", 25.0)])
def test_single_rank_proxy_on_nccl(variant, mb):
    """The one-GPU proxy as the overlay's jobs run it: NCCL in a group of one, every wrapper."""
    from conftest import run_experiment

    from cs336sys.distributed.experiments import run_ddp_step_point

    m = run_experiment(run_ddp_step_point, "cuda", size="tiny", variant=variant, bucket_size_mb=mb,
                       context_length=32, batch_size=2, warmup=1, steps=2, series="host", single_rank_proxy=True)
    assert m["world_size"] == 1 and m["backend"] == "nccl"
    if variant != "torch_ddp":
        assert m["all_reduces_per_step"] == m["launched_in_backward"] > 0
