"""The catch-up from accounting (pipeline/catchup.py) on the real cluster: a job whose controller
hook record is lost before any worker read it (a crash before the unsynced record reached the
disk, a hook killed, a record deleted by hand) gets its verdict from `sattr retry`, with the
state accounting gives. Near miss beside it: a job whose record is there is the hook's, not the
catch-up's.

Every worker slot is held while the jobs end (a test holds the slots' locks, so the hooks start no
worker and their records stay in the queue), then one record is deleted.
"""
from __future__ import annotations

import fcntl
import json
import os
import time
from contextlib import contextmanager

import pytest

from slurm_attr.config import load
from slurm_attr.pipeline import pool

from test_drain import sattr

pytestmark = pytest.mark.cluster


@contextmanager
def every_slot_held(cfg, timeout=120):
    """The workers' slot locks, each waited for (a worker still draining gives its slot back)."""
    fds = []
    deadline = time.monotonic() + timeout
    try:
        for i in range(pool.slots(cfg)):
            fd = os.open(os.path.join(cfg.intake.queue_dir, f".worker-{i}.lock"), os.O_RDWR | os.O_CREAT, 0o600)
            fds.append(fd)
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    assert time.monotonic() < deadline, "a worker kept its slot"
                    time.sleep(0.2)
        yield
    finally:
        for fd in fds:
            os.close(fd)


def _wait_file(path, timeout=60):
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.1)


def test_a_job_whose_hook_record_was_lost_gets_its_verdict_from_the_catch_up(cluster):
    # A short window keeps this run to the jobs of the last minutes (earlier tests' jobs may have
    # none on purpose, e.g. with the controller side turned off).
    # A hook's grace of 5 s (the site default: 60 s) keeps the wait short; the kept job's record
    # shows the hook still beats it.
    with cluster.settings(intake={"catchup_window_s": 240, "catchup_min_age_s": 5}):
        cfg = load(str(cluster.config_path))
        with every_slot_held(cfg):
            lost = cluster.sbatch("#!/bin/bash\n#SBATCH -N1 -w n1\nexit 3\n", user="sattrtest")
            kept = cluster.sbatch("#!/bin/bash\n#SBATCH -N1 -w n2\nexit 0\n", user="sattrtest")
            assert cluster.wait_state(lost) == "FAILED" and cluster.wait_state(kept) == "COMPLETED"
            for j in (lost, kept):
                _wait_file(os.path.join(cfg.intake.queue_dir, f"{j}.env"))
            os.unlink(os.path.join(cfg.intake.queue_dir, f"{lost}.env"))  # the record is gone
            ended = time.time()
            # a job that ended less than catchup_min_age_s ago is left to its own hook: wait that out
            time.sleep(cfg.intake.catchup_min_age_s + 2)
            proc = sattr(cluster, "retry", "--json")
        assert proc.returncode == 0, proc.stderr
        out = json.loads(proc.stdout)
        assert lost in out["caught_up"] and kept not in out["caught_up"], out  # near miss: its record was there
        assert out["catchup_error"] == "" and out["attempted"].get(lost) == "stored", out
        v = cluster.verdict(lost, timeout=30)
        assert v["job_id"] == lost and v["cause"] != "none", v
        assert cluster.sacct(lost, "State,ExitCode") == {"State": "FAILED", "ExitCode": "3:0"}
        from slurm_attr.store import Store

        job = Store(str(cluster.db_path)).job(lost)
        assert job["state"] == "FAILED" and job["exit_code"] == 3 and job["nodes"] == ["n1"]
        assert job["user"] == "sattrtest"
        # the kept job: the hook's own record, analysed as usual
        proc = sattr(cluster, "retry", "--all", "--json")
        assert proc.returncode == 0, proc.stderr
        assert lost not in json.loads(proc.stdout)["caught_up"]  # stored now: never a second time
        assert cluster.verdict(kept, timeout=60)["cause"] == "none"
        print(f"FIGURE catch-up: lost record's job {lost} stored {time.time() - ended:.1f}s after its record "
              f"was deleted (the catch-up waits {cfg.intake.catchup_min_age_s:.0f}s for a hook)")
