"""The hashes kept on disk between processes.

Hashing parses every module a workflow names (a few seconds per `snakemake` run, and per Slurm job, which
parses the workflow again). The hashes are kept on disk, keyed by a digest of what a hash can depend on: every
source file's path and bytes, the hash's own code (this package's files), and the Python that tokenizes them
(its version and implementation): a changed, added or removed file, or another Python, is another key.
$CS336SYS_CODEHASH_CACHE names the folder (default ~/.cache/cs336sys/codehash, or under $XDG_CACHE_HOME);
"off" turns it off."""

from __future__ import annotations

import hashlib
import json
import os
import sys
from functools import cache
from pathlib import Path

CACHE_ENV = "CS336SYS_CODEHASH_CACHE"
CACHE_FILES = 100  # source states kept


def _cache_dir() -> Path | None:
    where = os.environ.get(CACHE_ENV)
    if where == "off":
        return None
    if where:
        return Path(where)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "cs336sys" / "codehash"


@cache
def _sources_digest(root: Path) -> str:
    """Every source file under `root` (its relative path and bytes), the hash's own code and the Python running
    it: what a hash can depend on."""
    own = b"".join(p.read_bytes() for p in sorted(Path(__file__).parent.glob("*.py")))
    h = hashlib.sha256(own + f"\0{sys.implementation.name} {sys.version}\0".encode())
    for path in sorted(root.rglob("*.py")):
        h.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:32]


def _cache_file(root: Path) -> Path | None:
    folder = _cache_dir()
    return None if folder is None else folder / f"{_sources_digest(root)}.json"


def _read_cache(path: Path | None) -> dict[str, str]:
    try:
        found = json.loads(path.read_text()) if path is not None else {}
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


@cache
def _stored(root: Path) -> dict[str, str]:
    """The hashes stored for these sources (read once per process)."""
    return _read_cache(_cache_file(root))


def _store(root: Path, key: str, value: str) -> None:
    """Add one hash to the file (merged with what another process may have added; best effort)."""
    _stored(root)[key] = value
    path = _cache_file(root)
    if path is None:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        merged = {**_read_cache(path), **_stored(root)}
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(json.dumps(merged, sort_keys=True))
        os.replace(tmp, path)
        kept = sorted(path.parent.glob("*.json"), key=lambda p: p.stat().st_mtime, reverse=True)
        for old in kept[CACHE_FILES:]:  # each edit of the sources makes a file: keep the newest
            old.unlink(missing_ok=True)
    except OSError:
        pass  # a read-only home, or another process pruning: hashes are computed each time
