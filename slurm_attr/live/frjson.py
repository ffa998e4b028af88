"""A rank's ``fr_trace_json`` reply, decoded within a budget: what each group enqueued and
completed, and the collective under way.

The reply is the job's: it may be anything up to the client's byte cap. It is decoded
into the few fields the watcher uses (msgspec structs: every other field is skipped
without being built), after a byte count that bounds the objects decoding can create:
16 MiB of ``{},{},...`` took a watcher from 27 MB to 459 MB through ``json.loads``; here
it is refused before decoding. A reply nested past msgspec's depth limit, a field of the
wrong type, or invalid JSON is one refused reply (``FrReplyError``), never the cycle.
"""
from __future__ import annotations

from typing import Union

import msgspec

# Objects ("{") one reply may hold. torch's JSON ring is ~1 object per entry without stack
# frames (the fixtures; 2000 entries ~ 0.9 MiB) and ~30 per entry with them: 250,000 covers
# an 8,000-entry ring with stacks, and its structs stay under ~20 MB.
MAX_OBJECTS = 250_000
MAX_PGS = 256
TAIL = 4096  # entries from the end of the ring that are read


class FrReplyError(ValueError):
    """The reply is not a Flight Recorder document the watcher can use."""


class Entry(msgspec.Struct, gc=False):
    collective_seq_id: Union[int, None] = None
    pg_id: Union[int, str, None] = None
    is_p2p: Union[bool, None] = None
    retired: Union[bool, None] = None
    state: Union[str, None] = None
    profiling_name: Union[str, None] = None


class PgStatus(msgspec.Struct, gc=False):
    # torch writes these as strings ("5"); ints are read too
    last_enqueued_collective: Union[int, str, None] = None
    last_completed_collective: Union[int, str, None] = None


class FrDoc(msgspec.Struct, gc=False):
    entries: list[Entry] = []
    pg_status: dict[str, PgStatus] = {}


_DECODER = msgspec.json.Decoder(FrDoc)


def decode(data: bytes | bytearray) -> FrDoc:
    """The reply's FR fields; FrReplyError when it is too big to decode safely or not one."""
    objects = data.count(b"{")  # an upper bound on what decoding may build (braces in strings count too)
    if objects > MAX_OBJECTS:
        raise FrReplyError(f"{objects} JSON objects, over the watcher's cap of {MAX_OBJECTS}")
    try:
        return _DECODER.decode(data)
    except RecursionError as err:
        raise FrReplyError("nested too deep to decode") from err
    except msgspec.ValidationError as err:
        raise FrReplyError(f"not a Flight Recorder document: {str(err)[:160]}") from err
    except msgspec.DecodeError as err:
        raise FrReplyError(f"not JSON: {str(err)[:160]}") from err


def status(doc: FrDoc) -> dict[str, list[int]]:
    """pg id -> [last enqueued, last completed] collective seq.

    From the entries (the highest seq, the highest *retired* seq), which are current; Gloo's
    ``pg_status`` lags (captured: a rank that had finished collective 3 still said
    ``last_completed_collective: 2``). ``pg_status`` only for a group with no entry left in
    the ring."""
    out: dict[str, list[int]] = {}
    for e in doc.entries[-TAIL:]:
        seq, pg = e.collective_seq_id, e.pg_id
        if e.is_p2p is True or seq is None or pg is None or len(str(pg)) > 64:
            continue
        if str(pg) not in out and len(out) >= MAX_PGS:
            continue
        cur = out.setdefault(str(pg), [0, 0])
        cur[0] = max(cur[0], seq)
        if e.retired is True:
            cur[1] = max(cur[1], seq)
    for pg, v in list(doc.pg_status.items())[:MAX_PGS]:
        if len(pg) > 64 or pg in out:
            continue
        try:
            enq, comp = int(v.last_enqueued_collective), int(v.last_completed_collective)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            continue
        out[pg] = [enq, comp]
    return out


def pending(doc: FrDoc) -> str | None:
    """The first entry not retired (a collective under way), as "gloo:all_reduce #4"."""
    for e in doc.entries[-TAIL:]:
        if e.retired is False and e.state != "completed" and e.profiling_name is not None \
                and e.collective_seq_id is not None:
            return f"{e.profiling_name[:64]} #{e.collective_seq_id}"
    return None
