"""The DDP step benchmarks of the ddp section (problems 14, 15, 17a, 19): per (size, dtype) job, every
variant against the no-communication step and PyTorch's DDP of the same job, the targets, the bucket
sweep's figure and the overhead model fitted to it (`cs336sys.analysis.ddp_model`); and, apart, the
jobs of series "host" (host overhead: gradients as bucket views, single-rank proxies; `host_jobs`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from cs336sys.analysis.common import SIZE_ORDER, save_table
from cs336sys.analysis.ddp_buckets import FIT_R2_GOOD, bucket_model
from cs336sys.analysis.formatting import fixed, mean_std, number
from cs336sys.analysis.rounds import clock_cell, clocks_differ, held_out_choice, paired_ratio, ratio_cell
from cs336sys.analysis.verdicts import against_limit
from cs336sys.sizes import SIZES, train_step_flops

if TYPE_CHECKING:
    from cs336sys.analysis.ddp_context import DDPContext

# PyTorch's DistributedDataParallel bucket_cap_mb default (cs336sys.distributed.experiments
# TORCH_DDP_DEFAULT_BUCKET_MB; a test checks they agree): the reference of the targets.
TORCH_DDP_DEFAULT_MB = 25.0
TARGETS = {"bucketed_vs_torch": 1.02, "overlap_vs_torch": 1.10}
VARIANT_ORDER = ["none", "naive", "flat", "overlap", "bucketed", "bucket_view", "torch_ddp"]
HOST_SERIES = "host"  # DDPStepSettings.series of the host-overhead jobs, each with baselines of its own
DTYPE_ORDER = ["fp32", "bf16"]
LINE_STYLE = {"none": ("black", ":"), "naive": ("C3", "--"), "flat": ("C2", "--"), "overlap": ("C4", "-."),
              "torch_ddp": ("C1", "-")}


def variant_key(variant: str, bucket_mb: float | None) -> str:
    """The result file's stem: naive, bucketed-10MB, torch_ddp-25MB (torch_ddp without a size is its default)."""
    if variant == "torch_ddp" and bucket_mb is None:
        bucket_mb = TORCH_DDP_DEFAULT_MB
    return variant + (f"-{bucket_mb:g}MB" if bucket_mb is not None else "")


def variant_label(variant: str, bucket_mb: float | None) -> str:
    if variant == "none":
        return "none (no communication)"
    if variant == "bucketed":
        return f"bucketed, {bucket_mb:g} MiB"
    if variant == "bucket_view":
        return f"bucket views, {bucket_mb:g} MiB" + (" (one per tensor)" if bucket_mb == 0 else "")
    if variant == "torch_ddp":
        b = TORCH_DDP_DEFAULT_MB if bucket_mb is None else bucket_mb
        return f"PyTorch DDP, {b:g} MiB" + (" (default)" if b == TORCH_DDP_DEFAULT_MB else "")
    return variant


def _ratio(a: dict, b: dict | None) -> dict | None:
    """a's mean step over b's (two variants of one job), with the range across rounds (`rounds.paired_ratio`)."""
    return paired_ratio(a, b) if b is not None else None


def _range(r: dict | None, limit: float | None = None) -> dict:
    """A ratio's entry for the context: value, its range and how it was taken, the verdict against `limit`."""
    if r is None:
        return {}
    out = {"ratio": r["ratio"], "lo": r["lo"], "hi": r["hi"], "rounds": r["rounds"], "paired": r["paired"]}
    if limit is not None:
        out["ok"] = against_limit(r["lo"], r["hi"], limit)
    return out


def _point(row: pd.Series) -> dict:
    """A variant of a job, its rounds pooled (`rounds.pool_rounds`): mean and spread over every timed step,
    each round's mean, the SM clocks it ran at."""
    b = number(row.get("bucket_size_mb"))
    p = {"variant": row["variant"], "bucket_mb": b, "key": variant_key(row["variant"], b),
         "label": variant_label(row["variant"], b), "status": row["status"]}
    if row["status"] != "ok":
        return p
    steps = row.get("step_ms")
    calls, in_bwd = row.get("all_reduces_per_step"), row.get("launched_in_backward")
    rounds = row.get("round_ms")
    p.update(mean_ms=float(row["mean_ms"]), std_ms=float(row["std_ms"]),
             steps=len(steps) if isinstance(steps, list) else 1, step_ms=steps if isinstance(steps, list) else [],
             round_ms=rounds if isinstance(rounds, list) else [float(row["mean_ms"])],
             rounds=int(row.get("rounds") or 1),
             round_clock_mhz=row.get("round_clock_mhz") if isinstance(row.get("round_clock_mhz"), list) else [],
             sync_wait_ms=float(row["sync_wait_ms"]) if pd.notna(row.get("sync_wait_ms")) else None,
             all_reduces=int(calls) if pd.notna(calls) else None,
             in_backward=int(in_bwd) if pd.notna(in_bwd) else None)
    return p


def jobs(ctx: DDPContext, df: pd.DataFrame, out: Path, allreduce_fits: dict | None = None) -> None:
    """Every (size, dtype, world size) job, their figure and the targets' thresholds, into the context."""
    if df.empty:
        return
    world = df["world_size"] if "world_size" in df else pd.Series(None, index=df.index, dtype=float)
    if "env.world_size" in df:
        world = world.fillna(df["env.world_size"])
    # a job is its result folder (a failed point records no world size of its own); its ranks, its points'
    folder = df["job"] if "job" in df else pd.Series("", index=df.index)
    df = df.assign(_size=df["size"].map(lambda s: SIZE_ORDER.index(s) if s in SIZE_ORDER else len(SIZE_ORDER)),
                   _dtype=df["dtype"].map(lambda d: DTYPE_ORDER.index(d) if d in DTYPE_ORDER else len(DTYPE_ORDER)),
                   _job=folder, _world=world.groupby(folder).transform("max").fillna(0).astype(int))
    result = []
    for (_, _, world, _, size, dtype), g in df.groupby(["_size", "_dtype", "_world", "_job", "size", "dtype"],
                                                       sort=True):
        backend = next((b for b in g.get("env.backend", pd.Series(dtype=object)).dropna()),
                       {"cuda": "nccl", "cpu": "gloo"}.get(g["device"].iloc[0]))
        fits = (allreduce_fits or {}).get(f"{backend}-{world}")
        result.append(job(g, size, dtype, out, fits, world) | {"backend": backend})
    short = [j["label"] for j in result if j["answers"].get("buckets", {}).get("as_expected") is False]
    for j in result:
        j["missed"] = missed_note(j, result)
    ctx.ddp_jobs = result
    ctx.ddp_bucketing_short = short
    ctx.ddp_has_bf16 = any(j["dtype"] == "bf16" for j in result)
    ctx.ddp_targets = TARGETS | {"torch_default_mb": TORCH_DDP_DEFAULT_MB, "fit_r2_good": FIT_R2_GOOD}
    ctx.ddp_rounds = sorted({j["rounds"] for j in result})
    ctx.ddp_one_round = [j["label"] for j in result if j["rounds"] == 1]
    ctx.ddp_no_clocks = [j["label"] for j in result if not any(
        c is not None for p in j["variants"].values() for c in p.get("round_clock_mhz") or [])]


def missed_note(j: dict, result: list[dict]) -> dict | None:
    """For a job that misses a target: how its no-communication step compares with the job of the same
    dtype that computes fastest (more model work per ms), and its largest step-to-step spread. A step that
    does less arithmetic in more time is limited by something other than the GPU's arithmetic."""
    t = j["targets"]
    missed = [name for name in ("bucketed", "overlap") if t.get(name, {}).get("ok") is False]
    if not missed or j.get("none_tflops") is None:
        return None
    note: dict = {"targets": missed,
                  "max_std_ms": max(p["std_ms"] for p in j["variants"].values() if p["status"] == "ok"),
                  "tflops": j["none_tflops"]}
    others = [o for o in result if o is not j and o["dtype"] == j["dtype"] and o.get("none_tflops")
              and o["none_tflops"] > j["none_tflops"]]
    if others:
        o = max(others, key=lambda o: o["none_tflops"])
        note.update(other=o["label"], other_tflops=o["none_tflops"],
                    flops_ratio=j["rank_flops"] / o["rank_flops"], time_ratio=j["none_ms"] / o["none_ms"])
    return note


def job(g: pd.DataFrame, size: str, dtype: str, out: Path, allreduce_fit: dict | None = None,
        world: int | None = None) -> dict:
    """One (size, dtype) job's entry of `ddp_jobs`: its variants, table, targets, answers and bucket model."""
    points = [_point(r) for _, r in g.iterrows()]
    points.sort(key=lambda p: (VARIANT_ORDER.index(p["variant"]) if p["variant"] in VARIANT_ORDER else 99,
                               p["bucket_mb"] or 0.0))
    by = {p["key"]: p for p in points if p["status"] == "ok"}
    none = by.get("none")
    default = by.get(variant_key("torch_ddp", TORCH_DDP_DEFAULT_MB))
    for p in points:
        if p["status"] != "ok":
            continue
        p["vs_default"] = _range(_ratio(p, default)) if p["variant"] != "torch_ddp" else {}
        matched = by.get(variant_key("torch_ddp", p["bucket_mb"])) if p["variant"] == "bucketed" else None
        p["vs_matched"] = _range(_ratio(p, matched))
        if none is not None and p["variant"] != "none":
            p["comm_ms"] = p["mean_ms"] - none["mean_ms"]
            p["comm_share"] = p["comm_ms"] / p["mean_ms"]
    ok = g[g.status == "ok"]
    first = ok.iloc[0] if not ok.empty else None
    edition = SIZES[size].edition if size in SIZES else None  # which handout names the size, and how
    world = world or (int(first["world_size"]) if first is not None else None)
    stamps = g["env.timestamp"].dropna() if "env.timestamp" in g else pd.Series(dtype=object)
    j = {"size": size, "dtype": dtype, "name": f"{size}-{dtype}-ws{world}", "label": f"{size}, {dtype}, {world} ranks",
         "dates": sorted({str(t)[:10] for t in stamps}),
         "edition": edition, "variants": {p["key"]: p for p in points}, "order": [p["key"] for p in points],
         "world_size": world, "rounds": max((p.get("rounds", 1) for p in by.values()), default=1),
         "grad_bytes": int(first["grad_bytes"]) if first is not None else None,
         "parameters": int(first["parameters"]) if first is not None else None,
         "context_length": int(g["context_length"].iloc[0]), "batch_size": int(g["batch_size"].iloc[0]),
         "steps": int(g["steps"].iloc[0]), "warmup": int(g["warmup"].iloc[0])}
    if j["grad_bytes"]:
        j["grad_gib"] = j["grad_bytes"] / 2**30
    if none is not None and size in SIZES:  # each rank's model work per step, at the no-communication pace
        j["rank_flops"] = train_step_flops(size, j["batch_size"], j["context_length"])
        j["none_ms"] = none["mean_ms"]
        j["none_tflops"] = j["rank_flops"] / (none["mean_ms"] / 1e3) / 1e12
    j["table"] = save_table(_table(points), out, f"ddp_steps_{size}_{dtype}_ws{world}", digits=2)
    j["targets"] = targets(by)
    j["answers"] = answers(by)
    j["answers_complete"] = all(k in j["answers"] for k in ("naive", "flat", "overlap"))
    flat = j["answers"].get("flat")
    if flat and allreduce_fit and flat["naive_calls"] and flat["flat_calls"]:
        # what the all-reduce benchmark's fixed cost per call predicts batching saves
        flat["predicted_saving_ms"] = (flat["naive_calls"] - flat["flat_calls"]) * allreduce_fit["o_s"] * 1e3
    if j["grad_bytes"]:
        model = bucket_model(by, j["grad_bytes"], allreduce_fit)
        if model:
            model["table"] = save_table(model.pop("frame"), out, f"ddp_bucket_model_{size}_{dtype}_ws{world}", digits=2)
            j["model"] = model
    return j


def _table(points: list[dict]) -> pd.DataFrame:
    rows = []
    for p in points:
        if p["status"] != "ok":
            rows.append({"variant": p["label"], "step (ms)": p["status"]})
            continue
        calls = "" if p.get("all_reduces") is None else (
            f"{p['all_reduces']}" + (f" ({p['in_backward']})" if p.get("in_backward") is not None else ""))
        rows.append({"variant": p["label"], "step (ms)": mean_std(p["mean_ms"], p["std_ms"], 1),
                     "round means (ms)": ", ".join(f"{m:.1f}" for m in p["round_ms"]) if p["rounds"] > 1 else "",
                     "× DDP default": ratio_cell(p.get("vs_default")),
                     "× DDP same size": ratio_cell(p.get("vs_matched")),
                     "comm. (ms)": fixed(p.get("comm_ms"), 1),
                     "wait (ms)": fixed(p.get("sync_wait_ms"), 1), "all-reduces (in bwd)": calls,
                     "SM clock (MHz)": clock_cell(p)})
    return pd.DataFrame(rows)


def targets(by: dict) -> dict:
    """Bucketed at its best bucket size against PyTorch's DDP (default 25 MiB; and at the same
    bucket size where measured), overlap against the default; naive and flat shown against it. Each ratio
    with its range across the job's rounds and a verdict on that range (`verdicts.against_limit`)."""
    default = by.get(variant_key("torch_ddp", TORCH_DDP_DEFAULT_MB))
    torch_points = [p for p in by.values() if p["variant"] == "torch_ddp"]
    best_torch = min(torch_points, key=lambda p: p["mean_ms"]) if torch_points else None
    t: dict = {"has_default": default is not None, "clocks_differ": False, "clocks_recorded": False}
    if default is not None:
        t["default_ms"] = default["mean_ms"]
        differ = [clocks_differ(p, default) for p in by.values() if p is not default]
        t["clocks_differ"] = any(d for d in differ if d)
        t["clocks_recorded"] = bool(differ) and all(d is not None for d in differ)  # None: no clock to compare
    if best_torch is not None:
        t["best_torch"] = {"bucket_mb": best_torch["bucket_mb"] or TORCH_DDP_DEFAULT_MB,
                           "mean_ms": best_torch["mean_ms"]}
    bucketed = [p for p in by.values() if p["variant"] == "bucketed"]
    if bucketed:
        best = min(bucketed, key=lambda p: p["mean_ms"])
        t["bucketed"] = {"bucket_mb": best["bucket_mb"], "mean_ms": best["mean_ms"], "key": best["key"]}
        if default is not None:
            # judged on rounds it was not chosen on where the job has rounds; else the fastest, chosen on the
            # same steps it is judged on (a job of one round, which the report does not judge)
            held = held_out_choice(bucketed, default)
            chosen = held if held is not None else _ratio(best, default)
            t["bucketed"].update(_range(chosen, TARGETS["bucketed_vs_torch"]), held_out=held is not None,
                                 picks=held["picks"] if held else [best["bucket_mb"]])
        if best.get("vs_matched"):
            m = _range(_ratio(best, by.get(variant_key("torch_ddp", best["bucket_mb"]))), TARGETS["bucketed_vs_torch"])
            t["bucketed"].update(matched_ratio=m["ratio"], matched_lo=m["lo"], matched_hi=m["hi"], matched_ok=m["ok"])
        if best_torch is not None:
            t["bucketed"]["vs_best_torch"] = best["mean_ms"] / best_torch["mean_ms"]
    for name, limit in (("overlap", TARGETS["overlap_vs_torch"]), ("naive", None), ("flat", None)):
        p = by.get(name)
        if p is None or default is None:
            continue
        t[name] = _range(_ratio(p, default), limit) | {"mean_ms": p["mean_ms"]}
    return t


def overlap_outcome(o: dict) -> str:
    """What overlapping bought against the variants the job has: "beats_both" (naive and flat),
    "beats_naive_not_flat", "beats_naive" (no flat run), "beats_flat" (no naive run) or "does_not_pay"."""
    naive, flat = o.get("faster_than_naive"), o.get("faster_than_flat")
    if naive and flat:
        return "beats_both"
    if naive:
        return "beats_naive_not_flat" if flat is False else "beats_naive"
    if flat and naive is None:
        return "beats_flat"
    return "does_not_pay"


def _slower(a: dict, b: dict) -> bool:
    """Whether variant `a` was slower than `b` beyond their ratio's spread (`rounds.paired_ratio`)."""
    r = _ratio(a, b)
    return bool(r and r["lo"] > 1)


def answers(by: dict) -> dict:
    """The handouts' questions, from this job's numbers."""
    a: dict = {}
    naive, flat, overlap, none = (by.get(k) for k in ("naive", "flat", "overlap", "none"))
    if naive and none:
        a["naive"] = {k: naive[k] for k in ("mean_ms", "comm_ms", "comm_share")} | {
            "wait_ms": naive.get("sync_wait_ms"), "calls": naive.get("all_reduces"), "none_ms": none["mean_ms"]}
    if naive and flat:
        a["flat"] = {"mean_ms": flat["mean_ms"], "naive_over_flat": naive["mean_ms"] / flat["mean_ms"],
                     "over_naive": flat["mean_ms"] / naive["mean_ms"],
                     "saved_ms": naive["mean_ms"] - flat["mean_ms"], "comm_ms": flat.get("comm_ms"),
                     "comm_share": flat.get("comm_share"), "wait_ms": flat.get("sync_wait_ms"),
                     "naive_calls": naive.get("all_reduces"), "flat_calls": flat.get("all_reduces"),
                     "faster": flat["mean_ms"] < naive["mean_ms"]}
    if overlap and (naive or flat):
        a["overlap"] = {"mean_ms": overlap["mean_ms"], "wait_ms": overlap.get("sync_wait_ms"),
                        "comm_ms": overlap.get("comm_ms"), "calls": overlap.get("all_reduces"),
                        "in_backward": overlap.get("in_backward")}
        for name, other in (("naive", naive), ("flat", flat)):
            if other:
                a["overlap"][f"over_{name}"] = overlap["mean_ms"] / other["mean_ms"]
                a["overlap"][f"faster_than_{name}"] = overlap["mean_ms"] < other["mean_ms"]
        a["overlap"]["outcome"] = overlap_outcome(a["overlap"])
    bucketed = sorted((p for p in by.values() if p["variant"] == "bucketed"), key=lambda p: p["bucket_mb"])
    if bucketed:
        means = [p["mean_ms"] for p in bucketed]
        best = min(range(len(means)), key=means.__getitem__)
        diffs = [b - a_ for a_, b in zip(means, means[1:], strict=False)]
        shape = ("single" if len(means) == 1 else "falling" if all(d < 0 for d in diffs)
                 else "rising" if all(d > 0 for d in diffs) else "valley" if 0 < best < len(means) - 1 else "mixed")
        a["buckets"] = {"points": [{"bucket_mb": p["bucket_mb"], "mean_ms": p["mean_ms"],
                                    "wait_ms": p.get("sync_wait_ms"), "calls": p.get("all_reduces")} for p in bucketed],
                        "best_mb": bucketed[best]["bucket_mb"], "best_ms": means[best], "shape": shape,
                        "spread": max(means) / min(means),
                        # the sweep brackets its optimum when the sizes on each side of the fastest were slower
                        # beyond the comparison's spread (rounds' range; one round: two standard errors)
                        "brackets": 0 < best < len(means) - 1 and all(
                            _slower(bucketed[k], bucketed[best]) for k in (best - 1, best + 1)),
                        "largest_is_fastest": best == len(means) - 1, "largest_mb": bucketed[-1]["bucket_mb"]}
        if flat and best == len(means) - 1:
            # past the largest size swept lies one bucket of every gradient, whose all-reduce starts when the
            # backward ends: flat's schedule (flat copies the gradients after the backward, not as they come)
            r = _range(_ratio(flat, bucketed[best]))
            if r:
                a["buckets"]["one_bucket"] = {**r, "slower": r["lo"] > 1}
        runner_up = sorted(bucketed, key=lambda p: p["mean_ms"])[1] if len(bucketed) > 1 else None
        if runner_up is not None:  # is the fastest told apart from the next fastest, round by round?
            r = _range(_ratio(runner_up, bucketed[best]))
            a["buckets"]["runner_up"] = {"bucket_mb": runner_up["bucket_mb"], **r,
                                         "distinct": bool(r and r["lo"] > 1)}
        if naive:
            a["buckets"]["best_over_naive"] = means[best] / naive["mean_ms"]
        if overlap:
            a["buckets"]["best_over_overlap"] = means[best] / overlap["mean_ms"]
        if flat:
            a["buckets"]["best_over_flat"] = means[best] / flat["mean_ms"]
        # the expectation: bucketing, overlapped like overlap and with few calls like flat, beats both
        rivals = [p["mean_ms"] for p in (overlap, flat) if p]
        if rivals:
            a["buckets"]["as_expected"] = bool(means[best] <= min(rivals))
    return a
