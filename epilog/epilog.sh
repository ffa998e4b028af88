#!/bin/bash
# slurm-attr node Epilog (slurm.conf: Epilog=/usr/libexec/slurm-attr/epilog.sh).
# Runs as root on every node of the job. Collects this node's evidence into the
# bundle, and drains this node itself when its kernel log is fatal. Always exits 0:
# a failing Epilog would drain the node with "Epilog error" for no hardware reason.
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export SLURM_CONF=${SLURM_CONF:-/etc/slurm/slurm.conf}
# `make install` puts slurm-attr in a venv of its own (Debian's python3 refuses system-wide pip).
PY=${SLURM_ATTR_PYTHON:-/opt/slurm-attr/bin/python}
[ -x "$PY" ] || PY=python3
# Hard stop, well under PrologEpilogTimeout; the collector's own budget is smaller still.
LIMIT=${SLURM_ATTR_EPILOG_TIMEOUT:-40}
TAG="slurm_attr[${SLURM_JOB_ID:-?}]"

timeout -k 2 "$LIMIT" "$PY" -m slurm_attr.hooks node 2>&1 | logger -t "$TAG" -p daemon.info 2>/dev/null
rc=${PIPESTATUS[0]}
[ "$rc" = 124 ] || [ "$rc" = 137 ] && logger -t "$TAG" -p daemon.err "node epilog killed after ${LIMIT}s" 2>/dev/null
exit 0
