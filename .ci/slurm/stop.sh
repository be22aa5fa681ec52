#!/usr/bin/env bash
# Ends the daemons .ci/slurm/start.sh started, by the PIDs it wrote (slurmd, slurmctld,
# munged, in that order), each within 30 s (SIGTERM, then SIGKILL).
set -uo pipefail
cd "$(dirname "$0")/../.."
STATE=${ODB_SLURM_DIR:-$PWD/.ci/slurm/state}
for daemon in slurmd slurmctld munged; do
    file=$STATE/$daemon.pid
    [[ -s $file ]] || continue
    pid=$(cat "$file")
    if kill -0 "$pid" 2>/dev/null; then
        kill -TERM "$pid"
        for _ in $(seq 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
        if kill -0 "$pid" 2>/dev/null; then
            echo "$daemon (pid $pid) ignored SIGTERM for 30 s: SIGKILL" >&2
            kill -KILL "$pid"
        fi
    fi
    rm -f "$file"
done
