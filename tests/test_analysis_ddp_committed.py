"""The ddp section built from the committed result files, against what a hostile reading of section 6 found:
each test holds one statement of the section to what the results show (the numbers in the comments are the
committed results', read once by hand; the tests compute them)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from cs336sys import report
from cs336sys.analysis import ddp, ddp_allreduce
from cs336sys.analysis.context import as_json

REPO = Path(__file__).resolve().parents[1]


def _inputs() -> list[Path]:
    """What the section rule gives: the result files of its experiments and the traces' rendered folders."""
    results = [p for pattern in ("allreduce/*/*.json", "ddp_step/*/*.json", "ddp_trace/*.json")
               for p in sorted((REPO / "results").glob(pattern))]
    folders = sorted(p for p in (REPO / "results" / "ddp_trace").glob("*") if p.is_dir())
    return results + folders


@pytest.fixture(scope="module")
def committed(tmp_path_factory):
    """The context as the rule makes it (the configuration's all-reduce reference with it), and its text."""
    if not (REPO / "results" / "ddp_step").is_dir():
        pytest.skip("no committed DDP results")
    reference = yaml.safe_load((REPO / "config" / "main.yaml").read_text())["main"]["allreduce"]["reference"]
    out = tmp_path_factory.mktemp("ddp")
    ctx = as_json(ddp.build(_inputs(), out, allreduce_reference=reference))
    ctx = json.loads(json.dumps(ctx, default=str)) | {"result_counts": {}}
    text = report.render_section("ddp", ctx, REPO / "writeup" / "templates")
    main, appendix = text.split("Distributed data parallel: every table", 1)
    return ctx, main, appendix, reference


def _jobs(ctx: dict) -> dict[str, dict]:
    return {j["name"]: j for j in ctx["ddp_jobs"]}


def _rows(text: str, key: str) -> dict[str, list[str]]:
    """A rendered table's rows by their first cell."""
    table = text.split(f'<a id="tbl-{key}"></a>')[1].split("\n\n")[1]
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in table.splitlines()[2:] if line.startswith("|")]
    return {c[0]: c for c in cells}


# --- 1. all-reduce: which curves rise, where the fit supports a latency, the cross-host ratio ---------------

def test_the_curves_that_do_not_rise_at_every_size_are_named(committed):
    """Which curves the prose calls rising follows every step in size, not the two ends, and the curves that
    do not rise are named with their bus bandwidths (the branches on data made for them:
    tests/test_analysis_ddp.py::test_the_curves_by_shape_in_the_prose)."""
    ctx, main, _, _ = committed
    facts = {f["label"]: f for f in ctx["allreduce_facts"]}
    for label, f in facts.items():
        assert f["rises"] == all(b > a for a, b in zip(f["busbw"], f["busbw"][1:], strict=False)), label
    shape = ctx["allreduce_shape"]
    assert [c["label"] for c in shape["not_rising"]] == [k for k, f in facts.items() if not f["rises"]]
    assert shape["rising"] == [k for k, f in facts.items() if f["rises"]]
    if not shape["not_rising"]:
        assert "Bus bandwidth rises at every step in size on every curve." in main
    for c in shape["not_rising"]:
        said = ", ".join(report._num(b, 2) for b in c["busbw"])
        assert f"{c['label']} ({said} GB/s)" in main


def test_the_latency_explanation_only_where_the_fit_finds_a_fixed_cost(committed):
    """The latency sentence names the curves whose fit puts at least half the smallest size's time in o, and
    only those; the others are said to have no fixed cost (o = 0) or a smaller one."""
    ctx, main, _, _ = committed
    fits, shape = ctx["allreduce_fits"], ctx["allreduce_shape"]
    facts = {f["label"]: f for f in ctx["allreduce_facts"]}
    for label, f in facts.items():
        share = f["o_share"] or 0.0
        fit = fits[f"{f['backend']}-{f['world']}"]
        assert (label in shape["no_fixed_cost"]) == (fit["o_s"] == 0), label
        assert (label in shape["latency_bound"]) == (share >= ddp_allreduce.LATENCY_BOUND_SHARE), label
    assert "nccl with 2 ranks" in shape["latency_bound"]
    said = main.split("the fit puts most of the smallest size's time in $o$")[0].rsplit("For ", 1)[1]
    assert all(label in said for label in shape["latency_bound"])
    assert not any(label in said for label in shape["no_fixed_cost"] + shape["some_fixed_cost"])
    if shape["no_fixed_cost"]:
        assert f"for {', '.join(shape['no_fixed_cost'])} it finds no fixed cost" in main
    if shape["some_fixed_cost"]:
        assert f"for {', '.join(shape['some_fixed_cost'])} its $o$ is under half the smallest size's time" in main


def test_nccl_over_gloo_is_said_across_hosts_and_rounded(committed):
    ctx, main, _, _ = committed
    c = ctx["allreduce_compare"]["nccl_over_gloo"]
    assert c["other_host"] and c["rounded"] == float(f"{c['ratio']:.2g}")  # 424.9 -> 420
    assert f"about {c['rounded']:g}× the bus bandwidth of gloo on the CPU-only host" in main
    assert f"{c['ratio']:.1f}×" not in main and "comparison of hosts as much as of backends" in main


# --- 2. the all-reduce target's reference: measured outside the pipeline, shown beside the measured value ----

def test_the_reference_is_said_to_come_from_outside_the_pipeline_and_shown_in_its_table(committed):
    ctx, main, appendix, reference = committed
    [row] = [r for r in ctx["summary"] if r["part"].startswith("NCCL")]
    assert "measured outside the pipeline" in row["target"] and row["met"] is True
    assert "no result file holds" in main and reference["source"] in main and "`allreduce.reference`" in main
    rows = _rows(appendix, "ddp-allreduce-target")
    for world, gbps in reference["busbw_gbps"].items():
        t = next(t for t in ctx["allreduce_targets"] if str(t["world"]) == world)
        assert rows[world][2] == f"{gbps:.0f}" and rows[world][3] == f"{100 * t['busbw'] / gbps:.0f}% ✓"
        assert t["reference_ok"] == (t["busbw"] >= ddp.ALLREDUCE_REFERENCE_SHARE * gbps)
    assert "NCCL alone, outside the pipeline (GB/s)" in appendix


# --- 3 and 4. scaling: a cost inside its rounds' spread, no ratio across jobs, the step without communication --

def test_a_communication_cost_inside_its_rounds_spread_is_within_noise(committed):
    ctx, main, _, _ = committed
    xl = next(sc for sc in ctx["ddp_scaling"] if sc["label"] == "xl, bf16")
    job = _jobs(ctx)["xl-bf16-ws2"]["variants"]
    diffs = [f - n for f, n in zip(job["flat"]["round_ms"], job["none"]["round_ms"], strict=True)]
    two = next(f for f in xl["flat"] if f["world"] == 2)
    assert (two["lo"], two["hi"]) == pytest.approx((min(diffs), max(diffs)))  # -3.9 .. 74.4 ms
    assert two["within_noise"] and two["ms"] < two["predicted_ms"]  # 24.4 ms, below the ring's 25.2
    assert not next(f for f in xl["flat"] if f["world"] == 4)["within_noise"]
    assert "24.4 ms at 2 ranks, within noise" in main
    assert "from the fewest ranks to the most" not in main and "flat_growth" not in xl


def test_rank_counts_measured_in_different_jobs_are_named_and_not_divided(committed):
    ctx, main, _, _ = committed
    b27 = next(sc for sc in ctx["ddp_scaling"] if sc["label"] == "2.7B, bf16")
    assert b27["jobs_differ"] and [j["rounds"] for j in b27["jobs"]] == [1, 3]
    said = "".join(f"{j['world']} ranks: {j['rounds']} round{'s' if j['rounds'] != 1 else ''} on {j['dates'][0]}; "
                   for j in b27["jobs"]).removesuffix("; ")
    assert f"For 2.7B, bf16 ({said})" in main and "no ratio is taken across them" in main


def test_the_step_without_communication_across_rank_counts_is_within_the_between_job_spread(committed):
    ctx, main, _, _ = committed
    na = ctx["ddp_none_across"]
    assert na["within"] == ["xl, bf16", "2.7B, bf16"] and not na["beyond"]
    b = na["between"]  # the same xl, bf16 2-rank step in the host series' job and the grid's: 226.3, 291.1 ms
    host = next(h for h in ctx["ddp_host_jobs"] if (h["size"], h["dtype"], h["world_size"], h["proxy"])
                == ("xl", "bf16", 2, False))
    assert b["label"] == "xl, bf16" and b["ms"] == pytest.approx(sorted([host["none_ms"],
                                                                         _jobs(ctx)["xl-bf16-ws2"]["none_ms"]]))
    xl = next(sc for sc in ctx["ddp_scaling"] if sc["label"] == "xl, bf16")
    assert xl["none"]["change"] < b["spread"]  # 5 % between rank counts, 29 % between two jobs
    assert "launch-bound" not in main and "host's share" not in main
    assert f"took {b['ms'][0]:.1f} and {b['ms'][1]:.1f} ms" in main


# --- 5. overlap: one verdict per job, the same in the table, the summary and the conclusions ------------------

def test_a_ratio_two_jobs_disagree_on_is_not_reproducible_not_missed(committed):
    ctx, main, _, _ = committed
    t = _jobs(ctx)["xl-bf16-ws2"]["targets"]["overlap"]
    [other] = t["other_jobs"]  # the host series' 2-rank job: 273.1 / 281.7 ms
    assert other["hi"] < t["lo"] and t["reproduced"] is False and t["ok"] == "noise"
    assert _rows(main, "ddp-targets")["xl, bf16, 2 ranks"][4].endswith("≈†")
    assert f"{other['ratio']:.3f} ({other['lo']:.3f}–{other['hi']:.3f}) in the host series' job" in main
    assert _jobs(ctx)["xl-bf16-ws2"]["missed"] is None  # not listed among the jobs that miss a target
    assert "Between jobs a ratio moves" not in main  # no 4-rank ratio set against a 2-rank job


def test_the_summary_rows_mark_each_job_as_the_targets_table_does(committed):
    ctx, main, _, _ = committed
    table = _rows(main, "ddp-targets")
    for name, column in (("Bucketed", 3), ("Overlapped", 4)):
        [row] = [r for r in ctx["summary"] if r["part"].startswith(name)]
        marks = re.findall(r"× ([✓✗≈]) \(([^,]+?)(?: bf16)?, (\d) GPUs", row["result"])
        assert len(marks) == 3
        for mark, size, world in marks:
            assert table[f"{size}, bf16, {world} ranks"][column].rstrip("†").endswith(mark), (name, size, world)
    [overlap] = [r for r in ctx["summary"] if r["part"].startswith("Overlapped")]
    assert overlap["met"] is False and "1.13× ≈ (xl bf16, 4 GPUs)" in overlap["result"]
    assert "not reproducible" in overlap["result"]


def test_the_conclusions_list_the_rows_with_the_tables_marks(tmp_path, committed):
    ctx, _, _, _ = committed
    section = tmp_path / "sections" / "ddp"
    section.mkdir(parents=True)
    (section / "context.json").write_text(json.dumps(ctx))
    text = report.render_markdown([section], REPO / "writeup" / "templates", tmp_path / "writeup" / "report.md")
    conclusions = text.split("Conclusions and limitations")[-1]
    missed = conclusions.split("**Targets missed.**")[1].split("**Within the noise.**")[0]
    noise = conclusions.split("**Within the noise.**")[1].split("**Not measured")[0]
    assert "Overlapped DDP" in missed and "1.13× ≈ (xl bf16, 4 GPUs)" in missed and "1.14× ✗ (2.7B bf16" in missed
    assert "Bucketed DDP" in noise and "Bucketed DDP" not in missed


# --- 6. the bucket size: chosen on other rounds than it is judged on; clocks only where recorded -----------------

def test_the_bucket_size_is_judged_on_rounds_it_was_not_chosen_on(committed):
    ctx, main, _, _ = committed
    jobs = _jobs(ctx)
    t = jobs["xl-bf16-ws2"]["targets"]["bucketed"]
    v = jobs["xl-bf16-ws2"]["variants"]
    assert t["bucket_mb"] == 5000.0 and t["picks"] == [5000.0, 5000.0, 1000.0] and t["held_out"]
    per_round = [v[f"bucketed-{p:g}MB"]["round_ms"][r] / v["torch_ddp-25MB"]["round_ms"][r]
                 for r, p in enumerate(t["picks"])]
    assert (t["lo"], t["hi"]) == pytest.approx((min(per_round), max(per_round)))  # 0.884 .. 1.110
    assert t["ok"] == "noise"  # the fastest size judged on its own rounds read 0.905 (0.884-0.924) ✓
    assert jobs["xl-bf16-ws4"]["targets"]["bucketed"]["ok"] is True
    assert _rows(main, "ddp-targets")["xl, bf16, 2 ranks"][2] == "5000, 5000, 1000"
    [row] = [r for r in ctx["summary"] if r["part"].startswith("Bucketed")]
    assert row["met"] == "noise" and "size chosen on the others" in row["part"]
    assert "judged on the rounds that chose it, would be favoured by their noise" in main


def test_a_sweep_brackets_its_optimum_only_beyond_the_noise(committed):
    ctx, main, _, _ = committed
    for name in ("xl-bf16-ws4", "2.7B-bf16-ws4"):  # 5000 MiB within the rounds' noise of 1000 MiB
        b = _jobs(ctx)[name]["answers"]["buckets"]
        assert b["best_mb"] == 1000.0 and not b["brackets"] and not b["runner_up"]["distinct"]
    assert "there the sweep brackets the optimum" not in main


def test_the_clock_sentence_covers_only_the_jobs_that_record_clocks(committed):
    ctx, main, _, _ = committed
    assert ctx["ddp_no_clocks"] == ctx["ddp_one_round"] == ["xl, fp32, 2 ranks", "2.7B, fp32, 2 ranks",
                                                            "2.7B, bf16, 2 ranks"]
    assert "Every variant's timed steps ran at SM clocks" not in main
    assert ("In the jobs that record SM clocks, every variant ran within 30 MHz of the reference's, round by round; "
            "xl, fp32, 2 ranks; 2.7B, fp32, 2 ranks; 2.7B, bf16, 2 ranks record none.") in main


# --- 7. the traces: what the profiled steps show, and that they order the variants otherwise ------------------

def test_the_trace_prose_says_what_the_profiled_steps_show(committed):
    ctx, main, _, _ = committed
    v, o = ctx["trace_verdict"], ctx["trace_order"]
    rows = {r["variant"]: r for r in ctx["trace_rows"]}
    assert [x["label"] for x in v["longer_than_naive"]] == ["overlap"]  # 529.4 ms against naive's 453.9
    assert [x["label"] for x in v["more_exposed_than_naive"]] == ["bucketed, 100 MiB"]  # 98.6 ms against 92.1
    assert rows["overlap"]["span_ms"] > rows["naive"]["span_ms"]
    ratios = [f["ratio"] for f in ctx["trace_vs_bench"]]
    assert o["slowdown"] == pytest.approx([min(ratios), max(ratios)])  # 1.55 .. 1.97
    assert o["differs"] and o["profiled"][-1] == "overlap" and o["benchmark"][0] == "overlap"
    assert f"takes {rows['overlap']['span_ms']:.1f} ms against naive's {rows['naive']['span_ms']:.1f}" in main
    assert f"Profiling lengthens the step {min(ratios):.2f}× to {max(ratios):.2f}×" in main
    assert "not which variant is faster" in main
