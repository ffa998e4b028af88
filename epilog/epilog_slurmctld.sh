#!/bin/sh
# slurm-attr EpilogSlurmctld (slurm.conf: EpilogSlurmctld=/usr/libexec/slurm-attr/epilog_slurmctld.sh).
# Runs once per job on the controller, with no PATH and no SLURM_CONF (slurmctld gives
# neither). Records the ended job in the intake from its own environment (no RPC to slurmctld),
# starts an analysis worker if a slot is free (pipeline/record.py), exits 0.
# POSIX sh, not bash: at a burst thousands of these start beside slurmctld, and dash starts in
# a fraction of bash's time (bench/bench_record_front.py measures the difference).
PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
SLURM_CONF=${SLURM_CONF:-/etc/slurm/slurm.conf}
export PATH SLURM_CONF
# `make install` puts slurm-attr in a venv of its own (Debian's python3 refuses system-wide pip).
PY=${SLURM_ATTR_PYTHON:-/opt/slurm-attr/bin/python}
[ -x "$PY" ] || PY=python3
# The native front records the job and starts a worker in a few milliseconds (spank/tools/
# sattr_record.c); it hands anything it cannot do itself to the Python hook below.
REC=${SLURM_ATTR_RECORD:-/usr/libexec/slurm-attr/sattr-record}
if [ -x "$REC" ]; then
    SLURM_ATTR_PYTHON=$PY
    export SLURM_ATTR_PYTHON
    exec "$REC"
fi
LIMIT=${SLURM_ATTR_EPILOG_TIMEOUT:-40}
TAG="slurm_attr[${SLURM_JOB_ID:-?}]"

# The hook's exit status through the pipe to logger (no PIPESTATUS in POSIX sh): fd 3 carries it.
rc=$({ { timeout -k 2 "$LIMIT" "$PY" -m slurm_attr.hooks controller 2>&1; echo $? >&3; } |
       logger -t "$TAG" -p daemon.info >/dev/null 2>&1; } 3>&1)
if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
    logger -t "$TAG" -p daemon.err "controller epilog killed after ${LIMIT}s" 2>/dev/null
fi
exit 0
