"""The optimised-step series in interleaved rounds (results of `optimized_step_rounds`): per size, every
configuration once a round, the rounds one after another in one job (cs336sys.bench_optimized_rounds).

- Each configuration's rounds are pooled (`rounds.pool_rounds`: the mean of each round, the SM clock of each).
- Each technique is set against the configuration before it in the series (`rounds.paired_ratio`: the ratio of
  the pooled means, and the range of the rounds' own ratios, the two having run minutes apart in each round).
  It made the step faster, or slower, only where every round says so; otherwise the change lies within the
  rounds' range.
- The fastest configuration (by its pooled mean) is set against its roofline round by round: each point measured
  its own matmul ceiling after its steps (`optimized_step.roofline_ms`), and at the step's clock the ceiling is
  scaled to it, as the one-pass series does. Its target is judged on both ranges together (met when every round
  is within it at both clocks, missed when none is at either, within noise otherwise), and that verdict, not the
  one pass's, is the size's on the summary page (`optimized_step.summary_rows`).

Nothing here when the results hold no such series.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from cs336sys.analysis.common import save_table, sm_clock
from cs336sys.analysis.formatting import number
from cs336sys.analysis.optimized_step import LABELS, PROSE, roofline_ms, target_x_roofline
from cs336sys.analysis.rounds import clock_cell, paired_ratio, pool_rounds
from cs336sys.analysis.verdicts import against_limit

EXPERIMENT = "optimized_step_rounds"


def optimized_rounds(frame: pd.DataFrame, out: Path) -> dict | None:
    """The section context's `optimized_rounds`: {"sizes": {size: {"rounds", "gpu", "faster", "slower",
    "within", "fastest", "x_roofline", "x_at_clock", "target", "met", "met_at"}}, "table", "same_changes"}, or
    None without such results; `met_at` is the verdict at each clock, `met` the two together, `same_changes`
    whether every size's techniques changed its step the same way (the prose then says it once)."""
    if "problem" not in frame or not (frame.problem == EXPERIMENT).any():
        return None
    data = frame[frame.problem == EXPERIMENT].copy()
    data["sm_clock_mhz"] = [sm_clock(c) for c in data.get("step_clocks", pd.Series([None] * len(data)))]
    data["added"] = [len(t) if isinstance(t, list | tuple) else 0 for t in data["techniques"]]
    pooled = pool_rounds(data, ["size", "configuration"])  # each row keeps its first round's "added"
    sizes, rows = {}, []
    for size, g in pooled.groupby("size", sort=False):
        g = g.sort_values("added")
        said: dict[str, list[str]] = {"faster": [], "slower": [], "within": []}
        before = None
        for _, r in g.iterrows():
            ok = r["status"] == "ok"
            vs = paired_ratio(r, before) if ok and before is not None else None
            if vs is not None:
                verdict = "faster" if vs["hi"] < 1 else "slower" if vs["lo"] > 1 else "within"
                said[verdict].append(PROSE.get(r["configuration"], r["configuration"]))
            change = "" if vs is None else f"{vs['ratio']:.3f} ({_span([vs['lo'], vs['hi']], 3)})"
            rows.append({"size": size, "configuration": LABELS.get(r["configuration"], r["configuration"]),
                         "step (ms, mean)": float(r["mean_ms"]) if ok else r["status"],
                         "rounds (ms)": _span(r.get("round_ms") if ok else None, 1),
                         "× the one before": change,
                         "SM clock (MHz)": clock_cell(r) if ok else ""})
            before = r if ok else None
        ok = g[g.status == "ok"]
        if ok.empty:
            continue
        fastest = ok.loc[ok["mean_ms"].astype(float).idxmin()]
        x, y = _against_roofline(data[(data["size"] == size) & (data.configuration == fastest.configuration)])
        gpus = sorted({v for v in data.loc[data["size"] == size].get("env.gpu", pd.Series()).dropna()})
        target = target_x_roofline(size)
        met_at = {k: against_limit(*v, target) for k, v in (("ceiling", x), ("step", y)) if v}
        both = [v for v in (x, y) if v]
        sizes[size] = {"rounds": int(fastest["rounds"]), "gpu": ", ".join(gpus) or "the CPU", **said,
                       "fastest": LABELS.get(fastest.configuration, fastest.configuration),
                       "fastest_ms": float(fastest["mean_ms"]), "x_roofline": x, "x_at_clock": y,
                       "target": target, "met_at": met_at,
                       "met": against_limit(min(v[0] for v in both), max(v[1] for v in both), target) if both else None}
    table = save_table(pd.DataFrame(rows), out, "optimized_step_rounds", digits=1)
    said_of = [tuple(tuple(s[k]) for k in ("faster", "slower", "within")) for s in sizes.values()]
    return {"sizes": sizes, "table": table, "same_changes": len(set(said_of)) == 1}


def _span(values, digits: int) -> str:
    values = [v for v in (values or []) if v is not None]
    if not values:
        return ""
    lo, hi = min(values), max(values)
    return f"{lo:,.{digits}f}" if f"{lo:,.{digits}f}" == f"{hi:,.{digits}f}" else f"{lo:,.{digits}f}–{hi:,.{digits}f}"


def _against_roofline(rounds: pd.DataFrame) -> tuple[list[float] | None, list[float] | None]:
    """One configuration's step over its roofline in each round, [lowest, highest]: at the ceiling its own
    point measured, and at that ceiling scaled to the step's clock (None where a round lacks one)."""
    at_ceiling, at_clock = [], []
    for _, r in rounds[rounds.status == "ok"].iterrows():
        own = number(r.get("matmul_bf16_tflops"))
        roof = roofline_ms(r, own * 1e12)[0] if own else None
        if not roof:
            return None, None
        at_ceiling.append(float(r["median_ms"]) / roof)
        step, ceiling = sm_clock(r.get("step_clocks")), sm_clock(r.get("matmul_clocks"))
        scaled = roofline_ms(r, own * 1e12 * step / ceiling)[0] if step and ceiling else None
        at_clock.append(float(r["median_ms"]) / scaled if scaled else None)
    if not at_ceiling:
        return None, None
    y = None if None in at_clock else [min(at_clock), max(at_clock)]
    return [min(at_ceiling), max(at_ceiling)], y
