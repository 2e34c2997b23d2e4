#!/usr/bin/env bash
# Runs a qdarts sweep through a real single-node Slurm (Debian's slurm-wlm and munge, slurmctld
# and slurmd on this machine) and again locally (`qdarts sweep --local`), then checks that both
# give the same run records (every file but the wall-clock column and the checkpoint blobs).
#
#   bash scripts/slurm_check.sh [SWEEP.toml] [--quick]
#
# SWEEP.toml defaults to experiments/sweep-default.toml (2 configs × 2 seeds of the default
# search, about 4 × 3 minutes on 2 cores, done twice). --quick cuts each trial to one epoch on
# 128 images, for a check of the plumbing in a minute.
#
# Needs root for apt-get (it installs slurm-wlm and munge when they are missing) and for
# running slurmd; everything else lives in a temporary folder that is removed at the end.
set -euo pipefail

cd "$(dirname "$0")/.."
repo=$(pwd)
sweep_file=experiments/sweep-default.toml
quick=0
for a in "$@"; do
  case "$a" in
    --quick) quick=1 ;;
    -*) echo "unknown option $a" >&2; exit 2 ;;
    *) sweep_file=$a ;;
  esac
done
[ -f "$sweep_file" ] || { echo "$sweep_file: no such sweep file" >&2; exit 2; }

if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then
  [ "$(id -u)" = 0 ] || { echo "slurm-wlm and munge are missing, and installing them needs root" >&2; exit 2; }
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends slurm-wlm munge
fi
export PATH=$PATH:/usr/sbin

cargo build --release --quiet
qdarts=$repo/target/release/qdarts

work=$(mktemp -d /tmp/qdarts-slurm.XXXXXX)
cleanup() {
  [ -f "$work/slurmd.pid" ] && kill "$(cat "$work/slurmd.pid")" 2>/dev/null || true
  [ -f "$work/slurmctld.pid" ] && kill "$(cat "$work/slurmctld.pid")" 2>/dev/null || true
  [ -f "$work/munged.pid" ] && kill "$(cat "$work/munged.pid")" 2>/dev/null || true
  sleep 1
  rm -rf "$work"
}
trap cleanup EXIT

# munge: a fresh key and socket in the work folder.
mkdir -p "$work/munge" && chmod 700 "$work/munge"
dd if=/dev/urandom of="$work/munge/munge.key" bs=1 count=1024 status=none
chmod 400 "$work/munge/munge.key"
munged --key-file="$work/munge/munge.key" --socket="$work/munge/socket" \
  --pid-file="$work/munged.pid" --log-file="$work/munge/log" --seed-file="$work/munge/seed" --force

host=$(hostname -s)
cpus=$(nproc)
mem=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 - 1024 ))
mkdir -p "$work/state" "$work/spool"
cat > "$work/slurm.conf" <<EOF
ClusterName=qdarts-check
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$work/munge/socket
CryptoType=crypto/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
StateSaveLocation=$work/state
SlurmdSpoolDir=$work/spool
SlurmctldPidFile=$work/slurmctld.pid
SlurmdPidFile=$work/slurmd.pid
SlurmctldLogFile=$work/slurmctld.log
SlurmdLogFile=$work/slurmd.log
SlurmctldPort=16817
SlurmdPort=16818
NodeName=$host CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=check Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
export SLURM_CONF=$work/slurm.conf
slurmctld -f "$SLURM_CONF"
slurmd -f "$SLURM_CONF"
for _ in $(seq 60); do
  sinfo -h -o %T 2>/dev/null | grep -q idle && break
  sleep 1
done
sinfo

# The same sweep twice, in two results folders.
mk_sweep() {
  local dest=$1
  {
    grep -v '^results_dir' "$sweep_file"
  } > "$work/$dest.toml"
  # results_dir is a top-level key: put it before the first table.
  python3 - "$work/$dest.toml" "$work/$dest" "$quick" <<'PY'
import sys
path, results, quick = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
text = open(path).read()
lines = text.splitlines()
first = next((i for i, l in enumerate(lines) if l.lstrip().startswith("[")), len(lines))
lines.insert(first, f'results_dir = "{results}"')
text = "\n".join(lines) + "\n"
if quick:
    text += '\n[[variant]]\nlabel = "quick"\nset = { "search.epochs" = 1, "data.limit" = 128 }\n'
open(path, "w").write(text)
PY
}
mk_sweep slurm
mk_sweep local

name=$(python3 -c "import tomllib,sys; print(tomllib.load(open(sys.argv[1],'rb'))['name'])" "$work/slurm.toml")
echo "== through Slurm"
"$qdarts" sweep "$work/slurm.toml" --emit slurm --cpus 1 --time 01:00:00
jobid=$(sbatch --parsable "$work/slurm/$name/sweep.sbatch")
echo "submitted array job $jobid"
first=$work/slurm/$name/trial-000
if [ $quick = 0 ]; then
  # Requeue trial 0's task after its first epoch: the task must resume its folder from the
  # checkpoint, not start over, and still end with the records of an uninterrupted run.
  until grep -q ',val,' "$first/metrics.csv" 2>/dev/null; do sleep 2; done
  sleep 5
  echo "requeueing task ${jobid}_0 after its first epoch"
  scontrol requeue "${jobid}_0"
fi
while [ -n "$(squeue -h -j "$jobid" 2>/dev/null)" ]; do sleep 5; done
"$qdarts" sweep "$work/slurm/$name"
n=$(python3 -c "import json,sys; print(len(json.load(open(sys.argv[1]))['trials']))" "$work/slurm/$name/trials.json")
done_n=$("$qdarts" sweep "$work/slurm/$name" 2>/dev/null | grep -c ' finished$' || true)
[ "$done_n" = "$n" ] || { echo "only $done_n of $n trials finished under Slurm"; cat "$work"/slurm/"$name"/logs/*; exit 1; }
if [ $quick = 0 ]; then
  grep -q 'resuming' "$work/slurm/$name/logs/trial-000.log" \
    || { echo "the requeued task did not resume its trial"; exit 1; }
  echo "trial 0 was requeued and resumed:"; grep -E 'starting|resuming' "$work/slurm/$name/logs/trial-000.log"
fi
echo "== locally"
"$qdarts" sweep "$work/local.toml" --local --jobs "$cpus"

echo "== same run records?"
status=0
for t in $(seq 0 $((n - 1))); do
  d=$(printf 'trial-%03d' "$t")
  a=$work/slurm/$name/$d
  b=$work/local/$name/$d
  for f in $(cd "$b" && ls); do
    case "$f" in
      checkpoint|lock|debug.log) continue ;;
      metrics.csv)
        # The last column is wall-clock seconds.
        if ! cmp -s <(cut -d, -f1-7 "$a/$f") <(cut -d, -f1-7 "$b/$f"); then
          echo "DIFFER $d/$f"; status=1
        fi ;;
      config.toml)
        if ! cmp -s <(grep -v '^results_dir' "$a/$f") <(grep -v '^results_dir' "$b/$f"); then
          echo "DIFFER $d/$f"; status=1
        fi ;;
      *)
        if ! cmp -s "$a/$f" "$b/$f"; then echo "DIFFER $d/$f"; status=1; fi ;;
    esac
  done
  echo "$d: $(ls "$b" | grep -cv -e checkpoint -e lock) files compared"
done
"$qdarts" compare "$work/slurm/$name" "$work/local/$name"
if [ $status = 0 ]; then echo "slurm and local run records agree"; else echo "slurm and local run records differ"; fi
exit $status
