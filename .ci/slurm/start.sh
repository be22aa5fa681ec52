#!/usr/bin/env bash
# A one-node SLURM cluster on this machine for the SLURM test tier (tests/slurm/), run as
# root: installs Debian's slurm-wlm and munge where missing, writes a slurm.conf into
# $ODB_SLURM_DIR (default .ci/slurm/state) and starts munged (on its default socket
# /run/munge), slurmctld and slurmd. Each daemon's PID is written in the state directory;
# .ci/slurm/stop.sh ends them by those PIDs. Prints the line to export:
#   SLURM_CONF=<state dir>/slurm.conf   (the tests and every slurm command read it)
# The node declares more CPUs than the machine has (SlurmdParameters=config_overrides), so
# that a job of 2 tasks x 2 CPUs runs on a 2-core machine.
set -euo pipefail
cd "$(dirname "$0")/../.."
STATE=${ODB_SLURM_DIR:-$PWD/.ci/slurm/state}
CPUS=${ODB_SLURM_CPUS:-8}

if [[ $(id -u) != 0 ]]; then
    echo "start.sh runs as root (it starts munged, slurmctld and slurmd)" >&2
    exit 1
fi
if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null \
        || ! command -v munged >/dev/null || ! command -v sbatch >/dev/null; then
    echo "installing slurm-wlm and munge (apt-get)"
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q slurm-wlm munge >/dev/null
fi
for daemon in munged slurmctld slurmd; do
    if [[ -s $STATE/$daemon.pid ]] && kill -0 "$(cat "$STATE/$daemon.pid")" 2>/dev/null; then
        echo "$daemon already runs (pid $(cat "$STATE/$daemon.pid")): run .ci/slurm/stop.sh first" >&2
        exit 1
    fi
done

mkdir -p "$STATE/ctld" "$STATE/spool" /run/munge /var/log/munge /var/lib/munge
chown munge:munge /run/munge /var/log/munge /var/lib/munge
chmod 0755 /run/munge
if [[ ! -s /etc/munge/munge.key ]]; then
    mungekey --create --keyfile=/etc/munge/munge.key
    chown munge:munge /etc/munge/munge.key
    chmod 0400 /etc/munge/munge.key
fi

HOST=$(hostname -s)
MEMORY_MB=$(awk '/MemTotal/ {print int($2 / 1024 / 2)}' /proc/meminfo)
cat > "$STATE/slurm.conf" <<CONF
ClusterName=odbci
SlurmctldHost=$HOST
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
SchedulerType=sched/backfill
# Requeued jobs wait out their begin time (120 s), then start at the next pass: every 5 s.
SchedulerParameters=sched_interval=5,bf_interval=5
ReturnToService=2
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/spool
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd.pid
SlurmctldLogFile=$STATE/slurmctld.log
SlurmdLogFile=$STATE/slurmd.log
SlurmctldPort=${ODB_SLURMCTLD_PORT:-6817}
SlurmdPort=${ODB_SLURMD_PORT:-6818}
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
KillWait=30
MinJobAge=600
InactiveLimit=0
NodeName=$HOST CPUs=$CPUS RealMemory=$MEMORY_MB State=UNKNOWN
PartitionName=ci Nodes=$HOST Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
CONF
export SLURM_CONF=$STATE/slurm.conf

runuser -u munge -- munged --pid-file=/run/munge/munged.pid
cp /run/munge/munged.pid "$STATE/munged.pid"
slurmctld -f "$SLURM_CONF" -c   # -c: a clean start, no job state of an earlier cluster
slurmd -f "$SLURM_CONF"

# Ready once the node takes jobs (idle), within 60 s.
for _ in $(seq 120); do
    if sinfo -h -N -o "%t" 2>/dev/null | grep -qx idle; then
        echo "SLURM_CONF=$SLURM_CONF"
        exit 0
    fi
    sleep 0.5
done
echo "the one-node cluster did not come up within 60 s; logs in $STATE" >&2
sinfo -N -l >&2 || true
exit 1
