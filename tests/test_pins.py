"""Result pins: committed results kept across a code change that does not change what they measure.
Unit tests of the pins file and the provenance it reads, then the workflow on a copy of the repository
(the committed GPU results): an edit stales exactly its experiments' jobs, a pin holds them, pins=off
shows what the pins hold back, and a re-made result spends its pin."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path

import pytest
from test_workflow import scheduled

from cs336sys import pins

H1, H2, H3 = "0123456789abcdef", "fedcba9876543210", "00000000ffffffff"


def write_record(meta: Path, output: str, code: str, rule: str = "r") -> None:
    meta.mkdir(parents=True, exist_ok=True)
    name = base64.b64encode(output.encode()).decode().replace("/", "@")
    (meta / name).write_text(json.dumps({"rule": rule, "params": ["''", f"'{code}'", "'benchmarking'", "1"]}))


@pytest.mark.parametrize("text, said", [
    ("pins: [", "not valid YAML"),
    ("pins: {a: 1}", "a list under 'pins'"),
    ("pins:\n- {reason: x}", "needs 'rules'"),
    ("pins:\n- {rules: {r: " + H1 + "}}", "needs a 'reason'"),
    ("pins:\n- {rules: {r: abc}, reason: x}", "not 16 hex digits"),
    ("pins:\n- {rules: {r: " + H1 + "}, reason: x, colour: red}", "unknown key(s) ['colour']"),
    ("pins:\n- {rules: {r: " + H1 + "}, reason: x}", "'code' needs the hash"),
    ("pins:\n- {rules: {r: " + H1 + "}, code: {r: " + H2 + "}, reason: x}\n- {rules: {r: " + H2 + "}, code: {r: "
     + H1 + "}, reason: y}", "pinned twice"),
])
def test_a_malformed_pins_file_is_named(tmp_path, text, said):
    f = tmp_path / "pins.yaml"
    f.write_text(text)
    with pytest.raises(pins.PinError, match=said.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        pins.load(f)


def test_a_pin_holds_while_the_records_hold_its_hash(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    outs = ["results/x/a.json", "results/x/b.json"]
    for o in outs:
        Path(o).parent.mkdir(parents=True, exist_ok=True)
        Path(o).write_text("{}")
        write_record(Path(".snakemake/metadata"), o, H1)
    assert pins.recorded_hash(outs[0]) == H1
    pin = [pins.Pin(rules={"r": H1}, code={"r": H2}, reason="a message changed")]
    assert pins.state(H1, H2, outs, at=H2) == "effective" and pins.code_for("r", H2, outs, pin) == H1
    # the code changed again after the pin: the pin does not vouch for that change
    assert pins.state(H1, H3, outs, at=H2) == "outdated" and pins.code_for("r", H3, outs, pin) == H3
    pin[0].outputs = {"r": outs}
    assert pins.for_report(pin, {"r": H2}, experiment_of={"r": "precision"}) == [
        {"rules": ["r"], "what": "precision", "reason": "a message changed", "changes": ["a message changed"],
         "results_commit": "?", "pinned_at": "?"}]
    assert pins.for_report(pin, {"r": H1}) == []  # the code is back where the results were made
    assert pins.state(H1, H1, outs) == "unneeded" and pins.code_for("r", H1, outs, pin) == H1
    write_record(Path(".snakemake/metadata"), outs[1], H3)  # one result re-made with other code
    assert pins.state(H1, H2, outs) == "spent" and pins.code_for("r", H2, outs, pin) == H2
    Path(outs[0]).unlink()
    assert pins.state(H1, H2, outs) == "broken" and pins.code_for("r", H2, outs, pin) == H2
    assert pins.code_for("other", H2, outs, pin) == H2  # not pinned


def test_save_and_load_round_trip(tmp_path):
    f = tmp_path / "pins.yaml"
    p = pins.Pin(rules={"a": H1, "b": H2}, code={"a": H3, "b": H3}, reason="only the CLI changed", pinned_at="abc",
                 results_commit="def",
                 outputs={"a": ["results/a.json"]})
    pins.save([p], f)
    assert pins.load(f) == [p] and f.read_text().startswith("# Result pins")


def cli(repo: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cs336sys.pins", *args], cwd=repo, capture_output=True, text=True,
                          env={"PYTHONPATH": str(repo / "src"), "PATH": "/usr/bin:/bin"}, timeout=300)


@pytest.mark.slow(seconds=50)
def test_a_pin_keeps_committed_results_across_a_code_change(rerun_copy):
    repo = rerun_copy
    experiments = ("mixed_precision_accumulation", "autocast_dtypes")  # the jobs cs336sys.precision runs
    assert not scheduled(repo, "writeup/report.pdf") & set(experiments)
    before = pins.load(repo / "workflow" / "pins.yaml")
    code = repo / "src" / "cs336sys" / "precision.py"
    # a new import of another package: it runs that package's code, so both jobs count it
    code.write_text(code.read_text() + "\nimport yaml  # noqa: E402, F401\n")
    stale = {r for r in scheduled(repo, "writeup/report.pdf") if not r.endswith("_section")} - {
        "report_markdown", "report_pdf"}
    assert stale == set(experiments)  # exactly the jobs that import it

    bad = cli(repo, "add", "--experiments", "no_such_experiment", "--reason", "x")
    assert bad.returncode == 2 and "no_such_experiment" in bad.stderr and "Traceback" not in bad.stderr
    out = cli(repo, "add", "--experiments", *experiments, "--reason", "an import that changes nothing here")
    assert out.returncode == 0, out.stderr
    assert all(f"{r}: pinned to" in out.stdout for r in stale)
    assert pins.load(repo / "workflow" / "pins.yaml")[:len(before)] == before  # earlier pins kept
    assert not scheduled(repo, "writeup/report.pdf") & stale  # held
    assert scheduled(repo, "writeup/report.pdf", "--config", "pins=off") >= stale  # what the pins hold back
    assert "mixed_precision_accumulation: effective" in cli(repo, "list").stdout
    # a second edit of the same code is not what the pin vouched for: the jobs are stale again
    text = code.read_text()
    code.write_text(text + "\nimport jinja2  # noqa: E402, F401\n")
    assert scheduled(repo, "writeup/report.pdf") >= stale and "outdated" in cli(repo, "list").stdout
    code.write_text(text)

    # a re-made result (its record now holds other code) spends its pin: that job runs again
    rule = "autocast_dtypes"
    entry = pins.load(repo / "workflow" / "pins.yaml")[-1]
    meta = repo / ".snakemake" / "metadata" / base64.b64encode(entry.outputs[rule][0].encode()).decode()
    meta.write_text(meta.read_text().replace(entry.rules[rule], H3))
    assert rule in scheduled(repo, "writeup/report.pdf")
    assert f"{rule}: spent" in cli(repo, "list").stdout
    # the re-made results (all of the rule's) can be pinned in their turn: the spent pin gives the rule up
    for output in entry.outputs[rule][1:]:
        other = repo / ".snakemake" / "metadata" / base64.b64encode(output.encode()).decode()
        other.write_text(other.read_text().replace(entry.rules[rule], H3))
    again = cli(repo, "add", "--rules", rule, "--reason", "the re-made results, across the same change")
    assert f"{rule}: pinned to {H3}" in again.stdout, again.stdout + again.stderr
    assert [p.rules[rule] for p in pins.load(repo / "workflow" / "pins.yaml") if rule in p.rules] == [H3]
    assert f"{rule}: effective" in cli(repo, "list").stdout
    meta.write_text(meta.read_text().replace(H3, H2))  # re-made once more: spent again, and pruned
    assert f"{rule}: spent, removed" in cli(repo, "prune").stdout
    assert all(rule not in p.rules for p in pins.load(repo / "workflow" / "pins.yaml"))


def test_a_pin_extended_across_changes_lists_each_change_in_order():
    # `add` extends an outdated pin's reason with ". Then: "; the report lists the changes one by one
    reason = "a message changed. Then: an option, off by default. Then: a refactor."
    assert pins.changes(reason) == ["a message changed", "an option, off by default", "a refactor"]
    assert pins.changes("one change, e.g. a message. Then again, nothing else.") == [
        "one change, e.g. a message. Then again, nothing else"]
