"""The profiling section built from the committed kernel_profile results: the prose names the kernels of its
table in the table's order and spelling, and the inference-against-training comparison is made over the points
where both modes ran, its direction and its exceptions read from them, not typed."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from cs336sys.analysis import profiling
from cs336sys.analysis.context import as_json
from cs336sys.analysis.kernel_names import compact_name
from cs336sys.report import render_section
from cs336sys.results import read_result
from cs336sys.writeup import lint

REPO = Path(__file__).resolve().parent.parent
TEMPLATES = REPO / "writeup" / "templates"


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    paths = sorted(REPO.glob("results/kernel_profile/**/*.json")) + sorted(REPO.glob("benchmarks/kernel_profile/*.tsv"))
    if not any(p.suffix == ".json" for p in paths):
        pytest.skip("no committed kernel_profile results")
    ctx = profiling.build(paths, tmp_path_factory.mktemp("profiling"))
    return paths, ctx, render_section("profiling", as_json(ctx), TEMPLATES)


def _shares(paths: list[Path]) -> dict[tuple[str, int, str], dict[str, float]]:
    """(size, context, mode) -> matmul and elementwise share (%) of the forward, the train step (the optimizer's
    kernels apart) and the train step's forward and backward alone, straight from the result files."""
    out = {}
    for p in paths:
        if p.suffix != ".json":
            continue
        r = read_result(p)
        if r["status"] != "ok":
            continue
        s, scopes = r["settings"], r["metrics"]["scopes"]
        scope = scopes["forward" if s["mode"] == "forward" else "train_step"]["by_class_us"]
        optimizer = sum(scopes["optimizer_step"]["by_class_us"].values()) if s["mode"] == "train_step" else 0.0
        total = sum(scope.values())
        row = {"matmul": 100 * scope.get("matmul", 0) / total,
               "elementwise": 100 * (scope.get("elementwise", 0) - optimizer) / total}
        if s["mode"] == "train_step":
            fb = scopes["forward+backward"]["by_class_us"]
            row["forward_backward"] = 100 * fb.get("matmul", 0) / sum(fb.values())
        out[(s["size"], s["context_length"], s["mode"])] = row
    return out


def test_the_prose_names_the_non_matmul_kernels_as_their_table_does(built):
    """Table 9's first row was `elementwise_kernel<masked_fill_kernel>` while the prose called the same kernel
    `elementwise_kernel<gpu_kernel_impl_nocast>` (its generic launcher): one ranking, one spelling."""
    _, ctx, text = built
    rows = [line.split(" | ")[0].strip("| `") for line in ctx.tables["non_matmul"].splitlines()[2:]]
    assert [k["name"] for k in ctx.non_matmul] == rows[:4]
    assert rows[0] == "elementwise_kernel<masked_fill_kernel>"
    assert "gpu_kernel_impl_nocast" not in text
    shares = [k["share"] for k in ctx.non_matmul]
    assert shares == sorted(shares, reverse=True)


def test_kernels_of_equal_time_are_ranked_by_name():
    rows = [{"name": "b", "total_us": 5.0}, {"name": "c", "total_us": 9.0}, {"name": "a", "total_us": 5.0}]
    assert [r["name"] for r in profiling.ranked(rows)] == ["c", "a", "b"]
    assert [r["name"] for r in profiling.ranked(rows[::-1])] == ["c", "a", "b"]


def test_a_launcher_template_is_not_taken_for_the_kernel():
    assert compact_name("elementwise_kernel<128, 2, gpu_kernel_impl_nocast<masked_fill_kernel(Te…", 60) \
        == "elementwise_kernel<masked_fill_kernel>"
    assert compact_name("vectorized_elementwise_kernel<4, CUDAFunctor_add<float>, array<char*, 3ul> >", 60) \
        == "vectorized_elementwise_kernel<CUDAFunctor_add>"


def test_inference_against_training_is_compared_over_the_points_where_both_ran(built):
    """The old text compared a mean over 30 forwards with one over 24 train steps and called the elementwise
    share falling (12.4 % to 11.7 %); over the 24 common points it rises (11.6 % to 11.7 %), and the matmul share
    rises at some points: the section counts them and names them."""
    paths, ctx, text = built
    shares = _shares(paths)
    both = [(size, c) for size, c, mode in shares if mode == "forward" and (size, c, "train_step") in shares]
    q = ctx.paired
    assert q["points"] == len(both) and q["unpaired"] == sum(m == "forward" for *_, m in shares) - len(both)
    f = [shares[(*k, "forward")]["matmul"] for k in both]
    t = [shares[(*k, "train_step")]["matmul"] for k in both]
    assert q["matmul"]["forward"]["mean"] == pytest.approx(statistics.fmean(f))
    assert q["matmul"]["train_step"]["mean"] == pytest.approx(statistics.fmean(t))
    assert q["falls"] == (statistics.fmean(t) < statistics.fmean(f))
    against = [k for k, a, b in zip(both, f, t, strict=True) if (b > a if q["falls"] else b < a)]
    assert sorted(q["exceptions"]) == sorted(f"{size} ctx {c}" for size, c in against)
    assert q["lower"] == sum(b < a for a, b in zip(f, t, strict=True))
    ef = statistics.fmean(shares[(*k, "forward")]["elementwise"] for k in both)
    et = statistics.fmean(shares[(*k, "train_step")]["elementwise"] for k in both)
    assert (q["elementwise"]["forward"]["mean"], q["elementwise"]["train_step"]["mean"]) == pytest.approx((ef, et))
    fb = statistics.fmean(shares[(*k, "train_step")]["forward_backward"] for k in both)
    assert q["matmul"]["forward_backward"]["mean"] == pytest.approx(fb)
    assert q["fb_keeps_forward_share"] == (fb >= statistics.fmean(f))
    # the text says what the pairing found, with the exceptions, and keeps no claim the data contradict
    if against:
        assert ", ".join(q["exceptions"]) in " ".join(text.split())
    assert "doubles the matmul work" not in text


def test_the_section_renders_with_nothing_the_lint_objects_to(built):
    _, _, text = built
    assert lint.problems(text) == []
