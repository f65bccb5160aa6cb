"""The leaderboard training step from our own parts, driven unit by unit.

    spec = LeaderboardSpec()                               # 8B, 32k tokens, one sample per rank, bf16
    step = build_leaderboard_step(spec, "cuda:0")          # inside a process group of 2
    step.run()                                             # one whole step; returns the (local) loss

One step: `optimizer.zero_grad(set_to_none=True)`; the token embedding, each TransformerBlock
(checkpointed or not, per `checkpoint_blocks`) and ln_final + LM head as `BlockFSDP` units; the
loss as `lm_head_cross_entropy` (chunks of `ce_chunk_tokens`, the (N, V) logits never exist);
backward; `finish_gradient_synchronization()`; `FusedAdamW.step()` over the fp32 shards, which
also rewrites each shard's bf16 copy (what the next step's all-gathers send).

Options, each off by default (the configurations measured before them run as they did):
`fused_elementwise` runs each block through `fused_block.fused_block_forward` (RMSNorm, the SwiGLU
gate and RoPE as Triton kernels); attention "flash_tuned" is our flash through the step's own call
(`cs336sys.leaderboard.attention`: the tiles tuned at the 8B's shape), attention "gluon" our Gluon
kernels for Hopper (the same module); `keep_attention` makes each checkpointed block keep attention's
outputs from the forward, so its recompute skips attention's forward kernel (SDPA's, "flash_tuned"'s
or "gluon"'s); `offload_blocks` (k) takes the first k checkpointed blocks out of checkpointing: their
saved tensors go to pinned host memory during the forward and come back before their backward
(`cs336sys.leaderboard.offload.HostOffload`), so they are not recomputed. The earliest blocks, since
their copies have the rest of the step to hide under (one H200: the first 4 of 12 blocks offloaded ran
as fast as keeping all 12, the first 8 of 12 1.6x slower; notes/runs/2026-11-29-offload-probe).

Why drive the parts instead of calling `model(tokens)`: the model's forward ends in full logits
(151,936 x 32,768 x 4 bytes = 20 GB in fp32) and checkpoints every k-th group uniformly; the step
needs the fused head + loss and a per-block checkpoint policy. The model's parameters and modules
are used unchanged, through `torch.func.functional_call`.

Compute precision is the parameters' own dtype (the units gather bf16 weights), not autocast:
embedding lookups, matmuls and attention run in bf16, RMSNorm in fp32 (its own rule), the
cross-entropy in fp32 chunks; gradients are reduced and applied in fp32.

Memory (8B, 2 ranks, bf16, per rank): fp32 master shard 16.2 GB, Adam m and v 32.4 GB, fp32
gradient shard 16.2 GB, bf16 copy 8.1 GB: 73 GB persistent. While building, every rank holds the
whole fp32 model once (32.4 GB, built on the device with the seed, so every rank starts the same;
BlockFSDP then broadcasts rank 0's) before it is sharded unit by unit (each unit's originals are
freed as its shard is made), before any optimizer state exists: the allocator's peak while building
was 36.9 GB per GPU (`build_peak_bytes` of results/leaderboard_step/main/ours.json).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor
from torch.func import functional_call

from cs336sys.distributed import process_group
from cs336sys.distributed.fsdp_blocks import BlockFSDP, leaderboard_units
from cs336sys.distributed.fsdp_unit import FlatUnit
from cs336sys.dtypes import torch_dtype
from cs336sys.leaderboard.adamw import FusedAdamW
from cs336sys.leaderboard.loss import lm_head_cross_entropy
from cs336sys.leaderboard.offload import HostOffload
from cs336sys.model import AttentionFn, TransformerLM, build_model
from cs336sys.sizes import ModelSize, get_size, parameter_count, train_step_flops

ATTENTION = ("flash", "flash_tuned", "gluon", "sdpa", "naive")
KEPT_ATTENTION = ("sdpa", "flash_tuned", "gluon")  # one dispatched op each: what keep_attention can keep
COMPUTE_DTYPES = ("bf16", "fp32")
CheckpointPolicy = int | str | tuple[int, ...]


@dataclass(frozen=True)
class LeaderboardSpec:
    """What one leaderboard step is. `size`: a registry name or a `ModelSize` (tests use tiny ones).

    `checkpoint_blocks`: "all", "none", k (the first k blocks: their activations live longest), or
    a tuple of block indices. `world_size`: the number of ranks the step must run on (None: any).
    `fused_elementwise`, `keep_attention`, `offload_blocks`: see the module docstring.
    """

    size: str | ModelSize = "8B"
    context_length: int = 32768
    batch_per_rank: int = 1
    compute_dtype: str = "bf16"
    attention: str = "flash"
    checkpoint_blocks: CheckpointPolicy = "all"
    reshard_after_forward: bool = True
    ce_chunk_tokens: int = 4096
    seed: int = 0
    world_size: int | None = None
    lr: float = 1e-3
    eps: float = 1e-8
    weight_decay: float = 0.01
    fused_elementwise: bool = False
    keep_attention: bool = False
    offload_blocks: int = 0

    def __post_init__(self) -> None:
        size = get_size(self.size)
        if self.attention not in ATTENTION:
            raise ValueError(f"unknown attention {self.attention!r}; known: {', '.join(ATTENTION)}")
        if self.compute_dtype not in COMPUTE_DTYPES:
            raise ValueError(f"compute_dtype must be one of {', '.join(COMPUTE_DTYPES)}, got {self.compute_dtype!r}")
        for name in ("context_length", "batch_per_rank", "ce_chunk_tokens"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"{name} must be a positive integer, got {getattr(self, name)!r}")
        if self.world_size is not None and self.world_size < 1:
            raise ValueError(f"world_size must be positive (or None), got {self.world_size}")
        checkpointed = checkpointed_blocks(self.checkpoint_blocks, size.num_layers)
        if (not isinstance(self.offload_blocks, int) or isinstance(self.offload_blocks, bool)
                or not 0 <= self.offload_blocks <= len(checkpointed)):
            raise ValueError(f"offload_blocks={self.offload_blocks!r}: the first k of the {len(checkpointed)} "
                             f"checkpointed blocks, 0 <= k <= {len(checkpointed)}")
        if self.keep_attention and self.attention not in KEPT_ATTENTION:
            raise ValueError(f"keep_attention keeps the forward of attention {' or '.join(KEPT_ATTENTION)}, "
                             f"not {self.attention!r}")

    @property
    def model_size(self) -> ModelSize:
        return get_size(self.size)

    def block_policy(self) -> tuple[frozenset[int], frozenset[int]]:
        """(checkpointed, offloaded): the blocks recomputed in the backward, and those whose saved tensors
        wait in host memory instead (the first `offload_blocks` of `checkpoint_blocks`); the rest keep theirs."""
        chosen = checkpointed_blocks(self.checkpoint_blocks, self.model_size.num_layers)
        offloaded = frozenset(sorted(chosen)[:self.offload_blocks])
        return chosen - offloaded, offloaded


def checkpointed_blocks(policy: CheckpointPolicy | set[int] | frozenset[int], num_layers: int) -> frozenset[int]:
    """The indices of the blocks a policy checkpoints (ValueError for anything else)."""
    if policy == "all":
        return frozenset(range(num_layers))
    if policy == "none":
        return frozenset()
    if isinstance(policy, int) and not isinstance(policy, bool):
        if not 0 <= policy <= num_layers:
            raise ValueError(f"checkpoint_blocks={policy}: the first k blocks, 0 <= k <= {num_layers}")
        return frozenset(range(policy))
    if isinstance(policy, tuple | list | set | frozenset) and all(isinstance(i, int) for i in policy):
        bad = [i for i in policy if not 0 <= i < num_layers]
        if bad:
            raise ValueError(f"checkpoint_blocks: block indices {bad} outside 0..{num_layers - 1}")
        return frozenset(policy)
    raise ValueError(f"checkpoint_blocks must be 'all', 'none', a number of leading blocks or a tuple of block "
                     f"indices, got {policy!r}")


def resolve_attention(name: str, attention_fn: AttentionFn | None = None) -> str | AttentionFn:
    if attention_fn is not None:
        return attention_fn
    if name == "flash":
        from cs336sys.attention.flash_triton import flash_causal_attention

        return flash_causal_attention
    if name == "flash_tuned":
        from cs336sys.leaderboard.attention import tuned_flash_attention

        return tuned_flash_attention
    if name == "gluon":
        from cs336sys.leaderboard.attention import gluon_attention

        return gluon_attention
    return name


def random_batch(size: ModelSize, batch: int, context_length: int, seed: int,
                 device: str | torch.device) -> tuple[Tensor, Tensor]:
    """Tokens and targets drawn on the CPU (the same on any device), then moved."""
    generator = torch.Generator(device="cpu").manual_seed(seed)
    return tuple(torch.randint(0, size.vocab_size, (batch, context_length), generator=generator).to(device)
                 for _ in range(2))


def check_world_size(spec: LeaderboardSpec) -> tuple[int, int]:
    rank, world = process_group.rank(), process_group.world_size()
    if spec.world_size is not None and spec.world_size != world:
        raise ValueError(f"the spec asks for {spec.world_size} ranks but the process group has {world}")
    return rank, world


def no_phase(name: str) -> contextlib.AbstractContextManager:
    return contextlib.nullcontext()


class StepLoop:
    """The step every leaderboard variant runs, as the handout's harness does: zero_grad, forward and
    backward, the gradients' synchronisation (none by default), the optimizer step. A variant
    provides `forward_backward()`, `optimizer` and `phase`."""

    optimizer: torch.optim.Optimizer
    phase: Callable[[str], contextlib.AbstractContextManager]

    def forward_backward(self) -> Tensor:
        raise NotImplementedError

    def sync(self) -> None:
        pass

    def optimizer_step(self) -> None:
        with self.phase("optimizer_step"):
            self.optimizer.step()

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def run(self) -> Tensor:
        """One training step; returns this rank's loss (detached, not synchronised)."""
        self.zero_grad()
        loss = self.forward_backward()
        self.sync()
        self.optimizer_step()
        return loss


@dataclass
class LeaderboardStep(StepLoop):
    """A built step; `phase(name)` brackets "forward", "backward", "sync", "optimizer_step" (a
    profiler sets it to a range-opening function, as for `cs336sys.training.step.Step`).
    `tokens` and `targets` are this rank's batch; replace them to feed other data."""

    spec: LeaderboardSpec
    model: TransformerLM  # its parameters are meta tensors: the shards live in `fsdp`
    fsdp: BlockFSDP
    optimizer: FusedAdamW
    tokens: Tensor
    targets: Tensor
    device: str
    checkpointed: frozenset[int]
    info: dict = field(default_factory=dict)
    checkpoint_context: Callable | None = None  # the checkpoint's context_fn (keep_attention's policy)
    offloaded: frozenset[int] = frozenset()
    offload: HostOffload | None = None  # holds the offloaded blocks' saved tensors (when `offloaded`)
    phase: Callable[[str], contextlib.AbstractContextManager] = no_phase

    def _embed(self, params: dict[str, Tensor], tokens: Tensor) -> Tensor:
        return functional_call(self.model.token_embeddings, params, (tokens,))

    def _block_fn(self, index: int) -> Callable[[dict[str, Tensor], Tensor], Tensor]:
        block = self.model.layers[index]
        if self.spec.fused_elementwise:
            from cs336sys.leaderboard.fused_block import fused_block_forward

            return lambda params, x: fused_block_forward(block, params, x)
        return lambda params, x: functional_call(block, params, (x,))

    def _offloaded_fn(self, index: int, fn: Callable[[dict[str, Tensor], Tensor], Tensor]
                      ) -> Callable[[dict[str, Tensor], Tensor], Tensor]:
        """`fn` with block `index`'s saved tensors sent to host memory. Its hooks replace the unit's own
        (`FlatUnit.pack`: the gathered weights saved as views of the unit's buffer, not copied), so they
        run the unit's first: a weight stays a view, any other tensor goes to the host."""
        unit, offload = self.fsdp.units[index + 1], self.offload

        def pack(t: Tensor) -> object:
            saved = unit.pack(t)
            return offload.pack(saved) if isinstance(saved, Tensor) else saved

        def unpack(saved: object) -> Tensor:
            return FlatUnit.unpack(offload.unpack(saved))

        def run(params: dict[str, Tensor], x: Tensor) -> Tensor:
            with offload.group(index), torch.autograd.graph.saved_tensors_hooks(pack, unpack):
                return fn(params, x)

        return run

    def _head_loss(self, params: dict[str, Tensor], x: Tensor, targets: Tensor) -> Tensor:
        h = functional_call(self.model.ln_final, {"weight": params["ln_final.weight"]}, (x,))
        return lm_head_cross_entropy(h, params["lm_head.weight"], targets, self.spec.ce_chunk_tokens)

    def forward(self) -> Tensor:
        """Embedding, blocks, head + loss: this rank's mean loss (a graph to backpropagate)."""
        with self.phase("forward"):
            x = self.fsdp.run_unit(0, self._embed, self.tokens)
            last_offloaded = max(self.offloaded, default=None)
            for i in range(len(self.model.layers)):
                fn = self._block_fn(i)
                if i in self.offloaded:
                    fn = self._offloaded_fn(i, fn)
                elif last_offloaded is not None and i == last_offloaded + 2 and x.requires_grad:
                    # the copies back start once this block's backward is done: the next block's backward
                    # hides them, and the step's peak (the end of the forward) does not hold them
                    x.register_hook(self._prefetch)
                x = self.fsdp.run_unit(i + 1, fn, x, checkpointed=i in self.checkpointed,
                                      context_fn=self.checkpoint_context)
            if last_offloaded is not None and last_offloaded + 2 >= len(self.model.layers):
                self.offload.prefetch()
            return self.fsdp.run_unit(len(self.model.layers) + 1, self._head_loss, x, self.targets)

    def _prefetch(self, grad: Tensor) -> None:
        self.offload.prefetch()

    def forward_backward(self) -> Tensor:
        loss = self.forward()
        with self.phase("backward"):
            loss.backward()
        if self.offload is not None:
            self.offload.reset()  # the host buffers back to the pool, for the next step
        return loss.detach()

    def sync(self) -> None:
        with self.phase("sync"):
            self.fsdp.finish_gradient_synchronization()


def build_leaderboard_step(spec: LeaderboardSpec, device: str | torch.device,
                           attention_fn: AttentionFn | None = None, data_seed: int | None = None) -> LeaderboardStep:
    """Build the model (seeded by `spec.seed`; rank 0's wins), shard it into units, make the
    optimizer and this rank's random batch (seeded by `data_seed`, default `spec.seed + 1 + rank`)."""
    rank, world = check_world_size(spec)
    size = spec.model_size
    device = str(device)
    if spec.attention == "gluon" and attention_fn is None:
        from cs336sys.leaderboard.attention import gluon_device_refusal

        reason = gluon_device_refusal(device)
        if reason is not None:
            raise ValueError(f"attention 'gluon': {reason}")
    attention = resolve_attention(spec.attention, attention_fn)
    torch.manual_seed(spec.seed)
    model = build_model(size, spec.context_length, device=device, attention=attention)
    fsdp = BlockFSDP(leaderboard_units(model), compute_dtype=torch_dtype(spec.compute_dtype),
                     reshard_after_forward=spec.reshard_after_forward, device=device)
    optimizer = FusedAdamW(fsdp.shards(), lr=spec.lr, eps=spec.eps, weight_decay=spec.weight_decay,
                           lowp_copies=fsdp.lowp_copies())
    tokens, targets = random_batch(size, spec.batch_per_rank, spec.context_length,
                                   spec.seed + 1 + rank if data_seed is None else data_seed, device)
    batch = spec.batch_per_rank * world
    checkpointed, offloaded = spec.block_policy()
    info = {"batch_size": batch, "batch_per_rank": spec.batch_per_rank, "world_size": world,
            "parameters": parameter_count(size), "flops_per_step": train_step_flops(size, batch, spec.context_length),
            "checkpointed_blocks": sorted(checkpointed)}
    if offloaded:
        info["offloaded_blocks"] = sorted(offloaded)
    context = None
    if spec.keep_attention:
        from cs336sys.leaderboard.attention import keep_attention_context as context
    return LeaderboardStep(spec, model, fsdp, optimizer, tokens, targets, device, checkpointed, info,
                           checkpoint_context=context, offloaded=offloaded,
                           offload=HostOffload() if offloaded else None)
