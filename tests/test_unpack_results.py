"""tools/unpack_results.py: a GPU host's archive brings the jobs that ran there, and only those.

Each archive also carries the results the host's copy of the tree had when it started, so unpacking two
archives in either order must leave each job's newest results, with its timing beside them.
"""

from __future__ import annotations

import base64
import importlib.util
import json
import tarfile
from pathlib import Path

import pytest

TOOL = Path(__file__).resolve().parents[1] / "tools" / "unpack_results.py"


def unpack(archive: Path, repo: Path) -> None:
    spec = importlib.util.spec_from_file_location("unpack_results", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main(str(archive), repo) == 0


def host_archive(tmp: Path, name: str, jobs: dict[str, tuple[str, float]]) -> Path:
    """An archive as run_on_gpu_host.sh packs it: for each job X (its output results/X.json holding
    `text`, its record ending at `endtime`), the result, its provenance record and its timing."""
    root = tmp / name
    for job, (text, endtime) in jobs.items():
        output = f"results/{job}.json"
        (root / output).parent.mkdir(parents=True, exist_ok=True)
        (root / output).write_text(text)
        record = root / ".snakemake" / "metadata" / base64.b64encode(output.encode()).decode()
        record.parent.mkdir(parents=True, exist_ok=True)
        record.write_text(json.dumps({"rule": job.replace("/", "_"), "endtime": endtime, "incomplete": False}))
        timing = root / "benchmarks" / f"{job}.tsv"
        timing.parent.mkdir(parents=True, exist_ok=True)
        timing.write_text(f"s\n{text}\n")
    archive = tmp / f"{name}.tgz"
    with tarfile.open(archive, "w:gz") as tar:
        for path in sorted(root.rglob("*")):
            tar.add(path, arcname=path.relative_to(root).as_posix(), recursive=False)
    return archive


@pytest.mark.parametrize("order", ["first host first", "second host first"])
def test_each_job_keeps_its_newest_results_in_either_order(tmp_path, order):
    # the first host re-ran job a (its b is the tree's, older); the second re-ran b (its a is the tree's)
    first = host_archive(tmp_path, "first", {"lb/a": ("a new", 300.0), "lb/b": ("b old", 100.0)})
    second = host_archive(tmp_path, "second", {"lb/a": ("a old", 100.0), "lb/b": ("b new", 400.0)})
    repo = tmp_path / "repo"
    repo.mkdir()
    for archive in ([first, second] if order == "first host first" else [second, first]):
        unpack(archive, repo)
    assert (repo / "results/lb/a.json").read_text() == "a new"
    assert (repo / "results/lb/b.json").read_text() == "b new"
    assert (repo / "benchmarks/lb/a.tsv").read_text() == "s\na new\n"
    assert (repo / "benchmarks/lb/b.tsv").read_text() == "s\nb new\n"
