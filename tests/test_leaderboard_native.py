"""The PyTorch-native step memory-matched to our entry (`cs336sys.leaderboard.native`): FSDP2, SDPA,
torch.compile, fused AdamW and PyTorch's checkpointing API with a per-block policy.

On 2 gloo ranks on the CPU with a tiny model in fp32: each checkpoint policy's loss and gradients
against the plain model trained in one process on the whole batch (torch's AdamW, as the step's), and
the parameters after three steps; the policies' recomputation counted in the backward (SDPA's forward
and the matrix products that each block runs again); the compiled step (Inductor on the CPU) against
the same reference; the experiment's code path end to end. Every check runs on fresh random data (a
seed per session, printed).
"""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
import torch.distributed as dist
from conftest import spawn_checks
from torch.utils._python_dispatch import TorchDispatchMode

from cs336sys.distributed.spawn import spawn
from cs336sys.jobs import Run
from cs336sys.leaderboard.experiments import LeaderboardSettings, run_leaderboard_point
from cs336sys.leaderboard.native import (
    NativeOptions,
    block_policies,
    build_pytorch_native_step,
    plain_name,
    wrap_blocks,
)
from cs336sys.leaderboard.step import LeaderboardSpec
from cs336sys.model import build_model
from cs336sys.optim import cross_entropy
from cs336sys.sizes import ModelSize

TINY = ModelSize("native-test", d_model=32, d_ff=64, num_layers=4, num_heads=4, vocab_size=64, batch_size=2)
SEQ, BATCH_PER_RANK, STEPS, CHUNK = 16, 2, 3, 8  # 32 tokens a rank: the loss runs 4 chunks
LR, EPS, WD = 1e-3, 1e-6, 0.1
# (checkpoint_blocks, checkpoint_saves, matmul_blocks) -> the blocks' policies, every kind among them
POLICIES = {
    ("all", "nothing", 0): ["recompute"] * 4,
    (2, "nothing", 0): ["recompute", "recompute", "kept", "kept"],
    (3, "attention", 1): ["save_attention", "save_attention", "save_matmuls", "kept"],
    ("all", "attention", 4): ["save_matmuls"] * 4,
    ("none", "nothing", 0): ["kept"] * 4,
}
# fp32 on both sides: the differences are the order of summation (the loss in chunks, gradients
# averaged over ranks), as in test_leaderboard_step.py, whose bounds these are.
FP32_LOSS_TOL = 1e-5
FP32_GRAD_TOL = 5e-5
FP32_PARAM_TOL = 1e-5

_aten = torch.ops.aten
SDPA_FORWARD = _aten._scaled_dot_product_flash_attention_for_cpu.default
SDPA_BACKWARD = _aten._scaled_dot_product_flash_attention_for_cpu_backward.default


class _Count(TorchDispatchMode):
    """How often the backward runs SDPA's forward and backward and the matrix products."""

    def __init__(self):
        super().__init__()
        self.counts = {"sdpa_forward": 0, "sdpa_backward": 0, "mm": 0}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        key = {SDPA_FORWARD: "sdpa_forward", SDPA_BACKWARD: "sdpa_backward", _aten.mm.default: "mm"}.get(func)
        if key is not None:
            self.counts[key] += 1
        return func(*args, **(kwargs or {}))


def _spec(seed: int, policy) -> LeaderboardSpec:
    return LeaderboardSpec(size=TINY, context_length=SEQ, batch_per_rank=BATCH_PER_RANK, compute_dtype="fp32",
                           attention="sdpa", checkpoint_blocks=policy, ce_chunk_tokens=CHUNK, seed=seed, lr=LR,
                           eps=EPS, weight_decay=WD)


def _batches(seed: int, world: int):
    gen = torch.Generator().manual_seed(seed + 100)  # the same global batches on every rank
    for _ in range(STEPS):
        yield tuple(torch.randint(0, TINY.vocab_size, (BATCH_PER_RANK * world, SEQ), generator=gen) for _ in range(2))


def _train(rank: int, world: int, seed: int, key: tuple, compile_blocks: bool, track: list | None = None) -> dict:
    """Three steps of the native step against the plain model, the first backward's ops counted; `track`
    gets weak references to the step's parameters and optimizer state."""
    policy, saves, matmuls = key
    torch.manual_seed(seed)
    reference = build_model(TINY, SEQ, attention="sdpa")
    opt_ref = torch.optim.AdamW(reference.parameters(), lr=LR, eps=EPS, weight_decay=WD, foreach=True)
    options = NativeOptions(checkpoint_saves=saves, matmul_blocks=matmuls, compile_blocks=compile_blocks)
    step = build_pytorch_native_step(_spec(seed, policy), "cpu", options)
    mine = slice(rank * BATCH_PER_RANK, (rank + 1) * BATCH_PER_RANK)
    out = {"policies": step.policies, "loss_err": 0.0, "grad_err": 0.0, "counts": None}
    for tokens, targets in _batches(seed, world):
        opt_ref.zero_grad()
        ref_loss = cross_entropy(reference(tokens), targets)
        ref_loss.backward()
        step.tokens, step.targets = tokens[mine], targets[mine]
        step.zero_grad()
        loss = step.forward()
        counter = _Count()
        with counter:
            loss.backward()
        out["counts"] = out["counts"] or counter.counts
        step.optimizer_step()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        out["loss_err"] = max(out["loss_err"], abs(mean.item() / world - ref_loss.item()) / ref_loss.item())
        grads = {plain_name(n): p.grad.full_tensor() for n, p in step.module.named_parameters()}
        out["grad_err"] = max(out["grad_err"], *(((grads[n] - p.grad).abs().max() / p.grad.abs().max()).item()
                                                 for n, p in reference.named_parameters()))
        opt_ref.step()
    full = {plain_name(n): p.full_tensor() for n, p in step.module.named_parameters()}
    out["names_match"] = sorted(full) == sorted(n for n, _ in reference.named_parameters())
    out["param_err"] = max((full[n] - p).abs().max().item() for n, p in reference.named_parameters())
    if track is not None:
        tensors = [p for group in step.optimizer.param_groups for p in group["params"]]
        track += [weakref.ref(t) for t in tensors + [t for state in step.optimizer.state.values()
                                                     for t in state.values() if torch.is_tensor(t)]]
    return out


def _eager_checks(info, seed: int) -> dict:
    return {key: _train(info.rank, info.world_size, seed, key, compile_blocks=False) for key in POLICIES}


def _compiled_check(info, seed: int) -> dict:
    """The compiled step, then what outlives it once dropped: the job runs its configs one after another
    in one process, so a compiled graph that held the step's tensors would take the next config's memory."""
    refs: list[weakref.ref] = []
    out = _train(info.rank, info.world_size, seed, (3, "attention", 1), compile_blocks=True, track=refs)
    gc.collect()
    out["tracked"], out["alive"] = len(refs), sum(r() is not None for r in refs)
    return out


@pytest.fixture(scope="module")
def eager():
    return spawn_checks(_eager_checks, 2, timeout_s=300)


def _assert_matches(r: dict, rank: int) -> None:
    assert r["names_match"], "every parameter of the plain model, once"
    assert r["loss_err"] < FP32_LOSS_TOL, f"rank {rank}: loss off by {r['loss_err']:.3g} (relative)"
    assert r["grad_err"] < FP32_GRAD_TOL, f"rank {rank}: gradients off by {r['grad_err']:.3g} (relative)"
    assert r["param_err"] < FP32_PARAM_TOL, f"rank {rank}: parameters off by {r['param_err']:.3g} after {STEPS} steps"


@pytest.mark.parametrize("key", list(POLICIES), ids=["-".join(map(str, k)) for k in POLICIES])
def test_each_policy_matches_the_plain_model(eager, key):
    _, per_rank = eager
    for rank, results in enumerate(per_rank):
        assert results[key]["policies"] == POLICIES[key]
        _assert_matches(results[key], rank)


@pytest.mark.parametrize("key", list(POLICIES), ids=["-".join(map(str, k)) for k in POLICIES])
def test_each_policy_recomputes_what_it_says(eager, key):
    """In the backward: SDPA's forward runs again only in the blocks that recompute everything; the
    products run again in those and in the blocks that save attention alone (6 of a block's 7: the
    non-reentrant checkpoint stops recomputing once every tensor the backward saved is back, before
    w2's product, `set_checkpoint_early_stop`); a block that saves the products, or keeps everything,
    runs none again. Every block's backward runs its 14 products (2 per weight) and SDPA's backward
    once; each of the 4 loss chunks recomputes its head product and runs 2 more."""
    _, per_rank = eager
    policies = POLICIES[key]
    recompute_products = sum(p in ("recompute", "save_attention") for p in policies)
    chunks = BATCH_PER_RANK * SEQ // CHUNK
    expected = {"sdpa_forward": policies.count("recompute"), "sdpa_backward": TINY.num_layers,
                "mm": 14 * TINY.num_layers + 6 * recompute_products + 3 * chunks}
    for results in per_rank:
        assert results[key]["counts"] == expected


def test_the_compiled_step_matches_the_plain_model():
    """Inductor's graphs of the blocks (one per policy) and of the loss's chunk, on the CPU."""
    _, per_rank = spawn_checks(_compiled_check, 2, timeout_s=600)
    for rank, r in enumerate(per_rank):
        assert r["policies"] == ["save_attention", "save_attention", "save_matmuls", "kept"]
        _assert_matches(r, rank)
        assert r["tracked"] > 0 and r["alive"] == 0, f"rank {rank}: {r['alive']} tensors outlive the dropped step"


def test_each_compiled_policy_saves_what_it_says():
    """Compiled by Inductor, as in the step: the activations a block saves for its backward (parameters,
    buffers and the CPU generator's state left out). Every policy keeps its own graph: blocks of two policies
    sharing one compiled graph would save the same."""
    torch._dynamo.reset()
    model = build_model(TINY, SEQ, attention="sdpa")
    fixed = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers()]}
    policies = ["recompute", "save_attention", "save_matmuls"]
    saved = {}
    for policy, block in zip(policies, wrap_blocks(model, policies + ["kept"]), strict=False):
        x = torch.randn(BATCH_PER_RANK, SEQ, TINY.d_model, requires_grad=True)
        shapes = {}

        def pack(t: torch.Tensor, shapes=shapes) -> torch.Tensor:
            if t.is_floating_point() and t.untyped_storage().data_ptr() not in fixed:
                shapes[t.untyped_storage().data_ptr()] = tuple(t.shape)
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            block(x).sum().backward()
        saved[policy] = sorted(shapes.values())
    tokens, heads = BATCH_PER_RANK * SEQ, TINY.num_heads
    attention = [(BATCH_PER_RANK, heads, SEQ), (BATCH_PER_RANK, heads, SEQ, TINY.d_model // heads)]  # L and O
    products = [(tokens, TINY.d_model)] * 4 + [(tokens, TINY.d_ff)] * 2  # q, k, v, out; w1, w3 (not w2's)
    block_input = [(BATCH_PER_RANK, SEQ, TINY.d_model)]
    assert saved == {"recompute": block_input, "save_attention": sorted(block_input + attention),
                     "save_matmuls": sorted(block_input + attention + products)}


def test_block_policies_and_bad_options():
    spec = _spec(0, 3)
    assert block_policies(spec, NativeOptions()) == ["recompute"] * 3 + ["kept"]
    assert block_policies(spec, NativeOptions(checkpoint_saves="attention", matmul_blocks=2)) == [
        "save_attention", "save_matmuls", "save_matmuls", "kept"]
    with pytest.raises(ValueError, match="only 3 blocks are checkpointed"):
        block_policies(spec, NativeOptions(matmul_blocks=4))
    for bad, match in (({"checkpoint_saves": "everything"}, "checkpoint_saves must be"),
                       ({"sdpa_backend": "fast"}, "sdpa_backend must be"), ({"reduce_dtype": "fp8"}, "reduce_dtype"),
                       ({"matmul_blocks": -1}, "non-negative")):
        with pytest.raises(ValueError, match=match):
            NativeOptions(**bad)
    with pytest.raises(ValueError, match="needs a process group"):
        build_pytorch_native_step(spec, "cpu", NativeOptions())


def test_settings_keep_each_variants_options_to_it():
    with pytest.raises(ValueError, match="settings of variant pytorch_native only, not ours"):
        LeaderboardSettings(variant="ours", checkpoint_saves="attention")
    with pytest.raises(ValueError, match="fused_elementwise, keep_attention and offload_blocks are ours"):
        LeaderboardSettings(variant="pytorch_native", keep_attention=True)
    with pytest.raises(ValueError, match="offload_blocks are ours"):
        LeaderboardSettings(variant="pytorch_native", checkpoint_blocks=24, offload_blocks=8)
    with pytest.raises(ValueError, match="sdpa_backend must be"):
        LeaderboardSettings(variant="pytorch_native", sdpa_backend="fastest")
    options = LeaderboardSettings(variant="pytorch_native", matmul_blocks=3, reduce_dtype="bf16").native_options()
    assert (options.matmul_blocks, options.reduce_dtype, options.compile_blocks) == (3, "bf16", True)


def _point_on_cpu(info) -> dict:
    settings = LeaderboardSettings(size="tiny", context_length=SEQ, variant="pytorch_native", compute_dtype="fp32",
                                   checkpoint_blocks=1, checkpoint_saves="attention", compile_blocks=False, warmup=1,
                                   device="cpu")
    return run_leaderboard_point(settings, Run(device="cpu", rank=info.rank, world_size=info.world_size,
                                               backend=info.backend))


def test_the_native_point_runs_on_two_gloo_ranks():
    per_rank = spawn(_point_on_cpu, 2, timeout_s=180, pg_timeout_s=30)
    for r in per_rank:
        assert r["variant"] == "pytorch_native" and len(r["step_ms"]) == 5
        assert r["block_policies"] == ["save_attention", "kept"]  # tiny has 2 blocks
        assert r["warmup_s"] > 0 and r["build_s"] > 0 and r["wall_s_to_end_of_timing"] > r["warmup_s"]
        assert {"forward", "backward", "optimizer_step"} <= set(r["phases"])
