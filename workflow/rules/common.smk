# Shared by the part files (workflow/rules/<part>.smk): the grid, the commands each experiment and
# section runs, and the two helpers that register them (`experiment_job`, `section`). Rules are made
# from the registrations in workflow/rules/rules.smk; names come from cs336sys.registry; plain
# functions live in cs336sys.workflow_helpers.
import atexit
import glob
import json
import os
import sys

import yaml

from snakemake.exceptions import WorkflowError
from snakemake.utils import validate

# The workflow imports, and hashes, the library of its own checkout, whatever else is installed
# (another clone's editable install, say); export_job_environment gives its jobs the same path.
SRC = os.path.join(workflow.basedir, "src")
sys.path.insert(0, SRC)

from cs336sys import knobs  # noqa: E402
from cs336sys import pins as pins_lib  # noqa: E402
from cs336sys import registry  # noqa: E402
from cs336sys import why as why_lib  # noqa: E402
from cs336sys.codehash import RUNNER, code_hash  # noqa: E402
from cs336sys.writeup.items import WRITEUP, ReportIndex  # noqa: E402
from cs336sys.workflow_helpers import (  # noqa: E402
    ExperimentJob,
    export_job_environment,
    grid_of,
    refuse_corrupt_results,
    refuse_experiments_this_host_cannot_run,
    slug,
)

# Snakemake takes any `--config key=value`: a misspelt knob (`steps=ten` for the grid's warmup_sweep.steps)
# would look like a run that used it, so a top-level key the schema does not name is refused, naming them.
with open(os.path.join(workflow.basedir, "workflow", "schemas", "config.schema.yaml")) as _f:
    _KNOWN_KEYS = list(yaml.safe_load(_f)["properties"])
_unknown = sorted(set(config) - set(_KNOWN_KEYS))
if _unknown:
    raise WorkflowError(
        f"unknown config key(s) {', '.join(map(repr, _unknown))} (from --config, --configfile or a config file); "
        f"the known top-level keys are {', '.join(_KNOWN_KEYS)}. A grid's own settings go under its key: "
        "--configfile FILE with main: or smoke: (workflow/schemas/grid.schema.yaml)"
    )
validate(config, schema="../schemas/config.schema.yaml")


# Grids, one file each in config/ (main.yaml, next.yaml, smoke.yaml; config.yaml names the one to run):
# `main` (the committed results), `smoke` (tiny CPU models, under smoke/), and the overlay
# `next`: grid points and jobs whose code or results are ahead of the committed report. `next` runs
# main + next with results at their final paths (promoting a point to `main` later re-runs nothing) but
# its sections and report under next/ (git-ignored), never over the committed ones; `smoke+next` is
# the smoke grid with the overlay's points, under smoke/.
GRID_PARTS = config["grid"].split("+")
GRID = grid_of(config)  # main with the overlays the grid names merged on it (next, then smoke)
VIEW = "next/" if config["grid"] == "next" else ""  # where this grid's sections and report go
REPORT_GRID = "smoke" if "smoke" in GRID_PARTS else config["grid"]  # what the report says it is
validate(GRID, schema="../schemas/grid.schema.yaml")
DEVICE = GRID["device"]
REPO = workflow.basedir  # templates and sources are read from here, also when workdir is smoke/
registry.check()

# The environment every job inherits (the interpreter, this checkout's library, the commit): see
# cs336sys.workflow_helpers.export_job_environment. Set CS336SYS_GIT_COMMIT to override the commit.
export_job_environment(SRC, REPO)

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


KNOB_BLOCKS: dict[str, set[tuple[str, ...]]] = {}  # experiment -> the grid blocks its points read knobs from


def _path_in_grid(block, node=None, path=()):
    node = GRID if node is None else node
    if node is block:
        return path
    for key, value in node.items() if isinstance(node, dict) else ():
        found = _path_in_grid(block, value, path + (key,))
        if found is not None:
            return found
    return None


def point(experiment, block=None, **values):
    """One point of `experiment` (cs336sys.knobs.point): the values the rule sweeps or fixes, every knob
    of the experiment that its grid `block` sets (passed through by name), and the grid's device."""
    if "device" in knobs.knobs_of(experiment):
        values.setdefault("device", DEVICE)
    if block is not None and (path := _path_in_grid(block)) is not None:
        KNOB_BLOCKS.setdefault(experiment, set()).add(path)  # for tests/test_knobs.py's schema check
    try:
        return knobs.point(experiment, block or {}, **values)
    except ValueError as e:
        raise WorkflowError(str(e)) from None


def setting(experiment, block, name):
    """The value of `experiment`'s knob `name` under grid `block`: the block's, else the dataclass default."""
    try:
        return knobs.value(experiment, block, name)
    except ValueError as e:
        raise WorkflowError(str(e)) from None


def rotated_rounds(points, rounds):
    """Every point once a round, round r starting from the r-th point (ABCD BCDA CDAB): the variants
    alternate in time, so a drift of the GPU falls on all of them, and none always follows the same one, so
    what one leaves behind (a hot GPU, a lower clock) is not charged to its successor in every round."""
    return [p | {"round": r} for r in range(rounds) for p in points[r % len(points) :] + points[: r % len(points)]]


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
    """Content hash for an experiment: what its function can run, and the job runner."""
    return code_hash(function, RUNNER)


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


def points_json(experiment, points):
    """The job's `points` parameter: each point less the knobs at their default (knobs.without_defaults),
    so that a default written in the grid or left out makes the same parameters."""
    points = [knobs.without_defaults(experiment, p) for p in points]
    return json.dumps(points, sort_keys=True, separators=(",", ":"))


# Experiment jobs stale by their code: which definitions changed since their results (or their pins) were made,
# grouped by change (Snakemake itself shows two hashes). Said last, where it is read: after a dry run's job list
# (no Snakemake hook runs then, so as the process exits, once every job of the DAG is done), and as a run starts.
def say_stale_by_code():
    dag = getattr(workflow, "dag", None)  # none when the run stopped before building it
    jobs = list(dag.needrun_jobs(exclude_finished=False)) if dag is not None else []
    if workflow.dryrun and not all(dag.finished(j) for j in jobs):
        return  # the dry run failed: its error is the last word
    needed = {j.rule.name for j in jobs}
    text = why_lib.summary(
        [
            (
                j.rule,
                (registry.function_of(j.experiment, j.points), RUNNER),
                job_code(j, registry.function_of(j.experiment, j.points)),
                j.results,
            )
            for j in EXPERIMENT_JOBS
            if j.rule in needed
        ],
        PINS,
    )
    if text:
        print(text, file=sys.stderr)


atexit.register(lambda: workflow.dryrun and say_stale_by_code())  # known once a run starts, not at parsing
