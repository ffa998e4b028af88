#!/usr/bin/env bash
# `make demo`: what slurm-attr says about two failing jobs on the local Slurm.
#
# 1. A 2-node job whose GPU on n2 falls off the bus. This machine has no GPU, so the fault
#    is written where n2's node epilog reads its kernel log (the test cluster's kernel source
#    is a file per node), while the job runs on n2: an Xid 79, as the NVIDIA driver logs it.
#    The ranks fail the way NCCL jobs do when a peer's GPU dies. slurm-attr names n2 and its
#    GPU, drains n2 before it can take the next job, and writes the verdict into the Comment.
# 2. A real 4-rank torch.distributed (Gloo) job where rank 3 all_reduces 1000 elements
#    instead of 1024: its Flight Recorder dumps go where the SPANK plugin pointed them; the
#    verdict names the rank, its node and the collective, and `sattr fr` shows the matrix.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
VENV=${VENV:-$REPO/.venv}
case $VENV in /*) ;; *) VENV=$REPO/$VENV ;; esac
eval "$(bash "$REPO/cluster/testcluster.sh" env)"
BASE=$SATTR_CLUSTER_BASE
SATTR=$SATTR_BIN
WORK=$BASE/work/demo
T0=$(date +%s)
mkdir -p "$WORK"; chown sattrtest "$WORK"; rm -f "$WORK"/fault-injected

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
say() { printf '   %s\n' "$*"; }

# wait_for DESC SECONDS CMD...: poll CMD every 0.2 s until it succeeds.
wait_for() {
    local desc=$1 secs=$2; shift 2
    local i
    for ((i = 0; i < secs * 5; i++)); do "$@" >/dev/null 2>&1 && return 0; sleep 0.2; done
    echo "demo: gave up waiting for $desc after ${secs}s" >&2
    return 1
}
job_state() { sacct -n -P -X -j "$1" -o State 2>/dev/null | head -1 | cut -d' ' -f1; }
ended() { case $(job_state "$1") in COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY) return 0 ;; esac; return 1; }
has_comment() { sacct -n -P -X -j "$1" -o Comment | grep -q 'SATTR1:'; }
has_admin_comment() { sacct -n -P -X -j "$1" -o AdminComment | grep -q '^SATTR1: gpu_hardware'; }
# expect JOB CAUSE NODE: the stored verdict says CAUSE and names NODE; else the demo fails (after
# showing everything), so `make demo` cannot pass while showing a wrong answer.
PROBLEMS=()
expect() {
    local got
    # sattr's own interpreter: the checkout's .venv is not there where the demo runs in a
    # versions root (the cluster's venv is)
    got=$("$SATTR" "$1" --json 2>/dev/null | "$(dirname "$SATTR")/python" -c '
import json, sys
v = json.load(sys.stdin)
print(v.get("cause", ""), ",".join((v.get("culprit") or {}).get("nodes") or []))' 2>/dev/null || true)
    case " $got," in
        " $2 "*"$3,"*) ;;
        *) PROBLEMS+=("job $1: expected $2 on $3, the verdict says: ${got:-nothing}") ;;
    esac
}
finish() {
    if [ ${#PROBLEMS[@]} -gt 0 ]; then
        printf 'demo: FAILED: %s\n' "${PROBLEMS[@]}" >&2
        exit 1
    fi
}
# Until the job ended, its verdict is stored and its Comment carries it.
wait_verdict() {
    wait_for "job $1 to end" 180 ended "$1"
    say "state: $(job_state "$1")"
    wait_for "the verdict of job $1" 90 "$SATTR" show "$1"
    wait_for "the Comment of job $1" 60 has_comment "$1"
}

cat > "$WORK/train.sh" <<'EOF'
#!/bin/bash
#SBATCH -N2 --nodelist=n1,n2 --job-name=demo-train --gres=gpu:2
# Rank 1 runs on n2: it reports the CUDA error once the GPU is gone; rank 0 then sees its
# peer vanish and its watchdog times out.
srun -l bash -c '
  echo "step 100 loss 2.31"
  if [ "$SLURM_PROCID" = 1 ]; then
    for _ in $(seq 150); do [ -e fault-injected ] && break; sleep 0.2; done
    echo "RuntimeError: CUDA error: unspecified launch failure" >&2
    exit 1
  fi
  for _ in $(seq 150); do [ -e fault-injected ] && break; sleep 0.2; done
  sleep 1
  echo "[rank0]:[E ProcessGroupNCCL.cpp:616] [Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=812, OpType=ALLREDUCE, NumelIn=1048576, NumelOut=1048576, Timeout(ms)=600000) ran for 600047 milliseconds before timing out." >&2
  exit 1
'
EOF
chown sattrtest "$WORK/train.sh"

step "1. a 2-node training job (user sattrtest) on n1,n2"
cd "$WORK"
JOB=$(runuser -u sattrtest -- env SLURM_CONF="$SLURM_CONF" sbatch --parsable --comment="demo run" train.sh)
say "job $JOB submitted"
# Inject only once both ranks are running, so the Xid falls inside the job's window on n2.
wait_for "job $JOB to run" 120 grep -q '^1: step 100' "$WORK/slurm-$JOB.out"
say "running on $(squeue -h -j "$JOB" -o %N); both ranks at step 100"
LINE="NVRM: Xid (PCI:0000:3b:00): 79, pid=$$, name=python, GPU has fallen off the bus."
printf '%s %s kernel: %s\n' "$(date +%Y-%m-%dT%H:%M:%S%:z)" "$(hostname -s)" "$LINE" >> "$BASE/kernel/n2.log"
touch "$WORK/fault-injected"
say "n2's kernel log: $LINE"
wait_verdict "$JOB"

step "sattr $JOB   (what an admin or the job's user sees)"
"$SATTR" "$JOB" || true
expect "$JOB" gpu_hardware n2
step "sinfo -R   (n2 drained by slurm-attr before its next job)"
sinfo -R -o '%N|%T|%E' | column -t -s '|'
sinfo -h -n n2 -o '%E' | grep -q "^SATTR: .*job $JOB" || PROBLEMS+=("n2 is not drained by slurm-attr for job $JOB")
step "sacct -j $JOB -o JobID,State,Comment   (the user's comment kept, the verdict after it)"
sacct -X -j "$JOB" -o JobID,State,Comment%120
step "sacct -j $JOB -o AdminComment   (the admins' copy: the job's user cannot change it)"
wait_for "the AdminComment of job $JOB" 60 has_admin_comment "$JOB" \
    || PROBLEMS+=("job $JOB: no verdict in its AdminComment")
sacct -X -j "$JOB" -o JobID,AdminComment%100
sacct -n -P -X -j "$JOB" -o Comment | grep -q '^demo run; SATTR1: gpu_hardware' \
    || PROBLEMS+=("job $JOB: the Comment does not keep the user's text followed by the verdict")
step "sattr undrain n2   (resumes only nodes slurm-attr drained; the demo leaves the cluster clean)"
"$SATTR" undrain n2 --reason "demo finished"
wait_for "n2 to be idle" 30 sh -c "sinfo -h -n n2 -o %T | grep -qx idle"
sinfo -N -n n2 -o '%N %T'

step "sattr nodes   (the fleet: culprit of, GPU-hours the failures cost, hardware events, drain state)"
"$SATTR" nodes --since 1d || true
FLEET=$WORK/fleet.html
"$SATTR" report --fleet --since 1d --html "$FLEET" >/dev/null && say "fleet report (HTML, no network needed): $FLEET"
say "Prometheus metrics: sattr metrics (or the textfile [metrics] textfile; docs/metrics.md)"

if [ "${SATTR_DEMO_FR:-1}" = 0 ]; then
    # `make test-versions` runs the demo in roots whose Python the torch wheel does not fit.
    step "done in $(( $(date +%s) - T0 )) s (the torch job skipped: SATTR_DEMO_FR=0)"
    finish
    exit 0
fi
step "2. a real 4-rank torch (Gloo) job with a collective size bug on rank 3"
PY=$VENV/bin/python
if ! "$PY" -c 'import torch' 2>/dev/null; then
    echo "demo: torch is missing from $VENV (make demo installs it: cluster/deps.sh venv)" >&2
    exit 1
fi
cat > "$WORK/fr.sh" <<EOF
#!/bin/bash
#SBATCH -N2 -n4 -t 3 --job-name=demo-fr --nodelist=n3,n4
export MASTER_PORT=\$((20000 + SLURM_JOB_ID % 20000))
srun -l $PY $REPO/cluster/jobs/fr_train.py --fault size --rank 3 --step 3
EOF
JOB2=$(sbatch --parsable "$WORK/fr.sh")
say "job $JOB2 submitted"
wait_verdict "$JOB2"
expect "$JOB2" collective_mismatch n4
step "sattr $JOB2"
"$SATTR" "$JOB2" || true
step "sattr fr $JOB2   (Flight Recorder: ranks x collectives, the first divergence marked)"
"$SATTR" fr "$JOB2" || true
REPORT=$WORK/report-$JOB2.html
"$SATTR" report "$JOB2" --html "$REPORT" >/dev/null
step "sacct -j $JOB2 -o JobID,State,Comment"
sacct -X -j "$JOB2" -o JobID,State,Comment%120

step "done in $(( $(date +%s) - T0 )) s"
say "HTML report of job $JOB2: $REPORT"
say "more: sattr --help; sattr list; sattr nodes; sattr drains"
finish
