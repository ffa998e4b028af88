"""bench/bigjob/gen.py writes a bundle whose verdict is the fault it planted (and only that).

A small instance of the big-job workload (4 nodes x 8 GPUs): Xid 79 on one node's GPU with the
cascade on every other rank must give gpu_hardware on that node and a drain of it; the near miss
(the same job without the Xid lines and the CUDA error: NCCL errors and timeouts only) must not
call that node's hardware broken. No timings here: bench/bench_bigjob.py measures those.
"""
from __future__ import annotations

import importlib
import sys

import pytest

from slurm_attr import drain
from slurm_attr.bundleanalysis import run_bundle
from slurm_attr.bundle import Bundle
from slurm_attr.config import Config


@pytest.fixture(scope="module")
def gen(repo_root):
    sys.path.insert(0, str(repo_root / "bench"))
    try:
        yield importlib.import_module("bigjob.gen")
    finally:
        sys.path.remove(str(repo_root / "bench"))


def _verdict(path):
    """What `sattr analyze DIR` decides offline: the verdict and the drain policy's actions."""
    cfg = Config()
    v = run_bundle(str(path), cfg)
    v.actions = drain.apply_policy(cfg, v, Bundle(str(path)).job, slurm=None, store=None, path="offline")
    return v.to_dict()


def _drained(v):
    return {a["node"] for a in v["actions"] if a["kind"] in ("drain", "reboot")}


def test_planted_xid79_is_the_verdict(gen, tmp_path):
    truth = gen.generate(str(tmp_path / "b"), nodes=4, seed=3, entries=120, workers=1)
    (node,) = truth["nodes"]
    v = _verdict(tmp_path / "b")
    assert v["cause"] == "gpu_hardware"
    assert v["culprit"]["nodes"] == [node]
    assert truth["ranks"][0] in v["culprit"]["ranks"]
    assert _drained(v) == {node}
    roots = [s for s in v["symptoms"] if s["role"] == "root"]
    assert any(s["id"] == "gpu.xid_79" and s["node"] == node and s["trusted"] for s in roots)


def test_near_miss_without_xid_blames_no_hardware(gen, tmp_path):
    truth = gen.generate(str(tmp_path / "b"), nodes=4, seed=3, entries=120, xid=False, workers=1)
    node = truth["near_miss_node"]
    v = _verdict(tmp_path / "b")
    assert v["domain"] != "hardware", v["summary"]
    assert node not in _drained(v)
    assert not any(s["role"] == "root" and s["trusted"] for s in v["symptoms"])


def test_generation_is_deterministic(gen, tmp_path):
    a = gen.generate(str(tmp_path / "a"), nodes=2, seed=7, entries=60, workers=1)
    b = gen.generate(str(tmp_path / "b"), nodes=2, seed=7, entries=60, workers=1)
    assert a == b
    for rel in ("job.json", "output/stderr", f"nodes/{a['nodes'][0]}/kernel.log",
                f"nodes/{a['nodes'][0]}/fr/nccl_trace_rank_{a['ranks'][0]}"):
        assert (tmp_path / "a" / rel).read_bytes() == (tmp_path / "b" / rel).read_bytes(), rel
