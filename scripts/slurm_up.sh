#!/usr/bin/env bash
# A real single-node SLURM cluster on this machine, from Debian's packages (slurm-wlm 22.05 + munge), for the
# `slurm` tests and for trying cprobe's SLURM launcher (docs/cluster.md).
#
#   scripts/slurm_up.sh            # install (root, apt-get) when missing, write the config, start munged,
#                                  # slurmctld and slurmd, wait until the node is idle; prints `export SLURM_CONF=...`
#   scripts/slurm_down.sh          # stop the three daemons by their own process ids
#
# Everything lives in $CPROBE_SLURM_DIR (default /tmp/cprobe-slurm): slurm.conf, state, spool, logs, pid files and
# munge's socket; /etc/slurm is not touched, so clients need SLURM_CONF=$CPROBE_SLURM_DIR/slurm.conf. The node has the
# machine's real CPUs and memory (`slurmd -C`), one partition `debug` (default, no GPUs), no accounting database
# (sacct is unavailable, as on many small clusters; finished jobs go to a text job-completion log).
# Plugins as the issue advised for 22.05 in a container: proctrack/linuxproc, task/none and no cgroup.conf
# (CgroupPlugin=disabled makes slurmd exit at start while reporting success), select/cons_tres.
set -euo pipefail

DIR=${CPROBE_SLURM_DIR:-/tmp/cprobe-slurm}
CTLD_PORT=${CPROBE_SLURM_CTLD_PORT:-6817}
SLURMD_PORT=${CPROBE_SLURM_SLURMD_PORT:-6818}
WAIT_S=${CPROBE_SLURM_WAIT_S:-60}

say() { echo "slurm_up: $*" >&2; }
die() { echo "slurm_up: error: $*" >&2; exit 1; }

if ! command -v slurmctld >/dev/null 2>&1 || ! command -v munged >/dev/null 2>&1; then
  [ "$(id -u)" = 0 ] || die "slurm-wlm and munge are not installed and this is not root: apt-get install slurm-wlm munge"
  command -v apt-get >/dev/null 2>&1 || die "slurm-wlm and munge are not installed and there is no apt-get"
  say "installing slurm-wlm and munge (apt-get)"
  DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends slurm-wlm munge >/dev/null \
    || die "apt-get install slurm-wlm munge failed"
fi
[ "$(id -u)" = 0 ] || die "the daemons run as root here (SlurmUser=root); run this as root"

if [ -f "$DIR/slurmctld.pid" ] && kill -0 "$(cat "$DIR/slurmctld.pid")" 2>/dev/null; then
  say "already running in $DIR"
  echo "export SLURM_CONF=$DIR/slurm.conf"
  exit 0
fi

mkdir -p "$DIR"/{state,spool,log,munge}
chmod 0755 "$DIR"   # munged runs as the munge user and must reach $DIR/munge (mktemp -d makes 0700 directories)
HOST=$(hostname -s)
NODE=$(slurmd -C | head -1)                       # NodeName=<host> CPUs=.. Boards=.. ... RealMemory=..
CPUS=$(sed -n 's/.* CPUs=\([0-9]*\).*/\1/p' <<<"$NODE")
MEM=$(sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p' <<<"$NODE")
MEM=$(( MEM * 9 / 10 ))                           # leave the OS its share
TOPO=$(sed -e 's/^NodeName=[^ ]* //' -e 's/ RealMemory=[0-9]*//' <<<"$NODE")

# munge: its own socket, pid and log under $DIR (a system munged, if any, is left alone); the Debian key.
chown munge:munge "$DIR/munge" && chmod 0755 "$DIR/munge"
[ -s /etc/munge/munge.key ] || { /usr/sbin/mungekey --create --force >/dev/null 2>&1 || die "no /etc/munge/munge.key"; }
su -s /bin/sh munge -c "/usr/sbin/munged --socket=$DIR/munge/munge.socket --pid-file=$DIR/munge/munged.pid \
  --log-file=$DIR/munge/munged.log --seed-file=$DIR/munge/munged.seed" \
  || die "munged did not start (see $DIR/munge/munged.log)"

cat >"$DIR/slurm.conf" <<EOF
# Written by cprobe's scripts/slurm_up.sh: a single-node test cluster.
ClusterName=cprobe
SlurmctldHost=$HOST
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$DIR/munge/munge.socket
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2,bf_interval=2
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/filetxt
JobCompLoc=$DIR/log/jobcomp.txt
MpiDefault=none
ReturnToService=2
SlurmctldTimeout=30
SlurmdTimeout=30
MessageTimeout=10
KillWait=10
MinJobAge=300
DefMemPerCPU=1024
JobRequeue=1
NodeName=$HOST $TOPO RealMemory=$MEM State=UNKNOWN
PartitionName=debug Nodes=$HOST Default=YES MaxTime=INFINITE State=UP
EOF
export SLURM_CONF=$DIR/slurm.conf

# -c: a fresh cluster, no jobs of an earlier run
/usr/sbin/slurmctld -c -i -f "$SLURM_CONF" || die "slurmctld did not start (see $DIR/log/slurmctld.log)"
/usr/sbin/slurmd -f "$SLURM_CONF" || die "slurmd did not start (see $DIR/log/slurmd.log)"

for _ in $(seq "$WAIT_S"); do
  state=$(sinfo -h -n "$HOST" -o %T 2>/dev/null || true)
  if [ "$state" = idle ]; then
    say "node $HOST idle ($CPUS CPUs, $MEM MB) in partition debug; state in $DIR"
    echo "export SLURM_CONF=$SLURM_CONF"
    exit 0
  fi
  sleep 1
done
die "node $HOST not idle after ${WAIT_S}s (state: ${state:-unknown}); see $DIR/log/slurmctld.log and slurmd.log"
