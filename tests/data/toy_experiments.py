"""Tiny experiments for the job runner's tests (imported by `cs336sys.run --function`)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from cs336sys.jobs import Run, Unsupported


@dataclass(frozen=True)
class ToySettings:
    kind: str = "ok"  # ok | raise | oom | unsupported | die | hang
    x: float = 1.0
    failing_rank: int = 1
    device: str = "cpu"


def run_toy(settings: ToySettings, run: Run) -> dict:
    total = torch.tensor([float(run.rank + 1) * settings.x])
    if run.world_size > 1:
        dist.all_reduce(total)
    if run.rank == settings.failing_rank or run.world_size == 1:
        if settings.kind == "raise":
            raise ZeroDivisionError(f"planted bug on rank {run.rank}")
        if settings.kind == "oom":
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1 GiB (planted)")
        if settings.kind == "unsupported":
            raise Unsupported("no such backend here (planted)")
        if settings.kind == "die":
            os._exit(9)
        if settings.kind == "hang":  # never reaches the barrier the others wait in
            time.sleep(3600)
    if run.world_size > 1 and settings.kind != "ok":
        dist.barrier()  # the healthy ranks wait here for the failed one: the runner must not hang
    if run.rendered_dir is not None:
        run.rendered_dir.mkdir(parents=True, exist_ok=True)
        (run.rendered_dir / "note.txt").write_text(f"rank {run.rank}\n")
    return {"sum": total.item(), "rank": run.rank, "world_size": run.world_size}
