"""The native probe through the real pipeline: the plugin's env in the task, probe records
in the job's probe dir, collected by the node epilog, analysed into the verdict."""
from __future__ import annotations

from pathlib import Path

import pytest

from slurm_attr.probe import layout as L
from slurm_attr.probe import record

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
HARNESS = REPO / "spank" / "build" / "tests" / "probe_harness"


def test_probe_env_points_at_the_installed_library(cluster):
    out = cluster.run(["srun", "-N1", "-l", "env"], user="sattrtest").stdout
    env = dict(line.split(": ", 1)[1].split("=", 1) for line in out.splitlines() if "=" in line)
    lib = cluster.base / "lib" / "libnccl-profiler-sattr.so"
    assert env["NCCL_PROFILER_PLUGIN"] == lib.name
    assert env["LD_LIBRARY_PATH"].split(":")[0] == str(lib.parent)
    assert env["SLURM_ATTR_PROBE_DIR"] == f"{env['SLURM_ATTR_DIR']}/probe"


def test_probe_records_from_a_job_name_the_rank_that_never_entered(cluster):
    if not HARNESS.exists():
        pytest.fail(f"{HARNESS} missing: run `make -C spank test` first")
    # The harness plays an 8-rank NCCL job through the installed plugin (rank 3 never launches
    # the collective the others wait in), then the job leaves the records where NCCL would.
    script = f"""#!/bin/bash
#SBATCH -N1
set -e
lib=$(echo "$LD_LIBRARY_PATH" | cut -d: -f1)/$NCCL_PROFILER_PLUGIN
t=$(mktemp -d)
{HARNESS} run --plugin "$lib" --out "$t" --scenario nonentry
cp "$t"/nodes/*/probe/*.probe "$SLURM_ATTR_PROBE_DIR"/
rm -rf "$t"
sleep 3   # the hang outlives the probe's 2 s stall gate before the job is killed
exit 1
"""
    job = cluster.sbatch(script)
    assert cluster.wait_state(job) == "FAILED"
    v = cluster.verdict(job)
    files = list(cluster.bundle(job).glob("nodes/*/probe/*.probe"))
    assert len(files) == 8
    # the installed plugin writes layout version 2 (lane pool after the slots), whole
    recs = [record.parse(f.read_bytes(), str(f)) for f in files]
    assert {r.layout_ver for r in recs} == {L.LAYOUT_VER} and {f.stat().st_size for f in files} == {L.FILE_SIZE}
    probe = [s for s in v["symptoms"] if s["id"] == "probe.non_entry"]
    assert [s["rank"] for s in probe] == [3], v["symptoms"]
    assert probe[0]["trusted"] is False
    assert v["cause"] == "rank_stuck" and 3 in v["culprit"]["ranks"], v["summary"]
