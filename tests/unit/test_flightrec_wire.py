"""The plain form a loader worker sends its traces in (flightrec/tracewire.py): every field of a
RankTrace comes back as it was, whatever its streams hold."""
from __future__ import annotations

import pickle
from array import array

from slurm_attr.flightrec.types import NO_SIG, P2PStream, PgStatus, RankTrace, Stream
from slurm_attr.flightrec.tracewire import from_wire, to_wire


def _trace() -> RankTrace:
    tr = RankTrace(rank=7, path="nodes/n1/fr/nccl_trace_rank_7", node="n1", version="2.10", n_entries=5,
                   bad_entries=1, history_truncated=True, pg_config_broken=True, stray_ranks="m2-ab",
                   bad_pg_config=["9"], newest=("1", 12))
    tr.pg_config = {"0": ("default_pg", "m8-aa"), "1": ("TP", None)}
    tr.pg_status = {"1": PgStatus(12, 11)}
    tr.unmapped_status = {4: PgStatus(3, -1)}
    tr.pg_ids = {0: "0", 1: "1"}
    tr.descs = {"1": "TP"}
    tr.streams = {"1": Stream(lo=10, sigs=array("q", [5, NO_SIG, (1 << 62) + 3]), pos=array("l", [0, -1, 4]),
                              times=array("q", [1 << 60, 0, 7]), pending=bytearray(b"\x00\x00\x01"),
                              completed=bytearray(b"\x01\x00\x00"))}
    tr.p2p = {"1": P2PStream(lo=2, sigs=array("q", [9, NO_SIG]))}
    return tr


def test_a_trace_comes_back_with_every_field() -> None:
    tr = _trace()
    back = from_wire(pickle.loads(pickle.dumps(to_wire(tr))))
    assert back == tr
    assert back.streams["1"].pos.typecode == "l" and back.streams["1"].pending == bytearray(b"\x00\x00\x01")
    assert back.pg_status["1"] == PgStatus(12, 11) and back.unmapped_status == {4: PgStatus(3, -1)}
    assert back.p2p["1"].sigs.tolist() == [9, NO_SIG] and back.newest == ("1", 12)
    # near miss: one signature of one stream differs, and so does the trace that comes back
    other = _trace()
    other.streams["1"].sigs[2] = 6
    assert from_wire(to_wire(other)) != tr


def test_the_wire_form_is_plain_data() -> None:
    """No class of ours in it: the pool's pickle of it names no global but the pool's own."""
    w = to_wire(_trace())
    plain = (tuple, dict, list, str, int, bytes, bool, type(None))

    def walk(x) -> None:
        assert isinstance(x, plain), type(x)
        if isinstance(x, (tuple, list)):
            for y in x:
                walk(y)
        elif isinstance(x, dict):
            for k, v in x.items():
                walk(k)
                walk(v)

    walk(w)
    assert b"RankTrace" not in pickle.dumps(w) and b"RankTrace" in pickle.dumps(_trace())  # near miss: the record itself
