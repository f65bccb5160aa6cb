"""Allocator snapshots (problem 5): record, summarise, render an active-memory timeline.

A snapshot is the dict `torch.cuda.memory._snapshot()` returns (segments, and per device a
trace of alloc / free_requested / free_completed / segment_* events, each with its stack frames).
`summarize_snapshot` reduces one to a small JSON-ready summary on the GPU host (the raw pickle
stays out of git): active memory after every allocation event (the x axis of PyTorch's
memory_viz), stacked by the code that allocated it, the peak and what was alive at it, and the
largest allocations with their frames. `render_memory_timeline` draws the summary with matplotlib
(no browser, no PyTorch HTML viewer).

"The code that allocated it" (`allocation_site`) is the innermost informative frame: a cs336sys
line (`model.py:48 forward`), or the autograd node of a backward allocation (`autograd:
MmBackward0`, in C++ frames: record with stacks="all", since CUDA runs the backward on a thread
with no Python stack). Allocations alive before recording began (weights, say) form the "before
recording" band. Frames made by the profiler (CPU) carry each function's first line, not the
line that allocated. Recording with stacks="python" (fast), a CUDA backward allocation has no frame
at all; with the phase ranges' memory metadata it still shows as "(no stack) in backward".

On a machine without CUDA, `cpu_snapshot` records the same format from the PyTorch profiler's
CPU memory events (via PyTorch's private `torch.cuda._memory_viz._profile_to_snapshot`), so the
smoke grid exercises the same summary and figure; its `source` says so.
"""

from __future__ import annotations

import contextlib
import linecache
import math
import pickle
import re
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np
import torch
from matplotlib.figure import Figure

from cs336sys.profiling.timeline import SHADES

CUDA_SOURCE = "torch.cuda.memory._snapshot (caching allocator history)"
CPU_SOURCE = "torch.profiler CPU memory events (profile_memory=True), not the CUDA allocator"
BEFORE_RECORDING = "before recording"
OTHER = "other"
NO_STACK = "(no stack)"
_PROFILER_FRAME = re.compile(r"^(?P<file>.+?)\((?P<line>\d+)\): (?P<func>.+)$")
_AUTOGRAD_NODE = re.compile(r"\b(\w+Backward\d*)::apply")
_AUTOGRAD_ENTRIES = ("_engine_run_backward", "backward", "grad")
_PACKAGE_DIR = Path(__file__).resolve().parents[1]


@contextlib.contextmanager
def record_memory_history(max_entries: int = 1_000_000, stacks: str = "python") -> Iterator[None]:
    """Record the CUDA caching allocator's history inside the block (take `torch.cuda.memory.
    _snapshot()` before leaving it). stacks="all" adds C++ frames, which name the autograd node of
    each backward allocation but make the snapshot slower to take."""
    torch.cuda.memory._record_memory_history(enabled="all", context="all", stacks=stacks, max_entries=max_entries)
    try:
        yield
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)


def cuda_snapshot(fn: Callable[[], object], max_entries: int = 1_000_000, stacks: str = "python") -> dict:
    """Run `fn` with the allocator history on; return the snapshot (its `source` key added)."""
    with record_memory_history(max_entries, stacks):
        fn()
        torch.cuda.synchronize()
        snapshot = torch.cuda.memory._snapshot()
    snapshot["source"] = CUDA_SOURCE
    return snapshot


def cpu_snapshot(fn: Callable[[], object]) -> dict:
    """Run `fn` under the PyTorch profiler with memory events and Python stacks, and convert them
    to the snapshot format (CPU allocations, no segments of a caching allocator)."""
    from torch.cuda._memory_viz import _profile_to_snapshot

    activities = [torch.profiler.ProfilerActivity.CPU]
    with torch.profiler.profile(activities=activities, profile_memory=True, record_shapes=True,
                                with_stack=True) as prof:
        fn()
    snapshot = _profile_to_snapshot(prof)
    snapshot["source"] = CPU_SOURCE
    return snapshot


def save_snapshot(snapshot: dict, path: str | Path) -> None:
    with open(path, "wb") as f:
        pickle.dump(snapshot, f)


def load_snapshot(path: str | Path) -> dict:
    """A pickled snapshot written by `save_snapshot` or `torch.cuda.memory._dump_snapshot` (our
    own runs' files only: unpickling runs code)."""
    with open(path, "rb") as f:
        return pickle.load(f)


def _frame(frame: dict) -> tuple[str, int, str]:
    """(file, line, function) of a snapshot frame, either format (allocator or profiler-made)."""
    filename, line, name = frame.get("filename", ""), int(frame.get("line", 0) or 0), frame.get("name", "")
    if filename in ("none", "", "??"):
        match = _PROFILER_FRAME.match(name)
        if match:
            return match["file"], int(match["line"]), match["func"]
        return "", 0, name
    return filename, line, name


def _in_package(filename: str) -> str | None:
    """The path inside cs336sys ("model.py", "attention/naive.py") or None."""
    parts = Path(filename).parts
    if "cs336sys" in parts:
        return "/".join(parts[len(parts) - parts[::-1].index("cs336sys"):])
    return None


def frame_label(frame: dict) -> str:
    filename, line, func = _frame(frame)
    inside = _in_package(filename)
    if inside is not None:
        return f"{inside}:{line} {func}"
    if filename:
        return f"{Path(filename).name}:{line} {func}"
    return func


def allocation_site(frames: list[dict]) -> str:
    """The category of an allocation, from its innermost frame that says something: a cs336sys
    frame outside this profiling package (`model.py:48 forward`), an autograd node's C++ `apply`
    frame (`autograd: MmBackward0`) or the autograd engine's Python entry (`autograd (backward)`);
    failing those, the innermost Python frame, or "(no stack)" (`summarize_snapshot` adds the
    phase when it knows it: "(no stack) in backward")."""
    parsed = [_frame(f) for f in frames]
    for frame, (filename, _, func) in zip(frames, parsed, strict=True):
        inside = _in_package(filename)
        if inside is not None and not inside.startswith("profiling/"):
            return frame_label(frame)
        node = _AUTOGRAD_NODE.search(func)
        if node:
            return f"autograd: {node[1]}"
        if func in _AUTOGRAD_ENTRIES and "autograd" in filename:
            return "autograd (backward)"
    for frame, (filename, _, _) in zip(frames, parsed, strict=True):
        if filename.endswith(".py"):
            return frame_label(frame)
    return NO_STACK


def source_line(label: str) -> str | None:
    """The source text of a `path:line func` label inside cs336sys (None elsewhere)."""
    match = re.match(r"^(?P<path>[\w/]+\.py):(?P<line>\d+) ", label)
    if not match:
        return None
    text = linecache.getline(str(_PACKAGE_DIR / match["path"]), int(match["line"])).strip()
    return text or None


def user_frames(frames: list[dict], limit: int = 6) -> list[str]:
    """The cs336sys frames of a stack, innermost first (or its first frames when it has none)."""
    ours = [frame_label(f) for f in frames
            if (inside := _in_package(_frame(f)[0])) is not None and not inside.startswith("profiling/")]
    return (ours or [frame_label(f) for f in frames])[:limit]


def _pick_trace(snapshot: dict, device: int | None) -> tuple[int, list[dict]]:
    traces = snapshot.get("device_traces", [])
    if device is None:
        device = max(range(len(traces)), key=lambda i: len(traces[i])) if traces else 0
    return device, traces[device] if device < len(traces) else []


def _metadata(event: dict) -> str:
    return event.get("user_metadata") or ""


def summarize_snapshot(snapshot: dict, device: int | None = None, max_points: int = 1000, top_categories: int = 10,
                       top_allocations: int = 15) -> dict[str, Any]:
    """Reduce a snapshot to what the report needs (a few tens of KB).

    Returns {"source", "device", "events" (alloc + free events on the x axis), "peak_bytes",
    "peak_event", "baseline_bytes" (alive before recording), "final_bytes", "peak_reserved_bytes"
    (CUDA only, else None), "categories" (bottom to top; `top_categories` sites, then "other", with
    "before recording" first when present), "category_code" ({site: its source line} for sites in
    cs336sys), "peak_by_category" ({category: bytes at the peak}), "timeline": {"event",
    "total", "by_category" (one list per category, aligned with "categories")} sampled at no more
    than `max_points` events (the largest total of each bin, so the peak is kept),
    "phases" ([{"name", "start_event", "end_event"}] from the allocator's memory metadata, set by
    the annotation ranges), "largest_allocations" ([{"bytes", "count", "site", "frames",
    "phase"}]: allocations grouped by size and stack, largest first)}.
    """
    device, trace = _pick_trace(snapshot, device)
    free_action = "free_completed" if any(e["action"] == "free_completed" for e in trace) else "free_requested"
    events = [e for e in trace if e["action"] in ("alloc", free_action)]
    n = len(events)
    lifetimes = _lifetimes(snapshot, device, events)
    categories, curves, total = _category_curves(lifetimes, n, top_categories)
    peak_event = int(np.argmax(total))
    bin_size = max(1, math.ceil((n + 1) / max_points))
    samples = sorted({0, n, peak_event} | {lo + int(np.argmax(total[lo:lo + bin_size]))
                                           for lo in range(0, n + 1, bin_size)})
    source = snapshot.get("source", CUDA_SOURCE)
    return {
        "source": source,
        "device": device,
        "events": n,
        "peak_bytes": int(total[peak_event]),
        "peak_event": peak_event,
        "baseline_bytes": int(total[0]),
        "final_bytes": int(total[n]),
        "peak_reserved_bytes": _peak_reserved(snapshot, trace) if source == CUDA_SOURCE else None,
        "categories": categories,
        # profiler-made frames carry a function's first line, not the allocating one
        "category_code": {} if source == CPU_SOURCE else {c: code for c in categories if (code := source_line(c))},
        "peak_by_category": {c: int(curve[peak_event]) for c, curve in zip(categories, curves, strict=True)},
        "timeline": {
            "event": samples,
            "total": [int(total[i]) for i in samples],
            "by_category": [[int(curve[i]) for i in samples] for curve in curves],
        },
        "phases": _phases(events)[:200],
        "largest_allocations": _largest_allocations(lifetimes, top_allocations),
    }


def _lifetimes(snapshot: dict, device: int, events: list[dict]) -> list[list]:
    """Each allocation as [first index alive, index it ends at or None, bytes, site, frames, phase]; index
    i is the state after the i-th of `events`, index 0 the state before any. Blocks freed but never
    allocated while recording, and blocks the segments hold that no event names, were there before."""
    lifetimes: list[list] = []
    alive: dict[int, list] = {}
    for i, e in enumerate(events, start=1):
        if e["action"] == "alloc":
            frames = e.get("frames", [])
            site = allocation_site(frames)
            if site == NO_STACK and _metadata(e):  # e.g. the backward's allocations on CUDA (stacks="python")
                site = f"{NO_STACK} in {_metadata(e)}"
            record = [i, None, e["size"], site, frames, _metadata(e)]
            alive[e["addr"]] = record
            lifetimes.append(record)
        else:
            record = alive.pop(e["addr"], None)
            if record is None:  # allocated before recording began
                lifetimes.append([0, i, e["size"], BEFORE_RECORDING, e.get("frames", []), ""])
            else:
                record[1] = i
    tracked = {addr for addr in alive}
    for segment in snapshot.get("segments", []):
        if segment.get("device", device) != device:
            continue
        address = segment.get("address") or 0
        for block in segment.get("blocks", []):
            if block.get("state") == "active_allocated" and block.get("address", address) not in tracked:
                lifetimes.append([0, None, block["size"], BEFORE_RECORDING, block.get("frames", []), ""])
            address += block["size"]
    return lifetimes


def _curve(changes: list[tuple[int, int]], n: int) -> np.ndarray:
    """Bytes alive at each index 0..n from (index, change) pairs (index n + 1: alive at the end)."""
    delta = np.zeros(n + 2, dtype=np.int64)
    for index, change in changes:
        delta[index] += change
    return np.cumsum(delta)[: n + 1]


def _highest(changes: list[tuple[int, int]]) -> int:
    # one event per index (index 0 only gains, n + 1 only loses), so prefix sums in index order suffice
    return int(np.cumsum([c for _, c in sorted(changes)]).max())


def _category_curves(lifetimes: list[list], n: int,
                     top_categories: int) -> tuple[list[str], list[np.ndarray], np.ndarray]:
    """(categories, their curves, the total curve): the `top_categories` sites with the highest bytes
    alive at any one time, after "before recording", then "other" for the rest. A dense curve only for
    the sites drawn (a long snapshot has ~1e6 events and hundreds of sites)."""
    changes: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for start, end, size, site, _, _ in lifetimes:
        changes[site] += [(start, size), ((n + 1) if end is None else end, -size)]
    ranked = sorted((s for s in changes if s != BEFORE_RECORDING), key=lambda s: (-_highest(changes[s]), s))
    categories = ([BEFORE_RECORDING] if BEFORE_RECORDING in changes else []) + ranked[:top_categories]
    curves = [_curve(changes[c], n) for c in categories]
    total = _curve([c for site_changes in changes.values() for c in site_changes], n)
    if len(ranked) > top_categories:
        categories.append(OTHER)
        curves.append(total - np.sum(curves, axis=0))
    return categories, curves, total


def _phases(events: list[dict]) -> list[dict]:
    """Runs of events with the same memory metadata (the annotation ranges' names), by event index."""
    phases: list[dict] = []
    for i, e in enumerate(events, start=1):
        name = _metadata(e)
        if phases and phases[-1]["name"] == name:
            phases[-1]["end_event"] = i
        elif name:
            phases.append({"name": name, "start_event": i, "end_event": i})
    return phases


def _largest_allocations(lifetimes: list[list], top: int) -> list[dict]:
    """Allocations grouped by size and cs336sys stack, largest first (then most frequent)."""
    groups: dict[tuple[int, str], dict] = {}
    for _, _, size, site, frames, phase_name in lifetimes:
        stack = user_frames(frames)
        key = (size, "|".join(stack) or site)
        group = groups.setdefault(key, {"bytes": size, "count": 0, "site": site, "frames": stack, "phase": phase_name})
        group["count"] += 1
    return sorted(groups.values(), key=lambda g: (-g["bytes"], -g["count"]))[:top]


def _peak_reserved(snapshot: dict, trace: list[dict]) -> int:
    """Peak reserved (cudaMalloc'd) bytes: walk the segment events back from the final state."""
    reserved = sum(s.get("total_size", 0) for s in snapshot.get("segments", []))
    peak = reserved
    for e in reversed(trace):
        if e["action"] in ("segment_alloc", "segment_map"):
            reserved -= e["size"]
        elif e["action"] in ("segment_free", "segment_unmap"):
            reserved += e["size"]
        peak = max(peak, reserved)
    return peak


def _unit(nbytes: float) -> tuple[float, str]:
    return (2**30, "GiB") if nbytes >= 2**30 else (2**20, "MiB") if nbytes >= 2**20 else (2**10, "KiB")


def render_memory_timeline(summary: dict, path: str | Path, title: str | None = None, width: float = 11.0) -> None:
    """The active-memory timeline of a summary: memory over allocation events, stacked by
    allocation site, phases shaded, the peak marked."""
    timeline = summary["timeline"]
    scale, unit = _unit(max(summary["peak_bytes"], 1))
    fig = Figure(figsize=(width, 5.0))
    ax = fig.subplots()
    palette = matplotlib.colormaps["tab20"]
    colors = [palette((2 * i) % 20 + (2 * i) // 20 % 2) for i in range(len(summary["categories"]))]  # hues first
    ys = [[v / scale for v in curve] for curve in timeline["by_category"]]
    labels = [c if len(c) <= 60 else c[:59] + "…" for c in summary["categories"]]
    if ys:
        ax.stackplot(timeline["event"], ys, labels=labels, colors=colors, linewidth=0, step="post", zorder=2)
    for p in summary["phases"]:  # a band along the top, and a faint background over the phase
        color = SHADES.get(p["name"], "#cccccc")
        start, end = p["start_event"], min(p["end_event"] + 1, summary["events"])  # event i holds until i + 1
        ax.axvspan(start, end, color=color, alpha=0.15, lw=0, zorder=0)
        ax.axvspan(start, end, ymin=0.965, ymax=1.0, color=color, lw=0, zorder=3)
        ax.text(p["start_event"], 1.0, f" {p['name']}", transform=ax.get_xaxis_transform(), fontsize=7,
                va="bottom", zorder=4)
    peak = summary["peak_bytes"] / scale
    ax.axhline(peak, color="black", lw=0.6, ls="--")
    ax.annotate(f"peak {peak:.2f} {unit}", (summary["peak_event"], peak), xytext=(4, 4), textcoords="offset points",
                fontsize=8)
    ax.set_xlabel("allocation event (alloc / free)")
    ax.set_ylabel(f"active memory ({unit})")
    ax.set_xlim(0, max(summary["events"], 1))
    ax.set_ylim(0, peak * 1.08 if peak else 1)
    ax.set_title(title or summary["source"], fontsize=9, loc="left", pad=14 if summary["phases"] else 6)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7, frameon=False, reverse=True)
    fig.text(0.01, 0.01, summary["source"], fontsize=6, color="#555555")
    fig.tight_layout()
    fig.savefig(path, dpi=130)
