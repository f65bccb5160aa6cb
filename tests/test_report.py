import json

from cs336sys.problems import PROBLEMS
from cs336sys.report import coverage, render_markdown

TEMPLATES = __import__("pathlib").Path(__file__).parent.parent / "writeup" / "templates"


def test_coverage_lists_every_problem_and_marks_missing_ones():
    rows = coverage({"precision": {"result_counts": {"mixed_precision_accumulation": 1}}})
    assert [r["number"] for r in rows] == [p.number for p in PROBLEMS]
    by_name = {r["name"]: r for r in rows}
    assert by_name["mixed_precision_accumulation"]["has_results"]
    assert not by_name["nsys_profile"]["has_results"] and by_name["nsys_profile"]["points"] == 0


def test_report_says_when_a_section_has_no_results(tmp_path):
    sections = []
    for name in ("benchmarking", "precision", "attention"):
        d = tmp_path / "sections" / name
        d.mkdir(parents=True)
        (d / "context.json").write_text(json.dumps({"env": {}, "tables": {}, "figures": {}, "result_counts": {}}))
        sections.append(d)
    text = render_markdown(sections, TEMPLATES, tmp_path / "writeup" / "report.md")
    assert text.count("No results yet for this section") == 3
    assert f"Problems with results: 0 of {len(PROBLEMS)}" in text
    assert (tmp_path / "writeup" / "report.md").read_text() == text
