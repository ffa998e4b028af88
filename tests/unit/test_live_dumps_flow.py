"""Evidence before the kill, the exchange: FR-poll detection for jobs without probe
records (hang/frdetect.py), the leader's dump request, every node's answer, the finding's stuck
lines, the dumps before the job's end, ``on_hang = cancel`` only when two sources agree,
and the post-mortem reading the pre-kill FR (prekill/exchange.py, prekill/prekillevidence.py). Servers are
fakes that answer with replies captured from torch 2.13 (tests/fixtures/live_dumps)."""
from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest
from unix_servers import UnixServer

from slurm_attr.bundle import Bundle
from slurm_attr.config import Config, ConfigError, from_dict
from slurm_attr.live import findings
from slurm_attr.live.prekill import exchange as prekill, prekillevidence
from slurm_attr.live.hang.frdetect import FrTracker
from slurm_attr.live.watcher import Watcher
from slurm_attr.slurm.cli import CliSlurm

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "live_dumps"


def _fr_sum(node, ranks):
    return {"node": node, "fr": {str(r): {"pg": {"0": list(v)}, "pend": p} for r, (v, p) in ranks.items()}}


# ---- frdetect -----------------------------------------------------------------------------
def test_fr_tracker_names_the_rank_that_never_entered():
    t = FrTracker(hang_after_s=5)
    sums = [_fr_sum("n1", {0: ((4, 3), "gloo:all_reduce #4")}), _fr_sum("n2", {1: ((3, 3), None)})]
    assert t.update(sums, 0.0, "77") == []
    assert t.update(sums, 4.0, "77") == []
    [f] = t.update(sums, 6.0, "77")
    assert (f["class"], f["cause"], f["ranks"], f["nodes"], f["waiting_ranks"], f["source"]) == \
        ("H1", "rank_stuck", [1], ["n2"], [0], "fr")
    assert findings.headline(f).split(": ", 1)[1].startswith("rank 1 never entered gloo:all_reduce #4")
    assert t.update(sums, 20.0, "77") == []  # one stall, one finding


def test_fr_tracker_progress_or_rest_is_no_hang():
    t = FrTracker(hang_after_s=5)
    for i in range(10):  # a slow job: the numbers keep moving
        sums = [_fr_sum("n1", {0: ((4 + i, 3 + i), "gloo:all_reduce")}), _fr_sum("n2", {1: ((4 + i, 3 + i), None)})]
        assert t.update(sums, 3.0 * i, "77") == []
    rest = [_fr_sum("n1", {0: ((9, 9), None)}), _fr_sum("n2", {1: ((9, 9), None)})]
    for i in range(10):  # nothing under way (compute, I/O): never a hang
        assert t.update(rest, 100.0 + 3 * i, "77") == []


def test_fr_tracker_every_rank_waiting_is_unlocalised():
    t = FrTracker(hang_after_s=5)
    sums = [_fr_sum("n1", {0: ((4, 3), "gloo:all_reduce #4"), 1: ((4, 3), "gloo:all_reduce #4")})]
    t.update(sums, 0.0, "77")
    [f] = t.update(sums, 6.0, "77")
    assert (f["class"], f["cause"], f["ranks"], f["waiting_ranks"]) == ("H0", "comm_hang", [], [0, 1])


# ---- the watcher with fake worker servers -------------------------------------------------
class Replier(UnixServer):
    """Answers fr_trace_json / dump_traceback with the captured bodies of one rank."""

    def __init__(self, path: str, rank: int):
        self.bodies = {"fr_trace_json": (FIX / f"fr_trace_json_rank{rank}.json").read_bytes(),
                       "dump_traceback": (FIX / f"dump_traceback_rank{rank}.txt").read_bytes()}
        self.asked: list[str] = []
        super().__init__(path)

    def answer(self, c) -> None:
        with c:
            req = c.recv(4096).decode()
            name = req.split(" ", 2)[1].rsplit("/", 1)[-1]
            self.asked.append(name)
            body = self.bodies.get(name, b"")
            c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body)


@pytest.fixture
def job(tmp_path):
    d = tempfile.mkdtemp(prefix="sattr-j-", dir="/tmp")
    os.makedirs(f"{d}/ws")
    servers = [Replier(f"{d}/ws/rank_{r}.sock", r) for r in (0, 1)]
    cfg = Config()
    cfg.paths.spool = str(tmp_path / "spool")
    os.makedirs(cfg.paths.spool)
    cfg.live.hang_after_s, cfg.live.interval_s = 5.0, 1.0
    yield d, cfg, servers
    for s in servers:
        s.close()
    shutil.rmtree(d, ignore_errors=True)


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _run(w: Watcher, clock: Clock, cycles: int, step_s: float = 2.0) -> list[dict]:
    out = []
    for _ in range(cycles):
        out += w.cycle()
        clock.t += step_s
    return out


def test_gloo_hang_is_found_and_the_finding_names_the_sleeping_ranks_line(job):
    d, cfg, servers = job
    clock = Clock()
    w = Watcher(cfg, "77", "n1", d, leader=True, nnodes=1, clock=clock, step="0", show_job=lambda j: None)
    w.leader_dumps.before_end_done = True  # this test is about the hang
    found = _run(w, clock, 6)
    [f] = [x for x in found if x.get("source") == "fr"]
    assert (f["class"], f["ranks"]) == ("H1", [1])
    doc = findings.load(cfg.paths.spool, "77")
    [saved] = doc["findings"]
    assert saved["stacks"][0] == {"rank": 0, "node": "n1", "at": "/tmp/wsx/hk/train.py:10 in <module>",
                                  "inner": saved["stacks"][0]["inner"]}
    assert saved["stacks"][1]["at"] == "/tmp/wsx/hk/train.py:9 in <module>"
    assert saved["dumps"]["reason"] == "hang" and saved["dumps"]["fr_ranks"] == [0, 1]
    lines = findings.lines(doc)
    assert "  rank 1 (n1) is at /tmp/wsx/hk/train.py:9 in <module>" == lines[1]  # the culprit first
    spool_fr = Path(cfg.paths.spool, "live", "77", "dumps", "0", "nodes", "n1", "fr")
    assert sorted(os.listdir(spool_fr)) == ["nccl_trace_rank_0.json", "nccl_trace_rank_1.json"]
    assert "dump_traceback" in servers[1].asked


def test_on_hang_record_takes_no_dump(job):
    d, cfg, servers = job
    cfg.live.on_hang = "record"
    clock = Clock()
    w = Watcher(cfg, "78", "n1", d, leader=True, nnodes=1, clock=clock, step="0", show_job=lambda j: None)
    w.leader_dumps.before_end_done = True
    found = _run(w, clock, 6)
    assert [f["class"] for f in found] == ["H1"]
    doc = findings.load(cfg.paths.spool, "78")
    assert "stacks" not in doc["findings"][0]
    assert all(a == "fr_trace_json" for s in servers for a in s.asked)  # polled, never dumped


def test_dumps_before_the_jobs_end(job):
    d, cfg, servers = job
    cfg.live.hang_after_s = 1000.0  # no hang in this test
    clock = Clock()
    w = Watcher(cfg, "79", "n1", d, leader=True, nnodes=1, clock=clock, step="batch",
                end_ns=time.time_ns() + 30 * 10**9)  # ends in 30 s, dump_before_end_s = 60
    _run(w, clock, 2)
    doc = findings.load(cfg.paths.spool, "79")
    [dd] = doc["dumps"]
    assert dd["reason"] == "before_end" and [s["rank"] for s in dd["stacks"]] == [0, 1]
    assert any(ln.startswith("dumps ") and "(before_end)" in ln for ln in findings.lines(doc))
    # the post-mortem: where the ranks were, and the pre-kill FR (the bundle has none)
    bundle_dir = Path(cfg.paths.spool, "b79")
    (bundle_dir / "nodes" / "n1").mkdir(parents=True)
    (bundle_dir / "job.json").write_text('{"job_id": "79", "state": "TIMEOUT"}')
    [st] = prekillevidence.stacks_symptom(doc, "79")
    assert "before the job's end" in st.summary and "train.py:9 in <module>" in st.summary
    syms, cov = prekillevidence.fr_symptoms(Bundle(str(bundle_dir)), cfg, "79")
    assert any("pre-kill Flight Recorder of 2 rank(s)" in c.detail for c in cov)
    assert syms and all(not s.trusted and s.fields.get("prekill") for s in syms)
    assert any(1 in ([s.rank] + list(s.fields.get("ranks") or [])) for s in syms), [s.to_dict() for s in syms]


def test_bundle_with_its_own_fr_ignores_the_prekill_dumps(job, tmp_path):
    d, cfg, _ = job
    cfg.live.hang_after_s = 1000.0
    clock = Clock()
    w = Watcher(cfg, "80", "n1", d, leader=True, nnodes=1, clock=clock, step="0", end_ns=time.time_ns())
    _run(w, clock, 2)
    b = tmp_path / "b80"
    (b / "nodes" / "n1" / "fr").mkdir(parents=True)
    shutil.copy(FIX / "fr_trace_json_rank0.json", b / "nodes" / "n1" / "fr" / "nccl_trace_rank_0.json")
    (b / "job.json").write_text('{"job_id": "80"}')
    assert prekillevidence.fr_symptoms(Bundle(str(b)), cfg, "80") == ([], [])


# ---- cancel only when two sources agree ------------------------------------------------------
def _res(pending: bool, inner: str = "/home/u/train.py:3 in f"):
    return [{"node": "n1", "ranks": {"0": {"fr": {"pg": {"0": [4, 3] if pending else [4, 4]}},
                                            "stack": {"at": "x", "inner": inner}}}}]


def test_agreement_needs_the_probe_and_the_dumps():
    probe = {"source": "snapshot"}
    assert prekill.agreement(probe, _res(True)).startswith("Flight Recorder: 1 rank")
    assert prekill.agreement(probe, _res(False, "/v/site-packages/torch/distributed/distributed_c10d.py:1 in barrier")) \
        .startswith("stacks: 1 rank")
    assert prekill.agreement(probe, _res(False)) is None  # the dumps do not see a hang
    assert prekill.agreement({"source": "fr"}, _res(True)) is None  # FR alone is one source


def test_cancel_runs_scancel_and_counts_gpu_minutes(tmp_path):
    cfg = Config()
    cfg.live.on_hang = "cancel"
    cfg.paths.slurm_bin = "/opt/slurm/bin"
    calls = []

    class Slurm(CliSlurm):  # the job still RUNNING as the watcher's user; scancel recorded
        def show_job(self, job_id):
            start = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(time.time() - 60))
            return {"JobId": job_id, "JobState": "RUNNING", "UserId": "u(1001)", "StartTime": start}

        def run(self, tool, *args):
            calls.append([os.path.join(self.slurm_bin, tool), *args])
            return ""

    ld = prekill.LeaderDumps(cfg, "81", "0", str(tmp_path), 1, end_ns=time.time_ns() + 600 * 10**9, gpus=8,
                             slurm=Slurm(slurm_bin=cfg.paths.slurm_bin), uid=1001)
    c = ld.cancel({"source": "summary", "class": "H1", "what": "never entered AllReduce #9"}, _res(True))
    assert calls == [["/opt/slurm/bin/scancel", "81"]] and c["done"] is True and c["target"] == "81"
    assert 79.0 <= c["gpu_minutes_saved"] <= 80.0  # 8 GPUs x ~10 minutes left
    assert "never entered AllReduce #9" in c["reason"]
    calls.clear()
    c2 = ld.cancel({"source": "summary"}, _res(False))
    assert calls == [] and c2["done"] is False and c2["why"].startswith("withheld")


def test_job_facts_from_scontrol_fields():
    end = "2026-12-01T23:45:00"
    end_ns, gpus = prekill.job_facts({"EndTime": end, "TRES": "cpu=4,mem=8G,node=2,billing=4,gres/gpu=8"})
    from datetime import datetime

    assert end_ns == int(datetime.fromisoformat(end).timestamp() * 1e9) and gpus == 8
    assert prekill.job_facts({"EndTime": "Unknown", "TRES": "cpu=4,gres/gpu:a100=2"}) == (None, 0)
    assert prekill.job_facts(None) == (None, 0)


def test_config_on_hang_and_dump_before_end():
    cfg = from_dict({"live": {"on_hang": "cancel", "dump_before_end_s": 0}})
    assert (cfg.live.on_hang, cfg.live.dump_before_end_s) == ("cancel", 0.0)
    assert (Config().live.on_hang, Config().live.dump_before_end_s) == ("dump", 60.0)
    with pytest.raises(ConfigError, match="on_hang"):
        from_dict({"live": {"on_hang": "kill"}})
    with pytest.raises(ConfigError, match="dump_before_end_s"):
        from_dict({"live": {"dump_before_end_s": -1}})


def test_leader_reads_end_time_and_gpus_once_off_the_cycle(tmp_path):
    cfg = Config()
    calls = []
    show = {"EndTime": "2026-12-01T23:45:00", "TRES": "cpu=2,node=1,gres/gpu=4"}
    ld = prekill.LeaderDumps(cfg, "82", "0", str(tmp_path), 1, show_job=lambda j: calls.append(j) or show)
    ld.facts()
    ld.facts()
    for _ in range(200):  # the lookup runs in its own thread
        if ld.end_ns is not None:
            break
        time.sleep(0.01)
    assert calls == ["82"] and ld.gpus == 4 and ld.end_ns == prekill.job_facts(show)[0]
    # near miss: nothing needs the end time (no before-end dumps, no cancel): Slurm is not asked
    cfg.live.dump_before_end_s = 0
    ld2 = prekill.LeaderDumps(cfg, "83", "0", str(tmp_path), 1, show_job=lambda j: calls.append(j) or show)
    ld2.facts()
    time.sleep(0.05)
    assert calls == ["82"] and ld2.end_ns is None


def test_garbage_results_and_summaries_cost_nothing_but_themselves():
    req = {"seq": 1, "reason": "hang", "time_ns": 1}
    res = [{"node": "n1", "ranks": ["not", "a", "dict"], "pipes": "x"}, "junk",
           {"node": "n2", "time_ns": "soon", "pipes": {"0": "sent"},
            "ranks": {"x": {}, "3": "str", "4": {"stack": {"at": "/a.py:1 in f", "inner": 5}, "fr": {"pg": []}}}}]
    sm = prekill.summarize([r for r in res if isinstance(r, dict)], req, 2)
    assert sm["stacks"] == [{"rank": 4, "node": "n2", "at": "/a.py:1 in f", "inner": "5"}]
    assert (sm["pipes_sent"], sm["fr_ranks"], sm["latency_s"]) == (1, [4], None)
    assert prekill.agreement({"source": "snapshot"}, res) is None
    # FR summaries a broken (or foreign) watcher wrote: skipped, the good one still counts
    t = FrTracker(hang_after_s=1)
    bad = [{"node": "n9", "fr": {"0": {"pg": {"0": ["a", 1]}}, "x": {}, "1": "s"}}, {"node": "n8", "fr": []},
           _fr_sum("n1", {0: ((2, 1), "gloo:barrier #2")}), _fr_sum("n2", {1: ((1, 1), None)})]
    t.update(bad, 0.0, "90")
    [f] = t.update(bad, 2.0, "90")
    assert (f["ranks"], f["nodes"]) == ([1], ["n2"])


def test_fr_tracker_threshold_adapts_to_slow_collectives():
    t = FrTracker(hang_after_s=5)
    waiting = [_fr_sum("n1", {0: ((4, 3), "gloo:all_reduce #4"), 1: ((4, 3), None)})]
    done = [_fr_sum("n1", {0: ((4, 4), None), 1: ((4, 4), None)})]
    t.update(waiting, 0.0, "91")
    assert t.update(waiting, 4.0, "91") == []
    t.update(done, 4.5, "91")  # a 4.5 s collective ended: the threshold becomes 4 x 4.5 = 18 s
    nxt = [_fr_sum("n1", {0: ((5, 4), "gloo:all_reduce #5"), 1: ((5, 4), None)})]
    t.update(nxt, 5.0, "91")
    assert t.update(nxt, 15.0, "91") == []  # 10 s: past hang_after_s, not past 18 s
    [f] = t.update(nxt, 24.0, "91")
    assert f["threshold_s"] == 18.0 and f["class"] == "H0"
