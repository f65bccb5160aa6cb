"""The analysis layer on synthetic results: sections build the tables and context their templates
read, and a failed build leaves no half-made section directory."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
import typing

import pytest

from cs336sys import registry
from cs336sys.analysis import precision
from cs336sys.analysis.context import SectionContext, as_json
from cs336sys.results import write_result


def test_precision_section_tables_come_from_the_results(tmp_path):
    acc = write_result(tmp_path / "r" / "acc.json", "mixed_precision_accumulation", {"device": "cpu"},
                       {"n": 1000, "value": 0.01, "exact": 10.0,
                        "values": {"fp32 += fp32": 10.0001, "fp16 += fp16": 9.953},
                        "abs_error": {"fp32 += fp32": 1e-4, "fp16 += fp16": 0.047},
                        "fp16_of_value": 0.01000213623046875, "fp16_mantissa_bits": 10,
                        "fp16_spacing_from": 8.0, "fp16_spacing": 0.0078125})
    write_result(tmp_path / "r" / "bf16.json", "autocast_dtypes", {"autocast_dtype": "bf16", "device": "cpu"},
                 {"dtypes": {"parameters": "float32", "logits": "bfloat16"}})
    out = tmp_path / "out"
    out.mkdir()
    ctx = precision.build(sorted((tmp_path / "r").glob("*.json")), out)
    assert ctx.accumulation == acc["metrics"]["values"] and ctx.exact == 10.0
    table = (out / "accumulation.csv").read_text().splitlines()
    assert table[0].startswith("loop,result,error vs 10") and len(table) == 3
    assert ctx.autocast == {"bf16": {"parameters": "float32", "logits": "bfloat16"}}
    assert "| logits | bfloat16 |" in (out / "autocast_dtypes.md").read_text()


def test_precision_section_without_results_is_empty_not_an_error(tmp_path):
    ctx = precision.build([], tmp_path)
    assert ctx.tables == {} and ctx.env == {}
    assert as_json(ctx) == {"env": {}, "tables": {}}  # the parts without results are absent, not None


def _analysis(*args):
    return subprocess.run([sys.executable, "-m", "cs336sys.analysis", *args], capture_output=True, text=True)


def test_analysis_command_writes_the_context_and_counts_results(tmp_path):
    r = tmp_path / "autocast-fp16.json"
    write_result(r, "autocast_dtypes", {"autocast_dtype": "fp16", "device": "cpu"}, {"dtypes": {"loss": "float32"}})
    proc = _analysis("precision", "--results", str(r), "--out", str(tmp_path / "sec"))
    assert proc.returncode == 0, proc.stderr
    ctx = json.loads((tmp_path / "sec" / "context.json").read_text())
    assert ctx["result_counts"] == {"autocast_dtypes": 1}


@pytest.mark.parametrize("bad", ["{not json", '{"kind": 1}'])
def test_a_failed_section_build_leaves_the_old_section_untouched(tmp_path, bad):
    out = tmp_path / "sec"
    out.mkdir()
    (out / "context.json").write_text('{"old": true}')
    r = tmp_path / "broken.json"
    r.write_text(bad)
    proc = _analysis("precision", "--results", str(r), "--out", str(out))
    assert proc.returncode != 0
    assert json.loads((out / "context.json").read_text()) == {"old": True}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["broken.json", "sec"]  # no temporary left


@pytest.mark.parametrize("section", sorted(registry.SECTIONS))
def test_every_section_returns_its_typed_context_and_builds_from_no_results(section, tmp_path):
    """Each section's build returns a dataclass deriving SectionContext (its fields are what the template
    reads), and with no results at all it builds one, not an error."""
    module = importlib.import_module(registry.section(section).module)
    returned = typing.get_type_hints(module.build)["return"]
    assert isinstance(returned, type) and issubclass(returned, SectionContext), section
    ctx = module.build([], tmp_path)
    assert isinstance(ctx, returned) and ctx.env == {}
    json.dumps(as_json(ctx))  # what `python -m cs336sys.analysis` writes


@pytest.mark.parametrize("value, digits, text", [(-0.003, 0, "0%"), (-0.0004, 1, "0.0%"), (-0.006, 0, "-1%"),
                                                 (0.25, 0, "25%")])
def test_a_share_that_rounds_to_zero_has_no_sign(value, digits, text):
    # a smoke grid on a CPU measured a communication share of -0.3 %: the table printed "-0%"
    from cs336sys.analysis.formatting import percent
    assert percent(value, digits) == text


@pytest.mark.parametrize("value, digits, thousands, text", [(-0.04, 1, False, "0.0"), (-0.4, 0, True, "0"),
                                                            (-0.4, 1, False, "-0.4"), (-1234.5, 0, True, "-1,234")])
def test_a_number_that_rounds_to_zero_has_no_sign(value, digits, thousands, text):
    from cs336sys.analysis.formatting import fixed
    assert fixed(value, digits, thousands=thousands) == text


def test_the_templates_number_filter_prints_no_minus_zero():
    from cs336sys.report import _num
    assert (_num(-0.001, 1), _num(-0.3, 1), _num(-1234.5, 1)) == ("0.0", "-0.3", "-1,234")


@pytest.mark.parametrize("value, digits, text", [
    (50.765, 3, "50.77"), (1.0, 4, "1.000"), (2048.0, 2, "2,048"), (142506.0, 1, "142,506"), (9.9996, 3, "10.00"),
    (0.01000214, 8, "0.01000"), (0.5, 2, "0.50"), (3.14159, 2, "3.14"), (25302, 0, "25,302"), (0.0, 3, "0.000")])
def test_the_number_filter_prints_at_most_four_significant_digits_of_a_measured_value(value, digits, text):
    # issue 60: prose printed "50.765 GiB", "1.0000×" and a raw "25301.7106024295"; counts print whole
    from cs336sys.report import _num
    assert _num(value, digits) == text


def test_distinct_names_say_what_kernels_of_one_template_do():
    """Three elementwise kernels of one template read alike once compacted: each keeps the identifier that
    only it has (its functor), so the prose that names them tells them apart."""
    from cs336sys.analysis.kernel_names import distinct_names

    names = ["elementwise_kernel<128, 2, gpu_kernel_impl_nocast<BinaryFunctor<float, …",
             "elementwise_kernel<128, 2, gpu_kernel_impl_nocast<masked_fill_kernel(Te…",
             "elementwise_kernel<128, 2, gpu_kernel_impl_nocast<direct_copy_kernel_cu…"]
    assert distinct_names(names, 60) == ["elementwise_kernel<BinaryFunctor>", "elementwise_kernel<masked_fill_kernel>",
                                         "elementwise_kernel<direct_copy_kernel_cu>"]


def test_a_column_of_numbers_some_in_bold_is_right_aligned():
    """Table 19's fastest bucket sizes are bold: a column mostly of bold numbers is still a column of numbers."""
    import pandas as pd

    from cs336sys.analysis.common import markdown_table

    table = markdown_table(pd.DataFrame({"job": ["a", "b", "c"], "1000 MiB": ["**738.6**", "313.6", "**350.2**"]}))
    assert table.splitlines()[1] == "|:---|---:|"
