"""A one-GPU proxy of the leaderboard step: NOT the leaderboard step, and not its numbers.

    run_proxy_point(ProxySettings(variant="ours", fused_elementwise=True), run)   # one process, one GPU

The step (`cs336sys.leaderboard.step`, or PyTorch's parts) at the 8B's widths, vocabulary and
32,768-token sample, but with `num_layers` blocks (12 of the 8B's 34 in the grid; notes/leaderboard.md
has the peaks of its first runs on one H200) on a world of one rank: the shards are whole, and the
collectives copy within the device. It ranks the step's options between 2-GPU runs; what it cannot
show is communication, the 2-rank memory and the whole model's time.
Every result says so in its settings (`proxy`).

What is measured: build, `warmup` untimed steps, then `steps` steps each bracketed by a device
synchronisation (`cs336sys.timing.time_steps`); their median is the proxy's step time. The allocator's
peak over the timed steps, and over the build. A process group of one rank is made for the point
(PyTorch's FSDP2 needs one) and ended after it, unless the caller already has one.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist

from cs336sys.jobs import Run
from cs336sys.leaderboard.experiments import VARIANTS
from cs336sys.leaderboard.step import LeaderboardSpec
from cs336sys.sizes import get_size
from cs336sys.timing import peak_memory_bytes, reset_peak_memory, summarize_ms, synchronize, time_steps

PROXY = "one-GPU proxy of the leaderboard step (fewer layers, 1 rank): not a leaderboard result"


@dataclass(frozen=True)
class ProxySettings:
    proxy: str = PROXY
    """Recorded in every result: these are proxies, not leaderboard numbers."""
    size: str = "8B"
    """Model size whose widths and vocabulary are used, a name in `cs336sys.sizes.SIZES` (8B)."""
    num_layers: int = 12
    """Transformer blocks built (the 8B has 34)."""
    context_length: int = 32768
    """Sequence length of each sample, in tokens."""
    variant: str = "ours"
    """ours (our FSDP units and kernels) | pytorch_parts (FSDP2 and PyTorch's kernels: the baseline)."""
    compute_dtype: str = "bf16"
    """Dtype the parameters are gathered and computed in: bf16 | fp32; master weights and grads fp32."""
    attention: str = "flash"
    """Ours only: flash | flash_tuned | gluon (Hopper) | sdpa | naive; the baseline always uses sdpa."""
    checkpoint_blocks: int | str | tuple[int, ...] = "all"
    """Ours only: blocks checkpointed, of `num_layers`: "all" | "none" | k (the first k) | indices."""
    fused_elementwise: bool = False
    """Ours only: the blocks' RMSNorm, SwiGLU gate and RoPE as Triton kernels."""
    keep_attention: bool = False
    """Ours only: checkpointed blocks keep attention's outputs (sdpa, flash_tuned, gluon) and do not recompute it."""
    offload_blocks: int = 0
    """Ours only: the first this many checkpointed blocks keep their saved tensors in host memory instead."""
    ce_chunk_tokens: int = 4096
    """Tokens per chunk of the LM head + cross-entropy (the full logits never exist)."""
    warmup: int = 2
    """Untimed steps before the timed ones."""
    steps: int = 5
    """Timed steps, each bracketed by a device synchronisation; their median is the step time."""
    seed: int = 0
    """Seed of the model's initial parameters (the batch's seed is 4000)."""
    device: str = "cuda"
    """Device kind: cuda | cpu (the grid's `device`); the job runner picks this rank's GPU."""

    def __post_init__(self) -> None:
        if self.variant not in VARIANTS:
            raise ValueError(f"unknown variant {self.variant!r}; known: {', '.join(VARIANTS)}")
        if self.steps < 1 or self.warmup < 0:
            raise ValueError(f"steps must be positive and warmup non-negative, got {self.steps} and {self.warmup}")

    def spec(self) -> LeaderboardSpec:
        base = get_size(self.size)
        size = dataclasses.replace(base, name=f"{base.name} ({self.num_layers} layers)", num_layers=self.num_layers)
        policy = self.checkpoint_blocks
        return LeaderboardSpec(size=size, context_length=self.context_length, compute_dtype=self.compute_dtype,
                               attention=self.attention,
                               checkpoint_blocks=tuple(policy) if isinstance(policy, list) else policy,
                               fused_elementwise=self.fused_elementwise, keep_attention=self.keep_attention,
                               offload_blocks=self.offload_blocks, ce_chunk_tokens=self.ce_chunk_tokens,
                               seed=self.seed, world_size=1)


@contextlib.contextmanager
def _group_of_one(device: str) -> Iterator[None]:
    """A process group of this process alone (NCCL on CUDA, gloo on the CPU), unless one exists."""
    if dist.is_initialized():
        if dist.get_world_size() != 1:
            raise ValueError(f"the proxy runs on one rank; this process group has {dist.get_world_size()}")
        yield
        return
    cuda = torch.device(device).type == "cuda"
    extra = {"device_id": torch.device(device)} if cuda else {}
    dist.init_process_group("nccl" if cuda else "gloo", store=dist.HashStore(), rank=0, world_size=1, **extra)
    try:
        yield
    finally:
        dist.destroy_process_group()


def run_proxy_point(settings: ProxySettings, run: Run) -> dict:
    """Time one config of the step on one rank; see the module docstring."""
    with _group_of_one(run.device):
        if settings.variant == "ours":
            from cs336sys.leaderboard.step import build_leaderboard_step as build
        else:
            from cs336sys.leaderboard.baseline import build_pytorch_parts_step as build
        reset_peak_memory(run.device)
        step = build(settings.spec(), run.device, data_seed=4000)
        synchronize(run.device)
        build_peak = peak_memory_bytes(run.device)
        time_steps(step.run, settings.warmup, 0, run.device)
        reset_peak_memory(run.device)
        times = time_steps(step.run, 0, settings.steps, run.device)
        peak = peak_memory_bytes(run.device)
        return {**summarize_ms(times), "step_ms": times, "peak_bytes": peak, "build_peak_bytes": build_peak,
                "world_size": 1, "num_layers": settings.num_layers, "variant": settings.variant,
                "parameters": step.info["parameters"], "flops_per_step": step.info["flops_per_step"],
                "proxy": PROXY}
