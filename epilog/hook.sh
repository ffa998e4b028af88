#!/bin/sh
# slurm-attr's Slurm hooks, one script for the three roles. slurm.conf names each through its
# link (Slurm passes a hook no arguments, so the role is the name it was called by, or $1):
#
#   Prolog=/usr/libexec/slurm-attr/prolog.sh                     prolog: the gate before the next
#                                                                job (slurm_attr/gate.py)
#   Epilog=/usr/libexec/slurm-attr/epilog.sh                     node: this node's evidence into
#                                                                the bundle, the fast-path drain
#   EpilogSlurmctld=/usr/libexec/slurm-attr/epilog_slurmctld.sh  controller: the ended job
#                                                                recorded in the intake, no RPC
#
# Runs as root with no PATH, and on the controller no SLURM_CONF (slurmctld gives neither).
# Exits 0 in every case but one: the gate's deliberate drain (the Python entry's 100) is the
# Prolog's 1, so Slurm requeues the job about to start and keeps our reason. Anything else
# non-zero would cost a node ("Epilog error", "Prolog error" drains) for no hardware reason.
# POSIX sh, not bash: at a burst thousands of controller hooks start beside slurmctld, and dash
# starts in a fraction of bash's time (bench/bench_record_front.py measures the difference).
PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
SLURM_CONF=${SLURM_CONF:-/etc/slurm/slurm.conf}
export PATH SLURM_CONF
# `make install` puts slurm-attr in a venv of its own (Debian's python3 refuses system-wide pip).
PY=${SLURM_ATTR_PYTHON:-/opt/slurm-attr/bin/python}
[ -x "$PY" ] || PY=python3
TAG="slurm_attr[${SLURM_JOB_ID:-?}]"

role=${1:-$(basename "$0" .sh)}
case $role in
    prolog) ;;
    node | epilog) role=node ;;
    controller | epilog_slurmctld) role=controller ;;
    *)
        logger -t "$TAG" -p daemon.err "hook.sh: no role '$role' (prolog, node, controller)" 2>/dev/null
        exit 0 ;;
esac

if [ "$role" = controller ]; then
    # The native front records the job and starts a worker in a few milliseconds (spank/tools/
    # sattr_record.c); it hands anything it cannot do itself to the Python hook below.
    REC=${SLURM_ATTR_RECORD:-/usr/libexec/slurm-attr/sattr-record}
    if [ -x "$REC" ]; then
        SLURM_ATTR_PYTHON=$PY
        export SLURM_ATTR_PYTHON
        exec "$REC"
    fi
fi

# Hard stops. Every job start waits for the Prolog: the gate takes ~50 ms on a quiet node, a
# fatal line costs the catalog (~150 ms) and two short Slurm calls. The epilogs stop themselves
# well inside PrologEpilogTimeout; the collector's own budget is smaller still.
case $role in
    prolog) limit=${SLURM_ATTR_PROLOG_TIMEOUT:-15}; set -- slurm_attr.gate ;;
    node) limit=${SLURM_ATTR_EPILOG_TIMEOUT:-40}; set -- slurm_attr.hooks node ;;
    controller) limit=${SLURM_ATTR_EPILOG_TIMEOUT:-40}; set -- slurm_attr.hooks controller ;;
esac

# The entry's output to syslog and its exit status through fd 3 (no PIPESTATUS in POSIX sh).
rc=$({ { timeout -k 2 "$limit" "$PY" -m "$@" 2>&1; echo $? >&3; } |
       logger -t "$TAG" -p daemon.info >/dev/null 2>&1; } 3>&1)
if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
    logger -t "$TAG" -p daemon.err "$role hook killed after ${limit}s" 2>/dev/null
fi
# The gate's own code for "drained this node on purpose" (gate.RC_DRAINED); a crash is 0.
if [ "$role" = prolog ] && [ "$rc" = 100 ]; then
    exit 1
fi
exit 0
