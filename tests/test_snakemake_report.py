"""Snakemake's own report and linter: `snakemake --report` holds every numbered table and figure of the
rendered writeup, with its caption, section and provenance; `snakemake --lint` says nothing but the
conda/container lint; the rule files are as snakefmt formats them."""

from __future__ import annotations

import html
import importlib.util
import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path
from types import SimpleNamespace

import jinja2
import pytest
from docutils.core import publish_parts

from cs336sys import registry
from cs336sys.writeup import items, unnumbered

REPO = Path(__file__).resolve().parent.parent

REPORT = """# Title

## Summary

<a id="tbl-summary"></a>**Table 1.** The headline, see [Table 2](#tbl-times).

| part | result |
|:---|---:|
| a | 1 |

## 1 Benchmarking the model

### 1.1 (b) Times

<a id="tbl-times"></a>**Table 2.** Time per step (ms), `eager`, **one** H100.

| size | ms |
|:---|---:|
| small | 2.50 |

![Figure 1](../results/sections/benchmarking/warmup.png)

<a id="fig-warmup"></a>**Figure 1.** Step times from a cold start.

### 1.2 Laid out by the template

<a id="tbl-targets"></a>**Table 3.** Targets (✓ met).

| size | ok |
|:---|:---:|
| small | ✓ |

<!-- appendix -->

## B Benchmarking: every point

<a id="tbl-all"></a>**Table 4.** Every point.

| size | ms |
|:---|---:|
| small | 2.50 |
| large | 9.00 |
"""


def write_sections(root: Path) -> list[Path]:
    bench = root / "results" / "sections" / "benchmarking"
    bench.mkdir(parents=True)
    (bench / "timing.md").write_text("| size | ms |\n|:---|---:|\n| small | 2.50 |\n")
    (bench / "timing.csv").write_text("size,ms\nsmall,2.5\n")
    (bench / "all_points.md").write_text("| size | ms |\n|:---|---:|\n| small | 2.50 |\n| large | 9.00 |\n")
    (bench / "warmup.png").write_bytes(b"\x89PNG")
    (root / "writeup").mkdir()
    (root / "writeup" / "report.md").write_text(REPORT)
    return [bench]


def test_parse_finds_each_numbered_item_with_its_caption_and_heading():
    found = items.parse(REPORT)
    assert [(i.kind, i.number, i.key) for i in found] == [
        ("table", "1", "summary"), ("table", "2", "times"), ("figure", "1", "warmup"), ("table", "3", "targets"),
        ("table", "4", "all")]
    times = found[1]
    assert times.caption == "Time per step (ms), `eager`, **one** H100."
    assert times.heading == "1.1 (b) Times" and times.top == "1 Benchmarking the model" and not times.appendix
    assert times.body.splitlines()[-1] == "| small | 2.50 |"
    assert found[2].image == "../results/sections/benchmarking/warmup.png"
    assert found[4].appendix and found[4].heading == "B Benchmarking: every point"


def test_locate_finds_each_file_and_files_the_report_laid_out_under_their_section(tmp_path):
    dirs = write_sections(tmp_path)
    found = items.parse(REPORT)
    items.locate(found, tmp_path / "writeup" / "report.md", dirs)
    where = {i.key: (i.section, i.file, i.category) for i in found}
    bench = "1 Benchmarking the model"
    assert where == {
        "summary": (None, None, items.WRITEUP),  # under a heading with no section's file
        "times": ("benchmarking", "timing.csv", bench),  # the CSV beside the .md the report prints
        "warmup": ("benchmarking", "warmup.png", bench),
        "targets": ("benchmarking", None, bench),  # laid out by the template: its heading's section
        "all": ("benchmarking", "all_points.csv", bench),  # appendix items keep their section's category
    }


def render_caption(template: str, name: str, ext: str) -> str:
    """A caption as Snakemake's report renders it: Jinja with the file's wildcards, then reStructuredText."""
    snakemake = SimpleNamespace(wildcards=SimpleNamespace(name=name, ext=ext))
    rst = jinja2.Environment(trim_blocks=True, lstrip_blocks=True).from_string(template).render(snakemake=snakemake)
    return publish_parts(rst, writer_name="html")["body"]


def test_write_gives_each_file_its_caption_and_the_report_laid_tables_files_of_their_own(tmp_path):
    dirs = write_sections(tmp_path)
    out = tmp_path / "writeup" / "report_items"
    items.write(tmp_path / "writeup" / "report.md", dirs, out)
    assert sorted(p.name for p in (out / "tables").iterdir()) == ["summary.csv", "targets.csv"]
    assert (out / "tables" / "targets.csv").read_text() == "size,ok\nsmall,✓\n"
    template = (out / "benchmarking.rst").read_text()
    times = render_caption(template, "timing", "csv")
    assert "<b>Table 2.</b> Time per step (ms), <code>eager</code>, <b>one</b> H100." in times
    assert "<td align=right>2.50</td>" in times and "In the writeup: 1.1 (b) Times." in times
    assert "<b>Figure 1.</b> Step times from a cold start." in render_caption(template, "warmup", "png")
    assert "does not show" in render_caption(template, "timing", "png")  # another file of the folder
    summary = render_caption((out / "report.rst").read_text(), "summary", "csv")
    assert "<b>Table 1.</b> The headline, see Table 2." in summary  # links keep their text
    index = items.ReportIndex(str(out / "index.json"))
    assert index.subcategory("benchmarking", "timing.csv") == "1.1 (b) Times"
    assert index.labels("benchmarking", "warmup.png") == {"in the writeup": "Figure 1", "file": "warmup.png"}
    assert index.category(None, "targets.csv", "?") == "1 Benchmarking the model"
    assert index.category(None, "summary.csv", "?") == items.WRITEUP
    assert index.subcategory("benchmarking", "timing.png") == items.OTHER_FILES


def test_each_file_the_writeup_does_not_number_has_a_caption_of_its_own(tmp_path, monkeypatch):
    """A described file: what it is, the numbered table of the same name, where the report links it and the
    section that uses it; a file `unnumbered` does not describe gets the fallback and is listed as missing."""
    dirs = write_sections(tmp_path)
    bench = dirs[0]
    (bench / "timing.png").write_bytes(b"\x89PNG")  # a figure of Table 2's numbers, linked from 1.2
    (bench / "mystery.csv").write_text("a\n1\n")
    report = tmp_path / "writeup" / "report.md"
    report.write_text(REPORT.replace("### 1.2 Laid out by the template\n", "### 1.2 Laid out by the template\n\n"
                                     "As [a figure](../results/sections/benchmarking/timing.png).\n", 1))
    monkeypatch.setitem(unnumbered.UNNUMBERED, ("benchmarking", r"(tim)ing\.png"), "Times drawn, {0} first.")
    out = tmp_path / "out"
    found = items.write(report, dirs, out)
    template = (out / "benchmarking.rst").read_text()
    caption = render_caption(template, "timing", "png")
    assert "<b>timing.png</b> (not numbered in the writeup). Times drawn, tim first." in caption
    assert "Its numbers are in Table 2 (1.1 (b) Times)." in caption
    assert "The writeup links it under 1.2 Laid out by the template." in caption
    assert "section 1 Benchmarking the model" in caption and "<code>benchmarking_section</code>" in caption
    assert "does not describe yet" in render_caption(template, "mystery", "csv")
    numbered = {(i.section, i.file) for i in found}
    assert unnumbered.missing(dirs, numbered) == ["benchmarking/mystery.csv"]
    # a size in a file name (2_7B) is named as the report names it
    assert "for the 2.7B model" in unnumbered.description("sharding", "sharding_allocator_2_7B.csv")


def test_every_committed_section_file_is_numbered_or_described():
    """Every CSV and PNG of the committed sections gets its own caption in Snakemake's report: numbered in
    the committed writeup, or described in cs336sys.writeup.unnumbered (add a line there for a new file)."""
    dirs = [REPO / "results" / "sections" / s for s in registry.SECTIONS]
    found = items.parse((REPO / "writeup" / "report.md").read_text())
    items.locate(found, REPO / "writeup" / "report.md", dirs)
    assert unnumbered.missing(dirs, {(i.section, i.file) for i in found}) == []
    assert {s for s, _ in unnumbered.UNNUMBERED} <= set(registry.SECTIONS)
    # each line describes a committed file (a line whose file went away is dropped, not kept as dead text)
    for section, pattern in unnumbered.UNNUMBERED:
        files = unnumbered.section_files(REPO / "results" / "sections" / section)
        assert any(re.fullmatch(pattern, f) for f in files), f"{section}/{pattern} matches no committed file"


def test_a_figure_outside_the_section_folders_is_refused(tmp_path):
    dirs = write_sections(tmp_path)
    report = tmp_path / "writeup" / "report.md"
    report.write_text(REPORT.replace("../results/sections/benchmarking/warmup.png", "elsewhere/warmup.png"))
    try:
        items.write(report, dirs, tmp_path / "out")
    except ValueError as e:
        assert "figure 1" in str(e)
    else:
        raise AssertionError("a figure no rule makes was accepted")


def test_a_caption_that_cannot_be_quoted_is_refused():
    try:
        items.caption_template([("a.csv", "{% endraw %}")], "other")
    except ValueError as e:
        assert "a.csv" in str(e)
    else:
        raise AssertionError("a caption closing the raw block was accepted")


def report_results(zip_path: Path) -> tuple[dict, dict]:
    """The results and categories a Snakemake HTML report embeds as JSON."""
    with zipfile.ZipFile(zip_path) as z:
        page = z.read(next(n for n in z.namelist() if n.endswith("report.html"))).decode()

    def embedded(name: str) -> dict:
        return json.loads(re.search(rf"^\s*var {name} = (\{{.*\}});\s*$", page, re.M).group(1))

    return embedded("results"), embedded("categories")


def plain(text: str) -> str:
    """Caption text without markup, to compare the report's Markdown with the HTML report's caption."""
    text = re.sub(r"<[^>]+>", "", html.unescape(text)) if "<" in text else text
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    return " ".join(text.replace("`", "").replace("**", "").replace("*", "").split())


def test_snakemake_report_holds_every_numbered_table_and_figure_of_the_writeup(tmp_path):
    """Built from the committed results, as on a fresh clone (a few seconds: nothing runs)."""
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    proc = subprocess.run([sys.executable, "-m", "snakemake", "--report", str(tmp_path / "report.zip")], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results, categories = report_results(tmp_path / "report.zip")
    report = (REPO / "writeup" / "report.md").read_text()
    captioned = re.findall(r'^<a id="(?:tbl|fig)-[^"]+"></a>\*\*((?:Table|Figure) \d+)\.\*\* (.*)$', report, re.M)
    assert len(captioned) > 50
    by_label = {}
    for path, r in results.items():
        by_label.setdefault(r["labels"]["in the writeup"], []).append((path, r))
    sections = {s.rule for s in registry.SECTIONS.values()}
    titles = {h for h in re.findall(r"^## (\d+ .*)$", report, re.M)}
    for label, caption in captioned:
        assert len(by_label.get(label, [])) == 1, f"{label} is not in Snakemake's report once: {by_label.get(label)}"
        path, r = by_label[label][0]
        assert plain(caption) in plain(r["caption"]), f"{label}: the caption differs:\n{caption}\n{r['caption']}"
        category = next(c for c, subs in categories.items() for paths in subs.values() if path in paths)
        assert category in titles or category == items.WRITEUP, f"{label}: category {category!r}"
        if path.startswith("results/sections/"):
            assert r["job_properties"]["rule"] in sections and "code=" in r["job_properties"]["params"]
            assert f"{Path(path).parent.name}_section" == r["job_properties"]["rule"]
        else:
            assert path.startswith("writeup/report_items/tables/") and r["job_properties"]["rule"] == "report_markdown"
    # each figure is the very image the writeup shows
    for image, number in re.findall(r"^!\[Figure (?:\d+)\]\(\.\./([^)]+)\)\s*\n\n<a id=\"fig-[^\"]+\"></a>\*\*Figure "
                                    r"(\d+)\.", report, re.M):
        assert by_label[f"Figure {number}"][0][0] == image
    assert results["writeup/report.pdf"]["mime_type"] == "application/pdf"
    # every section folder's every CSV and PNG is there: numbered in the writeup, or listed as not numbered
    for s in registry.SECTIONS:
        for f in (REPO / "results" / "sections" / s).iterdir():
            if f.suffix in (".csv", ".png"):
                assert f"results/sections/{s}/{f.name}" in results
                caption = results[f"results/sections/{s}/{f.name}"]["caption"]
                assert "does not show" not in caption, f"{s}/{f.name} has the generic caption"  # its own, always


def load_lint_tool():
    spec = importlib.util.spec_from_file_location("snakemake_lint", REPO / "tools" / "snakemake_lint.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


LINT_TEXT = """Using workflow specific profile profiles/default for setting default command line arguments.
Lints for snakefile /w/workflow/rules/common.smk:
    * Environment variable PYTHONPATH used but not asserted with envvars directive in line 19.:
      Asserting existence of environment variables with the envvars directive
    * Mixed rules and functions in same snakefile.:
      Small one-liner functions used only once should be defined as lambda

Lints for rule matmul_peak (line 7, /w/workflow/rules/rules.smk):
    * Specify a conda environment or container for each rule.:
      This way, the used software for each specific step is documented, and the
"""


def test_the_lint_parser_reads_every_lint_of_snakemakes_text_output():
    tool = load_lint_tool()
    assert tool.lints(LINT_TEXT) == [
        ("snakefile /w/workflow/rules/common.smk",
         "Environment variable PYTHONPATH used but not asserted with envvars directive in line 19."),
        ("snakefile /w/workflow/rules/common.smk", "Mixed rules and functions in same snakefile."),
        ("rule matmul_peak", tool.ALLOWED),
    ]


def test_snakemake_lint_says_nothing_but_the_conda_lint():
    proc = subprocess.run([sys.executable, str(REPO / "tools" / "snakemake_lint.py")], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # the conda/container lint is there, once per rule that runs a command: the parser did read the output
    assert re.search(r"0 lint\(s\) to fix; (\d+) rule", proc.stdout) and int(
        re.search(r"; (\d+) rule", proc.stdout).group(1)) > 40


def test_rule_files_are_as_snakefmt_formats_them():
    """As .ci/run checks: `snakefmt Snakefile workflow/` (pyproject's [tool.snakefmt]) leaves them unchanged."""
    if importlib.util.find_spec("snakefmt") is None:
        pytest.skip("snakefmt is not installed (the dev extra installs it: pip install -e '.[dev]')")
    proc = subprocess.run([sys.executable, "-m", "snakefmt", "--check", "Snakefile", "workflow/"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, "run `snakefmt Snakefile workflow/`:\n" + proc.stdout + proc.stderr
