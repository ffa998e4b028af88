#!/bin/sh
# slurm-attr live watcher (plugstack.conf: live_watcher=/usr/libexec/slurm-attr/live_watch.sh).
# Started by the SPANK plugin as root, detached, once per node and job step, with a clean
# environment; ends with the step. Its exit status reaches nobody: the job never waits on it.
# `make install` puts slurm-attr in a venv of its own; a site wrapper may name another.
PY=${SLURM_ATTR_PYTHON:-/opt/slurm-attr/bin/python}
[ -x "$PY" ] || PY=python3
exec "$PY" -m slurm_attr.live "$@"
