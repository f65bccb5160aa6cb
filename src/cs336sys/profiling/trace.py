"""A torch.profiler Chrome trace, parsed once into host ranges and the work done inside them.

Why the Chrome trace (`prof.export_chrome_trace`) and not `prof.events()`: it is a file, so a GPU
host can reduce it and a CPU machine can re-read it; it holds every thread (the autograd engine
runs the backward on its own thread on CUDA, gloo runs collectives on worker threads); and each
kernel carries the correlation id of the CUDA runtime or driver call that launched it.

How work is mapped to a range (documented once here; `kernels` and `timeline` both use it):
a kernel, memcpy or memset belongs to a range when the host call that *launched* it (found by
correlation id) lies inside the range's host interval, on any thread. The launch, not the
kernel's own start, because kernels run asynchronously, often after the range closed; any thread,
because the thread that opened "backward" is blocked in `loss.backward()` while the engine thread
launches the backward kernels. This is what Nsight Systems' NVTX projection does. Nested ranges
are inclusive ("forward" contains "attention/softmax"). On a CPU-only trace there are no kernels:
the work is the CPU ops themselves, each counted with its *self* time (its duration minus that of
the ops it called, on its thread) so that nested aten ops are not counted twice, and a range
holds the ops that start inside it.
"""

from __future__ import annotations

import bisect
import gzip
import json
import os
import re
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

# Host-side annotations that name a collective rather than a region of our code: c10d records
# "nccl:all_reduce" / "gloo:all_reduce" ranges around each collective (gloo on its worker threads).
COMMUNICATION_ANNOTATION = re.compile(r"^(nccl|gloo|ucc|mpi):", re.IGNORECASE)
DEVICE_CATEGORIES = {"kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset"}
LAUNCH_CATEGORIES = ("cuda_runtime", "cuda_driver")


@dataclass(frozen=True)
class HostRange:
    """One occurrence of a named host range (record_function / NVTX), times in microseconds."""

    name: str
    thread: int | str
    start: float
    end: float

    @property
    def dur(self) -> float:
        return self.end - self.start


@dataclass(frozen=True)
class Work:
    """One piece of work: a device kernel/memcpy/memset, or (CPU-only trace) a CPU op or a
    collective's annotation. `self_dur` is the time it alone accounts for (kernels: `dur`);
    `launch` the host time it was issued (CPU work: its start); `depth` its nesting among CPU work
    on its thread (0 for device work)."""

    name: str
    kind: str  # kernel | memcpy | memset | cpu_op | collective
    lane: str  # "stream 7" (device) or "thread 1234" (host)
    start: float
    dur: float
    self_dur: float
    launch: float
    depth: int = 0

    @property
    def end(self) -> float:
        return self.start + self.dur


@dataclass
class ParsedTrace:
    source: str  # "cuda": device work is kernels; "cpu": device work is CPU ops
    ranges: list[HostRange]
    work: list[Work]  # sorted by launch
    unmatched: int = 0  # device events whose launch call was not in the trace (attributed by start)

    def __post_init__(self) -> None:
        self.work.sort(key=lambda w: w.launch)
        self._launches = [w.launch for w in self.work]

    @property
    def tool(self) -> str:
        return "torch.profiler (CUPTI kernels)" if self.source == "cuda" else "torch.profiler (CPU ops, no kernels)"

    def occurrences(self, name: str) -> list[HostRange]:
        return [r for r in self.ranges if r.name == name]

    def work_indices(self, ranges: Iterable[HostRange]) -> list[int]:
        """Indices of the work launched inside any of `ranges` (each counted once)."""
        chosen: set[int] = set()
        for r in ranges:
            lo = bisect.bisect_left(self._launches, r.start)
            hi = bisect.bisect_right(self._launches, r.end)
            chosen.update(range(lo, hi))
        return sorted(chosen)


def load_trace(source: Any) -> dict:
    """The trace JSON from a path (.json or .json.gz), a dict, or a finished `torch.profiler.profile`."""
    if isinstance(source, dict):
        return source
    if hasattr(source, "export_chrome_trace"):
        fd, path = tempfile.mkstemp(suffix=".json")
        os.close(fd)
        try:
            source.export_chrome_trace(path)
            return load_trace(path)
        finally:
            os.unlink(path)
    path = Path(source)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return json.load(f)


def _nest(events: list[dict]) -> list[tuple[dict, float, int]]:
    """(event, self time, depth) for host events of one thread, by interval containment."""
    events = sorted(events, key=lambda e: (e["ts"], -e.get("dur", 0.0)))
    out: list[list] = []  # [event, self, depth]
    stack: list[list] = []
    for e in events:
        start, end = e["ts"], e["ts"] + e.get("dur", 0.0)
        while stack and stack[-1][0]["ts"] + stack[-1][0].get("dur", 0.0) <= start:
            stack.pop()
        node = [e, e.get("dur", 0.0), len(stack)]
        if stack:
            parent = stack[-1]
            # a child sticking out of its parent by rounding must not make the parent's self negative
            parent[1] -= min(end, parent[0]["ts"] + parent[0].get("dur", 0.0)) - start
        stack.append(node)
        out.append(node)
    return [(e, max(self_dur, 0.0), depth) for e, self_dur, depth in out]


def parse_trace(source: Any) -> ParsedTrace:
    """Parse a Chrome trace (anything `load_trace` takes) into host ranges and work."""
    trace = load_trace(source)
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "ts" in e]
    device_events = [e for e in events if e.get("cat") in DEVICE_CATEGORIES]
    ranges: list[HostRange] = []
    host_by_thread: dict[Any, list[dict]] = {}
    for e in events:
        cat = e.get("cat")
        if cat == "user_annotation":
            if COMMUNICATION_ANNOTATION.match(e["name"]):
                host_by_thread.setdefault(e["tid"], []).append(e)
            else:
                ranges.append(HostRange(e["name"], e["tid"], e["ts"], e["ts"] + e.get("dur", 0.0)))
        elif cat == "cpu_op":
            host_by_thread.setdefault(e["tid"], []).append(e)
    ranges.sort(key=lambda r: r.start)

    work: list[Work] = []
    unmatched = 0
    if device_events:
        launch_ts = {e["args"]["correlation"]: e["ts"] for e in events
                     if e.get("cat") in LAUNCH_CATEGORIES and "correlation" in e.get("args", {})}
        for e in device_events:
            args = e.get("args", {})
            launch = launch_ts.get(args.get("correlation"))
            if launch is None:
                unmatched += 1
                launch = e["ts"]
            stream = args.get("stream", e.get("tid"))
            work.append(Work(e["name"], DEVICE_CATEGORIES[e["cat"]], f"stream {stream}", e["ts"], e.get("dur", 0.0),
                             e.get("dur", 0.0), launch))
        return ParsedTrace("cuda", ranges, work, unmatched)

    for tid, host in host_by_thread.items():
        for e, self_dur, depth in _nest(host):
            kind = "cpu_op" if e.get("cat") == "cpu_op" else "collective"
            work.append(Work(e["name"], kind, f"thread {tid}", e["ts"], e.get("dur", 0.0), self_dur, e["ts"], depth))
    return ParsedTrace("cpu", ranges, work, 0)


def union_length(intervals: Iterable[tuple[float, float]]) -> float:
    """Total length covered by (start, end) intervals (overlaps counted once)."""
    return sum(end - start for start, end in merge_intervals(intervals))


def merge_intervals(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[list[float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(a, b) for a, b in merged]


def intersection_length(a: Iterable[tuple[float, float]], b: Iterable[tuple[float, float]]) -> float:
    """Length of time covered by both interval sets."""
    a, b = merge_intervals(a), merge_intervals(b)
    total, i, j = 0.0, 0, 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        total += max(0.0, hi - lo)
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def record_trace(step: Callable[[], object], steps: int, warmup: int, device: str | torch.device,
                 path: str | Path | None = None, **profile_kwargs: Any) -> torch.profiler.profile:
    """Profile `steps` calls of `step` after `warmup` unprofiled ones (warm-up never appears in a
    trace), annotation on, each call inside a "step" range and followed by a device
    synchronisation. CUDA activity is recorded when the device is CUDA. `profile_kwargs` go to
    `torch.profiler.profile` (record_shapes, with_stack, profile_memory ...). The Chrome trace is
    written to `path` when given. Returns the finished profile."""
    from cs336sys.profiling.annotate import annotations_enabled, phase
    from cs336sys.timing import synchronize

    activities = [torch.profiler.ProfilerActivity.CPU]
    if torch.device(device).type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    for _ in range(warmup):
        step()
    synchronize(device)
    with torch.profiler.profile(activities=activities, **profile_kwargs) as prof, annotations_enabled():
        for _ in range(steps):
            with phase("step"):
                step()
                synchronize(device)
    if path is not None:
        prof.export_chrome_trace(str(path))
    return prof
