"""The leaderboard step from PyTorch's own parts: the baseline our step is timed against.

    step = build_pytorch_parts_step(LeaderboardSpec(), "cuda:0")   # inside a process group
    step.run()

The same model (same seed, same sizes) with attention "sdpa" (PyTorch picks its flash or cuDNN
kernel); FSDP2 (`fully_shard`) on each TransformerBlock and then on the root, with
`MixedPrecisionPolicy(param_dtype=<compute dtype>, reduce_dtype=fp32)`; every block checkpointed
(non-reentrant `torch.utils.checkpoint`, one block per group, as the model's `checkpoint_blocks=1`);
the LM head and the cross-entropy (`cs336sys.optim.cross_entropy`) in checkpointed chunks of
`ce_chunk_tokens` tokens, each chunk's mean weighted by its share of the tokens, so the sum is the
mean over all of them while at most one chunk's logits exist; `torch.optim.AdamW(fused=True)` on
CUDA (foreach on the CPU, where fused has no kernel for every dtype).

Why a root module of our own (`_LossRoot`): the model's forward ends in the full logits, and
FSDP2 gathers the root's parameters (embedding, final norm, head) in the root's forward pre-hook;
calling the model's parts one by one would bypass it. `_LossRoot` owns the unchanged model and its
forward is embed -> checkpointed blocks -> ln_final -> chunked head + loss; `fully_shard` wraps
it. The spec's `checkpoint_blocks` and `reshard_after_forward` are ours and are ignored here:
this is the fixed recipe that took 6.09 s/step.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from cs336sys.dtypes import torch_dtype
from cs336sys.leaderboard.step import LeaderboardSpec, StepLoop, check_world_size, no_phase, random_batch
from cs336sys.model import TransformerLM, build_model
from cs336sys.optim import cross_entropy
from cs336sys.sizes import parameter_count, train_step_flops


class _LossRoot(nn.Module):
    """tokens, targets -> mean cross-entropy, through the model's own parts."""

    def __init__(self, model: TransformerLM, chunk_tokens: int):
        super().__init__()
        self.model = model
        self.chunk_tokens = chunk_tokens

    def _chunk_loss(self, h: Tensor, targets: Tensor, weight: float) -> Tensor:
        return cross_entropy(self.model.lm_head(h), targets) * weight

    def forward(self, tokens: Tensor, targets: Tensor) -> Tensor:
        model = self.model
        x = model.token_embeddings(tokens)
        for i in range(len(model.layers)):
            x = checkpoint(model.layers[i], x, use_reentrant=False)
        h = model.ln_final(x)
        h, targets = h.reshape(-1, h.shape[-1]), targets.reshape(-1)
        n = h.shape[0]
        loss = None
        for start in range(0, n, self.chunk_tokens):
            end = min(start + self.chunk_tokens, n)
            part = checkpoint(self._chunk_loss, h[start:end], targets[start:end], (end - start) / n,
                              use_reentrant=False)
            loss = part if loss is None else loss + part
        return loss


@dataclass
class PytorchPartsStep(StepLoop):
    """Same interface as `LeaderboardStep`: `run()`, `phase`, `info`, `tokens`/`targets`. No `sync`:
    FSDP2's backward finishes its own reductions."""

    spec: LeaderboardSpec
    model: TransformerLM
    module: nn.Module  # the fully_shard-ed root
    optimizer: torch.optim.Optimizer
    tokens: Tensor
    targets: Tensor
    device: str
    info: dict = field(default_factory=dict)
    phase: Callable[[str], contextlib.AbstractContextManager] = no_phase

    def forward(self) -> Tensor:
        with self.phase("forward"):
            return self.module(self.tokens, self.targets)

    def forward_backward(self) -> Tensor:
        loss = self.forward()
        with self.phase("backward"):
            loss.backward()  # FSDP2 reduce-scatters during the backward and waits at its end
        return loss.detach()



def build_pytorch_parts_step(spec: LeaderboardSpec, device: str | torch.device,
                             data_seed: int | None = None) -> PytorchPartsStep:
    """FSDP2 needs a process group (it builds a device mesh over it): ValueError without one."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    if not dist.is_initialized():
        raise ValueError("the PyTorch-parts step needs a process group (FSDP2 shards over a device mesh of it); "
                         "run it under torchrun or cs336sys.distributed.spawn")
    rank, world = check_world_size(spec)
    size = spec.model_size
    device = str(device)
    torch.manual_seed(spec.seed)
    model = build_model(size, spec.context_length, device=device, attention="sdpa", checkpoint_blocks=1)
    root = _LossRoot(model, spec.ce_chunk_tokens)
    policy = MixedPrecisionPolicy(param_dtype=torch_dtype(spec.compute_dtype), reduce_dtype=torch.float32)
    for block in model.layers:
        fully_shard(block, mp_policy=policy)
    fully_shard(root, mp_policy=policy)  # fully_shard broadcasts nothing: every rank built the same seed
    params = list(root.parameters())
    if torch.device(device).type == "cuda":
        optimizer = torch.optim.AdamW(params, lr=spec.lr, eps=spec.eps, weight_decay=spec.weight_decay, fused=True)
    else:
        optimizer = torch.optim.AdamW(params, lr=spec.lr, eps=spec.eps, weight_decay=spec.weight_decay, foreach=True)
    tokens, targets = random_batch(size, spec.batch_per_rank, spec.context_length,
                                   spec.seed + 1 + rank if data_seed is None else data_seed, device)
    batch = spec.batch_per_rank * world
    info = {"batch_size": batch, "batch_per_rank": spec.batch_per_rank, "world_size": world,
            "parameters": parameter_count(size), "flops_per_step": train_step_flops(size, batch, spec.context_length)}
    return PytorchPartsStep(spec, model, root, optimizer, tokens, targets, device, info)
