"""The leaderboard section's judgements across its points: each of ours against PyTorch's parts in its
own job (a ratio; the targets are `leaderboard_verdicts`'), ours as built and the gap, our entry, the
ablation of each optimisation, the headline table's rows."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from cs336sys.analysis.common import save_table
from cs336sys.analysis.leaderboard_verdicts import TARGET_STEP_S, TARGET_WALL_S, attention_label

# A step is called bound by compute when no more than this share of it is communication that no
# compute hid (in ours and in PyTorch's parts).
COMPUTE_BOUND_EXPOSED_SHARE = 0.05


def against_baseline(row: dict, ok: list[dict], floor_s: float | None) -> dict:
    """A config of ours against the targets, the floor and PyTorch's parts timed in the same job."""
    out = {"job": row["job"], "config": row["name"], "setup": row["setup"], "step_s": row["step_s"],
           "step_ok": row["step_s"] <= TARGET_STEP_S, "to_target_s": row["step_s"] - TARGET_STEP_S,
           "wall_s": row["wall_s"], "wall_ok": row["wall_s"] is not None and row["wall_s"] <= TARGET_WALL_S,
           "peak_gib": row["peak_gib"], "do_bench_s": None if math.isnan(row["do_bench_s"]) else row["do_bench_s"],
           "do_bench_calls": row.get("do_bench_calls")}
    if floor_s:
        out["over_floor"] = row["step_s"] / floor_s
    base = next((r for r in ok if r["variant"] == "pytorch_parts" and r["job"] == row["job"]), None)
    if base is not None:
        out.update(base_s=base["step_s"], base_peak_gib=base["peak_gib"], speedup=base["step_s"] / row["step_s"])
    return out


def verdict_of(rows: list[dict], floor_s: float | None) -> dict | None:
    """`ours` (the default config) against the targets and against PyTorch's parts timed in the same job
    (the first job that has both; else `ours` alone, from the first job that has it)."""
    ok = [r for r in rows if r["status"] == "ok"]
    jobs = list(dict.fromkeys(r["job"] for r in ok))
    pick = next((j for j in jobs if {"ours", "pytorch_parts"} <= {r["name"] for r in ok if r["job"] == j}), None)
    ours = next((r for r in ok if r["name"] == "ours" and r["job"] == (pick or r["job"])), None)
    if ours is None:
        return None
    return against_baseline(ours, ok, floor_s)


def gap_to_baseline(rows: list[dict], verdict: dict | None) -> dict | None:
    """Where ours loses to PyTorch's parts, in the job of the verdict: each phase's device time, and
    the communication that no compute hid, from the profiled step of each."""
    if not verdict or "base_s" not in verdict:
        return None
    job = verdict["job"]
    ours = next(r for r in rows if r["job"] == job and r["name"] == verdict["config"])
    base = next(r for r in rows if r["job"] == job and r["variant"] == "pytorch_parts")
    phases = {}
    for phase in ("forward", "backward"):
        a, b = ours["phase_device_ms"].get(phase), base["phase_device_ms"].get(phase)
        if a is not None and b is not None:
            phases[phase] = {"ours_ms": a, "base_ms": b, "diff_ms": a - b}
    exposed = [ours.get("exposed_comm_ms"), base.get("exposed_comm_ms")]
    compute_bound = None
    if None not in exposed:
        compute_bound = max(exposed) < COMPUTE_BOUND_EXPOSED_SHARE * 1000 * verdict["step_s"]
    return {"job": job, "phases": phases, "ours_exposed_comm_ms": exposed[0], "base_exposed_comm_ms": exposed[1],
            "compute_bound": compute_bound, "compute_bound_share_pct": 100 * COMPUTE_BOUND_EXPOSED_SHARE,
            "ours_optimizer_ms": ours["phase_device_ms"].get("optimizer_step")}


def ablation_rows(rows: list[dict]) -> list[dict]:
    """Every other config of ours against `ours` timed in the same job: the settings it changes (and how
    many), the change of the step, and whether that change is within the two steps' standard deviations."""
    ok = [r for r in rows if r["status"] == "ok"]
    out = []
    for job in dict.fromkeys(r["job"] for r in ok):
        ours = next((r for r in ok if r["job"] == job and r["name"] == "ours"), None)
        if ours is None:
            continue
        out += [{"job": job, "config": r["name"], "settings": r["changes"], "changed": len(r["changes"].split(", ")),
                 "step s": r["step_s"], "change s": r["step_s"] - ours["step_s"],
                 "within_noise": abs(r["step_s"] - ours["step_s"]) <= r.get("std_s", 0.0) + ours.get("std_s", 0.0),
                 "vs ours": f"{r['step_s'] / ours['step_s']:.3f}×", "peak GiB/GPU": r["peak_gib"]}
                for r in ok if r["job"] == job and r["variant"] == "ours" and r is not ours]
    return out


def ablation_table(ablation: list[dict], out: Path) -> tuple[dict, dict | None, list[int], str]:
    """The ablation's largest saving, its largest single change beyond the noise, how many settings its rows
    change, and its table: each row named by what it changes (the config's name is that, spelt long; the CSV
    has both), a change within the two steps' spread marked."""
    largest = min(ablation, key=lambda a: a["change s"])
    single = [a for a in ablation if a["changed"] == 1 and not a["within_noise"]]
    frame = pd.DataFrame([{"job": a["job"], "config": a["config"], "what changes": a["settings"],
                           "step (s)": a["step s"], "change (s)": a["change s"], "× ours": a["vs ours"].rstrip("×"),
                           "peak (GiB/GPU)": a["peak GiB/GPU"], "within noise": a["within_noise"]} for a in ablation])
    cells = frame.drop(columns=["config", "within noise"]).assign(**{
        "step (s)": [f"{x:.3f}" for x in frame["step (s)"]],
        "change (s)": [f"{x:.2f}" + (" ≈" if n else "") for x, n in zip(frame["change (s)"], frame["within noise"],
                                                                       strict=True)],
        "peak (GiB/GPU)": [f"{x:.1f}" if x == x else "" for x in frame["peak (GiB/GPU)"]]})  # NaN: no reading
    return (largest, min(single, key=lambda a: a["change s"]) if single else None,
            sorted({a["changed"] for a in ablation}), save_table(cells, out, "ablation", digits=3, data=frame))


def own_attention(row: dict) -> bool:
    """An entry must use our own implementation: SDPA's kernels (cuDNN) make a config an ablation only."""
    return row["variant"] == "ours" and row.get("attention") != "sdpa"


def entry_point(rows: list[dict], floor_s: float | None) -> dict | None:
    """Our leaderboard entry: the fastest config that uses only our own kernels, with what it was timed
    beside (PyTorch's parts, or `ours`, in the same job). A config timed in several jobs (beside PyTorch's
    parts, beside the PyTorch-native points) is reported from the first job that has PyTorch's parts, not
    from its fastest run; its other runs are listed (`other_runs`)."""
    ok = [r for r in rows if r["status"] == "ok" and own_attention(r)]
    if not ok:
        return None
    every = [r for r in rows if r["status"] == "ok"]
    runs = [r for r in ok if r["name"] == min(ok, key=lambda r: r["step_s"])["name"]]
    with_parts = [r for r in runs if any(b["job"] == r["job"] and b["variant"] == "pytorch_parts" for b in every)]
    entry = (with_parts or sorted(runs, key=lambda r: r["step_s"]))[0]
    out = against_baseline(entry, every, floor_s)
    out["other_runs"] = [{"job": r["job"], "step_s": r["step_s"]} for r in runs if r is not entry]
    same = next((r for r in rows if r["status"] == "ok" and r["job"] == entry["job"] and r["name"] == "ours"
                 and r is not entry), None)
    if same is not None:
        out.update(ours_s=same["step_s"], vs_ours=entry["step_s"] / same["step_s"])
    out.update(mfu=entry.get("mfu"), mfu_palm=entry.get("mfu_palm"), host=entry["host"]["label"],
               attention=attention_label(entry))
    return out


def headline_rows(rows: list[dict], verdict: dict | None, entry: dict | None, fastest: dict | None,
                  native: dict | None) -> list[dict]:
    """The headline table's rows, each once: PyTorch's parts and ours as built (one job), our entry, the
    fastest config of any attention, the memory-matched PyTorch-native step and the entry in its job; each
    against PyTorch's parts in its own job where they ran there, and that job's PyTorch's parts shown before
    it, so that every ratio in the table is one of two times the table shows."""
    picks = []
    for pick, role in ((verdict and (verdict["job"], "pytorch_parts"), "PyTorch's parts (reference)"),
                       (verdict and (verdict["job"], verdict["config"]), "ours as built"),
                       (entry and (entry["job"], entry["config"]), "our entry"),
                       (fastest and (fastest["job"], fastest["config"]), "fastest, any attention"),
                       (native and (native["job"], entry["config"]), "our entry"),
                       (native and (native["job"], native["config"]), "PyTorch-native, memory-matched")):
        if pick and not any(p[0] == pick for p in picks):
            own = (pick[0], "pytorch_parts")
            if pick != own and not any(p[0] == own for p in picks):
                picks.append((own, "PyTorch's parts (reference)"))
            picks.append((pick, role))
    head = []
    for (job, name), role in picks:
        r = next((r for r in rows if r["job"] == job and r["name"] == name and r["status"] == "ok"), None)
        if r is None:
            continue
        base = next((b for b in rows if b["job"] == job and b["variant"] == "pytorch_parts" and b["status"] == "ok"),
                    None)
        head.append({"config": name, "role": f"{role}; job {job}", "step (s)": r["step_s"],
                     "× PyTorch's parts": f"{base['step_s'] / r['step_s']:.3f}" if base else "not in its job",
                     "peak (GiB/GPU)": r["peak_gib"], "MFU (%)": 100 * r["mfu"] if r.get("mfu") else None,
                     "PaLM's MFU (%)": 100 * r["mfu_palm"] if r.get("mfu_palm") else None})
    return head


def headline_cells(head: list[dict]) -> list[dict]:
    """The headline table's printed cells: the step in seconds to the millisecond, peak and MFU to one
    decimal (steps of one config move by a few per cent between jobs: more digits say nothing)."""
    def cell(x, digits: int) -> str:
        return "" if x is None or x != x else f"{x:.{digits}f}"

    return [h | {"step (s)": cell(h["step (s)"], 3), "peak (GiB/GPU)": cell(h["peak (GiB/GPU)"], 1),
                 "MFU (%)": cell(h["MFU (%)"], 1), "PaLM's MFU (%)": cell(h["PaLM's MFU (%)"], 1)} for h in head]

