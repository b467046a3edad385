#!/usr/bin/env bash
# A one-node SLURM cluster on this machine, for sweeps through hydra/launcher=submitit_slurm (docs/sweeps.md).
#   bash benchmarks/local_slurm.sh start    # apt-installs slurm-wlm and munge if missing, writes slurm.conf, starts
#                                           # munged, slurmctld and slurmd (plain daemons: no systemd needed); again = no-op
#   bash benchmarks/local_slurm.sh status   # the daemons' pids and `sinfo`; exit status 1 when the cluster is not up
#   bash benchmarks/local_slurm.sh stop     # stops the three daemons (by their pid files)
# Needs root (apt, /etc/slurm). The node is this host (`hostname -s`) with `nproc` cores and its memory less a margin,
# in one partition, `local` (the default one). Cores are consumable (select/cons_tres, CR_Core) and task/affinity pins
# each job to its cores, so jobs never share one. There is no slurmdbd (it needs a MySQL server): job completions go
# to a text file (jobcomp/filetxt), which `sacct --completion` (sacct -c) lists; plain `sacct` says accounting is off.
# slurmctld and slurmd listen on all interfaces (SLURM 22.05 has no bind address); every message needs this host's
# munge key, and SlurmctldHost/NodeAddr are 127.0.0.1, so nothing leaves the machine.
set -euo pipefail

CONF=${SLURM_CONF:-/etc/slurm/slurm.conf}
STATE=${SLURM_LOCAL_STATE:-/var/lib/specbench-slurm}
MARK="# written by specbench benchmarks/local_slurm.sh"
MEM_MARGIN_MB=${SLURM_LOCAL_MEM_MARGIN_MB:-2048}   # left to the OS and the submitting process

die() { echo "local_slurm.sh: $*" >&2; exit 1; }

running() {  # running <pidfile>: the pid file names a live process
    [[ -s $1 ]] && kill -0 "$(cat "$1")" 2>/dev/null
}

install_packages() {
    command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v munged >/dev/null && return
    [[ $(id -u) == 0 ]] || die "slurm-wlm and munge are missing, and installing them needs root"
    echo "installing slurm-wlm and munge (apt)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends slurm-wlm munge >/dev/null \
        || die "apt-get install slurm-wlm munge failed (no package index? try apt-get update)"
}

write_conf() {
    [[ -e $CONF ]] && ! grep -qF "$MARK" "$CONF" && die "$CONF exists and is not ours: not overwriting it"
    local node cores mem_mb
    node=$(hostname -s)
    cores=$(nproc)
    mem_mb=$(( $(awk '/^MemTotal:/ {print $2}' /proc/meminfo) / 1024 - MEM_MARGIN_MB ))
    mkdir -p "$(dirname "$CONF")" "$STATE/ctld" "$STATE/d" "$STATE/log"
    cat > "$CONF.new" <<EOF
$MARK: bash benchmarks/local_slurm.sh stop; rm this file to drop it
ClusterName=specbench
SlurmctldHost=$node(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/d
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd.pid
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd.log
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ProctrackType=proctrack/linuxproc
TaskPlugin=task/affinity
JobAcctGatherType=jobacct_gather/linux
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=$STATE/log/jobcomp.txt
JobRequeue=1
ReturnToService=2
MpiDefault=none
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
KillWait=30
MinJobAge=3600
NodeName=$node NodeAddr=127.0.0.1 CPUs=$cores RealMemory=$mem_mb State=UNKNOWN
PartitionName=local Nodes=$node Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
EOF
    mv "$CONF.new" "$CONF"
}

start() {
    install_packages
    write_conf
    if ! running /run/munge/munged.pid; then
        mkdir -p /run/munge && chown munge:munge /run/munge && chmod 755 /run/munge
        runuser -u munge -- munged || die "munged did not start (see /var/log/munge/munged.log)"
    fi
    munge -n | unmunge >/dev/null || die "munge cannot decode its own credential"
    if ! running "$STATE/slurmctld.pid"; then
        SLURM_CONF=$CONF slurmctld || die "slurmctld did not start (see $STATE/log/slurmctld.log)"
    fi
    if ! running "$STATE/slurmd.pid"; then
        SLURM_CONF=$CONF slurmd || die "slurmd did not start (see $STATE/log/slurmd.log)"
    fi
    local tries
    for tries in $(seq 30); do  # the node registers within a few seconds
        if SLURM_CONF=$CONF sinfo -h -N -o %T 2>/dev/null | grep -qE '^(idle|mixed|allocated)'; then
            status
            return
        fi
        sleep 1
    done
    die "the node did not come up in 30 s: $(SLURM_CONF=$CONF sinfo -h -N -o '%T %E' 2>&1)"
}

stop() {
    local pidfile
    for pidfile in "$STATE/slurmd.pid" "$STATE/slurmctld.pid" /run/munge/munged.pid; do
        if running "$pidfile"; then
            kill "$(cat "$pidfile")"
            for _ in $(seq 20); do running "$pidfile" || break; sleep 0.5; done
        fi
    done
    echo "stopped"
}

status() {
    local up=0 name pidfile
    for name in munged slurmctld slurmd; do
        case $name in munged) pidfile=/run/munge/munged.pid ;; *) pidfile=$STATE/$name.pid ;; esac
        if running "$pidfile"; then echo "$name: running (pid $(cat "$pidfile"))"; else echo "$name: stopped"; up=1; fi
    done
    [[ $up == 0 ]] && SLURM_CONF=$CONF sinfo
    return $up
}

case ${1:-} in
    start) start ;;
    stop) stop ;;
    status) status ;;
    *) echo "usage: bash benchmarks/local_slurm.sh start|stop|status" >&2; exit 2 ;;
esac
