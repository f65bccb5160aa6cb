#!/usr/bin/env bash
# Run part of the main grid on a bare GPU host from a copy of this tree (no .git, no network), as
# the committed results were made:
#
#   CS336SYS_GIT_COMMIT=$(git rev-parse HEAD) tools/run_on_gpu_host.sh SECONDS TARGET...
#
# TARGETs are rule names or result files (`snakemake --list-rules`), and may end with Snakemake options:
# a pinned job (workflow/pins.yaml) counts as up to date, so re-making one that waits for a GPU takes
# `TARGET... --config pins=off` (its pin is spent once the results are unpacked here: `python -m
# cs336sys.pins prune`). Installs Snakemake from the wheels in .whl/ when it is missing (build them
# where pip works: ../shared/device/wheelhouse.sh .whl), gives the run a time limit (jobs cut off are
# redone by the next run), and packs results/, benchmarks/, .snakemake/metadata and logs/ into
# $OUT/results.tgz (or ./results.tgz): unpack that into the checkout and commit it.
# CS336SYS_GIT_COMMIT names the commit whose code runs, since the copy has no .git; the tree must be
# that commit's (CS336SYS_GIT_DIRTY=0 says so). Jobs run one at a time (-c1): nothing else disturbs a
# timing, CPU-only (gloo) jobs included.
#
#   tools/run_on_gpu_host.sh tests [PYTEST_ARG...]
#
# instead runs the GPU tests, `python3 -m pytest -m gpu -q` (the tests that compile the kernels and
# run on CUDA; README "Tests on a GPU"), with src/ on the path, writing their output to
# $OUT/pytest-gpu.log (or ./pytest-gpu.log) as well; the exit status is pytest's. Collecting the
# tests imports every test module, one of which needs pypdf, and `-n N` (the whole set in one
# command) needs pytest-xdist: build the wheels with all three (wheelhouse.sh .whl pytest pypdf pytest-xdist).
set -uo pipefail
export PYTHONUNBUFFERED=1
needed=snakemake
[[ ${1:-} == tests ]] && needed="pytest pypdf xdist"
for module in $needed; do  # one missing: install the wheels
    if ! python3 -c "import $module" 2>/dev/null; then
        python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl || exit 1
        export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
        break
    fi
done
if [[ ${1:-} == tests ]]; then
    shift
    export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH}
    python3 -m pytest -m gpu -q -p no:cacheprovider "$@" 2>&1 | tee "${OUT:-.}/pytest-gpu.log"
    exit "${PIPESTATUS[0]}"
fi
limit=${1:?usage: run_on_gpu_host.sh SECONDS TARGET... | run_on_gpu_host.sh tests [PYTEST_ARG...]}
shift
: "${CS336SYS_GIT_COMMIT:?set CS336SYS_GIT_COMMIT to the commit of this tree}"
# the whole hash: the copy has no .git to expand an abbreviation, and the report names results by full hashes
if [[ ! $CS336SYS_GIT_COMMIT =~ ^[0-9a-f]{40}$ ]]; then
    echo "CS336SYS_GIT_COMMIT=$CS336SYS_GIT_COMMIT is not a full commit hash: pass \$(git rev-parse HEAD)" >&2
    exit 2
fi
export CS336SYS_GIT_DIRTY=${CS336SYS_GIT_DIRTY:-0}
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
echo "== $(date -u +%FT%TZ) ${gpus} GPU(s), commit ${CS336SYS_GIT_COMMIT}, limit ${limit} s: $*"
start=$SECONDS
# the targets first: --quiet takes a list and would swallow them
timeout --signal=INT --kill-after=30 "$limit" python3 -m snakemake "$@" -c1 --resources gpu="${gpus:-1}" \
    --keep-going --nocolor --quiet progress > snakemake.log 2>&1
status=$?
grep -E "^(Error|error|Finished|[0-9]+ of [0-9]+ steps|Exiting|Nothing)" snakemake.log | tail -n 40
echo "== snakemake exit ${status} after $((SECONDS - start)) s"
tar czf "${OUT:-.}/results.tgz" results benchmarks .snakemake/metadata logs snakemake.log 2>/dev/null
exit "$status"
