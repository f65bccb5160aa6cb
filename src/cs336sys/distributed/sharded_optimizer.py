"""Optimizer state sharding (a simplified ZeRO stage 1): each rank keeps optimizer
state for about 1/world_size of the parameters and steps only those; the updated values are then
broadcast from their owners, so every rank ends the step with the same full set of parameters.

    opt = ShardedOptimizer(model.parameters(), torch.optim.AdamW, lr=1e-3)
    ...backward, gradients averaged over ranks (DDP)...
    opt.step()

Placement. Parameters are assigned to ranks greedily, largest first (ties: earlier in the group
first), each onto the rank holding the fewest elements so far (ties: the lowest rank). Every rank
computes the same placement from the shapes alone; a group added later (`add_param_group`)
continues from the loads left by the earlier groups.

Synchronisation. After the local step, every parameter is broadcast from its owner, in place into
the parameter itself: all broadcasts are issued asynchronously, then waited on. We broadcast
rather than all-gather flattened shards because an all-gather needs a staging buffer of the whole
model (plus copies in and out of it) at exactly the moment that peak memory is measured; in-place
broadcasts move the same bytes ((N-1)/N of the model into each rank) with no extra memory, at
the price of one collective per tensor (a few hundred for the largest models: negligible against
the bytes moved).

Hyperparameters. `param_groups` are this object's own groups (all parameters; what a scheduler
sees and edits); the local optimizer has one group per ours, holding our share of its parameters
(possibly none), and receives our hyperparameters before each step.

Checkpoints. `consolidate_state_dict(to=r)` gathers every rank's state onto rank r; `state_dict()`
there returns exactly what the unsharded optimizer would: {"state": {index: {...}},
"param_groups": [{..., "params": [index, ...]}]}, with parameters numbered in the order of our
groups, as `torch.optim.Optimizer.state_dict` numbers them. `load_state_dict` takes that full
format on every rank and keeps only this rank's share.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from cs336sys.distributed import process_group


def assign_to_ranks(numels: list[int], loads: list[int]) -> list[int]:
    """Owner rank of each entry of `numels`: largest first onto the least-loaded rank.

    `loads` (elements already owned per rank) is updated in place, so later groups balance
    against earlier ones.
    """
    owners = [0] * len(numels)
    for i in sorted(range(len(numels)), key=lambda i: (-numels[i], i)):
        rank = min(range(len(loads)), key=lambda r: (loads[r], r))
        owners[i] = rank
        loads[rank] += numels[i]
    return owners


class ShardedOptimizer(torch.optim.Optimizer):
    """Wraps `optimizer_cls` so that each rank holds state only for its share of the parameters."""

    def __init__(self, params: Iterable[Tensor] | Iterable[dict[str, Any]],
                 optimizer_cls: type[torch.optim.Optimizer], **kwargs: Any):
        self.optimizer_cls = optimizer_cls
        self.optimizer_kwargs = kwargs
        self.rank = process_group.rank()
        self.world_size = process_group.world_size()
        self.rank_loads = [0] * self.world_size  # elements owned by each rank, over all groups
        self.owner: dict[Tensor, int] = {}
        self.local_optimizer: torch.optim.Optimizer | None = None
        self._local_groups_before_init: list[dict[str, Any]] = []
        self._consolidated: dict[str, Any] | None = None
        # Optimizer.__init__ calls self.add_param_group for every group, before the local optimizer
        # exists: those groups wait in _local_groups_before_init.
        super().__init__(params, defaults=dict(kwargs))
        pending, self._local_groups_before_init = self._local_groups_before_init, []
        self.local_optimizer = optimizer_cls(pending, **kwargs)
        for group, local_group in zip(self.param_groups, self.local_optimizer.param_groups, strict=True):
            self._adopt_local_defaults(group, local_group)
        self.state = self.local_optimizer.state  # what exists on this rank: our share's state only

    # --- parameter placement ------------------------------------------------------------------

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        super().add_param_group(param_group)  # validates, fills our defaults, appends to param_groups
        group = self.param_groups[-1]
        owners = assign_to_ranks([p.numel() for p in group["params"]], self.rank_loads)
        self.owner.update(zip(group["params"], owners, strict=True))
        mine = [i for i, owner in enumerate(owners) if owner == self.rank]
        local_group = {k: v for k, v in group.items() if k not in ("params", "param_names")}
        local_group["params"] = [group["params"][i] for i in mine]
        if "param_names" in group:
            local_group["param_names"] = [group["param_names"][i] for i in mine]
        if self.local_optimizer is None:
            self._local_groups_before_init.append(local_group)
        else:
            self.local_optimizer.add_param_group(local_group)
            self._adopt_local_defaults(group, self.local_optimizer.param_groups[-1])
            self._consolidated = None

    @staticmethod
    def _adopt_local_defaults(group: dict[str, Any], local_group: dict[str, Any]) -> None:
        """Our group shows the hyperparameters the wrapped class filled in (betas, eps, ...)."""
        for key, value in local_group.items():
            if key not in ("params", "param_names"):
                group.setdefault(key, value)

    def local_parameters(self) -> list[Tensor]:
        """The parameters this rank steps (and holds optimizer state for)."""
        return [p for g in self.param_groups for p in g["params"] if self.owner[p] == self.rank]

    # --- stepping -----------------------------------------------------------------------------

    def _push_hyperparameters(self) -> None:
        for group, local_group in zip(self.param_groups, self.local_optimizer.param_groups, strict=True):
            local_group.update((k, v) for k, v in group.items() if k not in ("params", "param_names"))

    def step(self, closure: Callable[[], float] | None = None, **kwargs: Any) -> Any:
        self._push_hyperparameters()
        loss = self.local_optimizer.step(closure, **kwargs)
        self._consolidated = None
        self.broadcast_parameters()
        return loss

    @torch.no_grad()
    def broadcast_parameters(self) -> None:
        """Every parameter from its owner into every other rank's copy (async, then waited on)."""
        if self.world_size == 1:
            return
        pending = []
        for group in self.param_groups:
            for p in group["params"]:
                buffer = p.data if p.is_contiguous() else p.data.contiguous()
                pending.append((p, buffer, dist.broadcast(buffer, src=self.owner[p], async_op=True)))
        for p, buffer, work in pending:
            work.wait()
            if buffer is not p.data:
                p.data.copy_(buffer)

    def zero_grad(self, set_to_none: bool = True) -> None:
        super().zero_grad(set_to_none)  # every parameter's gradient, not only our share's

    # --- checkpoints --------------------------------------------------------------------------

    def _global_indices(self) -> dict[Tensor, int]:
        """Each parameter's index as the unsharded optimizer numbers it in its state_dict."""
        return {p: i for i, p in enumerate(p for g in self.param_groups for p in g["params"])}

    def _packed_groups(self, indices: dict[Tensor, int]) -> list[dict[str, Any]]:
        self._push_hyperparameters()
        return [{**{k: v for k, v in g.items() if k != "params"}, "params": [indices[p] for p in g["params"]]}
                for g in self.param_groups]

    def consolidate_state_dict(self, to: int = 0) -> None:
        """Gather the full optimizer state onto rank `to` (a collective: call it on every rank)."""
        indices = self._global_indices()
        mine = {indices[p]: {k: v.cpu() if isinstance(v, Tensor) else v for k, v in state.items()}
                for p, state in self.local_optimizer.state.items()}
        gathered: list[Any] = [None] * self.world_size if self.rank == to else None
        if self.world_size == 1:
            gathered = [mine]
        else:
            dist.gather_object(mine, gathered, dst=to)
        if self.rank != to:
            self._consolidated = None
            return
        by_index = {i: p for p, i in indices.items()}
        state = {}
        for shard in gathered:
            for i, param_state in shard.items():
                device = by_index[i].device
                state[i] = {k: v.to(device) if isinstance(v, Tensor) else v for k, v in param_state.items()}
        self._consolidated = {"state": dict(sorted(state.items())), "param_groups": self._packed_groups(indices)}

    def state_dict(self) -> dict[str, Any]:
        """The full, unsharded-format state; only after `consolidate_state_dict` onto this rank."""
        if self._consolidated is None:
            raise RuntimeError("call consolidate_state_dict(to=rank) on every rank first (and again after "
                               f"each step); rank {self.rank} holds no consolidated state")
        return self._consolidated

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load the full format (from `state_dict()` or an unsharded optimizer); keeps our share."""
        saved_groups = state_dict["param_groups"]
        if len(saved_groups) != len(self.param_groups):
            raise ValueError(f"state_dict has {len(saved_groups)} parameter groups, this optimizer "
                             f"{len(self.param_groups)}")
        local_index: dict[Tensor, int] = {}
        for local_group in self.local_optimizer.param_groups:
            for p in local_group["params"]:
                local_index[p] = len(local_index)
        local_state, local_groups = {}, []
        for group, saved in zip(self.param_groups, saved_groups, strict=True):
            if len(saved["params"]) != len(group["params"]):
                raise ValueError(f"a saved group has {len(saved['params'])} parameters, ours "
                                 f"{len(group['params'])}")
            hyper = {k: v for k, v in saved.items() if k not in ("params", "param_names")}
            group.update(hyper)
            local_params = []
            for p, saved_index in zip(group["params"], saved["params"], strict=True):
                if self.owner[p] == self.rank:
                    local_params.append(local_index[p])
                    if saved_index in state_dict["state"]:
                        local_state[local_index[p]] = state_dict["state"][saved_index]
            local_groups.append({**hyper, "params": local_params})
        self.local_optimizer.load_state_dict({"state": local_state, "param_groups": local_groups})
        self.state = self.local_optimizer.state
        self._consolidated = None
