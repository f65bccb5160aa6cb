#!/usr/bin/env bash
# The pipeline through a real (one-node, fake-GPU) Slurm cluster, as a user with
# `--profile profiles/slurm` would run it:
#   1. bring the cluster up (.ci/slurm-up.sh),
#   2. run tests/test_slurm_profile.py, whose Slurm tests need the cluster,
#   3. run the smoke grid, every job forced, through profiles/slurm (+ the CI overrides),
#   4. check that every experiment job ran as a Slurm job that completed with its GPU, and that
#      the local rules did not go through Slurm,
# and always stop the cluster again. Writes only under smoke/ (git-ignored), logs/ and $SLURM_CI_DIR.
#
# Environment: SLURM_SMOKE_TIMEOUT (s, default 1800; the grid took 15 min on a loaded 2-core host) bounds the pipeline run, SLURM_SMOKE_TESTS=0
# skips step 2; the SLURM_CI_* variables of slurm-up.sh apply.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
cd "$here/.."
STATE_DIR=${SLURM_CI_DIR:-/tmp/cs336sys-slurm}
SMOKE_TIMEOUT=${SLURM_SMOKE_TIMEOUT:-1800}
PYTHON=${PYTHON:-python}
log() { echo "slurm-smoke: $*" >&2; }

# Long steps run in the background so that a signal interrupts `wait` at once (bash runs traps
# only between commands). Snakemake ends cleanly (cancelling its Slurm jobs) on SIGINT, not on
# SIGTERM, so a step is stopped with INT, both at its time limit and on interruption.
child=""
# run_step SECONDS COMMAND...: run COMMAND with a time limit, in the background, and wait for it.
run_step() {
    local limit=$1 status=0
    shift
    timeout --signal=INT --kill-after=30 "$limit" "$@" &
    child=$!
    wait "$child" || status=$?
    child=""
    return "$status"
}
cleanup() {
    if [[ -n $child ]] && kill -0 "$child" 2>/dev/null; then
        kill -INT "$child" 2>/dev/null || true   # timeout passes it on to the command
        for _ in $(seq 150); do kill -0 "$child" 2>/dev/null || break; sleep 0.2; done
        for pid in $(pgrep -P "$child") "$child"; do kill -KILL "$pid" 2>/dev/null || true; done
    fi
    bash "$here/slurm-down.sh"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
start=$SECONDS

bash "$here/slurm-up.sh"
mkdir -p "$STATE_DIR"

if [[ ${SLURM_SMOKE_TESTS:-1} != 0 ]]; then
    log "tests/test_slurm_profile.py against the cluster"
    run_step 600 "$PYTHON" -m pytest -q -p no:cacheprovider tests/test_slurm_profile.py
fi

log "smoke grid through Slurm (log: $STATE_DIR/smoke.log)"
smoke_start=$(date +%s)
status=0
run_step "$SMOKE_TIMEOUT" "$PYTHON" -m snakemake --profile profiles/slurm \
    --profile profiles/slurm-ci --nocolor --forceall writeup/report.pdf --config grid=smoke \
    >"$STATE_DIR/smoke.log" 2>&1 || status=$?
if ((status != 0)); then
    tail -n 80 "$STATE_DIR/smoke.log" >&2
    if ((status == 124 || status == 137)); then log "ERROR: the pipeline did not finish within ${SMOKE_TIMEOUT}s"; fi
    log "ERROR: the smoke grid failed through Slurm (exit $status); full log: $STATE_DIR/smoke.log"
    exit 1
fi

# Every job of a rule that is not local was submitted to Slurm and completed there with a GPU;
# no local rule was submitted.
"$PYTHON" - "$STATE_DIR/smoke.log" "$smoke_start" <<'EOF'
import os
import re
import subprocess
import sys

text = open(sys.argv[1]).read()
jobs = {}  # Snakemake job id -> (rule, local?)
gpus = {}  # Snakemake job id -> the GPUs its rule declares (resources: gpu=N)
for kind, rule, body in re.findall(r"^(localrule|rule) (\S+):\n((?:[ \t]+\S.*\n)+)", text, re.M):
    jobid = re.search(r"^\s+jobid: (\d+)$", body, re.M)
    jobs[jobid.group(1)] = (rule, kind == "localrule")
    gpu = re.search(r"^\s+resources:.*\bgpu=(\d+)", body, re.M)
    gpus[jobid.group(1)] = int(gpu.group(1)) if gpu else 0
submitted = dict(re.findall(r"Job (\d+) has been submitted with SLURM jobid (\d+)", text))

problems = []
remote = {j for j, (_, local) in jobs.items() if not local}
if not remote:
    problems.append("no experiment job ran at all")
for j in sorted(remote - submitted.keys(), key=int):
    problems.append(f"job {j} ({jobs[j][0]}) did not go through Slurm")
for j in sorted(submitted.keys() & {j for j, (_, local) in jobs.items() if local}, key=int):
    problems.append(f"local job {j} ({jobs[j][0]}) was submitted to Slurm")
for j, slurm_id in sorted(submitted.items(), key=lambda kv: int(kv[0])):
    info = subprocess.run(["scontrol", "show", "job", slurm_id], capture_output=True, text=True,
                          timeout=10).stdout
    # A rule with gpu=N > 0 must reach Slurm as a GPU request; a CPU-only experiment (gloo, gpu=0)
    # must not hold a GPU it does not use.
    with_gpu = bool(re.search(r"TresPerJob=\S*gpu", info))
    wanted = gpus.get(j, 0) > 0
    if "JobState=COMPLETED" not in info or with_gpu != wanted:
        problems.append(f"Slurm job {slurm_id} (job {j}, {jobs.get(j, ('?',))[0]}, gpu={gpus.get(j, 0)}) did not "
                        f"complete {'with' if wanted else 'without'} a GPU: {' '.join(info.split()[:40])}")
report = "smoke/writeup/report.pdf"
if not os.path.exists(report) or os.path.getmtime(report) < int(sys.argv[2]):
    problems.append(f"{report} was not rebuilt")
if problems:
    sys.exit("slurm-smoke: ERROR:\n  " + "\n  ".join(problems))
rules = sorted({jobs[j][0] for j in remote})
print(f"slurm-smoke: {len(remote)} experiment jobs ran as Slurm jobs "
      f"{', '.join(sorted(submitted.values(), key=int))} ({len(rules)} rules); "
      f"{len(jobs) - len(remote)} local jobs stayed local", file=sys.stderr)
EOF
log "passed in $((SECONDS - start))s"
