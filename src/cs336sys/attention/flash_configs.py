"""Part of `flash_triton`: the Triton kernels' tile shapes, a small table chosen by (d, dtype, size).

A deliberate table instead of `triton.autotune`: every entry compiles once, so the whole flash
grid (d 16..128, two dtypes, seq 128..65,536) compiles a handful of kernels, not hundreds, and no
timing includes a search. The entries were chosen on an H100 with the tuning script that now lies
in notes/runs/2026-11-23-h200/flash_tune.py; notes/flash_attention.md has the measurements.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

import torch

H100_SMS = 132


@dataclass(frozen=True)
class Tiles:
    """The forward's launch shape: block_m query rows per program, block_n keys per step."""

    block_m: int  # a multiple of block_n, so that causal tiles line up on the diagonal
    block_n: int
    num_warps: int
    num_stages: int

    def __str__(self) -> str:
        return f"{self.block_m}x{self.block_n}/w{self.num_warps}/s{self.num_stages}"

    @classmethod
    def parse(cls, text: str) -> Tiles:
        """The inverse of str(): "256x64/w8/s3"."""
        m = re.fullmatch(r"(\d+)x(\d+)/w(\d+)/s(\d+)", text.strip())
        if not m:
            raise ValueError(f"forward tiles {text!r} are not of the form MxN/wW/sS, e.g. 128x64/w8/s3")
        return cls(*map(int, m.groups()))


@dataclass(frozen=True)
class BackwardConfig:
    """The backward kernel's launch shape (one launch runs both kinds of program)."""

    block_m_kv: int  # dK/dV programs: query rows per step ...
    block_n_kv: int  # ... and keys per program (a multiple of block_m_kv)
    block_m_q: int  # dQ programs: query rows per program (a multiple of block_n_q) ...
    block_n_q: int  # ... and keys per step
    num_warps: int
    num_stages: int
    fused: bool = True  # one launch for both kinds of program, or one launch per kind

    def __str__(self) -> str:
        return (f"kv{self.block_m_kv}x{self.block_n_kv}/q{self.block_m_q}x{self.block_n_q}"
                f"/w{self.num_warps}/s{self.num_stages}" + ("" if self.fused else "/split"))

    @classmethod
    def parse(cls, text: str) -> BackwardConfig:
        """The inverse of str(): "kv64x128/q128x64/w8/s3/split" (without /split: one fused launch)."""
        m = re.fullmatch(r"kv(\d+)x(\d+)/q(\d+)x(\d+)/w(\d+)/s(\d+)(/split)?", text.strip())
        if not m:
            raise ValueError(f"backward tiles {text!r} are not of the form kvMxN/qMxN/wW/sS[/split], "
                             "e.g. kv64x128/q128x64/w8/s3/split")
        *numbers, split = m.groups()
        return cls(*map(int, numbers), fused=split is None)


# Under the interpreter (CPU) the tiles only need to be small and unequal, so that the tests
# walk several tiles per program and the causal diagonal split.
INTERPRETER_FORWARD = Tiles(32, 16, 4, 1)
INTERPRETER_BACKWARD = BackwardConfig(16, 32, 32, 16, 4, 1)


def _waves(seq: int, block: int, batch_heads: int) -> float:
    """Programs of `block` rows per multiprocessor of an H100."""
    return -(-seq // block) * batch_heads / H100_SMS


@functools.cache
def forward_config(d: int, dtype: torch.dtype, seq_q: int, batch_heads: int, on_gpu: bool) -> Tiles:
    if not on_gpu:
        return INTERPRETER_FORWARD
    if dtype == torch.float32:  # 4-byte tiles: half as many rows fit in shared memory
        return Tiles(64, 32, 4, 2) if d >= 128 else Tiles(64, 64, 4, 2)
    # 128-row tiles (8 warps) pay off only with two or more programs per multiprocessor.
    if _waves(seq_q, 128, batch_heads) >= 2:
        return Tiles(128, 64, 8, 3)
    return Tiles(64, 64, 4, 3)


@functools.cache
def backward_config(d: int, dtype: torch.dtype, seq_k: int, batch_heads: int, on_gpu: bool) -> BackwardConfig:
    if not on_gpu:
        return INTERPRETER_BACKWARD
    if dtype == torch.float32:
        return BackwardConfig(16 if d >= 128 else 32, 64, 64, 32, 4, 2)
    # Many programs (8+ of each kind per multiprocessor): at d <= 64 one launch per kind, each
    # with its own register allocation (3% faster at the leaderboard shape); otherwise one launch
    # of both kinds, which fills the GPU when one head's sequence gives too few programs.
    many = _waves(seq_k, 64, batch_heads) >= 8
    if d >= 128:
        return BackwardConfig(32, 64, 64, 64, 4, 2 if many else 3, fused=True)
    return BackwardConfig(64, 64, 64, 64, 4, 3, fused=not many)
