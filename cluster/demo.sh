#!/usr/bin/env bash
# `make demo`: what slurm-attr says about two failing jobs on the local Slurm.
#
# 1. A 2-node job whose GPU on its second node falls off the bus. This machine has no GPU, so
#    the fault is written where that node's epilog reads its kernel log (the test cluster's
#    kernel source is a file per node), while the job runs there: an Xid 79, as the NVIDIA
#    driver logs it. The ranks fail the way NCCL jobs do when a peer's GPU dies. slurm-attr
#    names the node and its GPU, drains it before it can take the next job, writes the verdict
#    into the Comment and AdminComment, and requeues the job, which runs again elsewhere.
#    1b: a GPU that fails while its node is idle is caught by the next job's Prolog (the gate).
#    1c: the driver's Xid 154 "Node Reboot Required": drained, rebooted through Slurm, resumed.
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

# The demo runs as a site that opted in to closing the loop ([actions]; a site's default is off):
# requeue a job that ended on hardware around the drained node, and (from 1c on) reboot a node
# whose driver asks for it, through Slurm's RebootProgram. The config is restored at the end.
CFG=$BASE/etc/slurm_attr.toml
cp -p "$CFG" "$WORK/slurm_attr.toml.orig"
restore_cfg() { cp -p "$WORK/slurm_attr.toml.orig" "$CFG.demo" && mv "$CFG.demo" "$CFG"; }
trap restore_cfg EXIT
# opt_in KEY=VALUE...: the lines added under [actions] (atomically: the hooks read it any time)
opt_in() { local l; for l in "$@"; do sed "/^\[actions\]$/a $l" "$CFG" > "$CFG.demo"; mv "$CFG.demo" "$CFG"; done; }
opt_in 'requeue_on = ["hardware"]' 'max_requeues = 1'
"$SATTR" breaker reset --reason "demo start" >/dev/null 2>&1 || true
rm -f "$WORK"/demo-continue "$WORK"/reboot-started "$WORK"/reboot-fault

cat > "$WORK/train.sh" <<'EOF'
#!/bin/bash
#SBATCH -N2 --job-name=demo-train --gres=gpu:2 --requeue
if [ "${SLURM_RESTART_COUNT:-0}" != 0 ]; then
  # Attempt 2, after slurm-attr requeued the job around the drained node: it resumes and ends
  # well (once the demo has shown attempt 1).
  for _ in $(seq 300); do [ -e demo-continue ] && break; sleep 0.2; done
  srun -l bash -c 'echo "step 101 loss 2.30 (attempt $((SLURM_RESTART_COUNT + 1)), resumed on $SLURMD_NODENAME)"'
  exit 0
fi
# Rank 1 runs on the second node: it reports the CUDA error once the GPU is gone; rank 0 then
# sees its peer vanish and its watchdog times out.
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

# kernel NODE LINE: what the NVIDIA driver would log on NODE (this machine has no GPU).
kernel() { printf '%s %s kernel: %s\n' "$(date +%Y-%m-%dT%H:%M:%S%:z)" "$(hostname -s)" "$2" >> "$BASE/kernel/$1.log"; }
attempts() { sacct -n -P -X -D -j "$1" -o State,NodeList 2>/dev/null | tr '\n' ' '; }

step "1. a 2-node training job (user sattrtest), requeue allowed"
cd "$WORK"
JOB=$(runuser -u sattrtest -- env SLURM_CONF="$SLURM_CONF" sbatch --parsable --comment="demo run" train.sh)
say "job $JOB submitted"
# Inject only once both ranks are running, so the Xid falls inside the job's window on its node.
wait_for "job $JOB to run" 120 grep -q '^1: step 100' "$WORK/slurm-$JOB.out"
BAD=$(scontrol show hostnames "$(squeue -h -j "$JOB" -o %N)" | sed -n 2p)
say "running on $(squeue -h -j "$JOB" -o %N); both ranks at step 100; rank 1 on $BAD"
LINE="NVRM: Xid (PCI:0000:3b:00): 79, pid=$$, name=python, GPU has fallen off the bus."
kernel "$BAD" "$LINE"
touch "$WORK/fault-injected"
say "$BAD's kernel log: $LINE"
# Not wait_verdict: the job does not end, slurm-attr requeues it (attempt 2 waits for the demo).
wait_for "the verdict of job $JOB" 180 "$SATTR" show "$JOB"
wait_for "the Comment of job $JOB" 60 has_comment "$JOB"

step "sattr $JOB   (what an admin or the job's user sees)"
SHOWN=$("$SATTR" "$JOB" 2>&1 || true)
printf '%s\n' "$SHOWN"
expect "$JOB" gpu_hardware "$BAD"
case $SHOWN in *"Requeue: requeued as attempt 2; $BAD excluded"*) ;; *) PROBLEMS+=("job $JOB: not requeued around $BAD") ;; esac
step "sinfo -R   ($BAD drained by slurm-attr before its next job)"
sinfo -R -o '%N|%T|%E' | column -t -s '|'
sinfo -h -n "$BAD" -o '%E' | grep -q "^SATTR: .*job $JOB" || PROBLEMS+=("$BAD is not drained by slurm-attr for job $JOB")
step "sacct -D -j $JOB -o JobID,State,Comment   (each attempt's row: the user's comment kept, the verdict after it)"
sacct -X -D -j "$JOB" -o JobID,State,Comment%120
step "sacct -j $JOB -o AdminComment   (the admins' copy: the job's user cannot change it)"
wait_for "the AdminComment of job $JOB" 60 has_admin_comment "$JOB" \
    || PROBLEMS+=("job $JOB: no verdict in its AdminComment")
sacct -X -j "$JOB" -o JobID,AdminComment%100
# 22.05 shows one row, "demo run; SATTR1: ...". 24.11 and 26.05 give the requeued attempt a row of
# its own without the user's comment: the user's text stays on the REQUEUED row and the verdict,
# written by job id, lands on the newest.
COMMENTS=$(sacct -n -P -X -D -j "$JOB" -o Comment)
case $COMMENTS in
    *"demo run"*"SATTR1: gpu_hardware"*) ;;
    *) PROBLEMS+=("job $JOB: no attempt's Comment keeps the user's text followed by the verdict: $COMMENTS") ;;
esac

step "attempt 2 of job $JOB   (requeued by slurm-attr; Slurm starts it once the old launch credential expires)"
touch "$WORK/demo-continue"
T1=$(date +%s)
wait_for "job $JOB's attempt 2 to end" 240 ended "$JOB"
say "attempts (state|nodes): $(attempts "$JOB")  [attempt 2 ended $(( $(date +%s) - T1 )) s after the demo let it]"
wait_for "attempt 2's verdict" 90 sh -c "'$SATTR' '$JOB' | grep -q 'Earlier attempt'"
"$SATTR" "$JOB" || true
case " $(attempts "$JOB")" in
    *" COMPLETED|"*) ;; *) PROBLEMS+=("job $JOB: attempt 2 did not complete: $(attempts "$JOB")") ;;
esac
case " $(attempts "$JOB")" in
    *"COMPLETED|"*"$BAD"*) PROBLEMS+=("job $JOB: attempt 2 ran on the drained $BAD") ;;
esac
step "sattr undrain $BAD   (resumes only nodes slurm-attr drained; the demo leaves the cluster clean)"
"$SATTR" undrain "$BAD" --reason "demo finished"
wait_for "$BAD to be idle" 30 sh -c "sinfo -h -n $BAD -o %T | grep -qx idle"
sinfo -N -n "$BAD" -o '%N %T'

step "1b. a GPU that fails while its node is idle: the next job's Prolog drains the node first"
IDLE=$(sbatch --test-only -N1 --wrap true 2>&1 | sed -n 's/.* on nodes \([^ ]*\).*/\1/p')
LINE="NVRM: Xid (PCI:0000:5e:00): 79, pid=$$, name=python, GPU has fallen off the bus."
kernel "$IDLE" "$LINE"
say "$IDLE is idle; its kernel log: $LINE"
JOB3=$(runuser -u sattrtest -- env SLURM_CONF="$SLURM_CONF" sbatch --parsable -N1 --job-name=demo-next \
       --wrap 'echo "ran on $SLURMD_NODENAME"')
say "job $JOB3 submitted: Slurm gives it $IDLE"
wait_for "the Prolog gate to drain $IDLE" 60 sh -c "sinfo -h -n $IDLE -o %E | grep -q '^SATTR: .*idle before job $JOB3'" \
    || PROBLEMS+=("$IDLE was not drained by the Prolog gate before job $JOB3")
sinfo -R -o '%N|%T|%E' | column -t -s '|'
wait_for "job $JOB3 to end" 240 ended "$JOB3"
say "job $JOB3 attempts (state|nodes): $(attempts "$JOB3")"
case " $(attempts "$JOB3")" in
    *" REQUEUED|$IDLE "*"COMPLETED|"*) ;; *) PROBLEMS+=("job $JOB3 did not run elsewhere: $(attempts "$JOB3")") ;;
esac
"$SATTR" undrain "$IDLE" --reason "demo finished" >/dev/null

step "1c. the driver asks for a reboot (Xid 154): slurm-attr drains the node and Slurm reboots it"
opt_in 'reboot = true'
JOB4=$(runuser -u sattrtest -- env SLURM_CONF="$SLURM_CONF" sbatch --parsable -N1 --no-requeue --job-name=demo-reboot \
       --wrap 'touch reboot-started; for _ in $(seq 300); do [ -e reboot-fault ] && break; sleep 0.2; done; exit 1')
wait_for "job $JOB4 to run" 120 test -e "$WORK/reboot-started"
RB=$(squeue -h -j "$JOB4" -o %N)
LINE="NVRM: Xid (PCI:0000:86:00): 154, GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)"
kernel "$RB" "$LINE"
touch "$WORK/reboot-fault"
say "job $JOB4 on $RB; $RB's kernel log: $LINE"
wait_verdict "$JOB4"
SHOWN=$("$SATTR" "$JOB4" 2>&1 || true)
printf '%s\n' "$SHOWN" | grep -E -A2 '^(Verdict|Drain decisions)' || true
case $SHOWN in *"reboot $RB: SATTR: gpu_hardware xid154"*"(applied)"*) ;; *) PROBLEMS+=("job $JOB4: no reboot of $RB") ;; esac
wait_for "$RB to be rebooted and resumed" 120 sh -c "sinfo -h -n $RB -o %T | grep -qx idle" \
    || PROBLEMS+=("$RB was not rebooted and resumed after job $JOB4")
sinfo -N -n "$RB" -o '%N %T %E'
"$SATTR" drains --since 10m | head -8 || true
rm -f "$WORK"/reboot-started "$WORK"/reboot-fault "$WORK"/demo-continue

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
