"""Bounded spool on the node side: sparse files, one cap per job, a full spool, clean-up that always runs,
and the epilog's order (kernel window in memory -> fast path -> spool)."""
from __future__ import annotations

import errno
import os
import time

import pytest

from slurm_attr import hooks
from slurm_attr.collect import jobfiles, nodepart
from slurm_attr.collect import node as node_mod
from slurm_attr.collect.node import NodeJob, collect_node

MiB = 1 << 20


def _jobdir(cfg, job="42"):
    d = os.path.join(cfg.paths.evidence_root, job)
    for k in ("fr", "probe", "nccl"):
        os.makedirs(os.path.join(d, k), exist_ok=True)
    return d


def _rank_map(cfg, job="42", node="n1"):
    path = os.path.join(cfg.paths.evidence_root, f"{job}.ranks.0.0")
    with open(path, "w") as f:
        f.write(f"0 0 0 {node}\n")
    return path


def _part(cfg, job="42", node="n1"):
    return os.path.join(cfg.paths.spool, "bundles", job, "nodes", node)


def _spool_bytes(cfg):
    total = 0
    for root, _, files in os.walk(cfg.paths.spool):
        total += sum(os.lstat(os.path.join(root, f)).st_blocks * 512 for f in files)
    return total


def test_sparse_files_are_skipped_with_a_coverage_note(cfg):
    d = _jobdir(cfg)
    with open(os.path.join(d, "fr", "nccl_trace_rank_0"), "wb") as f:
        f.truncate(2 << 30)  # 2 GiB of nothing: costs the job no blocks
    with open(os.path.join(d, "fr", "nccl_trace_rank_1"), "wb") as f:
        f.write(b"\x80\x04real dump" * 100)  # near miss: a dense file is copied
    doc = collect_node(cfg, NodeJob(job_id="42", node="n1", bundle_key="42"))
    fr = doc["sources"]["fr"]
    assert fr["files"] == 1 and fr["status"] == "truncated" and "sparse" in fr["detail"]
    assert os.listdir(os.path.join(_part(cfg), "fr")) == ["nccl_trace_rank_1"]
    assert _spool_bytes(cfg) < 1 * MiB


def test_one_cap_for_the_whole_job_besides_each_kind(cfg):
    cfg.collect.job_cap_bytes = 3 * MiB
    d = _jobdir(cfg)
    blob = os.urandom(2 * MiB)
    for kind in ("fr", "probe", "nccl"):
        with open(os.path.join(d, kind, "f"), "wb") as f:
            f.write(blob)
    doc = collect_node(cfg, NodeJob(job_id="42", node="n1", bundle_key="42"))
    copied = sum(doc["sources"][k]["bytes"] for k in ("fr", "probe", "nccl"))
    assert copied == 3 * MiB
    assert doc["sources"]["nccl"]["status"] == "truncated"
    assert "job_cap_bytes" in doc["sources"]["nccl"]["detail"]


def test_full_spool_keeps_the_kernel_window_and_still_cleans_up(cfg, tmp_path, monkeypatch):
    d = _jobdir(cfg)
    with open(os.path.join(d, "fr", "dump"), "wb") as f:
        f.write(b"x" * 1000)
    rank_map = _rank_map(cfg)
    (tmp_path / "kern-n1.log").write_text("a kernel line\n")
    real = nodepart.write_private

    def enospc_except_small(path, data):
        if os.path.basename(path) not in ("kernel.log", "collect.json"):
            raise nodepart.SpoolFull(errno.ENOSPC, "spool: No space left on device")
        real(path, data)

    monkeypatch.setattr(nodepart, "write_private", enospc_except_small)
    doc = collect_node(cfg, NodeJob(job_id="42", node="n1", bundle_key="42", start=time.time() - 5))
    assert doc["sources"]["spool"]["status"] == "error"
    assert "kept only the kernel window" in doc["sources"]["spool"]["detail"]
    assert doc["sources"]["fr"]["status"] == "error"
    assert open(os.path.join(_part(cfg), "kernel.log")).read() == "a kernel line\n"
    assert not os.path.exists(os.path.join(_part(cfg), "fr"))
    assert not os.path.exists(d) and not os.path.exists(rank_map)
    assert doc["ranks"] == {"0": [0]}


def test_read_only_spool_writes_nothing_and_still_cleans_up(cfg, monkeypatch):
    d = _jobdir(cfg)
    rank_map = _rank_map(cfg)

    def erofs(path, mode=0o700):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(node_mod.spool, "ensure_dir", erofs)
    monkeypatch.setattr(nodepart, "write_private", lambda p, data: (_ for _ in ()).throw(
        nodepart.SpoolFull(errno.EROFS, "spool: Read-only file system")))
    doc = collect_node(cfg, NodeJob(job_id="42", node="n1", bundle_key="42"))
    assert "kept nothing" in doc["sources"]["spool"]["detail"]
    assert not os.path.exists(d) and not os.path.exists(rank_map)


def test_unexpected_failure_still_cleans_up(cfg, monkeypatch):
    d = _jobdir(cfg)
    rank_map = _rank_map(cfg)

    def broken(*a, **k):
        raise RuntimeError("collector bug")

    monkeypatch.setattr(jobfiles, "copy_kind", broken)
    with pytest.raises(RuntimeError):
        collect_node(cfg, NodeJob(job_id="42", node="n1", bundle_key="42"))
    assert not os.path.exists(d) and not os.path.exists(rank_map)
    # Near miss: another node's rank map of the same job is that node's to read.
    monkeypatch.undo()
    other = _rank_map(cfg, node="n2")
    _jobdir(cfg)
    collect_node(cfg, NodeJob(job_id="42", node="n1", bundle_key="42"))
    assert os.path.exists(other)


def _hook_env(tmp_path, monkeypatch, cfg_text):
    path = tmp_path / "c.toml"
    path.write_text(cfg_text)
    monkeypatch.setenv("SLURM_ATTR_CONFIG", str(path))
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    monkeypatch.setenv("SLURMD_NODENAME", "n1")
    monkeypatch.delenv("SPANK_SATTR_ENABLED", raising=False)


def test_node_hook_runs_the_fast_path_on_the_window_before_the_spool(tmp_path, monkeypatch):
    """Issue 11: a read-only spool and no database: the node is drained all the same, the epilog
    returns 0, and the evidence root is empty afterwards."""
    from slurm_attr import fastpath

    ev = tmp_path / "evidence"
    (ev / "42" / "fr").mkdir(parents=True)
    (tmp_path / "kern-n1.log").write_text("NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=python, GPU has fallen off the bus.\n")
    _hook_env(tmp_path, monkeypatch, f"""[paths]
evidence_root = "{ev}"
spool = "{tmp_path}/spool"
database = "{tmp_path}/nodb/sattr.db"
[collect]
kernel_source = "file"
kernel_file = "{tmp_path}/kern-%n.log"
""")
    order = []

    def fake_run(cfg, job_id, node, kernel, slurm=None):
        order.append(("fast", bytes(kernel)))
        return []

    def erofs(path, mode=0o700):
        order.append(("spool", path))
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(fastpath, "run", fake_run)
    monkeypatch.setattr(node_mod.spool, "ensure_dir", erofs)
    assert hooks.main(["node"]) == 0
    assert order[0][0] == "fast" and b"Xid" in order[0][1] and order[1][0] == "spool"
    assert os.listdir(ev) == [] and not (tmp_path / "nodb").exists()
