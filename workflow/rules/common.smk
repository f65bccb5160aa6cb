# Shared by every rule file: the grid, the commands every experiment and section rule runs, and the
# two helpers that register them (`experiment_job`, `section`). Rules are made from the
# registrations in workflow/rules/rules.smk; names come from cs336sys.registry.
import glob
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass

from snakemake.exceptions import WorkflowError
from snakemake.utils import validate

# The workflow runs, and hashes, the library of its own checkout, whatever else is installed
# (another clone's editable install, say); its jobs inherit the same path.
SRC = os.path.join(workflow.basedir, "src")
sys.path.insert(0, SRC)
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [SRC, os.environ.get("PYTHONPATH")]))

from cs336sys import pins as pins_lib  # noqa: E402
from cs336sys import provenance  # noqa: E402
from cs336sys import registry  # noqa: E402
from cs336sys.codehash import code_hash  # noqa: E402

validate(config, schema="../schemas/config.schema.yaml")


def merged(base, overlay):
    """`overlay` on top of `base`: dicts merge key by key; lists and values replace."""
    if not isinstance(base, dict) or not isinstance(overlay, dict):
        return overlay
    return {k: merged(base[k], overlay[k]) if k in base and k in overlay else overlay.get(k, base.get(k))
            for k in {**base, **overlay}}


# Grids: `main` (the committed results), `smoke` (tiny CPU models, under smoke/), and the overlay
# `next`: grid points and jobs whose code or results are ahead of the committed report. `next` runs
# main + next with results at their final paths (promoting a point to `main` later re-runs nothing) but
# its sections and report under next/ (git-ignored), never over the committed ones; `smoke+next` is
# the smoke grid with the overlay's points, under smoke/.
GRID_PARTS = config["grid"].split("+")
GRID = config["main"]
if "next" in GRID_PARTS:
    GRID = merged(GRID, config.get("next") or {})
if "smoke" in GRID_PARTS:
    GRID = merged(GRID, config["smoke"])
VIEW = "next/" if config["grid"] == "next" else ""  # where this grid's sections and report go
REPORT_GRID = "smoke" if "smoke" in GRID_PARTS else config["grid"]  # what the report says it is
validate(GRID, schema="../schemas/grid.schema.yaml")
DEVICE = GRID["device"]
REPO = workflow.basedir  # templates and sources are read from here, also when workdir is smoke/
registry.check()

# The interpreter that runs Snakemake runs the experiments. Passed through the environment so that
# no rule's text or parameters depend on the machine (that would make every result look stale).
os.environ.setdefault("CS336SYS_PYTHON", sys.executable)


def _git(*args):
    try:
        out = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=10)
        return out.stdout.strip() if out.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


# The commit of the code the jobs run, recorded in every result. Read here, on the submit host,
# and passed through the environment, so that it reaches jobs in a copied tree without .git (a GPU
# host, a cluster node) and stays out of every code hash. Set CS336SYS_GIT_COMMIT to override.
if "CS336SYS_GIT_COMMIT" not in os.environ and (commit := _git("rev-parse", "HEAD")):
    os.environ["CS336SYS_GIT_COMMIT"] = commit
    os.environ.setdefault("CS336SYS_GIT_DIRTY", "1" if _git("status", "--porcelain", "--", SRC) else "0")

# Every experiment rule runs this command; per rule only params change. `code` is the content hash
# of the modules the experiment imports: a change re-runs exactly the jobs whose code changed.
EXPERIMENT = (
    '"$CS336SYS_PYTHON" -m cs336sys.run {params.problem} --function {params.function} --nproc {params.nproc} '
    "{params.rendered} --points {params.points:q} --outputs {params.results:q} 2>&1 | tee {log}"
)
ANALYSIS = (
    '"$CS336SYS_PYTHON" -m cs336sys.analysis {params.section} --results {input:q} --out {output:q} '
    "--extra {params.extra:q} > {log} 2>&1"
)


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


EXPERIMENT_JOBS: list[ExperimentJob] = []
DECLARED_EXPERIMENTS: set[str] = set()  # every experiment a rule file handles, with or without points
SECTION_INPUTS: dict[str, dict] = {}


def experiment_job(experiment, job, points, results, gpus=1, ranks=None, rendered=False):
    """Register an experiment job (made into a rule by rules.smk); returns its result paths.
    `gpus` GPUs, `ranks` processes (default: one per GPU, at least one). A job with no points (a
    grid that leaves the experiment out) makes no rule."""
    registry.experiment(experiment)
    DECLARED_EXPERIMENTS.add(experiment)
    if len(points) != len(results):
        raise ValueError(f"{experiment} {job}: {len(points)} points but {len(results)} result paths")
    if not points:
        return []
    ranks = ranks or max(gpus, 1)
    if gpus and ranks != gpus:
        raise ValueError(f"{experiment} {job}: one rank per GPU ({gpus} GPUs, {ranks} ranks)")
    EXPERIMENT_JOBS.append(ExperimentJob(experiment, job, points, list(results), gpus, ranks, rendered))
    return list(results)


def jobs_of(experiment):
    return [j for j in EXPERIMENT_JOBS if j.experiment == experiment]


def results_of(*experiments):
    """Every result path (and rendered folder) of the registered jobs of these experiments."""
    return [p for e in experiments for j in jobs_of(e) for p in j.results + j.rendered_dirs]


def timings_of(*experiments):
    """Snakemake's wall-clock record of each job of these experiments."""
    return [j.benchmark for e in experiments for j in jobs_of(e)]


def section(name, inputs, extra=None):
    """Register a report section's inputs (made into the rule `<name>_section` by rules.smk)."""
    registry.section(name)
    SECTION_INPUTS[name] = {"inputs": list(inputs), "extra": extra or {}}


def experiment_code(function):
    """Content hash for an experiment: its function's module closure plus the job runner."""
    return code_hash(function, "cs336sys.run")


# Result pins (cs336sys.pins): a pinned rule's `code` is the hash its committed results were made
# with, while their provenance records still hold it. `--config pins=off` ignores every pin.
PINS_PATH = os.path.join(REPO, "workflow", "pins.yaml")
try:
    PINS = pins_lib.load(PINS_PATH) if config.get("pins", "on") == "on" else []
except pins_lib.PinError as e:
    raise WorkflowError(str(e))


def job_code(job, function):
    """The `code` parameter of an experiment job: live, or pinned (see PINS)."""
    return pins_lib.code_for(job.rule, experiment_code(function), job.results, PINS)


def points_json(points):
    return json.dumps(points, sort_keys=True, separators=(",", ":"))


def slug(value):
    """A name as part of a rule name (rule names are identifiers: 2.7B -> 2_7B)."""
    return re.sub(r"\W", "_", str(value))


def refuse_experiments_this_host_cannot_run(workflow):
    """Before any job starts (so before Snakemake deletes an output or touches metadata): on a host
    with too few GPUs, a missing or stale GPU experiment is an error naming every such job, and
    nothing is changed. Jobs dispatched to a cluster are not checked here."""
    if DEVICE != "cuda" or not workflow.local_exec:
        return
    # The GPUs a job needs are its registered count: `resources: gpu` is capped by --resources.
    needs = {j.rule: j.gpus for j in EXPERIMENT_JOBS}
    jobs = [j for j in workflow.dag.needrun_jobs() if j.rule.name in needs]
    if not jobs:
        return
    have = host_gpu_count()
    short = [(j, needs[j.rule.name]) for j in jobs if needs[j.rule.name] > have]
    if not short:
        return
    lines = [f"  {j.rule.name} (needs {need} GPU{'s' if need > 1 else ''}): {why_stale(workflow.dag.reason(j))}"
             for j, need in sorted(short, key=lambda s: s[0].rule.name)]
    print(
        f"error: {len(short)} GPU experiment job(s) are missing or stale, and this host has {have} GPU(s):\n"
        + "\n".join(lines)
        + "\nNothing was run, deleted or rewritten: committed results and .snakemake/metadata are as they were.\n"
        "Run them on a GPU host (snakemake -c1 --resources gpu=N writeup/report.pdf), or dispatch them to a\n"
        "cluster (snakemake --profile profiles/slurm writeup/report.pdf). If a code change made them stale\n"
        "by mistake, undo it; `snakemake -n` lists each job's reason. The CPU smoke grid runs every rule here:\n"
        "snakemake -c2 writeup/report.pdf --config grid=smoke",
        file=sys.stderr,
    )
    raise SystemExit(1)


def why_stale(reason):
    """A short reason for a job that must run (Snakemake's own is a paragraph of parameter dumps)."""
    why = [text for flag, text in [
        (reason.missing_output, "results missing"), (reason.incomplete_output, "results incomplete"),
        (reason.code_changed, "rule changed"), (reason.params_changed, "its code or points changed"),
        (reason.updated_input, "inputs updated"), (reason.forced, "forced")] if flag]
    return ", ".join(why) or str(reason).splitlines()[0][:80]


def host_gpu_count():
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def refuse_corrupt_results(workflow):
    """Before any job starts: a result file that a job would read and that is not whole or not of
    the schema (truncated, hand-edited) is named, with how to restore it, and nothing is run or
    deleted (else Snakemake removes the reading section's committed outputs, then the section
    fails on the file)."""
    from cs336sys.resultcheck import corrupt

    makers = {r: j for j in EXPERIMENT_JOBS for r in j.results}
    needed = list(workflow.dag.needrun_jobs())
    remade = {str(f) for j in needed for f in j.output}
    read = sorted({str(f) for j in needed for f in j.input if str(f) in makers and str(f) not in remade})
    bad = corrupt((f, makers[f].experiment) for f in read)
    if not bad:
        return
    # in a git checkout, whether each file is committed; elsewhere (a copied tree) not known
    listed = _git("ls-files", "--", *(f for f, _ in bad))
    tracked = None if listed is None else {os.path.normpath(p) for p in listed.splitlines()}
    lines = []
    for f, why in bad:
        redo = f"re-make it: snakemake -c1 --forcerun {makers[f].rule} writeup/report.pdf"
        committed = tracked is None or os.path.relpath(os.path.abspath(f), REPO) in tracked
        restore = ("restore the committed file: git checkout -- " + f + ("" if tracked else " (if committed)")
                   + ", or " if committed else "")
        lines.append(f"  {f} {why}\n    {restore}{redo}")
    print(
        f"error: {len(bad)} result file(s) that jobs would read are corrupt:\n" + "\n".join(lines)
        + "\nNothing was run, deleted or rewritten.",
        file=sys.stderr,
    )
    raise SystemExit(1)
