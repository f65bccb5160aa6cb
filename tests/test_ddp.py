"""DDP wrappers against single-process training, on 2 and 3 gloo ranks on the CPU.

Each rank trains on its slice of a global batch; a reference model trains on the whole batch in
one process (mean losses, so the averaged gradient is the full-batch gradient). Every variant must
give the reference's gradients (None where the reference has None) and parameters at every step.
One spawn per world size runs every variant and check; the tests below read its results.
"""

from __future__ import annotations

import contextlib
import math
import time

import pytest
import torch
import torch.distributed as dist
from conftest import spawn_checks
from torch import nn

from cs336sys.distributed.ddp import BucketedDDP, FlatDDP, NaiveDDP, OverlappedDDP, build_ddp
from cs336sys.distributed.ddp_base import plan_buckets
from cs336sys.distributed.spawn import RankFailed, spawn
from cs336sys.units import MIB

IN, HIDDEN, OUT = 6, 12, 3
BATCH_PER_RANK = 4
STEPS = 4
MATRIX_BYTES = HIDDEN * HIDDEN * 4
# fp32 on the CPU: the only difference from the reference is the order of summation (observed: gradients
# 1e-6, parameters 6e-6 after AdamW steps of 1e-2). A wrong None or a missing average moves parameters by 1e-4+.
GRAD_TOL, PARAM_TOL = 1e-5, 5e-5
BF16_REL_TOL = 2e-2  # all gradients (or parameters) together: bf16 matmuls of a slice and of the batch round
# differently (observed up to ~6e-3)


class ToyNet(nn.Module):
    """Every awkward kind of state a DDP wrapper meets: a parameter never used (registered first,
    so its gradient group is issued last), a frozen weight, a weight tied between two layers, a
    layer used only for examples whose gate is set (so a rank may have no gradient for it), and a
    buffer."""

    def __init__(self):
        super().__init__()
        self.unused = nn.Linear(HIDDEN, HIDDEN)
        self.inp = nn.Linear(IN, HIDDEN)
        self.hidden = nn.Linear(HIDDEN, HIDDEN)
        self.frozen = nn.Linear(HIDDEN, HIDDEN)
        self.frozen.weight.requires_grad_(False)
        self.tied = nn.Linear(HIDDEN, HIDDEN)
        self.tied.weight = self.hidden.weight
        self.gated = nn.Linear(HIDDEN, HIDDEN, bias=False)
        self.head = nn.Linear(HIDDEN, OUT)
        self.register_buffer("scale", torch.rand(HIDDEN) + 0.5)

    def forward(self, x: torch.Tensor, gate: torch.Tensor | None = None) -> torch.Tensor:
        h = torch.relu(self.hidden(torch.relu(self.inp(x))))
        h = torch.tanh(self.tied(self.frozen(h))) * self.scale
        if gate is not None and bool(gate.any()):
            rows = gate.nonzero().squeeze(1)
            h = h.index_add(0, rows, self.gated(h[rows]).to(h.dtype))
        return self.head(h)


def gate_schedule(step: int, world: int, micro: int, g: torch.Generator) -> torch.Tensor:
    """Gates of a global batch laid out [rank][micro-batch][example]: random, then only rank 0's
    first micro-batch (other ranks get no gradient for `gated`), then none (no rank does)."""
    shape = (world, micro, BATCH_PER_RANK)
    kind = step % 3
    if kind == 0:
        return torch.rand(shape, generator=g) < 0.5
    gate = torch.zeros(shape, dtype=torch.bool)
    if kind == 1:
        gate[0, 0, 0] = True
    return gate


def make_optimizer(name: str, params) -> torch.optim.Optimizer:
    from cs336sys.optim import AdamW

    # Weight decay shows a parameter wrongly given a zero gradient instead of None: it would move.
    if name == "adamw":
        return AdamW(params, lr=1e-2, weight_decay=0.1)
    return torch.optim.SGD(params, lr=0.05, momentum=0.9, weight_decay=0.1)


def train_against_reference(wrap, optimizer: str, rank: int, world: int, seed: int, *, micro: int = 1,
                            autocast: bool = False, before_batch=None, after_backward=None) -> dict:
    """Train a wrapped ToyNet on this rank's slices and a reference on the whole batches; return
    the worst gradient and parameter differences, where grad None-ness disagreed, and how many
    gradient groups started during backward."""
    torch.manual_seed(seed + 1 + rank)  # different initial weights on every rank: the wrapper must broadcast
    ddp = wrap(ToyNet())
    reference = ToyNet()
    reference.load_state_dict(ddp.module.state_dict())
    opt, ref_opt = make_optimizer(optimizer, ddp.parameters()), make_optimizer(optimizer, reference.parameters())
    data = torch.Generator().manual_seed(seed)  # the same global batches on every rank
    loss_fn = nn.MSELoss()
    context = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if autocast else torch.enable_grad
    report = {"grad_err": 0.0, "param_err": 0.0, "none_mismatch": [], "overlapped": 0, "grad_dtypes": set(),
              "all_reduces": set()}
    for step in range(STEPS):
        x = torch.randn(world, micro, BATCH_PER_RANK, IN, generator=data)
        y = torch.randn(world, micro, BATCH_PER_RANK, OUT, generator=data)
        gate = gate_schedule(step, world, micro, data)
        if before_batch:
            before_batch(ddp, opt)
        for m in range(micro):  # micro-batches before the last accumulate locally
            sync = ddp.no_sync() if m < micro - 1 else torch.enable_grad()
            with sync, context(), count_all_reduces() as calls:
                (loss_fn(ddp(x[rank, m], gate=gate[rank, m]), y[rank, m]) / micro).backward()
                if after_backward:  # inside no_sync() this must do nothing
                    after_backward(ddp, opt)
            report["all_reduces"].add(calls[0] if m == micro - 1 else -calls[0])  # negative: under no_sync
        report["overlapped"] = max(report["overlapped"], getattr(ddp, "groups_launched_in_backward", 0))
        with context():
            loss_fn(reference(x.reshape(-1, IN), gate=gate.reshape(-1)), y.reshape(-1, OUT)).backward()
        grads, ref_grads = [], []
        for (name, p), q in zip(ddp.module.named_parameters(), reference.parameters(), strict=True):
            if (p.grad is None) != (q.grad is None):
                report["none_mismatch"].append((step, name, p.grad is None))
            elif p.grad is not None:
                report["grad_dtypes"].add(str(p.grad.dtype))
                grads.append(p.grad)
                ref_grads.append(q.grad)
        report["grad_err"] = max(report["grad_err"], _error(grads, ref_grads, autocast))
        opt.step()
        ref_opt.step()
        opt.zero_grad(set_to_none=True)
        ref_opt.zero_grad(set_to_none=True)
        state = list(ddp.module.state_dict().values()), list(reference.state_dict().values())
        report["param_err"] = max(report["param_err"], _error(*state, autocast))
    report["tied"] = ddp.module.tied.weight is ddp.module.hidden.weight
    return report


def train_transformer_against_reference(wrap, rank: int, world: int, seed: int, steps: int = 2) -> dict:
    """Our Transformer LM ("tiny") instead of the toy: worst parameter difference after AdamW steps."""
    from cs336sys.model import build_model
    from cs336sys.optim import AdamW, cross_entropy

    context, vocab = 16, 10_000
    torch.manual_seed(seed + 1 + rank)
    ddp = wrap(build_model("tiny", context))
    reference = build_model("tiny", context)
    reference.load_state_dict(ddp.module.state_dict())
    opt, ref_opt = AdamW(ddp.parameters(), lr=1e-3), AdamW(reference.parameters(), lr=1e-3)
    data = torch.Generator().manual_seed(seed)
    overlapped = 0
    for _ in range(steps):
        tokens = torch.randint(0, vocab, (world, 2, context + 1), generator=data)
        mine = tokens[rank]
        cross_entropy(ddp(mine[:, :-1]), mine[:, 1:]).backward()
        ddp.finish_gradient_synchronization()
        overlapped = max(overlapped, ddp.groups_launched_in_backward)
        everyone = tokens.reshape(-1, context + 1)
        cross_entropy(reference(everyone[:, :-1]), everyone[:, 1:]).backward()
        for o in (opt, ref_opt):
            o.step()
            o.zero_grad()
    state = list(ddp.module.state_dict().values()), list(reference.state_dict().values())
    return {"param_err": _error(*state, relative=False), "overlapped": overlapped,
            "groups": len(ddp.gradient_groups)}


@contextlib.contextmanager
def count_all_reduces():
    """Count the all-reduces issued inside the block (into a one-element list)."""
    original, calls = dist.all_reduce, [0]

    def counted(*args, **kwargs):
        calls[0] += 1
        return original(*args, **kwargs)

    dist.all_reduce = counted
    try:
        yield calls
    finally:
        dist.all_reduce = original


def _error(ours: list[torch.Tensor], reference: list[torch.Tensor], relative: bool) -> float:
    """Largest absolute difference, or (relative) the norm of the difference of all the tensors
    together over the reference's norm: bf16 rounding makes single small tensors noisy."""
    from cs336sys.numerics import rel_err

    if not ours:
        return 0.0
    if relative:
        return rel_err(torch.cat([t.flatten() for t in ours]), torch.cat([t.flatten() for t in reference]))
    return max((a - b).abs().max().item() for a, b in zip(ours, reference, strict=True))


def _variants() -> dict:
    """name -> wrapper constructor; bucket sizes below one parameter, between, and above the model."""
    return {
        "naive": NaiveDDP,
        "flat": FlatDDP,
        "overlap": OverlappedDDP,
        "bucketed_tiny": lambda m: BucketedDDP(m, bucket_size_mb=8 / MIB),  # 8 bytes: below every parameter
        "bucketed_mid": lambda m: BucketedDDP(m, bucket_size_mb=2.5 * MATRIX_BYTES / MIB),
        "bucketed_huge": lambda m: BucketedDDP(m, bucket_size_mb=100.0),
    }


def _adapter_variants() -> dict:
    """The course's adapters driving the course's loop (batch start, after-backward calls)."""
    from cs336sys import adapters as a

    return {
        "adapter_individual": (a.get_ddp_individual_parameters, None, a.ddp_individual_parameters_on_after_backward),
        "adapter_bucketed": (lambda m: a.get_ddp_bucketed(m, 2.5 * MATRIX_BYTES / MIB),
                             a.ddp_bucketed_on_train_batch_start, a.ddp_bucketed_on_after_backward),
        "adapter_2026": (a.get_ddp, None, a.ddp_on_after_backward),
    }


def _all_checks(info, seed: int) -> dict:
    """Everything one spawn checks, on every rank."""
    rank, world = info.rank, info.world_size
    results: dict = {}

    torch.manual_seed(seed + 1 + rank)
    model = ToyNet()
    # Plain lists: tensors sent through spawn's pipe would point at shared memory of an exited process.
    before = {k: v.tolist() for k, v in model.state_dict().items()}
    wrapped = NaiveDDP(model)
    results["broadcast"] = (before, {k: v.tolist() for k, v in wrapped.module.state_dict().items()})

    def synchronise_after_backward(ddp, opt):
        ddp.finish_gradient_synchronization()

    for name, wrap in _variants().items():
        for optimizer in ("adamw", "sgd"):
            results[f"{name}/{optimizer}"] = train_against_reference(
                wrap, optimizer, rank, world, seed, after_backward=synchronise_after_backward)
        # three micro-batches, the first two under no_sync(): one big batch
        results[f"{name}/no_sync"] = train_against_reference(
            wrap, "adamw", rank, world, seed, micro=3, after_backward=synchronise_after_backward)
    for name in ("overlap", "bucketed_mid"):
        results[f"{name}/bf16"] = train_against_reference(
            _variants()[name], "sgd", rank, world, seed, autocast=True, after_backward=synchronise_after_backward)
    for name, (wrap, before_batch, after_backward) in _adapter_variants().items():
        results[f"{name}/adamw"] = train_against_reference(wrap, "adamw", rank, world, seed,
                                                           before_batch=before_batch, after_backward=after_backward)

    for name in ("overlap", "bucketed_mid"):
        results[f"{name}/transformer"] = train_transformer_against_reference(_variants()[name], rank, world, seed)

    results["mid_buckets"] = len(_variants()["bucketed_mid"](ToyNet()).gradient_groups)

    # Two backward passes without synchronising in between is a usage error, said at once.
    torch.manual_seed(seed)
    ddp = OverlappedDDP(ToyNet())
    x = torch.randn(BATCH_PER_RANK, IN)
    ddp(x).sum().backward()
    try:
        ddp(x).sum().backward()
        results["double_backward"] = None
    except RuntimeError as exc:
        results["double_backward"] = str(exc)
    ddp.finish_gradient_synchronization()  # the first backward's all-reduces still complete on every rank
    return results


@pytest.fixture(scope="module", params=[2, 3], ids=lambda n: f"world{n}")
def spawned(request):
    return spawn_checks(_all_checks, request.param)


MATCH_CONFIGS = [f"{v}/{o}" for v in _variants() for o in ("adamw", "sgd", "no_sync")] + [
    f"{a}/adamw" for a in ("adapter_individual", "adapter_bucketed", "adapter_2026")]


@pytest.mark.parametrize("config", MATCH_CONFIGS)
def test_matches_single_process_training(spawned, config):
    _, per_rank = spawned
    for rank, results in enumerate(per_rank):
        r = results[config]
        assert r["none_mismatch"] == [], f"rank {rank}: grad None-ness differs (step, name, ddp None): " \
                                         f"{r['none_mismatch']}"
        assert r["grad_err"] < GRAD_TOL, f"rank {rank}: gradients off by {r['grad_err']:.3g}"
        assert r["param_err"] < PARAM_TOL, f"rank {rank}: parameters off by {r['param_err']:.3g}"
        assert r["tied"]


TRAINABLE = 11  # ToyNet's trainable parameters, the tied weight once, the frozen one not at all
ALL_REDUCES_PER_STEP = {  # gradient groups + the one all-reduce of who-had-a-gradient counts
    "naive": TRAINABLE + 1, "flat": 2, "overlap": TRAINABLE + 1, "bucketed_tiny": TRAINABLE + 1,
    "bucketed_mid": None, "bucketed_huge": 2}


@pytest.mark.parametrize("variant", ALL_REDUCES_PER_STEP)
def test_all_reduces_per_step_and_none_under_no_sync(spawned, variant):
    _, per_rank = spawned
    for results in per_rank:
        expected = ALL_REDUCES_PER_STEP[variant]
        assert results[f"{variant}/adamw"]["all_reduces"] == {expected or results["mid_buckets"] + 1}
        # the no_sync run: two silent micro-batches, then one synchronised
        assert results[f"{variant}/no_sync"]["all_reduces"] == {0, expected or results["mid_buckets"] + 1}


def test_overlapping_variants_start_all_reduces_during_backward(spawned):
    _, per_rank = spawned
    for results in per_rank:
        for config in ("overlap/adamw", "bucketed_tiny/adamw", "bucketed_mid/adamw", "adapter_2026/adamw"):
            assert results[config]["overlapped"] > 0, config
        for config in ("naive/adamw", "flat/adamw"):
            assert results[config]["overlapped"] == 0, config


def test_transformer_matches_single_process_training(spawned):
    _, per_rank = spawned
    for rank, results in enumerate(per_rank):
        for config in ("overlap/transformer", "bucketed_mid/transformer"):
            r = results[config]
            assert r["param_err"] < PARAM_TOL, (rank, config, r)
            # parameters are produced about in reverse registration order: most all-reduces overlap backward
            assert r["overlapped"] > r["groups"] // 2, (rank, config, r)


def test_bf16_autocast_matches_within_tolerance(spawned):
    _, per_rank = spawned
    for rank, results in enumerate(per_rank):
        for config in ("overlap/bf16", "bucketed_mid/bf16"):
            r = results[config]
            assert r["none_mismatch"] == []
            assert r["grad_dtypes"] == {"torch.float32"}, "fp32 parameters get fp32 gradients under autocast"
            assert r["grad_err"] < BF16_REL_TOL and r["param_err"] < BF16_REL_TOL, (rank, config, r)


def test_construction_broadcasts_rank0_parameters_and_buffers(spawned):
    _, per_rank = spawned
    rank0_before = per_rank[0]["broadcast"][0]
    for rank, results in enumerate(per_rank):
        before, after = results["broadcast"]
        assert after == rank0_before, f"rank {rank} does not hold rank 0's initial parameters and buffers"
        if rank:
            assert before["head.weight"] != rank0_before["head.weight"], "ranks began equal: nothing tested"
            assert before["scale"] != rank0_before["scale"]


def test_double_backward_without_finish_is_refused(spawned):
    _, per_rank = spawned
    for results in per_rank:
        assert results["double_backward"] is not None and "became ready twice" in results["double_backward"]


def _fail_in_step(info, failing_rank: int) -> None:
    torch.manual_seed(info.rank)
    ddp = BucketedDDP(ToyNet(), bucket_size_mb=1.0)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for step in range(3):
        if info.rank == failing_rank and step == 1:
            raise ValueError(f"boom in step {step}")
        ddp(torch.randn(BATCH_PER_RANK, IN)).square().mean().backward()
        ddp.finish_gradient_synchronization()  # the other ranks wait here for the failed one
        opt.step()
        opt.zero_grad()


def test_a_failing_rank_fails_the_job_fast_naming_it():
    world = 2
    start = time.monotonic()
    with pytest.raises(RankFailed) as failure:
        spawn(_fail_in_step, world, world - 1, timeout_s=60, pg_timeout_s=20)
    assert failure.value.rank == world - 1
    assert "ValueError: boom in step 1" in str(failure.value)
    assert time.monotonic() - start < 30, "the job waited for a timeout instead of failing at once"


# -- without spawning -------------------------------------------------------------------------


def test_buckets_follow_reverse_order_size_cap_and_dtype():
    params = [torch.empty(n, dtype=dt) for n, dt in
              [(10, torch.float32), (300, torch.float32), (20, torch.float32), (30, torch.float32),
               (5, torch.bfloat16), (5, torch.bfloat16), (8, torch.float32)]]
    # 8 fp32, then the bf16 pair, then 30+20 fp32 (200 bytes), 300 fp32 alone (over the cap), 10 fp32
    assert plan_buckets(params, cap_bytes=200) == [[6], [5, 4], [3, 2], [1], [0]]
    assert plan_buckets(params, cap_bytes=0) == [[i] for i in reversed(range(7))]
    assert plan_buckets(params, cap_bytes=math.inf) == [[6], [5, 4], [3, 2, 1, 0]]
    with pytest.raises(ValueError):
        plan_buckets(params, cap_bytes=-1)


def test_bucket_contents_skip_frozen_and_count_tied_once():
    model = ToyNet()  # no process group here: the wrapper builds its groups but never communicates
    groups = BucketedDDP(model, bucket_size_mb=100.0).gradient_groups
    assert len(groups) == 1
    flat = groups[0]
    assert len(flat) == len({id(p) for p in flat}) == TRAINABLE
    assert all(p is not model.frozen.weight for p in flat)
    per_param = OverlappedDDP(model).gradient_groups
    assert [g[0] for g in per_param] == [p for p in model.parameters() if p.requires_grad][::-1]


def test_without_a_process_group_the_wrapper_changes_nothing():
    for variant in ("naive", "flat", "overlap", "bucketed"):
        model = ToyNet()
        ddp = build_ddp(variant, model, bucket_size_mb=1.0 if variant == "bucketed" else None)
        x = torch.randn(BATCH_PER_RANK, IN)
        torch.testing.assert_close(ddp(x, gate=torch.ones(BATCH_PER_RANK, dtype=torch.bool)),
                                   model(x, gate=torch.ones(BATCH_PER_RANK, dtype=torch.bool)))
        ddp(x).sum().backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        ddp.finish_gradient_synchronization()
        assert {n: p.grad for n, p in model.named_parameters() if p.grad is not None}.keys() == grads.keys()
        for n, p in model.named_parameters():
            if p.grad is not None:
                torch.testing.assert_close(p.grad, grads[n], rtol=0, atol=0)


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="bucket_size_mb"):
        BucketedDDP(ToyNet(), bucket_size_mb=-1)
    with pytest.raises(ValueError, match="unknown DDP variant"):
        build_ddp("ring", ToyNet())
    with pytest.raises(ValueError, match="needs bucket_size_mb"):
        build_ddp("bucketed", ToyNet())


def _dropped_wrappers_free_their_models(world: int) -> dict[str, bool]:
    """Build, train one step and drop each wrapper (and FSDP); report which models outlive it."""
    import gc
    import weakref

    from cs336sys.distributed.fsdp import FSDP

    alive = {}
    for name in ("naive", "flat", "overlap", "bucketed", "fsdp"):
        model = nn.Sequential(nn.Linear(16, 16), nn.LayerNorm(16), nn.Linear(16, 4))
        if name == "fsdp":
            wrapper = FSDP(model)
        else:
            wrapper = build_ddp(name, model, 0.001 if name == "bucketed" else None)
        wrapper(torch.randn(4, 16)).sum().backward()
        if name != "fsdp":
            wrapper.finish_gradient_synchronization()
        ref = weakref.ref(model)
        del model, wrapper
        gc.collect()
        alive[name] = ref() is not None
    return alive


def test_a_dropped_wrapper_does_not_keep_its_model_alive():
    # Gradient hooks are held by autograd in C++, out of the garbage collector's sight: a hook that
    # holds its wrapper kept a whole model per point alive in one job (out of memory on the GPU).
    for alive in spawn(_dropped_wrappers_free_their_models, 2, timeout_s=120, pg_timeout_s=30):
        assert not any(alive.values()), alive
