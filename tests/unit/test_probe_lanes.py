"""Layout version 2: pool lanes (other writer threads' shares of a slot's proxy-side
counters) merged by the reader, and version 1 records still read."""
from __future__ import annotations

import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from slurm_attr.bundle import Bundle
from slurm_attr.probe import layout as L
from slurm_attr.probe import record
from slurm_attr.probe.reader import read_bundle
from slurm_attr.probe.synth import LaneSpec, SlotSpec, record_bytes

REPO = Path(__file__).resolve().parents[2]
SPANK = REPO / "spank"
HASH = 0x1234_5678_9ABC_DEF0


def _slot(rank: int = 0, comm_hash: int = HASH, **kw) -> SlotSpec:
    base = dict(comm_hash=comm_hash, rank=rank, nranks=8, name="world", launched={4: 3}, op_count=3,
                in_state=(0, 0, 1, 0, 0, 0), last_ns=5_000, pop_started=2,
                peers=[{"peer": 1, "kind": L.PK_NET_SEND, "send_posted": 10, "send_done": 9,
                        "wait": (0, 0, 1, 0, 0, 0), "last_send_ms": 40, "last_ch": 2}])
    base.update(kw)
    return SlotSpec(**base)


def _lane(slot: int = 0, **values) -> LaneSpec:
    v = dict(send_posted=7, send_done=5, pop_started=3, in_state2=2, last_progress_ns=9_000)
    v.update(values)
    return LaneSpec(slot=slot, values=v,
                    peers=[{"peer": 1, "kind": L.PK_NET_SEND, "send_posted": 7, "send_done": 5,
                            "wait": (0, 0, 2, 0, 0, 0), "last_send_ms": 90, "last_ch": 6},
                           {"peer": 4, "kind": L.PK_NET_RECV, "recv_posted": 3, "recv_done": 3}])


def test_lanes_add_to_their_slot_only():
    data = record_bytes(0, [_slot(), _slot(comm_hash=0x99)], lanes=[_lane(0), _lane(0, send_done=1)])
    rec = record.parse(data)
    s, other = rec.slots
    assert rec.lanes_used == 2 and not rec.problems
    assert (s.send_posted, s.send_done, s.pop_started) == (14, 6, 2 + 3 + 3)
    assert s.in_state == (0, 0, 1 + 2 + 2, 0, 0, 0)
    assert s.last_progress_ns == 9_000 and s.stamps[L.SLOT_STAMPS.index("last_progress_ns")] == 9_000
    peers = {p.peer: p for p in s.peers}
    assert (peers[1].send_posted, peers[1].send_done, peers[1].wait[L.W_SEND_NET]) == (24, 19, 5)
    assert (peers[1].last_send_ms, peers[1].last_ch) == (90, 6)  # the lane that moved last
    assert peers[4].recv_done == 6 and peers[4].kind == L.PK_NET_RECV
    # near miss: the other communicator's slot is untouched
    assert (other.send_posted, other.pop_started, other.in_state[L.W_SEND_NET]) == (0, 2, 1)
    assert [p.peer for p in other.peers] == [1] and other.peers[0].send_done == 9


def test_unbound_and_stray_lanes():
    # lane 0 never bound (bind 0), lane 1 bound to slot 5 of a record using 1 slot
    data = record_bytes(0, [_slot()], lanes=[_lane(-1), _lane(5)])
    rec = record.parse(data)
    (s,) = rec.slots
    assert (s.send_posted, s.pop_started) == (0, 2)
    assert rec.problems == ["lane 1: bound to slot 5 of 1"]


def test_version_1_records_still_read():
    v1 = record_bytes(2, [_slot(2)], version=1)
    assert len(v1) == L.V1_FILE_SIZE == 96_256
    rec = record.parse(v1)
    assert rec.layout_ver == 1 and rec.lanes_used == 0 and rec.slots[0].send_done == 0
    # version 1 had reserved zeros where version 2 counts lanes: junk there is not a lane count
    junk = bytearray(v1)
    struct.pack_into("<I", junk, 240, 3)
    assert record.parse(bytes(junk)).lanes_used == 0
    # near misses: version 1 with version 2's size, and an unknown version
    bad = bytearray(v1)
    struct.pack_into("<Q", bad, 24, L.FILE_SIZE)
    with pytest.raises(record.ProbeFormatError, match="layout sizes do not match version 1"):
        record.parse(bytes(bad))
    bad = bytearray(record_bytes(2, [_slot(2)]))
    struct.pack_into("<I", bad, 8, 3)
    with pytest.raises(record.ProbeFormatError, match="unsupported layout version 3"):
        record.parse(bytes(bad))


def test_hostile_lane_counts(tmp_path):
    good = record_bytes(1, [_slot(1)], lanes=[_lane(0)])
    many = bytearray(good)
    struct.pack_into("<I", many, 240, L.NLANES + 1)
    with pytest.raises(record.ProbeFormatError, match="lanes_used 17 out of range"):
        record.parse(bytes(many))
    # announced lanes beyond the end of a (truncated) file: an error for that file only
    d = tmp_path / "nodes" / "n1" / "probe"
    d.mkdir(parents=True)
    (d / "rank1.probe").write_bytes(good[:L.LANES_OFF + 100])
    (d / "rank2.probe").write_bytes(record_bytes(2, [_slot(2)], lanes=[_lane(0)]))
    (tmp_path / "job.json").write_text('{"job_id": "1"}')
    recs, cov = read_bundle(Bundle(str(tmp_path)))
    assert [r.global_rank for r in recs] == [2] and recs[0].slots[0].send_posted == 7
    assert [c.detail for c in cov if c.status == "error"] == [
        "nodes/n1/probe/rank1.probe: truncated (1 lanes announced)"]


@pytest.fixture(scope="module")
def harness() -> Path:
    if not (shutil.which("make") and (shutil.which("cc") or shutil.which("gcc"))):
        pytest.skip("no C toolchain to build the probe")
    res = subprocess.run(["make", "-s", "-C", str(SPANK), "-f", "probe.mk", "probe-harness"],
                         capture_output=True, text=True, timeout=300)
    if res.returncode != 0:
        pytest.fail(f"building the probe failed:\n{res.stdout}\n{res.stderr}")
    return SPANK / "build" / "tests" / "probe_harness"


def test_plugin_record_from_eight_threads(harness, tmp_path):
    """The real plugin, 8 threads (twice) on one communicator: the file's own slot holds
    none of their steps (the main thread owns it), the merged view holds all of them."""
    res = subprocess.run([str(harness), "lanes", "--plugin", str(SPANK / "build" / "libnccl-profiler-sattr.so"),
                          "--out", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    (path,) = tmp_path.glob("*.probe")
    data = path.read_bytes()
    assert len(data) == L.FILE_SIZE == 110_592
    rec = record.parse(data)
    (s,) = rec.slots
    steps = 2 * 8 * 1500  # threads x steps per op, per round x 2 rounds (probe_harness_check.c)
    assert rec.layout_ver == 2 and 1 <= rec.lanes_used <= 8
    assert (s.send_done, s.send_posted, s.recv_done, s.recv_posted) == (2 * steps, 2 * steps, steps, steps)
    assert s.in_state == (0,) * L.NWAIT and s.pop_started == s.pop_stopped == 2 * 2 * 8 + 1
    assert sorted((p.peer, p.send_done, p.recv_done) for p in s.peers) == [
        (1, steps, 0), (2, 0, steps), (3, steps, 0)]
    # near miss: the slot's own copy alone (what a version 1 reader would see)
    alone = L.SLOT_FIXED.unpack_from(data, L.HDR_SIZE)
    assert alone[L.SLOT_NAMES.index("send_done")] == 0


def test_symlinked_node_or_probe_dir_is_not_followed(tmp_path):
    """read_bundle opens nodes/ once and each node's probe dir relative to it: a symlink
    at either level is refused (coverage error), the other nodes still read."""
    outside = tmp_path / "outside"
    (outside / "probe").mkdir(parents=True)
    (outside / "probe" / "rank9.probe").write_bytes(record_bytes(9, [_slot(9)]))
    root = tmp_path / "b"
    for n, r in (("n1", 1), ("n2", 2)):
        d = root / "nodes" / n / "probe"
        d.mkdir(parents=True)
        (d / f"rank{r}.probe").write_bytes(record_bytes(r, [_slot(r)]))
    (root / "nodes" / "n3").symlink_to(outside)           # the node dir itself
    (root / "nodes" / "n4").mkdir()
    (root / "nodes" / "n4" / "probe").symlink_to(outside / "probe")  # its probe dir
    (root / "job.json").write_text('{"job_id": "1", "nodes": ["n1", "n2", "n3", "n4"]}')
    recs, cov = read_bundle(Bundle(str(root)))
    assert sorted(r.global_rank for r in recs) == [1, 2]  # never rank 9
    by_node = {c.node: c.status for c in cov}
    assert by_node["n1"] == by_node["n2"] == "ok"
    assert by_node["n3"] == by_node["n4"] == "error"
