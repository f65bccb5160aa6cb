"""Where a kernel's warps wait, from Nsight Compute's source page (`notes/runs/2026-11-27-h100-gluon/ncu_gluon.sh` writes it):

    python notes/runs/2026-11-27-h100-gluon/ncu_stalls.py SOURCE.csv[.gz] [--top N] [--ops MEMBAR,FENCE,LDG]

For each kernel in the file: the share of its warp-state samples by stall reason, the N instructions
with the most samples (index, share, instruction, its three largest reasons), and for the opcode
families asked for, how many times they ran and their share of the samples. The samples cover every
warp, idle ones included (a warp-specialised CTA's padding warps wait at a barrier all along).
"""

from __future__ import annotations

import argparse
import collections
import csv
import gzip
from pathlib import Path


def kernels(path: Path) -> list[tuple[str, list[dict]]]:
    """(kernel name, one dict per SASS instruction) for each kernel of a `--page source --csv` file."""
    text = (gzip.open(path, "rt") if path.suffix == ".gz" else open(path)).read().splitlines()
    blocks: list[list[str]] = []
    for line in text:
        if line.startswith('"Kernel Name"'):
            blocks.append([line])
        elif blocks:
            blocks[-1].append(line)
    return [(block[0].split(",")[1].strip('"'), list(csv.DictReader(block[1:]))) for block in blocks]


def _int(value: str | None) -> int:
    return int((value or "0").replace(",", "") or 0)


def stalls(row: dict) -> collections.Counter:
    return collections.Counter({k.removeprefix("stall_"): _int(v) for k, v in row.items()
                                if k and k.startswith("stall_") and "(Not Issued)" not in k})


def opcode(row: dict) -> str:
    words = row["Source"].split()
    return (words[1] if words and words[0].startswith("@") else words[0] if words else "").split(".")[0]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("source", type=Path)
    ap.add_argument("--top", type=int, default=20)
    ap.add_argument("--ops", default="MEMBAR,FENCE,BAR,LDG,LDS,STS,STSM,HGMMA,SYNCS,MUFU,WARPGROUP")
    args = ap.parse_args(argv)
    for name, rows in kernels(args.source):
        total = sum(_int(r["# Samples"]) for r in rows)
        if not total:
            continue
        reasons = sum((stalls(r) for r in rows), collections.Counter())
        print(f"{name[:70]}: {total:,} samples, {len(rows):,} instructions")
        print("  " + ", ".join(f"{k} {100 * v / sum(reasons.values()):.1f}%" for k, v in reasons.most_common(10)))
        for index, row in sorted(enumerate(rows), key=lambda x: -_int(x[1]["# Samples"]))[:args.top]:
            top = ", ".join(f"{k} {v}" for k, v in stalls(row).most_common(3) if v)
            print(f"  {index:5d} {100 * _int(row['# Samples']) / total:5.1f}%  {row['Source'].strip()[:60]:60s} {top}")
        ran, sampled = collections.Counter(), collections.Counter()
        for row in rows:
            ran[opcode(row)] += _int(row["Instructions Executed"])
            sampled[opcode(row)] += _int(row["# Samples"])
        for op in args.ops.split(","):
            if ran[op] or sampled[op]:
                print(f"  {op:10s} ran {ran[op]:>14,d}  samples {100 * sampled[op] / total:5.1f}%")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
