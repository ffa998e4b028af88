"""Evidence before the kill on the real cluster: a 2-node Gloo torch job whose ranks run
torch's worker server (the start-up hook slurm_attr/live/pyhook, with the variable set in
the job script: the plugstack's worker_hook= is for partition live only, see
test_live_plugin.py), one rank asleep
before a collective. One watcher per node runs here, in-process, as root, over each node's
evidence dir (as tests/integration/test_live.py does). Gloo has no probe records, so the
hang is found from the ranks' own Flight Recorder (hang/frdetect.py); the watchers pull
``fr_trace_json`` and ``dump_traceback`` from every rank, and the finding names the
sleeping rank's line. Then a ``-t 1`` job that hangs: the dumps are taken before its time
limit and its verdict says where the ranks were. Latencies are printed, not asserted.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from gloo_hang import line, write_train
from slurm_attr import config as config_mod
from slurm_attr.live import findings
from slurm_attr.live.prekill.exchange import show_job
from slurm_attr.live.watcher import Watcher
from slurm_attr.slurm.hostlist import expand

pytestmark = [pytest.mark.cluster, pytest.mark.torch]

REPO = Path(__file__).resolve().parents[2]
HOOK = REPO / "slurm_attr" / "live" / "pyhook"
def _job(cluster, limit_min: int) -> tuple[str, Path]:
    train = write_train(cluster)
    script = f"""#!/bin/bash
#SBATCH -N2 -n2 -t {limit_min}
export MASTER_PORT=$((20000 + SLURM_JOB_ID % 20000))
# what the plugin's worker_hook= would set per task: a per-rank socket in the job dir, the hook first
srun bash -c 'export TORCH_WORKER_SERVER_SOCKET=$SLURM_ATTR_DIR/ws/rank_$SLURM_PROCID.sock PYTHONPATH={HOOK}; \\
    exec {sys.executable} {train}'
"""
    return cluster.sbatch(script), train


def _nodes(cluster, job: str, timeout: float = 120) -> list[str]:
    cluster.wait_running(job, timeout=timeout)
    out = cluster.run(["squeue", "-h", "-j", job, "-o", "%N"]).stdout.strip()
    return expand(out)


def _watchers(cluster, cfg, job: str, nodes: list[str], **kw) -> list[Watcher]:
    # node 1 first: the leader (node 0) reads what the other wrote in the same cycle
    return [Watcher(cfg, job, nodes[i], str(cluster.base / "nodes" / nodes[i] / "evidence" / job),
                    leader=(i == 0), nnodes=2, step="0", **kw) for i in (1, 0)]


def _cycle_until(watchers, cond, timeout: float, interval: float = 0.5):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        t0 = time.monotonic()
        for w in watchers:
            w.cycle()
        got = cond()
        if got:
            return got
        time.sleep(max(0.0, interval - (time.monotonic() - t0)))
    return None


def test_gloo_hang_finding_names_the_sleeping_ranksline(cluster):
    job, train = _job(cluster, 3)
    try:
        nodes = _nodes(cluster, job)
        cfg = config_mod.load(str(cluster.config_path))
        cfg.live.hang_after_s, cfg.live.interval_s = 5.0, 0.5
        cfg.live.on_hang, cfg.live.dump_before_end_s = "dump", 0.0
        watchers = _watchers(cluster, cfg, job, nodes)

        def settled():
            doc = findings.load(cfg.paths.spool, job)
            return next((f for f in (doc or {}).get("findings", []) if f.get("stacks")), None)

        f = _cycle_until(watchers, settled, timeout=240)
        assert f is not None, f"no finding with stacks for job {job}: {findings.load(cfg.paths.spool, job)}"
        assert (f["class"], f["cause"], f["ranks"], f["nodes"], f["source"]) == \
            ("H1", "rank_stuck", [1], [nodes[1]], "fr")
        at = {s["rank"]: s["at"] for s in f["stacks"]}
        assert at == {0: f"{train}:{line('WAITS HERE')} in <module>",
                      1: f"{train}:{line('SLEEPS HERE')} in <module>"}, f["stacks"]
        assert f["dumps"]["fr_ranks"] == [0, 1] and f["dumps"]["nodes_answered"] == 2
        spool = Path(cfg.paths.spool) / "live" / job / "dumps" / "0" / "nodes"
        assert sorted(p.name for p in spool.glob("*/fr/*")) == ["nccl_trace_rank_0.json", "nccl_trace_rank_1.json"]
        assert sorted(p.name for p in spool.glob("*/stacks/*")) == ["rank_0.txt", "rank_1.txt"]
        # users see it while the job runs
        out = cluster.sattr("live", job, check=True).stdout
        assert f"rank 1 ({nodes[1]}) is at {train}:{line('SLEEPS HERE')} in <module>" in out, out
        assert cluster.run(["squeue", "-h", "-j", job, "-o", "%T"]).stdout.strip() == "RUNNING"
        from datetime import datetime

        since = datetime.fromisoformat(f["waiting_since"]).timestamp()
        print(f"\nlive dumps: H1 rank 1 found {f['detected_ns'] / 1e9 - since:.2f} s after the last FR change "
              f"(hang_after_s = 5, FR poll every {watchers[0].fr_poll_s:.2f} s); dumps of {len(at)} ranks on 2 nodes "
              f"{f['dumps']['latency_s']:.3f} s after the request (detection -> dumps)")
    finally:
        cluster.run(["scancel", job], check=False)
        cluster.wait_state(job)


def test_time_limited_hang_is_dumped_before_the_limit(cluster):
    job, train = _job(cluster, 1)
    nodes = _nodes(cluster, job)
    cfg = config_mod.load(str(cluster.config_path))
    cfg.live.hang_after_s, cfg.live.interval_s = 600.0, 0.5  # no hang finding: only the end matters here
    cfg.live.dump_before_end_s = 45.0  # the limit is 60 s: the dumps come ~15 s in
    # the leader reads EndTime from Slurm itself, as the installed watcher does
    watchers = _watchers(cluster, cfg, job, nodes, show_job=lambda j: show_job(cfg, j))

    def dumped():
        doc = findings.load(cfg.paths.spool, job)
        return next((d for d in (doc or {}).get("dumps", []) if d.get("reason") == "before_end"), None)

    d = _cycle_until(watchers, dumped, timeout=120)
    assert d is not None, f"no dump before the end of job {job}"
    end = cluster.run(["squeue", "-h", "-j", job, "-o", "%e"]).stdout.strip()
    assert {s["rank"] for s in d["stacks"]} == {0, 1} and d["fr_ranks"] == [0, 1]
    print(f"\nbefore-end dumps of job {job} at {d['requested']} (EndTime {end}), "
          f"{d['latency_s']:.3f} s from the request to the last node's dumps")
    assert cluster.wait_state(job, timeout=240) == "TIMEOUT"
    v = cluster.verdict(job, timeout=180)
    st = [s for s in v["symptoms"] if s["id"] == "live.stacks"]
    assert st and f"is at {train}:{line('SLEEPS HERE')} in <module>" in st[0]["summary"], v["symptoms"]
    assert any("pre-kill Flight Recorder of 2 rank(s)" in (c.get("detail") or "") for c in v["coverage"]), v["coverage"]
    assert all(not s["trusted"] for s in v["symptoms"] if s["id"].startswith(("fr.", "live.")))
    print(f"verdict of the time-limited job: {v['cause']}: {v['summary']}")
