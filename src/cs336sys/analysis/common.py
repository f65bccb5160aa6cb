"""Helpers every section uses: Markdown tables, figure style, the environment line."""

from __future__ import annotations

import math
import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from cs336sys.results import load_results  # noqa: E402

# Report order of model sizes (registry order), used to sort tables and x axes.
SIZE_ORDER = ["tiny", "tiny2", "small", "medium", "large", "xl", "2.7B", "10B", "8B"]


def results_frame(paths: list[Path]) -> pd.DataFrame:
    files = [p for p in paths if p.suffix == ".json"]
    return load_results(files) if files else pd.DataFrame()


def fmt(value, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return str(value)


def markdown_table(df: pd.DataFrame, digits: int = 2) -> str:
    cols = [str(c) for c in df.columns]
    numeric = [pd.api.types.is_numeric_dtype(df[c]) for c in df.columns]
    lines = ["| " + " | ".join(cols) + " |",
             "|" + "|".join("---:" if n else "---" for n in numeric) + "|"]
    for row in df.itertuples(index=False):
        lines.append("| " + " | ".join(fmt(v, digits) for v in row) + " |")
    return "\n".join(lines) + "\n"


def save_table(df: pd.DataFrame, out_dir: Path, name: str, digits: int = 2) -> str:
    """Write NAME.csv and NAME.md; return the Markdown for the report."""
    df.to_csv(out_dir / f"{name}.csv", index=False)
    md = markdown_table(df, digits)
    (out_dir / f"{name}.md").write_text(md)
    return md


def save_figure(fig, out_dir: Path, name: str) -> str:
    path = out_dir / f"{name}.png"
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path.name


def size_key(series: pd.Series) -> pd.Series:
    return series.map(lambda s: SIZE_ORDER.index(s) if s in SIZE_ORDER else len(SIZE_ORDER))


def environment_summary(df: pd.DataFrame) -> dict:
    """Hardware, software and date range of the results a section shows."""
    if df.empty:
        return {}

    def values(col: str) -> list:
        return sorted({str(v) for v in df[col].dropna()}) if col in df else []

    stamps = values("env.timestamp")
    gpus = values("env.gpu")
    return {
        "device": ", ".join(gpus) if gpus else f"CPU ({', '.join(values('env.cpu')) or 'unknown'})",
        "is_gpu": bool(gpus),
        "torch": ", ".join(values("env.torch")),
        "cuda": ", ".join(values("env.cuda")) or "none",
        "triton": ", ".join(values("env.triton")) or "none",
        "driver": ", ".join(values("env.driver")) or "n/a",
        "python": ", ".join(values("env.python")),
        "first_date": stamps[0][:10] if stamps else "",
        "last_date": stamps[-1][:10] if stamps else "",
        "commits": [c[:8] for c in values("env.git_commit") if re.fullmatch(r"[0-9a-f]{40}", c)],
        "points": int(len(df)),
        "status_counts": {k: int(v) for k, v in df["status"].value_counts().items()},
    }


def read_benchmark_tsv(path: Path) -> float:
    """Wall-clock seconds of a Snakemake `benchmark:` record."""
    return float(pd.read_csv(path, sep="\t")["s"].iloc[0])
