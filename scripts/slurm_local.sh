#!/usr/bin/env bash
# A real single-node SLURM on this machine (Debian packages), for the launcher=slurm tests and for
# trying SLURM sweeps on a laptop/CPU box:
#   scripts/slurm_local.sh start    # install slurm-wlm + munge if missing (apt-get), configure, start
#   scripts/slurm_local.sh status   # sinfo
#   scripts/slurm_local.sh stop     # stop the daemons this script started
# Root only. No cgroups, no accounting (submitit's sacct polls fail and are hidden by run.py), and
# KillWait=2: scancel's SIGTERM (which submitit ignores) is followed by SIGKILL after 2 s, not 30.
set -euo pipefail
cmd="${1:-start}"
HOST="$(hostname -s)"
CPUS="$(nproc)"
MEM_MB="$(awk '/MemTotal/ {print int($2 / 1024 * 0.8)}' /proc/meminfo)"

need_root() { [[ "$(id -u)" == 0 ]] || { echo "slurm_local: needs root" >&2; exit 3; }; }

install() {
  if command -v slurmctld >/dev/null && command -v munged >/dev/null; then return; fi
  echo "[slurm_local] installing slurm-wlm and munge (apt-get)"
  DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge >/dev/null
}

configure() {
  mkdir -p /etc/slurm /var/spool/slurmctld /var/spool/slurmd /run/munge
  cat > /etc/slurm/slurm.conf <<CONF
ClusterName=local
SlurmctldHost=${HOST}
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmdSpoolDir=/var/spool/slurmd
StateSaveLocation=/var/spool/slurmctld
SlurmUser=root
ReturnToService=2
JobAcctGatherType=jobacct_gather/none
KillWait=2
NodeName=${HOST} CPUs=${CPUS} RealMemory=${MEM_MB} State=UNKNOWN
PartitionName=debug Nodes=${HOST} Default=YES MaxTime=INFINITE State=UP
CONF
  chown -R munge:munge /var/log/munge /var/lib/munge /etc/munge /run/munge
  chmod 700 /var/log/munge
}

idle() { sinfo -h -o "%t" 2>/dev/null | grep -q "idle"; }

start() {
  need_root
  install
  configure
  if idle; then
    scontrol reconfigure >/dev/null 2>&1 || true
    echo "[slurm_local] already up (configuration reloaded): $(sinfo -h -o '%N %t %c CPUs')"
    return
  fi
  pgrep -x munged >/dev/null || runuser -u munge -- /usr/sbin/munged
  pgrep -x slurmctld >/dev/null || slurmctld
  pgrep -x slurmd >/dev/null || slurmd
  for _ in $(seq 1 30); do
    if idle; then echo "[slurm_local] up: $(sinfo -h -o '%N %t %c CPUs')"; return; fi
    scontrol update nodename="${HOST}" state=resume >/dev/null 2>&1 || true
    sleep 1
  done
  echo "[slurm_local] the node did not become idle: $(sinfo 2>&1 | tail -1)" >&2
  exit 1
}

stop() {
  need_root
  for d in slurmd slurmctld; do pkill -x "$d" 2>/dev/null || true; done
  echo "[slurm_local] stopped slurmd and slurmctld"
}

case "$cmd" in
  start) start ;;
  stop) stop ;;
  status) sinfo ;;
  *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
