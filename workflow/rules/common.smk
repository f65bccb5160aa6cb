import json
import re
import os
import sys

from snakemake.utils import validate

# The workflow runs, and hashes, the library of its own checkout, whatever else is installed
# (another clone's editable install, say); its jobs inherit the same path.
SRC = os.path.join(workflow.basedir, "src")
sys.path.insert(0, SRC)
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [SRC, os.environ.get("PYTHONPATH")]))

from cs336sys.codehash import code_hash  # noqa: E402

validate(config, schema="../schemas/config.schema.yaml")

GRID = config[config["grid"]]
DEVICE = GRID["device"]
REPO = workflow.basedir  # templates and sources are read from here, also when workdir is smoke/

# The interpreter that runs Snakemake runs the experiments. Passed through the environment so that
# no rule's text or parameters depend on the machine (that would make every result look stale).
os.environ.setdefault("CS336SYS_PYTHON", sys.executable)

# Every experiment rule runs this command; per rule only params change. `code` is the content hash
# of the modules the experiment imports: a change re-runs exactly the jobs whose code changed.
EXPERIMENT = (
    '"$CS336SYS_PYTHON" -m cs336sys.run {params.problem} --function {params.function} '
    "--points {params.points:q} --outputs {output:q} 2>&1 | tee {log}"
)
ANALYSIS = (
    '"$CS336SYS_PYTHON" -m cs336sys.analysis {params.section} --results {input:q} --out {output:q} '
    "--extra {params.extra:q} > {log} 2>&1"
)


def experiment_code(function):
    """Content hash for an experiment: its function's module closure plus the job runner."""
    return code_hash(function.partition(":")[0], "cs336sys.run")


def points_json(points):
    return json.dumps(points, sort_keys=True, separators=(",", ":"))


def slug(value):
    """A model size as part of a rule name (rule names are identifiers: 2.7B -> 2_7B)."""
    return re.sub(r"\W", "_", str(value))
