"""Command line that Snakemake's experiment rules call: run a batch of points of one problem.

    python -m cs336sys.run PROBLEM --points '[{...}, ...]' --outputs a.json b.json ...

Each problem maps to a `run_point(settings) -> metrics` function, imported only when needed.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys

from cs336sys.jobs import GpuRequired, run_points

# problem -> "module:function". The module's import closure is what the workflow hashes to decide
# whether this problem's results are stale (workflow/rules/common.smk, cs336sys.codehash).
PROBLEMS: dict[str, str] = {
    "benchmarking": "cs336sys.bench:run_point",
    "warmup": "cs336sys.bench:run_warmup_point",
    "mixed_precision_accumulation": "cs336sys.precision:run_accumulation_point",
    "autocast_dtypes": "cs336sys.precision:run_autocast_dtypes_point",
    "matmul_peak": "cs336sys.peak:run_point",
    "pytorch_attention": "cs336sys.attention.bench:run_pytorch_attention_point",
    "flash_benchmarking": "cs336sys.attention.bench:run_flash_point",
    "flash_leaderboard": "cs336sys.attention.bench:run_leaderboard_point",
}


def resolve(problem: str):
    try:
        target = PROBLEMS[problem]
    except KeyError:
        raise SystemExit(f"unknown problem {problem!r}; known: {', '.join(PROBLEMS)}") from None
    module, func = target.split(":")
    return getattr(importlib.import_module(module), func)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cs336sys.run", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("problem", choices=sorted(PROBLEMS))
    parser.add_argument("--points", required=True, help="JSON list of settings dicts, one per output")
    parser.add_argument("--outputs", nargs="+", required=True)
    args = parser.parse_args(argv)
    points = json.loads(args.points)
    try:
        errors = run_points(args.problem, points, args.outputs, resolve(args.problem))
    except GpuRequired as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 3
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
