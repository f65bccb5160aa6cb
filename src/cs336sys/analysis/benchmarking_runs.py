"""The benchmarking section's runs themselves: the modes timed, the cold start (how many warm-up steps a
fresh process needs) and the pipeline's overhead around the timed points."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from cs336sys.analysis.common import figure, log_axis, read_benchmark_tsv, save_figure, save_table, size_key, sort_rows
from cs336sys.analysis.formatting import mean_std

if TYPE_CHECKING:
    from cs336sys.analysis.benchmarking_context import BenchmarkingContext

MODE_LABEL = {"forward": "forward", "forward_backward": "forward+backward", "train_step": "train step"}


def warmup(ctx: BenchmarkingContext, warm: pd.DataFrame, out: Path) -> None:
    """benchmarking_script (c), cold start: each size's step times in a fresh process, the mean and spread
    after each number of warm-up steps (a table and a figure), the first step against the settled one."""
    ok = warm[warm.status == "ok"] if not warm.empty else warm
    if ok.empty:
        return
    rows, ratios = [], {}
    for _, r in ok.iterrows():
        steps, n = r["step_ms"], int(r["measured_steps"])
        for w in r["warmups"]:
            window = steps[w:w + n]
            rows.append({"size": r["size"], "mode": MODE_LABEL[r["mode"]], "warm-up steps": w,
                         "mean (ms)": statistics.fmean(window), "std (ms)": statistics.stdev(window)})
        ratios[f"{r['size']} {MODE_LABEL[r['mode']]}"] = steps[0] / statistics.median(steps[-n:])
    table = sort_rows(pd.DataFrame(rows), "size", "mode", "warm-up steps")
    # Printed: one row per size and mode, one column per number of warm-up steps (mean ± std).
    cells = table.assign(cell=[mean_std(m, sd) for m, sd in zip(table["mean (ms)"], table["std (ms)"], strict=True)])
    wide = cells.pivot_table(index=["size", "mode"], columns="warm-up steps", values="cell", aggfunc="first")
    wide = wide.rename(columns=lambda w: f"w = {w} (ms)").reset_index()
    wide.columns.name = None
    wide = wide.sort_values(["size", "mode"], key=lambda c: size_key(c) if c.name == "size" else
                            c.map(list(MODE_LABEL.values()).index))
    ctx.tables_warmup = save_table(wide, out, "warmup", data=table)
    fig, ax = figure(3.0)
    for _, r in sort_rows(ok[ok["mode"] == ok["mode"].iloc[0]], "size").iterrows():
        ax.plot(range(len(r["step_ms"])), r["step_ms"], marker=".", label=r["size"])
    log_axis(ax, "y")
    ax.set_xlabel("step index in a fresh process (0 = first step)")
    ax.set_ylabel("step time (ms, log scale)")
    ax.set_title(f"Cold start: {MODE_LABEL[ok['mode'].iloc[0]]} step times, context {int(ok.context_length.iloc[0])}")
    fig.legend(title="model size", loc="outside right upper")
    worst = max(ratios, key=ratios.get)
    ctx.figure_warmup = save_figure(fig, out, "warmup_steps")
    ctx.warmup_first_step_ratio = ratios
    ctx.warmup_worst = {"what": worst, "ratio": ratios[worst]}
    ctx.warmup_values = sorted({int(w) for ws in ok["warmups"] for w in ws})
    ctx.warmup_context_length = int(ok.context_length.iloc[0])


def overhead(ctx: BenchmarkingContext, paths: list[Path], bench: pd.DataFrame, warm: pd.DataFrame,
             out: Path) -> None:
    """Pipeline overhead per job: the job's wall time (Snakemake's benchmark record) minus the time
    spent inside its points (model build, compile, warm-up, timed steps)."""
    # Jobs whose results are not inputs here (precision) count as all overhead: an upper bound.
    records = {p.relative_to(p.parents[1]).with_suffix("").as_posix() if p.parent.name != "benchmarks" else p.stem:
               read_benchmark_tsv(p) for p in paths if p.suffix == ".tsv"}
    if not records:
        return
    inside: dict[str, float] = {}
    for df, kind in ((bench, "benchmarking"), (warm, "warmup")):
        if df.empty:
            continue
        for _, r in df.iterrows():
            job = f"{kind}/{r['size']}-{r['compile']}" if kind == "benchmarking" else f"{kind}/{r['size']}"
            inside[job] = inside.get(job, 0.0) + float(r.get("point_wall_s") or 0.0)
    wall, points, over = "wall (s)", "in points (s)", "overhead (s)"
    # a job whose points record no time of their own (the matmul ceilings) is left out: nothing to subtract
    rows = [{"job": j, wall: w, points: inside[j], over: w - inside[j]}
            for j, w in sorted(records.items()) if inside.get(j)]
    if not rows:
        return
    table = pd.DataFrame(rows)
    total_wall, total_over = table[wall].sum(), table[over].sum()
    table.loc[len(table)] = {"job": "total", wall: total_wall, points: table[points].sum(), over: total_over}
    ctx.tables_overhead = save_table(table, out, "overhead", digits=1)
    ctx.overhead = {"wall_s": float(total_wall), "overhead_s": float(total_over),
                    "share_pct": float(100 * total_over / total_wall), "jobs": len(rows)}
