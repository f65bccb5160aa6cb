"""A job of fewer rounds than the verdicts need shows its ratio and range but no ✓ ✗ ≈, in the DDP and the
sharding sections' target tables alike (issue 60: a verdict only from interleaved rounds)."""

from __future__ import annotations

import json
from pathlib import Path

from cs336sys import report

REPO = Path(__file__).resolve().parents[1]
MARKS = ("✓", "✗", "≈")


def _rows(text: str, key: str) -> list[str]:
    table = text.split(f'<a id="tbl-{key}"></a>')[1].split("\n\n")[1]
    return [line for line in table.splitlines()[2:] if line.startswith("|")]


def _render(section: str, **changes) -> str:
    context = json.loads((REPO / f"results/sections/{section}/context.json").read_text())
    return report.render_section(section, context | changes, REPO / "writeup/templates")


def test_ddp_targets_judge_only_jobs_of_enough_rounds():
    rows = _rows(_render("ddp"), "ddp-targets")
    rounds = [int(r.split("|")[2]) for r in rows]
    assert 1 in rounds and 3 in rounds  # the committed jobs hold both kinds
    for row, n in zip(rows, rounds, strict=True):
        assert any(m in row for m in MARKS) == (n >= 3), row
    everyone = _rows(_render("ddp", min_rounds=1), "ddp-targets")  # the threshold is the context's
    assert all(any(m in r for m in MARKS) for r in everyone)


def test_sharding_targets_judge_only_jobs_of_enough_rounds():
    rows = _rows(_render("sharding"), "shard-targets")
    unjudged = [r for r in rows if "1 round: not judged" in r]
    assert unjudged and not any(m in r for r in unjudged for m in MARKS)
    assert all(any(m in r for m in MARKS) for r in rows if r not in unjudged)
    assert not any("not judged" in r for r in _rows(_render("sharding", min_rounds=1), "shard-targets"))
