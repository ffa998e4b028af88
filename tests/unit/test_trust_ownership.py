"""Issue 10 item 5: the collector never reads or removes a job dir the job's user does not own."""
import os
import time

import pytest

from slurm_attr.collect.node import NodeJob, cleanup, collect_node

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to chown the job dir")


def _jobdir(cfg, job, owner):
    d = os.path.join(cfg.paths.evidence_root, job)
    for k in ("fr", "probe", "nccl"):
        os.makedirs(os.path.join(d, k))
    with open(os.path.join(d, "fr", "nccl_trace_rank_0"), "wb") as f:
        f.write(b"planted by another user")
    for root, dirs, files in os.walk(d):
        for n in dirs + files:
            os.chown(os.path.join(root, n), owner, owner)
    os.chown(d, owner, owner)
    return d


def test_a_dir_owned_by_another_uid_is_neither_read_nor_removed(cfg):
    d = _jobdir(cfg, "60", owner=2002)  # planted by uid 2002 before job 60 (uid 1001) started
    doc = collect_node(cfg, NodeJob(job_id="60", node="n1", bundle_key="60", uid=1001, start=time.time() - 5))
    assert doc["sources"]["fr"]["status"] == "error" and "not read" in doc["sources"]["fr"]["detail"]
    assert not os.path.exists(os.path.join(cfg.paths.spool, "bundles", "60", "nodes", "n1", "fr"))
    assert os.path.isdir(d) and "jobdir_cleanup" in doc["sources"]
    _ranks, why = cleanup(cfg, NodeJob(job_id="60", node="n1", bundle_key="60", uid=1001))
    assert "owned by uid 2002" in why and os.path.isdir(d)


def test_the_jobs_own_dir_is_read_and_removed(cfg):
    d = _jobdir(cfg, "61", owner=1001)  # near miss of the above: the job's own uid
    doc = collect_node(cfg, NodeJob(job_id="61", node="n1", bundle_key="61", uid=1001, start=time.time() - 5))
    assert doc["sources"]["fr"]["status"] == "ok" and doc["sources"]["fr"]["files"] == 1
    assert not os.path.exists(d)
