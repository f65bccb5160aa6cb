"""cs336sys.provenance: the sources of a commit unpacked once, whole, however many processes ask at once."""

from __future__ import annotations

import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from cs336sys import provenance

REPO = Path(__file__).resolve().parents[1]


def test_sources_of_a_commit_asked_for_at_once_are_whole(tmp_path, monkeypatch):
    if not (REPO / ".git").exists():
        pytest.skip("needs the repository's git history (a copied tree has none)")
    monkeypatch.setattr(provenance, "_SOURCES", tmp_path / "sources")
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    want = sorted(p.relative_to(REPO) for p in (REPO / "src").rglob("*.py")
                  if subprocess.run(["git", "ls-files", "--error-unmatch", str(p)], cwd=REPO,
                                    capture_output=True).returncode == 0)
    with ThreadPoolExecutor(6) as pool:  # six at once, as test workers and Slurm jobs may
        got = list(pool.map(lambda _: provenance.sources_at(head, REPO), range(6)))
    assert len(set(got)) == 1 and got[0] is not None
    unpacked = sorted(Path("src") / p.relative_to(got[0]) for p in got[0].rglob("*.py"))
    assert unpacked == want
    assert [p.name for p in (tmp_path / "sources").iterdir()] == [head]  # no work folder left behind


def test_sources_of_a_commit_from_a_folder_inside_the_checkout(tmp_path, monkeypatch):
    """The smoke grid runs the workflow from `smoke/`: `src` is still the checkout's top-level one."""
    if not (REPO / ".git").exists():
        pytest.skip("needs the repository's git history (a copied tree has none)")
    monkeypatch.setattr(provenance, "_SOURCES", tmp_path / "sources")
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    got = provenance.sources_at(head, REPO / "src" / "cs336sys")
    assert got is not None and (got / "cs336sys" / "provenance.py").exists()
