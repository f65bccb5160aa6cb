"""`tools/` holds only what is maintained: every file there is used by CI, the README or a rule, and a
test or a CI step runs it. A one-off probe goes beside the notes it produced (`notes/runs/<run>/`), or
leaves the tree (git history keeps it). Seconds, nothing runs."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# Kept in tools/ though no test or CI step runs it yet, with the reason.
EXEMPT: dict[str, str] = {}


def tools() -> list[str]:
    return sorted(p.name for p in (REPO / "tools").iterdir()
                  if p.is_file() and not p.name.startswith("."))


def _texts(*patterns: str, skip: Path | None = None) -> dict[str, str]:
    return {str(p.relative_to(REPO)): p.read_text() for pattern in patterns for p in sorted(REPO.glob(pattern))
            if p.is_file() and p != skip}


def ci() -> dict[str, str]:
    return _texts(".ci/*")


def readme() -> dict[str, str]:
    return _texts("README.md")


def rules() -> dict[str, str]:
    return _texts("Snakefile", "workflow/rules/*.smk")


def in_tests() -> dict[str, str]:
    return _texts("tests/*.py", skip=Path(__file__).resolve())


def naming(name: str, texts: dict[str, str]) -> list[str]:
    """The files whose text names the tool (its file name, as a whole word)."""
    pattern = re.compile(rf"(?<![\w.-]){re.escape(name)}(?![\w-])")
    return [path for path, text in texts.items() if pattern.search(text)]


def test_every_tool_is_used_by_ci_the_readme_or_a_rule():
    users = {**ci(), **readme(), **rules()}
    unused = [name for name in tools() if not naming(name, users)]
    assert unused == [], "move each to notes/runs/<the run it made> or delete it (git history keeps it)"


def test_every_tool_is_run_by_a_test_or_a_ci_step():
    runners = {**ci(), **in_tests()}
    unrun = [name for name in tools() if name not in EXEMPT and not naming(name, runners)]
    assert unrun == []


def test_the_exemptions_name_tools_and_say_why():
    assert set(EXEMPT) <= set(tools())
    assert all(len(reason) > 20 for reason in EXEMPT.values())


def test_the_check_can_fail():
    assert "compare_results.py" in tools() and len(tools()) >= 5
    assert naming("compare_results.py", readme()) == ["README.md"]
    assert naming("no_such_probe.py", {**ci(), **readme(), **rules(), **in_tests()}) == []
    # a longer name that contains a tool's name is not a reference to it
    assert naming("results.py", {"x": "tools/compare_results.py and compare-results.py"}) == []
    assert naming("results.py", {"x": "see results.py."}) == ["x"]
