"""What Snakemake recorded about each committed output, and the code it was made with.

Snakemake keeps one provenance record per output in `.snakemake/metadata/` (committed with the
results): the rule, its parameters (among them `code`, the hash of what the experiment runs) and
its shell command. A result file also names the commit whose code made it (`env.git_commit`), and
`sources_at` unpacks a commit's sources, from which cs336sys.why rebuilds the code a result was made with.

No Snakemake import and no torch: the workflow, the report and the command lines use this.
"""

from __future__ import annotations

import base64
import json
import re
import shutil
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
    # Unpacked in a folder of its own, then renamed into place whole: processes that ask for the same
    # commit at once (test workers, Slurm jobs) never read one another's half-written archive.
    _SOURCES.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f"{full[:12]}-", dir=_SOURCES))
    try:
        archive = work / "src.tar"
        top = git("rev-parse", "--show-toplevel", cwd=repo) or repo  # `src` is the top's, from any folder
        done = subprocess.run(["git", "archive", "--format=tar", "-o", str(archive), full, "src"], cwd=top,
                              capture_output=True, timeout=60)
        if done.returncode != 0:
            return None
        with tarfile.open(archive) as tar:
            tar.extractall(work, filter="data")
        archive.unlink()
        (work / ".complete").touch()
        if target.exists() and not (target / ".complete").exists():
            shutil.rmtree(target, ignore_errors=True)  # left half-done by an older version of this function
        try:
            work.rename(target)
        except OSError:  # another process put it there first
            pass
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return target / "src" if (target / ".complete").exists() else None
