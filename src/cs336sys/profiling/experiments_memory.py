"""Problem 5 (memory_profiling) and the saved-tensor half of problem 6 as experiments.

`run_memory_snapshot`: one point is (size, context length, mode, dtype). After `warmup` steps (so
that the optimizer state and the allocator's pools exist, as in training), the allocator history
of one more step is recorded: CUDA's caching-allocator history on a GPU, the profiler's CPU memory
events on a CPU (`cs336sys.profiling.memory`). The raw snapshot stays in the artifact folder; its
summary (JSON) and active-memory timeline (PNG) go to the committed rendered folder; the result
holds the peak, the largest allocations with the code that made them, the memory level at the end
of each phase (CUDA), and the residual-stream check: the size derived from the config against the
allocation sizes the snapshot saw.

`run_saved_tensors`: what one TransformerBlock of a size saves for its backward (by op, top 5),
RMSNorm eager against torch.compile'd, and the gradient memory of a block (expected from its
parameters, and measured after a backward through it).
"""

from __future__ import annotations

import contextlib
import json
import shutil
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from cs336sys.dtypes import autocast
from cs336sys.jobs import Run
from cs336sys.model import RMSNorm
from cs336sys.profiling.annotate import annotations_enabled, phase
from cs336sys.profiling.memory import (
    CUDA_SOURCE,
    allocation_site,
    cpu_snapshot,
    cuda_snapshot,
    render_memory_timeline,
    save_snapshot,
    source_line,
    summarize_snapshot,
)
from cs336sys.profiling.saved_tensors import (
    allocated_gradient_bytes,
    gradient_bytes_per_block,
    parameter_gradient_bytes,
    residual_stream_bytes,
    saved_tensor_accounting,
)
from cs336sys.sizes import get_size
from cs336sys.timing import reset_peak_memory
from cs336sys.training.step import StepSpec, build_step


@dataclass(frozen=True)
class MemorySnapshotSettings:
    size: str
    """Model size, a name in `cs336sys.sizes.SIZES` (small, medium, large, xl, 2.7B, ...)."""
    context_length: int
    """Sequence length of each sample, in tokens."""
    mode: str = "train_step"
    """What one step runs: forward | forward_backward | train_step."""
    dtype: str = "fp32"
    """Autocast dtype: fp32 (no autocast) | bf16 | fp16; parameters stay fp32."""
    warmup: int = 1
    """Steps run before the recorded one (so optimizer state and allocator pools exist)."""
    max_entries: int = 100_000
    """Allocator history kept, in entries (a 2.7B train step makes a few tens of thousands)."""
    stacks: str = "python"
    """Frames recorded: python | all (C++ frames name the autograd node; much slower to snapshot)."""
    top_allocations: int = 12
    """Largest allocations (grouped by size and stack) kept in the result."""
    batch_size: int | None = None
    """Sequences per batch; None: the size's default batch size."""
    seed: int = 0
    """Seed of the model's initial parameters and of the random batch."""
    device: str = "cuda"
    """Device kind: cuda | cpu (the grid's `device`); the job runner picks this rank's GPU."""


def _phase_levels(levels: dict[str, int], device: str):
    """A phase hook that opens the annotation range and notes the allocated bytes when it closes."""
    def hook(name: str) -> contextlib.AbstractContextManager:
        @contextlib.contextmanager
        def scope() -> Iterator[None]:
            with phase(name):
                yield
            levels[name] = torch.cuda.memory_allocated(device)
        return scope()
    return hook


def _phase_at(phases: list[dict], event: int) -> str | None:
    for p in phases:
        if p["start_event"] <= event <= p["end_event"]:
            return p["name"]
    return None


def residual_check(snapshot: dict, device: int | None, residual: int) -> dict[str, Any]:
    """How the derived residual-stream size shows in a snapshot: allocations of exactly that size,
    and the nearest allocation size seen with the sites that made it."""
    traces = snapshot.get("device_traces", [])
    if device is None:
        device = max(range(len(traces)), key=lambda i: len(traces[i])) if traces else 0
    allocs = [e for e in (traces[device] if device < len(traces) else []) if e["action"] == "alloc"]
    sizes = Counter(e["size"] for e in allocs)
    if not sizes:
        return {"exact_matches": 0, "nearest_bytes": None, "nearest_count": 0, "nearest_sites": []}
    nearest = min(sizes, key=lambda s: (abs(s - residual), s))
    sites = Counter(allocation_site(e.get("frames", [])) for e in allocs if e["size"] == nearest)
    return {"exact_matches": sizes.get(residual, 0), "nearest_bytes": nearest, "nearest_count": sizes[nearest],
            "nearest_sites": [{"site": s, "count": n} for s, n in sites.most_common(3)]}


def run_memory_snapshot(settings: MemorySnapshotSettings, run: Run) -> dict:
    size = get_size(settings.size)
    spec = StepSpec(size=settings.size, context_length=settings.context_length, batch_size=settings.batch_size,
                    mode=settings.mode, dtype=settings.dtype, seed=settings.seed)
    step = build_step(spec, run.device)
    for _ in range(settings.warmup):
        step.run()

    levels: dict[str, int] = {}
    if run.is_cuda:
        torch.cuda.synchronize(run.device)
        reset_peak_memory(run.device)
        levels["start"] = torch.cuda.memory_allocated(run.device)
        step.phase = _phase_levels(levels, run.device)
        with annotations_enabled():  # phase names become the allocations' metadata
            snapshot = cuda_snapshot(step.run, settings.max_entries, settings.stacks)
        levels["end"] = torch.cuda.memory_allocated(run.device)
        peak_allocated = torch.cuda.max_memory_allocated(run.device)
    else:
        step.phase = phase
        with annotations_enabled():
            snapshot = cpu_snapshot(step.run)
        peak_allocated = None

    summary = summarize_snapshot(snapshot, top_categories=10, top_allocations=settings.top_allocations)
    if run.artifact_dir is not None:
        run.artifact_dir.mkdir(parents=True, exist_ok=True)
        save_snapshot(snapshot, run.artifact_dir / "snapshot.pickle")
    files = {}
    if run.rendered_dir is not None:
        run.rendered_dir.mkdir(parents=True, exist_ok=True)
        (run.rendered_dir / "summary.json").write_text(json.dumps(summary, separators=(",", ":")))
        title = (f"{settings.size}, context {settings.context_length}, {settings.mode}, {settings.dtype}: "
                 "active memory over one step")
        render_memory_timeline(summary, run.rendered_dir / "timeline.png", title=title)
        files = {"summary": "summary.json", "timeline": "timeline.png"}

    trace_len = max((len(t) for t in snapshot.get("device_traces", [])), default=0)
    residual = residual_stream_bytes(spec.batch, settings.context_length, size.d_model, 4)
    cuda = summary["source"] == CUDA_SOURCE
    largest = [{"bytes": a["bytes"], "count": a["count"], "site": a["site"], "frames": a["frames"][:4],
                "phase": a["phase"], "code": source_line(a["site"]) if cuda else None}
               for a in summary["largest_allocations"]]
    return {
        "source": summary["source"],
        "files": files,
        "batch_size": spec.batch,
        "d_model": size.d_model,
        "num_layers": size.num_layers,
        "parameters": step.info["parameters"],
        "events": summary["events"],
        "history_full": trace_len >= settings.max_entries,  # the ring buffer wrapped: the oldest events are lost
        "peak_bytes": summary["peak_bytes"],
        "peak_allocated_bytes": peak_allocated,
        "peak_reserved_bytes": summary["peak_reserved_bytes"],
        "baseline_bytes": summary["baseline_bytes"],
        "final_bytes": summary["final_bytes"],
        "peak_phase": _phase_at(summary["phases"], summary["peak_event"]),
        "phases": [p["name"] for p in summary["phases"]],
        "peak_by_category": summary["peak_by_category"],
        "phase_end_bytes": levels or None,
        "largest_allocations": largest,
        "residual_bytes": residual,
        "residual": {"batch_size": spec.batch, "context_length": settings.context_length, "d_model": size.d_model,
                     "bytes_per_element": 4, **residual_check(snapshot, summary["device"], residual)},
    }


# --- saved tensors -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class SavedTensorsSettings:
    size: str
    """Model size, a name in `cs336sys.sizes.SIZES` (small, medium, large, xl, 2.7B, ...)."""
    context_length: int
    """Sequence length of each sample, in tokens."""
    dtype: str = "fp32"
    """Autocast dtype of the block's forward: fp32 (no autocast) | bf16 | fp16."""
    batch_size: int | None = None
    """Sequences per batch; None: the size's default batch size."""
    compile_rmsnorm: bool = True
    """Also account for a torch.compile'd RMSNorm (skipped where inductor cannot compile)."""
    top: int = 5
    """Producing ops listed in the block's `top` (largest saved bytes first)."""
    seed: int = 0
    """Seed of the model's initial parameters and of the random block and RMSNorm inputs."""
    device: str = "cuda"
    """Device kind: cuda | cpu (the grid's `device`); the job runner picks this rank's GPU."""


def _compact(report: dict[str, Any]) -> dict[str, Any]:
    keep = ("total_bytes", "tensor_bytes", "input_bytes", "parameter_bytes", "saved", "unique", "top", "by_producer",
            "by_saver")
    out = {k: report[k] for k in keep}
    out["tensors"] = [{k: t[k] for k in ("saved_by", "produced_by", "shape", "dtype", "bytes", "shared")}
                      for t in report["tensors"]]
    return out


def compiler_available() -> str | None:
    """Why inductor cannot compile here (None when it can): on the CPU it needs a C++ compiler."""
    if torch.cuda.is_available() or shutil.which("g++") or shutil.which("clang++") or shutil.which("c++"):
        return None
    return "torch.compile's inductor needs a C++ compiler on the CPU and none is on the PATH"


def run_saved_tensors(settings: SavedTensorsSettings, run: Run) -> dict:
    size = get_size(settings.size)
    spec = StepSpec(size=settings.size, context_length=settings.context_length, batch_size=settings.batch_size,
                    mode="forward_backward", dtype=settings.dtype, seed=settings.seed)
    step = build_step(spec, run.device)
    block = step.model.layers[0]
    shape = (spec.batch, settings.context_length, size.d_model)
    generator = torch.Generator(device="cpu").manual_seed(settings.seed)

    x = torch.randn(shape, generator=generator).to(run.device).requires_grad_()
    with autocast(settings.dtype, run.device):
        report = saved_tensor_accounting(block, x, top=settings.top, keep_output=True)
    output = report.pop("output")
    output.float().sum().backward()
    measured_gradients = allocated_gradient_bytes(block)
    del output

    rmsnorm: dict[str, Any] = {}
    y = torch.randn(shape, generator=generator).to(run.device).requires_grad_()
    rmsnorm["eager"] = _compact(saved_tensor_accounting(RMSNorm(size.d_model, device=run.device), y))
    why_not = compiler_available() if settings.compile_rmsnorm else "not asked for (compile_rmsnorm: false)"
    if why_not is None:
        torch._dynamo.reset()
        compiled = torch.compile(RMSNorm(size.d_model, device=run.device))
        rmsnorm["compiled"] = _compact(saved_tensor_accounting(compiled, y))
    rmsnorm["compiled_skipped"] = why_not

    per_block = gradient_bytes_per_block(step.model)
    return {
        "batch_size": spec.batch,
        "d_model": size.d_model,
        "d_ff": size.d_ff,
        "num_heads": size.num_heads,
        "num_layers": size.num_layers,
        "input_shape": list(shape),
        "block": _compact(report),
        "rmsnorm": rmsnorm,
        "gradient_bytes_per_block": per_block[0],
        "gradient_bytes_blocks_equal": len(set(per_block)) == 1,
        "gradient_bytes_measured": measured_gradients,
        "block_parameter_bytes": parameter_gradient_bytes(block),
        "residual_bytes": residual_stream_bytes(spec.batch, settings.context_length, size.d_model, 4),
    }
