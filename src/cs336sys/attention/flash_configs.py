"""Tile shapes for the Triton FlashAttention kernels: a small table, chosen by (d, dtype, size).

A deliberate table instead of `triton.autotune`: every entry compiles once, so the whole flash
grid (d 16..128, two dtypes, seq 128..65,536) compiles a handful of kernels, not hundreds, and a
timing never includes a search. The entries were chosen on an H100 with benchmarks/flash_tune.py;
notes/flash_attention.md has the measurements.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

H100_SMS = 132


@dataclass(frozen=True)
class Tiles:
    """One kernel's launch shape: each program owns block_m rows (forward, dQ) or block_n keys
    (dK/dV) and loops over the other dimension in steps of the other block."""

    block_m: int  # query rows
    block_n: int  # keys
    num_warps: int
    num_stages: int

    def __str__(self) -> str:
        return f"{self.block_m}x{self.block_n}/w{self.num_warps}/s{self.num_stages}"


@dataclass(frozen=True)
class BackwardConfig:
    dkdv: Tiles  # block_n % block_m == 0, so causal tiles line up
    dq: Tiles  # block_m % block_n == 0
    atomic_dq: bool = False  # accumulate dQ inside the dK/dV kernel with fp32 atomics instead


# Under the interpreter (CPU) the tiles only need to be small and unequal, so that the tests
# walk several tiles per program and the causal diagonal split.
INTERPRETER_FORWARD = Tiles(32, 16, 4, 1)
INTERPRETER_BACKWARD = BackwardConfig(dkdv=Tiles(16, 32, 4, 1), dq=Tiles(32, 16, 4, 1))


def _few_programs(seq: int, block: int, batch_heads: int) -> bool:
    """Would tiles of `block` rows leave some of an H100's multiprocessors without a program?"""
    return -(-seq // block) * batch_heads < H100_SMS


def forward_config(d: int, dtype: torch.dtype, seq_q: int, batch_heads: int,
                   device: torch.device) -> Tiles:
    if device.type != "cuda":
        return INTERPRETER_FORWARD
    if dtype == torch.float32:  # 4-byte tiles: half as many rows fit in shared memory
        return Tiles(64, 32, 4, 2) if d >= 128 else Tiles(64, 64, 4, 2)
    block_m = 64 if _few_programs(seq_q, 128, batch_heads) else 128
    if d <= 64:
        return Tiles(block_m, 64, 4, 3)
    return Tiles(block_m, 64, 8 if block_m == 128 else 4, 3)


def backward_config(d: int, dtype: torch.dtype, seq_k: int, batch_heads: int,
                    device: torch.device) -> BackwardConfig:
    if device.type != "cuda":
        return INTERPRETER_BACKWARD
    if dtype == torch.float32:
        return BackwardConfig(dkdv=Tiles(32, 64, 4, 2), dq=Tiles(64, 32, 4, 2))
    block = 64 if _few_programs(seq_k, 128, batch_heads) else 128
    return BackwardConfig(dkdv=Tiles(32, block, 4, 3 if d >= 128 else 4),
                          dq=Tiles(block, 32, 4, 3 if d >= 128 else 4))
