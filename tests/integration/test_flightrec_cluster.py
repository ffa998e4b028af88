"""A real torch (Gloo) job on the cluster with a collective bug: Flight Recorder dumps land
in the job's dir through the plugin's env, the epilog bundles them, the verdict names the rank."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.cluster, pytest.mark.torch]

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "cluster" / "jobs" / "fr_train.py"


@pytest.fixture(scope="module")
def fr_job(cluster):
    if subprocess.run([sys.executable, "-c", "import torch"], capture_output=True).returncode != 0:
        pytest.fail("torch is not installed: `pip install torch==2.13.0` (the CPU wheel on disk)")
    script = ("#!/bin/bash\n#SBATCH -N2 -n4 -t 3\n"
              "export MASTER_PORT=$((20000 + SLURM_JOB_ID % 20000))\n"
              f"srun -l {sys.executable} {SCRIPT} --fault size --rank 3 --step 3\n")
    job = cluster.sbatch(script)
    assert cluster.wait_state(job, timeout=180) == "FAILED"
    return job, cluster.verdict(job)


def test_verdict_names_the_rank_and_its_node(cluster, fr_job):
    job, v = fr_job
    assert v["cause"] == "collective_mismatch", v["summary"]
    assert v["culprit"]["ranks"] == [3]
    facts = json.loads((cluster.bundle(job) / "job.json").read_text())
    # Block distribution: ranks 2 and 3 run on the job's second node.
    assert v["culprit"]["nodes"] == [facts["nodes"][1]]
    root = next(s for s in v["symptoms"] if s["role"] == "root")
    assert root["id"] == "fr.collective_mismatch" and root["trusted"] is False
    assert root["fields"]["kind"] == "size"
    # FR evidence is untrusted: it never drains.
    assert all(not a["applied"] for a in v["actions"])
    assert "SATTR1: collective_mismatch" in cluster.comment(job)


def test_dumps_are_in_the_bundle_and_the_matrix_shows_them(cluster, fr_job, tmp_path):
    job, _ = fr_job
    dumps = sorted(p.name for p in cluster.bundle(job).glob("nodes/*/fr/nccl_trace_rank_*"))
    assert dumps == [f"nccl_trace_rank_{r}" for r in range(4)]
    out = cluster.sattr("fr", job).stdout
    assert "rank 3" in out or "3" in out
    html = tmp_path / "r.html"
    proc = cluster.sattr("report", job, "--html", str(html))
    assert proc.returncode == 0, proc.stderr
    assert "culprit" in html.read_text()
