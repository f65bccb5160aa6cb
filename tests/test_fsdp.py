"""FSDP against single-process training, on 2 and 3 gloo ranks on the CPU.

Each rank trains on its slice of a global batch; a reference copy of rank 0's initial model trains
on the whole batch in one process (mean losses, so the averaged gradient is the full-batch one).
Models: our TransformerLM ("tiny": its Linear and Embedding are our own classes) and a toy model
whose linear maps are bare 2-D weights used through F.linear and x @ w.T, with an nn.Linear
called twice per forward, an nn.Embedding and a LayerNorm; at world size 3 no sharded layer of
either model divides evenly. Every check runs ITERATIONS times with fresh data inside one spawn.
"""

from __future__ import annotations

import time
import weakref

import pytest
import torch
import torch.nn.functional as F
from conftest import spawn_checks
from torch import nn

from cs336sys import adapters
from cs336sys.distributed.fsdp import FSDP
from cs336sys.model import build_model
from cs336sys.optim import AdamW, cross_entropy

ITERATIONS = 3
STEPS = 3
BATCH_PER_RANK, SEQ = 2, 8
# fp32: the only difference from the reference is the order of summation (gradients averaged
# over ranks instead of one mean over the whole batch), ~1e-7 relative. The first step's
# gradients show it alone; AdamW then divides each element's update by that element's own
# gradient scale, so an element whose gradient nearly cancels turns rounding noise into a
# parameter difference (up to lr times its relative error), and later gradients differ by what
# the parameters do. Measured over 48 runs (lr 1e-3): first gradients 1.5e-6 and later 5.7e-6 of
# each tensor's largest gradient, parameters 1.1e-6 absolute; the bounds are ~7-10x that.
# AdamW's eps is 1e-6, not 1e-8, for the same reason: with 1e-8 and lr 1e-2 elements with
# gradients ~1e-9 gave parameter differences of 2e-4, although every gradient agreed to 1e-6.
FP32_FIRST_GRAD_TOL = 1e-5
FP32_GRAD_TOL = 5e-5
FP32_PARAM_TOL = 1e-5
ADAM_LR, ADAM_EPS = 1e-3, 1e-6
# bf16 compute (fp32 masters, fp32 gradient reduction), trained with SGD so that the parameter
# update is proportional to the gradient. bf16 keeps 8 significant bits (relative rounding 2^-9);
# a gradient passes through several bf16 matmuls and roundings of weights and activations, so
# updates differ from the fp32 reference's by about a percent: measured over 48 runs, at most
# 0.9% for the whole model's update vector, and at most 6.4% for the worst single tensor (a small
# bias or norm whose update nearly cancels). Bounds: 3% and 15%. A real error (a missing average,
# a wrong shard) is off by 50% or more.
BF16_MODEL_UPDATE_REL_TOL = 3e-2
BF16_TENSOR_UPDATE_REL_TOL = 1.5e-1
TOY_VOCAB = 11


class MatrixLayer(nn.Module):
    """A linear map that is not nn.Linear: a bare 2-D weight used through F.linear."""

    def __init__(self, d_in: int, d_out: int):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(d_out, d_in) / d_in**0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight)


class TransposedMatrixLayer(MatrixLayer):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.weight.T


class ToyNet(nn.Module):
    """Sharded: embed 77, proj 35, hidden 25 + 5 (called twice), head 55 elements; replicated: norm."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(TOY_VOCAB, 7)
        self.proj = MatrixLayer(7, 5)
        self.norm = nn.LayerNorm(5)
        self.hidden = nn.Linear(5, 5)
        self.head = TransposedMatrixLayer(5, TOY_VOCAB)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.norm(F.gelu(self.proj(self.embed(ids))))
        x = self.hidden(torch.tanh(self.hidden(x)))
        return self.head(x)


def _build(name: str, seed: int) -> tuple[nn.Module, int]:
    torch.manual_seed(seed)
    if name in ("tiny", "tiny2"):
        return build_model(name, SEQ), 10_000
    return ToyNet(), TOY_VOCAB


def _relative(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got - want).norm() / want.norm()).item()


def _grad_error(fsdp: FSDP, reference: nn.Module, rank: int) -> float:
    """Largest difference between this rank's gradients (shards and replicated parameters) and the
    matching part of the reference's, relative to the largest reference gradient of the tensor."""
    reference_params = dict(reference.named_parameters())
    pairs = []
    for unit in fsdp.units:
        flat = torch.cat([reference_params[name].grad.reshape(-1) for name in unit.names])
        flat = F.pad(flat, (0, unit.padded_numel - unit.numel))
        pairs.append((unit.shard.grad, flat[rank * unit.shard_numel:(rank + 1) * unit.shard_numel]))
    replicated = {id(p) for p in fsdp.replicated_parameters()}
    pairs += [(p.grad, reference_params[name].grad) for name, p in fsdp.module.named_parameters()
              if id(p) in replicated]
    return max(((got - want).abs().max() / want.abs().max().clamp_min(1e-30)).item() for got, want in pairs)


def _train_against_reference(rank: int, world: int, model_name: str, compute_dtype: torch.dtype | None,
                             seed: int, unit: str | int = "layer") -> dict:
    reference, vocab = _build(model_name, seed)  # rank 0's initial model
    model, _ = _build(model_name, seed + rank)  # differs between ranks: FSDP broadcasts rank 0's
    fsdp = FSDP(model, compute_dtype=compute_dtype, unit=unit)
    initial = {n: p.detach().clone() for n, p in reference.named_parameters()}
    gathered = fsdp.gather_full_params()
    result = {"initial_err": max((gathered[n] - p).abs().max().item() for n, p in initial.items())}
    make_optimizer = (lambda ps: AdamW(ps, lr=ADAM_LR, eps=ADAM_EPS, weight_decay=0.1)) if compute_dtype is None \
        else (lambda ps: torch.optim.SGD(ps, lr=0.5))
    opt_ref, opt = make_optimizer(reference.parameters()), make_optimizer(fsdp.parameters())

    gen = torch.Generator().manual_seed(seed + 100)  # the same global batches on every rank
    for _ in range(STEPS):
        tokens = torch.randint(0, vocab, (BATCH_PER_RANK * world, SEQ + 1), generator=gen)
        x, y = tokens[:, :-1], tokens[:, 1:]
        opt_ref.zero_grad()
        ref_loss = cross_entropy(reference(x), y)
        ref_loss.backward()
        opt_ref.step()

        mine = slice(rank * BATCH_PER_RANK, (rank + 1) * BATCH_PER_RANK)
        opt.zero_grad()
        logits = fsdp(x[mine])
        loss = cross_entropy(logits, y[mine])
        loss.backward()
        fsdp.finish_gradient_synchronization()
        result.setdefault("first_grad_err", _grad_error(fsdp, reference, rank))
        result["grad_err"] = max(result.get("grad_err", 0.0), _grad_error(fsdp, reference, rank))
        opt.step()
        result["logits_dtype"] = str(logits.dtype)

    full = fsdp.gather_full_params()
    result["names_match"] = list(full) == [n for n, _ in reference.named_parameters()]
    result["shapes_match"] = all(full[n].shape == p.shape and full[n].dtype == torch.float32
                                 for n, p in reference.named_parameters())
    if compute_dtype is None:
        result["param_err"] = max((full[n] - p).abs().max().item() for n, p in reference.named_parameters())
    else:
        result["update_rel_err"] = max(_relative(full[n] - initial[n], p.detach() - initial[n])
                                       for n, p in reference.named_parameters())
        names = [n for n, _ in reference.named_parameters()]
        result["model_update_rel_err"] = _relative(torch.cat([(full[n] - initial[n]).flatten() for n in names]),
                                                   torch.cat([(p.detach() - initial[n]).flatten()
                                                              for n, p in reference.named_parameters()]))
    result["grad_dtypes"] = sorted({str(p.grad.dtype) for p in fsdp.parameters() if p.grad is not None})
    result["shard_sizes"] = {",".join(paths): (unit.shard.numel(), unit.numel)
                             for paths, unit in zip(fsdp.unit_paths(), fsdp.units, strict=True)}
    result["padded"] = sum(unit.padded_numel != unit.numel for unit in fsdp.units)
    return result


def _count_alive(refs: list[weakref.ref], patience_s: float = 2.0) -> int:
    """How many of the tensors are still alive, allowing gloo's worker thread, which drops its
    reference to a finished collective's tensors a moment after `wait()` returns, that moment."""
    deadline = time.monotonic() + patience_s
    while (alive := sum(r() is not None for r in refs)) and time.monotonic() < deadline:
        time.sleep(0.01)
    return alive


def _trace_one_step(rank: int, world: int, seed: int) -> dict:
    """The order of gathers, layer calls and reductions in a second training step (after the
    first has recorded the call order), and whether any gathered weight outlives its use."""
    model, vocab = _build("tiny", seed)
    fsdp = FSDP(model)
    events: list[tuple[str, str]] = []
    alive: list[weakref.ref] = []
    for (path,), unit in zip(fsdp.unit_paths(), fsdp.units, strict=True):
        def start_gather(unit=unit, path=path, original=unit.start_gather):
            original()
            events.append(("gather", path))
            alive.append(weakref.ref(unit._inflight[0]))

        def reduce_scatter(grads, path=path, original=unit.reduce_scatter):
            events.append(("reduce", path))
            return original(grads)

        unit.start_gather = start_gather
        unit.reduce_scatter = reduce_scatter
        # prepended, so they see the call before FSDP's own hooks do
        module = model.get_submodule(path)
        module.register_forward_pre_hook(lambda m, a, path=path: events.append(("call", path)), prepend=True)
        module.register_forward_hook(lambda m, a, o, path=path: events.append(("end", path)), prepend=True)
    gen = torch.Generator().manual_seed(seed)
    result = {}
    for _ in range(2):
        events.clear()
        tokens = torch.randint(0, vocab, (BATCH_PER_RANK, SEQ + 1), generator=gen)
        loss = cross_entropy(fsdp(tokens[:, :-1]), tokens[:, 1:])
        result["forward"] = list(events)
        result["alive_after_forward"] = _count_alive(alive)
        events.clear()
        loss.backward()
        fsdp.finish_gradient_synchronization()
        result["backward"] = list(events)
        del loss
        result["alive_after_backward"] = _count_alive(alive)
        alive.clear()
    result["attributes_removed"] = all(not hasattr(model.get_submodule(path), "weight")
                                       for (path,) in fsdp.unit_paths())
    return result


def _all_checks(info, seed: int) -> dict:
    results = {}
    for it in range(ITERATIONS):
        for model_name in ("tiny", "toy"):
            for dtype_name, dtype in (("fp32", None), ("bf16", torch.bfloat16)):
                results[f"{model_name}/{dtype_name}/{it}"] = _train_against_reference(
                    info.rank, info.world_size, model_name, dtype, seed + 1000 * it)
    results["trace"] = _trace_one_step(info.rank, info.world_size, seed)
    return results


@pytest.fixture(scope="module", params=[2, 3], ids=lambda n: f"world{n}")
def spawned(request):
    return spawn_checks(_all_checks, request.param, timeout_s=180)


def _configs(dtype_name: str) -> list[str]:
    return [f"{m}/{dtype_name}/{it}" for it in range(ITERATIONS) for m in ("tiny", "toy")]


def _check_common(r: dict, rank: int) -> None:
    assert r["initial_err"] == 0, f"rank {rank}: gathered initial parameters are not rank 0's model"
    assert r["names_match"] and r["shapes_match"], "gather_full_params keeps names, shapes; fp32"
    assert r["grad_dtypes"] == ["torch.float32"], "the optimizer sees fp32 gradients"


@pytest.mark.parametrize("config", _configs("fp32"))
def test_fp32_matches_single_process_training(spawned, config):
    _, per_rank = spawned
    for rank, results in enumerate(per_rank):
        r = results[config]
        _check_common(r, rank)
        assert r["logits_dtype"] == "torch.float32"
        assert r["first_grad_err"] < FP32_FIRST_GRAD_TOL, f"rank {rank}: first gradients off by " \
                                                          f"{r['first_grad_err']:.3g} (relative)"
        assert r["grad_err"] < FP32_GRAD_TOL, f"rank {rank}: gradients off by {r['grad_err']:.3g} (relative)"
        assert r["param_err"] < FP32_PARAM_TOL, f"rank {rank}: parameters off by {r['param_err']:.3g}"


@pytest.mark.parametrize("config", _configs("bf16"))
def test_bf16_compute_matches_within_tolerance(spawned, config):
    _, per_rank = spawned
    for rank, results in enumerate(per_rank):
        r = results[config]
        _check_common(r, rank)
        assert r["logits_dtype"] == "torch.bfloat16", "layers computed with bf16 weights"
        assert r["model_update_rel_err"] < BF16_MODEL_UPDATE_REL_TOL, \
            f"rank {rank}: the model's update off by {r['model_update_rel_err']:.3g} (relative)"
        assert r["update_rel_err"] < BF16_TENSOR_UPDATE_REL_TOL, \
            f"rank {rank}: a tensor's update off by {r['update_rel_err']:.3g} (relative)"


def test_every_linear_and_embedding_is_sharded_evenly_with_padding(spawned):
    world, per_rank = spawned
    for model_name, expected in (("tiny", {"token_embeddings", "lm_head", "layers.1.ffn.w3",
                                            "layers.0.attn.output_proj"}),
                                 ("toy", {"embed", "proj", "hidden", "head"})):
        sizes = per_rank[0][f"{model_name}/fp32/0"]["shard_sizes"]
        assert expected <= set(sizes), sorted(sizes)
        assert not any("ln" in path or "norm" in path for path in sizes), "norms stay replicated"
        for path, (shard, numel) in sizes.items():
            assert shard == -(-numel // world), path
        if world == 3:
            assert per_rank[0][f"{model_name}/fp32/0"]["padded"] >= len(sizes) - 1, "sizes that do not divide"
    assert per_rank[0]["toy/fp32/0"]["shard_sizes"]["hidden"][1] == 30, "nn.Linear's bias is sharded with it"


def test_prefetch_order_and_freeing(spawned):
    """Forward: the gathers of the first two calls are issued before any layer runs, and each
    other call's gather is issued right when the call two before it has ended. Backward: each
    layer whose weight autograd saved is gathered once (the embedding not at all), the next one
    prefetched at the first gather, and the one two ahead right after each reduction."""
    _, per_rank = spawned
    for results in per_rank:
        trace = results["trace"]
        forward = trace["forward"]
        calls = [path for kind, path in forward if kind == "call"]
        gathers = [path for kind, path in forward if kind == "gather"]
        assert gathers == calls, "one gather per call, in call order"
        assert forward[:2] == [("gather", calls[0]), ("gather", calls[1])]
        for k in range(len(calls) - 2):
            end = forward.index(("end", calls[k]))
            assert forward[end + 1] == ("gather", calls[k + 2]), (k, forward[end - 2:end + 3])
        assert trace["alive_after_forward"] == 0, "no gathered weight outlives its forward"

        backward = trace["backward"]
        reduces = [path for kind, path in backward if kind == "reduce"]
        gathered = [path for kind, path in backward if kind == "gather"]
        assert sorted(reduces) == sorted(calls), "every layer's gradient is reduce-scattered once"
        assert sorted(gathered) == sorted(p for p in calls if p != "token_embeddings"), \
            "gathered again once for the backward, the embedding never"
        assert gathered[:2] == reduces[:2] and backward[:2] == [("gather", reduces[0]), ("gather", reduces[1])]
        for k in range(len(reduces) - 3):  # the last reductions have nothing left to prefetch
            at = backward.index(("reduce", reduces[k]))
            assert backward[at + 1] == ("gather", reduces[k + 2]), (k, backward[at - 2:at + 3])
        assert trace["alive_after_backward"] == 0, "no gathered weight outlives the backward"
        assert trace["attributes_removed"], "full weights exist as attributes only inside the layer's forward"


def test_world_of_one_without_a_process_group():
    """Without a process group FSDP shards into one piece and trains like the model itself
    (through the course adapters)."""
    reference, vocab = _build("toy", 0)
    model, _ = _build("toy", 0)
    fsdp = adapters.get_fsdp(model)
    assert fsdp.unit_paths() == [["embed"], ["proj"], ["hidden"], ["head"]]
    assert [p.dim() for p in fsdp.replicated_parameters()] == [1, 1], "LayerNorm's weight and bias"
    opt_ref, opt = AdamW(reference.parameters(), lr=1e-2), AdamW(fsdp.parameters(), lr=1e-2)
    for _ in range(2):
        tokens = torch.randint(0, vocab, (3, SEQ + 1))
        for m, o in ((reference, opt_ref), (fsdp, opt)):
            o.zero_grad()
            cross_entropy(m(tokens[:, :-1]), tokens[:, 1:]).backward()
            if m is fsdp:
                adapters.fsdp_on_after_backward(fsdp, o)
            o.step()
    full = adapters.fsdp_gather_full_params(fsdp)
    for name, p in reference.named_parameters():
        torch.testing.assert_close(full[name], p.detach(), rtol=1e-6, atol=1e-6)
