"""The parallelism-accounting report section: built with and without results, rendered alone as
`cs336sys.report` renders it (StrictUndefined, the `num` filter), and compiled to a PDF."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_accounting import synthetic_results

from cs336sys.analysis import accounting as section
from cs336sys.analysis.context import as_json
from cs336sys.report import render_section

TEMPLATES = Path(__file__).parent.parent / "writeup" / "templates"


@pytest.fixture(scope="module")
def fast_section():
    old = section.MODEL_CHECKS
    section.MODEL_CHECKS = (("tiny", 2, 16),)
    yield section
    section.MODEL_CHECKS = old


def _render(ctx: section.AccountingContext | dict) -> str:
    """The section with its appendix, as the report renders them (numbered, cross-referenced), from its
    context as `python -m cs336sys.analysis` saves it (JSON)."""
    return render_section("accounting", json.loads(json.dumps(as_json(ctx))), TEMPLATES)


def test_section_builds_and_renders_without_results(fast_section, tmp_path):
    ctx = fast_section.build([], tmp_path)
    json.dumps(as_json(ctx))  # the context is saved as JSON
    assert ctx.env == {} and not any(ctx.measured.values())
    assert ctx.model_checks_max_error == 0
    for name in ("ffn_bounds", "ffn_times_h100", "xxl_fsdp_devices", "checks_model", "checks_measured"):
        assert (tmp_path / f"{name}.csv").exists() and (tmp_path / f"{name}.md").exists()
    text = _render(ctx)
    assert r"N_{\mathrm{DP}} \leq \frac{B W}{C} + 1" in text
    assert "not yet measured" in text and "{{" not in text
    assert "25,302 tokens" in text  # communication_accounting (c), computed


def test_section_with_synthetic_results_fills_the_measured_column(fast_section, tmp_path):
    paths = synthetic_results(tmp_path / "results")
    out = tmp_path / "out"
    out.mkdir()
    ctx = fast_section.build(paths, out)
    assert all(ctx.measured.values())
    assert ctx.env["points"] == len(paths)
    measured = (out / "checks_measured.csv").read_text()
    assert "all-reduce 1 MiB, nccl, 2 ranks" in measured and "not yet measured" not in measured
    text = _render(ctx)
    assert "points (" in text and "| GB |" not in text and "| GiB |" in text  # memory in GiB, as in the rest


def test_template_renders_with_an_empty_context():
    assert "No results yet for this section: it has not been built" in _render({})


def test_rendered_section_converts_to_typst_and_compiles(fast_section, tmp_path):
    """Every formula is LaTeX that pandoc turns into Typst math and Typst accepts (the report's PDF path)."""
    pypandoc = pytest.importorskip("pypandoc")
    typst = pytest.importorskip("typst")
    md = tmp_path / "section.md"
    md.write_text(_render(fast_section.build([], tmp_path)))
    from cs336sys.writeup import typst as report_typst

    typ = tmp_path / "section.typ"
    typ.write_text(pypandoc.convert_text(report_typst.to_pandoc(md.read_text())[0], "typst",
                                         format=report_typst.READER, extra_args=["--standalone"]))
    assert typst.compile(str(typ))[:4] == b"%PDF"
