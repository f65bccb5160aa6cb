#!/usr/bin/env bash
# Bring up a one-node Slurm cluster with fake GPUs, for CI (Debian 12, root, no systemd).
#
#   .ci/slurm-up.sh      install (if needed) and start munged + slurmctld + slurmd, wait for "idle"
#   .ci/slurm-down.sh    stop what this script started
#
# The node offers SLURM_CI_GPUS (default 2) GPUs as GRES backed by character devices, so jobs that
# ask for `--gpus=N` are scheduled and get CUDA_VISIBLE_DEVICES, without any real GPU.
# Re-running it while the cluster is up only waits for the node to be idle again.
set -euo pipefail

STATE_DIR=${SLURM_CI_DIR:-/tmp/cs336sys-slurm}
N_GPUS=${SLURM_CI_GPUS:-2}
PARTITION=${SLURM_CI_PARTITION:-gpu}
UP_TIMEOUT=${SLURM_CI_UP_TIMEOUT:-60}      # seconds for the node to become idle
APT_TIMEOUT=${SLURM_CI_APT_TIMEOUT:-600}   # seconds for each apt-get call
CONF_DIR=/etc/slurm
MARKER="# written by cs336sys .ci/slurm-up.sh"

log() { echo "slurm-up: $*" >&2; }

dump_logs() {
    log "---- diagnostics ----"
    for f in "$@" "$STATE_DIR/slurmctld.log" "$STATE_DIR/slurmd.log"; do
        if [[ -s $f ]]; then echo "== tail $f" >&2; tail -n 25 "$f" >&2; fi
    done
    echo "== sinfo -R" >&2; timeout 5 sinfo -R >&2 2>&1 || true
    echo "== scontrol show node" >&2; timeout 5 scontrol show node >&2 2>&1 || true
}

# die MESSAGE [EXTRA_LOG...]: report, show the logs, stop what was started, fail.
die() {
    log "ERROR: $1"
    shift
    dump_logs "$@"
    # Leave nothing half-started behind.
    bash "$(dirname "$0")/slurm-down.sh" || true
    exit 1
}

# pid_alive PIDFILE NAME: the pid in PIDFILE is a running process called NAME.
pid_alive() {
    local pid
    [[ -s $1 ]] || return 1
    pid=$(<"$1")
    [[ -r /proc/$pid/comm && $(</proc/"$pid"/comm) == "$2" ]]
}

[[ $(id -u) == 0 ]] || { log "ERROR: must run as root (CI only)"; exit 1; }
mkdir -p "$STATE_DIR"

# ---- install (quiet, idempotent) -------------------------------------------------------------
missing=()
for pkg_bin in munge:/usr/sbin/munged slurmctld:/usr/sbin/slurmctld slurmd:/usr/sbin/slurmd \
               slurm-client:/usr/bin/sbatch; do
    [[ -x ${pkg_bin#*:} ]] || missing+=("${pkg_bin%%:*}")
done
if ((${#missing[@]})); then
    log "installing ${missing[*]} (log: $STATE_DIR/apt.log)"
    export DEBIAN_FRONTEND=noninteractive
    timeout "$APT_TIMEOUT" apt-get update -q >"$STATE_DIR/apt.log" 2>&1 \
        || die "apt-get update failed or timed out" "$STATE_DIR/apt.log"
    timeout "$APT_TIMEOUT" apt-get install -y -q --no-install-recommends "${missing[@]}" \
        >>"$STATE_DIR/apt.log" 2>&1 || die "apt-get install ${missing[*]} failed or timed out" \
        "$STATE_DIR/apt.log"
fi

# ---- munge ------------------------------------------------------------------------------------
munge_works() { timeout 5 munge -n </dev/null 2>/dev/null | timeout 5 unmunge >/dev/null 2>&1; }
if ! munge_works; then
    if [[ ! -s /etc/munge/munge.key ]]; then
        dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
        chown munge:munge /etc/munge/munge.key
        chmod 400 /etc/munge/munge.key
    fi
    mkdir -p /run/munge
    chown munge:munge /run/munge
    timeout 10 runuser -u munge -- /usr/sbin/munged || die "munged did not start"
    touch "$STATE_DIR/munged.ours"   # slurm-down.sh stops munged only if we started it
    for _ in $(seq 20); do munge_works && break; sleep 0.5; done
    munge_works || die "munge does not work after starting munged"
fi

# ---- fake GPUs and configuration --------------------------------------------------------------
if pid_alive "$STATE_DIR/slurmctld.pid" slurmctld && pid_alive "$STATE_DIR/slurmd.pid" slurmd; then
    log "slurmctld and slurmd already running; reusing them"
else
    if [[ -e $CONF_DIR/slurm.conf ]] && ! grep -qF "$MARKER" "$CONF_DIR/slurm.conf"; then
        log "ERROR: $CONF_DIR/slurm.conf exists and was not written by this script; refusing to"
        log "       overwrite a real cluster's configuration."
        exit 1
    fi
    mkdir -p "$STATE_DIR/dev" "$STATE_DIR/ctld" "$STATE_DIR/d" "$CONF_DIR"
    # GRES without File= drain the node and regular files are rejected: use character devices
    # with the NVIDIA major number (nothing ever opens them).
    for ((i = 0; i < N_GPUS; i++)); do
        [[ -c $STATE_DIR/dev/nvidia$i ]] || mknod "$STATE_DIR/dev/nvidia$i" c 195 "$i"
    done

    host=$(hostname -s)
    node_line=$(timeout 10 slurmd -C | grep '^NodeName=') || die "slurmd -C failed"
    cat >"$CONF_DIR/slurm.conf" <<EOF
$MARKER
ClusterName=cs336sys-ci
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
AuthType=auth/munge
CredType=cred/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
ReturnToService=2
MpiDefault=none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MailProg=/bin/true
# Finished jobs stay visible to squeue and scontrol this long. Snakemake's status check needs that,
# and so does the smoke-grid test's check of every job (tools/slurm_smoke_check.py), which runs after
# the whole grid: with 600 s a slow CI host purged the records of the grid's first jobs before the
# check read them.
MinJobAge=7200
StateSaveLocation=$STATE_DIR/ctld
SlurmdSpoolDir=$STATE_DIR/d
SlurmctldPidFile=$STATE_DIR/slurmctld.pid
SlurmdPidFile=$STATE_DIR/slurmd.pid
SlurmctldLogFile=$STATE_DIR/slurmctld.log
SlurmdLogFile=$STATE_DIR/slurmd.log
$node_line NodeAddr=127.0.0.1 Gres=gpu:$N_GPUS State=UNKNOWN
PartitionName=$PARTITION Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
    cat >"$CONF_DIR/gres.conf" <<EOF
$MARKER
AutoDetect=off
NodeName=$host Name=gpu File=$STATE_DIR/dev/nvidia[0-$((N_GPUS - 1))]
EOF

    # Fresh logs, so that a failure shows this start only.
    for d in slurmctld slurmd; do
        if [[ -e $STATE_DIR/$d.log ]]; then mv -f "$STATE_DIR/$d.log" "$STATE_DIR/$d.log.old"; fi
    done
    # -c: start from an empty job state, whatever an earlier run left behind.
    timeout 20 /usr/sbin/slurmctld -c || die "slurmctld did not start"
    timeout 20 /usr/sbin/slurmd || die "slurmd did not start"
    # The daemons write their pid files shortly after forking.
    for d in slurmctld slurmd; do
        for _ in $(seq 50); do pid_alive "$STATE_DIR/$d.pid" "$d" && break; sleep 0.2; done
        pid_alive "$STATE_DIR/$d.pid" "$d" || die "$d did not stay up (see its log below)"
    done
fi

# ---- wait until the node is idle --------------------------------------------------------------
deadline=$((SECONDS + UP_TIMEOUT))
state=""
while ((SECONDS < deadline)); do
    pid_alive "$STATE_DIR/slurmctld.pid" slurmctld || die "slurmctld exited (see its log below)"
    pid_alive "$STATE_DIR/slurmd.pid" slurmd || die "slurmd exited (see its log below)"
    state=$(timeout 5 sinfo -h -N -o %T 2>/dev/null | head -n 1) || state=""
    case $state in
        idle) break ;;
        drain* | *fail*) die "node is '$state' (see the reason below)" ;;
    esac
    sleep 1
done
[[ $state == idle ]] || die "node not idle after ${UP_TIMEOUT}s (last state: '${state:-none}')"
log "cluster up: partition '$PARTITION', $N_GPUS fake GPUs, node $(hostname -s) idle" \
    "(state and logs in $STATE_DIR)"
