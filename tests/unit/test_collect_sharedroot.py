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
