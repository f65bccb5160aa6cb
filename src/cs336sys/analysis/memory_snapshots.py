"""The memory section's snapshots (problem 5 a-e): from the memory_snapshot results, peak memory per
context, mode and dtype; the active-memory timelines (re-drawn from each point's committed summary
JSON, in the report's figure style); the residual stream derived from the config and checked against
the allocation sizes seen; the largest allocations and the code that made them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from cs336sys.analysis.common import figure, save_figure, save_table
from cs336sys.profiling.timeline import SHADES
from cs336sys.units import GIB, MIB

if TYPE_CHECKING:
    from cs336sys.analysis.memory_context import MemoryContext

MODE_LABEL = {"forward": "forward", "forward_backward": "forward+backward", "train_step": "train step"}


def unit_of(largest: float) -> tuple[str, int]:
    """GiB for GPU-sized numbers, MiB for the smoke grid's tiny ones."""
    return ("GiB", GIB) if largest >= GIB else ("MiB", MIB)


def _cell(r: dict | None, scale: int) -> str | float | None:
    """A point's peak in the unit, its status where it did not run, None where it is not in the grid."""
    if r is None:
        return None
    return r["metrics"]["peak_bytes"] / scale if r["status"] == "ok" else r["status"]


def from_snapshots(ctx: MemoryContext, out: Path, snapshots: list[dict], residual_context: int | None = None) -> None:
    """Problem 5 (a-e) from the memory_snapshot results of the size with the most points that ran: peak
    memory per context, mode and dtype, the active-memory timelines, the residual stream (answered at
    `residual_context` where the snapshots have it, else at the longest context), the largest allocations."""
    ok = [r for r in snapshots if r["status"] == "ok"]
    by = {(r["settings"]["size"], r["settings"]["context_length"], r["settings"]["mode"], r["settings"]["dtype"]): r
          for r in snapshots}
    # one model size is shown: the one with the most points that ran
    size = max(sorted({k[0] for k in by}), key=lambda s: sum(1 for r in ok if r["settings"]["size"] == s))
    unit, scale = unit_of(max((r["metrics"]["peak_bytes"] for r in ok), default=0))
    contexts = sorted({k[1] for k in by if k[0] == size})
    dtypes = [d for d in ("fp32", "bf16") if any(k[3] == d for k in by)]
    modes = [m for m in MODE_LABEL if any(k[2] == m for k in by)]
    ctx.snapshot = {"size": size, "contexts": contexts, "dtypes": dtypes, "unit": unit,
                       "sources": sorted({r["metrics"]["source"] for r in ok}),
                       "oom": [f"context {k[1]} {MODE_LABEL[k[2]]} {k[3]}" for k, r in sorted(by.items())
                               if k[0] == size and r["status"] == "oom"]}
    ctx.snapshot["source"] = "; ".join(ctx.snapshot["sources"])
    _peaks(ctx, out, by, size, contexts, dtypes, modes, unit, scale)
    _timelines(ctx, out, by, size, contexts, dtypes, modes, scale)
    _residual(ctx, out, by, size, ok, residual_context)
    _largest(ctx, out, by, size)


Key = tuple[str, int, str, str]  # size, context length, mode, dtype


def _peaks(ctx: MemoryContext, out: Path, by: dict[Key, dict], size: str, contexts: list[int], dtypes: list[str],
           modes: list[str], unit: str, scale: int) -> None:
    """(b, c) peak memory: two numbers per context length, per dtype; bf16's peak over fp32's per mode."""
    rows = []
    for c in contexts:
        row = {"context": c}
        for d in dtypes:
            for m in modes:
                row[f"{MODE_LABEL[m]} {d} ({unit})"] = _cell(by.get((size, c, m, d)), scale)
        rows.append(row)
    ctx.tables["peaks"] = save_table(pd.DataFrame(rows), out, "peak_memory", digits=2)

    pairs: dict[str, list[tuple[int, dict, dict]]] = {}  # mode -> (context, fp32's metrics, bf16's)
    for (s, c, m, d), r in sorted(by.items()):
        other = by.get((s, c, m, "fp32"))
        if s == size and d == "bf16" and r["status"] == "ok" and other is not None and other["status"] == "ok":
            pairs.setdefault(m, []).append((c, other["metrics"], r["metrics"]))
    ctx.bf16_ratio = {MODE_LABEL[m]: {"mode": MODE_LABEL[m], **_bf16_against_fp32(v, scale)} for m, v in pairs.items()}


def _bf16_against_fp32(pairs: list[tuple[int, dict, dict]], scale: int) -> dict:
    """(c) bf16's peaks against fp32's over one mode's contexts: the ratio's range, at how many contexts bf16
    needs more, the largest excess; and, at the largest excess where both dtypes peak in the same phase, what
    the code sites (`peak_by_category`) hold at the two peaks: the bytes freed by the sites that shrink, added
    by those that grow, and the two that grow most."""
    ratio = {c: b["peak_bytes"] / a["peak_bytes"] for c, a, b in pairs}
    worst = max(ratio, key=lambda c: (ratio[c], c))
    out = {"min": min(ratio.values()), "max": max(ratio.values()), "points": len(pairs),
           "larger": sum(v > 1 for v in ratio.values()), "max_context": worst,
           "excess": next(b["peak_bytes"] - a["peak_bytes"] for c, a, b in pairs if c == worst) / scale}
    same_phase = [(c, a, b) for c, a, b in pairs if a["peak_phase"] == b["peak_phase"] and ratio[c] > 1]
    if same_phase:
        c, a, b = max(same_phase, key=lambda t: (ratio[t[0]], t[0]))
        fp32, bf16 = a["peak_by_category"], b["peak_by_category"]
        change = {site: bf16.get(site, 0) - fp32.get(site, 0) for site in set(fp32) | set(bf16)
                  if site != "before recording"}  # what the step allocated, not the state it started with
        grew = sorted((site for site in change if change[site] > 0 and site != "other"), key=lambda x: -change[x])
        out["sites"] = {"context": c, "phase": a["peak_phase"],
                        "freed": -sum(v for v in change.values() if v < 0) / scale,
                        "added": sum(v for v in change.values() if v > 0) / scale,
                        # a site as file:line, its function's name left to the table of the largest allocations
                        "grew": [{"site": site.split()[0], "change": change[site] / scale} for site in grew[:2]]}
    return out


def _timelines(ctx: MemoryContext, out: Path, by: dict[Key, dict], size: str, contexts: list[int], dtypes: list[str],
               modes: list[str], scale: int) -> None:
    """(a) timelines: forward and train step at the longest context where both ran (fp32 first); the
    phase in which each train step peaked."""
    pairs = [(c, d) for d in dtypes for c in reversed(contexts)
             if all(by.get((size, c, m, d)) is not None and by[(size, c, m, d)]["status"] == "ok" for m in modes)]
    if pairs:
        c, d = pairs[0]
        ctx.timeline = {"context_length": c, "dtype": d, "modes": []}
        for m in modes:
            r = by[(size, c, m, d)]
            summary_path = r["path"].with_suffix("") / "summary.json"
            entry = {"mode": MODE_LABEL[m], "peak": r["metrics"]["peak_bytes"] / scale,
                     "peak_phase": r["metrics"]["peak_phase"], "baseline": r["metrics"]["baseline_bytes"] / scale,
                     "phases": sorted(set(r["metrics"]["phases"]))}
            if summary_path.exists():
                summary = json.loads(summary_path.read_text())
                entry["figure"] = _timeline_figure(summary, out, f"timeline_{m}",
                                                   f"{size}, context {c}, {MODE_LABEL[m]}, {d}")
            ctx.timeline["modes"].append(entry)
    peaks_in = {}
    for (s, c, m, d), r in sorted(by.items()):
        if s == size and m == "train_step" and r["status"] == "ok" and r["metrics"]["peak_phase"]:
            peaks_in.setdefault(r["metrics"]["peak_phase"], []).append(f"{c} {d}")
    ctx.train_peak_phases = peaks_in


def _residual(ctx: MemoryContext, out: Path, by: dict[Key, dict], size: str, ok: list[dict],
              prefer_context: int | None) -> None:
    """(d) the residual stream: derived from the config, checked against the allocation sizes seen; the
    answer at `prefer_context` (fp32) where measured, and at the longest context beside it."""
    rows = []
    for (s, c, m, d), r in sorted(by.items()):
        if s != size or r["status"] != "ok" or m != "forward":
            continue
        res = r["metrics"]["residual"]
        rows.append({"context": c, "dtype": d, "derived (MiB)": r["metrics"]["residual_bytes"] / MIB,
                     "allocations of that size": res["exact_matches"],
                     "nearest size seen (MiB)": None if res["nearest_bytes"] is None else res["nearest_bytes"] / MIB,
                     "made at": f"`{res['nearest_sites'][0]['site']}`" if res["nearest_sites"] else ""})
    if rows:
        ctx.tables["residual"] = save_table(pd.DataFrame(rows), out, "residual_stream", digits=2)
        fp32 = [r for (s, c, m, d), r in sorted(by.items()) if s == size and r["status"] == "ok" and d == "fp32"]
        # the forward's point, as the table's rows (a train step allocates the same size more often)
        preferred = [r for r in fp32 if r["settings"]["context_length"] == prefer_context
                     and r["settings"]["mode"] == "forward"]
        ref = preferred[-1] if preferred else fp32[-1] if fp32 else ok[-1]
        res = ref["metrics"]["residual"]
        ctx.residual = {**res, "bytes": ref["metrics"]["residual_bytes"],
                        "nearest_mib": None if res["nearest_bytes"] is None else res["nearest_bytes"] / MIB,
                        "mib": ref["metrics"]["residual_bytes"] / MIB,
                        "matches_all": all(row["allocations of that size"] > 0 for row in rows),
                        "at": "saved_tensors" if preferred else "longest",
                        "longest_context": max(row["context"] for row in rows),
                        "longest_mib": max(row["derived (MiB)"] for row in rows)}


def _largest(ctx: MemoryContext, out: Path, by: dict[Key, dict], size: str) -> None:
    """(e) the largest allocations of the forward pass at the longest context that ran."""
    fwd = [r for (s, c, m, d), r in sorted(by.items(), key=lambda kv: (kv[0][3] != "fp32", -kv[0][1]))
           if s == size and m == "forward" and r["status"] == "ok"]
    if fwd:
        r = fwd[0]
        largest = [a for a in r["metrics"]["largest_allocations"] if a["site"] != "before recording"][:6]
        ctx.largest = {"context_length": r["settings"]["context_length"], "dtype": r["settings"]["dtype"],
                          "top_mib": largest[0]["bytes"] / MIB if largest else None,
                          "top_site": largest[0]["site"] if largest else None,
                          "top_code": largest[0].get("code") if largest else None}
        rows = [{"size (MiB)": a["bytes"] / MIB, "count": a["count"], "made at": f"`{a['site'][:48]}`",
                 "code": f"`{a['code'][:56]}`" if a.get("code") else ""} for a in largest]
        ctx.tables["largest"] = save_table(pd.DataFrame(rows), out, "largest_allocations", digits=2)


def _short(label: str, width: int = 46) -> str:
    """A legend label cut to `width` characters."""
    return label if len(label) <= width else label[: width - 1] + "…"


def _timeline_figure(summary: dict, out: Path, name: str, title: str) -> str:
    """The active-memory timeline of one snapshot summary at the report's width and font sizes:
    memory over allocation events, stacked by allocation site, phases as a band along the top."""
    import matplotlib

    timeline = summary["timeline"]
    scale = GIB if summary["peak_bytes"] >= GIB else MIB
    unit = "GiB" if scale == GIB else "MiB"
    fig, ax = figure(3.6)
    palette = matplotlib.colormaps["tab20"]
    colors = [palette((2 * i) % 20 + (2 * i) // 20 % 2) for i in range(len(summary["categories"]))]
    ys = [[v / scale for v in curve] for curve in timeline["by_category"]]
    if ys:
        ax.stackplot(timeline["event"], ys, labels=[_short(c) for c in summary["categories"]], colors=colors,
                     linewidth=0, step="post", zorder=2)
    peak = summary["peak_bytes"] / scale
    for p in summary["phases"]:
        color = SHADES.get(p["name"], "#cccccc")
        end = min(p["end_event"] + 1, summary["events"])
        ax.axvspan(p["start_event"], end, ymin=0.96, ymax=1.0, color=color, lw=0, zorder=3)
        ax.axvspan(p["start_event"], end, color=color, alpha=0.12, lw=0, zorder=0)
    for name in dict.fromkeys(p["name"] for p in summary["phases"]):
        ax.plot([], [], color=SHADES.get(name, "#cccccc"), lw=6, label=f"phase: {name}")
    ax.axhline(peak, color="black", lw=0.6, ls="--")
    ax.set_xlim(0, max(summary["events"], 1))
    low = min((sum(v) for v in zip(*ys, strict=True)), default=0.0) if ys else 0.0
    if peak and peak - low < 0.25 * peak:  # the step's changes are small against what it holds: zoom in
        margin = 0.1 * (peak - low) or 0.01 * peak
        ax.set_ylim(low - margin, peak + margin)
        title = f"{title} (axis from {low - margin:.1f} {unit})"
    else:
        ax.set_ylim(0, peak * 1.08 if peak else 1)
    ax.set_xlabel("allocation event (alloc or free)")
    ax.set_ylabel(f"active memory ({unit})")
    ax.set_title(f"{title}: peak {peak:.2f} {unit}", loc="left")
    ax.grid(axis="x", visible=False)
    handles, labels = ax.get_legend_handles_labels()
    fig.legend(handles[::-1], labels[::-1], loc="outside lower center", ncol=2, frameon=False)
    return save_figure(fig, out, name)
