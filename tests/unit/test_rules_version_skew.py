"""One node on another NVIDIA driver or NCCL than the rest of the job (rules/version_skew.py),
through the verdict and the drain policy; and the node collector's reading of the driver's own
version file (collect/software.py)."""
from __future__ import annotations

import os

from slurm_attr.collect.software import driver_version_text
from slurm_attr.drain import candidates
from slurm_attr.model import Coverage, Evidence, Symptom
from slurm_attr.rules.catalog import load_catalog
from slurm_attr.rules.extract import extract_lines
from slurm_attr.rules.jobwide import before_verdict
from slurm_attr.verdict import decide

NODES = ["n1", "n2", "n3", "n4"]
JOB = {"job_id": "910", "nodes": NODES, "ranks": {str(i): n for i, n in enumerate(NODES)}, "state": "FAILED",
       "exit_code": 1, "start_time": "2025-03-02T09:00:00", "end_time": "2025-03-02T09:01:00"}
COV = [Coverage("kernel", n, "ok", "") for n in NODES] + [Coverage("stdout", None, "ok", "")]
PROC = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  {v}  Tue Mar  5 22:42:15 UTC 2024\nGCC version:  gcc version 12.2.0\n"


def driver_lines(odd="550.54.15"):
    """Every node's software.log as the rules read it: n4 on ``odd``, the others on 535."""
    cat = load_catalog()
    out = []
    for n in NODES:
        text = PROC.format(v=odd if n == "n4" else "535.161.08")
        out += extract_lines(cat, "kernel", n, f"nodes/{n}/software.log", enumerate(text.splitlines(), 1))
    return out


def refused_on_n4():
    # the kernel module refusing the user-space driver of the container (gpu.driver_api_mismatch)
    return Symptom(id="gpu.driver_api_mismatch", cause="launch_failure", role="root", priority=60, trusted=True,
                   node="n4", summary="NVIDIA driver mismatch on the node",
                   evidence=[Evidence("kernel", "nodes/n4/kernel.log", 3, "NVRM: API mismatch: the client has the version "
                                                                         "535.161.08, but this kernel module has the version 550.54.15.")])


def exception(rank=1):
    return Symptom(id="python.exception", cause="user_error", role="root", priority=20, rank=rank, summary="ValueError",
                   evidence=[Evidence("stdout", "output/stdout", 9, "ValueError: bad shape")])


def verdict(syms):
    return decide(JOB, before_verdict(syms, JOB), COV)


def test_the_odd_driver_where_the_job_failed_at_launch_is_the_cause_and_drains_the_node():
    v = verdict(driver_lines() + [refused_on_n4()])
    assert v.cause == "launch_failure" and v.culprit_nodes == ["n4"]
    skew = next(s for s in v.symptoms if s.id == "infra.version_skew")
    assert skew.role == "root" and skew.trusted and "NVIDIA driver 550.54.15" in skew.summary and "535.161.08" in skew.summary
    assert [(node, action) for node, action, _ in candidates(v)] == [("n4", "drain")]


def test_near_miss_an_odd_driver_the_job_did_not_fail_on_is_said_beside_and_drains_nothing():
    v = verdict(driver_lines() + [exception(rank=1)])
    assert v.cause == "user_error"
    assert any(a["cause"] == "launch_failure" and "n4 runs NVIDIA driver 550.54.15" in a["why"] for a in v.alternatives)
    assert candidates(v) == []


def test_near_miss_every_node_on_one_driver_names_no_skew():
    v = verdict(driver_lines(odd="535.161.08") + [refused_on_n4()])
    assert not any(s.id == "infra.version_skew" for s in v.symptoms)


def test_an_odd_nccl_is_the_jobs_word_a_root_that_cannot_drain():
    nccl = [Symptom(id="nccl.version", cause="launch_failure", role="context", node=n, fields={"value": v},
                    evidence=[Evidence("stdout", "output/stdout", i, f"NCCL version {v}")])
            for i, (n, v) in enumerate(zip(NODES, ["2.21.5+cuda12.4"] * 3 + ["2.18.3+cuda12.2"]), 1)]
    claim = Symptom(id="cuda.driver_mismatch", cause="launch_failure", role="root", priority=60, node="n4",
                    summary="CUDA driver too old", evidence=[Evidence("stderr", "output/stderr", 2, "CUDA driver version is insufficient")])
    v = verdict(nccl + [claim])
    skew = next(s for s in v.symptoms if s.id == "infra.version_skew")
    assert v.cause == "launch_failure" and skew.role == "root" and not skew.trusted and skew.action == "none"
    assert candidates(v) == []


def test_the_collector_reads_the_drivers_version_file_bounded_and_without_following_links(tmp_path):
    f = tmp_path / "version"
    f.write_text(PROC.format(v="535.161.08"))
    assert driver_version_text(str(f)).startswith(b"NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.161.08")
    big = tmp_path / "big"
    big.write_bytes(b"x" * 100_000)
    assert len(driver_version_text(str(big))) == 4096
    link = tmp_path / "link"
    os.symlink(f, link)
    assert driver_version_text(str(link)) == b""  # a link is not the driver's own file
    assert driver_version_text(str(tmp_path / "absent")) == b"" and driver_version_text("") == b""
