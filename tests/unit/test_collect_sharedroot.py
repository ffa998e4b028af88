"""A node on a shared evidence root collects only its own ranks' files: never one twice."""
from __future__ import annotations

from slurm_attr.collect.sharedroot import ownership

# Ranks 0,1 on node a (host gpu-a), 2,3 on node b (host gpu-b), step 0; the batch step on a.
MAP_A = {"0": [0, 1], "4294967291": [0]}
MAP_B = {"0": [2, 3]}
FILES = [("fr", "fr/nccl_trace_rank_0"), ("fr", "fr/nccl_trace_rank_3"), ("fr", "fr/nccl_trace_rank_12"),
         ("fr", "fr/nccl_trace_rank_2.json"), ("probe", "probe/rank1.pid77.probe"),
         ("probe", "probe/rank2.pid80.probe"), ("nccl", "nccl/nccl.gpu-a.100.log"),
         ("nccl", "nccl/nccl.gpu-b.cluster.local.200.log"), ("fr", "fr/notes.txt"), ("nccl", "nccl/other.log")]


def test_each_file_is_collected_by_exactly_one_node():
    a = ownership(MAP_A, "gpu-a")
    b = ownership(MAP_B, "gpu-b.cluster.local")
    for kind, rel in FILES:
        if rel.endswith("rank_12"):
            continue  # a rank neither map places: nobody claims it (see below)
        assert a.keeps(kind, rel) != b.keeps(kind, rel), rel


def test_files_go_where_the_rank_map_says():
    a = ownership(MAP_A, "gpu-a")
    assert a.keeps("fr", "fr/nccl_trace_rank_0") and not a.keeps("fr", "fr/nccl_trace_rank_3")
    assert a.keeps("probe", "probe/rank1.pid77.probe") and not a.keeps("probe", "probe/rank2.pid80.probe")
    assert a.keeps("nccl", "nccl/nccl.gpu-a.100.log")
    assert not a.keeps("nccl", "nccl/nccl.gpu-b.cluster.local.200.log")
    # Near miss: rank 12 is in a file name but on no node of this map.
    assert not a.keeps("fr", "fr/nccl_trace_rank_12")
    # Names that say nothing: the node of rank 0 takes them (once).
    assert a.keeps("fr", "fr/notes.txt") and not ownership(MAP_B, "gpu-b").keeps("fr", "fr/notes.txt")


def test_rank_zero_is_judged_on_the_first_real_step():
    # Step 1 ran elsewhere with rank 0 on this node; step 0 (the first) did not put rank 0 here.
    own = ownership({"1": [0], "0": [5]}, "h")
    assert not own.has_rank0
    assert ownership({"4294967291": [0], "0": [0, 1]}, "h").has_rank0


def test_no_rank_map_means_no_filter():
    assert ownership({}, "gpu-a") is None


def test_two_nodes_on_one_shared_root_collect_each_file_once(tmp_path, monkeypatch, cfg):
    """Both node epilogs read one evidence root (a shared filesystem): the bundle has every
    rank's dump exactly once, each under the node that ran the rank, and the dir goes last."""
    import os
    import time

    from slurm_attr.collect import node as nodemod

    d = tmp_path / "evidence" / "42"
    for k in ("fr", "probe", "nccl"):
        (d / k).mkdir(parents=True)
    for r in range(4):
        (d / "fr" / f"nccl_trace_rank_{r}").write_bytes(b"\x80\x04" + bytes([r]) * 100)
        (d / "probe" / f"rank{r}.pid{100 + r}.probe").write_bytes(b"P" * 64)
    (d / "nccl" / "nccl.gpu-a.100.log").write_text("gpu-a:100:1 [0] NCCL WARN x\n")
    (d / "nccl" / "nccl.gpu-b.200.log").write_text("gpu-b:200:1 [0] NCCL WARN y\n")
    # The plugin's root-owned rank maps: step 0 on n[1-2], ranks 0,1 on n1 and 2,3 on n2.
    for nodeid, ranks in ((0, (0, 1)), (1, (2, 3))):
        (tmp_path / "evidence" / f"42.ranks.0.{nodeid}").write_text(
            "".join(f"0 {r} {nodeid} n[1-2]\n" for r in ranks))
    if os.geteuid() != 0:  # the collector trusts only root-owned maps
        import pytest
        pytest.skip("needs root to own the rank maps")
    hosts = {"n1": "gpu-a", "n2": "gpu-b"}
    for n in ("n1", "n2"):
        monkeypatch.setattr(nodemod.socket, "gethostname", lambda n=n: hosts[n])
        nodemod.collect_node(cfg, nodemod.NodeJob(job_id="42", node=n, bundle_key="42", start=time.time() - 5))
        if n == "n1":
            assert d.exists(), "the first node removed a dir its peer still collects from"
    nodes = tmp_path / "spool" / "bundles" / "42" / "nodes"
    got = {n: sorted(os.listdir(nodes / n / "fr")) for n in ("n1", "n2")}
    assert got == {"n1": ["nccl_trace_rank_0", "nccl_trace_rank_1"], "n2": ["nccl_trace_rank_2", "nccl_trace_rank_3"]}
    assert sorted(os.listdir(nodes / "n1" / "probe")) == ["rank0.pid100.probe", "rank1.pid101.probe"]
    assert sorted(os.listdir(nodes / "n2" / "nccl")) == ["nccl.gpu-b.200.log"]
    assert not d.exists()
