#!/usr/bin/env bash
# A one-node SLURM cluster on this machine, for sweeps through hydra/launcher=submitit_slurm (docs/sweeps.md).
#   bash tools/local_slurm.sh start    # apt-installs slurm-wlm, slurmdbd, munge and mariadb-server if missing,
#                                           # writes slurm.conf and slurmdbd.conf, starts munged, mariadbd, slurmdbd,
#                                           # slurmctld and slurmd (plain daemons: no systemd needed); again = no-op
#   bash tools/local_slurm.sh status   # the daemons' pids and `sinfo`; exit status 1 when the cluster is not up
#   bash tools/local_slurm.sh stop     # stops the daemons (by their pid files)
#   bash tools/local_slurm.sh conf     # only writes the two configs ($SLURM_CONF and slurmdbd.conf beside it)
# Needs root (apt, /etc/slurm). The node is this host (`hostname -s`) with `nproc` cores and its memory less a margin,
# in one partition, `local` (the default one). Cores are consumable (select/cons_tres, CR_Core) and task/affinity pins
# each job to its cores, so jobs never share one. `sacct` (which submitit polls for a job's state: without it a
# cancelled job is never seen to end) needs slurmdbd, and slurmdbd a MySQL server: MariaDB, socket only
# (--skip-networking), root by unix-socket login. Without slurmdbd SLURM 22.05 offers only jobcomp/filetxt and
# `sacct -c`, which submitit does not use. slurmctld, slurmd and slurmdbd listen on all interfaces (SLURM 22.05 has no
# bind address); every message needs this host's munge key, and the hosts they name are 127.0.0.1.
set -euo pipefail

CONF=${SLURM_CONF:-/etc/slurm/slurm.conf}
DBD_CONF=$(dirname "$CONF")/slurmdbd.conf
MYSQL_PID=/run/mysqld/mysqld.pid
STATE=${SLURM_LOCAL_STATE:-/var/lib/specbench-slurm}
MARK="# written by specbench tools/local_slurm.sh"
MEM_MARGIN_MB=${SLURM_LOCAL_MEM_MARGIN_MB:-2048}   # left to the OS and the submitting process

die() { echo "local_slurm.sh: $*" >&2; exit 1; }

running() {  # running <pidfile>: the pid file names a live process
    local pid
    pid=$(cat "$1" 2>/dev/null) && [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null
}

install_packages() {
    local program missing=""
    for program in slurmctld slurmd slurmdbd munged mysqld_safe; do
        command -v $program >/dev/null || missing="$missing $program"
    done
    [[ -z $missing ]] && return
    [[ $(id -u) == 0 ]] || die "missing:$missing; installing them needs root"
    echo "installing slurm-wlm slurmdbd munge mariadb-server (apt)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends slurm-wlm slurmdbd munge mariadb-server \
        >/dev/null || die "apt-get install slurm-wlm slurmdbd munge mariadb-server failed (try apt-get update)"
}

write_conf() {
    local conf
    for conf in "$CONF" "$DBD_CONF"; do
        [[ -e $conf ]] && ! grep -qF "$MARK" "$conf" && die "$conf exists and is not ours: not overwriting it"
    done
    local node cores mem_mb
    node=$(hostname -s)
    cores=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)  # nproc counts OMP_NUM_THREADS, not cores, where set
    mem_mb=$(( $(awk '/^MemTotal:/ {print $2}' /proc/meminfo) / 1024 - MEM_MARGIN_MB ))
    mkdir -p "$(dirname "$CONF")" "$STATE/ctld" "$STATE/d" "$STATE/log"
    cat > "$CONF.new" <<EOF
$MARK: bash tools/local_slurm.sh stop; rm this file to drop it
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
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
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
    if ! cmp -s "$CONF.new" "$CONF"; then  # a changed node or setting: the SLURM daemons restart on it
        CHANGED=1
        mv "$CONF.new" "$CONF"
    else
        rm "$CONF.new"
    fi
    cat > "$DBD_CONF" <<EOF
$MARK
DbdHost=localhost
DbdAddr=127.0.0.1
SlurmUser=root
AuthType=auth/munge
PidFile=$STATE/slurmdbd.pid
LogFile=$STATE/log/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=root
StorageLoc=slurm_acct_db
EOF
    chmod 600 "$DBD_CONF"
}

wait_for() {  # wait_for <name> <command...>: until the command succeeds, 30 s at most
    local name=$1
    shift
    for _ in $(seq 60); do "$@" >/dev/null 2>&1 && return; sleep 0.5; done
    die "$name did not come up in 30 s (see $STATE/log/)"
}

start() {
    install_packages
    write_conf
    if ! running /run/munge/munged.pid; then
        mkdir -p /run/munge && chown munge:munge /run/munge && chmod 755 /run/munge
        runuser -u munge -- munged || die "munged did not start (see /var/log/munge/munged.log)"
    fi
    munge -n | unmunge >/dev/null || die "munge cannot decode its own credential"
    if ! running $MYSQL_PID; then
        mkdir -p /run/mysqld && chown mysql:mysql /run/mysqld
        setsid mysqld_safe --skip-networking --pid-file=$MYSQL_PID >/dev/null 2>&1 </dev/null &
        wait_for mariadbd mariadb-admin ping
    fi
    if ! running "$STATE/slurmdbd.pid"; then
        slurmdbd || die "slurmdbd did not start (see $STATE/log/slurmdbd.log)"
        wait_for slurmdbd sacctmgr -n list cluster
    fi
    if [[ ${CHANGED:-0} == 1 ]]; then
        stop_daemons "$STATE/slurmd.pid" "$STATE/slurmctld.pid"
    fi
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

stop_daemons() {  # stop_daemons <pidfile...>: each one's process, in turn, waiting up to 10 s for it to end
    local pidfile
    for pidfile in "$@"; do
        if running "$pidfile"; then
            kill "$(cat "$pidfile")"
            for _ in $(seq 20); do running "$pidfile" || break; sleep 0.5; done
        fi
    done
}

stop() {
    stop_daemons "$STATE/slurmd.pid" "$STATE/slurmctld.pid" "$STATE/slurmdbd.pid" $MYSQL_PID /run/munge/munged.pid
    echo "stopped"
}

status() {
    local up=0 name pidfile
    for name in munged mariadbd slurmdbd slurmctld slurmd; do
        case $name in
            munged) pidfile=/run/munge/munged.pid ;;
            mariadbd) pidfile=$MYSQL_PID ;;
            *) pidfile=$STATE/$name.pid ;;
        esac
        if running "$pidfile"; then echo "$name: running (pid $(cat "$pidfile"))"; else echo "$name: stopped"; up=1; fi
    done
    [[ $up == 0 ]] && SLURM_CONF=$CONF sinfo
    return $up
}

case ${1:-} in
    start) start ;;
    stop) stop ;;
    status) status ;;
    conf) write_conf ;;
    *) echo "usage: bash tools/local_slurm.sh start|stop|status|conf" >&2; exit 2 ;;
esac
