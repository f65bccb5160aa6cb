"""The attention section's leaderboard shapes: ours against SDPA's backends at both leaderboards'
attention shapes (forward, backward, both; the kernels of ours and of cuDNN), the Gluon kernels
against cuDNN timed in the same job, whether each ratio's two sides ran at one SM clock, and our
kernels at the 2025 shape against the best verified entry of the course's published leaderboard."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from cs336sys.analysis.common import CLOCK, POWER, clocks, gpu_model, save_table
from cs336sys.analysis.formatting import fmt

if TYPE_CHECKING:
    from cs336sys.analysis.attention_context import AttentionContext

LB_IMPLS = {"ours": "ours (Triton)", "sdpa_cudnn": "SDPA cuDNN", "sdpa_flash": "SDPA FlashAttention-2",
            "sdpa_efficient": "SDPA memory-efficient", "naive": "naive PyTorch"}


def _shape_text(r: pd.Series) -> str:
    """The attention shape of a leaderboard point, in words."""
    if r.get("layout") == "bsd":
        return f"q, k, v of ({int(r['batch'])}, {int(r['seq']):,}, {int(r['d'])}), heads in the batch"
    return f"{int(r['batch'])} × {int(r['heads'])} heads × {int(r['seq']):,} × d {int(r['d'])}"


def _backward_in_noise(df: pd.DataFrame) -> tuple[pd.DataFrame, int]:
    """The points with `bwd_ms` and `bwd_tflops` blanked where the backward, timed as forward+backward minus
    the forward alone, is not positive: the forward alone timed no faster than the two together, so their
    difference is within the timing's noise (the smoke grid's interpreted kernels on a loaded CPU). Also how
    many points that blanked."""
    noise = (df["status"] == "ok") & (df["bwd_ms"] <= 0) if "bwd_ms" in df else pd.Series(False, index=df.index)
    df = df.copy()
    df.loc[noise, [c for c in ("bwd_ms", "bwd_tflops") if c in df]] = float("nan")
    return df, int(noise.sum())


def _ratios(num: pd.Series, den: pd.Series) -> dict:
    """fwd, bwd and fwd_bwd of `num` over `den`; None for a part either lacks (a backward within the noise)."""
    out = {}
    for part in ("fwd", "bwd", "fwd_bwd"):
        a, b = num.get(f"{part}_ms"), den.get(f"{part}_ms")
        out[part] = None if pd.isna(a) or pd.isna(b) else float(a / b)
    return out


def _kernel_label(name: str, nth: int, count: int) -> str:
    """Our backward launches `backward_kernel` once per kind of program (dQ first) when split."""
    if name == "backward_kernel" and count == 2:
        return f"backward_kernel ({'dQ' if nth == 0 else 'dK/dV'} programs)"
    if name.startswith("cudnn_generated") and ("fprop" in name or "bprop" in name):  # cuDNN's generated names
        return f"cuDNN sm90 {'fprop' if 'fprop' in name else 'bprop'} (wgmma)"
    return name if len(name) <= 40 else name[:37] + "..."


def _kernels(r: pd.Series) -> list[dict]:
    """A point's kernels with their time and share, those under 2% of the total gathered as "other kernels"."""
    kernels = r.get("kernels")
    if not isinstance(kernels, list) or not kernels:
        return []
    total = sum(k["ms"] for k in kernels)
    seen: dict[str, int] = {}
    counts: dict[str, int] = {}
    for k in kernels:
        counts[k["name"]] = counts.get(k["name"], 0) + 1
    rows, other = [], 0.0
    for k in kernels:
        nth = seen.get(k["name"], 0)
        seen[k["name"]] = nth + 1
        if k["ms"] < 0.02 * total:  # the loss's sum, the ones of its gradient, casts
            other += k["ms"]
            continue
        rows.append({"kernel": _kernel_label(k["name"], nth, counts[k["name"]]), "ms": k["ms"],
                     "share (%)": 100 * k["ms"] / total})
    if other:
        rows.append({"kernel": "other kernels", "ms": other, "share (%)": 100 * other / total})
    return rows


def gpu_label(r: pd.Series) -> str:
    """The GPU a result was measured on, from its env ("NVIDIA H100 80GB HBM3" -> "H100")."""
    name = next((str(v) for v in (r.get("env.gpu"), r.get("gpu_model")) if isinstance(v, str) and v), "")
    return gpu_model(name) if name else "CPU"


GLUON_IMPLS = {"sdpa_cudnn": "SDPA cuDNN (same process)", "gluon": "Gluon forward, tl backward",
               "gluon_bwd": "Gluon forward and backward"}
# Two SM clocks within 2 % of each other (two of nvidia-smi's 15 MHz steps at 1.5 GHz) count as one clock; a ratio
# whose two sides ran further apart says so, since an attention kernel's time follows its clock.
CLOCK_TOLERANCE = 0.02


def _clock_by_impl(ok: pd.DataFrame) -> dict:
    """impl -> the SM clock of its forward+backward timing, for the points (indexed by impl) that kept one."""
    return {impl: c[CLOCK] for impl, r in ok.iterrows() if (c := clocks(r))}


def clocks_differ(clock_mhz: dict, a: str, b: str) -> bool | None:
    """Whether `a` and `b` were timed at SM clocks more than CLOCK_TOLERANCE apart; None where either lacks one."""
    ca, cb = clock_mhz.get(a), clock_mhz.get(b)
    if not ca or not cb:
        return None
    return bool(abs(ca - cb) > CLOCK_TOLERANCE * max(ca, cb))


def public_entry(gluon_editions: list[dict], lb_editions: list[dict], gluon_ms: dict, reference_ms: dict,
                 source: str | None) -> dict | None:
    """Our kernels' forward+backward at the shape of the course's published attention leaderboard (2025, one
    H100) against its best verified entry: the Gluon kernels' and the Triton kernels' times and ratios."""
    best = reference_ms.get("public best Triton entry")
    ours = {"gluon": gluon_ms.get(("H100", "2025"))}
    ours["triton"] = next((ed["ours"]["fwd_bwd_ms"] for ed in lb_editions
                           if (ed["gpu"], ed["edition"]) == ("H100", "2025") and ed.get("ours")), None)
    ours = {k: v for k, v in ours.items() if v}
    if not best or not ours:
        return None
    clock = next((ed["clock_mhz"].get("gluon_bwd") for ed in gluon_editions
                  if (ed["gpu"], ed["edition"]) == ("H100", "2025")), None)
    return {"reference_ms": best, "source": source, "gpu": "H100", "edition": "2025", "gluon_clock_mhz": clock,
            "ms": ours, "ratio": {k: v / best for k, v in ours.items()}}


def _whole_numbers(table: pd.DataFrame) -> pd.DataFrame:
    """The table for print, clock, power and TFLOP/s without decimals (a value under one half with two
    significant digits, as `fmt` prints it); the CSV keeps them whole."""
    shown = table.copy()
    for col in (CLOCK, POWER, "forward TFLOP/s", "backward TFLOP/s"):
        if col in shown:
            shown[col] = [fmt(float(v), 0) if isinstance(v, float | int) else "" for v in shown[col]]
    return shown


def gluon(df: pd.DataFrame, out: Path) -> dict | None:
    """The Gluon kernels at the leaderboard shapes against cuDNN timed in the same job: a table and, per
    (GPU, shape), each Gluon configuration's time over cuDNN's (forward, backward, both); None without any."""
    if df.empty:
        return None
    df, noise = _backward_in_noise(df.assign(gpu=[gpu_label(r) for _, r in df.iterrows()]))
    rows, editions = [], []
    for (gpu, edition), part in df.groupby(["gpu", "edition"], sort=True):
        ok = part[part.status == "ok"].set_index("impl")
        for _, r in part.iterrows():
            good = r["status"] == "ok"
            rows.append({"GPU": gpu, "leaderboard": edition, "implementation": GLUON_IMPLS.get(r["impl"], r["impl"]),
                         "status": r["status"], "forward (ms)": r.get("fwd_ms") if good else None,
                         "backward (ms)": r.get("bwd_ms") if good else None,
                         "fwd+bwd (ms)": r.get("fwd_bwd_ms") if good else None, **(clocks(r) if good else {})})
        ratios = {}
        if "sdpa_cudnn" in ok.index:
            base = ok.loc["sdpa_cudnn"]
            ratios = {impl: _ratios(ok.loc[impl], base) for impl in ok.index if impl != "sdpa_cudnn"}
        clock = _clock_by_impl(ok)
        editions.append({"gpu": gpu, "edition": edition, "ratios": ratios, "clock_mhz": clock,
                         "clocks_differ": {impl: clocks_differ(clock, impl, "sdpa_cudnn") for impl in ratios},
                         "fwd_bwd_ms": {impl: float(ok.loc[impl, "fwd_bwd_ms"]) for impl in ok.index
                                        if "fwd_bwd_ms" in ok and pd.notna(ok.loc[impl, "fwd_bwd_ms"])}})
    table = pd.DataFrame(rows)
    if (table["status"] == "ok").all():
        table = table.drop(columns="status")
    return {"table": save_table(_whole_numbers(table), out, "leaderboard_gluon", digits=3, data=table),
            "editions": editions, "gpus": sorted(set(df["gpu"])), "backward_in_noise": noise}


def leaderboard(ctx: AttentionContext, df: pd.DataFrame, out: Path, reference_ms: dict) -> None:
    """Both leaderboards' attention shapes: forward, backward, both; ours against SDPA's backends."""
    if df.empty:
        return
    df, ctx.lb_backward_in_noise = _backward_in_noise(df)
    if "edition" not in df:
        df["edition"] = "2025"
    df["gpu"] = [gpu_label(r) for _, r in df.iterrows()]
    rows, kernel_rows, editions = [], [], []
    for (gpu, edition), part in df.groupby(["gpu", "edition"], sort=True):
        ok = part[part.status == "ok"].set_index("impl")
        for _, r in part.iterrows():
            good = r["status"] == "ok"
            rows.append({"GPU": gpu, "leaderboard": edition, "implementation": LB_IMPLS.get(r["impl"], r["impl"]),
                         "status": r["status"],
                         "forward (ms)": r.get("fwd_ms") if good else None,
                         "backward (ms)": r.get("bwd_ms") if good else None,
                         "fwd+bwd (ms)": r.get("fwd_bwd_ms") if good else None,
                         "forward TFLOP/s": r.get("fwd_tflops") if good else None,
                         "backward TFLOP/s": r.get("bwd_tflops") if good else None, **(clocks(r) if good else {})})
            if good and r["impl"] in ("ours", "sdpa_cudnn"):
                kernel_rows += [{"GPU": gpu, "leaderboard": edition, "implementation": LB_IMPLS[r["impl"]], **k}
                                for k in _kernels(r)]
        entry = {"gpu": gpu, "edition": edition, "shape": _shape_text(part.iloc[0]), "ratios": {}}
        if "ours" in ok.index and "fwd_ms" in ok:
            ours = ok.loc["ours"]
            entry["ours"] = {k: None if pd.isna(ours[k]) else float(ours[k])
                             for k in ("fwd_ms", "bwd_ms", "fwd_bwd_ms")}
            entry["ratios"] = {impl: _ratios(ours, ok.loc[impl]) for impl in ok.index if impl != "ours"}
            entry["tiles"] = {k: ours.get(k) for k in ("forward_tiles", "backward_tiles")
                              if isinstance(ours.get(k), str)}
        entry["clock_mhz"] = _clock_by_impl(ok)
        entry["clocks_differ"] = {impl: clocks_differ(entry["clock_mhz"], "ours", impl) for impl in entry["ratios"]}
        editions.append(entry)
    table = pd.DataFrame(rows)
    if (table["status"] == "ok").all():
        table = table.drop(columns="status")
    # printed: ours against cuDNN and FlashAttention-2; the CSV also has SDPA's other backends, the sum of
    # forward and backward, and the power
    shown = table[table["implementation"].isin([LB_IMPLS[k] for k in ("ours", "sdpa_cudnn", "sdpa_flash")])]
    shown = _whole_numbers(shown.drop(columns=[POWER, "fwd+bwd (ms)"], errors="ignore"))
    ctx.lb_table = save_table(shown, out, "leaderboard", digits=3, data=table)
    ctx.lb_reference_ms, ctx.lb_editions = reference_ms, editions
    ctx.lb_dtype, ctx.lb_gpus = str(df.iloc[0]["dtype"]), sorted(set(df["gpu"]))
    if kernel_rows:
        ctx.lb_kernels = save_table(pd.DataFrame(kernel_rows), out, "leaderboard_kernels", digits=3)
