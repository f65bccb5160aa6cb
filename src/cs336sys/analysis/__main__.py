"""python -m cs336sys.analysis SECTION --results FILE... --out DIR"""

from __future__ import annotations

import argparse
import importlib
import json
import shutil
import sys
import tempfile
from pathlib import Path

from cs336sys.analysis.context import as_json
from cs336sys.results import read_result, write_json_atomic


def _result_counts(paths: list[Path]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for p in paths:
        if p.suffix == ".json":
            problem = read_result(p)["problem"]
            counts[problem] = counts.get(problem, 0) + 1
    return counts


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m cs336sys.analysis", description=__doc__)
    p.add_argument("section")
    p.add_argument("--results", nargs="*", default=[])
    p.add_argument("--out", required=True)
    p.add_argument("--extra", default="{}", help="JSON: settings from the config a section needs (e.g. references)")
    a = p.parse_args(argv)
    module = importlib.import_module(f"cs336sys.analysis.{a.section}")
    out = Path(a.out)
    # Build into a temporary sibling, then swap in: a failed run leaves no half-made section.
    tmp = Path(tempfile.mkdtemp(dir=out.parent if out.parent.exists() else None, prefix=f".{out.name}."))
    try:
        paths = [Path(r) for r in a.results]
        context = as_json(module.build(paths, tmp, **json.loads(a.extra)))
        context["result_counts"] = _result_counts(paths)
        write_json_atomic(tmp / "context.json", context)
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    print(f"wrote {out}: {sorted(f.name for f in out.iterdir())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
