"""What one experiment point is, and what becomes of it.

An experiment is a function `run_point(settings: SomeSettings, run: Run) -> dict` whose first
parameter is annotated with a dataclass of settings. The job runner (`cs336sys.run`) turns each
JSON point of a rule into that dataclass (`parse_settings`: unknown keys, missing keys and wrong
types are clear errors, defaults are filled in), calls the function on every rank, and records the
*settings as run* (`dataclasses.asdict`, defaults included) with the metrics.

Outcomes: `ok` (metrics), `oom` (out of memory is a result), `unsupported` (raise `Unsupported`:
the point cannot run here, for a reason that is a fact), or an error (a bug: no result is written,
so Snakemake reports the job failed).

Which rule makes a result file: `snakemake --summary FILE` (no experiment imports the re-run machinery, so
none of it is in an experiment's code hash).
"""

from __future__ import annotations

import dataclasses
import gc
import time
import traceback
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class Unsupported(Exception):
    """This point cannot run here for a reason that is a fact, not a bug (e.g. no cuDNN backend)."""


class GpuRequired(RuntimeError):
    pass


@dataclass(frozen=True)
class Run:
    """Where a point runs: its rank in the job's process group and its per-point directories.

    `device` is concrete ("cuda:<local rank>" or "cpu"). `artifact_dir` is for raw artifacts
    (traces, snapshots: git-ignored, may be large); `rendered_dir` for small rendered files that
    are committed with the result (PNG figures, JSON summaries), when the rule declares them.
    """

    device: str = "cpu"
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    backend: str | None = None
    artifact_dir: Path | None = None
    rendered_dir: Path | None = None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def is_cuda(self) -> bool:
        return self.device.startswith("cuda")

    def require_ranks(self, what: str) -> None:
        """`Unsupported` on fewer than 2 ranks: `what` ("a sharding experiment") needs a process group."""
        if self.world_size < 2:
            raise Unsupported(f"{what} needs at least 2 ranks (register the job with ranks >= 2)")


@dataclass
class Outcome:
    status: str  # ok | oom | unsupported | error
    metrics: dict = field(default_factory=dict)
    reason: str | None = None
    traceback: str | None = None
    rank: int = 0
    wall_s: float = 0.0


# --- settings -----------------------------------------------------------------------------------

def settings_type(fn: Callable) -> type:
    """The dataclass annotated on an experiment function's first parameter."""
    hints = typing.get_type_hints(fn)
    params = [p for p in fn.__code__.co_varnames[: fn.__code__.co_argcount]]
    cls = hints.get(params[0]) if params else None
    if cls is None or not dataclasses.is_dataclass(cls):
        raise TypeError(f"{fn.__module__}.{fn.__name__}: its first parameter must be annotated with a settings "
                        "dataclass, e.g. `def run_point(settings: MySettings, run: Run) -> dict`")
    return cls


def _type_ok(value: Any, hint: Any) -> bool:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return True
    if origin is typing.Literal:
        return value in args
    if origin in (typing.Union, types.UnionType):
        return any(_type_ok(value, a) for a in args)
    if hint is type(None):
        return value is None
    if hint is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if origin in (list, tuple):
        return isinstance(value, list | tuple) and (not args or all(_type_ok(v, args[0]) for v in value))
    if origin is dict or hint is dict:
        return isinstance(value, dict)
    return isinstance(value, hint)


def parse_settings(cls: type, point: dict) -> Any:
    """Build the settings dataclass from a JSON point: unknown, missing or mistyped keys raise
    ValueError naming the key, the expected type and the known keys."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(point) - set(fields))
    if unknown:
        raise ValueError(f"{cls.__name__}: unknown setting(s) {unknown}; known: {', '.join(fields)}")
    missing = [n for n, f in fields.items() if n not in point
               and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    if missing:
        raise ValueError(f"{cls.__name__}: missing setting(s) {missing}")
    hints = typing.get_type_hints(cls)
    for name, value in point.items():
        if not _type_ok(value, hints[name]):
            raise ValueError(f"{cls.__name__}.{name} = {value!r} is not of type {hints[name]}")
    return cls(**{k: tuple(v) if isinstance(v, list) and typing.get_origin(hints[k]) is tuple else v
                  for k, v in point.items()})


def settings_as_run(settings: Any) -> dict:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(settings).items()}


# --- one point ------------------------------------------------------------------------------------

def is_oom(exc: BaseException) -> bool:
    import torch

    if isinstance(exc, torch.OutOfMemoryError):
        return True
    # Triton and some CUDA paths report memory exhaustion as a plain RuntimeError.
    text = str(exc).lower()
    return "out of memory" in text or "outofresources" in type(exc).__name__.lower()


def free_device_memory() -> None:
    import torch

    gc.collect()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def gpu_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def require_gpus(needed: int) -> None:
    have = gpu_count()
    if have >= needed:
        return
    what = "a CUDA GPU and none is visible" if have == 0 else f"{needed} GPUs and only {have} are visible"
    raise GpuRequired(
        f"this experiment needs {what}. GPU results are never replaced by CPU numbers: run it on a "
        f"host with {needed} GPU(s) (snakemake -c1 --resources gpu={needed} ...) or dispatch it with the "
        "cluster profile (snakemake --profile profiles/slurm ...), or run the CPU smoke grid (--config grid=smoke).")


def attempt(fn: Callable, settings: Any, run: Run) -> Outcome:
    """Run one point on this rank; classify what happened (never raises for a point's failure)."""
    start = time.perf_counter()
    try:
        metrics = fn(settings, run)
        if not isinstance(metrics, dict):
            raise TypeError(f"an experiment returns a dict of metrics, got {type(metrics).__name__}")
        outcome = Outcome("ok", metrics, rank=run.rank)
    except Unsupported as exc:
        outcome = Outcome("unsupported", reason=str(exc), rank=run.rank)
    except Exception as exc:
        if is_oom(exc):
            first = (str(exc).splitlines() or [""])[0][:300]
            outcome = Outcome("oom", reason=f"{type(exc).__name__}: {first}", rank=run.rank)
        else:
            outcome = Outcome("error", reason=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc(),
                              rank=run.rank)
    finally:
        free_device_memory()
    outcome.wall_s = time.perf_counter() - start
    outcome.metrics["point_wall_s"] = outcome.wall_s
    return outcome

