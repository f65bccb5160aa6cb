"""The pipeline's re-run contract, checked on a private copy of the repository:

(a) after a complete run `snakemake -n` has nothing to do;
(b) a content change to a module re-runs exactly the experiments that import it, their sections
    and the report;
(c) touching files without changing them schedules nothing;
(d) a fresh checkout (any file times) with the committed results schedules no experiment;
plus: a bad config value fails with the key and the allowed values, and on a host without the GPUs
a stale GPU experiment fails before anything is deleted or rewritten.
"""

from __future__ import annotations

import importlib.util
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from cs336sys import registry
from cs336sys.workflow_helpers import CONFIG_FILES, load_config
from cs336sys.writeup import lint

REPO = Path(__file__).resolve().parent.parent
CHEAP = registry.local_rules()
SMOKE = ["writeup/report.pdf", "--config", "grid=smoke"]


def snakemake(cwd: Path, *args: str, check: bool = True, timeout: int = 900) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(cwd / "src")}
    proc = subprocess.run([sys.executable, "-m", "snakemake", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"snakemake {' '.join(args)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


def scheduled(cwd: Path, *args: str) -> set[str]:
    """Names of the rules a dry run would execute."""
    proc = snakemake(cwd, *args, "-n", "--quiet", "rules")
    out = (proc.stdout + proc.stderr).splitlines()
    starts = [i for i, line in enumerate(out) if line.split()[:2] == ["job", "count"]]
    if not starts:
        assert any("Nothing to be done" in line for line in out), "\n".join(out[-40:])
        return set()
    start = starts[0]
    rules = set()
    for line in out[start + 2:]:
        parts = line.split()
        if not parts or parts[0] == "total":
            break
        rules.add(parts[0])
    return rules


def shuffle_times(root: Path) -> None:
    """What a fresh clone looks like: file times in an arbitrary (checkout) order."""
    files = [p for p in root.rglob("*") if p.is_file()]
    random.shuffle(files)
    for i, p in enumerate(files):
        os.utime(p, (1_700_000_000 + i, 1_700_000_000 + i))


# What the pipeline reads: the workflow, the library, the committed results with their provenance,
# the report's templates and the profiles. Not tests, notes, tools, nor a .venv in the checkout.
PIPELINE = ("Snakefile", "config.yaml", "config", "pyproject.toml", "workflow", "src", "results", "benchmarks",
            ".snakemake/metadata", "writeup", "profiles")


def copy_pipeline(dest: Path) -> Path:
    """The pipeline's files of a clone of this checkout (tracked and untracked-not-ignored) under `dest`."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z", "--", *PIPELINE], cwd=REPO,
                            check=True, capture_output=True, text=True).stdout.split("\0")
    for rel in filter(None, listed):
        src = REPO / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    return dest


@pytest.fixture(scope="module")
def repo_copy(tmp_path_factory) -> Path:
    dest = copy_pipeline(tmp_path_factory.mktemp("clone"))
    yield dest
    shutil.rmtree(dest, ignore_errors=True)  # a smoke run leaves ~100 MB


@pytest.fixture(scope="module")
def rerun_copy(repo_copy) -> Path:
    """The module's copy, where a test checks what Snakemake would re-run there: the re-run contract, a long
    check (tests/conftest.py). The config checks use `repo_copy` itself: they stop at parse time."""
    return repo_copy


def test_the_copy_holds_the_pipeline_and_nothing_else(repo_copy):
    top = {p.name for p in repo_copy.iterdir()}
    assert top == {p.split("/")[0] for p in PIPELINE}
    assert not (repo_copy / ".venv").exists() and not (repo_copy / "tests").exists()
    # a virtual environment in the checkout is ignored by git, so neither committed nor copied
    ignored = subprocess.run(["git", "check-ignore", "-q", ".venv/bin/python"], cwd=REPO)
    assert ignored.returncode == 0


def test_a_fresh_clone_has_snakemakes_incomplete_folder():
    # Snakemake migrates a .snakemake holding metadata/ but no incomplete/ (a fresh clone without the keep
    # file), and two runs started at once race on the migration's marker: one deletes it under the other
    # (FileNotFoundError: .snakemake/incomplete/migration_underway, seen in CI's parallel tests)
    tracked = subprocess.run(["git", "ls-files", ".snakemake/incomplete"], cwd=REPO, capture_output=True,
                             text=True, check=True).stdout.split()
    assert tracked == [".snakemake/incomplete/.gitkeep"]
    ignored = subprocess.run(["git", "check-ignore", "-q", ".snakemake/incomplete/cmVzdWx0cy9mb28="], cwd=REPO)
    assert ignored.returncode == 0  # an interrupted job's marker is never committed


def test_the_snakefile_loads_the_config_files_the_helpers_read():
    """config.yaml (the grid to run) then config/<grid>.yaml: the Snakefile's `configfile:` directives, in
    order, are workflow_helpers.CONFIG_FILES, which tests and tools read without Snakemake."""
    loaded = re.findall(r'^configfile: f"\{workflow\.basedir\}/(.+)"$', (REPO / "Snakefile").read_text(), re.M)
    assert tuple(loaded) == CONFIG_FILES
    config = load_config(REPO)
    assert set(config) == {"grid", "main", "next", "smoke"} and config["grid"] == "main"


def test_bad_config_value_names_the_key_and_allowed_values(repo_copy):
    proc = snakemake(repo_copy, "-n", "--config", "grid=huge", check=False)
    assert proc.returncode != 0
    text = proc.stdout + proc.stderr
    assert "grid" in text and "'huge' is not one of ['main', 'smoke', 'next', 'smoke+next']" in text


def test_an_unknown_config_key_is_refused_naming_the_known_ones(repo_copy, tmp_path):
    """A misspelt knob (`steps=ten` for the grid's warmup_sweep.steps) fails at parse time, from --config or
    from a --configfile, naming it and the schema's top-level keys."""
    import yaml

    schema = yaml.safe_load((REPO / "workflow" / "schemas" / "config.schema.yaml").read_text())
    assert {"grid", "pins", "main", "next", "smoke"} <= set(schema["properties"])
    from_file = tmp_path / "extra.yaml"
    from_file.write_text(yaml.safe_dump({"grid": "main", "warmup_steps": 3}))
    for args, key in ((("--config", "steps=ten"), "'steps'"), (("--configfile", str(from_file)), "'warmup_steps'")):
        proc = snakemake(repo_copy, "writeup/report.pdf", "-n", *args, check=False)
        text = proc.stdout + proc.stderr
        assert proc.returncode != 0 and f"unknown config key(s) {key}" in text, text[-2000:]
        assert f"the known top-level keys are {', '.join(schema['properties'])}" in text
        assert "Nothing to be done" not in text


def test_bad_nested_config_value_is_named(repo_copy, tmp_path):
    bad = tmp_path / "bad.yaml"
    text = (repo_copy / "config" / "main.yaml").read_text()
    bad.write_text(text.replace("sizes: [small, medium, large, xl, 2.7B, 10B]", "sizes: [small, huge]", 1))
    proc = snakemake(repo_copy, "-n", "--configfile", str(bad), check=False)
    assert proc.returncode != 0
    text = proc.stdout + proc.stderr
    assert "'huge' is not one of" in text and "'small'" in text and "sizes" in text


def test_a_leaderboard_config_checkpointing_more_blocks_than_the_model_has_is_named(repo_copy, tmp_path):
    """The smoke grid's tiny model has 2 blocks: a config that checkpoints 27 of them (as the 8B's does)
    fails before any job runs, naming the config, not as an error inside a 2-rank job."""
    bad = tmp_path / "bad.yaml"
    text = (repo_copy / "config" / "smoke.yaml").read_text()
    bad.write_text(text.replace("ours_sdpa_checkpoint_27: {checkpoint_blocks: 1}",
                                "ours_sdpa_checkpoint_27: {checkpoint_blocks: 27}", 1))
    proc = snakemake(repo_copy, "-n", "--configfile", str(bad), "--config", "grid=smoke", check=False)
    assert proc.returncode != 0
    text = proc.stdout + proc.stderr
    assert "leaderboard.configs.ours_sdpa_checkpoint_27: checkpoint_blocks 27" in text and "(0..2)" in text


def test_a_pending_configuration_waits_in_next_and_an_unknown_one_is_named(repo_copy, tmp_path):
    """config/main.yaml's optimized_step `pending` leaves [size, configuration] out of that size's series (its
    job runs the rest, as committed); the overlay next empties it, so `--config grid=next` runs that size's
    job with it. A pending configuration the series lacks fails before any job runs, named."""
    import yaml

    config = load_config(repo_copy)
    pending = config["main"]["optimized_step"].get("pending") or [["xl", "compiled_loss"]]
    jobs = {f"optimized_step_{size.replace('.', '_')}" for size, _ in pending}
    main = {**config, "main": {**config["main"], "optimized_step": {**config["main"]["optimized_step"],
                                                                    "pending": pending}}}
    (tmp_path / "main.yaml").write_text(yaml.safe_dump(main, sort_keys=False))
    # forced, so each dry run prints the job's command whether or not the committed results match it (with
    # main's list empty, the probe's job under `next` is the committed one, up to date)
    force = ["--forcerun", *sorted(jobs)]
    main_commands = shell_commands(repo_copy, "--configfile", str(tmp_path / "main.yaml"), *force,
                                   "--config", "pins=off")
    next_commands = shell_commands(repo_copy, "--configfile", str(tmp_path / "main.yaml"), *force,
                                   "--config", "grid=next", "pins=off")
    for size, name in pending:
        job = f"optimized_step_{size.replace('.', '_')}"
        assert '"configuration":"plain"' in main_commands[job]
        assert f'"{name}"' not in main_commands[job]  # neither its point nor its technique in a later one
        assert f'"configuration":"{name}"' in next_commands[job]
    assert jobs <= set(next_commands)
    bad = {**main, "main": {**main["main"], "optimized_step": {**main["main"]["optimized_step"],
                                                               "pending": [["xl", "no_such_step"]]}}}
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(bad, sort_keys=False))
    proc = snakemake(repo_copy, "-n", "--configfile", str(tmp_path / "bad.yaml"), check=False)
    assert proc.returncode != 0
    assert "optimized_step.pending names configurations not in the series: [('xl', 'no_such_step')]" in (
        proc.stdout + proc.stderr)


def tree_digest(root: Path, *folders: str) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for f in folders for p in sorted((root / f).rglob("*"))
            if p.is_file()}


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU host the stale experiment would simply run")
def test_a_stale_gpu_experiment_on_a_cpu_host_changes_nothing(rerun_copy):
    peak = rerun_copy / "src" / "cs336sys" / "peak.py"
    original = peak.read_text()
    before = tree_digest(rerun_copy, "results", ".snakemake/metadata", "benchmarks")
    assert "for _ in range(5):" in original
    peak.write_text(original.replace("for _ in range(5):", "for _ in range(6):", 1))  # one more warm-up product
    try:
        proc = snakemake(rerun_copy, "-c1", "writeup/report.pdf", check=False)
    finally:
        peak.write_text(original)
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "matmul_peak (needs 1 GPU)" in text and "Nothing was run, deleted or rewritten" in text
    assert "profiles/slurm" in text  # says how to run them
    assert tree_digest(rerun_copy, "results", ".snakemake/metadata", "benchmarks") == before


@pytest.mark.parametrize("damage", ["truncated", "bad status"])
def test_a_corrupt_result_is_named_before_any_job_runs_and_nothing_is_deleted(rerun_copy, damage):
    rel = "results/ddp_step/2.7B-bf16/bucketed-1000MB.json"
    path = rerun_copy / rel
    original = path.read_bytes()
    if damage == "truncated":
        path.write_bytes(original[:300])
    else:
        path.write_text(original.decode().replace('"status": "ok"', '"status": "finished"', 1))
    before = tree_digest(rerun_copy, "results", ".snakemake/metadata", "writeup")
    try:
        proc = snakemake(rerun_copy, "-c1", "writeup/report.pdf", check=False)
        after = tree_digest(rerun_copy, "results", ".snakemake/metadata", "writeup")
    finally:
        path.write_bytes(original)
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0
    why = "is not valid JSON" if damage == "truncated" else "status 'finished' is not one of ok, oom"
    line = next(x for x in text.splitlines() if x.strip().startswith(rel))
    assert why in line, text[-2000:]
    assert f"git checkout -- {rel}" in text and "--forcerun ddp_step_2_7B_bf16" in text
    assert "Traceback" not in text and "JSONDecodeError" not in text
    assert after == before  # the sections that read it were not deleted, nothing rewritten


def test_fresh_clone_with_committed_results_runs_no_experiment(rerun_copy):
    shuffle_times(rerun_copy)
    assert scheduled(rerun_copy, "writeup/report.pdf") <= CHEAP


# .ci/slurm-smoke.sh sets this while its one-node cluster is up (CI runs the tests inside it): the smoke grid
# then goes through the Slurm profile, as a user's `--profile profiles/slurm` run would. With "1", only the
# jobs of SLURM_RULES do: one of each kind of request a job makes (no GPU with two gloo ranks, one GPU, two
# GPUs with torchrun; two of one GPU, so that two jobs share the node), after the rest of the grid was made
# with 2 local cores. Each Slurm job costs about 8 s of CPU more than the same job made locally (the job
# step starts Snakemake twice, then srun), which for the whole grid came to about 5 minutes of CI's
# 2 cores. With "all", every experiment job goes through Slurm.
VIA_SLURM = os.environ.get("CS336SYS_SMOKE_VIA_SLURM") in ("1", "all")
SLURM_ALL = os.environ.get("CS336SYS_SMOKE_VIA_SLURM") == "all"
SLURM_RULES = ("allreduce_gloo_2", "matmul_peak", "autocast_dtypes", "ddp_trace")
SLURM_PROFILES = ("--profile", "profiles/slurm", "--profile", "profiles/slurm-ci")
SLURM_GRID_TIMEOUT_S = 1800  # the whole grid: 7-12 min alone on 2 cores, longer beside the other tests


def make_smoke_grid(cwd: Path) -> None:
    """The whole smoke grid from nothing: with two local cores, or through Slurm (VIA_SLURM: the jobs of
    SLURM_RULES, or every job with SLURM_ALL), where every experiment job of that run must run as a Slurm job
    that holds a GPU exactly when its rule asks for one, and no local rule may be submitted
    (tools/slurm_smoke_check.py)."""
    shutil.rmtree(cwd / "smoke", ignore_errors=True)
    if not VIA_SLURM:
        snakemake(cwd, "-c2", *SMOKE, timeout=SLURM_GRID_TIMEOUT_S)
        return
    if not SLURM_ALL:  # the rest first (--omit-from takes every name after it: the target goes before)
        snakemake(cwd, "-c2", SMOKE[0], "--omit-from", *SLURM_RULES, *SMOKE[1:], timeout=SLURM_GRID_TIMEOUT_S)
    spec = importlib.util.spec_from_file_location("slurm_smoke_check", REPO / "tools" / "slurm_smoke_check.py")
    checker = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(checker)
    log_path = cwd / "slurm-smoke.log"
    start = time.time()
    # At most 4 jobs queued or running (the node runs 2 at once), so that the jobs tests/test_slurm_profile.py
    # submits during this grid wait behind 2 of its jobs at most, not behind the whole grid.
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "snakemake", *SLURM_PROFILES, "--jobs", "4", "--nocolor",
                                 *SMOKE], cwd=cwd, env={**os.environ, "PYTHONPATH": str(cwd / "src")},
                                stdout=log, stderr=subprocess.STDOUT)
        timed_out = False
        try:
            proc.wait(timeout=SLURM_GRID_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            timed_out = True
            proc.send_signal(signal.SIGINT)  # Snakemake cancels its Slurm jobs on Ctrl-C (not on TERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    text = log_path.read_text()
    what = f"did not finish within {SLURM_GRID_TIMEOUT_S} s" if timed_out else f"failed (exit {proc.returncode})"
    assert proc.returncode == 0 and not timed_out, f"the smoke grid through Slurm {what}:\n{text[-4000:]}"
    problems, summary = checker.check(text, start, cwd / "smoke" / "writeup" / "report.pdf")
    assert not problems, "\n".join(problems)
    through_slurm = {rule for kind, rule, _ in checker.JOB.findall(text) if kind == "rule"}
    assert SLURM_ALL or through_slurm == set(SLURM_RULES), f"through Slurm: {sorted(through_slurm)}"
    print(f"smoke grid through Slurm: {summary}")


@pytest.fixture(scope="module")
def smoke_grid(repo_copy) -> Path:
    """The copy with the whole smoke grid made in it: minutes, so a long check (tests/conftest.py)."""
    make_smoke_grid(repo_copy)
    return repo_copy


@pytest.fixture
def smoke_jobs(tmp_path) -> Path:
    """A fresh copy of the pipeline whose smoke-grid jobs the test runs for real: a long check."""
    return copy_pipeline(tmp_path / "clone")


@pytest.mark.slow(seconds=900 if SLURM_ALL else 480)
def test_smoke_grid_reruns_exactly_what_changed(smoke_grid):
    repo_copy = smoke_grid
    smoke = repo_copy / "smoke"
    assert (smoke / "writeup" / "report.pdf").read_bytes().startswith(b"%PDF")
    smoke_report = (smoke / "writeup" / "report.md").read_text()
    assert "CPU numbers from the smoke grid" in smoke_report
    assert lint.problems(smoke_report) == [], "\n".join(lint.problems(smoke_report))  # as the main report's
    assert not (repo_copy / "writeup" / "report.md").exists() or \
        "smoke grid" not in (repo_copy / "writeup" / "report.md").read_text()

    # (a) a complete run leaves nothing to do
    assert scheduled(repo_copy, *SMOKE) == set()

    # (c) touching sources, results and the workflow changes nothing
    for p in (repo_copy / "src").rglob("*.py"):
        p.touch()
    for p in (repo_copy / "workflow").rglob("*"):
        p.touch()
    assert scheduled(repo_copy, *SMOKE) == set()

    # (b) documentation, comments and layout re-run nothing; a change to what the model computes
    # re-runs exactly the experiments that run it, and their sections and the report
    model = repo_copy / "src" / "cs336sys" / "model.py"
    original = model.read_text()
    model.write_text(original.replace('"""', '"""Edited documentation. ', 1) + "\n# a comment\n")
    assert scheduled(repo_copy, *SMOKE) == set()
    assert "1e-5" in original
    model.write_text(original.replace("1e-5", "1e-6"))  # the norms' epsilon
    rules = scheduled(repo_copy, *SMOKE)
    experiments = rules - CHEAP
    from cs336sys import codehash
    from cs336sys.registry import EXPERIMENTS

    codehash.clear_cache()
    runs_model = {name for name, e in EXPERIMENTS.items()
                  if "cs336sys.model" in codehash.manifest(e.function, "cs336sys.run")}
    assert {"benchmarking", "warmup", "kernel_profile"} <= runs_model and "matmul_peak" not in runs_model
    by_length = sorted(EXPERIMENTS, key=len, reverse=True)  # a rule is named after its experiment
    ran = {next(n for n in by_length if r == n or r.startswith(n + "_")) for r in experiments}
    assert ran == runs_model  # every experiment has a rule in the smoke grid (test_registry)
    assert {"benchmarking_section", "report_markdown", "report_pdf"} <= rules
    assert "precision_section" not in rules and "matmul_peak" not in rules
    model.write_text(original)
    assert scheduled(repo_copy, *SMOKE) == set()  # content back: nothing stale

    precision = repo_copy / "src" / "cs336sys" / "precision.py"
    precision.write_text(precision.read_text() + "\nimport yaml  # noqa: E402, F401\n")  # runs another package
    assert scheduled(repo_copy, *SMOKE) - CHEAP == {"mixed_precision_accumulation", "autocast_dtypes"}

    # (d) smoke results under arbitrary file times: no experiment re-runs
    precision.write_text(precision.read_text().removesuffix("\nimport yaml  # noqa: E402, F401\n"))
    shuffle_times(smoke)
    assert scheduled(repo_copy, *SMOKE) <= CHEAP


# Stands in for the interpreter of every job (the workflow reads it from CS336SYS_PYTHON, which no rule's
# text or code hash includes). The first job runs through. The next one runs its command to the end, all
# its files written, then says so and blocks until it is interrupted: the test interrupts at that moment,
# one job finished and one whose files exist but which Snakemake has not seen finish.
GATED_PYTHON = """#!/bin/sh
if mkdir "$GATE/first" 2>/dev/null; then exec "$REAL_PYTHON" "$@"; fi
"$REAL_PYTHON" "$@" || exit
touch "$GATE/waiting"
exec sleep 600
"""


def _default_sigint() -> None:
    """In the child before exec: Ctrl-C acts even where the test's own shell ignores it (a background job
    without job control), since an ignored signal stays ignored across exec and Python then keeps it so."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.slow(seconds=40)
def test_a_second_run_is_locked_out_and_ctrl_c_leaves_exactly_the_interrupted_jobs(smoke_jobs, tmp_path):
    """Two snakemake runs in one checkout: the second is refused with the lock message. Ctrl-C in the
    middle of a grid (one job finished, the next one running): the next dry run lists the interrupted job
    and those not started, none that finished, and they re-run without a manual unlock or cleanup."""
    import signal
    import time

    repo = smoke_jobs
    gate = tmp_path / "gate"
    gate.mkdir()
    python = tmp_path / "gated-python"
    python.write_text(GATED_PYTHON)
    python.chmod(0o755)
    env = {**os.environ, "PYTHONPATH": str(repo / "src"), "CS336SYS_PYTHON": str(python),
           "GATE": str(gate), "REAL_PYTHON": sys.executable}
    log_path = tmp_path / "first.log"
    with log_path.open("w") as log_file:
        # Its own session, as a terminal's foreground job is its own process group: Ctrl-C reaches
        # Snakemake and its running job together, and never this test.
        first = subprocess.Popen([sys.executable, "-m", "snakemake", "-c1", *SMOKE], cwd=repo, env=env,
                                 stdout=log_file, stderr=subprocess.STDOUT, text=True, start_new_session=True,
                                 preexec_fn=_default_sigint)
    try:
        deadline = time.monotonic() + 300
        while not ((gate / "waiting").exists() and "Finished jobid" in log_path.read_text()):
            assert first.poll() is None, "the grid ended before it could be interrupted:\n" + log_path.read_text()
            assert time.monotonic() < deadline, "no job finished, or none started after it, in 300 s"
            time.sleep(0.2)
        second = snakemake(repo, "-c1", *SMOKE, check=False)
        assert second.returncode != 0 and "cannot be locked" in second.stdout + second.stderr
        os.killpg(first.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
        first.wait(timeout=120)
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
            first.wait()
    log = log_path.read_text()
    started = set(re.findall(r"^(?:local)?rule (\w+):", log, re.M))
    finished = {rule for rule in re.findall(r"Finished jobid: \d+ \(Rule: (\w+)\)", log)}
    assert first.returncode != 0 and len(finished) == 1 and len(started - finished) == 1, log[-3000:]
    todo = scheduled(repo, *SMOKE)  # no --rerun-incomplete, no --unlock
    assert not todo & finished and started - finished <= todo and "report_pdf" in todo


def shell_commands(cwd: Path, *args: str) -> dict[str, str]:
    """rule -> its shell command in a dry run (the points and result paths it would run)."""
    out = snakemake(cwd, *args, "-n", "-p").stdout
    found, rule = {}, None
    for line in out.splitlines():
        if m := re.match(r"^(?:local)?rule (\w+):", line):
            rule = m.group(1)
        elif rule and "cs336sys.run" in line:
            found[rule] = line.strip()
            rule = None
    return found


def test_the_overlay_lists_exactly_its_new_jobs_and_promoting_it_reruns_nothing(rerun_copy, tmp_path):
    """A point in the overlay `next` is a job that `--config grid=next` runs with results at their final
    paths, its sections and report under next/; moved into `main` it is the same job (same points, same
    result files), so once its results exist the promotion re-runs nothing."""
    import yaml

    config = load_config(rerun_copy)
    overlay = {**config, "next": {"leaderboard": {"jobs": {"overlay_probe": ["ours"]}}}}
    (tmp_path / "next.yaml").write_text(yaml.safe_dump(overlay, sort_keys=False))  # the order as written
    # (a --configfile merges into config/next.yaml key by key: the committed overlay's jobs stay in it)
    waiting = {r for r in scheduled(rerun_copy, "--config", "grid=next") if r not in CHEAP and r != "all"}
    new = {r for r in scheduled(rerun_copy, "--configfile", str(tmp_path / "next.yaml"), "--config", "grid=next")
           if r not in CHEAP and r != "all"}
    assert new - waiting == {"leaderboard_step_overlay_probe"}
    assert not {r for r in scheduled(rerun_copy) if r not in CHEAP}  # the main grid has nothing waiting
    dry = snakemake(rerun_copy, "--configfile", str(tmp_path / "next.yaml"), "--config", "grid=next", "-n").stdout
    assert "next/writeup/report.pdf" in dry and "results/leaderboard_step/overlay_probe/ours.json" in dry
    assert "next/results/leaderboard_step" not in dry  # results at their final paths

    promoted = {**config, "next": {}}
    promoted["main"]["leaderboard"]["jobs"]["overlay_probe"] = ["ours"]
    (tmp_path / "promoted.yaml").write_text(yaml.safe_dump(promoted))
    before = shell_commands(rerun_copy, "--configfile", str(tmp_path / "next.yaml"), "--config", "grid=next")
    after = shell_commands(rerun_copy, "--configfile", str(tmp_path / "promoted.yaml"))
    assert before["leaderboard_step_overlay_probe"] == after["leaderboard_step_overlay_probe"]
    assert not (rerun_copy / "next").exists()  # a dry run writes nothing; the committed report is untouched
