"""The node parts are waited for until [analysis] node_wait_s after the job's end, not again from
every attempt: a `sattr retry` after a full spool (200 jobs, none with its node parts) otherwise
waited node_wait_s per job and ran past its timer (found by `make soak`)."""
from __future__ import annotations

import json
import os
import time
import zlib

from slurm_attr.pipeline import ctldrecord, finish, intake


def test_node_wait_counts_from_the_jobs_end(spool_cfg):
    spool_cfg.analysis.node_wait_s = 20.0
    now = 1_000_000.0
    assert finish.node_wait_s(spool_cfg, None, now) == 20.0  # nothing says when it ended: the whole wait
    assert finish.node_wait_s(spool_cfg, now - 5, now) == 15.0
    assert finish.node_wait_s(spool_cfg, now - 20, now) == 0.0
    assert finish.node_wait_s(spool_cfg, now - 3600, now) == 0.0
    # near miss: a clock that puts the end in the future never waits longer than node_wait_s
    assert finish.node_wait_s(spool_cfg, now + 600, now) == 20.0


def _bundle(spool_cfg, job_id: str, nodes: list[str], present: list[str]) -> str:
    bdir = os.path.join(spool_cfg.paths.spool, job_id)
    os.makedirs(bdir)
    with open(os.path.join(bdir, "job.json"), "w") as f:
        json.dump({"job_id": job_id, "slurm_job_id": job_id, "nodes": nodes, "state": "FAILED",
                   "exit_code": "1:0"}, f)
    for n in present:
        os.makedirs(os.path.join(bdir, "nodes", n))
        with open(os.path.join(bdir, "nodes", n, "collect.json"), "w") as f:
            f.write("{}")
    return bdir


class _Accounting:
    """Accounting that knows the job's final state at once (settle does not wait)."""

    def sacct_job(self, job_id):
        return {"JobIDRaw": job_id, "JobID": job_id, "State": "FAILED", "ExitCode": "1:0", "DerivedExitCode": "1:0",
                "Start": "2026-12-07T07:00:00", "End": "2026-12-07T07:01:00", "NodeList": "n[1-2]"}

    def show_job(self, job_id):
        return None


def test_a_long_ended_job_missing_a_node_part_is_analysed_without_waiting_again(spool_cfg):
    spool_cfg.analysis.node_wait_s = 60.0
    bdir = _bundle(spool_cfg, "71", ["n1", "n2"], present=["n1"])
    t0 = time.monotonic()
    job, err = finish.prepare_job(spool_cfg, _Accounting(), bdir, None, ended_at=time.time() - 600)
    assert time.monotonic() - t0 < 30  # not the 60 s node wait (the bound is loose: a loaded machine)
    assert job["state"] == "FAILED" and err == ""


def test_near_miss_a_job_that_just_ended_still_gets_its_wait(spool_cfg):
    spool_cfg.analysis.node_wait_s = 1.0
    bdir = _bundle(spool_cfg, "72", ["n1", "n2"], present=["n1"])
    t0 = time.monotonic()
    finish.prepare_job(spool_cfg, _Accounting(), bdir, None, ended_at=time.time())
    assert time.monotonic() - t0 >= 0.9  # waited for n2's part, in case its epilog was still writing


def test_a_front_record_read_late_keeps_the_jobs_end(spool_cfg):
    os.makedirs(spool_cfg.intake.queue_dir)
    env = {"SLURM_JOB_ID": "73", "SLURM_JOB_NODELIST": "n1", "SLURM_JOB_EXIT_CODE2": "1:0", "SLURM_JOB_UID": "0",
           "SLURM_JOB_USER": "root"}
    body = b"".join(f"{k}={v}".encode() + b"\0" for k, v in env.items())
    data = body + ctldrecord.TRAILER + f"{len(body)},{zlib.crc32(body):08x}".encode() + b"\0"
    path = os.path.join(spool_cfg.intake.queue_dir, "73" + intake.ENV_SUFFIX)
    with open(path, "wb") as f:
        f.write(data)
    ended = time.time() - 300  # the hook wrote it at the job's end; a busy worker reads it now
    os.utime(path, (ended, ended))
    assert ctldrecord.ingest(spool_cfg) == 1
    doc = intake.load(spool_cfg, "73")
    assert abs(doc["since"] - ended) < 1.0
    # near miss: a torn record (no trailer) is recorded by name, with the same end
    path2 = os.path.join(spool_cfg.intake.queue_dir, "74" + intake.ENV_SUFFIX)
    with open(path2, "wb") as f:
        f.write(body[:10])
    os.utime(path2, (ended, ended))
    assert ctldrecord.ingest(spool_cfg) == 1
    assert abs(intake.load(spool_cfg, "74")["since"] - ended) < 1.0
