"""Slow anomalies from real record bytes: the header ring read back by the node part (torn,
foreign and impossible entries dropped), the watchers end to end with a straggler (finding
stored, shown, read back by the post-mortem as context that leaves the verdict alone), and
the post-mortem's own S1 from the final records of a COMPLETED job."""
from __future__ import annotations

import json
import os
import random

from slurm_attr.bundleanalysis import run_bundle
from slurm_attr.bundle import Bundle
from slurm_attr.config import Config
from slurm_attr.live import analyze, findings
from slurm_attr.live.slow.anomalies import node_part, ring_entries
from slurm_attr.live.watcher import Watcher
from slurm_attr.probe import layout as L
from slurm_attr.probe.record import parse
from slurm_attr.probe.synth import SlotSpec, record_bytes, write_bundle

AR = 4
WORLD = 0x9E3779B97F4A7C15
RT0 = 1_700_000_000_000_000_000
MONO0 = 5_000_000_000
JOB = "66"


def ring_bytes(entries: list[dict]) -> bytes:
    """The header ring with ``entries`` (HRING_ENT field names) at ring positions 0.., tag = pos + 1."""
    buf = bytearray(L.HRING * L.HRING_ENT.size)
    for pos, e in enumerate(entries):
        v = dict.fromkeys(L.HRING_NAMES, 0)
        v.update(tag=pos + 1, kind=1, comm_hash=WORLD, func=AR, count=1 << 20)
        v.update(e)
        i = pos % L.HRING
        L.HRING_ENT.pack_into(buf, i * L.HRING_ENT.size, *(v[n] for n in L.HRING_NAMES))
    return bytes(buf)


def record(r: int, n: int, k: int, node: str, late_ms) -> bytes:
    """Rank r of n after k AllReduce (100 ms apart), entering each late_ms(opi, r) late; the
    ring holds the last 50."""
    sp = SlotSpec(comm_hash=WORLD, rank=r, nranks=n, name="world", launched={AR: k}, op_count=k,
                  ops=[(o, AR, 1 << 20, 8, -1, o) for o in range(max(0, k - 16), k)], digest=k,
                  kernel_done=(AR, k - 1), api=(k, k, k, k), last_ns=MONO0 + k * 100_000_000, pop_started=k)
    data = bytearray(record_bytes(r, [sp], pid=100 + r, node=node, rt_ns=RT0, mono_ns=MONO0))
    ents = [{"opi": o, "seq": o, "start_ns": MONO0 + o * 100_000_000 + int(late_ms(o, r) * 1e6)}
            for o in range(max(0, k - 50), k)]
    data[L.RING_OFF:L.HDR_SIZE] = ring_bytes(ents)
    return bytes(data)


def test_ring_entries_keep_only_sound_collectives():
    data = bytearray(record(0, 8, 100, "n0", lambda o, r: 0))
    good = ring_entries(parse(bytes(data)), data[L.RING_OFF:L.HDR_SIZE])
    assert list(good) == [(WORLD, 0)]
    assert [e[0] for e in good[(WORLD, 0)]] == list(range(50, 100))
    # entry time = the record's wall clock at creation + (stamp - its monotonic anchor), in us
    assert good[(WORLD, 0)][0] == [50, (RT0 + 50 * 100_000_000) // 1000, AR]
    bad = ring_bytes([{"opi": 1, "start_ns": MONO0}, {"opi": 2, "start_ns": MONO0, "kind": 2},  # p2p
                      {"opi": 3, "start_ns": MONO0, "comm_hash": 0x1234},  # not this slot's comm
                      {"opi": 400, "start_ns": MONO0},  # never launched (op_count 100)
                      {"opi": 5, "start_ns": MONO0, "slot": 7},  # no such slot
                      {"opi": 6, "start_ns": 0},  # no stamp
                      {"opi": 7, "start_ns": MONO0, "tag": 99}])  # torn: tag of another position
    assert [e[0] for e in ring_entries(parse(bytes(data)), bad)[(WORLD, 0)]] == [1]


def _bundle(tmp_path, late_ms, state="COMPLETED", n=8, per_node=4):
    recs = {(f"n{r // per_node}", r): record(r, n, 200, f"n{r // per_node}", late_ms) for r in range(n)}
    root = tmp_path / "bundle"
    write_bundle(str(root), recs, {"job_id": JOB, "state": state, "exit_code": 0 if state == "COMPLETED" else 1,
                                   "nodes": ["n0", "n1"], "end_time": "2026-12-01T14:05:00+00:00"})
    return root


def _cfg(tmp_path) -> Config:
    cfg = Config()
    cfg.paths.spool = str(tmp_path / "spool")
    os.makedirs(cfg.paths.spool, exist_ok=True)
    return cfg


def test_node_part_reads_the_rings_without_following_links(tmp_path):
    root = _bundle(tmp_path, lambda o, r: 0)
    probe = root / "nodes" / "n0" / "probe"
    recs = [parse((probe / name).read_bytes(), f"probe/{name}", "n0") for name in sorted(os.listdir(probe))]
    part = node_part(str(root / "nodes" / "n0"), recs)
    assert sorted(e[1] for e in part["e"]) == [0, 1, 2, 3] and part["unread"] == 0
    victim = probe / sorted(os.listdir(probe))[0]
    victim.unlink()
    os.symlink(str(probe / sorted(os.listdir(probe))[0]), victim)  # swapped for a link since listed
    part = node_part(str(root / "nodes" / "n0"), recs)
    assert len(part["e"]) == 3 and part["unread"] == 1


def test_watchers_report_a_straggler_that_the_post_mortem_keeps_as_context(tmp_path):
    cfg = _cfg(tmp_path)
    jobdirs = {nd: tmp_path / f"ev-{nd}" / JOB for nd in ("n0", "n1")}
    for d in jobdirs.values():
        (d / "probe").mkdir(parents=True)
    now = [0.0]
    ws = [Watcher(cfg, JOB, nd, str(jobdirs[nd]), leader=(nd == "n0"), nnodes=2, clock=lambda: now[0],
                  show_job=lambda job: None)  # no Slurm here (the pre-kill part asks it for the time limit)
          for nd in ("n1", "n0")]
    rnd = random.Random(2)
    jitter = {(o, r): rnd.random() for o in range(1000) for r in range(8)}
    found = []
    for cyc in range(12):  # 20 collectives a cycle; rank 6 enters every one 25 ms late
        k = 40 + 20 * cyc
        for r in range(8):
            nd = f"n{r // 4}"
            (jobdirs[nd] / "probe" / f"rank{r}.probe").write_bytes(
                record(r, 8, k, nd, lambda o, rr: 25 if rr == 6 else jitter[o, rr]))
        now[0] += 1.0
        for w in ws:
            found += w.cycle()
    s1 = [f for f in found if f["class"] == "S1"]
    assert s1 and not [f for f in found if f["class"].startswith("H")]
    assert (s1[0]["ranks"], s1[0]["nodes"]) == ([6], ["n1"])
    doc = findings.load(cfg.paths.spool, JOB)
    line = findings.lines(doc)[0]
    assert line.startswith("straggler detected ") and "rank 6 on node n1 entered AllReduce last in 100% of" in line
    # post-mortem: context only; the COMPLETED job's verdict stays "none" and acts on nothing
    bdir = tmp_path / "b"
    bdir.mkdir()
    (bdir / "job.json").write_text(json.dumps({"job_id": JOB, "state": "COMPLETED", "exit_code": 0}))
    syms, _cov = analyze(Bundle(str(bdir)), cfg)
    assert [(s.id, s.cause, s.role, s.rank, s.node, s.trusted) for s in syms] == [
        ("live.slow", "none", "context", 6, "n1", False)]
    v = run_bundle(str(bdir), cfg).to_dict()
    assert v["cause"] == "none" and all(a["kind"] == "none" for a in v["actions"])
    assert [s["role"] for s in v["symptoms"] if s["id"] == "live.slow"] == ["context"]


def test_post_mortem_finds_the_straggler_in_a_completed_jobs_records(tmp_path):
    cfg = _cfg(tmp_path)
    root = _bundle(tmp_path, lambda o, r: 30 if r == 5 else (o * 7 + r * 3) % 10 / 10)
    syms, _ = analyze(Bundle(str(root)), cfg)
    (s,) = syms
    assert (s.id, s.cause, s.role, s.rank, s.node, s.evidence[0].source) == ("live.slow", "none", "context", 5, "n1",
                                                                            "probe")
    assert "rank 5 on node n1 entered AllReduce last in 100% of the last 50 collectives" in s.summary
    assert "(from the final probe records)" in s.summary
    v = run_bundle(str(root), cfg).to_dict()
    assert v["cause"] == "none" and "live.slow" in [x["id"] for x in v["symptoms"]]


def test_post_mortem_near_misses_failed_job_and_no_late_rank(tmp_path):
    cfg = _cfg(tmp_path)
    # the same straggler in a FAILED job: its verdict is about the failure, the records' S1 not computed
    root = _bundle(tmp_path, lambda o, r: 30 if r == 5 else 0, state="FAILED")
    assert [s for s in analyze(Bundle(str(root)), cfg)[0] if s.id == "live.slow"] == []
    # COMPLETED, nobody consistently late
    root2 = tmp_path / "b2"
    recs = {(f"n{r // 4}", r): record(r, 8, 200, f"n{r // 4}", lambda o, rr: 30 if rr == o % 8 else 0) for r in range(8)}
    write_bundle(str(root2), recs, {"job_id": JOB, "state": "COMPLETED", "exit_code": 0})
    assert analyze(Bundle(str(root2)), cfg)[0] == []


def test_large_jobs_thin_the_rings_by_nested_powers_of_two():
    # rank 0 of a 4096-rank world and of an 8-rank tp group; the ring holds 30 of each
    world = SlotSpec(comm_hash=WORLD, rank=0, nranks=4096, name="world", launched={AR: 100}, op_count=100)
    tp = SlotSpec(comm_hash=0x77, rank=0, nranks=8, name="tp", launched={AR: 100}, op_count=100)
    data = bytearray(record_bytes(0, [world, tp], rt_ns=RT0, mono_ns=MONO0))
    ents = [{"opi": 70 + i // 2, "slot": i % 2, "comm_hash": (WORLD, 0x77)[i % 2], "start_ns": MONO0 + i}
            for i in range(60)]
    data[L.RING_OFF:L.HDR_SIZE] = ring_bytes(ents)
    rec = parse(bytes(data))
    thin = ring_entries(rec, data[L.RING_OFF:L.HDR_SIZE])
    assert [e[0] for e in thin[(WORLD, 0)]] == [80, 96]  # stride(4096) = 16
    assert [e[0] for e in thin[(0x77, 0)]] == [72, 80, 88, 96]  # 30 entries -> every 8th: <= 6 a cycle
    full = ring_entries(rec, data[L.RING_OFF:L.HDR_SIZE], thin=False)
    assert len(full[(0x77, 0)]) == 30 and [e[0] for e in full[(WORLD, 0)]] == [80, 96]
