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

SATTR=$BASE/venv/bin/sattr
# Wait until the job ended, its verdict is stored and its Comment carries it; print the state.
wait_verdict() {
    local job=$1 st=""
    for _ in $(seq 180); do
        st=$(sacct -n -P -X -j "$job" -o State | head -1)
        case $st in COMPLETED|FAILED*|CANCELLED*|TIMEOUT|NODE_FAIL) break ;; esac
        sleep 0.5
    done
    echo "   state: $st"
    for _ in $(seq 120); do "$SATTR" show "$job" >/dev/null 2>&1 && break; sleep 0.5; done
    for _ in $(seq 60); do sacct -n -P -X -j "$job" -o Comment | grep -q 'SATTR1:' && break; sleep 0.5; done
}
wait_verdict "$JOB"

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

# A second job, when torch is installed: a real 4-rank torch.distributed (Gloo) run where
# rank 3 all_reduces 1000 elements instead of 1024. Its Flight Recorder dumps go where the
# SPANK plugin pointed them; the verdict names the rank, its node and the collective.
PYTHON=$(command -v python3)
if "$PYTHON" -c 'import torch' 2>/dev/null; then
    {
        echo '#!/bin/bash'
        echo '#SBATCH -N2 -n4 -t 3 --job-name=demo-fr --exclude=n2'
        echo 'export MASTER_PORT=$((20000 + SLURM_JOB_ID % 20000))'
        echo "srun -l $PYTHON $REPO/cluster/jobs/fr_train.py --fault size --rank 3 --step 3"
    } > "$WORK/fr.sh"
    echo
    echo "== submitting a 4-rank torch job with a collective size bug on rank 3"
    JOB2=$(sbatch --parsable "$WORK/fr.sh")
    echo "   job $JOB2"
    wait_verdict "$JOB2"
    echo
    echo "== sattr $JOB2"
    "$SATTR" "$JOB2" || true
    echo
    echo "== sattr fr $JOB2"
    "$SATTR" fr "$JOB2" || true
    echo
    echo "== sacct -j $JOB2 -o JobID,State,Comment%200"
    sacct -X -j "$JOB2" -o JobID,State,Comment%200
else
    echo "(torch is not installed: skipping the Flight Recorder job; pip install torch==2.13.0)"
fi
