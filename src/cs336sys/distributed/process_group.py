"""Process-group setup shared by the job runner (under torchrun), the spawn helper (tests) and
the distributed experiments: NCCL on CUDA, gloo on the CPU, always with a timeout.

A rank reads who it is from the environment torchrun (or `spawn`) sets: RANK, WORLD_SIZE,
LOCAL_RANK, MASTER_ADDR, MASTER_PORT. Every process group gets a timeout, so a collective whose
peer died or raised ends in an error instead of waiting forever; the launcher then ends the job.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

DEFAULT_TIMEOUT_S = 600.0  # long enough for a compile or a cold cuBLAS on some rank; tests use seconds
TIMEOUT_ENV = "CS336SYS_PG_TIMEOUT_S"


@dataclass(frozen=True)
class RankInfo:
    rank: int
    world_size: int
    local_rank: int
    device: str  # "cuda:<local rank>" or "cpu"
    backend: str | None  # "nccl", "gloo", or None for a single process without a group

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def timeout_s() -> float:
    value = os.environ.get(TIMEOUT_ENV)
    try:
        return float(value) if value else DEFAULT_TIMEOUT_S
    except ValueError:
        raise ValueError(f"{TIMEOUT_ENV}={value!r} is not a number of seconds") from None


def env_rank() -> tuple[int, int, int]:
    """(rank, world size, local rank) from the launcher's environment; (0, 1, 0) outside one."""
    return (int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)),
            int(os.environ.get("LOCAL_RANK", os.environ.get("RANK", 0))))


def init(device: str = "cuda", backend: str | None = None, timeout: float | None = None) -> RankInfo:
    """Join the process group the environment describes (or none for a world of one).

    `device` is the grid's device kind ("cuda" or "cpu"): CUDA ranks use NCCL and GPU `local_rank`;
    CPU ranks use gloo. Idempotent: a second call returns the same RankInfo.
    """
    rank, world, local = env_rank()
    kind = torch.device(device).type
    if kind == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("this rank needs a CUDA GPU and none is visible")
        if local >= torch.cuda.device_count():
            raise RuntimeError(f"local rank {local} needs GPU {local}, but only {torch.cuda.device_count()} "
                               "are visible: start at most one rank per GPU")
        torch.cuda.set_device(local)
        rank_device = f"cuda:{local}"
    else:
        rank_device = "cpu"
    if world == 1 and not dist.is_initialized():
        return RankInfo(0, 1, 0, rank_device, None)
    backend = backend or ("nccl" if kind == "cuda" else "gloo")
    if not dist.is_initialized():
        kwargs = {"device_id": torch.device(rank_device)} if backend == "nccl" else {}
        dist.init_process_group(backend, rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=timeout or timeout_s()), **kwargs)
    return RankInfo(dist.get_rank(), dist.get_world_size(), local, rank_device, dist.get_backend())


def destroy() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0
