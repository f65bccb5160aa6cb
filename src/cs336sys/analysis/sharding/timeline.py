"""The gather timeline of one FSDP step: from the timeline summary rendered beside the `fsdp_trace`
result, which lanes compute, how much of the all-gathers' time is hidden behind compute and how much
exposed, which gathers were waited for, per phase; the step's figure."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd

from cs336sys.analysis.common import figure, save_figure
from cs336sys.analysis.sharding.shared import number
from cs336sys.analysis.verdicts import waits

# A gather counts as waited for when the compute lanes are idle as it ends and resume within this many
# microseconds of its end.
WAIT_SLACK_US = 50.0
GATHER = re.compile(r"all_?gather|allgather", re.I)
PHASES = ("forward", "backward")
TIMELINE_COLORS = {"compute": "#4C72B0", "all-gather": "#DD8452", "other communication": "#937860",
                   "memcpy": "#55A868", "memset": "#8172B3", "exposed": "#C44E52"}
PHASE_SHADES = {"forward": "#9ecae1", "backward": "#fdae6b", "sync": "#fc9272", "optimizer_step": "#a1d99b"}
ZOOM_GATHERS = 8  # the zoomed panel: the forward from its start to the end of its first gathers

def _intersection(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The intervals where both sets of intervals hold."""
    from cs336sys.profiling.trace import merge_intervals

    a, b = merge_intervals(a), merge_intervals(b)
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if hi > lo:
            out.append((lo, hi))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def _complement(busy: list[tuple[float, float]], lo: float, hi: float) -> list[tuple[float, float]]:
    """The gaps between the busy intervals within [lo, hi]."""
    from cs336sys.profiling.trace import merge_intervals

    gaps, t = [], lo
    for a, b in merge_intervals(busy):
        if a > t:
            gaps.append((t, min(a, hi)))
        t = max(t, b)
        if t >= hi:
            break
    if t < hi:
        gaps.append((t, hi))
    return [(a, b) for a, b in gaps if b > a]


def _length(intervals) -> float:
    """The time the intervals cover, overlaps counted once."""
    from cs336sys.profiling.trace import union_length

    return union_length(intervals)


def _phase_extents(summary: dict) -> dict[str, tuple[float, float]]:
    """Start and end of each shaded phase's first range: on the device where recorded, else on the host."""
    out = {}
    for r in summary.get("ranges", []):
        if r["name"] in PHASE_SHADES and r["name"] not in out:
            start, dur = ((r["device_start_us"], r["device_dur_us"]) if r.get("device_start_us") is not None
                          else (r["host_start_us"], r["host_dur_us"]))
            out[r["name"]] = (float(start), float(start + dur))
    return out


def gather_exposure(summary: dict, slack_us: float = WAIT_SLACK_US) -> dict | None:
    """From a timeline summary: which lanes compute (their busiest category is compute), the all-gathers
    on the other lanes, and the gaps of the compute lanes (no compute, copy or memset on any of them)
    within the step. A gather's time is hidden where compute runs, exposed where the compute lanes are
    idle while it is in flight; it is waited for when the compute lanes are idle as it ends and resume
    within `slack_us`. The same split for all communication, and per phase (forward, backward)."""
    ev = summary.get("events") or {}
    if not ev.get("start_us"):
        return None
    names = summary.get("names", [])
    busy_by_lane: dict[int, dict[str, float]] = {}
    for lane, cat, dur in zip(ev["lane"], ev["category"], ev.get("busy_us", ev["dur_us"]), strict=True):
        busy_by_lane.setdefault(lane, {}).setdefault(cat, 0.0)
        busy_by_lane[lane][cat] += dur
    compute_lanes = {lane for lane, t in busy_by_lane.items() if max(t, key=t.get) == "compute"}
    if not compute_lanes:
        return None
    busy, gathers, others = [], [], []
    gather_kernels, comm_merged = [], []  # kernels per gather event; (start, kernels) of every collective event
    gather_count = 0
    for name, lane, cat, start, dur, count in zip(ev["name"], ev["lane"], ev["category"], ev["start_us"],
                                                  ev["dur_us"], ev.get("count", [1] * len(ev["lane"])), strict=True):
        interval = (float(start), float(start) + float(dur))
        if lane in compute_lanes:
            if cat != "communication":
                busy.append(interval)
        elif cat == "communication":
            label = names[name] if isinstance(name, int) and name < len(names) else str(name)
            comm_merged.append((interval[0], int(count)))
            if GATHER.search(label):
                gathers.append(interval)
                gather_kernels.append(int(count))
                gather_count += int(count)
            else:
                others.append(interval)
    span = max(float(s) + float(d) for s, d in zip(ev["start_us"], ev["dur_us"], strict=True))
    gaps = _complement(busy, 0.0, span)

    def split(intervals, lo=0.0, hi=span) -> dict:
        clipped = _intersection(intervals, [(lo, hi)])
        total = _length(clipped)
        exposed = _length(_intersection(clipped, gaps))
        return {"total_us": total, "exposed_us": exposed, "hidden_us": total - exposed,
                "hidden_share": (total - exposed) / total if total else None}

    forward = _phase_extents(summary).get("forward")
    in_forward = sorted(x for x in gathers if forward is None or forward[0] <= x[0] <= forward[1])
    first_exposed = _length(_intersection([in_forward[0]], gaps)) if in_forward else None
    waited = [any(a < end <= b and b - end <= slack_us and b < span for a, b in gaps) for _, end in gathers]
    phases = _phase_extents(summary)

    def in_phase(lo: float, hi: float) -> dict:
        """The phase's gathers; `waited_after_first` leaves out its first, which nothing runs before
        (ours issues the forward's first gathers as the forward starts). `kernels`: the kernels inside its
        gather events, and `merged`: whether the summary merged any of its collectives with neighbours (an
        event named for its longest kernel may then hold reduce-scatters too, so the counts are of events)."""
        inside = sorted((start, w, k) for (start, _), w, k in zip(gathers, waited, gather_kernels, strict=True)
                        if lo <= start <= hi)
        flags = [w for _, w, _ in inside]
        return {"events": len(inside), "waited": sum(flags), "waited_after_first": sum(flags[1:]),
                "kernels": sum(k for _, _, k in inside),
                "merged": any(lo <= a <= hi for a, k in comm_merged if k > 1), **split(gathers, lo, hi)}

    out = {"compute_lanes": sorted(summary["lanes"][i]["label"] for i in compute_lanes if i < len(summary["lanes"])),
           "gathers": {"count": gather_count, "events": len(gathers), "waited": sum(waited), **split(gathers)},
           "communication": split(gathers + others),
           "phases": {p: {"start_us": lo, "end_us": hi, "gathers": in_phase(lo, hi)}
                      for p, (lo, hi) in phases.items() if p in PHASES},
           "span_us": span, "compute_idle_us": _length(gaps), "slack_us": slack_us,
           "first_forward_exposed_us": first_exposed,
           "merged": bool(summary.get("merged")),
           "_gaps": gaps, "_exposed": _intersection(gathers, gaps), "_gathers": gathers}
    return out


# The forward's gathers count as hidden behind compute when at most this share of their time ran with the
# compute lanes idle.
HIDDEN_SHARE = 0.5


def forward_gathers_verdict(exposure: dict) -> dict | None:
    """Whether the forward's all-gathers were in time and hidden: how many came after the first (`later`),
    how many of those were waited for (`waited`, and `waits`' verdict on the two), the share of the forward's
    gather time that ran with the compute lanes idle (`exposed_share`) and whether it is at most
    `HIDDEN_SHARE` (`hidden`; None without their times). `answer`: "late" where more than half were waited
    for, else "not_hidden" where the gathers were not hidden, else "yes" where none was waited for, else
    "mostly". None where the forward had at most one gather, leaving nothing to judge."""
    forward = exposure["phases"].get("forward")
    if forward is None or forward["gathers"]["events"] <= 1:
        return None
    g = forward["gathers"]
    later, waited = g["events"] - 1, g["waited_after_first"]
    verdict = waits(waited, later)
    exposed = g["exposed_us"] / g["total_us"] if g.get("total_us") else None
    hidden = None if exposed is None else exposed <= HIDDEN_SHARE  # None: no gather time to judge
    answer = ("late" if verdict == "more_than_half" else "not_hidden" if hidden is False
              else "yes" if verdict == "none" else "mostly")
    return {"later": later, "waited": waited, "verdict": verdict, "exposed_share": exposed, "hidden": hidden,
            "answer": answer}


def _timeline_dirs(paths: list[Path]) -> list[Path]:
    """The input folders that hold a timeline summary."""
    return [p for p in paths if p.is_dir() and (p / "timeline.json").exists()]


def trace(df: pd.DataFrame, paths: list[Path], out: Path) -> dict | None:
    """The trace point's settings and totals (or its status where it failed), and from its timeline the
    gathers' exposure, the forward gathers' verdict and the figure; None where nothing was traced."""
    dirs = _timeline_dirs(paths)
    if not dirs and df.empty:
        return None
    info: dict = {}
    ok = df[df.status == "ok"] if not df.empty else df
    if not ok.empty:
        r = ok.iloc[0]
        unit = r.get("unit")  # the trace's step is FSDPSettings' with its default unit, "layer", unless recorded
        world = number(r.get("env.world_size"))
        info.update(size=r["size"], compute_dtype=r.get("compute_dtype"), tool=r.get("tool"),
                    totals={k: number(v) for k, v in (r.get("totals") or {}).items()},
                    window_us=number(r.get("window_us")), unit="layer" if unit is None or unit != unit else str(unit),
                    world=int(world) if world else None)
    elif not df.empty:
        info["status"] = df.iloc[0]["status"]
    if not dirs:
        return info
    wanted = [Path(p).with_suffix("") for p in ok["path"]] if not ok.empty and "path" in ok else []
    d = next((x for x in dirs if x in wanted), dirs[0])
    summary = json.loads((d / "timeline.json").read_text())
    result = d.parent / f"{d.name}.json"
    if "size" not in info and result.exists():
        from cs336sys.results import read_result

        settings = read_result(result)["settings"]
        info.update(size=settings.get("size"), compute_dtype=settings.get("compute_dtype"))
    info.setdefault("tool", summary.get("tool"))
    info.setdefault("totals", summary.get("totals"))
    info["on_device"] = summary.get("source") == "cuda"  # CUDA kernels per stream; else CPU ops per thread
    exposure = gather_exposure(summary)
    if exposure is not None:
        info["figure"] = _timeline_figure(summary, exposure, info, out)
        info["exposure"] = {k: v for k, v in exposure.items() if not k.startswith("_")}
        info["exposure"]["forward_gathers"] = forward_gathers_verdict(exposure)
    return info


def timed_step(info: dict, fsdp: list[dict]) -> dict | None:
    """The profiled step's setting timed without the profiler in the fsdp_step job of its size and rank count
    (ours with the trace's unit and compute dtype, the mean over every round), and the profiled step's span
    over it (the profiler's slow-down; the two are different jobs). None where that point did not run."""
    span = (info.get("exposure") or {}).get("span_us") or (info.get("totals") or {}).get("span_us")
    job = next((f for f in fsdp if f["size"] == info.get("size") and f["world"] == info.get("world")), None)
    per = job and job["dtypes"].get(info.get("compute_dtype"))
    unit = info.get("unit", "layer")
    e = per and per["variants"].get("ours" if unit == "layer" else f"ours-{unit}")
    if not e or e.get("mean_ms") is None or not span:
        return None
    return {"ms": e["mean_ms"], "span_over_step": span / 1e3 / e["mean_ms"]}


def _timeline_figure(summary: dict, exposure: dict, info: dict, out: Path) -> str:
    """The step's lanes (compute, all-gathers, other communication), the compute lanes' idle time while
    a gather is in flight as its own row, the phases shaded; below, the forward's first gathers."""
    ev = summary["events"]
    names = summary.get("names", [])
    lanes = summary["lanes"]
    rows = [lane["label"] for lane in lanes] + ["compute idle, gather in flight"]
    bars: dict[tuple[int, str], list[tuple[float, float]]] = {}
    for name, lane, cat, start, dur in zip(ev["name"], ev["lane"], ev["category"], ev["start_us"], ev["dur_us"],
                                           strict=True):
        label = names[name] if isinstance(name, int) and name < len(names) else str(name)
        kind = cat if cat != "communication" else ("all-gather" if GATHER.search(label) else "other communication")
        bars.setdefault((lane, kind), []).append((start / 1e3, max(dur / 1e3, 1e-6)))
    exposed = [(a / 1e3, (b - a) / 1e3) for a, b in exposure["_exposed"]]
    phases = _phase_extents(summary)
    forward = phases.get("forward", (0.0, exposure["span_us"]))
    firsts = sorted(g for g in exposure["_gathers"] if forward[0] <= g[0] <= forward[1])[:ZOOM_GATHERS]
    zoom = (forward[0] / 1e3, (max(e for _, e in firsts) if firsts else forward[1]) / 1e3)
    zoom = (zoom[0], zoom[1] + 0.05 * (zoom[1] - zoom[0]) + 1e-3)
    height = 0.24 * len(rows) + 0.6  # a lane's bar a quarter inch: the figure fits the page under its heading
    fig, axes = figure(2 * height + 0.5, 2, 1)
    for ax, (lo, hi), title in ((axes[0], (0.0, exposure["span_us"] / 1e3), "one step"),
                                (axes[1], zoom, f"the forward's first {len(firsts)} all-gathers (events on any lane)")):
        for name, (start, end) in phases.items():
            if end / 1e3 > lo and start / 1e3 < hi:
                ax.axvspan(start / 1e3, end / 1e3, color=PHASE_SHADES[name], alpha=0.35, lw=0, zorder=1)
        for (lane, kind), b in bars.items():
            ax.broken_barh(b, (lane - 0.38, 0.76), facecolors=TIMELINE_COLORS.get(kind, "#999999"), linewidth=0,
                           zorder=3)
        if exposed:
            ax.broken_barh(exposed, (len(lanes) - 0.38, 0.76), facecolors=TIMELINE_COLORS["exposed"], linewidth=0,
                           zorder=3)
        ax.set_yticks(range(len(rows)), rows)
        ax.set_ylim(len(rows) - 0.4, -0.6)
        ax.set_xlim(lo, hi)
        ax.grid(axis="y", visible=False)
        ax.set_title(title, loc="left")
    axes[-1].set_xlabel("time from the step's start (ms)")
    from matplotlib.patches import Patch

    present = {k for _, k in bars} | ({"exposed"} if exposed else set())
    handles = [Patch(color=c, label=k if k != "exposed" else "gather exposed") for k, c in TIMELINE_COLORS.items()
               if k in present]
    handles += [Patch(color=PHASE_SHADES[n], alpha=0.35, label=n.replace("_", " ")) for n in phases]
    fig.legend(handles=handles, loc="outside lower center", ncol=min(len(handles), 5), frameon=False)
    return save_figure(fig, out, "fsdp_timeline")
