"""The one result schema: writing a point atomically, and reading a results tree into a DataFrame.

A result file is JSON:
    {"schema": 1, "problem": str, "settings": {...}, "status": "ok"|"oom"|"unsupported"|"error",
     "reason": str|None, "metrics": {...}, "env": {...}}
`settings` says exactly what was run; `metrics` holds what was measured (numbers, or lists of
numbers such as every step's time); `env` is the hardware/software manifest of `environment()`.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import subprocess
from collections.abc import Iterable
from functools import cache
from pathlib import Path
from typing import Any

from cs336sys.io import write_atomic

SCHEMA_VERSION = 1
STATUSES = ("ok", "oom", "unsupported", "error")


GIT_COMMIT_ENV = "CS336SYS_GIT_COMMIT"  # set by the workflow on the submit host (see common.smk)


@cache
def _git_commit() -> str | None:
    """The commit of the code that ran: from the environment when the workflow passes it (a copied
    tree without .git, e.g. a GPU host or a cluster node), else from git. Not part of any code hash."""
    given = os.environ.get(GIT_COMMIT_ENV)
    if given:
        return given
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                             cwd=Path(__file__).parent)
        return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else None
    except (OSError, subprocess.SubprocessError):
        return None


@cache
def _static_environment() -> dict[str, Any]:
    import torch

    env: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "gpu_count": torch.cuda.device_count() if torch.cuda.is_available() else 0,
    }
    try:
        import triton

        env["triton"] = triton.__version__
    except ImportError:
        env["triton"] = None
    if env["gpu_count"]:
        devices = [torch.cuda.get_device_properties(i) for i in range(env["gpu_count"])]
        env["gpu"] = devices[0].name
        env["gpu_memory_bytes"] = devices[0].total_memory
        env["gpus"] = [{"index": i, "name": d.name, "memory_bytes": d.total_memory} for i, d in enumerate(devices)]
        env["device"] = "cuda"
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=10)
            env["driver"] = out.stdout.strip().splitlines()[0] if out.stdout.strip() else None
        except (OSError, subprocess.SubprocessError):
            env["driver"] = None
    else:
        env.update(gpu=None, gpu_memory_bytes=None, gpus=[], device="cpu", driver=None)
    env.update(cpu=platform.processor() or platform.machine(), cpu_count=os.cpu_count())
    return env


def environment() -> dict[str, Any]:
    """Hardware and software manifest: every visible GPU, the process group's world size and
    backend, the git commit and a UTC timestamp."""
    import torch.distributed as dist

    grouped = dist.is_available() and dist.is_initialized()
    return {**_static_environment(),
            "world_size": dist.get_world_size() if grouped else 1,
            "backend": dist.get_backend() if grouped else None,
            "git_commit": _git_commit(),
            "timestamp": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")}


def make_result(problem: str, settings: dict, metrics: dict | None = None, status: str = "ok",
                reason: str | None = None) -> dict[str, Any]:
    if status not in STATUSES:
        raise ValueError(f"status {status!r} is not one of {STATUSES}")
    if status != "ok" and not reason:
        raise ValueError(f"a result with status {status!r} needs a reason")
    return {"schema": SCHEMA_VERSION, "problem": problem, "settings": settings, "status": status,
            "reason": reason, "metrics": metrics or {}, "env": environment()}


def write_json_atomic(path: str | Path, data: Any) -> None:
    """JSON through the one atomic writer: readers never see half a file."""
    write_atomic(path, json.dumps(data, indent=1, default=_json_default) + "\n")


def write_result(path: str | Path, problem: str, settings: dict, metrics: dict | None = None,
                 status: str = "ok", reason: str | None = None) -> dict[str, Any]:
    result = make_result(problem, settings, metrics, status, reason)
    write_json_atomic(path, result)
    return result


def read_result(path: str | Path) -> dict[str, Any]:
    with open(path) as f:
        data = json.load(f)
    missing = {"schema", "problem", "settings", "status", "metrics", "env"} - set(data)
    if missing:
        raise ValueError(f"{path}: not a result file (missing {sorted(missing)})")
    return data


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "item"):  # numpy / torch scalars
        return obj.item()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"cannot serialise {type(obj).__name__}")


def load_results(paths: Iterable[str | Path] | str | Path, problem: str | None = None):
    """Read result files (or every *.json under a directory) into one flat DataFrame.

    Columns: problem, status, reason, path, then settings and metrics flattened (no prefix;
    a metric that shares a setting's name becomes `metric_<name>`), then `env.<key>`.
    """
    import pandas as pd

    if isinstance(paths, str | Path) and Path(paths).is_dir():
        paths = sorted(Path(paths).rglob("*.json"))
    elif isinstance(paths, str | Path):
        paths = [paths]
    rows = []
    for p in paths:
        r = read_result(p)
        if problem is not None and r["problem"] != problem:
            continue
        row: dict[str, Any] = {"problem": r["problem"], "status": r["status"], "reason": r.get("reason"),
                               "path": str(p)}
        row.update(r["settings"])
        for k, v in r["metrics"].items():
            row[f"metric_{k}" if k in r["settings"] else k] = v
        row.update({f"env.{k}": v for k, v in r["env"].items()})
        rows.append(row)
    return pd.DataFrame(rows)
