"""The probe harness as a job runs it (spank/tests/probe_harness*.c): where it is, and the
start of its command line in a task, with the probe library the plugin set up there."""
from __future__ import annotations

from pathlib import Path

import pytest

HARNESS = Path(__file__).resolve().parents[2] / "spank" / "build" / "tests" / "probe_harness"
# Shared ring state of a step's harness processes (the pretend nodes share this machine's /dev/shm)
SHM = "/dev/shm/sattr-harness-$SLURM_JOB_ID"
# The plugin puts the probe's directory first on LD_LIBRARY_PATH and its name in NCCL_PROFILER_PLUGIN
PLUGIN = '"$(echo "$LD_LIBRARY_PATH" | cut -d: -f1)/$NCCL_PROFILER_PLUGIN"'


def run_cmd() -> str:
    """``probe_harness run --plugin <the task's probe>``: the rest is the caller's."""
    if not HARNESS.exists():
        pytest.fail(f"{HARNESS} missing: run `make -C spank test` first")
    return f"{HARNESS} run --plugin {PLUGIN}"
