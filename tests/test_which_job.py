"""`python -m cs336sys.whichjob which PATH` / `rule RULE` (cs336sys.whichjob) on the committed results: a
result names its rule, experiment and point; rule -> files -> which gives the rule back; a path no
rule makes and an unknown rule are errors with exit status 2; a changed code hash makes a result
stale with the reason in words. One parse of the workflow serves most tests (a few seconds each)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from cs336sys import codehash, knobs, provenance, whichjob
from cs336sys.whichjob import model

REPO = Path(__file__).resolve().parent.parent
PROXY = "results/fsdp_step/2.7B-proxy/ours-bf16-layer.json"
PEAK = "results/matmul_peak/bf16.json"


@pytest.fixture(scope="module")
def wf() -> Iterator[whichjob.Workflow]:
    with whichjob.Workflow(REPO) as w:
        yield w


def test_a_result_names_its_rule_experiment_and_point(wf):
    proxy, peak = wf.which([PROXY, PEAK])
    assert proxy["rule"] == "fsdp_step_2_7B_proxy"
    assert proxy["experiment"] == "fsdp_step" and proxy["kind"] == "experiment"
    assert proxy["point"]["unit"] == "layer" and proxy["point"]["single_rank_proxy"] is True
    assert proxy["point_index"] == 0 and proxy["points"] == 2
    assert any(place.startswith("workflow/rules/sharding.smk:") for place in proxy["registered_in"])
    assert proxy["exists"] and proxy["up_to_date"]
    assert peak["rule"] == "matmul_peak" and peak["experiment"] == "matmul_peak"
    assert peak["point"]["dtype"] == "bf16"
    # the point is what the rule passes, and what the file records it ran
    assert provenance.recorded_hash(PEAK) in peak["made_with"]


def test_a_folder_lists_the_rules_with_files_in_it(wf):
    peak, fsdp = wf.which(["results/matmul_peak", "results/fsdp_step/"])
    assert peak["folder"] and [r["rule"] for r in peak["rules"]] == ["matmul_peak"]
    assert {r["experiment"] for r in fsdp["rules"]} == {"fsdp_step"}
    assert {"fsdp_step_2_7B_ws2", "fsdp_step_2_7B_proxy"} <= {r["rule"] for r in fsdp["rules"]}


def test_sections_report_logs_and_timing_records_name_their_rule(wf):
    section, report, log, timing = wf.which(
        ["results/sections/precision", "writeup/report.pdf", "logs/matmul_peak.log", "benchmarks/matmul_peak.tsv"])
    assert (section["rule"], section["kind"], section["section"]) == ("precision_section", "section", "precision")
    assert (report["rule"], report["kind"]) == ("report_pdf", "report")
    assert (log["rule"], log["role"]) == ("matmul_peak", "log")
    assert (timing["rule"], timing["role"]) == ("matmul_peak", "benchmark")
    inside = next(p for p in (REPO / "results/sections/precision").iterdir() if p.is_file())
    (entry,) = wf.which([str(inside)])
    assert entry["rule"] == "precision_section" and entry["in"] == "results/sections/precision"


@pytest.mark.parametrize("rule", ["matmul_peak", "fsdp_step_2_7B_proxy", "fsdp_trace", "precision_section",
                                  "report_markdown"])
def test_rule_to_files_to_which_gives_the_rule_back(wf, rule):
    d = wf.rule_outputs(rule)
    assert d["rule"] == rule and d["outputs"]
    back = wf.which([o["path"] for o in d["outputs"]])
    assert {e["rule"] for e in back} == {rule}
    if d["kind"] == "experiment":
        results = [o for o in d["outputs"] if o["role"] == "result"]
        assert [o["point_index"] for o in results] == list(range(d["points"]))


def test_unknown_path_and_rule_are_clear_errors(wf):
    (entry,) = wf.which(["results/matmul_peak/bf17.json"])
    assert "no rule makes results/matmul_peak/bf17.json" in entry["error"] and PEAK in entry["error"]
    with pytest.raises(whichjob.Unknown, match="holds no such file"):
        wf.locate("results/sections/precision/no-such-table.csv")
    with pytest.raises(whichjob.Unknown, match="did you mean matmul_peak"):
        wf.rule("matmul_pek")
    with pytest.raises(whichjob.Unknown, match="is an experiment, not a rule; its rules: .*fsdp_step_2_7B_proxy"):
        wf.rule("fsdp_step")


def test_the_command_line_exits_2_for_an_unknown_path_or_rule(capsys):
    assert whichjob.main(["rule", "matmul_pek"]) == 2
    assert "did you mean matmul_peak" in capsys.readouterr().err
    proc = subprocess.run([sys.executable, "-m", "cs336sys.whichjob", "which", PEAK, "results/nowhere.json"], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert "rule        matmul_peak" in proc.stdout
    assert "error: no rule makes results/nowhere.json" in proc.stderr


def test_a_changed_code_hash_is_reported_stale_with_the_reason(monkeypatch):
    real = codehash.code_hash
    function = "cs336sys.peak:run_point"
    monkeypatch.setattr(codehash, "code_hash", lambda *e: "0123456789abcdef" if e[:1] == (function,) else real(*e))
    with whichjob.Workflow(REPO) as w:
        peak, section = w.which([PEAK, "results/sections/benchmarking"])
        rule = w.rule_outputs("matmul_peak")
    assert peak["status"] == "stale" and not peak["up_to_date"]
    assert "params have changed" in peak["why"][0]
    made = provenance.recorded_hash(PEAK)
    assert f"code: made with {made}, the rule now passes 0123456789abcdef" in peak["why"]
    # the code is the same by today's rule, and this says so rather than inventing a change
    assert any("whose code is the same by the current rule" in line or "git history" in line for line in peak["why"])
    assert section["status"] == "stale" and "inputs to be re-made first, by: matmul_peak" in section["why"]
    assert not rule["up_to_date"] and {o["status"] for o in rule["outputs"] if o["role"] == "result"} == {"stale"}
    assert "stale" in whichjob.render_rule(rule)


def test_the_recorded_point_and_its_difference():
    rec = provenance.record(PEAK)
    point = model._recorded_point(rec, PEAK)
    assert point is not None and point["dtype"] == "bf16"
    assert "n" not in point  # the record holds the point less its defaults (knobs.without_defaults)
    full = knobs.with_defaults("matmul_peak", point)
    assert model._point_diff(full, {**full, "n": 4096}) == [f"n: {full['n']} -> 4096"]


def test_each_result_lies_in_its_experiments_folder_and_its_jobs(wf):
    """results/<experiment>/<job>/... (results/<experiment>/... for an experiment's only job)."""
    jobs = wf.snakemake.globals["EXPERIMENT_JOBS"]
    assert jobs
    for job in jobs:
        folder = f"results/{job.experiment}/" + (f"{job.job}/" if job.job else "")
        assert all(r.startswith(folder) for r in job.results), (job.rule, folder, job.results[:2])
