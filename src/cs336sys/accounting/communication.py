"""Collectives in the handout's model of a network, and what each strategy sends per training step.

The model (handout section 8.1): N devices, every pair linked, each device sends W bytes/s. A ring
collective runs in steps; in each step every device sends one message to its right-hand neighbour,
so a step lasts (message bytes) / W. For a tensor of S bytes:

* all-gather and reduce-scatter: N - 1 steps of S/N bytes, time (N - 1)/N * S/W;
* all-reduce as reduce-scatter then all-gather: 2(N - 1) steps of S/N bytes, 2 (N - 1)/N * S/W;
* the handout's alternate all-reduce (every device forwards whole tensors round the ring):
  N - 1 steps of S bytes, (N - 1) S/W.

`cs336sys.accounting.ring` runs these step by step and `tests/test_accounting_ring.py` checks
the counts against these formulas. NCCL reports an all-reduce's *bus bandwidth* as
busbw = (S / t) * 2(N - 1)/N; with t from the ring formula that is exactly W, so a measured bus
bandwidth is the W of this model.
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy as sp

from cs336sys.accounting.memory import P_BLOCK, P_EMBED, P_NORM, PARAMETER_CLASSES
from cs336sys.accounting.symbols import N_FSDP, N_TP, N, W, b, d, s
from cs336sys.accounting.symbols import L as LAYERS

COLLECTIVES = ("all_gather", "reduce_scatter", "all_reduce", "alternate_all_reduce", "broadcast_shards")


def steps(collective: str, n: sp.Expr = N) -> sp.Expr:
    return {"all_gather": n - 1, "reduce_scatter": n - 1, "all_reduce": 2 * (n - 1),
            "alternate_all_reduce": n - 1, "broadcast_shards": n - 1}[collective]


def bytes_sent_per_device(collective: str, size: sp.Expr, n: sp.Expr = N) -> sp.Expr:
    """Bytes each device sends for a collective on a tensor of `size` bytes (the full tensor: for an
    all-gather the gathered result, for a reduce-scatter its input). `broadcast_shards` is every device
    broadcasting its 1/n of the tensor to the others (what a sharded optimizer does after its step),
    which moves the same bytes as an all-gather."""
    if collective not in COLLECTIVES:
        raise ValueError(f"unknown collective {collective!r}; known: {', '.join(COLLECTIVES)}")
    message = size if collective == "alternate_all_reduce" else size / n
    return steps(collective, n) * message


def collective_time(collective: str, size: sp.Expr, n: sp.Expr = N, bandwidth: sp.Expr = W) -> sp.Expr:
    return bytes_sent_per_device(collective, size, n) / bandwidth


def bus_bandwidth_factor(collective: str, n: sp.Expr = N) -> sp.Expr:
    """NCCL's busbw / algbw (algbw = size / time): the factor that makes busbw equal W in the ring model."""
    return sp.simplify(bytes_sent_per_device(collective, 1, n))


@dataclass(frozen=True)
class Transfer:
    """One kind of collective in a training step, `count` times per step, on `size` bytes over `group` devices."""

    label: str
    collective: str
    size: sp.Expr
    group: sp.Expr
    count: sp.Expr = 1

    def bytes_sent(self) -> sp.Expr:
        return self.count * bytes_sent_per_device(self.collective, self.size, self.group)

    def time(self, bandwidth: sp.Expr = W) -> sp.Expr:
        return self.bytes_sent() / bandwidth


def step_transfers(strategy: str, grad_bytes: int = 4, param_bytes: int = 4, compute_bytes: int = 2) -> list[Transfer]:
    """The collectives one training step of our Transformer needs under `strategy`.

    ddp: one all-reduce of every gradient (grad_bytes each). zero1 (our ShardedOptimizer): the same
    all-reduce, then every rank broadcasts the parameters it updated (param_bytes each). fsdp: the
    sharded matrices are all-gathered in the compute dtype before the forward and again before the
    backward, their gradients reduce-scattered in the compute dtype; the replicated norm gains'
    gradients are all-reduced. tp (Megatron-style): two all-reduces of a (b, s, d_model) activation
    per block in the forward (after the attention output projection and after w2) and two in the
    backward (the gradients of the blocks' inputs), in the compute dtype; embedding and head are
    replicated and see the same data, so they need no communication. fsdp_tp: tp inside groups of
    N_TP devices, fsdp across them on the tensor-parallel shards. b is the batch of one data-parallel
    rank (a tensor-parallel group shares its batch).
    """
    total_params = sp.Add(*PARAMETER_CLASSES)
    if strategy == "single":
        return []
    if strategy == "ddp":
        return [Transfer("gradients", "all_reduce", total_params * grad_bytes, N)]
    if strategy == "zero1":
        return [Transfer("gradients", "all_reduce", total_params * grad_bytes, N),
                Transfer("updated parameter shards", "broadcast_shards", total_params * param_bytes, N)]
    if strategy in ("fsdp", "fsdp_tp"):
        group = N if strategy == "fsdp" else N_FSDP
        tp = 1 if strategy == "fsdp" else N_TP
        # The tensor a device group gathers: its share of the matrices before FSDP divided them.
        gathered = (P_BLOCK / tp + P_EMBED) * compute_bytes
        out = [Transfer("weights (forward)", "all_gather", gathered, group),
               Transfer("weights (backward)", "all_gather", gathered, group),
               Transfer("weight gradients", "reduce_scatter", gathered, group),
               Transfer("norm gradients", "all_reduce", P_NORM * grad_bytes, group)]
        if strategy == "fsdp_tp":
            out += _tp_activations(b, compute_bytes)
        return out
    if strategy == "tp":
        return _tp_activations(b, compute_bytes)
    raise AssertionError(strategy)


def _tp_activations(local_batch: sp.Expr, compute_bytes: int) -> list[Transfer]:
    activation = local_batch * s * d * compute_bytes
    return [Transfer("activations (forward)", "all_reduce", activation, N_TP, 2 * LAYERS),
            Transfer("activation gradients (backward)", "all_reduce", activation, N_TP, 2 * LAYERS)]


def step_communication_time(strategy: str, **dtypes: int) -> sp.Expr:
    return sp.Add(*(t.time() for t in step_transfers(strategy, **dtypes)))
