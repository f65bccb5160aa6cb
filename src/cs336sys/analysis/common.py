"""Helpers every section uses: Markdown tables, figure style, the environment line.

Figures: the report sets every image at the text width (`cs336sys.writeup.layout.TEXT_WIDTH_CM`), so a figure is
made exactly that wide (`figure()`; `save_figure` brings any other width to it) and its font sizes are
the printed sizes: FIGURE_STYLE keeps all text at 8 pt or more. Give no smaller `fontsize=`.
Tables: the Markdown of a table is printed in the PDF, so keep it narrow (at most 9 columns, short
headers with units); a wider table goes to a CSV file only (`save_csv`), which the report links.
"""

from __future__ import annotations

import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter  # noqa: E402

from cs336sys.analysis.formatting import fmt  # noqa: E402
from cs336sys.results import load_results  # noqa: E402
from cs336sys.sizes import SIZES, SMOKE_SIZES  # noqa: E402
from cs336sys.writeup.layout import TEXT_WIDTH_CM  # noqa: E402

FIGURE_WIDTH_IN = TEXT_WIDTH_CM / 2.54
MIN_FONT_PT = 8
FIGURE_STYLE = {
    "font.size": 9, "axes.titlesize": 9, "axes.labelsize": 9, "xtick.labelsize": MIN_FONT_PT,
    "ytick.labelsize": MIN_FONT_PT, "legend.fontsize": MIN_FONT_PT, "legend.title_fontsize": MIN_FONT_PT,
    "figure.titlesize": 10, "lines.markersize": 4, "lines.linewidth": 1.3, "axes.grid": True,
    "grid.alpha": 0.3, "grid.linewidth": 0.5, "legend.framealpha": 0.9, "savefig.dpi": 200,
}
plt.rcParams.update(FIGURE_STYLE)

# Report order of model sizes (tables, x axes): the smoke grid's tiny ones first, then the registry's order.
SIZE_ORDER = [*SMOKE_SIZES, *(s for s in SIZES if s not in SMOKE_SIZES)]


def results_frame(paths: list[Path]) -> pd.DataFrame:
    files = [p for p in paths if p.suffix == ".json"]
    return load_results(files) if files else pd.DataFrame()


# A cell that reads as a number: 1,234.5 / 0.76 / 19.22 ± 2.14 / 14% (a status such as "oom" is not).
_NUMBER = re.compile(r"[-+]?[\d,]*\.?\d+(?: ± [\d,]*\.?\d+)?\s*[%×]?")


def _numeric(column: pd.Series) -> bool:
    """Right-align a column of numbers, also when some cells are statuses instead ("oom", "–")."""
    if pd.api.types.is_numeric_dtype(column):
        return True
    cells = [v for v in column if (isinstance(v, str) and v) or _is_number(v)]
    numbers = sum(_is_number(c) or bool(_NUMBER.fullmatch(c.strip("*"))) for c in cells)  # **738.6**: bold
    return numbers > 0 and numbers >= len(cells) / 2


def _is_number(v) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and v == v


def markdown_table(df: pd.DataFrame, digits: int = 2) -> str:
    """A pipe table: numbers right-aligned, text left-aligned. A column with no value in any row is left
    out of the printed table (it says nothing; the CSV keeps it)."""
    df = df[[c for c in df.columns if any(fmt(v, digits) != "" for v in df[c])]] if len(df) else df
    cols = [str(c) for c in df.columns]
    numeric = [_numeric(df[c]) for c in df.columns]
    lines = ["| " + " | ".join(cols) + " |",
             "|" + "|".join("---:" if n else ":---" for n in numeric) + "|"]
    for row in df.itertuples(index=False):
        lines.append("| " + " | ".join(fmt(v, digits) for v in row) + " |")
    return "\n".join(lines) + "\n"


def save_table(df: pd.DataFrame, out_dir: Path, name: str, digits: int = 2, data: pd.DataFrame | None = None) -> str:
    """Write NAME.csv (`data` if given: the numbers behind a table shaped for print) and NAME.md;
    return the Markdown for the report."""
    (df if data is None else data).to_csv(out_dir / f"{name}.csv", index=False)
    md = markdown_table(df, digits)
    (out_dir / f"{name}.md").write_text(md)
    return md


def save_csv(df: pd.DataFrame, out_dir: Path, name: str) -> str:
    """Write NAME.csv only (a table too wide to print); return its file name for the report's link."""
    df.to_csv(out_dir / f"{name}.csv", index=False)
    return f"{name}.csv"


def figure(height_in: float, nrows: int = 1, ncols: int = 1, **kwargs):
    """A figure as wide as the report's text, laid out by matplotlib's constrained layout (so a
    `fig.legend(loc="outside lower center")` gets room of its own); `plt.subplots` arguments otherwise."""
    kwargs.setdefault("layout", "constrained")
    return plt.subplots(nrows, ncols, figsize=(FIGURE_WIDTH_IN, height_in), **kwargs)


def log_axis(ax, which: str = "y", base: int = 10) -> None:
    """Log scale on the x or y axis, labelled with plain numbers (0.5, 1, 2, 5, 10; 512, 1K, 64K for
    base 2) rather than powers, whose small superscripts do not read in print."""
    (ax.set_xscale if which == "x" else ax.set_yscale)("log", base=base)
    axis = ax.xaxis if which == "x" else ax.yaxis

    def label(v, _pos=None) -> str:
        return f"{v / 1024:g}K" if base == 2 and v >= 1024 else f"{v:g}"

    axis.set_major_locator(LogLocator(base=base, subs=(1.0, 2.0, 5.0) if base == 10 else (1.0,)))
    axis.set_major_formatter(FuncFormatter(label))
    axis.set_minor_formatter(NullFormatter())


def save_figure(fig, out_dir: Path, name: str) -> str:
    """Write NAME.png at the text width of the report (a figure of another width is scaled to it,
    aspect kept, so its text prints at its nominal size)."""
    width, height = fig.get_size_inches()
    if abs(width - FIGURE_WIDTH_IN) > 1e-3:
        fig.set_size_inches(FIGURE_WIDTH_IN, height * FIGURE_WIDTH_IN / width)
    path = out_dir / f"{name}.png"
    if fig.get_layout_engine() is None:
        fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path.name


def size_key(series: pd.Series) -> pd.Series:
    return series.map(lambda s: SIZE_ORDER.index(s) if s in SIZE_ORDER else len(SIZE_ORDER))


def sort_rows(df: pd.DataFrame, *cols: str) -> pd.DataFrame:
    """The rows sorted by the columns, model sizes in the grid's order."""
    return df.sort_values(list(cols), key=lambda s: size_key(s) if s.name == "size" else s)


def environment_summary(df: pd.DataFrame) -> dict:
    """Hardware, software and date range of the results a section shows."""
    if df.empty:
        return {}

    def values(col: str) -> list:
        return sorted({str(v) for v in df[col].dropna()}) if col in df else []

    stamps = values("env.timestamp")
    gpus = values("env.gpu")
    first, last = (stamps[0][:10], stamps[-1][:10]) if stamps else ("", "")
    return {
        "machines": _machines(df),
        "dates": first if first == last else f"{first} to {last}",
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
        "on": _on_by_problem(df),
    }


GPU_MODELS = ("H100", "H200", "B200", "A100")


def gpu_model(name: str) -> str:
    """The GPU's model from its full name ("NVIDIA H100 80GB HBM3" -> "H100"); the name itself when unknown."""
    return next((m for m in GPU_MODELS if m in name), name)


def ran_on(gpu_names) -> str | None:
    """Where results ran, as a caption says it, from their `env.gpu` values: "one H100", "one H100 or one H200";
    None when none names a GPU (the CPU)."""
    models = sorted({gpu_model(g) for g in gpu_names if isinstance(g, str) and g})
    return " or ".join(f"one {g}" for g in models) or None


def _on_by_problem(df: pd.DataFrame) -> dict[str, str]:
    """Where each experiment's results ran, as a caption says it: 'one H100', 'one H100 or one H200' (some
    results on each), 'the CPU' (the smoke grid). A caption reads it instead of naming a GPU, so results re-made
    on another GPU model are never captioned with the old one."""
    if "problem" not in df:
        return {}
    out = {}
    for problem, group in df.groupby("problem"):
        out[str(problem)] = ran_on(group.get("env.gpu", pd.Series(dtype=object))) or "the CPU"
    return out


def _machines(df: pd.DataFrame) -> list[str]:
    """Each machine the results ran on: '2x NVIDIA H200' (GPUs a job used), or the CPU with its cores."""
    out = []
    for _, row in df.drop_duplicates([c for c in ("env.gpu", "env.world_size", "env.cpu_count", "env.device")
                                      if c in df]).iterrows():
        gpu = row.get("env.gpu")
        if isinstance(gpu, str) and gpu:
            n = row.get("env.world_size")
            n = int(n) if isinstance(n, (int, float)) and n == n and n else 1
            name = f"{n}\u00d7 {gpu}"
        else:
            cores = row.get("env.cpu_count")
            cores = f", {int(cores)} cores" if isinstance(cores, (int, float)) and cores == cores else ""
            name = f"CPU ({row.get('env.cpu', 'unknown')}{cores})"
        if name not in out:
            out.append(name)
    return out


def read_benchmark_tsv(path: Path) -> float:
    """Wall-clock seconds of a Snakemake `benchmark:` record."""
    return float(pd.read_csv(path, sep="\t")["s"].iloc[0])


CLOCK, POWER = "clock (MHz)", "power (W)"


def rises(values: list[float]) -> bool:
    """Whether a series, in its order (size, k, ...), rises at every step: a trend the prose may then state.
    False for fewer than two values (no step to rise over)."""
    return len(values) > 1 and all(b > a for a, b in zip(values, values[1:], strict=False))


def sm_clock(summary) -> float | None:
    """The median SM clock (MHz) of a `gpu_clocks.ClockSampler` summary (None: not sampled)."""
    value = summary.get("sm_clock_mhz") if isinstance(summary, dict) else None
    return float(value) if value else None


def clocks(r: pd.Series, phase: str = "fwd_bwd") -> dict:
    """The median SM clock and power over a point's timed `phase` (its `{phase}_clocks`, a
    `gpu_clocks.ClockSampler` summary: fwd_bwd | fwd for attention, step for the optimised step): a
    table's two columns, empty where the result has none (nvidia-smi absent, or measured before they
    were kept)."""
    c = r.get(f"{phase}_clocks")
    if not isinstance(c, dict) or not c:
        return {}
    return {CLOCK: c.get("sm_clock_mhz"), POWER: c.get("power_w")}
