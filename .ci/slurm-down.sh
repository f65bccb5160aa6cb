#!/usr/bin/env bash
# Stop the CI Slurm cluster started by .ci/slurm-up.sh: cancel its jobs, stop slurmd, slurmctld
# and (if slurm-up.sh started it) munged, each by the pid in its pid file, and remove the
# configuration slurm-up.sh wrote.
# Safe to run when nothing is up; never waits more than a few seconds per daemon.
set -euo pipefail

STATE_DIR=${SLURM_CI_DIR:-/tmp/cs336sys-slurm}
log() { echo "slurm-down: $*" >&2; }

# stop_pid PIDFILE NAME: TERM the process in PIDFILE if it is NAME, KILL it after 10 s.
stop_pid() {
    local pidfile=$1 name=$2 pid
    [[ -s $pidfile ]] || return 0
    pid=$(<"$pidfile")
    if [[ -r /proc/$pid/comm && $(</proc/"$pid"/comm) == "$name" ]]; then
        kill -TERM "$pid" 2>/dev/null || true
        for _ in $(seq 50); do [[ -e /proc/$pid ]] || break; sleep 0.2; done
        if [[ -e /proc/$pid ]]; then
            log "$name ($pid) ignored TERM; killing it"
            kill -KILL "$pid" 2>/dev/null || true
        fi
        log "stopped $name ($pid)"
    fi
    rm -f "$pidfile"
}

if [[ -s $STATE_DIR/slurmctld.pid ]] && command -v scancel >/dev/null; then
    # Running job steps belong to slurmstepd processes that outlive slurmd: end them first.
    timeout 10 scancel --full --user "$(id -un)" 2>/dev/null || true
    for _ in $(seq 20); do
        [[ -z $(timeout 5 squeue -h -t running,completing -o %i 2>/dev/null) ]] && break
        sleep 0.5
    done
fi

stop_pid "$STATE_DIR/slurmd.pid" slurmd
stop_pid "$STATE_DIR/slurmctld.pid" slurmctld
if [[ -e $STATE_DIR/munged.ours ]]; then
    stop_pid /run/munge/munged.pid munged
    rm -f "$STATE_DIR/munged.ours"
fi

# Without a configuration, Slurm's clients fail at once instead of trying to reach the stopped
# controller for ~10 s; the Slurm executor plugin runs them whenever Snakemake starts.
for conf in /etc/slurm/slurm.conf /etc/slurm/gres.conf; do
    if [[ -e $conf ]] && grep -qF "# written by cs336sys .ci/slurm-up.sh" "$conf"; then rm -f "$conf"; fi
done
