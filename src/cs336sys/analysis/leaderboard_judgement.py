"""The leaderboard section's judgements across its points: each of ours against PyTorch's parts in its
own job and against the targets, the verdict on ours as built and the gap, the best point and our
entry, the ablation of each optimisation, the headline table's rows."""

from __future__ import annotations

TARGET_STEP_S = 5.0  # the project's leaderboard issue: step <= 5.0 s on 2 H200s
# ... i.e. at least 1.35x faster than PyTorch's parts in the same job (their 6.73-6.78 s over 5.0 s)
TARGET_SPEEDUP = 1.35
TARGET_WALL_S = 600.0  # the handout: from an empty cache, the timing run within 10 minutes
# A step is called bound by compute when no more than this share of it is communication that no
# compute hid (in ours and in PyTorch's parts).
COMPUTE_BOUND_EXPOSED_SHARE = 0.05


def against_baseline(row: dict, ok: list[dict], floor_s: float | None) -> dict:
    """A config of ours against the targets, the floor and PyTorch's parts timed in the same job."""
    out = {"job": row["job"], "config": row["name"], "setup": row["setup"], "step_s": row["step_s"],
           "step_ok": row["step_s"] <= TARGET_STEP_S, "to_target_s": row["step_s"] - TARGET_STEP_S,
           "wall_s": row["wall_s"], "wall_ok": row["wall_s"] is not None and row["wall_s"] <= TARGET_WALL_S,
           "peak_gib": row["peak_gib"]}
    if floor_s:
        out["over_floor"] = row["step_s"] / floor_s
    base = next((r for r in ok if r["variant"] == "pytorch_parts" and r["job"] == row["job"]), None)
    if base is not None:
        out.update(base_s=base["step_s"], base_peak_gib=base["peak_gib"], speedup=base["step_s"] / row["step_s"],
                   speedup_ok=base["step_s"] / row["step_s"] >= TARGET_SPEEDUP)
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


def best_point(rows: list[dict], floor_s: float | None) -> dict | None:
    """The fastest config of ours that was timed in a job with PyTorch's parts, when it is not `ours`."""
    ok = [r for r in rows if r["status"] == "ok"]
    with_base = {r["job"] for r in ok if r["variant"] == "pytorch_parts"}
    candidates = [r for r in ok if r["variant"] == "ours" and r["job"] in with_base]
    if not candidates:
        return None
    best = min(candidates, key=lambda r: r["step_s"])
    if best["name"] == "ours":
        return None
    return against_baseline(best, ok, floor_s)


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
    """Every other config of ours against `ours` timed in the same job."""
    ok = [r for r in rows if r["status"] == "ok"]
    out = []
    for job in dict.fromkeys(r["job"] for r in ok):
        ours = next((r for r in ok if r["job"] == job and r["name"] == "ours"), None)
        if ours is None:
            continue
        out += [{"job": job, "config": r["name"], "settings": r["changes"], "step s": r["step_s"],
                 "change s": r["step_s"] - ours["step_s"], "vs ours": f"{r['step_s'] / ours['step_s']:.3f}×",
                 "peak GiB/GPU": r["peak_gib"]}
                for r in ok if r["job"] == job and r["variant"] == "ours" and r is not ours]
    return out


def own_attention(row: dict) -> bool:
    """An entry must use our own implementation: SDPA's kernels (cuDNN) make a config an ablation only."""
    return row["variant"] == "ours" and row.get("attention") != "sdpa"


def entry_point(rows: list[dict], floor_s: float | None) -> dict | None:
    """Our leaderboard entry: the fastest config that uses only our own kernels, with what it was timed
    beside (PyTorch's parts, or `ours`, in the same job)."""
    ok = [r for r in rows if r["status"] == "ok" and own_attention(r)]
    if not ok:
        return None
    entry = min(ok, key=lambda r: r["step_s"])
    out = against_baseline(entry, [r for r in rows if r["status"] == "ok"], floor_s)
    same = next((r for r in rows if r["status"] == "ok" and r["job"] == entry["job"] and r["name"] == "ours"
                 and r is not entry), None)
    if same is not None:
        out.update(ours_s=same["step_s"], vs_ours=entry["step_s"] / same["step_s"])
    out["mfu"] = entry.get("mfu")
    out["host"] = entry["host"]["label"]
    return out


def headline_rows(rows: list[dict], verdict: dict | None, entry: dict | None, best: dict | None) -> list[dict]:
    """The headline table's rows: PyTorch's parts and ours as built (one job), our entry, the fastest
    ablation; each once, each against PyTorch's parts in its own job."""
    picks = []
    for pick, role in ((verdict and ("main", "pytorch_parts"), "baseline"),
                       (verdict and (verdict["job"], verdict["config"]), "ours as built"),
                       (entry and (entry["job"], entry["config"]), "our entry"),
                       (best and (best["job"], best["config"]), "ablation, cuDNN attention")):
        if pick and not any(p[0] == pick for p in picks):
            picks.append((pick, role))
    if verdict is not None:
        picks[0] = ((verdict["job"], "pytorch_parts"), picks[0][1])
    head = []
    for (job, name), role in picks:
        r = next((r for r in rows if r["job"] == job and r["name"] == name and r["status"] == "ok"), None)
        if r is None:
            continue
        base = next((b for b in rows if b["job"] == job and b["variant"] == "pytorch_parts" and b["status"] == "ok"),
                    None)
        head.append({"config": name, "role": role, "step (s)": r["step_s"],
                     "× PyTorch's parts": f"{base['step_s'] / r['step_s']:.3f}" if base else "not in its job",
                     "peak (GiB/GPU)": r["peak_gib"], "MFU (%)": 100 * r["mfu"] if r.get("mfu") else None})
    return head
