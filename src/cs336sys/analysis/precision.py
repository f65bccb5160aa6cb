"""Section: mixed-precision accumulation (problem 3) and autocast dtypes (4a, 4b)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from cs336sys.analysis.common import environment_summary, results_frame, save_table
from cs336sys.analysis.context import SectionContext

# what the accumulation result states about fp16, copied to the context as they are
ACCUMULATION_FACTS = ("n", "value", "exact", "fp16_of_value", "fp16_mantissa_bits", "fp16_spacing_from",
                      "fp16_spacing")


@dataclass
class PrecisionContext(SectionContext):
    accumulation: dict[str, float] | None = None
    """Each of the handout's accumulation loops -> the sum it reached (None: no result)."""
    accumulation_error: dict[str, float] | None = None
    """Each loop -> its absolute error against the exact sum."""
    n: int | None = None
    """Increments added in each loop."""
    value: float | None = None
    """The increment (0.01)."""
    exact: float | None = None
    """The exact sum, n x value."""
    fp16_of_value: float | None = None
    """The increment as fp16 rounds it."""
    fp16_mantissa_bits: int | None = None
    """fp16's explicit mantissa bits."""
    fp16_spacing_from: float | None = None
    """The magnitude from which adjacent fp16 values are `fp16_spacing` apart."""
    fp16_spacing: float | None = None
    """The distance between adjacent fp16 values from `fp16_spacing_from` on."""
    autocast: dict[str, dict[str, str]] | None = None
    """Autocast dtype -> each quantity of the toy model -> the dtype it had (None: no result)."""


def _accumulation(frame: pd.DataFrame, ctx: PrecisionContext, out: Path) -> None:
    """Problem 3: the four loops' sums and errors, and the fp16 facts the text explains them with."""
    acc = frame[(frame.problem == "mixed_precision_accumulation") & (frame.status == "ok")]
    if acc.empty:
        return
    r = acc.iloc[0]
    table = pd.DataFrame([{"loop": k, "result": v, f"error vs {r['exact']:g}": r["abs_error"][k]}
                          for k, v in r["values"].items()])
    ctx.tables["accumulation"] = save_table(table, out, "accumulation", digits=6)
    ctx.accumulation, ctx.accumulation_error = r["values"], r["abs_error"]
    for key in ACCUMULATION_FACTS:
        setattr(ctx, key, r[key])


def _autocast(frame: pd.DataFrame, ctx: PrecisionContext, out: Path) -> None:
    """Problem 4a: the dtype of each quantity under each autocast dtype."""
    dt = frame[(frame.problem == "autocast_dtypes") & (frame.status == "ok")]
    if dt.empty:
        return
    cols = {r["autocast_dtype"]: r["dtypes"] for _, r in dt.iterrows()}
    quantities = list(next(iter(cols.values())))
    table = pd.DataFrame([{"quantity": q, **{f"autocast {d}": cols[d][q] for d in cols}} for q in quantities])
    ctx.tables["autocast"] = save_table(table, out, "autocast_dtypes")
    ctx.autocast = cols


def build(paths: list[Path], out: Path, **_: object) -> PrecisionContext:
    frame = results_frame(paths)
    ctx = PrecisionContext(env=environment_summary(frame))
    if not frame.empty:
        _accumulation(frame, ctx, out)
        _autocast(frame, ctx, out)
    return ctx
