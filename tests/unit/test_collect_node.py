import json
import os
import time


from slurm_attr.collect.jobfiles import safe_name
from slurm_attr.collect.node import NodeJob, collect_node


def _jobdir(cfg, job="42"):
    d = os.path.join(cfg.paths.evidence_root, job)
    for k in ("fr", "probe", "nccl"):
        os.makedirs(os.path.join(d, k))
    return d


def _node_part(cfg, job="42", node="n1"):
    return os.path.join(cfg.paths.spool, "bundles", job, "nodes", node)


def test_collects_files_kernel_and_removes_job_dir(cfg, tmp_path):
    d = _jobdir(cfg)
    for r in range(8):
        with open(os.path.join(d, "fr", f"nccl_trace_rank_{r}"), "wb") as f:
            f.write(b"\x80\x04" + bytes([r]) * 1000)
    with open(os.path.join(d, "nccl", "nccl.h.1.log"), "w") as f:
        f.write("h:1:2 [0] NCCL WARN x\n")
    (tmp_path / "kern-n1.log").write_text("Xid line without time\n")
    doc = collect_node(cfg, NodeJob(job_id="42", node="n1", bundle_key="42", start=time.time() - 5))
    part = _node_part(cfg)
    assert sorted(os.listdir(os.path.join(part, "fr"))) == [f"nccl_trace_rank_{r}" for r in range(8)]
    assert doc["sources"]["fr"] == {"status": "ok", "bytes": 8 * 1002, "ms": doc["sources"]["fr"]["ms"], "files": 8}
    assert doc["sources"]["probe"]["status"] == "missing"
    assert open(os.path.join(part, "kernel.log")).read() == "Xid line without time\n"
    assert json.load(open(os.path.join(part, "collect.json")))["node"] == "n1"
    assert not os.path.exists(d)


def test_symlinks_fifos_and_symlinked_dir(cfg, tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("root:x:0:0:shadow")
    d = _jobdir(cfg)
    os.symlink(secret, os.path.join(d, "fr", "nccl_trace_rank_0"))
    os.symlink(str(tmp_path), os.path.join(d, "nccl", "dirlink"))
    os.mkfifo(os.path.join(d, "probe", "fifo"))
    doc = collect_node(cfg, NodeJob(job_id="42", node="n1", bundle_key="42"))
    part = _node_part(cfg)
    for root, _, files in os.walk(part):
        for f in files:
            assert b"shadow" not in open(os.path.join(root, f), "rb").read()
    assert doc["sources"]["fr"]["status"] == "missing"
    assert secret.exists() and not os.path.exists(d)

    # The whole job dir replaced by a link to somewhere else: nothing read, only the link removed.
    target = tmp_path / "victim"
    target.mkdir()
    (target / "keep").write_text("x")
    os.symlink(target, os.path.join(cfg.paths.evidence_root, "43"))
    doc = collect_node(cfg, NodeJob(job_id="43", node="n1", bundle_key="43"))
    assert doc["sources"]["fr"]["status"] == "missing"
    assert (target / "keep").exists()
    assert not os.path.lexists(os.path.join(cfg.paths.evidence_root, "43"))


def test_caps_are_enforced(cfg):
    cfg.collect.fr_file_cap_bytes = 1000
    cfg.collect.fr_cap_bytes = 2500
    d = _jobdir(cfg)
    for r in range(5):
        with open(os.path.join(d, "fr", f"nccl_trace_rank_{r}"), "wb") as f:
            f.write(b"x" * 5000)
    doc = collect_node(cfg, NodeJob(job_id="42", node="n1", bundle_key="42"))
    assert doc["sources"]["fr"]["status"] == "truncated"
    assert doc["sources"]["fr"]["bytes"] <= 2500


def test_opted_out_skips_job_files_but_keeps_kernel(cfg, tmp_path):
    _jobdir(cfg)
    (tmp_path / "kern-n1.log").write_text("k\n")
    doc = collect_node(cfg, NodeJob(job_id="42", node="n1", bundle_key="42", opted_out=True))
    assert doc["sources"]["kernel"]["status"] == "ok"
    assert "opted out" in doc["sources"]["fr"]["detail"]


def test_safe_name():
    assert safe_name("a/../b c") == "a__..__b_c"
    assert safe_name("..hidden") == "hidden"
    assert len(safe_name("x" * 500)) == 200


def test_rank_map_is_read_removed_and_used_by_the_bundle(cfg):
    from slurm_attr.bundle import Bundle

    _jobdir(cfg)
    root = cfg.paths.evidence_root
    # Step 0 on n[1-2] (nodeid 0 = n1, 1 = n2); step 1 on n2 alone (nodeid 0 = n2).
    with open(os.path.join(root, "42.ranks.0.0"), "w") as f:
        f.write("0 0 0 n[1-2]\n0 1 0 n[1-2]\njunk line\n")
    with open(os.path.join(root, "42.ranks.0.1"), "w") as f:
        f.write("0 2 1 n[1-2]\n0 3 1 n[1-2]\n")
    with open(os.path.join(root, "42.ranks.1.0"), "w") as f:
        f.write("1 0 0 n2\n")
    doc = collect_node(cfg, NodeJob(job_id="42", node="n1", bundle_key="42"))
    assert doc["ranks"] == {"0": [0, 1]}
    assert not os.path.exists(os.path.join(root, "42.ranks.0.0"))
    assert os.path.exists(os.path.join(root, "42.ranks.0.1"))  # n2's, left for n2
    collect_node(cfg, NodeJob(job_id="42", node="n2", bundle_key="42"))
    b = Bundle(os.path.join(cfg.paths.spool, "bundles", "42"))
    assert b.ranks() == {0: "n1", 1: "n1", 2: "n2", 3: "n2"}
    assert b.node_of_rank(3) == "n2"


def test_rank_map_symlink_is_ignored(cfg, tmp_path):
    other = tmp_path / "forged"
    other.write_text("0 0 0 n1\n")
    os.symlink(other, os.path.join(cfg.paths.evidence_root, "42.ranks.0.0"))
    doc = collect_node(cfg, NodeJob(job_id="42", node="n1", bundle_key="42"))
    assert doc["ranks"] == {}
    assert other.exists()


def test_kernel_window_starts_at_the_jobs_first_step(cfg, tmp_path):
    """Without the job dir (a shared root another node cleaned), the rank map dates the start:
    an Xid from an earlier job on this node stays out of the window."""
    cfg.collect.window_slack_s = 2
    old = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(time.time() - 600))
    (tmp_path / "kern-n1.log").write_text(f"{old} h kernel: NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.\n")
    with open(os.path.join(cfg.paths.evidence_root, "42.ranks.0.0"), "w") as f:
        f.write("0 0 0 n1\n")
    collect_node(cfg, NodeJob(job_id="42", node="n1", bundle_key="42"))
    assert open(os.path.join(_node_part(cfg), "kernel.log")).read() == ""


def test_the_nodes_driver_version_is_kept_beside_its_kernel_log(cfg, tmp_path):
    _jobdir(cfg)
    (tmp_path / "kern-n1.log").write_text("a kernel line\n")
    (tmp_path / "nvidia-n1").write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.161.08  Tue Mar  5 2024\n")
    cfg.collect.driver_version_file = str(tmp_path / "nvidia-%n")
    doc = collect_node(cfg, NodeJob(job_id="42", node="n1", bundle_key="42"))
    part = _node_part(cfg)
    assert open(os.path.join(part, "software.log")).read().startswith("NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.161.08")
    assert doc["sources"]["software"]["status"] == "ok"
    # near miss: a node without the NVIDIA driver has no such file, and says nothing of it
    _jobdir(cfg, "43")
    doc = collect_node(cfg, NodeJob(job_id="43", node="n2", bundle_key="43"))
    assert "software" not in doc["sources"] and not os.path.exists(os.path.join(_node_part(cfg, "43", "n2"), "software.log"))
