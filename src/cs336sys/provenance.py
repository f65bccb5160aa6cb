"""What Snakemake recorded about each committed output, and the code it was made with.

Snakemake keeps one provenance record per output in `.snakemake/metadata/` (committed with the
results): the rule, its parameters (among them `code`, the hash of what the experiment runs) and
its shell command. A result file also names the commit whose code made it (`env.git_commit`). From
these two, `code_at` rebuilds the code hash a result was made with by today's rule, from the sources
at that commit (`git archive`), which is how `python -m cs336sys.codehash why` says what changed.

No Snakemake import and no torch: the workflow, the report and the command lines use this.
"""

from __future__ import annotations

import base64
import json
import re
import subprocess
import tarfile
import tempfile
from collections.abc import Iterator
from functools import cache
from pathlib import Path

METADATA = Path(".snakemake/metadata")
_HASH = re.compile(r"^'([0-9a-f]{16})'$")
_FUNCTION = re.compile(r"^'(cs336sys(?:\.\w+)+:\w+)'$")


def record_name(output: str) -> str:
    return base64.b64encode(output.encode()).decode().replace("/", "@")


def output_of(record_file: str) -> str:
    return base64.b64decode(record_file.replace("@", "/")).decode()


def record(output: str, metadata: Path = METADATA) -> dict | None:
    """Snakemake's provenance record of an output (None if there is none)."""
    try:
        return json.loads((Path(metadata) / record_name(output)).read_text())
    except (OSError, json.JSONDecodeError):
        return None


def records(metadata: Path = METADATA) -> Iterator[tuple[str, dict]]:
    """(output, record) for every record, in file-name order."""
    if not Path(metadata).is_dir():
        return
    for f in sorted(Path(metadata).iterdir()):
        try:
            yield output_of(f.name), json.loads(f.read_text())
        except (ValueError, OSError):
            continue


def code_param(rec: dict | None) -> str | None:
    """The `code` parameter a record holds: its one 16-hex-digit parameter."""
    found = {m.group(1) for p in (rec or {}).get("params", []) if isinstance(p, str) and (m := _HASH.match(p))}
    return found.pop() if len(found) == 1 else None


def recorded_hash(output: str, metadata: Path = METADATA) -> str | None:
    """The `code` parameter the output was made with."""
    return code_param(record(output, metadata))


def function_param(rec: dict | None) -> str | None:
    """The experiment function (`module:function`) an experiment job's record names."""
    found = {m.group(1) for p in (rec or {}).get("params", []) if isinstance(p, str) and (m := _FUNCTION.match(p))}
    return found.pop() if len(found) == 1 else None


def results_commit(output: str) -> str | None:
    """The commit a result file names as its code's (`env.git_commit`); for a rendered folder, its
    result file's (`results/a/b/` -> `results/a/b.json`)."""
    path = Path(output)
    if path.is_dir() or not path.suffix:
        path = path.with_suffix(".json")
    try:
        return json.loads(path.read_text()).get("env", {}).get("git_commit") or None
    except (OSError, ValueError, AttributeError):  # missing, not text, not JSON, not a result
        return None


def git(*args: str, cwd: Path | str = ".") -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


_SOURCES = Path(tempfile.gettempdir()) / "cs336sys-sources"


@cache
def sources_at(commit: str, repo: Path | str = ".") -> Path | None:
    """The package sources (`src/`) of `commit`, unpacked once under the temporary folder; None when
    there is no git history here that holds the commit (a copied tree, a shallow clone)."""
    full = git("rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}", cwd=repo)
    if not full:
        return None
    target = _SOURCES / full
    if (target / ".complete").exists():
        return target / "src"
    target.mkdir(parents=True, exist_ok=True)
    archive = target / "src.tar"
    done = subprocess.run(["git", "archive", "--format=tar", "-o", str(archive), full, "src"], cwd=repo,
                          capture_output=True, timeout=60)
    if done.returncode != 0:
        return None
    with tarfile.open(archive) as tar:
        tar.extractall(target, filter="data")
    archive.unlink()
    (target / ".complete").touch()
    return target / "src"


def explain(entries: tuple[str, ...], outputs: list[str], metadata: Path = METADATA) -> list[str]:
    """Why a job's `code` parameter differs from what its outputs were made with: the statements
    that changed since their results' commit, by the current rule. A line each."""
    from cs336sys import codehash

    commits = {results_commit(o) for o in outputs if Path(o).exists()}
    commits.discard(None)
    if not commits:
        return ["its results name no commit to compare with"]
    now = codehash.manifest(*entries)
    lines = []
    for commit in sorted(commits):
        src = sources_at(commit)
        if src is None:
            lines.append(f"made at {commit[:10]}, which this checkout's git history does not hold")
            continue
        then = codehash.Tree(src).manifest(*entries)
        diff = codehash.changes(then, now)
        lines += [f"since {commit[:10]}: {d}" for d in diff] or [
            f"made at {commit[:10]}, whose code is the same by the current rule (its record holds another hash)"]
    return lines


def stale_by_code(jobs: list[tuple[str, tuple[str, ...], str, list[str]]], metadata: Path = METADATA,
                  limit: int = 3) -> str:
    """For the workflow's output: of `jobs` (rule, hash entries, the `code` it gets, its result files),
    those whose results hold another code hash, each with what changed (at most `limit` lines;
    `python -m cs336sys.codehash why RULE` gives all). Empty when there are none."""
    stale = []
    for rule, entries, code, outputs in jobs:
        made = {recorded_hash(o, metadata) for o in outputs if Path(o).exists()}
        made.discard(None)
        if made and made != {code}:
            lines = explain(entries, outputs, metadata)
            shown = lines[:limit] + ([f"... {len(lines) - limit} more"] if len(lines) > limit else [])
            stale.append(f"  {rule}:\n" + "\n".join(f"      {line}" for line in shown))
    if not stale:
        return ""
    return (f"{len(stale)} experiment job(s) will re-run because code they run changed since their results were "
            "made (Snakemake says 'Params have changed': the parameter is `code`). What changed:\n"
            + "\n".join(stale)
            + "\n`python -m cs336sys.codehash why RULE...` lists every change; a change that leaves the results valid "
            "can be pinned (`python -m cs336sys.pins add`, see README).")
