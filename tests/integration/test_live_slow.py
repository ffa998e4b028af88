"""Slow anomalies on the real cluster: the probe harness as a real 2-node Slurm job that
COMPLETES, only slower. Straggler: one rank pauses before every collective; the step leader's
S1 finding names the rank and its node while the job runs, `sattr live` shows it, and the
post-mortem verdict of the COMPLETED job keeps it as context (cause stays "none"). Near miss:
the same job without the pause leaves no slow finding. Slow link: one rank's network sends
to its successor take longer; S2 names both ends. Slow phase: from collective 300 on every
rank pauses before each collective; S3 names no rank and both nodes. The watchers' cycle cost
and the time to the finding are printed, not asserted.

As in test_live.py: the harness's eight rank processes share memory, so they all run on the
batch host; ranks 0-3 play the first node, 4-7 the second (their records in h/nodes/node0 and
node1 of the job's evidence dir), and the watchers run here, as root, over those directories,
each named after one of the job's two nodes.
"""
from __future__ import annotations

import statistics
import time
from pathlib import Path

import pytest

from slurm_attr import config as config_mod
from slurm_attr.live.watcher import Watcher

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
HARNESS = REPO / "spank" / "build" / "tests" / "probe_harness"
INTERVAL_S = 0.5


def _watch(cluster, scenario: str, args: str) -> tuple[str, list[str], list[dict], dict]:
    """Run the harness job with two watchers beside it until it ends: (job, its nodes, the
    slow findings in the order first reported, the verdict of the COMPLETED job)."""
    if not HARNESS.exists():
        pytest.fail(f"{HARNESS} missing: run `make -C spank test` first")
    script = f"""#!/bin/bash
#SBATCH -N2
#SBATCH -t 3
lib=$(echo "$LD_LIBRARY_PATH" | cut -d: -f1)/$NCCL_PROFILER_PLUGIN
exec {HARNESS} run --plugin "$lib" --out "$SLURM_ATTR_DIR/h" --scenario {scenario} --per-node 4 {args}
"""
    job = cluster.sbatch(script)
    try:
        host, nodes = cluster.job_nodes(job)
        assert len(nodes) == 2
        cfg = config_mod.load(str(cluster.config_path))
        cfg.live.interval_s = INTERVAL_S
        jobdir = cluster.base / "nodes" / host / "evidence" / job / "h" / "nodes"
        while not (jobdir / "node1" / "probe").is_dir() and cluster.is_running(job):
            time.sleep(0.05)
        # node 1's watcher first: the leader (node 0) reads what the other wrote this cycle;
        # step 0: the harness's --out ranks carry the env of step 0 of their pretend job
        watchers = [Watcher(cfg, job, nodes[i], str(jobdir / f"node{i}"), leader=(i == 0), nnodes=2,
                            step="0") for i in (1, 0)]
        leader = watchers[1]
        slow_cost: list[float] = []
        orig = leader.slow.cycle

        def timed(*a, **kw):
            t = time.perf_counter()
            try:
                return orig(*a, **kw)
            finally:
                slow_cost.append(time.perf_counter() - t)

        leader.slow.cycle = timed
        found: list[dict] = []
        cycle_cost: list[float] = []
        t_start = time.monotonic()
        first_at = None
        while cluster.is_running(job) and time.monotonic() - t_start < 150:
            t0 = time.monotonic()
            for w in watchers:
                for f in w.cycle():
                    if f.get("kind") == "slow" and all(f is not g for g in found):
                        found.append(f)
                        first_at = first_at or time.monotonic() - t_start
            cycle_cost.append(time.monotonic() - t0)
            time.sleep(max(0.0, INTERVAL_S - (time.monotonic() - t0)))
        state = cluster.wait_state(job)
        assert state == "COMPLETED", state
        assert leader.slow.error is None, leader.slow.error
        print(f"\nlive slow {scenario}: {len(cycle_cost)} cycles of both watchers, median "
              f"{statistics.median(cycle_cost) * 1000:.1f} ms (slow/anomalies.py part of the leader's: median "
              f"{statistics.median(slow_cost) * 1000:.2f} ms, max {max(slow_cost) * 1000:.2f} ms); "
              f"first slow finding {first_at if first_at is None else round(first_at, 1)} s after the "
              f"watch began; findings: {[(f['class'], f['ranks'], f['nodes']) for f in found]}")
        for f in found:
            print(f"  {f['class']}: {f['what']}")
        return job, nodes, found, cluster.verdict(job)
    finally:
        cluster.run(["scancel", job], check=False)
        cluster.wait_state(job)


def _context_only(v: dict, ranks: list[int | None], node: str) -> None:
    """The COMPLETED job's verdict: the slow finding as untrusted context, nothing else changed."""
    assert v["cause"] == "none", v["summary"]
    slow = [s for s in v["symptoms"] if s["id"] == "live.slow"]
    assert [(s["role"], s["cause"], s["rank"], s["node"]) for s in slow] == [("context", "none", ranks[0], node)]
    assert all(a["kind"] == "none" for a in v["actions"])


@pytest.mark.parametrize("scenario,args,victim", [
    ("straggler", "--ops 400 --delay-us 20000", 5),  # rank 5 (second node) 20 ms late to every collective
    ("healthy", "--ops 1500", None),                 # near miss: nobody late, nothing slow
])
def test_straggler_named_on_a_completed_job(cluster, scenario, args, victim):
    job, nodes, found, v = _watch(cluster, scenario, args)
    if victim is None:
        assert found == [] and v["cause"] == "none"
        assert not [s for s in v["symptoms"] if s["id"] == "live.slow"]
        return
    s1 = [f for f in found if f["class"] == "S1"]
    # near miss of S3: the job is slow, but from the start and because of one rank
    assert len(s1) == 1 and not [f for f in found if f["class"] in ("S2", "S3")], [f["what"] for f in found]
    assert (s1[0]["ranks"], s1[0]["nodes"]) == ([victim], [nodes[1]])
    assert f"rank {victim} on node {nodes[1]} entered " in s1[0]["what"]
    out = cluster.sattr("live", job, check=True).stdout
    assert "straggler detected " in out and f"rank {victim} on node {nodes[1]}" in out, out
    _context_only(v, [victim], nodes[1])


def test_slow_link_named_by_both_ends_on_a_completed_job(cluster):
    # rank 3's network sends to rank 4 (first node -> second) take 3 ms longer each
    job, nodes, found, v = _watch(cluster, "slowlink", "--ops 600 --delay-us 3000")
    s2 = [f for f in found if f["class"] == "S2"]
    assert len(s2) == 1 and not [f for f in found if f["class"] == "S1"], [f["what"] for f in found]
    assert (s2[0]["ranks"], s2[0]["nodes"]) == ([3, 4], nodes)
    out = cluster.sattr("live", job, check=True).stdout
    assert "slow link detected " in out and f"rank 3 ({nodes[0]}) -> rank 4 ({nodes[1]})" in out, out
    _context_only(v, [3], nodes[0])


def test_slow_phase_of_every_rank_on_a_completed_job(cluster):
    # from collective 300 every rank pauses 30 ms (the harness's default) before each collective
    # it launches: ~12 ms a world collective before, ~72 after (bench_live.py --slow-runs); the
    # near misses are the straggler case above (slow, but one rank's doing: S1, no S3) and the
    # healthy one (nothing)
    job, nodes, found, v = _watch(cluster, "slowphase", "--ops 400 --inject 300")
    s3 = [f for f in found if f["class"] == "S3"]
    assert s3 and not [f for f in found if f["class"] in ("S1", "S2")], [f["what"] for f in found]
    # one finding though the world and both half rings slowed, with the world's figures; it
    # names no rank (nobody to blame) and both nodes
    assert len(s3) == 1, [f["what"] for f in s3]
    assert (s3[0]["ranks"], s3[0]["nodes"]) == ([], sorted(nodes))
    assert s3[0]["what"].startswith("all 8 ranks of world ") and "slowed together" in s3[0]["what"], s3[0]["what"]
    out = cluster.sattr("live", job, check=True).stdout
    assert "slow phase detected " in out and "all 8 ranks of world " in out and "[S3]" in out, out
    _context_only(v, [None], sorted(nodes)[0])
    assert [s["fields"]["class"] for s in v["symptoms"] if s["id"] == "live.slow"] == ["S3"]
