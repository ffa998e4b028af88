"""Live watch on the real cluster: the probe harness as a real 2-node Slurm job (the
installed plugin's probe library writes every rank's record into the job's evidence dir),
one watcher per node reading those records while the job runs, and the step leader's
finding (class, ranks, nodes) checked before the job ends. Detection latency after the
stall is measured and printed, not asserted.

The harness's eight rank processes share memory, so they all run on the batch host; ranks
0-3 play the first node and 4-7 the second (their records in h/nodes/node0 and node1 of
the job's evidence dir). The watchers run here, as root on the host, over each pretend
node's evidence root ($BASE/nodes/<node>/evidence), exactly the files a watcher on that
node reads; each is named after one of the job's two nodes. These jobs run in the default
partition, where the plugin starts no watcher (plugstack live_partitions=live); the watchers
the plugin starts are tested in test_live_plugin.py.
"""
from __future__ import annotations

import time
from pathlib import Path

import pytest

from slurm_attr import config as config_mod
from slurm_attr.live.watcher import Watcher

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
HARNESS = REPO / "spank" / "build" / "tests" / "probe_harness"
HANG_AFTER_S = 5.0


@pytest.mark.parametrize("scenario,cls,ranks,node_idx", [
    ("nonentry", "H1", [3], [0]),       # rank 3 never launches AllReduce #300
    ("linkstall", "H3", [3, 4], [0, 1]),  # rank 3's network send to rank 4 never completes
    ("count", "H2", [5], [1]),          # rank 5 issues another count at #300
])
def test_live_finding_while_the_job_runs(cluster, scenario, cls, ranks, node_idx):
    if not HARNESS.exists():
        pytest.fail(f"{HARNESS} missing: run `make -C spank test` first")
    script = f"""#!/bin/bash
#SBATCH -N2
#SBATCH -t 3
lib=$(echo "$LD_LIBRARY_PATH" | cut -d: -f1)/$NCCL_PROFILER_PLUGIN
exec {HARNESS} run --plugin "$lib" --out "$SLURM_ATTR_DIR/h" --scenario {scenario} \\
    --ops 400 --inject 300 --per-node 4 --hang-ms 60000
"""
    job = cluster.sbatch(script)
    try:
        host, nodes = cluster.job_nodes(job, timeout=60)
        assert len(nodes) == 2
        cfg = config_mod.load(str(cluster.config_path))
        cfg.live.hang_after_s, cfg.live.interval_s = HANG_AFTER_S, 0.5
        jobdir = cluster.base / "nodes" / host / "evidence" / job / "h" / "nodes"
        # node 1's watcher first: the leader (node 0) reads what the other wrote this cycle;
        # step 0: the harness's --out ranks carry the env of step 0 of their pretend job
        watchers = [Watcher(cfg, job, nodes[i], str(jobdir / f"node{i}"), leader=(i == 0), nnodes=2,
                            step="0") for i in (1, 0)]
        found: list[dict] = []
        deadline = time.monotonic() + 90
        # until the world communicator's finding: a stuck rank also stalls its side communicator,
        # whose unlocalised H0 may come a cycle earlier (then marked as behind the world's)
        while not any(f["label"].startswith("world ") for f in found) and time.monotonic() < deadline:
            t0 = time.monotonic()
            for w in watchers:
                found += w.cycle()
            time.sleep(max(0.0, 0.5 - (time.monotonic() - t0)))
        assert found, f"no live finding for job {job} ({scenario})"
        assert cluster.is_running(job), "the finding must come while the job still runs"
        best = [f for f in found if f["class"] == cls and f["label"].startswith("world ")]
        assert best, [(f["class"], f["ranks"], f["label"]) for f in found]
        f = best[0]
        assert (f["ranks"], f["nodes"], f["source"]) == (ranks, [nodes[i] for i in node_idx], "snapshot")
        # users see it with `sattr live JOB` (and `sattr JOB` while no verdict exists)
        out = cluster.sattr("live", job, check=True).stdout
        assert f"[{cls}, world " in out, out
        # latency: the stall's last recorded event -> the finding (measured, not asserted)
        from datetime import datetime
        since = datetime.fromisoformat(f["waiting_since"]).timestamp()
        latency = f["detected_ns"] / 1e9 - since
        print(f"\nlive {scenario}: {cls} ranks {f['ranks']} nodes {f['nodes']}; detection latency "
              f"{latency:.2f} s after the stall with hang_after_s = {HANG_AFTER_S}, interval_s = 0.5")
    finally:
        cluster.run(["scancel", job], check=False)
        cluster.wait_state(job)
