import json

import pytest

from cs336sys.registry import PROBLEMS, SECTIONS
from cs336sys.report import coverage, render_markdown

TEMPLATES = __import__("pathlib").Path(__file__).parent.parent / "writeup" / "templates"


def test_coverage_lists_every_problem_and_marks_missing_ones():
    rows = coverage({"precision": {"result_counts": {"mixed_precision_accumulation": 1}}})
    assert [r["number"] for r in rows] == [p.number for p in PROBLEMS]
    by_name = {r["name"]: r for r in rows}
    assert by_name["mixed_precision_accumulation"]["has_results"]
    assert not by_name["nsys_profile"]["has_results"] and by_name["nsys_profile"]["points"] == 0


def empty_sections(root):
    dirs = []
    for name in SECTIONS:
        d = root / "sections" / name
        d.mkdir(parents=True)
        (d / "context.json").write_text(json.dumps({"env": {}, "tables": {}, "figures": {}, "result_counts": {}}))
        dirs.append(d)
    return dirs


def test_report_says_when_a_section_has_no_results(tmp_path):
    text = render_markdown(empty_sections(tmp_path), TEMPLATES, tmp_path / "writeup" / "report.md")
    assert text.count("No results yet for this section") == len(SECTIONS)
    assert f"Problems with results: 0 of {len(PROBLEMS)}" in text
    assert (tmp_path / "writeup" / "report.md").read_text() == text
    assert "smoke grid" not in text.split("\n## ")[0]


def test_the_smoke_report_says_what_it_is_on_its_first_line(tmp_path):
    text = render_markdown(empty_sections(tmp_path), TEMPLATES, tmp_path / "report.md", grid="smoke")
    first = text.lstrip().splitlines()[0]
    assert first.startswith("# CPU smoke grid") and "not results" in first


def test_unknown_section_directory_is_an_error(tmp_path):
    d = tmp_path / "sections" / "nonsense"
    d.mkdir(parents=True)
    (d / "context.json").write_text("{}")
    with pytest.raises(ValueError, match="not sections of cs336sys.registry"):
        render_markdown([d], TEMPLATES, tmp_path / "report.md")


def test_coverage_counts_an_experiment_read_by_two_sections_once():
    rows = coverage({"ddp": {"result_counts": {"allreduce": 4, "ddp_step": 9}},
                     "accounting": {"result_counts": {"allreduce": 4, "ddp_step": 9}}})
    by_name = {r["name"]: r for r in rows}
    assert by_name["distributed_communication_single_node"]["points"] == 4
    assert by_name["naive_ddp"]["points"] == 9
