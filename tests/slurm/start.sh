#!/usr/bin/env bash
# Start a single-node Slurm for the tests (munged, slurmctld, slurmd), installing Debian's
# slurm-wlm and munge when missing; a no-op when it already answers. Prints the SLURM_CONF to use.
#   tests/slurm/start.sh [STATE_DIR]   (default /tmp/parallab-slurm; PARALLAB_TEST_SLURM_DIR)
# Ports: PARALLAB_TEST_SLURMCTLD_PORT (default 16817) and that + 1 for slurmd.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
dir=${1:-${PARALLAB_TEST_SLURM_DIR:-/tmp/parallab-slurm}}
port=${PARALLAB_TEST_SLURMCTLD_PORT:-16817}
host=$(hostname -s)
export SLURM_CONF=$dir/slurm.conf

if [ -f "$SLURM_CONF" ] && scontrol ping 2>/dev/null | grep -q UP && sinfo -h -o %T 2>/dev/null | grep -qE '^(idle|mixed|allocated)'; then
  echo "$SLURM_CONF"; exit 0
fi

if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -q --no-install-recommends slurm-wlm munge >/dev/null 2>&1 \
    || { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends slurm-wlm munge >/dev/null; }
fi

mkdir -p "$dir"/munge "$dir"/ctld "$dir"/slurmd
chmod 700 "$dir"/munge
sed -e "s|@DIR@|$dir|g" -e "s|@HOST@|$host|g" -e "s|@CTLD_PORT@|$port|g" -e "s|@SLURMD_PORT@|$((port + 1))|g" \
  "$here/slurm.conf.in" > "$SLURM_CONF"

# munge on a private socket with its own key (root runs it: --force).
if ! munge -n --socket="$dir/munge/munge.socket" >/dev/null 2>&1; then
  [ -f "$dir/munge/munge.key" ] || { dd if=/dev/urandom bs=1 count=1024 of="$dir/munge/munge.key" 2>/dev/null; chmod 400 "$dir/munge/munge.key"; }
  munged --force --socket="$dir/munge/munge.socket" --key-file="$dir/munge/munge.key" \
    --pid-file="$dir/munge/munged.pid" --log-file="$dir/munge/munged.log" --seed-file="$dir/munge/munged.seed"
fi

# Daemons of an earlier start (another config, a stale state) are stopped first.
# (only a pid that is still that daemon: after a reboot a stale pid file may name anything).
for daemon in slurmd slurmctld; do
  pidfile="$dir/$daemon.pid"
  if [ -f "$pidfile" ]; then
    pid=$(cat "$pidfile")
    if [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$daemon" ]; then kill "$pid" 2>/dev/null || true; fi
    rm -f "$pidfile"
  fi
done
sleep 1
slurmctld -i -f "$SLURM_CONF"
slurmd -f "$SLURM_CONF"

for _ in $(seq 1 60); do
  if sinfo -h -o %T 2>/dev/null | grep -qE '^(idle|mixed|allocated)'; then echo "$SLURM_CONF"; exit 0; fi
  scontrol update nodename="$host" state=resume >/dev/null 2>&1 || true
  sleep 1
done
echo "slurm did not come up; see $dir/slurmctld.log and $dir/slurmd.log" >&2
tail -20 "$dir/slurmctld.log" "$dir/slurmd.log" >&2 || true
exit 1
