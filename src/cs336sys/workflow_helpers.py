"""Plain functions the workflow's rule files use (`workflow/rules/common.smk` imports them): the configuration
files and the grid overlay, the environment every job inherits, the experiment job record, and the two guards that run
before any job starts. No Snakemake import at module level and no torch until a guard needs the GPU
count: the workflow imports this at parse time, and no experiment or section imports it (so it is in
no code hash).
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import subprocess
import sys
from collections.abc import Iterator, Mapping, MutableMapping
from dataclasses import dataclass
from pathlib import Path


def merged(base, overlay):
    """`overlay` on top of `base`: dicts merge key by key; lists and values replace."""
    if not isinstance(base, dict) or not isinstance(overlay, dict):
        return overlay
    return {k: merged(base[k], overlay[k]) if k in base and k in overlay else overlay.get(k, base.get(k))
            for k in {**base, **overlay}}


# The workflow's configuration files, in the order the Snakefile's `configfile:` directives load them:
# the entry (which grid to run), then one file per grid (top-level keys main, next, smoke).
CONFIG_FILES = ("config.yaml", "config/main.yaml", "config/next.yaml", "config/smoke.yaml")


def load_config(repo, overrides: Mapping | None = None) -> dict:
    """The workflow's config as Snakemake builds it, for readers without Snakemake (tests, tools): the
    files of `CONFIG_FILES` under `repo` merged key by key in order, then `overrides` (what --config or a
    --configfile would give) on top. The grid a run uses is `grid_of(config)`."""
    import yaml

    config: dict = {}
    for name in CONFIG_FILES:
        config = merged(config, yaml.safe_load((Path(repo) / name).read_text()) or {})
    return merged(config, dict(overrides or {}))


def grid_of(config: Mapping) -> dict:
    """The grid `config["grid"]` names (main, next, smoke, smoke+next): main with the overlays it lists
    merged on it, next before smoke, as workflow/rules/common.smk builds GRID."""
    parts = str(config["grid"]).split("+")
    grid = config["main"]
    if "next" in parts:
        grid = merged(grid, config.get("next") or {})
    if "smoke" in parts:
        grid = merged(grid, config["smoke"])
    return grid


def git(repo: str, *args: str) -> str | None:
    """`git ARGS` in `repo`: its output, or None outside a git checkout (a copied tree) or without git."""
    try:
        out = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, timeout=10)
        return out.stdout.strip() if out.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


def export_job_environment(src: str, repo: str, env: MutableMapping[str, str] = os.environ) -> None:
    """What every job inherits, set in the workflow's own environment (jobs, local or submitted, inherit
    it). Nothing here is required at startup: each variable is set if the host can say, else left out.

    - `PYTHONPATH` starts with the checkout's `src`: jobs run, and the workflow hashes, the library of this
      checkout, whatever else is installed (another clone's editable install, say).
    - `CS336SYS_PYTHON`: the interpreter that runs Snakemake runs the experiments; passed this way so no
      rule's text or parameters depend on the machine (that would make every result look stale).
    - `CS336SYS_GIT_COMMIT` (and `CS336SYS_GIT_DIRTY`): the commit of the code the jobs run, recorded in
      every result. Read here, on the submit host, so that it reaches jobs in a copied tree without .git
      (a GPU host, a cluster node) and stays out of every code hash. A value already set wins; in a tree
      without .git and without the variable, results record no commit.
    """
    env.update(PYTHONPATH=os.pathsep.join(filter(None, [src, env.get("PYTHONPATH")])))
    env.setdefault("CS336SYS_PYTHON", sys.executable)
    if "CS336SYS_GIT_COMMIT" not in env and (commit := git(repo, "rev-parse", "HEAD")):
        env.update(CS336SYS_GIT_COMMIT=commit)
        env.setdefault("CS336SYS_GIT_DIRTY", "1" if git(repo, "status", "--porcelain", "--", src) else "0")


def slug(value) -> str:
    """A name as part of a rule's name (those are identifiers: 2.7B -> 2_7B)."""
    return re.sub(r"\W", "_", str(value))


@dataclass
class ExperimentJob:
    """One experiment job: a batch of points of one registered experiment, one result file each."""

    experiment: str
    job: str  # names the rule, log and timing record; "" for an experiment with one job
    points: list
    results: list
    gpus: int = 1  # GPUs the job needs (resources: gpu); 0 for a CPU-only job
    ranks: int = 1  # processes the runner starts: one per GPU, or gloo processes for CPU points
    rendered: bool = False  # each point also makes a committed folder beside its result

    @property
    def rule(self):
        return slug(f"{self.experiment}_{self.job}" if self.job else self.experiment)

    @property
    def stem(self):
        return f"{self.experiment}/{self.job}" if self.job else self.experiment

    @property
    def benchmark(self):
        return f"benchmarks/{self.stem}.tsv"

    @property
    def log(self):
        return f"logs/{self.stem}.log"

    @property
    def rendered_dirs(self):
        return [r.removesuffix(".json") for r in self.results] if self.rendered else []


def refuse_experiments_this_host_cannot_run(workflow, jobs: list[ExperimentJob], device: str) -> None:
    """Before any job starts (so before Snakemake deletes an output or touches metadata): on a host
    with too few GPUs, a missing or stale GPU experiment is an error naming every such job, and
    nothing is changed. Jobs dispatched to a cluster are not checked here."""
    if device != "cuda" or not workflow.local_exec:
        return
    # The GPUs a job needs are its registered count: `resources: gpu` is capped by --resources.
    needs = {j.rule: j.gpus for j in jobs}
    stale = [j for j in workflow.dag.needrun_jobs() if j.rule.name in needs]
    if not stale:
        return
    have = host_gpu_count()
    short = [(j, needs[j.rule.name]) for j in stale if needs[j.rule.name] > have]
    if not short:
        return
    lines = "\n".join(
        f"  {j.rule.name} (needs {need} GPU{'s' if need > 1 else ''}): {why_stale(workflow.dag.reason(j))}"
        for j, need in sorted(short, key=lambda s: s[0].rule.name))
    print(
        f"error: {len(short)} GPU experiment job(s) are missing or stale, and this host has {have} GPU(s):\n"
        f"{lines}\n"
        "Nothing was run, deleted or rewritten: committed results and .snakemake/metadata are as they were.\n"
        "Run them on a GPU host (snakemake -c1 --resources gpu=N writeup/report.pdf), or dispatch them to a\n"
        "cluster (snakemake --profile profiles/slurm writeup/report.pdf). If a code change made them stale\n"
        "by mistake, undo it; `snakemake -n` lists each job's reason. The CPU smoke grid runs every rule here:\n"
        "snakemake -c2 writeup/report.pdf --config grid=smoke",
        file=sys.stderr,
    )
    raise SystemExit(1)


def why_stale(reason) -> str:
    """A short reason for a job that must run (Snakemake's own is a paragraph of parameter dumps)."""
    why = [text for flag, text in [
        (reason.missing_output, "results missing"), (reason.incomplete_output, "results incomplete"),
        (reason.code_changed, "rule changed"), (reason.params_changed, "its code or points changed"),
        (reason.updated_input, "inputs updated"), (reason.forced, "forced")] if flag]
    return ", ".join(why) or str(reason).splitlines()[0][:80]


def host_gpu_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def refuse_corrupt_results(workflow, jobs: list[ExperimentJob], repo: str) -> None:
    """Before any job starts: a result file that a job would read and that is not whole or not of
    the schema (truncated, hand-edited) is named, with how to restore it, and nothing is run or
    deleted (else Snakemake removes the reading section's committed outputs, then the section
    fails on the file)."""
    from cs336sys.resultcheck import corrupt

    makers: Mapping[str, ExperimentJob] = {r: j for j in jobs for r in j.results}
    needed = list(workflow.dag.needrun_jobs())
    remade = {str(f) for j in needed for f in j.output}
    read = sorted({str(f) for j in needed for f in j.input if str(f) in makers and str(f) not in remade})
    bad = corrupt((f, makers[f].experiment) for f in read)
    if not bad:
        return
    # in a git checkout, whether each file is committed; elsewhere (a copied tree) not known
    listed = git(repo, "ls-files", "--", *(f for f, _ in bad))
    tracked = None if listed is None else {os.path.normpath(p) for p in listed.splitlines()}
    lines = []
    for f, why in bad:
        redo = f"re-make it: snakemake -c1 --forcerun {makers[f].rule} writeup/report.pdf"
        committed = tracked is None or os.path.relpath(os.path.abspath(f), repo) in tracked
        restore = (f"restore the committed file: git checkout -- {f}{'' if tracked else ' (if committed)'}, or "
                   if committed else "")
        lines.append(f"  {f} {why}\n    {restore}{redo}")
    listing = "\n".join(lines)
    print(
        f"error: {len(bad)} result file(s) that jobs would read are corrupt:\n{listing}\n"
        "Nothing was run, deleted or rewritten.",
        file=sys.stderr,
    )
    raise SystemExit(1)


@contextlib.contextmanager
def parsed_workflow(repo: Path, config: dict | None = None) -> Iterator:
    """The workflow of checkout `repo` as Snakemake parses it for `config` (its `rules`, its `globals`:
    GRID, EXPERIMENT_JOBS, ...), nothing run. Parsing changes the working directory (`smoke/` for the smoke
    grid), the environment and `sys.path`: each is what it was again on exit."""
    from snakemake.api import SnakemakeApi
    from snakemake.settings.types import ConfigSettings, OutputSettings, Quietness, ResourceSettings

    cwd, environ, path = os.getcwd(), dict(os.environ), list(sys.path)
    os.chdir(repo)
    try:
        with SnakemakeApi(OutputSettings(quiet={Quietness.ALL})) as api, contextlib.redirect_stderr(io.StringIO()):
            yield api.workflow(resource_settings=ResourceSettings(), snakefile=Path(repo) / "Snakefile",
                               config_settings=ConfigSettings(config=dict(config or {})))._workflow
    finally:
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(environ)
        sys.path[:] = path
