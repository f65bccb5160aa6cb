"""Activation checkpointing (problem 6): what one level of checkpointing over groups of k blocks
should cost, what it does cost, and nested schemes.

Model of peak activation memory, one level, N blocks in groups of k (the model's
`checkpoint_blocks=k`): the forward keeps only each group's input, ceil(N/k) tensors of
`boundary_bytes` (one residual-stream activation); the backward recomputes one group at a time,
holding that group's saved tensors, k * `block_bytes`, while every boundary is still alive (the
last group is recomputed first). So

    M(k) = ceil(N/k) * boundary_bytes + k * block_bytes,

minimised near k* = sqrt(N * boundary_bytes / block_bytes), where M is about
2 * sqrt(N * boundary_bytes * block_bytes): the sqrt(N) law. Compute: one extra forward of every
block, whatever k. Gradients, optimizer state, weights and the logits are the same for every k
and sit on top of M(k).

Nested checkpoints trade more compute for less memory: `bisection_checkpoint` (O(log N)
boundaries, O(N log N) block forwards) and `recompute_from_input` (O(1): only the input and one
block's saved tensors, O(N^2) block forwards), with their costs counted by `bisection_cost` and
`recompute_from_input_cost`.
"""

from __future__ import annotations

import gc
import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from cs336sys.timing import peak_memory_bytes, reset_peak_memory, summarize_ms, time_steps


def checkpoint_memory(num_blocks: int, group_size: int, block_bytes: float, boundary_bytes: float) -> float:
    """M(k) above: predicted peak activation bytes with one level of checkpointing over groups of
    `group_size` blocks (0 = no checkpointing: every block's saved tensors at once)."""
    if group_size <= 0:
        return num_blocks * block_bytes
    group_size = min(group_size, num_blocks)
    return math.ceil(num_blocks / group_size) * boundary_bytes + group_size * block_bytes


def optimal_group_size(num_blocks: int, block_bytes: float, boundary_bytes: float) -> dict[str, Any]:
    """The group size minimising `checkpoint_memory` for N blocks.

    Returns {"k_continuous": sqrt(N * boundary / block), "best_k" (the integer 1..N with the
    least predicted memory; the smallest such k on ties), "best_bytes", "sqrt_law_bytes"
    (2 * sqrt(N * boundary * block)), "no_checkpoint_bytes" (N * block), "predicted": {k: bytes}
    for every k in 1..N}.
    """
    predicted = {k: checkpoint_memory(num_blocks, k, block_bytes, boundary_bytes) for k in range(1, num_blocks + 1)}
    best = min(predicted, key=lambda k: (predicted[k], k))
    return {
        "k_continuous": math.sqrt(num_blocks * boundary_bytes / block_bytes),
        "best_k": best,
        "best_bytes": predicted[best],
        "sqrt_law_bytes": 2 * math.sqrt(num_blocks * boundary_bytes * block_bytes),
        "no_checkpoint_bytes": num_blocks * block_bytes,
        "predicted": predicted,
    }


def recompute_from_input(blocks: Sequence[nn.Module], x: torch.Tensor) -> torch.Tensor:
    """Least activation memory, whatever the compute (problem 6a): nest checkpoints so that only
    the input is ever kept; block i's backward first recomputes blocks 0..i-1 from the input.

        y = blocks[N-1](checkpoint(blocks[0..N-2] done the same way, x))

    Peak: the input, one block's saved tensors (its own input among them) and its output
    gradient: O(1) in N. Compute: N + (N-1) + ... + 1 = N(N+1)/2 block forwards, O(N^2).
    """
    if len(blocks) == 1:
        return blocks[0](x)
    inner = checkpoint(recompute_from_input, blocks[:-1], x, use_reentrant=False)
    return blocks[-1](inner)


def recompute_from_input_cost(num_blocks: int) -> dict[str, int]:
    """Boundary tensors alive at the peak (besides one block's saved tensors) and block forwards."""
    return {"peak_boundaries": 1, "block_forwards": num_blocks * (num_blocks + 1) // 2}


def bisection_checkpoint(blocks: Sequence[nn.Module], x: torch.Tensor) -> torch.Tensor:
    """The balanced nested scheme: checkpoint each half of the block list, recursively, down to
    single blocks. Peak: O(log N) boundaries (one per level on the path being recomputed) plus one
    block's saved tensors; compute: every level recomputes each block once, O(N log N)."""
    if len(blocks) == 1:
        return blocks[0](x)
    mid = len(blocks) // 2
    x = checkpoint(bisection_checkpoint, blocks[:mid], x, use_reentrant=False)
    return checkpoint(bisection_checkpoint, blocks[mid:], x, use_reentrant=False)


def bisection_cost(num_blocks: int) -> dict[str, int]:
    """Boundary tensors alive at the peak (besides one block's saved tensors) and block forwards
    (first pass and recomputes) of `bisection_checkpoint`, counted on its recursion."""
    def cost(n: int) -> tuple[int, int]:
        if n == 1:
            return 0, 1
        left, right = n // 2, n - n // 2
        left_boundaries, left_forwards = cost(left)
        right_boundaries, right_forwards = cost(right)
        # the right half's input is kept while that half is recomputed by its own scheme; each
        # level's recompute runs every block of the segment once more
        return max(left_boundaries, 1 + right_boundaries), left_forwards + right_forwards + n
    boundaries, forwards = cost(num_blocks)
    return {"peak_boundaries": boundaries + 1, "block_forwards": forwards}


def measure_step(make_step: Callable[[], Callable[[], object]], device: str, warmup: int = 1,
                 steps: int = 3) -> dict[str, Any]:
    """Build a step, run `warmup` steps, reset the peak, time `steps` more. Returns {"status"
    ("ok" | "oom"), "peak_memory_bytes" (CUDA's max allocated over the timed steps; None on CPU),
    "step_ms" (summarize_ms of the timed steps, None on OOM), "error" (None or the OOM message)}.
    The step and everything it holds are dropped before returning."""
    result: dict[str, Any] = {"status": "ok", "peak_memory_bytes": None, "step_ms": None, "error": None}
    step = None
    try:
        step = make_step()
        for _ in range(warmup):
            step()
        reset_peak_memory(device)
        result["step_ms"] = summarize_ms(time_steps(step, 0, steps, device))
        result["peak_memory_bytes"] = peak_memory_bytes(device)
    except torch.OutOfMemoryError as error:
        result.update(status="oom", error=str(error).splitlines()[0])
    finally:
        del step
        gc.collect()
        if torch.device(device).type == "cuda":
            torch.cuda.empty_cache()
    return result


def checkpointing_sweep(make_step: Callable[[int], Callable[[], object]], group_sizes: Sequence[int], device: str,
                        warmup: int = 1, steps: int = 3) -> list[dict[str, Any]]:
    """`measure_step` for each group size k (0 = no checkpointing); `make_step(k)` builds the step,
    e.g. `lambda k: build_step(replace(spec, checkpoint_blocks=k), device).run`. Returns one row
    per k: {"checkpoint_blocks": k, **measure_step(...)}."""
    return [{"checkpoint_blocks": k, **measure_step(lambda k=k: make_step(k), device, warmup, steps)}
            for k in group_sizes]
