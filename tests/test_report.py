import json
from pathlib import Path

import pytest

from cs336sys.deliverables import DELIVERABLES
from cs336sys.registry import SECTIONS
from cs336sys.report import overview, render_markdown
from cs336sys.writeup import lint

TEMPLATES = Path(__file__).parent.parent / "writeup" / "templates"


def sections(root: Path, contexts: dict[str, dict] | None = None) -> list[Path]:
    """A section folder per registered section, each with the given context (default: no results)."""
    dirs = []
    for name in SECTIONS:
        d = root / "sections" / name
        d.mkdir(parents=True)
        context = (contexts or {}).get(name, {"env": {}, "tables": {}, "figures": {}, "result_counts": {}})
        (d / "context.json").write_text(json.dumps(context))
        dirs.append(d)
    return dirs


def test_a_report_without_results_says_so_in_every_section_and_has_nothing_degenerate(tmp_path):
    text = render_markdown(sections(tmp_path), TEMPLATES, tmp_path / "writeup" / "report.md")
    assert text.count("No results yet for this section") == len(SECTIONS)
    assert (tmp_path / "writeup" / "report.md").read_text() == text
    assert "smoke grid" not in text.split("\n## ")[0]
    assert lint.problems(text) == []


def test_the_smoke_report_says_what_it_is_on_its_first_line_and_on_every_page(tmp_path):
    text = render_markdown(sections(tmp_path), TEMPLATES, tmp_path / "report.md", grid="smoke")
    first = text.lstrip().splitlines()[0]
    assert first.startswith("# CPU smoke grid") and "not results" in first
    assert "<!-- grid: smoke -->" in text  # the PDF's running header


def test_the_smoke_reports_first_page_holds_its_disclaimer_and_summary_and_every_page_its_header(tmp_path):
    import pypdf

    from cs336sys.writeup.typst import render_pdf

    md = tmp_path / "writeup" / "report.md"
    render_markdown(sections(tmp_path), TEMPLATES, md, grid="smoke")
    render_pdf(md, tmp_path / "report.pdf")
    pages = [page.extract_text() for page in pypdf.PdfReader(tmp_path / "report.pdf").pages]
    assert len(pages) > 2 and all(p.startswith("CPU smoke grid: a pipeline check, not results\n") for p in pages)
    assert "This is the report of the CPU smoke grid" in pages[0] and "\nSummary\n" in pages[0]
    main = tmp_path / "main" / "report.md"
    render_markdown(sections(tmp_path / "main"), TEMPLATES, main)
    render_pdf(main, tmp_path / "main.pdf")
    assert "smoke grid" not in pypdf.PdfReader(tmp_path / "main.pdf").pages[1].extract_text()


def test_unknown_section_directory_is_an_error(tmp_path):
    d = tmp_path / "sections" / "nonsense"
    d.mkdir(parents=True)
    (d / "context.json").write_text("{}")
    with pytest.raises(ValueError, match="not sections of cs336sys.registry"):
        render_markdown([d], TEMPLATES, tmp_path / "report.md")


def env(machine: str, torch: str, commits: list[str], first: str, last: str, counts: dict) -> dict:
    return {"machines": [machine], "device": machine, "torch": torch, "triton": "3.6.0", "cuda": "13.0",
            "driver": "580", "python": "3.12.3", "commits": commits, "first_date": first, "last_date": last,
            "status_counts": counts, "points": sum(counts.values()), "is_gpu": True}


def test_the_title_block_names_each_machine_once_with_its_sections_and_the_dates_once():
    o = overview({
        "benchmarking": {"env": env("1× H100", "2.11.0+cu130", ["aaaa"], "2026-11-22", "2026-11-22", {"ok": 3})},
        "attention": {"env": env("1× H100", "2.11.0+cu130", ["bbbb"], "2026-11-23", "2026-11-23",
                                 {"ok": 1, "oom": 2})},
        "ddp": {"env": env("2× H200", "2.11.0+cu130", ["bbbb"], "2026-11-23", "2026-11-23", {"ok": 4})},
    })
    assert [m["machine"] for m in o["machines"]] == ["1× H100", "2× H200"]
    assert o["machines"][0]["sections"] == [SECTIONS["benchmarking"].title, SECTIONS["attention"].title]
    assert o["dates"] == "2026-11-22 to 2026-11-23" and o["commits"] == ["aaaa", "bbbb"]
    assert o["status_counts"] == {"ok": 8, "oom": 2} and o["software"]["torch"] == ["2.11.0+cu130"]
    one_day = overview({"ddp": {"env": env("2× H200", "2.11", ["c"], "2026-11-23", "2026-11-23", {"ok": 1})}})
    assert one_day["dates"] == "2026-11-23"


def test_the_committed_report_is_clean_and_answers_every_deliverable():
    """The committed writeup/report.md, as the pipeline rendered it from the committed results."""
    text = (Path(__file__).parent.parent / "writeup" / "report.md").read_text()
    assert lint.problems(text) == []
    index = text.split("<!-- index -->")[1].split("<!-- /index -->")[0]
    unanswered = [line for line in index.splitlines() if line.endswith("| not answered |")]
    assert unanswered == [], f"{len(unanswered)} of {len(DELIVERABLES)} deliverables have no answer"
    assert "## Summary" in text.split("## Contents")[0]


def empty_sections(root: Path) -> list[Path]:
    """Every section with no results (other test files render their own sections among these)."""
    return sections(root)


def test_the_main_report_rendered_from_the_committed_sections_is_clean(tmp_path):
    """The report as the pipeline renders it from the committed section contexts: no artefact, every
    deliverable of both handouts answered under a heading."""
    root = Path(__file__).parent.parent
    dirs = [root / "results" / "sections" / name for name in SECTIONS]
    if not all((d / "context.json").is_file() for d in dirs):
        pytest.skip("the committed sections are not all here")
    text = render_markdown(dirs, TEMPLATES, tmp_path / "writeup" / "report.md")
    assert lint.problems(text) == []
    assert "| not answered |" not in text


def test_the_report_build_fails_on_a_lint_problem_and_names_it(tmp_path, capsys):
    """`python -m cs336sys.report md` (the rule report_markdown) runs the lint on what it rendered: a
    heading glued to a paragraph (a template's block tag that ate a line break) fails the build."""
    from cs336sys.report import main

    templates = tmp_path / "templates"
    templates.mkdir()
    (templates / "earlier_code.md.j2").write_text("# Results made with earlier code\n")
    good = "# Title\n\nSome text.\n{% if true %}(A note.){% endif %}\n\n## Part {: #part}\n\nMore.\n"
    bad = good.replace("{% endif %}\n\n## Part", "{% endif %}\n## Part")  # the tag eats the newline
    dirs = sections(tmp_path)
    for template, code in ((good, 0), (bad, 1)):
        (templates / "report.md.j2").write_text(template)
        assert main(["md", "--sections", *map(str, dirs), "--templates", str(templates),
                     "--out", str(tmp_path / "report.md")]) == code
    err = capsys.readouterr().err
    assert "a heading glued to the text before it" in err and "an attribute list left in the text" in err


def test_the_summary_shows_each_sections_first_rows_up_to_its_quota_and_the_conclusions_count_every_target(
        tmp_path):
    """At most 12 rows on the summary page (at most 2 from each distributed part and the leaderboard), each
    section's first ones; a ratio within the noise reads "≈" (the caption says what it means) and counts as
    neither met nor missed; the conclusions count every section's targets, shown or not."""
    from cs336sys.report import MAX_SUMMARY_ROWS, SUMMARY_ROWS

    assert sum(SUMMARY_ROWS.values()) <= MAX_SUMMARY_ROWS and set(SUMMARY_ROWS) <= set(SECTIONS)
    assert all(SUMMARY_ROWS[s] <= 2 for s in ("ddp", "sharding", "leaderboard"))

    def row(part, met):
        return {"part": part, "result": "1.01× its step time", "target": "≤ 1.00×", "met": met, "ref": "conclusion"}

    empty = {"env": {}, "tables": {}, "figures": {}, "result_counts": {}}
    ddp = [row("DDP first", True), row("DDP second", "noise"), row("DDP third", False)]
    contexts = {"ddp": {**empty, "summary": ddp}, "sharding": {**empty, "summary": [row("FSDP", False)]}}
    text = render_markdown(sections(tmp_path, contexts), TEMPLATES, tmp_path / "writeup" / "report.md")
    summary = text.split("## Summary")[1].split("## Contents")[0]
    assert "| DDP first |" in summary and "| DDP third |" not in summary  # beyond the quota
    assert "| DDP second | 1.01× its step time | ≤ 1.00× | ≈ |" in summary
    conclusions = text.split("Conclusions and limitations")[2]
    assert "Of the 4 targets the sections set, 1 was met and\n2 missed; 1 is within the noise" in conclusions
    missed = conclusions.split("**Targets missed.**")[1].split("**Within the noise.**")[0]
    assert "DDP third" in missed and "FSDP" in missed and "DDP second" not in missed
    assert lint.problems(text) == []


def test_the_best_bf16_mfu_by_the_datasheet_is_taken_over_that_points_own_ceiling(tmp_path):
    """The benchmarking section's "by the datasheet" figure is the best point's rate over the datasheet's peak:
    its MFU times the ceiling it was set against (its own job's product), not matmul_peak's from another job."""
    import random

    root = Path(__file__).parent.parent
    dirs = [root / "results" / "sections" / name for name in SECTIONS]
    if not all((d / "context.json").is_file() for d in dirs):
        pytest.skip("the committed sections are not all here")
    contexts = {d.name: json.loads((d / "context.json").read_text()) for d in dirs}
    best = contexts["benchmarking"].get("best_mfu_by_dtype", {}).get("bf16")
    if best is None or not contexts["leaderboard"].get("peak_tflops"):
        pytest.skip("no bf16 MFU or no datasheet peak in the committed sections")
    best.update(pct=random.uniform(20.0, 60.0), ceiling=random.uniform(600.0, 800.0), own_ceiling=True)
    text = render_markdown(sections(tmp_path, contexts), TEMPLATES, tmp_path / "writeup" / "report.md")
    by_datasheet = best["pct"] * best["ceiling"] / contexts["leaderboard"]["peak_tflops"]
    assert f"{best['ceiling']:.0f} TFLOP/s in the best point's own job" in text
    assert f"so by the datasheet the bf16 best here is\n{by_datasheet:.1f} %" in text
