"""The cluster profiles: they parse, a rule's `resources: gpu=N` reaches Slurm as `--gpus=N`,
local rules stay local, and failures are fast and clear.

The first tests need no Slurm (the sbatch test uses stand-in Slurm commands). The last ones
submit tests/data/slurm_probe/Snakefile to a real cluster (.ci/slurm-up.sh, run by
.ci/slurm-smoke.sh) and skip when no Slurm node answers (fail, inside .ci/slurm-smoke.sh).
"""

import functools
import importlib.util
import os
import re
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
PROFILES = REPO / "profiles"
PROBE = REPO / "tests" / "data" / "slurm_probe" / "Snakefile"
# How CI and these tests run on the throwaway cluster: the real profile plus the CI overrides.
SLURM_CI = ["--profile", str(PROFILES / "slurm"), "--profile", str(PROFILES / "slurm-ci")]
SUBMITTED = re.compile(r"Job (\d+) has been submitted with SLURM jobid (\d+) \(log: (.+?)\)\.")


def profile(name: str) -> dict:
    return yaml.safe_load((PROFILES / name / "config.yaml").read_text())


def snakemake(*args: str, cwd: Path, env: dict | None = None, timeout: int = 300):
    return subprocess.run(
        [sys.executable, "-m", "snakemake", "-s", str(PROBE), "--nocolor", *args],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
    )


# ---- the profiles themselves (no Slurm) ---------------------------------------------------------


def test_slurm_profile_has_the_intended_settings():
    p = profile("slurm")
    assert p["executor"] == "slurm"
    assert p["retries"] >= 1
    assert p["slurm-logdir"]
    resources = p["default-resources"]
    assert {"slurm_partition", "runtime", "mem_mb"} <= resources.keys()
    # GPUs are requested by the rules themselves, never as a default for every job.
    assert not {"gpu", "gres", "slurm_extra"} & resources.keys()


def test_slurm_ci_profile_overrides_the_cluster_specifics():
    main, ci = profile("slurm"), profile("slurm-ci")
    assert ci["slurm-status-command"] == "squeue"
    assert ci["slurm-init-seconds-before-status-checks"] <= 10
    assert "executor" not in ci, "CI must run the real profile, only overriding it"
    # A later profile replaces a whole top-level key: the CI default-resources must restate all.
    assert main["default-resources"].keys() <= ci["default-resources"].keys()


def test_local_profile_serialises_gpu_jobs():
    p = profile("local")
    assert p.get("executor", "local") == "local"
    assert p["cores"] == "all"
    assert p["resources"]["gpu"] >= 1
    # profiles/default/ applies to every plain `snakemake`: it may only say that a job cut off mid-way
    # is re-made (what Ctrl-C leaves), never change what runs, where, or on how many cores.
    assert profile("default") == {"rerun-incomplete": True}
    assert p["rerun-incomplete"] is True


# ---- what sbatch receives, with stand-in Slurm commands (no Slurm) ------------------------------

STUBS = {
    # Record the call, "run" the probe job (write its output), answer with job id 1001, 1002, ...
    "sbatch": 'echo "$*" >> "$STUB_LOG"; mkdir -p probe; echo stub > probe/gpu1.txt; '
              'echo $((1000 + $(wc -l < "$STUB_LOG")))',
    "squeue": 'for i in $(seq 1001 $((1000 + $(wc -l < "$STUB_LOG")))); do echo "$i|COMPLETED"; done',
    # MinJobAge long enough for squeue-based status checks.
    "scontrol": "echo 'MinJobAge = 600 sec'",
    "sinfo": "echo 'gpu*'",
    "sacct": "exit 1",
    "sacctmgr": "exit 1",
    "scancel": "exit 0",
}


@pytest.fixture
def stub_slurm(tmp_path):
    """Environment whose Slurm commands are the stand-ins above; STUB_LOG collects sbatch calls."""
    # Not imported here: importing the plugin probes Slurm, slow where it is installed but down.
    if importlib.util.find_spec("snakemake_executor_plugin_slurm") is None:
        pytest.skip("snakemake-executor-plugin-slurm is not installed: pip install -e '.[slurm]'")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in STUBS.items():
        path = bin_dir / name
        path.write_text(f"#!/bin/sh\n{body}\n")
        path.chmod(path.stat().st_mode | stat.S_IEXEC)
    log = tmp_path / "sbatch.log"
    log.touch()
    return dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", STUB_LOG=str(log))


def test_profile_keys_are_options_of_the_installed_snakemake(stub_slurm):
    # (The stand-ins keep the plugin's Slurm probes quick where Slurm is installed but down.)
    help_text = subprocess.run([sys.executable, "-m", "snakemake", "--help"], env=stub_slurm,
                               capture_output=True, text=True, timeout=120).stdout
    for name in ["slurm", "slurm-ci", "local"]:
        for key in profile(name):
            assert f"--{key}" in help_text, f"profiles/{name}: unknown option {key!r}"


def test_gpu_rule_reaches_sbatch_as_gpus_and_local_rule_stays_local(tmp_path, stub_slurm):
    run = snakemake(*SLURM_CI, "--slurm-init-seconds-before-status-checks", "1",
                    "probe/gpu1.txt", "probe/local.txt", cwd=tmp_path, env=stub_slurm, timeout=120)

    assert run.returncode == 0, run.stderr
    calls = Path(stub_slurm["STUB_LOG"]).read_text().splitlines()
    assert len(calls) == 1, f"expected one sbatch call (the GPU rule), got {calls}"
    call = calls[0]
    assert "--gpus=1" in call
    ci = profile("slurm-ci")["default-resources"]
    for option in [f"-p {ci['slurm_partition']}", f"-t {ci['runtime']}", f"--mem {ci['mem_mb']}",
                   f"--cpus-per-gpu={ci['cpus_per_gpu']}", "--nodes=1"]:
        assert option in call
    # The job re-invokes Snakemake on the node.
    assert "--wrap=" in call and "--executor slurm-jobstep" in call
    # The local rule ran here, outside any Slurm job.
    assert (tmp_path / "probe" / "local.txt").read_text().strip() == "SLURM_JOB_ID="


# ---- a real cluster (.ci/slurm-up.sh) ----------------------------------------------------------


@functools.cache
def _idle_node_gpus() -> int | str:
    """GPUs of the first Slurm node that is up (idle, or running jobs: in CI the smoke grid of
    tests/test_workflow.py may hold it), or why there is none (asked once: sinfo can take 10 s)."""
    if shutil.which("sinfo") is None:
        return "no Slurm here (sinfo not found); .ci/slurm-smoke.sh runs these tests"
    try:
        sinfo = subprocess.run(["sinfo", "-h", "-N", "-t", "idle,mixed,allocated", "-o", "%G"],
                               capture_output=True, text=True, timeout=15)
    except subprocess.TimeoutExpired:
        return "sinfo did not answer within 15 s"
    match = re.search(r"gpu(?::[^:(\s]+)?:(\d+)", sinfo.stdout)
    if match is None:
        said = (sinfo.stdout + sinfo.stderr).strip().splitlines()[:1]
        return f"no Slurm node with GPUs is up (sinfo: {said}); .ci/slurm-up.sh starts one"
    return int(match.group(1))


def node_gpus() -> int:
    """GPUs of a Slurm node that is up; skips the test when no Slurm answers."""
    gpus = _idle_node_gpus()
    if isinstance(gpus, str):
        if os.environ.get("CS336SYS_SMOKE_VIA_SLURM") in ("1", "all"):  # .ci/slurm-smoke.sh brought one up
            pytest.fail(f"the cluster of .ci/slurm-smoke.sh does not answer: {gpus}")
        pytest.skip(gpus)
    return gpus


@pytest.fixture(scope="module")
def slurm_cluster() -> int:
    """The GPUs of a Slurm node that answers (skips without one): a test asking for it is a long check."""
    return node_gpus()


@pytest.fixture(scope="module")
def probe_run(tmp_path_factory, slurm_cluster):
    """One run through Slurm: a 1-GPU job, an all-GPU job, a failing job and a local job."""
    gpus = slurm_cluster
    cwd = tmp_path_factory.mktemp("slurm_probe")
    run = snakemake(*SLURM_CI, "--keep-going", "--slurm-logdir", str(cwd / "slurm-logs"),
                    "probe/gpu1.txt", f"probe/gpu{gpus}.txt", "probe/fail.txt", "probe/local.txt",
                    cwd=cwd, timeout=300)
    return gpus, cwd, run, run.stdout + run.stderr


@pytest.mark.parametrize("which", ["one", "all"])
def test_gpu_request_arrives_at_slurm(probe_run, which):
    gpus, cwd, _, output = probe_run
    n = 1 if which == "one" else gpus
    text = (cwd / "probe" / f"gpu{n}.txt").read_text()
    # What Slurm recorded for the job: --gpus=N is a per-job GPU request (TRES).
    assert re.search(rf"TresPerJob=gres[:/]gpu[:=]{n}\b", text), text
    # The job ran exactly once (not once per GPU) and saw exactly its N devices.
    visible = re.findall(r"^CUDA_VISIBLE_DEVICES=(.*)$", text, re.M)
    assert len(visible) == 1, text
    assert len(visible[0].split(",")) == n, text


def test_only_gpu_rules_are_submitted(probe_run):
    gpus, cwd, _, output = probe_run
    submitted = SUBMITTED.findall(output)
    assert len(submitted) == (2 if gpus > 1 else 1) + 1, output  # gpu1, gpu<all>, fail
    assert (cwd / "probe" / "local.txt").read_text().strip() == "SLURM_JOB_ID="


def test_failed_job_names_its_slurm_log_and_leaves_no_output(probe_run):
    _, cwd, run, output = probe_run
    assert run.returncode != 0
    assert "Error in rule failing_probe" in output
    log = re.search(r"log: (\S+/rule_failing_probe/\d+\.log)", output)
    assert log, output
    assert "probe failure on purpose" in Path(log.group(1)).read_text()
    # Snakemake removed the half-written output.
    assert not (cwd / "probe" / "fail.txt").exists()
    # The other jobs still finished (--keep-going).
    assert (cwd / "probe" / "gpu1.txt").exists()


def test_more_gpus_than_the_node_has_fails_fast(tmp_path, slurm_cluster):
    gpus = slurm_cluster
    start = time.monotonic()
    run = snakemake(*SLURM_CI, f"probe/gpu{gpus + 1}.txt", cwd=tmp_path, timeout=120)
    elapsed = time.monotonic() - start
    output = run.stdout + run.stderr
    assert run.returncode != 0
    assert "Requested node configuration is not available" in output, output
    assert f"--gpus={gpus + 1}" in output
    assert elapsed < 60, f"took {elapsed:.0f} s"


# ---- the smoke grid's check (tools/slurm_smoke_check.py), on a made-up log and stand-in scontrol ----

def _job(kind: str, rule: str, jobid: int, gpus: int) -> str:
    return f"{kind} {rule}:\n    output: {rule}.txt\n    jobid: {jobid}\n    resources: tmpdir=/tmp, gpu={gpus}\n"


def test_smoke_check_names_every_job_that_missed_slurm_or_its_gpu(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("slurm_smoke_check", REPO / "tools" / "slurm_smoke_check.py")
    checker = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(checker)
    states = {"501": "COMPLETED gres/gpu:1", "502": "COMPLETED gres/gpu:1", "503": "COMPLETED none",
              "504": "FAILED gres/gpu:2", "505": "COMPLETED none"}
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    cases = "\n".join(f"  {j}) echo 'JobId={j} JobState={s.split()[0]} TresPerJob={s.split()[1]}';;"
                      for j, s in states.items())
    (bin_dir / "scontrol").write_text(f'#!/bin/sh\ncase "$3" in\n{cases}\nesac\n')
    (bin_dir / "scontrol").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    report = tmp_path / "report.pdf"
    report.write_bytes(b"%PDF")
    since = report.stat().st_mtime - 1

    good = (_job("rule", "gpu_one", 1, 1) + _job("rule", "gloo_two", 5, 0) + _job("localrule", "section", 6, 0)
            + "Job 1 has been submitted with SLURM jobid 501 (log: x).\n"
            + "Job 5 has been submitted with SLURM jobid 505 (log: x).\n")
    problems, summary = checker.check(good, since, report)
    assert problems == [] and summary.startswith("2 experiment jobs ran as Slurm jobs 501, 505 (2 rules); 1 local")

    bad = (_job("rule", "gpu_one", 1, 1) + _job("rule", "cpu_only", 2, 0) + _job("rule", "never_sent", 3, 1)
           + _job("localrule", "section", 4, 0) + _job("rule", "gpu_two", 7, 2)
           + "".join(f"Job {j} has been submitted with SLURM jobid {s} (log: x).\n"
                     for j, s in [(1, 501), (2, 502), (4, 503), (7, 504)]))
    problems, _ = checker.check(bad, report.stat().st_mtime + 5, report)
    assert len(problems) == 5, problems
    said = "\n".join(problems)
    assert "job 3 (never_sent) did not go through Slurm" in said
    assert "local job 4 (section) was submitted to Slurm" in said
    assert "Slurm job 502 (job 2, cpu_only, gpu=0) did not complete without a GPU" in said
    assert "Slurm job 504 (job 7, gpu_two, gpu=2) did not complete with a GPU" in said
    assert f"{report} was not rebuilt" in said
    assert "gpu_one" not in said  # the job that did everything right is not named
