"""How a loader worker sends its ``RankTrace`` records back: plain tuples, bytes and dicts.

Pickled as dataclasses, every trace cost the pool ~25 reduce calls (the record, its streams,
each array and bytearray, each pg_status row): at 32,768 ranks about a tenth of the workers'
time, spent again by the parent to unpickle them. As plain values the pickler writes them
without a call, and the parent rebuilds the records from them (``array.frombytes`` is a
copy). Both ends are this process's own code on one machine, so native array sizes agree.
"""
from __future__ import annotations

from array import array
from dataclasses import fields
from typing import Any

from .types import P2PStream, PgStatus, RankTrace, Stream

_FIELDS = tuple(f.name for f in fields(RankTrace))
_STATUS, _UNMAPPED, _STREAMS, _P2P = (_FIELDS.index(n) for n in ("pg_status", "unmapped_status", "streams", "p2p"))


def _arr(typecode: str, raw: bytes) -> array:
    a = array(typecode)
    a.frombytes(raw)
    return a


def to_wire(tr: RankTrace) -> tuple[Any, ...]:
    """The trace as a tuple of plain values (its fields in order)."""
    d = tr.__dict__
    out = [d[name] for name in _FIELDS]
    out[_STATUS] = {k: (v.last_enqueued, v.last_completed) for k, v in tr.pg_status.items()}
    out[_UNMAPPED] = {k: (v.last_enqueued, v.last_completed) for k, v in tr.unmapped_status.items()}
    out[_STREAMS] = {k: (s.lo, s.sigs.typecode, s.sigs.tobytes(), s.pos.typecode, s.pos.tobytes(),
                             s.times.typecode, s.times.tobytes(), bytes(s.pending), bytes(s.completed))
                         for k, s in tr.streams.items()}
    out[_P2P] = {k: (p.lo, p.sigs.typecode, p.sigs.tobytes()) for k, p in tr.p2p.items()}
    return tuple(out)


def from_wire(values: tuple[Any, ...]) -> RankTrace:
    """The trace ``to_wire`` was given."""
    d = dict(zip(_FIELDS, values))
    d["pg_status"] = {k: PgStatus(*v) for k, v in d["pg_status"].items()}
    d["unmapped_status"] = {k: PgStatus(*v) for k, v in d["unmapped_status"].items()}
    d["streams"] = {k: Stream(lo, _arr(ts, s), _arr(tp, p), _arr(tt, t), bytearray(pend), bytearray(done))
                    for k, (lo, ts, s, tp, p, tt, t, pend, done) in d["streams"].items()}
    d["p2p"] = {k: P2PStream(lo, _arr(ts, s)) for k, (lo, ts, s) in d["p2p"].items()}
    return RankTrace(**d)
