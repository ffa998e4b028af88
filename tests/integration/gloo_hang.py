"""The live tests' Gloo hang: a torch job whose rank 1 sleeps before a collective the others
wait in (test_live_dumps.py with watchers of its own, test_live_plugin.py with the plugin's).
Each rank runs torch's worker server (TORCH_WORKER_SERVER_SOCKET, set by the job script or by
the plugin's worker_hook=), so a watcher can pull its Flight Recorder and stack."""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

TRAIN = """import os, sys, time
from datetime import timedelta
import torch, torch.distributed as dist
rank, world = int(os.environ["SLURM_PROCID"]), int(os.environ["SLURM_NTASKS"])
assert os.environ.get("TORCH_WORKER_SERVER_SOCKET", "").endswith("/ws/rank_%d.sock" % rank)  # its server's
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%s" % os.environ["MASTER_PORT"], rank=rank,
                        world_size=world, timeout=timedelta(seconds=900))
t = torch.ones(8)
for _ in range(5):
    dist.all_reduce(t)
print("rank", rank, "ready", flush=True)
if rank == 1:
    time.sleep(900)  # SLEEPS HERE
dist.all_reduce(t)  # WAITS HERE
"""


def line(marker: str) -> int:
    """The script's line holding marker (SLEEPS HERE, WAITS HERE): what the stacks must name."""
    return next(i for i, ln in enumerate(TRAIN.splitlines(), 1) if marker in ln)


def write_train(cluster) -> Path:
    """The script in the cluster's work dir (the ranks run it with this interpreter's torch)."""
    if subprocess.run([sys.executable, "-c", "import torch"], capture_output=True).returncode != 0:
        pytest.fail("torch is not installed: `pip install torch==2.13.0` (the CPU wheel on disk)")
    train = Path(cluster.workdir()) / f"hang-{time.time_ns()}.py"
    train.write_text(TRAIN)
    return train
