"""Take a GPU host's results.tgz (tools/run_on_gpu_host.sh) into this checkout: the result files, job
timings and Snakemake provenance records of the jobs that finished there, and nothing else.

    python tools/unpack_results.py results.tgz

A job counts as finished when every output its provenance record names is in the archive; the
records of unfinished jobs (cut off by the time limit) are left out, so those jobs stay to do. An
archive also carries the results the host's copy of the tree had: a record no newer than the
checkout's is left alone, so archives may be unpacked in any order. A job timing
(benchmarks/X.tsv) comes with the results it timed (results/X/... or results/X.*). Prints what it
copied.
"""

from __future__ import annotations

import base64
import json
import shutil
import sys
import tarfile
import tempfile
from pathlib import Path


def main(archive: str, repo: Path = Path(".")) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        with tarfile.open(archive) as tar:
            tar.extractall(tmp, filter="data")
        root = Path(tmp)
        meta = root / ".snakemake" / "metadata"
        copied_jobs: dict[str, int] = {}
        copied: list[str] = []
        for record in sorted(meta.iterdir()) if meta.is_dir() else []:
            output = base64.b64decode(record.name.replace("@", "/")).decode()
            if not output.startswith(("results/", "benchmarks/")) or output.startswith("results/sections/"):
                continue
            src = root / output
            if not src.exists():
                continue
            info = json.loads(record.read_text())
            if info.get("incomplete"):  # started, cut off: its outputs may be half a job's
                continue
            # newer than what the checkout has: the job ran on that host
            mine = repo / ".snakemake" / "metadata" / record.name
            if mine.exists() and json.loads(mine.read_text()).get("endtime", 0) >= info.get("endtime", 0):
                continue
            dest = repo / output
            if src.is_dir():
                shutil.rmtree(dest, ignore_errors=True)
                shutil.copytree(src, dest)
            else:
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, dest)
            mine.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(record, mine)
            copied.append(output)
            copied_jobs[info.get("rule", "?")] = copied_jobs.get(info.get("rule", "?"), 0) + 1
        for tsv in sorted((root / "benchmarks").rglob("*.tsv")):
            rel = tsv.relative_to(root)
            timed = "results/" + rel.with_suffix("").relative_to("benchmarks").as_posix()
            if not any(out.startswith((timed + "/", timed + ".")) for out in copied):
                continue
            if not (repo / rel).exists() or (repo / rel).read_bytes() != tsv.read_bytes():
                (repo / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(tsv, repo / rel)
                print(f"timing {rel}")
        for rule, n in sorted(copied_jobs.items()):
            print(f"{rule}: {n} output(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:2]))
