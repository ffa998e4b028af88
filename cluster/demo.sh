#!/usr/bin/env bash
# `make demo`: a failing 2-node job on the local Slurm, then what slurm-attr says about it.
#
# This machine has no GPU, so the hardware fault is injected where the node epilog reads
# the kernel log (the test cluster's kernel source is a file per node): an Xid 79 "fallen
# off the bus" on n2 while the job's ranks fail the way NCCL jobs do when a peer's GPU dies.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
eval "$(bash "$REPO/cluster/testcluster.sh" env)"
BASE=$SATTR_CLUSTER_BASE
WORK=$BASE/work/demo
mkdir -p "$WORK"; chown sattrtest "$WORK"

cat > "$WORK/train.sh" <<'EOF'
#!/bin/bash
#SBATCH -N2 --job-name=demo-train
# Rank 1 (on the node whose GPU dies) reports the CUDA error; rank 0 sees its peer vanish.
srun -l bash -c '
  echo "step 100 loss 2.31"
  if [ "$SLURM_PROCID" = 1 ]; then
    sleep 1
    echo "RuntimeError: CUDA error: unspecified launch failure" >&2
    exit 1
  fi
  sleep 2
  echo "[rank0]:[E ProcessGroupNCCL.cpp:616] [Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=812, OpType=ALLREDUCE, NumelIn=1048576, NumelOut=1048576, Timeout(ms)=600000) ran for 600047 milliseconds before timing out." >&2
  exit 1
'
EOF
chown sattrtest "$WORK/train.sh"

echo "== submitting a 2-node job as user sattrtest"
cd "$WORK"
JOB=$(runuser -u sattrtest -- env SLURM_CONF="$SLURM_CONF" sbatch --parsable --comment="demo run" train.sh)
echo "   job $JOB"
# The fault, as the NVIDIA driver logs it on n2 while the job runs.
sleep 1
printf '%s %s kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=%s, name=python, GPU has fallen off the bus.\n' \
    "$(date +%Y-%m-%dT%H:%M:%S%:z)" "$(hostname -s)" "$$" >> "$BASE/kernel/n2.log"

for _ in $(seq 120); do
    st=$(sacct -n -P -X -j "$JOB" -o State | head -1)
    case $st in COMPLETED|FAILED*|CANCELLED*|TIMEOUT|NODE_FAIL) break ;; esac
    sleep 0.5
done
echo "   state: $st"

SATTR=$BASE/venv/bin/sattr
for _ in $(seq 120); do "$SATTR" show "$JOB" >/dev/null 2>&1 && break; sleep 0.5; done
for _ in $(seq 60); do sacct -n -P -X -j "$JOB" -o Comment | grep -q 'SATTR1:' && break; sleep 0.5; done

echo
echo "== sattr $JOB"
"$SATTR" "$JOB" || true
echo
echo "== sacct -j $JOB -o JobID,State,Comment%200"
sacct -X -j "$JOB" -o JobID,State,Comment%200
echo
echo "== sinfo -R"
sinfo -R -o '%N|%T|%E' | column -t -s '|'
# Put the demo's node back: only nodes slurm-attr drained are resumed.
"$SATTR" undrain n2 --reason "demo finished" >/dev/null 2>&1 || true
