"""docs/architecture.md against the registry: every problem's row names its experiments, the modules of
their functions and the rule files that register them, and its section; every section's row names its
context module, its template and its rule file; every path the page names exists (as tests/test_docs.py
checks for every doc); the README's first screen links the page."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

from test_docs import _inline_code, _resolve, exists

from cs336sys import registry

REPO = Path(__file__).resolve().parent.parent
PAGE = REPO / "docs" / "architecture.md"


def table(heading_row: str) -> list[list[str]]:
    """The cells of the Markdown table whose header row starts with `heading_row`."""
    lines = PAGE.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(heading_row))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


def named(cell: str) -> set[str]:
    return set(re.findall(r"`([^`]+)`", cell))


@cache
def rule_texts() -> dict[str, str]:
    return {str(p.relative_to(REPO)): p.read_text() for p in sorted((REPO / "workflow" / "rules").glob("*.smk"))}


def registered_in(pattern: str) -> set[str]:
    """The rule files whose text matches `pattern`."""
    return {path for path, text in rule_texts().items() if re.search(pattern, text)}


def may_register(experiment: str) -> set[str]:
    """The rule files that register jobs (`experiment_job(`) and name the experiment as a string: its
    name as the call's first argument, or in a loop over experiments that feeds the call."""
    return registered_in(r"experiment_job\(") & registered_in(rf"[\"']{experiment}[\"']")


def problem_rows() -> dict[int, list[str]]:
    return {int(row[0]): row for row in table("| # | problem")}


def row_faults(row: list[str], problem: registry.Problem) -> list[str]:
    """What a problem's row gets wrong against the registry (nothing: [])."""
    number, name, experiments, implementation, points, rule_files, section = row
    functions = {f.partition(":")[0] for e in problem.experiments for f in registry.experiment(e).functions}
    listed = named(rule_files)
    candidates = {e: may_register(e) for e in problem.experiments}
    checks = {
        "number": number == str(problem.number),
        "name": name.startswith(problem.name.split(" (")[0]) and ("derived" in name) == problem.derived,
        "experiments": named(experiments) == set(problem.experiments),
        "implementation": bool(named(implementation)),
        "points": named(points) == functions,
        # each experiment's jobs come from a listed file, and each listed file registers one of them
        "rule files": all(listed & c for c in candidates.values()) and listed <= set().union(*candidates.values()),
        "section": section == problem.section,
    }
    return [f"problem {problem.number}: {what}" for what, ok in checks.items() if not ok]


def test_every_problem_has_its_row():
    rows = problem_rows()
    assert sorted(rows) == [p.number for p in registry.PROBLEMS] and len(rows) == 25
    assert [fault for p in registry.PROBLEMS for fault in row_faults(rows[p.number], p)] == []


def test_every_section_has_its_row_in_report_order():
    rows = table("| section | context")
    assert [row[0] for row in rows] == list(registry.SECTIONS)
    for name, context, template, rule_file in rows:
        section = registry.section(name)
        assert named(context) == {section.module}
        assert named(template) == {f"writeup/templates/{section.template}"}
        assert named(rule_file) == registered_in(rf'(?m)^section\(\s*"{name}"'), name


def test_every_path_and_module_the_page_names_exists():
    tokens = _inline_code(PAGE.read_text())
    paths = [t for t in tokens if "/" in t and " " not in t and not t.startswith("python")]
    assert len(paths) > 30
    assert [p for p in paths if not exists(p)] == []
    names = sorted({t for t in tokens if re.fullmatch(r"cs336sys(\.\w+)+", t)})
    assert len(names) > 30
    assert [n for n in names if not _resolve(n)] == []  # a module, or a name in one


def test_the_readme_first_screen_links_the_page():
    first_screen = "\n".join((REPO / "README.md").read_text().splitlines()[:20])
    assert "(docs/architecture.md)" in first_screen


def test_the_row_check_can_fail():
    seven = next(p for p in registry.PROBLEMS if p.number == 7)
    row = problem_rows()[7]
    assert row_faults(row, seven) == []
    wrong_points = row[:4] + ["`cs336sys.bench`"] + row[5:]
    wrong_rules = row[:5] + ["`workflow/rules/benchmarking.smk`"] + row[6:]
    assert row_faults(wrong_points, seven) == ["problem 7: points"]
    assert row_faults(wrong_rules, seven) == ["problem 7: rule files"]
    assert row_faults(row[:6] + ["memory"], seven) == ["problem 7: section"]
