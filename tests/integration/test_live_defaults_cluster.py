"""The plugin's live watchers at the DEFAULT [live] settings (hang_after_s 60, the learned
threshold floored at hang_floor_s 5, interval_s 1; the test cluster itself runs 5 s / 0.5 s),
with on_hang = cancel: a real hang is named long before the 60 s ceiling, and a checkpoint
beside it (rank 0 writing 20+ s while the others wait in the barrier) is left alone. The two
jobs run at once; bench/bench_live_cluster.py runs many of each. Latency is printed, not
asserted.

The hang is the probe harness (nonentry: rank 3 never launches AllReduce #450, after ~25 s of
collectives to learn from). The checkpoint is cluster/jobs/live_scenario.py: 8 real rank
processes writing their probe records, rank 0 really writing (torch.save, with torch's
worker server started by the plugin's worker_hook, so its stack says save_checkpoint).
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest

from harness import run_cmd
from slurm_attr import config as config_mod
from slurm_attr.config import Config
from slurm_attr.live import findings

pytestmark = [pytest.mark.cluster, pytest.mark.torch]  # torch's worker server gives the stacks; the versions roots have no torch

REPO = Path(__file__).resolve().parents[2]
JOBPY = REPO / "cluster" / "jobs" / "live_scenario.py"
SHM = "/dev/shm/sattr-defaults-$SLURM_JOB_ID"


def test_defaults_name_a_hang_within_seconds_and_leave_a_checkpoint_alone(cluster):
    if subprocess.run([sys.executable, "-c", "import torch"], capture_output=True).returncode != 0:
        pytest.fail("torch is not installed: `pip install torch==2.13.0` (the CPU wheel on disk)")
    d = Config().live
    hang = f"""#!/bin/bash
#SBATCH -N2 -p live -t 4
rm -f {SHM}
srun -N2 --ntasks-per-node=1 bash -c 'exec {run_cmd()} --shm {SHM} --node-index $SLURM_NODEID --scenario nonentry \\
    --ops 600 --inject 450 --step-us 2500 --per-node 4 --hang-ms 60000'
rm -f {SHM}
"""
    info = Path(cluster.workdir()) / f"defaults-{time.time_ns()}.json"
    ckpt = f"""#!/bin/bash
#SBATCH -N2 -n8 -O -p live -t 5
srun {sys.executable} {JOBPY} checkpoint --t0 $(( $(date +%s) + 20 )) --seed 2 --episodes 1 --info {info} --torch
"""
    spool = config_mod.load(str(cluster.config_path)).paths.spool
    with cluster.settings(live={"hang_after_s": d.hang_after_s, "hang_floor_s": d.hang_floor_s,
                                "interval_s": d.interval_s, "on_hang": "cancel"}):
        jobs = [cluster.sbatch(hang), cluster.sbatch(ckpt)]
        try:
            f = None
            deadline = time.monotonic() + 150
            while f is None and time.monotonic() < deadline:
                doc = findings.load(spool, jobs[0]) or {}
                f = next((x for x in doc.get("findings", []) if x.get("label", "").startswith("world ")), None)
                time.sleep(0.5)
            cluster.run(["scancel", jobs[0]], check=False)
            state = cluster.wait_state(jobs[1], timeout=240)
        finally:
            for j in jobs:
                cluster.run(["scancel", j], check=False)
    assert f is not None, f"no hang finding for job {jobs[0]}"
    assert (f["class"], f["ranks"]) == ("H1", [3]), f
    assert f["threshold_s"] < d.hang_after_s, f  # learned, not the ceiling
    latency = f["detected_ns"] / 1e9 - datetime.fromisoformat(f["waiting_since"]).timestamp()
    doc = findings.load(spool, jobs[1]) or {}
    plan = json.loads(info.read_text())
    info.unlink()
    # the near miss: the checkpoint ran (a busy note names rank 0's save_checkpoint), no hang, not cancelled
    assert [x for x in doc.get("findings", []) if x.get("class", "").startswith("H")] == [], doc
    assert state == "COMPLETED", state
    notes = doc.get("notes") or []
    assert notes and all(n["why"].startswith("rank 0: checkpoint at ") for n in notes), notes
    print(f"\ndefaults: H1 rank 3 {latency:.2f} s after the stall (threshold {f['threshold_s']} s); "
          f"checkpoint job ({plan['seconds']} s) {state}, {len(notes)} busy note(s), no finding")
