"""Section: ddp — the all-reduce benchmark (problem 12; `ddp_allreduce`), the DDP variants' training steps against no
communication and PyTorch's DDP (14, 15, 17a, 19a; `ddp_steps`), the bucket overhead model and its fit
(19b; `ddp_model`), one profiled step of naive, overlapped and bucketed DDP drawn on one time axis
(17b), and the grid's machine time from Snakemake's timing records."""

from __future__ import annotations

import re
from pathlib import Path

from cs336sys.analysis import ddp_steps
from cs336sys.analysis.common import environment_summary, read_benchmark_tsv, results_frame
from cs336sys.analysis.ddp_allreduce import (  # noqa: F401  (the tests read the targets' constants here)
    ALLREDUCE_REFERENCE_SHARE,
    BUSBW_TARGET_FRACTION,
    TARGET_SIZE_BYTES,
    against_reference,
    allreduce,
    gloo_environment,
)
from cs336sys.analysis.ddp_context import DDPContext
from cs336sys.analysis.ddp_host import host_jobs, is_host
from cs336sys.analysis.ddp_model import formulas
from cs336sys.analysis.ddp_scaling import none_across, scaling
from cs336sys.analysis.ddp_sweep import sweep_figure, sweep_table
from cs336sys.analysis.ddp_trace import trace, trace_against_benchmark
from cs336sys.analysis.rounds import CLOCK_TOLERANCE_MHZ, with_rounds_pooled
from cs336sys.analysis.verdicts import all_of, at_most, between_jobs, overlaps

GRID_TARGET_S = 600.0  # the whole DDP grid's machine time
MIN_ROUNDS = 3  # a ratio the summary judges comes from a job of at least this many interleaved rounds


def build(paths: list[Path], out: Path, allreduce_reference: dict | None = None, pending: list[str] | None = None,
          **_: object) -> DDPContext:
    """The section's context: the all-reduce benchmark, the DDP steps, the traced steps, the grid's machine
    time and the summary."""
    frame = results_frame(paths)
    ctx = DDPContext(env=environment_summary(frame), model_formulas=formulas(), clock_tolerance_mhz=CLOCK_TOLERANCE_MHZ,
                     min_rounds=MIN_ROUNDS)
    if allreduce_reference:
        ctx.allreduce_reference = {str(k): float(v) for k, v in allreduce_reference["busbw_gbps"].items()}
        ctx.allreduce_reference_source = allreduce_reference["source"]
        ctx.allreduce_reference_share = ALLREDUCE_REFERENCE_SHARE
    gloo_environment(ctx, frame)
    if not frame.empty:
        allreduce(ctx, frame[frame.problem == "allreduce"], out)
        against_reference(ctx)
        frame = with_rounds_pooled(frame)  # each DDP variant's interleaved rounds in one row (analysis.rounds)
        steps = frame[frame.problem == "ddp_step"]
        host = is_host(steps)  # the host-overhead jobs: shown apart, never mixed into the grid's
        ddp_steps.jobs(ctx, steps[~host], out, ctx.allreduce_fits)
        host_jobs(ctx, steps[host], out)
        _between_jobs(ctx)
        if ctx.ddp_jobs:
            ctx.ddp_figure = sweep_figure(ctx.ddp_jobs, out)  # None where no job has a bucketed point
            ctx.ddp_bucket_table = sweep_table(ctx.ddp_jobs, out)
        _views_for_missed(ctx)
        busbw = {t["world"]: t.get("busbw", t["best_busbw"]) for t in ctx.allreduce_targets or []}
        ctx.ddp_scaling = scaling(ctx.ddp_jobs or [], busbw, out, ctx.ddp_host_jobs) or None
        ctx.ddp_none_across = none_across(ctx.ddp_scaling or [])
        trace(ctx, frame[frame.problem == "ddp_trace"], out)
        trace_against_benchmark(ctx, frame.drop(index=steps.index[host]), out)
    ctx.grid_time = grid_time([p for p in paths if p.suffix == ".tsv"])
    ctx.summary = _summary(ctx)
    missing = (ctx.allreduce_nccl_worlds or {}).get("missing")
    unrun = ([f"the NCCL all-reduce at {' and '.join(str(n) for n in missing)} GPUs"] if missing else []) + (
        [f"DDP {_by_world(pending)} (overlay `next`)"] if pending else [])  # config: ddp.pending
    ctx.limitations = [f"Not run (no host with the GPUs lent): {'; '.join(unrun)}."] if unrun else []
    return ctx


def _between_jobs(ctx: DDPContext) -> None:
    """A judged grid job's target ratio against the same ratio in the host series' job of the same size, dtype
    and ranks (another job, another day): where their ranges do not overlap, the ratio is not reproducible between
    jobs and its verdict is "noise" (`verdicts.between_jobs`), the other job's ratio kept beside it
    ("other_jobs"). Bucketed is compared where the job chose one bucket size in every round. The jobs'
    notes on a missed target follow the verdicts as they then stand."""
    hosts = [h for h in ctx.ddp_host_jobs or [] if not h["proxy"]]
    for j in [j for j in ctx.ddp_jobs or [] if j["rounds"] >= MIN_ROUNDS]:  # the jobs whose verdicts count
        same = [h for h in hosts if (h["size"], h["dtype"], h["world_size"]) == (j["size"], j["dtype"],
                                                                                  j["world_size"])]
        for name in ("overlap", "bucketed"):
            t = j["targets"].get(name) or {}
            picks = set(t.get("picks") or [])
            key = "overlap" if name == "overlap" else (
                ddp_steps.variant_key("bucketed", picks.pop()) if len(picks) == 1 else None)
            others = [h for h in same if key in h["ratios"]]
            if "ok" not in t or not others:
                continue
            t["other_jobs"] = [{**h["ratios"][key], "dates": h["dates"],
                                "ref": f"ddp-host-{h['size'].lower()}-{h['dtype']}"} for h in others]
            ranges = [(o["lo"], o["hi"]) for o in t["other_jobs"]]
            t["reproduced"] = all(overlaps((t["lo"], t["hi"]), r) for r in ranges)
            t["ok"] = between_jobs(t["ok"], (t["lo"], t["hi"]), ranges)
    for j in ctx.ddp_jobs or []:
        j["missed"] = ddp_steps.missed_note(j, ctx.ddp_jobs)


def _views_for_missed(ctx: DDPContext) -> None:
    """A grid job that misses the bucketed target gets the bucket views' result of its host job of the same
    size, dtype and ranks, which the section and the summary quote (none from another rank count)."""
    views = {(h["size"], h["dtype"], h["world_size"]): h["views"]
             for h in ctx.ddp_host_jobs or [] if not h["proxy"] and (h["world_size"] or 0) > 1 and "views" in h}
    for j in ctx.ddp_jobs or []:
        key = (j["size"], j["dtype"], j["world_size"])
        if j.get("missed") and "bucketed" in j["missed"]["targets"] and key in views:
            j["missed"]["views"] = views[key]


def _views_said(v: dict | None) -> str:
    """The bucket views' 2-rank result in words, or that it has not run."""
    if v is None:
        return "their 2-GPU run has not been made"
    said = f"in their own 2-rank job they take {v['ratio']:.3f}× PyTorch's step at {v['bucket_mb']:g} MiB"
    if "bucketed_ratio" in v:
        said += f" (our bucketed wrapper {v['bucketed_ratio']:.3f}×)"
    return said


# --- machine time ---------------------------------------------------------------------------------------

def grid_time(tsvs: list[Path]) -> dict | None:
    """Wall time of every job of the section's experiments (benchmarks/<experiment>/<job>.tsv, or
    benchmarks/<experiment>.tsv for an experiment with one job)."""
    if not tsvs:
        return None
    by: dict[str, dict] = {}
    for p in sorted(tsvs):
        experiment = p.stem if p.parent.name == "benchmarks" else p.parent.name
        e = by.setdefault(experiment, {"experiment": experiment, "jobs": 0, "wall_s": 0.0, "cpu_only_s": 0.0})
        wall = read_benchmark_tsv(p)
        e["jobs"] += 1
        e["wall_s"] += wall
        if p.stem.startswith("gloo-"):  # gloo all-reduce jobs use the host's CPUs only
            e["cpu_only_s"] += wall
    total = sum(e["wall_s"] for e in by.values())
    cpu_only = sum(e["cpu_only_s"] for e in by.values())
    return {"experiments": list(by.values()), "total_s": total, "jobs": sum(e["jobs"] for e in by.values()),
            "cpu_only_s": cpu_only, "target_s": GRID_TARGET_S,
            "has_cpu_only": bool(cpu_only > 0), "ok": at_most(total, GRID_TARGET_S), "total_min": total / 60,
            "target_min": GRID_TARGET_S / 60}


def _summary(ctx: DDPContext) -> list[dict]:
    """Page 1, two rows: NCCL's bus bandwidth at each rank count against NCCL measured alone on the same
    kind of host (a figure from outside the pipeline, which the configuration records), and our bucketed DDP
    against PyTorch's in the jobs measured in interleaved rounds; past them, overlap against PyTorch's. A row's
    verdict is `all_of` the very verdicts the targets' table marks, job by job, and its text gives each job's
    mark."""
    rows = []
    measured = [t for t in ctx.allreduce_targets or [] if "busbw" in t]
    if measured:
        refs = ctx.allreduce_reference or {}
        ts = sorted(measured, key=lambda t: -t["world"])
        said = ", ".join(f"{t['busbw']:.0f} GB/s ({t['world']} GPUs)" for t in ts)
        shares = [t["of_reference"] for t in ts if "of_reference" in t]
        if shares:
            said += ": " + ", ".join(f"{100 * x:.0f} %" for x in shares) + " of NCCL alone"
        rows.append({"part": f"NCCL all-reduce, bus bandwidth at {ctx.allreduce_target_values['size']}",
                     "result": said, "target": f"≥ {100 * ALLREDUCE_REFERENCE_SHARE:.0f} % of NCCL alone, "
                     "measured outside the pipeline" if refs
                     else None, "met": all_of([t.get("reference_ok") for t in ts]) if refs else None,
                     "ref": "ddp-allreduce-target"})
    limits = ctx.ddp_targets or {}
    judged = [j for j in ctx.ddp_jobs or [] if j["rounds"] >= MIN_ROUNDS and "ok" in j["targets"].get("bucketed", {})]
    if judged:
        ts = [j["targets"]["bucketed"] for j in judged]
        met = all_of([t["ok"] for t in ts])
        missed = next((j for j in judged if j["targets"]["bucketed"]["ok"] is False), None)
        chosen = "size chosen on the others" if all(t.get("held_out") for t in ts) else "the fastest size"
        rows.append({"part": f"Bucketed DDP against PyTorch's DDP ({judged[0]['rounds']} rounds, {chosen})",
                     "result": ", ".join(_job_said(j, "bucketed", short=k > 0 and j["dtype"] == judged[0]["dtype"])
                                         for k, j in enumerate(judged)),
                     "target": f"≤ {limits['bucketed_vs_torch']:.2f}× its step", "met": met, "ref": "ddp-targets",
                     "why": None if missed is None else "bucketing adds a hook per tensor and the copies into and "
                            "out of the buckets; bucket views remove the copies out: "
                            + _views_said((missed.get("missed") or {}).get("views"))})
    # Past the summary's quota (report.SUMMARY_ROWS): the conclusions count it with the targets, the summary
    # page does not show it. The overlap target is the section's as much as the bucketed one is.
    overlapped = [j for j in judged if "ok" in j["targets"].get("overlap", {})]
    if overlapped:
        met = all_of([j["targets"]["overlap"]["ok"] for j in overlapped])
        missed = [j for j in overlapped if j["targets"]["overlap"]["ok"] is False]
        calls = sorted({j["variants"]["overlap"].get("all_reduces") for j in missed} - {None})
        rows.append({"part": f"Overlapped DDP (a collective per tensor) against PyTorch's DDP "
                             f"({overlapped[0]['rounds']} rounds)",
                     "result": "; ".join(_job_said(j, "overlap") for j in overlapped),
                     "target": f"≤ {limits['overlap_vs_torch']:.2f}× its step", "met": met, "ref": "ddp-targets",
                     "why": None if met is not False else "a collective per gradient tensor ("
                            + " or ".join(str(c) for c in calls) + " a step) against PyTorch's "
                            f"{limits['torch_default_mb']:g} MiB buckets"})
    return rows


MARKS = {True: "✓", False: "✗", "noise": "≈"}


def _job_said(j: dict, name: str, short: bool = False) -> str:
    """One job's ratio for a target with its own verdict, as the targets' table marks it, and the other job's
    ratio where the two do not agree: "1.15× ≈ (xl bf16, 2 GPUs; 0.97× in another job: not reproducible)";
    `short` leaves out the dtype (the row's first job names it): "(xl, 4 GPUs)"."""
    t = j["targets"][name]
    said = f"{t['ratio']:.2f}× {MARKS[t['ok']]} " + (f"({j['size']}, {j['world_size']} GPUs" if short else
                                                      f"({j['size']} {j['dtype']}, {j['world_size']} GPUs")
    if t.get("reproduced") is False:
        said += "; " + ", ".join(f"{o['ratio']:.2f}×" for o in t["other_jobs"]) + " in another job: not reproducible"
    return said + ")"


def _by_world(jobs: list[str]) -> str:
    """Pending DDP jobs grouped by world size: "at 4 ranks (2.7B-fp32, xl-fp32) and 6 ranks (...)"; a name
    without a world size (a 2-rank job of one round) is listed as it is."""
    groups: dict[int, list[str]] = {}
    plain = []
    for job in sorted(jobs):
        m = re.fullmatch(r"(.+)-ws(\d+)", job)
        if m:
            groups.setdefault(int(m.group(2)), []).append(m.group(1))
        else:
            plain.append(job)
    said = [f"{w} ranks ({', '.join(names)})" for w, names in sorted(groups.items())]
    parts = ([f"jobs {', '.join(plain)}"] if plain else []) + ([f"at {' and '.join(said)}"] if said else [])
    return " and ".join(parts)
