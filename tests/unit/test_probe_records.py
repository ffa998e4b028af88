"""Reading probe records from a bundle: decoding, and every way a job-written file can lie."""
from __future__ import annotations

import os
import struct

import pytest

from slurm_attr.bundle import Bundle
from slurm_attr.probe import layout as L
from slurm_attr.probe import record
from slurm_attr.probe.reader import read_bundle
from slurm_attr.probe.synth import SlotSpec, record_bytes, write_bundle

HASH = 0xABCDEF0123456789


def _slot(rank: int = 0, **kw) -> SlotSpec:
    base = dict(comm_hash=HASH, rank=rank, nranks=4, name="world", launched={4: 10}, op_count=10,
                ops=[(opi, 4, 1000, 8, -1, opi) for opi in range(10)])
    base.update(kw)
    return SlotSpec(**base)


def _bundle(tmp_path, files: dict[str, bytes], node: str = "n1") -> Bundle:
    d = tmp_path / "nodes" / node / "probe"
    d.mkdir(parents=True)
    for name, data in files.items():
        (d / name).write_bytes(data)
    (tmp_path / "job.json").write_text('{"job_id": "9"}')
    return Bundle(str(tmp_path))


def _errors(cov) -> list[str]:
    return [c.detail for c in cov if c.status == "error"]


def test_decodes_what_synth_wrote():
    data = record_bytes(3, [_slot(3)], pid=77, node="gpu7", job_id=42)
    assert len(data) == L.FILE_SIZE <= 112 * 1024
    rec = record.parse(data, "p", "n")
    assert (rec.global_rank, rec.pid, rec.job_id, rec.hostname, rec.node_name) == (3, 77, 42, "gpu7", "gpu7")
    (s,) = rec.slots
    assert (s.comm_hash, s.rank, s.nranks, s.name, s.func_seq[4], s.op_count) == (HASH, 3, 4, "world", 10, 10)
    # only the last 16 positions of the ring survive: 10 collectives, all present
    assert [e.opi for e in s.ops] == list(range(10))
    assert s.ops[-1].count == 1000 and s.ops[-1].seq == 9


def test_every_field_readable_by_name():
    rec = record.parse(record_bytes(0, [_slot(0, api=(5, 4, 3, 3))]))
    s = rec.slots[0]
    assert (s.group_api_enter, s.group_api_exit, s.coll_api_enter, s.win_ms) == (5, 4, 3, 1000)
    assert rec.world_size == 0 and rec.win_ms == 1000
    with pytest.raises(AttributeError):
        rec.no_such_field


def test_ring_window_and_torn_entries():
    ops = [(opi, 4, 1, 8, -1, opi) for opi in range(30, 40)]
    raw = bytearray(record_bytes(0, [_slot(0, op_count=40, ops=ops)]))
    ring = L.HDR_SIZE + L.OPS_OFF
    struct.pack_into("<I", raw, ring + (35 % 16) * 32, 0)  # killed while writing op 35
    struct.pack_into("<I", raw, ring + (36 % 16) * 32, 37 + 16)  # an entry claiming the future
    struct.pack_into("<I", raw, ring + (37 % 16) * 32, 37 - 32 + 1)  # right slot, older than the window
    got = [e.opi for e in record.parse(bytes(raw)).slots[0].ops]
    assert got == [30, 31, 32, 33, 34, 38, 39]


def test_widen_recovers_wrapped_counters():
    assert record.widen(5, 2**32 + 10, 32) == 2**32 + 5
    assert record.widen(2**32 - 2, 2**32 + 10, 32) == 2**32 - 2
    assert record.widen(7, 3, 32) == 7  # nothing below the reference: keep the low bits


def test_kernel_op_is_decoded_with_the_full_sequence():
    s = record.parse(record_bytes(0, [_slot(0, kernel=(4, 9), inflight=3)])).slots[0]
    assert s.kch_op(s.kch_cur) == (4, 9)
    assert s.kch_op(0) is None
    assert s.kch_op((200 << 56) | 5) is None  # impossible function code


@pytest.mark.parametrize("mutate, reason", [
    (lambda b: b[:100], "short file"),
    (lambda b: bytes(8) + b[8:], "never initialised"),
    (lambda b: b"NOTPROBE" + b[8:], "bad magic"),
    (lambda b: b[:8] + struct.pack("<I", 9) + b[12:], "unsupported layout version 9"),
    (lambda b: b[:16] + struct.pack("<I", 999) + b[20:], "layout sizes"),
    (lambda b: b[:160] + struct.pack("<I", 41) + b[164:], "nslots_used 41 out of range"),
    (lambda b: b[:36] + struct.pack("<i", -5) + b[40:], "global rank -5"),
    (lambda b: b[: L.HDR_SIZE + 100], "truncated"),
])
def test_hostile_headers_become_coverage_errors(tmp_path, mutate, reason):
    good = record_bytes(1, [_slot(1)])
    bundle = _bundle(tmp_path, {"bad.probe": mutate(good), "good.probe": record_bytes(2, [_slot(2)])})
    recs, cov = read_bundle(bundle)
    assert [r.global_rank for r in recs] == [2]  # the bad file never stops the others
    (err,) = _errors(cov)
    assert err.startswith("nodes/n1/probe/bad.probe: ") and reason in err


def test_hostile_slots_and_peers_are_skipped(tmp_path):
    bad_state = _slot(0, state=7)
    bad_rank = _slot(9)  # rank 9 of 4
    peers = _slot(1, peers=[{"peer": 2, "kind": 1}, {"peer": 4000, "kind": 1}, {"peer": -1 + 2**24, "kind": 1}])
    interrupted = _slot(3, state=0)
    data = record_bytes(0, [bad_state, bad_rank, peers, interrupted])
    bundle = _bundle(tmp_path, {"r.probe": data})
    (rec,), cov = read_bundle(bundle)
    assert [s.rank for s in rec.slots] == [1]
    assert [p.peer for p in rec.slots[0].peers] == [2]  # peers beyond nranks dropped
    (err,) = _errors(cov)
    assert "slot 0: state 7" in err and "slot 1: rank 9 of 4" in err and "slot 3" not in err


def test_non_files_and_junk_in_the_probe_dir(tmp_path):
    bundle = _bundle(tmp_path, {"ok.probe": record_bytes(0, [_slot(0)]), "notes.txt": b"x"})
    d = tmp_path / "nodes" / "n1" / "probe"
    os.symlink("/etc/passwd", d / "evil.probe")
    os.mkfifo(d / "fifo.probe")
    (d / "dir.probe").mkdir()
    recs, cov = read_bundle(bundle)
    assert [r.global_rank for r in recs] == [0]
    errs = _errors(cov)
    assert any("evil.probe: not a regular file" in e for e in errs)
    assert any("fifo.probe" in e for e in errs)
    assert not any("notes.txt" in e or "dir.probe" in e for e in errs)


def test_coverage_per_node(tmp_path):
    write_bundle(str(tmp_path), {("n1", 0): record_bytes(0, [_slot(0)])},
                 {"job_id": "5", "nodes": ["n1", "n2"]})
    (tmp_path / "nodes" / "n3" / "probe").mkdir(parents=True)
    _recs, cov = read_bundle(Bundle(str(tmp_path)))
    by_node = {c.node: (c.status, c.detail) for c in cov}
    assert by_node["n1"] == ("ok", "1 rank records")
    assert by_node["n2"][0] == "missing" and "no probe files" in by_node["n2"][1]
    assert by_node["n3"] == ("missing", "probe directory is empty")
    assert all(c.source == "probe" for c in cov)


def test_strings_are_made_printable():
    data = bytearray(record_bytes(0, [_slot(0)]))
    data[96:104] = b"ev\x1bil\xff\x00z"
    assert record.parse(bytes(data)).hostname == "ev?il\ufffd"
