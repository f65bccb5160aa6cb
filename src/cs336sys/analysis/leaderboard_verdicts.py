"""The 8B step's verdicts, decided once: every place that states one (the summary's rows, the leaderboard
section, the conclusions, the README's sentence about the 8B step) reads it from here.

The targets: our entry (our own kernels only) within `TARGET_STEP_S` per step; and, against the
strongest PyTorch-native step at the same memory (variant `pytorch_native`, its peak within
`MEMORY_MATCH` of the entry's, timed in the same job as the entry), at least `TARGET_NATIVE_SPEEDUP`x its
speed. A target with nothing measured has no verdict (None): it is said to be not measured, never
judged on a stand-in. PyTorch's parts (every block checkpointed) stay the simple reference, with a
ratio and no target: that ratio mixes a memory policy with our kernels.
"""

from __future__ import annotations

TARGET_STEP_S = 5.0  # the project's leaderboard issue: step <= 5.0 s on 2 H200s
TARGET_NATIVE_SPEEDUP = 1.15  # issue 59: >= 1.15x the memory-matched PyTorch-native step in the same job
TARGET_WALL_S = 600.0  # the handout: from an empty cache, the timing run within 10 minutes
MEMORY_MATCH = 0.10  # a PyTorch-native point is memory-matched when its peak is within +-10 % of the entry's

ATTENTION_LABELS = {"gluon": "our Gluon attention", "flash_tuned": "our Triton attention",
                    "flash": "our Triton attention", "naive": "naive attention", "sdpa": "cuDNN's attention via SDPA"}


def attention_label(row: dict) -> str:
    return ATTENTION_LABELS.get(row.get("attention"), f"attention {row.get('attention')}")


def fastest_point(rows: list[dict]) -> dict | None:
    """The fastest config of ours with any attention (an entry or not), labelled by what it uses."""
    ok = [r for r in rows if r["status"] == "ok" and r["variant"] == "ours"]
    if not ok:
        return None
    r = min(ok, key=lambda r: r["step_s"])
    return {"job": r["job"], "config": r["name"], "step_s": r["step_s"], "attention": attention_label(r),
            "peak_gib": r["peak_gib"]}


def job_spread(rows: list[dict]) -> dict | None:
    """How far one config's step moves between jobs: of every config timed in more than one job, the one
    whose fastest and slowest runs differ most (`spread`: slowest over fastest, less one). A comparison of two
    configs across jobs is inside the noise when it differs by no more than that."""
    runs: dict[str, list[float]] = {}
    for r in rows:
        if r["status"] == "ok":
            runs.setdefault(r["name"], []).append(r["step_s"])
    widest = max(((name, min(v), max(v)) for name, v in runs.items() if len(v) > 1),
                 key=lambda t: t[2] / t[1], default=None)
    if widest is None:
        return None
    name, lo, hi = widest
    return {"config": name, "lo_s": lo, "hi_s": hi, "spread": hi / lo - 1}


def runner_up(rows: list[dict], entry: dict | None) -> dict | None:
    """The fastest config of ours with another attention than the entry's, against the entry: in the same
    job, beyond the two steps' standard deviations or within them; across jobs, within the between-job
    spread of identical configs (`job_spread`) or beyond it."""
    if entry is None:
        return None
    mine = next((r for r in rows if r["job"] == entry["job"] and r["name"] == entry["config"]), None)
    others = [r for r in rows if r["status"] == "ok" and r["variant"] == "ours" and mine is not None
              and r["attention"] != mine["attention"]]
    if not others:
        return None
    r = min(others, key=lambda r: r["step_s"])
    out = {"job": r["job"], "config": r["name"], "step_s": r["step_s"], "attention": attention_label(r),
           "over_entry": r["step_s"] / mine["step_s"] - 1, "same_job": r["job"] == mine["job"],
           "same_settings": r["with_sdpa"] == mine["with_sdpa"]}
    if out["same_job"]:
        out["within_noise"] = abs(r["step_s"] - mine["step_s"]) <= r.get("std_s", 0.0) + mine.get("std_s", 0.0)
    else:
        spread = job_spread(rows)
        out["spread"] = spread
        out["within_noise"] = spread is not None and abs(out["over_entry"]) <= spread["spread"]
    return out


def native_points(rows: list[dict], entry: dict | None) -> list[dict]:
    """Every PyTorch-native point timed in a job with our entry's config: its time, peak and the entry's
    time in that job (ratio above 1: the entry is faster), and whether its peak matches the entry's."""
    if entry is None:
        return []
    ok = [r for r in rows if r["status"] == "ok"]
    out = []
    for r in ok:
        mine = next((e for e in ok if e["job"] == r["job"] and e["name"] == entry["config"]), None)
        if r["variant"] != "pytorch_native" or mine is None:
            continue
        matched = abs(r["peak_gib"] / mine["peak_gib"] - 1) <= MEMORY_MATCH
        out.append({"job": r["job"], "config": r["name"], "setup": r["setup"], "step_s": r["step_s"],
                    "peak_gib": r["peak_gib"], "entry_s": mine["step_s"], "entry_peak_gib": mine["peak_gib"],
                    "speedup": r["step_s"] / mine["step_s"], "matched": matched})
    return out


def memory_matched(points: list[dict]) -> dict | None:
    """The strongest PyTorch-native point at the entry's memory: the fastest of the matched ones."""
    matched = [p for p in points if p["matched"]]
    return min(matched, key=lambda p: p["step_s"]) if matched else None


def verdicts(entry: dict | None, native: dict | None) -> dict:
    """Each target's verdict: `met` True, False, or None where nothing was measured."""
    return {"step": {"target_s": TARGET_STEP_S, "met": None if entry is None else entry["step_s"] <= TARGET_STEP_S,
                     "value_s": None if entry is None else entry["step_s"]},
            "native_speedup": {"target": TARGET_NATIVE_SPEEDUP,
                               "met": None if native is None else native["speedup"] >= TARGET_NATIVE_SPEEDUP,
                               "value": None if native is None else native["speedup"]},
            "wall": {"target_s": TARGET_WALL_S, "met": None if entry is None or entry["wall_s"] is None
                     else entry["wall_s"] <= TARGET_WALL_S}}


def readme_claim(v: dict, size: str = "8B") -> str:
    """The README's sentence about the 8B step, from the verdicts: tests/test_analysis_leaderboard.py fails
    while the README says otherwise than the committed results."""
    step, native = v["step"], v["native_speedup"]
    head = f"The {size} step (`cs336sys.leaderboard`)"
    if step["met"] is None:
        return f"{head} is not measured yet."
    said = (f"reaches the {step['target_s']:.1f} s target with our own kernels" if step["met"]
            else f"does not yet reach the {step['target_s']:.1f} s target")
    against = "its speed against the strongest PyTorch-native step at the same memory"
    if native["met"] is None:
        tail = f"{against} is not measured yet"
    else:
        tail = f"{against} is {'at least' if native['met'] else 'under'} the {native['target']:.2f}× target"
    return f"{head} {said}; {tail}."


def why_step(points: list[dict], entry: dict, fallback: str | None) -> str | None:
    """Why our entry misses the step target: where the same config ran with SDPA's (cuDNN) attention, the
    time between the two is our attention kernels'; else `fallback` (the largest kernel-family loss)."""
    rows = [r for r in points if r["status"] == "ok"]
    mine = next((r for r in rows if r["job"] == entry["job"] and r["name"] == entry["config"]), None)
    twin = mine and next((r for r in rows if r["variant"] == "ours" and r["attention"] == "sdpa"
                          and r["setup"] == mine["with_sdpa"]), None)
    if twin is None or twin["step_s"] >= entry["step_s"]:
        return fallback
    return (f"the same config with cuDNN's attention (`{twin['name']}`, job {twin['job']}) takes "
            f"{twin['step_s']:.2f} s: our attention kernels cost the {entry['step_s'] - twin['step_s']:.2f} s between")


def summary_rows(size: str, entry: dict | None, fastest: dict | None, natives: list[dict], v: dict,
                 why: str | None, second: dict | None = None) -> list[dict]:
    """At most two rows: our entry against the step target (with the fastest config of any attention, or
    where the entry is the fastest the runner-up with another attention and whether the two differ beyond
    the noise), and the entry against the memory-matched PyTorch-native step (not measured: said so)."""
    native = memory_matched(natives)
    if entry is None:
        return []
    result = f"{entry['step_s']:.2f} s per step ({entry['attention']})"
    if fastest is not None and fastest["config"] != entry["config"]:
        result += f"; fastest with any attention: {fastest['step_s']:.2f} s ({fastest['attention']})"
    elif second is not None:
        where = "same job" if second["same_job"] else "another job"
        short = second["attention"].replace(" attention", "").replace(" via SDPA", "")  # "cuDNN's", "our Triton"
        result += (f"; {short} {second['step_s']:.2f} s, {where}"
                   + (": within noise" if second["within_noise"] else ""))
    rows = [{"part": f"{size} step, our entry: our kernels only ({entry['host']})", "result": result,
             "target": f"≤ {v['step']['target_s']:.1f} s", "met": v["step"]["met"], "ref": "lb-entry",
             "why": None if v["step"]["met"] else why}]
    if native is None and natives:
        measured = f"no PyTorch-native point within {100 * MEMORY_MATCH:.0f} % of the entry's peak: no ratio"
    elif native is None:
        measured = "not measured yet (overlay `next`)"
    else:
        measured = (f"{native['speedup']:.2f}× its speed (job {native['job']}: ours {native['entry_s']:.2f} s, "
                    f"`{native['config']}` {native['step_s']:.2f} s)")
    rows.append({"part": f"{size} step, our entry against PyTorch's own step at its memory (same job)",
                 "result": measured, "target": f"≥ {v['native_speedup']['target']:.2f}×",
                 "met": v["native_speedup"]["met"], "ref": "lb-native"})
    return rows


def why_kernels(gap: dict | None) -> str | None:
    """The largest kernel-family loss of ours against PyTorch's parts, in words (from the profiled steps)."""
    kernels = (gap or {}).get("kernels")
    if not kernels:
        return None
    attention = sum(kernels.get(f, {}).get("diff_ms", 0.0) for f in ("attention forward", "attention backward"))
    family, k = max(kernels.items(), key=lambda fk: fk[1]["diff_ms"])
    if attention >= k["diff_ms"]:
        return f"our attention kernels take {attention / 1e3:.2f} s longer per step than cuDNN's"
    return f"{family} takes {k['diff_ms'] / 1e3:.2f} s longer per step than in PyTorch's parts"


def public_reference(reference: dict | None, flops: float | None, world_size: int, peak_tflops: float | None,
                     entry: dict | None) -> dict | None:
    """The public best (a published figure, other GPUs) set against ours by the share of peak each reaches
    (both counted with attention's causal half)."""
    if not reference or not flops or not peak_tflops:  # the smoke grid's tiny model has no peak to set it against
        return None
    out = {k: v for k, v in reference.items() if k != "hardware"}
    hw = reference.get("hardware", {})
    theirs = hw.get(reference.get("public_best_gpu", ""), {}).get("bf16_dense_tflops")
    if theirs and reference.get("public_best_ms"):
        out["public_best_mfu"] = flops / (reference["public_best_ms"] / 1e3) / (world_size * theirs * 1e12)
        out["public_best_peak_tflops"] = theirs
        out["peak_ratio"] = theirs / peak_tflops
        out["public_best_here_s"] = flops / (out["public_best_mfu"] * world_size * peak_tflops * 1e12)
    if entry is not None and entry.get("mfu"):
        out["entry_mfu"] = entry["mfu"]
    return out
