"""Problem 2 (nsys_profile) as an experiment: kernel tables of an annotated step.

One point is (size, context length, mode, dtype). The step comes from the step builder with the
annotated naive attention (ranges for the score matmul, the softmax and the final matmul) and the
phase ranges (forward, backward, optimizer step). `warmup` steps run first and are never
profiled; then `steps` steps are timed with the Python timer alone (the reference the profiler is
compared with), and `steps` more are profiled with torch.profiler while the same timer times them
too (the profiler's own overhead). The raw Chrome trace stays in the point's artifact folder; the
result holds the reduced tables.

The GPU host has no Nsight Systems, so the tool is torch.profiler with CUPTI (kernel names, times
and their launching calls, the same source nsys reads). On a CPU-only machine the same code
profiles CPU ops, and every table says so (`tool`).
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from typing import Any

from cs336sys.jobs import Run
from cs336sys.profiling.annotate import annotated_naive_causal_attention, phase
from cs336sys.profiling.kernels import attention_table, kernel_tables
from cs336sys.profiling.trace import parse_trace, record_trace
from cs336sys.sizes import get_size
from cs336sys.timing import summarize_ms, synchronize, time_steps
from cs336sys.training.step import StepSpec, build_step

# What the report reads of each scope and range; the rest of kernel_tables' output stays in the trace.
SCOPES = ("forward", "backward", "optimizer_step", "forward+backward", "train_step")
RANGES = ("step", "forward", "backward", "optimizer_step", "attention", "attention/scores", "attention/softmax",
          "attention/final_matmul")
_ROW_KEYS = ("short_name", "class", "calls", "calls_per_occurrence", "total_us", "mean_us", "share")
_RANGE_KEYS = ("occurrences", "host_us_per_occurrence", "device_us_per_occurrence", "device_span_us_per_occurrence",
               "work_items", "matmul_share", "by_class")


@dataclass(frozen=True)
class KernelProfileSettings:
    size: str
    """Model size, a name in `cs336sys.sizes.SIZES` (small, medium, large, xl, 2.7B, ...)."""
    context_length: int
    """Sequence length of each sample, in tokens."""
    mode: str = "forward"
    """What one step runs: forward | forward_backward | train_step."""
    dtype: str = "fp32"
    """Autocast dtype: fp32 (no autocast) | bf16 | fp16; parameters stay fp32."""
    warmup: int = 2
    """Steps run first, neither timed nor profiled."""
    steps: int = 2
    """Steps timed with the Python timer, then as many more profiled (and timed)."""
    top: int = 8
    """Kernels kept per table."""
    batch_size: int | None = None
    """Sequences per batch; None: the size's default batch size."""
    seed: int = 0
    """Seed of the model's initial parameters and of the random batch."""
    device: str = "cuda"
    """Device kind: cuda | cpu (the grid's `device`); the job runner picks this rank's GPU."""


def _trim_rows(rows: list[dict], top: int) -> list[dict]:
    return [{"name": r["name"][:200], **{k: r[k] for k in _ROW_KEYS}} for r in rows[:top]]


def trim_tables(tables: dict[str, Any], top: int) -> dict[str, Any]:
    """The parts of `kernel_tables` the report reads: a few ranges, each scope's top rows."""
    scopes = {}
    for name in SCOPES:
        scope = tables["scopes"].get(name)
        # a scope counts when its ranges ran (a forward-only step has no backward; "sync" only with DDP)
        if scope is None or any(r not in tables["ranges"] for r in scope["ranges"] if r != "sync"):
            continue
        scopes[name] = {
            "occurrences": scope["occurrences"],
            "device_us_per_occurrence": scope["device_us_per_occurrence"],
            "matmul_share": scope["matmul_share"],
            "by_class_us": scope["by_class"],
            "top": _trim_rows(scope["top"], top),
            "top_non_matmul": _trim_rows(scope["top_non_matmul"], top),
        }
    ranges = {name: {k: row[k] for k in _RANGE_KEYS} for name, row in tables["ranges"].items() if name in RANGES}
    return {"ranges": ranges, "scopes": scopes}


def run_kernel_profile(settings: KernelProfileSettings, run: Run) -> dict:
    size = get_size(settings.size)
    spec = StepSpec(size=settings.size, context_length=settings.context_length, batch_size=settings.batch_size,
                    mode=settings.mode, dtype=settings.dtype, attention="annotated_naive", seed=settings.seed)
    step = build_step(spec, run.device, attention_fn=annotated_naive_causal_attention)
    step.phase = phase  # ranges only inside annotations_enabled() (record_trace switches them on)

    python_ms = time_steps(step.run, settings.warmup, settings.steps, run.device)

    profiled_ms: list[float] = []

    def timed_step() -> None:
        start = time.perf_counter()
        step.run()
        synchronize(run.device)
        profiled_ms.append((time.perf_counter() - start) * 1e3)

    trace_path = None
    if run.artifact_dir is not None:
        run.artifact_dir.mkdir(parents=True, exist_ok=True)
        trace_path = run.artifact_dir / "trace.json"
    prof = record_trace(timed_step, settings.steps, 0, run.device, trace_path)
    parsed = parse_trace(trace_path if trace_path is not None else prof)
    tables = kernel_tables(parsed, top=settings.top)
    attention = attention_table(parsed, spec.batch, size.num_heads, settings.context_length, size.d_head)

    ranges = tables["ranges"]
    forward = ranges.get("forward", {})
    # On a CUDA trace the forward's time is its kernels' span on the GPU (first start to last end);
    # on a CPU trace it is the span of the CPU ops run inside it.
    forward_ms = forward.get("device_span_us_per_occurrence", 0.0) / 1e3

    return {
        "tool": parsed.tool,
        "trace_source": parsed.source,
        "nsys": shutil.which("nsys"),  # noted, not used: the GPU host has none
        "trace_file": trace_path.name if trace_path is not None else None,
        "unmatched_launches": parsed.unmatched,
        "batch_size": spec.batch,
        "num_layers": size.num_layers,
        "num_heads": size.num_heads,
        "flops_per_step": step.info["flops_per_step"],
        "python_ms": summarize_ms(python_ms),
        "python_step_ms": python_ms,
        "python_profiled_ms": summarize_ms(profiled_ms),
        "profiler_step_ms": ranges.get("step", {}).get("host_us_per_occurrence", 0.0) / 1e3,
        "profiler_forward_ms": forward_ms,
        "profiler_forward_host_ms": forward.get("host_us_per_occurrence", 0.0) / 1e3,
        "profiler_forward_busy_ms": forward.get("device_us_per_occurrence", 0.0) / 1e3,
        **trim_tables(tables, settings.top),
        "attention": attention,
    }
