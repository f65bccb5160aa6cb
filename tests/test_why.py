"""`python -m cs336sys.codehash why` and the workflow's stale-by-code summary (cs336sys.why): what changed since a
job's results were made, or since its pin for a pinned job, for experiments and sections alike. On a small git
repository made here (a package, provenance records, result files naming their commit), then on the committed
results, then a dry run of a copy of the pipeline after a one-line edit."""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cs336sys import codehash, pins, provenance, registry, why

REPO = Path(__file__).resolve().parent.parent
SECTION = registry.section("precision")  # a real section: its rule and module are the registry's
EXPERIMENT = ("cs336sys.exp:run_point", codehash.RUNNER)

SOURCES = {
    "cs336sys/__init__.py": "",
    "cs336sys/run.py": "def main():\n    return 0\n",
    "cs336sys/exp.py": "def scale(x):\n    return 2 * x\n\n\ndef offset(x):\n    return x + 1\n\n\n"
                       "def run_point(settings, run):\n    return offset(scale(settings))\n",
    "cs336sys/analysis/__init__.py": "",
    f"{SECTION.module.replace('.', '/')}.py": "def table(rows):\n    return sorted(rows)\n",
}


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True).stdout.strip()


def commit(repo: Path, message: str) -> str:
    git(repo, "add", "-A")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", message)
    return git(repo, "rev-parse", "HEAD")


def edit(repo: Path, module: str, old: str, new: str) -> None:
    path = repo / "src" / module
    assert old in path.read_text()
    path.write_text(path.read_text().replace(old, new))
    codehash.clear_cache()


def record(repo: Path, output: str, rule: str, params: list[str], result_commit: str | None) -> None:
    """A provenance record as Snakemake writes it, and the output (a result naming its commit, or a folder)."""
    meta = repo / ".snakemake" / "metadata"
    meta.mkdir(parents=True, exist_ok=True)
    name = base64.b64encode(output.encode()).decode().replace("/", "@")
    (meta / name).write_text(json.dumps({"rule": rule, "params": params, "endtime": time.time()}))
    if result_commit:
        (repo / output).parent.mkdir(parents=True, exist_ok=True)
        (repo / output).write_text(json.dumps({"env": {"git_commit": result_commit}}))
    else:
        (repo / output).mkdir(parents=True, exist_ok=True)


@pytest.fixture
def small_repo(tmp_path, monkeypatch):
    """A git repository with a package of three modules and the records of one experiment job (`exp_job`)
    and one section, made at its first commit; the working directory, hashed with the disk cache off."""
    repo = tmp_path / "repo"
    for rel, text in SOURCES.items():
        (repo / "src" / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / "src" / rel).write_text(text)
    git(repo, "init", "-q")
    first = commit(repo, "first")
    monkeypatch.chdir(repo)
    monkeypatch.setattr(codehash, "SRC", repo / "src")
    codehash.clear_cache()
    made = codehash.code_hash(*EXPERIMENT)
    record(repo, "results/exp/a.json", "exp_job", ["''", f"'{made}'", f"'{EXPERIMENT[0]}'", "'exp'"], first)
    section_hash = codehash.code_hash(SECTION.module)
    record(repo, f"results/sections/{SECTION.name}", SECTION.rule, [f"'{section_hash}'", f"'{SECTION.name}'"], None)
    time.sleep(1.1)  # the section's job ran before any later commit (git's times are in seconds)
    yield repo
    codehash.clear_cache()


def test_why_names_the_changed_definition_since_the_results(small_repo):
    assert why.why(["exp_job", SECTION.rule], pins=[]) == ["exp_job: up to date", f"{SECTION.rule}: up to date"]
    edit(small_repo, "cs336sys/exp.py", "2 * x", "3 * x")
    lines = why.why(["exp_job"], pins=[])
    assert lines[0] == "exp_job: stale, its code changed"
    assert re.fullmatch(r"    since its results \([0-9a-f]{10}\): cs336sys\.exp: changed: def scale", lines[1])
    assert len(lines) == 2  # offset and run_point did not change


def test_why_works_for_a_section(small_repo):
    edit(small_repo, f"{SECTION.module.replace('.', '/')}.py", "sorted(rows)", "sorted(rows, reverse=True)")
    commit(small_repo, "a section edit, committed after the section ran")
    lines = why.why([SECTION.rule], pins=[])
    assert lines[0] == f"{SECTION.rule}: stale, its code changed"
    assert lines[1].endswith(f"{SECTION.module}: changed: def table")


def test_a_pinned_job_is_compared_with_its_pin_not_its_results(small_repo):
    made = provenance.recorded_hash("results/exp/a.json")
    edit(small_repo, "cs336sys/exp.py", "2 * x", "3 * x")  # the change the pin vouches for
    pinned_at = commit(small_repo, "the pinned change")
    pin = pins.Pin(rules={"exp_job": made}, code={"exp_job": codehash.code_hash(*EXPERIMENT)}, reason="vouched",
                   pinned_at=pinned_at, outputs={"exp_job": ["results/exp/a.json"]})
    assert why.why(["exp_job"], pins=[pin])[0].startswith("up to date by pin [0]")
    edit(small_repo, "cs336sys/exp.py", "x + 1", "x + 2")  # the next edit: the pin is outdated
    lines = why.why(["exp_job"], pins=[pin])
    assert lines == ["exp_job: stale, its code changed",
                     f"    since its pin ({pinned_at[:10]}): cs336sys.exp: changed: def offset"]
    # the summary the workflow prints: the same, grouped, and against the results without the pin
    job = ("exp_job", EXPERIMENT, codehash.code_hash(*EXPERIMENT), ["results/exp/a.json"])
    text = why.summary([job, ("other_job", *job[1:])], [pin])
    assert "  cs336sys.exp: changed: def offset\n    -> 1 job(s), since their pins: exp_job\n" in text
    unpinned = why.summary([job], [])
    assert "  cs336sys.exp: changed: def scale, def offset\n    -> 1 job(s), since their results: exp_job" in unpinned


def test_a_summary_groups_jobs_and_stays_short(small_repo):
    edit(small_repo, "cs336sys/exp.py", "2 * x", "3 * x")
    job = ("exp_job", EXPERIMENT, codehash.code_hash(*EXPERIMENT), ["results/exp/a.json"])
    text = why.summary([(f"job_{i}", *job[1:]) for i in range(30)], [])
    lines = text.splitlines()
    assert lines[0].startswith("30 experiment job(s) re-run") and len(lines) == 4
    assert lines[2] == "    -> 30 job(s), since their results: job_0, job_1, job_10, job_11 and 26 more"
    assert why.summary([job[:2] + (provenance.recorded_hash("results/exp/a.json"),) + job[3:]], []) == ""


def test_why_judges_every_committed_rule_as_the_workflow_does(monkeypatch):
    """On the committed results (nothing to do by `snakemake -n`): every rule with records, sections and the
    report included, is up to date by its code or by a pin, and `why` names each."""
    with_records = {rec["rule"] for _, rec in provenance.records(REPO / provenance.METADATA)}
    monkeypatch.chdir(REPO)
    lines = why.why(sorted(with_records))
    assert {s.rule for s in registry.SECTIONS.values()} | set(why.REPORT_ENTRIES) <= with_records
    assert not [line for line in lines if "stale" in line]
    said = {line.split(":")[0] for line in lines if line.endswith(": up to date")}
    said |= {r.strip() for line in lines if line.startswith("up to date by pin")
             for r in line.split("): ", 1)[1].split(";")[0].split(",")}
    assert said == with_records


@pytest.fixture
def pipeline_with_history(tmp_path) -> Path:
    """A clone of this checkout's history (objects shared, nothing copied) with the working tree's pipeline
    files over it: the results name commits it holds."""
    from test_workflow import copy_pipeline

    if provenance.git("rev-parse", "--is-shallow-repository", cwd=REPO) != "false":
        pytest.skip("needs the project's git history (a full clone) to rebuild the code results were made with")
    dest = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", "--shared", "--no-checkout", str(REPO), str(dest)], check=True)
    git(dest, "reset", "-q", "--soft", git(REPO, "rev-parse", "HEAD"))  # HEAD here, no files checked out
    copy_pipeline(dest)
    yield dest
    shutil.rmtree(dest, ignore_errors=True)


def test_a_dry_run_ends_naming_the_edited_definition_for_every_stale_job(pipeline_with_history):
    repo = pipeline_with_history
    edit(repo, "cs336sys/attention/flash_triton_forward.py", "scores, -1.0e6)", "scores, -1.0e7)")
    out = subprocess.run([sys.executable, "-m", "snakemake", "-n", "writeup/report.pdf"], cwd=repo,
                         capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(repo / "src")})
    assert out.returncode == 0, out.stderr[-3000:]
    lines = (out.stdout + out.stderr).splitlines()
    stale = re.search(r"params have changed since last execution:\n\s+(.+)\n", out.stdout + out.stderr).group(1)
    stale_rules = {r.strip() for r in stale.split(",")}
    assert len(stale_rules) > 20
    tail = lines[-40:]
    assert "  cs336sys.attention.flash_triton_forward: changed: def mask_scores" in tail
    counted = sum(int(m.group(1)) for line in tail if (m := re.match(r"    -> (\d+) job\(s\)", line)))
    assert counted == len(stale_rules)  # every stale job, in the groups of what changed
    assert any("since their pins" in line for line in tail) and any("since their results" in line for line in tail)
    assert not any("more module(s)" in line for line in tail)  # for a pinned job, only the new edit
