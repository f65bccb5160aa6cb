"""What the sharding section's parts share: the variants and targets, readings as numbers in the
section's unit, table cells, the accounting's predictions at a size and world, a target's record."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd

from cs336sys.accounting import questions
from cs336sys.accounting.symbols import N, evaluate
from cs336sys.analysis.common import save_table, size_key
from cs336sys.analysis.formatting import fixed, number

# Targets of the project's sharding issue (ratios of times measured in the same job).
TARGETS = {"sharded_vs_zero": 1.05, "fsdp_vs_fsdp2_bf16": 1.05, "model_state_tolerance": 0.05}
# A peak "fits" a sum of the accounting's terms when it is within this share of the peak above that sum.
PEAK_FIT_TOLERANCE = 0.05
VARIANTS = ("unsharded", "sharded", "zero")
VARIANT_LABEL = {"unsharded": "unsharded", "sharded": "ours (sharded)", "zero": "torch ZeRO"}  # short, for tables
STRATEGY = {"unsharded": "ddp", "sharded": "zero1", "zero": "zero1"}  # cs336sys.accounting.memory strategies
FSDP_LABEL = {"ours": "ours, per layer", "fsdp2": "FSDP2"}  # ours with other units: "ours-block", "ours-2", ...
DTYPE_BYTES = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2}
POINTS = ("after init", "before step", "after step")  # the handout's three readings


def by_size(df: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """The frame's rows grouped by model size and then rank count (one job each), smallest first."""
    sizes = sorted(df["size"].unique(), key=lambda s: size_key(pd.Series([s])).iloc[0])
    worlds = _worlds(df)
    return [(s, df[(df["size"] == s) & (worlds == w)]) for s in sizes for w in sorted(worlds[df["size"] == s].unique())]


def _worlds(df: pd.DataFrame) -> pd.Series:
    """Each row's rank count: the metric, else the environment's, else 2."""
    world = df["world_size"] if "world_size" in df else pd.Series(None, index=df.index, dtype=float)
    if "env.world_size" in df:
        world = world.fillna(df["env.world_size"])
    return world.fillna(2).astype(int)


def slug(size: str, world: int) -> str:
    """A job's part of a table's file name: the size's characters that are a name's, and its rank count."""
    return re.sub(r"\W", "_", size) + f"_ws{world}"


def unit_of_bytes(frame: pd.DataFrame) -> dict:
    """GiB for real models, as the rest of the report; MiB where every model held is smaller than a GiB
    (the smoke grid's tiny ones)."""
    held = [v for c in ("param_bytes", "sharded_param_bytes") if c in frame for v in frame[c].dropna()]
    return {"name": "MiB", "bytes": 2**20} if held and max(held) < 2**30 else {"name": "GiB", "bytes": 2**30}


def in_unit(value, u: dict) -> float | None:
    """A byte count in the section's unit `u`; None where the reading is absent."""
    v = number(value)
    return None if v is None else v / u["bytes"]


def cell(value, digits: int = 3) -> str:
    """The section's table cell: thousands separators and `digits` decimals, "n/a" where absent (`table`
    drops a column of nothing else)."""
    return fixed(value, digits, missing="n/a", thousands=True)


def table(rows: list[dict], out: Path, name: str) -> str:
    """Save a table without the columns that hold no value in any row (the allocator's readings on
    the CPU, a ratio to a variant that failed): a column of "n/a" says nothing the prose does not."""
    df = pd.DataFrame(rows).fillna("")
    empty = [c for c in df.columns if df[c].isin(["n/a", ""]).all() and df[c].eq("n/a").any()]
    return save_table(df.drop(columns=empty), out, name)


def class_values(size: str, world: int) -> dict:
    """The accounting's symbols at a model size and world size."""
    return {**questions.parameter_class_values(size), N: world}


def predict(formula, size: str, world: int) -> int | float:
    """An accounting formula evaluated at a model size and world size."""
    return evaluate(formula, class_values(size, world))


def world_size(g: pd.DataFrame) -> int:
    """The job's number of ranks as its results record it (2 where none does)."""
    for col in ("world_size", "env.world_size"):
        if col in g and g[col].notna().any():
            return int(g[col].dropna().iloc[0])
    return 2


STATUS = {None: "not measured", True: "met", False: "missed", "noise": "within noise"}


def target(name: str, size: str, what: str, value: float | None, limit: float, ok: bool | str | None,
           note: str = "", world: int | None = None, spread: dict | None = None) -> dict:
    """One target's record for the section's table of targets: `ok` is met (True), missed (False), within
    noise ("noise": the ratio's range across rounds holds the limit) or not measured (None); `spread` the
    ratio's range ({"lo", "hi", "rounds", "paired"}) where it is a ratio of two variants' times."""
    return {"target": name, "size": size, "world": world, "what": what, "value": value, "limit": limit, "ok": ok,
            "status": STATUS[ok], "note": note, **({"spread": spread} if spread else {})}


def steady_state_peak(peak: dict, state: float | None) -> float | None:
    """The peak of a step after the first. The readings are of the first timed point's step, whose forward
    and backward run before any optimizer state exists; every later step's run with the state allocated, so
    its forward-and-backward peak is the first one's plus the state, and the optimizer step's peak recurs."""
    candidates = [peak.get("after step")]
    if peak.get("before step") is not None and state is not None:
        candidates.append(peak["before step"] + state)
    candidates = [c for c in candidates if c is not None]
    return max(candidates) if candidates else None


def timing_of(r: pd.Series) -> dict:
    """What a ratio across interleaved rounds needs of a pooled point (`analysis.rounds`)."""
    lists = {k: r.get(k) if isinstance(r.get(k), list) else [] for k in ("step_ms", "round_ms", "round_clock_mhz")}
    return lists | {"rounds": int(number(r.get("rounds")) or 1)}
