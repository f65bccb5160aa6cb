"""Running one Snakemake job: a batch of experiment points, one result file each.

A job amortises process start, imports and CUDA initialisation over several points; every point
still gets its own result file, written atomically. Out-of-memory is a result (`oom`), as is a
point the hardware or software cannot run (`unsupported`, raised as `Unsupported`).
"""

from __future__ import annotations

import gc
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path

from cs336sys.results import write_result


class Unsupported(Exception):
    """This point cannot run here for a reason that is a fact, not a bug (e.g. no cuDNN backend)."""


class GpuRequired(RuntimeError):
    pass


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
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def require_device(device: str) -> None:
    import torch

    if device.startswith("cuda") and not torch.cuda.is_available():
        raise GpuRequired(
            "this experiment needs a CUDA GPU and none is visible here. GPU results are never "
            "replaced by CPU numbers: run it on a GPU host (snakemake -c1 --resources gpu=1 ...) "
            "or dispatch it with the cluster profile (snakemake --profile profiles/slurm ...), "
            "or run the CPU smoke grid (--config grid=smoke).")


def run_points(problem: str, points: Sequence[dict], outputs: Sequence[str | Path],
               run_point: Callable[[dict], dict]) -> int:
    """Run each point and write its result; returns the number of points with status `error`."""
    if len(points) != len(outputs):
        raise ValueError(f"{len(points)} points but {len(outputs)} outputs")
    for device in {p.get("device", "cpu") for p in points}:
        require_device(device)
    errors = 0
    for i, (point, out) in enumerate(zip(points, outputs, strict=True), 1):
        label = " ".join(f"{k}={v}" for k, v in point.items())
        print(f"[{problem} {i}/{len(points)}] {label}", flush=True)
        start = time.perf_counter()
        try:
            metrics = run_point(dict(point))
            metrics["point_wall_s"] = time.perf_counter() - start
            write_result(out, problem, point, metrics)
            status = "ok"
        except Unsupported as exc:
            write_result(out, problem, point, {"point_wall_s": time.perf_counter() - start},
                         "unsupported", str(exc))
            status = f"unsupported: {exc}"
        except Exception as exc:
            if not is_oom(exc):
                # A bug is not a result: leave no file so that Snakemake reports the job failed.
                traceback.print_exc()
                errors += 1
                status = "error (no result written)"
            else:
                write_result(out, problem, point, {"point_wall_s": time.perf_counter() - start},
                             "oom", f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}")
                status = "oom"
        finally:
            free_device_memory()
        print(f"    -> {status} ({time.perf_counter() - start:.1f} s)", flush=True)
    if errors:
        print(f"{errors} point(s) failed with an error; see the traceback(s) above", file=sys.stderr)
    return errors
