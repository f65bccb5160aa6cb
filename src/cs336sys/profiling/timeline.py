"""One step of a torch.profiler trace as a compact per-stream timeline, and its figure.

A GPU host reduces a trace of any size with `summarize_timeline` and commits only the summary (a
few hundred KB at most); `render_timeline` draws one summary, or several stacked on one time
axis (naive vs overlapped DDP, say), on any machine.

Device work is what `cs336sys.profiling.trace` parses: on CUDA, kernels/memcpys/memsets in lanes
per stream, the NCCL kernels labelled communication; on a CPU-only trace, the top-level CPU ops in
lanes per thread, with the c10d collective ops of the main thread and the "gloo:..." ranges of
gloo's worker threads labelled communication. The window is one occurrence of a host range (the
"step" range `record_trace` puts around each step, by default); work belongs to it when it was
launched inside it. Times are microseconds from the window's start.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure
from matplotlib.patches import Patch

from cs336sys.profiling.annotate import PHASES
from cs336sys.profiling.kernels import kernel_class
from cs336sys.profiling.trace import ParsedTrace, Work, intersection_length, parse_trace, union_length

CATEGORIES = ("compute", "communication", "memcpy", "memset")
COLORS = {"compute": "#4C72B0", "communication": "#DD8452", "memcpy": "#55A868", "memset": "#8172B3"}
SHADES = {"forward": "#9ecae1", "backward": "#fdae6b", "sync": "#fc9272", "optimizer_step": "#a1d99b"}
MAX_RANGES = 300


def event_category(w: Work) -> str:
    if w.kind in ("memcpy", "memset"):
        return w.kind
    return "communication" if kernel_class(w.name, w.kind) == "communication" else "compute"


def _window(parsed: ParsedTrace, window: str | tuple[float, float] | None, occurrence: int) -> dict[str, Any]:
    if isinstance(window, tuple):
        return {"name": None, "start": window[0], "end": window[1]}
    if window is not None:
        found = parsed.occurrences(window)
        if found:
            r = found[occurrence]
            return {"name": window, "start": r.start, "end": r.end}
    launches = [w.launch for w in parsed.work] + [r.start for r in parsed.ranges]
    ends = [w.end for w in parsed.work] + [r.end for r in parsed.ranges]
    return {"name": None, "start": min(launches, default=0.0), "end": max(ends, default=0.0)}


def _merge(events: list[dict], max_events: int) -> list[dict]:
    """Merge neighbours in a lane (same category, gap below a threshold that doubles from 1 us)
    until at most `max_events` remain; a merged event keeps its longest member's name."""
    gap = 1.0
    while len(events) > max_events:
        by_lane: dict[str, list[dict]] = defaultdict(list)
        for e in events:
            by_lane[e["lane"]].append(e)
        merged = []
        for lane_events in by_lane.values():
            lane_events.sort(key=lambda e: e["start"])
            current = None
            for e in lane_events:
                if (current is not None and e["category"] == current["category"]
                        and e["start"] - current["end"] <= gap):
                    if e["dur"] > current["longest"]:
                        current["name"], current["longest"] = e["name"], e["dur"]
                    current["end"] = max(current["end"], e["start"] + e["dur"])
                    current["count"] += e["count"]
                    current["busy"] += e["busy"]
                else:
                    current = dict(e, end=e["start"] + e["dur"], longest=e["dur"])
                    merged.append(current)
        events = [dict(e, dur=e["end"] - e["start"]) for e in merged]
        gap *= 2
    return events


def summarize_timeline(source: Any, window: str | tuple[float, float] | None = "step", occurrence: int = -1,
                       ranges: Sequence[str] | None = None, max_events: int = 4000) -> dict[str, Any]:
    """Reduce a trace (anything `parse_trace` takes) to one window's device work and ranges.

    `window`: a range name (its `occurrence`-th occurrence, default the last), a (start, end) host
    time pair, or None for the whole trace (also the fallback when the name does not occur).
    `ranges`: the range names to keep (default all in the window, at most 300).
    Returns {"tool", "source", "window": {"name", "start_us" (absolute trace time), "dur_us"},
    "lanes": [{"id", "label"}], "names": [...], "events": {"name" (index into names), "lane" (index
    into lanes), "category", "start_us", "dur_us", "busy_us", "count"} (columns of equal length;
    `count` > 1 and `busy_us` < `dur_us` where neighbours were merged to stay under `max_events`),
    "ranges": [{"name", "host_start_us", "host_dur_us", "device_start_us", "device_dur_us"}],
    "totals": {"<category>_us" (time covered, overlaps once), "communication_overlapped_us"
    (communication time during which compute also ran), "span_us"}, "merged": bool}.
    """
    parsed = source if isinstance(source, ParsedTrace) else parse_trace(source)
    win = _window(parsed, window, occurrence)
    work = [w for w in parsed.work if win["start"] <= w.launch <= win["end"] and w.depth == 0]
    t0 = min([win["start"]] + [w.start for w in work])

    events = [{"name": w.name, "lane": w.lane, "category": event_category(w), "start": w.start - t0, "dur": w.dur,
               "busy": w.dur, "count": 1} for w in work]
    intervals: dict[str, list[tuple[float, float]]] = {c: [] for c in CATEGORIES}
    for e in events:
        intervals[e["category"]].append((e["start"], e["start"] + e["dur"]))
    totals = {f"{c}_us": union_length(intervals[c]) for c in CATEGORIES}
    totals["communication_overlapped_us"] = intersection_length(intervals["communication"], intervals["compute"])
    totals["span_us"] = max((e["start"] + e["dur"] for e in events), default=0.0)

    merged = len(events) > max_events
    events = _merge(events, max_events)
    lane_time: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for e in events:
        lane_time[e["lane"]][e["category"]] += e["busy"]
    lane_role = {lane: max(t, key=t.get) for lane, t in lane_time.items()}
    lane_ids = sorted(lane_role, key=lambda lane: (CATEGORIES.index(lane_role[lane]), lane))
    names = sorted({e["name"] for e in events})
    name_index = {n: i for i, n in enumerate(names)}
    events.sort(key=lambda e: (lane_ids.index(e["lane"]), e["start"]))

    kept = []
    for r in parsed.ranges:
        if r.name == win["name"] or not (win["start"] <= r.start and r.end <= win["end"]):
            continue
        if ranges is not None and r.name not in ranges:
            continue
        inside = [parsed.work[i] for i in parsed.work_indices([r])]
        device_start = min((w.start for w in inside), default=None)
        device_end = max((w.end for w in inside), default=None)
        kept.append({"name": r.name, "host_start_us": round(r.start - t0, 3), "host_dur_us": round(r.dur, 3),
                     "device_start_us": None if device_start is None else round(device_start - t0, 3),
                     "device_dur_us": None if device_start is None else round(device_end - device_start, 3)})
        if len(kept) == MAX_RANGES:
            break

    return {
        "tool": parsed.tool,
        "source": parsed.source,
        "window": {"name": win["name"], "start_us": win["start"], "dur_us": win["end"] - win["start"]},
        "lanes": [{"id": lane, "label": f"{lane} ({lane_role[lane]})"} for lane in lane_ids],
        "names": names,
        "events": {
            "name": [name_index[e["name"]] for e in events],
            "lane": [lane_ids.index(e["lane"]) for e in events],
            "category": [e["category"] for e in events],
            "start_us": [round(e["start"], 3) for e in events],
            "dur_us": [round(e["dur"], 3) for e in events],
            "busy_us": [round(e["busy"], 3) for e in events],
            "count": [e["count"] for e in events],
        },
        "ranges": kept,
        "totals": {k: round(v, 3) for k, v in totals.items()},
        "merged": merged,
    }


def save_summary(summary: dict, path: str | Path) -> None:
    Path(path).write_text(json.dumps(summary, separators=(",", ":")))


def render_timeline(summaries: dict | Sequence[dict], path: str | Path, titles: Sequence[str] | None = None,
                    shade: Sequence[str] = PHASES, width: float = 12.0) -> None:
    """Draw one or more timeline summaries stacked on one time axis (ms): a row per lane, device
    work coloured by category, the ranges named in `shade` as bands over their device extent
    (their host extent where no device work was launched in them)."""
    summaries = [summaries] if isinstance(summaries, dict) else list(summaries)
    titles = list(titles) if titles is not None else [s["window"]["name"] or "trace" for s in summaries]
    heights = [max(len(s["lanes"]), 1) * 0.45 + 0.9 for s in summaries]
    fig = Figure(figsize=(width, sum(heights) + 0.6))
    axes = fig.subplots(len(summaries), 1, sharex=True, squeeze=False, gridspec_kw={"height_ratios": heights})[:, 0]
    for ax, summary, title in zip(axes, summaries, titles, strict=True):
        ev = summary["events"]
        for lane in range(len(summary["lanes"])):
            for category in CATEGORIES:
                bars = [(s / 1e3, max(d / 1e3, 1e-6)) for s, d, ln, c in
                        zip(ev["start_us"], ev["dur_us"], ev["lane"], ev["category"], strict=True)
                        if ln == lane and c == category]
                if bars:
                    ax.broken_barh(bars, (lane - 0.38, 0.76), facecolors=COLORS[category], linewidth=0, zorder=3)
        for r in summary["ranges"]:
            if r["name"] not in shade:
                continue
            start, dur = ((r["device_start_us"], r["device_dur_us"]) if r["device_start_us"] is not None
                          else (r["host_start_us"], r["host_dur_us"]))
            ax.axvspan(start / 1e3, (start + dur) / 1e3, color=SHADES.get(r["name"], "#dddddd"), alpha=0.35, lw=0,
                       zorder=1)
            ax.text(start / 1e3, -0.55, r["name"], fontsize=7, va="top", zorder=4)
        ax.set_yticks(range(len(summary["lanes"])), [lane["label"] for lane in summary["lanes"]], fontsize=8)
        ax.set_ylim(len(summary["lanes"]) - 0.4, -0.6)
        totals = summary["totals"]
        ax.set_title(f"{title} — compute {totals['compute_us'] / 1e3:.2f} ms, communication "
                     f"{totals['communication_us'] / 1e3:.2f} ms ({totals['communication_overlapped_us'] / 1e3:.2f}"
                     f" ms overlapped) · {summary['tool']}", fontsize=9, loc="left")
    axes[-1].set_xlabel("time from window start (ms)")
    present = {c for s in summaries for c in s["events"]["category"]}
    handles = [Patch(color=COLORS[c], label=c) for c in CATEGORIES if c in present]
    handles += [Patch(color=SHADES.get(n, "#dddddd"), alpha=0.35, label=n) for n in shade
                if any(r["name"] == n for s in summaries for r in s["ranges"])]
    if handles:
        fig.legend(handles=handles, loc="lower center", ncol=len(handles), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    fig.savefig(path, dpi=130)
