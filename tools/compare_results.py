"""Compare the result JSONs of two git revisions, point by point, and flag changes beyond noise.

    python tools/compare_results.py OLD_REV NEW_REV [--under results/] [--threshold 0.05] [--k 2]
                                    [--metrics REGEX] [--match REGEX] [--markdown] [--only-beyond]

Both trees are read through git (`git ls-tree`, `git cat-file --batch`): nothing is checked out.
A result file is one with the schema of `cs336sys.results` (a `metrics` dict); other JSON is skipped.
Files are matched by path.

Timing metrics: numeric scalars whose key matches `--metrics` (default: ends in `_ms`, or is `tflops`,
the matmul peak), less the keys that carry spread: `std_ms`, `<x>_std_ms`, `min_ms`, `max_ms`, `iqr*`.
The spread of a metric is `<x>_std_ms` for `<x>_ms` if recorded, else `std_ms` for `mean_ms`/`median_ms`
(the standard deviation of the timed steps).

Noise rule. With a spread recorded in both runs (s_old, s_new): the change is beyond noise when
|new - old| > k * sqrt(s_old^2 + s_new^2) (k = 2) and |new/old - 1| > threshold / 5 (a 1 % floor at the
default threshold, as step-to-step spread does not show run-to-run drift). Without a recorded spread:
beyond noise when |new/old - 1| > threshold.

Also printed: status changes (ok -> oom ...), points present in only one revision (counted per folder),
settings that differ between matched points, and a summary per experiment (first folder under --under).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import subprocess
from collections import Counter
from typing import Any

import pandas as pd

SPREAD = re.compile(r"(^|_)(std|min|max|iqr)(_|$)")


def git_results(rev: str, under: str, cwd: str | None = None) -> dict[str, dict[str, Any]]:
    """Every result JSON under `under` at `rev`, by path."""
    names = subprocess.run(["git", "ls-tree", "-r", "--name-only", rev, "--", under], cwd=cwd, check=True,
                           capture_output=True, text=True).stdout.split("\n")
    names = [n for n in names if n.endswith(".json")]
    blob = subprocess.run(["git", "cat-file", "--batch"], cwd=cwd, check=True, capture_output=True,
                          input="".join(f"{rev}:{n}\n" for n in names).encode()).stdout
    out, pos = {}, 0
    for name in names:
        end = blob.index(b"\n", pos)
        size = int(blob[pos:end].split()[2])
        data = json.loads(blob[end + 1:end + 1 + size])
        pos = end + 1 + size + 1
        if isinstance(data, dict) and isinstance(data.get("metrics"), dict):
            out[name] = data
    return out


def spread_key(metric: str, metrics: dict[str, Any]) -> str | None:
    own = metric[:-3] + "_std_ms" if metric.endswith("_ms") else None
    if own in metrics:
        return own
    return "std_ms" if metric in ("mean_ms", "median_ms") and "std_ms" in metrics else None


def is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def compare(old: dict[str, dict], new: dict[str, dict], pattern: str, threshold: float, k: float) -> pd.DataFrame:
    """One row per (common path, common timing metric): old, new, new/old, the noise bound, beyond."""
    rows = []
    for path in sorted(old.keys() & new.keys()):
        mo, mn = old[path]["metrics"], new[path]["metrics"]
        for key in sorted(mo.keys() & mn.keys()):
            vo, vn = mo[key], mn[key]
            if SPREAD.search(key) or not re.search(pattern, key) or not (is_number(vo) and is_number(vn)):
                continue
            ratio = vn / vo if vo else math.nan
            so, sn = (d.get(spread_key(key, d) or "") for d in (mo, mn))
            if is_number(so) and is_number(sn):
                noise = k * math.hypot(so, sn)
                beyond = abs(vn - vo) > noise and abs(ratio - 1) > threshold / 5
            else:
                noise, beyond = math.nan, abs(ratio - 1) > threshold
            rows.append({"path": path, "metric": key, "old": vo, "new": vn, "ratio": ratio, "noise": noise,
                         "beyond": bool(beyond)})
    return pd.DataFrame(rows, columns=["path", "metric", "old", "new", "ratio", "noise", "beyond"])


def experiment(path: str, under: str) -> str:
    return path[len(under):].lstrip("/").split("/")[0] if path.startswith(under) else path.split("/")[0]


def summary(df: pd.DataFrame, under: str) -> pd.DataFrame:
    if df.empty:
        return pd.DataFrame()
    g = df.assign(experiment=[experiment(p, under) for p in df.path],
                  faster=df.beyond & (df.ratio < 1)).groupby(["experiment", "metric"])
    return pd.DataFrame({"points": g.size(), "median_ratio": g.ratio.median(), "min_ratio": g.ratio.min(),
                         "max_ratio": g.ratio.max(), "beyond_noise": g.beyond.sum(),
                         "beyond_faster": g.faster.sum()}).reset_index()


def settings_changes(old: dict[str, dict], new: dict[str, dict], under: str) -> pd.DataFrame:
    seen: Counter[tuple[str, str, str, str]] = Counter()
    for path in old.keys() & new.keys():
        so, sn = old[path].get("settings", {}), new[path].get("settings", {})
        for key in so.keys() | sn.keys():
            a, b = so.get(key, "(absent)"), sn.get(key, "(absent)")
            if a != b:
                seen[(experiment(path, under), key, json.dumps(a), json.dumps(b))] += 1
    return pd.DataFrame([(*k, n) for k, n in sorted(seen.items())],
                        columns=["experiment", "setting", "old", "new", "points"])


def fmt(v: Any) -> str:
    if isinstance(v, bool | str) or v is None:
        return str(v)
    if isinstance(v, float):
        return "nan" if math.isnan(v) else f"{v:.4g}" if abs(v) < 1e5 else f"{v:.3e}"
    return str(v)


def table(df: pd.DataFrame, markdown: bool) -> str:
    if df.empty:
        return "(none)\n"
    cells = [[str(c) for c in df.columns]] + [[fmt(v) for v in row] for row in df.itertuples(index=False)]
    if markdown:
        lines = ["| " + " | ".join(r) + " |" for r in cells]
        lines.insert(1, "|" + "|".join("---" for _ in df.columns) + "|")
        return "\n".join(lines) + "\n"
    widths = [max(len(r[i]) for r in cells) for i in range(len(df.columns))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells) + "\n"


def report(old_rev: str, new_rev: str, under: str = "results/", threshold: float = 0.05, k: float = 2.0,
           pattern: str = r"(_ms|^tflops)$", markdown: bool = False, only_beyond: bool = False,
           match: str | None = None, cwd: str | None = None) -> str:
    old, new = git_results(old_rev, under, cwd), git_results(new_rev, under, cwd)
    if match:
        old, new = ({p: r for p, r in d.items() if re.search(match, p)} for d in (old, new))
    df = compare(old, new, pattern, threshold, k)
    h = (lambda t: f"\n## {t}\n\n") if markdown else (lambda t: f"\n{t}\n{'=' * len(t)}\n")
    out = [f"{'# ' if markdown else ''}Results {old_rev} -> {new_rev} under {under}: {len(old)} old, "
           f"{len(new)} new, {len(old.keys() & new.keys())} common; rule: k={k}, threshold={threshold}\n"]
    out += [h("Summary per experiment and metric"), table(summary(df, under), markdown)]
    status = pd.DataFrame([(p, old[p]["status"], new[p]["status"]) for p in sorted(old.keys() & new.keys())
                           if old[p]["status"] != new[p]["status"]], columns=["path", "old", "new"])
    out += [h("Status changes"), table(status, markdown)]
    for rev, only in ((old_rev, old.keys() - new.keys()), (new_rev, new.keys() - old.keys())):
        counts = Counter(p.rsplit("/", 1)[0] for p in only)
        out += [h(f"Only in {rev}"), table(pd.DataFrame(sorted(counts.items()), columns=["folder", "files"]), markdown)]
    out += [h("Settings that differ"), table(settings_changes(old, new, under), markdown)]
    rows = df[df.beyond] if only_beyond else df
    out += [h("Points beyond noise" if only_beyond else "All points"), table(rows, markdown)]
    return "".join(out)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("old_rev")
    p.add_argument("new_rev")
    p.add_argument("--under", default="results/", help="folder holding the result JSONs")
    p.add_argument("--threshold", type=float, default=0.05, help="relative change counted as beyond noise "
                   "when no spread is recorded (a fifth of it is the floor when one is)")
    p.add_argument("--k", type=float, default=2.0, help="multiple of the combined spread")
    p.add_argument("--metrics", default=r"(_ms|^tflops)$", help="regex of the metric keys compared")
    p.add_argument("--match", help="regex: only result paths matching it")
    p.add_argument("--markdown", action="store_true", help="Markdown tables instead of plain text")
    p.add_argument("--only-beyond", action="store_true", help="list only the points beyond noise")
    a = p.parse_args(argv)
    print(report(a.old_rev, a.new_rev, a.under, a.threshold, a.k, a.metrics, a.markdown, a.only_beyond, a.match),
          end="")


if __name__ == "__main__":
    main()
