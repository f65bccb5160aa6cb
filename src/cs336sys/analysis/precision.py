"""Section: mixed-precision accumulation (problem 3) and autocast dtypes (4a, 4b)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from cs336sys.analysis.common import environment_summary, results_frame, save_table


def build(paths: list[Path], out: Path, **_: object) -> dict:
    frame = results_frame(paths)
    ctx: dict = {"env": environment_summary(frame), "tables": {}}
    if frame.empty:
        return ctx
    acc = frame[(frame.problem == "mixed_precision_accumulation") & (frame.status == "ok")]
    if not acc.empty:
        r = acc.iloc[0]
        table = pd.DataFrame([{"loop": k, "result": v, f"error vs {r['exact']:g}": r["abs_error"][k]}
                              for k, v in r["values"].items()])
        ctx["tables"]["accumulation"] = save_table(table, out, "accumulation", digits=6)
        ctx["accumulation"] = r["values"]
        ctx["accumulation_error"] = r["abs_error"]
        for key in ("n", "value", "exact", "fp16_of_value", "fp16_mantissa_bits", "fp16_spacing_from",
                    "fp16_spacing"):
            ctx[key] = r[key]
    dt = frame[(frame.problem == "autocast_dtypes") & (frame.status == "ok")]
    if not dt.empty:
        cols = {r["autocast_dtype"]: r["dtypes"] for _, r in dt.iterrows()}
        quantities = list(next(iter(cols.values())))
        table = pd.DataFrame([{"quantity": q, **{f"autocast {d}": cols[d][q] for d in cols}} for q in quantities])
        ctx["tables"]["autocast"] = save_table(table, out, "autocast_dtypes")
        ctx["autocast"] = cols
    return ctx
