#!/usr/bin/env bash
# Runs a command with a real (one-node, fake-GPU) Slurm cluster up, as a user with
# `--profile profiles/slurm` would have one, and always stops the cluster again:
#   .ci/slurm-smoke.sh [COMMAND [ARG...]]
# The command runs with CS336SYS_SMOKE_VIA_SLURM=1, which the tests read:
#   - tests/test_slurm_profile.py submits its probe rules to the cluster (and fails, not skips, when
#     none answers);
#   - the smoke-grid test of tests/test_workflow.py makes the grid but four experiment rules locally, then
#     those four (no GPU, one GPU twice, two GPUs) with the sections and report through profiles/slurm
#     (+ the CI overrides, profiles/slurm-ci), and checks that each of their jobs ran as a Slurm job that
#     completed holding a GPU exactly when its rule asks for one, and that the local rules did not go
#     through Slurm (tools/slurm_smoke_check.py), before it checks the re-run contract on that grid
#     (CS336SYS_SMOKE_VIA_SLURM=all instead of 1: the whole grid through Slurm).
# CI runs its long checks inside (`.ci/slurm-smoke.sh python -m pytest -m long -n 2`, .ci/run), so the grid
# runs once, beside the other long checks; the fast suite needs no cluster and runs before, outside it. The default command runs only those two (about 14 min on 2 cores when the whole
# grid went through Slurm; less now, not measured).
#
# Environment: SLURM_SMOKE_TIMEOUT (s, default 3600) bounds the command; the SLURM_CI_* variables of
# slurm-up.sh apply.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
cd "$here/.."
STATE_DIR=${SLURM_CI_DIR:-/tmp/cs336sys-slurm}
SMOKE_TIMEOUT=${SLURM_SMOKE_TIMEOUT:-3600}
PYTHON=${PYTHON:-python}
log() { echo "slurm-smoke: $*" >&2; }

# Long steps run in the background so that a signal interrupts `wait` at once (bash runs traps
# only between commands). Snakemake ends cleanly (cancelling its Slurm jobs) on SIGINT, not on
# SIGTERM, so a step is stopped with INT, both at its time limit and on interruption.
# One cluster at a time: a second run (another clone's .ci/run) would bring up and tear down the same
# cluster under the first one's jobs. Refused at once, before this one touches it (no trap set yet).
exec 9>"$STATE_DIR.lock"
if ! flock -n 9; then
    log "another slurm-smoke.sh is using the cluster at $STATE_DIR (a second .ci/run?): run this after it ends"
    exit 1
fi

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

bash "$here/slurm-up.sh" 9>&-  # its daemons must not hold the lock past this script
mkdir -p "$STATE_DIR"

if (($# == 0)); then
    set -- "$PYTHON" -m pytest -q -p no:cacheprovider -m long tests/test_slurm_profile.py \
        tests/test_workflow.py::test_smoke_grid_reruns_exactly_what_changed
fi
log "running with the cluster up: $*"
export CS336SYS_SMOKE_VIA_SLURM=${CS336SYS_SMOKE_VIA_SLURM:-1}  # or "all", set by the caller
status=0
run_step "$SMOKE_TIMEOUT" "$@" || status=$?
if ((status == 124 || status == 137)); then log "ERROR: the command did not finish within ${SMOKE_TIMEOUT}s"; fi
if ((status != 0)); then
    log "ERROR: the command failed (exit $status); Slurm's logs: $STATE_DIR"
    exit "$status"
fi
log "passed in $((SECONDS - start))s"
