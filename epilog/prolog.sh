#!/bin/bash
# slurm-attr node Prolog (slurm.conf: Prolog=/usr/libexec/slurm-attr/prolog.sh; with
# SchedulerParameters=nohold_on_prolog_fail, or the requeued job waits held).
# Runs as root on the node before a job's tasks start. Reads the kernel events since the node's
# last job; a GPU that failed while the node was idle drains the node (reason "SATTR: ... idle
# before job N") and this script exits 1, so Slurm requeues the job that was about to start and
# keeps our reason. Everything else exits 0: a failing Prolog drains the node ("Prolog error")
# and fails the job, which must only ever happen on purpose.
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export SLURM_CONF=${SLURM_CONF:-/etc/slurm/slurm.conf}
PY=${SLURM_ATTR_PYTHON:-/opt/slurm-attr/bin/python}
[ -x "$PY" ] || PY=python3
# Hard stop: every job start waits for this. The gate takes ~50 ms on a quiet node; a fatal
# line costs the catalog (~150 ms) and two short Slurm calls.
LIMIT=${SLURM_ATTR_PROLOG_TIMEOUT:-15}
TAG="slurm_attr[${SLURM_JOB_ID:-?}]"
# The gate's own code for "drained this node on purpose"; anything else (a crash, a timeout) is 0.
DRAINED=100

out=$(timeout -k 2 "$LIMIT" "$PY" -m slurm_attr.gate 2>&1)
rc=$?
[ -n "$out" ] && printf '%s\n' "$out" | logger -t "$TAG" -p daemon.info 2>/dev/null
[ "$rc" = 124 ] || [ "$rc" = 137 ] && logger -t "$TAG" -p daemon.err "prolog gate killed after ${LIMIT}s" 2>/dev/null
[ "$rc" = "$DRAINED" ] && exit 1
exit 0
