#!/usr/bin/env bash
# Stop the test cluster of scripts/slurm_up.sh: slurmd, slurmctld and munged, each by the process id in its own pid
# file under $CPROBE_SLURM_DIR (never by name). Jobs still running are killed with their slurmd.
set -uo pipefail

DIR=${CPROBE_SLURM_DIR:-/tmp/cprobe-slurm}

stop() {  # stop NAME PIDFILE: SIGTERM, then SIGKILL after 10 s
  local name=$1 pidfile=$2 pid
  [ -f "$pidfile" ] || return 0
  pid=$(cat "$pidfile" 2>/dev/null || true)
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$pid" 2>/dev/null; then
      echo "slurm_down: $name ($pid) ignored SIGTERM; killing it" >&2
      kill -KILL "$pid" 2>/dev/null || true
    fi
    echo "slurm_down: stopped $name ($pid)" >&2
  fi
  rm -f "$pidfile"
}

if [ -f "$DIR/slurm.conf" ] && command -v scancel >/dev/null 2>&1; then
  SLURM_CONF=$DIR/slurm.conf timeout 10 scancel --user="$(id -un)" >/dev/null 2>&1 || true
fi
stop slurmd "$DIR/slurmd.pid"
stop slurmctld "$DIR/slurmctld.pid"
stop munged "$DIR/munge/munged.pid"
exit 0
