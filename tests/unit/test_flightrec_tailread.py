"""Head + tail reading on both pickle layouts Flight Recorder dumps come in.

torch 2.13's C++ Pickler writes ``X'entries' BINPUT ](`` and every entry as
``}(`` (containers not memoised; tests/torch reads such dumps). Dumps that went
through Python's pickler - the shared fixtures, whose frame paths were rewritten,
and the shared 4096-rank workload cloned from them - memoise every container:
``] BINPUT (`` and ``} BINPUT (`` with a PUT index that differs per entry. So the
bytes that open an entry are a pattern, not a constant.
"""
from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from slurm_attr.flightrec import safepickle
from slurm_attr.flightrec.loader import load_dumps


@pytest.fixture(scope="module")
def real(shared_fixtures: Path) -> bytes:
    """A real torch 2.13 Gloo dump (frame paths rewritten by Python: memoised containers)."""
    return (shared_fixtures / "flight_recorder" / "gloo" / "s6_subgroup_mismatch" / "nccl_trace_rank_0").read_bytes()


def test_real_dump_entries_are_found_by_the_marker(real: bytes) -> None:
    raw = real
    assert raw[raw.find(b"entries") + 9 : raw.find(b"entries") + 11] == b"]q"  # the entries list is memoised
    marker, first = safepickle._entry_marker(raw)
    n = len(pickle.loads(raw)["entries"])
    starts = [first] + [m.start() for m in marker.finditer(raw, first + 2)]
    assert len(starts) == n >= 8
    # each start really opens one entry: unpickling from there (after the head) yields that entry
    head = raw[: starts[-3]]
    top, rest = safepickle._stream_load(head + b"eu." + safepickle._TAIL_PREFIX + raw[starts[-3]:], 2)
    assert rest["entries"] == pickle.loads(raw)["entries"][-3:]


def test_unmemoised_layout_still_found(gen_fr) -> None:
    """The other layout (no PUT after containers) is read by the same pattern."""
    d = gen_fr.rank_dump(1, 16, 400, fault_rank=None)
    raw = gen_fr.TorchStylePickler().dump(d)
    marker, first = safepickle._entry_marker(raw)
    assert 1 + sum(1 for _ in marker.finditer(raw, first + 2)) == 400


def _big_real_like(real: bytes, entries: int = 2000) -> dict:
    """A full 2000-entry ring built from a real dump's entries (same keys, shared frame dicts)."""
    d = pickle.loads(real)
    src = d["entries"]
    out = []
    for i in range(entries):
        e = dict(src[i % len(src)])
        e["record_id"] = i
        e["collective_seq_id"] = i + 1
        e["pg_id"], e["process_group"] = 0, ("0", "default_pg")
        out.append(e)
    d["entries"] = out
    return d


def test_memoised_2000_entry_ring_is_read_by_head_and_tail(real: bytes, tmp_path: Path) -> None:
    d = _big_real_like(real)
    raw = pickle.dumps(d, protocol=2)
    got = safepickle.load(lambda off, n: raw[off : off + n], len(raw), 1 << 30, 128)
    assert got.history_truncated is True
    assert got.data["entries"] == d["entries"][-128:]
    assert got.data["pg_status"] == d["pg_status"] and got.data["pg_config"] == d["pg_config"]
    assert got.bytes_read < len(raw) // 4
    # through the loader: same streams as a full read over the window
    for r in (0, 1):
        (tmp_path / f"nccl_trace_rank_{r}").write_bytes(raw)
    tail = load_dumps(str(tmp_path), tail_entries=128, workers=1)
    full = load_dumps(str(tmp_path), tail_entries=None, workers=1)
    st, ref = tail.traces[0].streams["0"], full.traces[0].streams["0"]
    assert tail.traces[0].history_truncated and not full.traces[0].history_truncated
    assert st.hi == ref.hi == 2000 and list(st.sigs) == list(ref.sigs[-128:])


def test_memoised_tail_needing_a_middle_string_falls_back(real: bytes) -> None:
    """Near miss: a string first written in the skipped middle cannot be resolved from head + tail."""
    d = _big_real_like(real)
    for e in d["entries"][1000:]:
        e["thread_name"] = "first-seen-mid-buffer"
    raw = pickle.dumps(d, protocol=2)
    got = safepickle.load(lambda off, n: raw[off : off + n], len(raw), 1 << 30, 128)
    assert got.history_truncated is False and got.data["entries"] == d["entries"]

