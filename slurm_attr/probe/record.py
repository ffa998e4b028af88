"""Decoding one probe record (the per-rank file) into checked Python objects.

The file is written by the job, so every count, index and string is hostile: nothing
here indexes with a value from the file without a bound, and a value out of range either
drops that piece (a torn ring entry, a peer entry with an impossible rank) or rejects the
file with ``ProbeFormatError`` naming the reason. Numbers are only ever compared, never
used to size anything.
"""
from __future__ import annotations

from operator import itemgetter
from typing import Any, NamedTuple

from . import layout as L

MAX_RANKS = 1 << 24  # ranks are 24-bit in the peer keys; more is a corrupt file


class ProbeFormatError(ValueError):
    """The bytes are not a usable probe record; the message says why (for coverage)."""


class OpEntry(NamedTuple):
    opi: int  # per-communicator collective index
    func: int
    dtype: int
    algo: int
    proto: int
    root: int
    nch: int
    count: int
    seq: int  # NCCL seqNumber of this function on this communicator


class Peer(NamedTuple):
    peer: int  # comm rank
    last_ch: int
    kind: int  # layout.PK_* bits
    send_posted: int
    send_done: int
    recv_posted: int
    recv_done: int
    wait: tuple[int, ...]  # steps now in each layout.WAITS state
    last_send_ms: int  # ms after the record's creation + 1; 0 = never
    last_recv_ms: int
    p2p_ops: int


def _text(raw: bytes, cap: int = 64) -> str:
    """A NUL-terminated, job-written string made safe to print."""
    s = raw.split(b"\0", 1)[0][:cap].decode("utf-8", errors="replace")
    return s if s.isprintable() else "".join(c if c.isprintable() else "?" for c in s)


_HOT_IDX = {name: i for i, name in enumerate(L.SLOT_HOT_FIELDNAMES)}
_HOT_GET = itemgetter(*(_HOT_IDX[n] for n in ("comm_hash", "state", "rank", "nranks", "op_count", "op_digest",
                                               "kch_started", "kch_inflight", "kch_cur", "pop_started")))
_STAMPS_GET = itemgetter(*(_HOT_IDX[n] for n in L.SLOT_STAMPS))
_HOT_FUNC_SEQ, _HOT_IN_STATE = _HOT_IDX["func_seq0"], _HOT_IDX["in_state0"]


class Slot:
    """One communicator of one rank.

    The fields every rule reads for every rank (layout.SLOT_HOT_NAMES) are plain
    attributes from one small unpack; every other fixed field (layout.SLOT_FIELDS) is a
    read-only attribute of the same name, unpacked on first use, as are the op ring, the
    peer table and the channel table: 4096 ranks x several slots must decode in
    milliseconds."""

    __slots__ = ("rec", "index", "buf", "off", "comm_hash", "state", "rank", "nranks", "op_count",
                 "op_digest", "kch_started", "kch_inflight", "kch_cur", "pop_started", "func_seq",
                 "in_state", "stamps", "_v", "_ops", "_peers", "_lanes")

    def __init__(self, rec: "RankRecord", index: int, buf: bytes, off: int):
        h = L.SLOT_HOT.unpack_from(buf, off)
        self.rec, self.index, self.buf, self.off = rec, index, buf, off
        (self.comm_hash, self.state, self.rank, self.nranks, self.op_count, self.op_digest,
         self.kch_started, self.kch_inflight, self.kch_cur, self.pop_started) = _HOT_GET(h)
        self.func_seq = h[_HOT_FUNC_SEQ:_HOT_FUNC_SEQ + L.NFUNC]
        self.in_state = h[_HOT_IN_STATE:_HOT_IN_STATE + L.NWAIT]
        self.stamps = _STAMPS_GET(h)  # layout.SLOT_STAMPS, monotonic ns (0 = never)
        self._v: tuple | None = None
        self._ops: list[OpEntry] | None = None
        self._peers: list[Peer] | None = None
        self._lanes: tuple[tuple[tuple, bytes, int], ...] = ()  # pool lanes bound to this slot (rare)

    def add_lane(self, values: tuple, buf: bytes, peers_off: int) -> None:
        """Merge a pool lane (layout.LANE values; its peer table at buf[peers_off:]): the
        other threads' share of the proxy-side counters (sattr_probe_layout.h, lanes)."""
        self._lanes += ((values, buf, peers_off),)
        self.pop_started += values[_L_POP]
        self.in_state = tuple(a + b for a, b in zip(self.in_state, values[_L_IN_STATE:_L_IN_STATE + L.NWAIT]))
        if values[_L_PROGRESS] > self.stamps[_ST_PROGRESS]:
            st = list(self.stamps)
            st[_ST_PROGRESS] = values[_L_PROGRESS]
            self.stamps = tuple(st)
        self._v = self._peers = None

    @property
    def v(self) -> tuple:
        """All fixed fields, in layout.SLOT_NAMES order (pool lanes merged in)."""
        if self._v is None:
            v = L.SLOT_FIXED.unpack_from(self.buf, self.off)
            if self._lanes:
                m = list(v)
                for values, _buf, _off in self._lanes:
                    for si, li, is_max in _CORE_MERGE:
                        m[si] = max(m[si], values[li]) if is_max else m[si] + values[li]
                v = tuple(m)
            self._v = v
        return self._v

    @property
    def name(self) -> str:
        return _text(self.comm_name, 16)

    @property
    def api_func(self) -> tuple[int, ...]:
        return self.v[_API_FUNC:_API_FUNC + L.NFUNC]

    def valid(self) -> str | None:
        """None when the identity is plausible, else why the slot is skipped."""
        if self.state not in (L.SLOT_ACTIVE, L.SLOT_FINALIZED):
            return f"slot {self.index}: state {self.state}"
        if not 0 <= self.nranks <= MAX_RANKS:
            return f"slot {self.index}: nranks {self.nranks}"
        if not -1 <= self.rank < (self.nranks or MAX_RANKS):
            return f"slot {self.index}: rank {self.rank} of {self.nranks}"
        return None

    @property
    def ops(self) -> list[OpEntry]:
        """Recent collectives, oldest first; torn, stale or impossible entries dropped."""
        if self._ops is None:
            self._ops = decode_ops(self.buf, self.off + L.OPS_OFF, self.op_count)
        return self._ops

    @property
    def peers(self) -> list[Peer]:
        if self._peers is None:
            peers = decode_peers(self.buf, self.off + L.PEERS_OFF, self.nranks)
            for _values, buf, off in self._lanes:
                peers = merge_peers(peers, decode_peers(buf, off, self.nranks))
            self._peers = peers
        return self._peers

    def channels(self) -> list[tuple[int, int, int]]:
        """(channel, last started packed, last stopped packed) for channels ever used."""
        v = L.CHANS.unpack_from(self.buf, self.off + L.CHAN_OFF)
        return [(c, v[2 * c], v[2 * c + 1]) for c in range(L.NCHAN) if v[2 * c]]

    def kch_op(self, packed: int) -> tuple[int, int] | None:
        """(func, seq) of a kch_cur/kch_done value, seq completed from func_seq."""
        if packed == 0:
            return None
        func, low = packed >> 56, (packed & ((1 << L.KCH_SEQ_BITS) - 1)) - 1
        if func >= L.NFUNC or low < 0:
            return None
        return func, widen(low, self.func_seq[func] - 1 if self.func_seq[func] else low, L.KCH_SEQ_BITS)


_I = {name: i for i, name in enumerate(L.SLOT_NAMES)}
_API_FUNC = _I["api_func0"]
for _name, _i in _I.items():
    if _name not in Slot.__slots__:
        setattr(Slot, _name, property(lambda self, _i=_i: self.v[_i]))
del _name, _i


_LI = {name: i for i, name in enumerate(L.LANE_NAMES)}
_L_POP, _L_IN_STATE, _L_PROGRESS, _L_BIND = _LI["pop_started"], _LI["in_state0"], _LI["last_progress_ns"], _LI["bind"]
_ST_PROGRESS = L.SLOT_STAMPS.index("last_progress_ns")
# (index in SLOT_NAMES, index in LANE_NAMES, take the max) for every lane core value
_CORE_MERGE = tuple((_I[n], _LI[n], n in L.CORE_MAX) for n in L.LANE_NAMES if n in _I)


def merge_peers(a: list[Peer], b: list[Peer]) -> list[Peer]:
    """Peer tables of two lanes of one slot, merged by peer rank: counts and gauges add up,
    the latest stamps win (and the channel of the lane that moved last)."""
    by = {p.peer: p for p in a}
    for q in b:
        p = by.get(q.peer)
        if p is None:
            by[q.peer] = q
            continue
        later = max(q.last_send_ms, q.last_recv_ms) > max(p.last_send_ms, p.last_recv_ms)
        by[q.peer] = Peer(p.peer, q.last_ch if later else p.last_ch, p.kind | q.kind,
                          p.send_posted + q.send_posted, p.send_done + q.send_done,
                          p.recv_posted + q.recv_posted, p.recv_done + q.recv_done,
                          tuple(x + y for x, y in zip(p.wait, q.wait)),
                          max(p.last_send_ms, q.last_send_ms), max(p.last_recv_ms, q.last_recv_ms),
                          p.p2p_ops + q.p2p_ops)
    return list(by.values())


def widen(low: int, ref: int, bits: int) -> int:
    """The value <= ref (within one wrap) whose low ``bits`` are ``low``."""
    mod = 1 << bits
    v = (ref & ~(mod - 1)) | low
    if v > ref:
        v -= mod
    return v if v >= 0 else low


def decode_ops(buf: bytes, off: int, op_count: int) -> list[OpEntry]:
    values = L.OPS.unpack_from(buf, off)
    n = len(L.OP_NAMES)
    out = []
    last = op_count - 1
    for i in range(L.OPRING):
        tag, func, dtype, algo, proto, root, nch, _nw, _fl, count, seq = values[i * n:(i + 1) * n]
        if tag == 0 or last < 0:
            continue
        opi = widen(tag - 1, last, 32)
        # an entry must sit where its index puts it and inside the ring's window
        if opi % L.OPRING != i or not last - L.OPRING < opi <= last:
            continue
        out.append(OpEntry(opi, func if func < L.NFUNC else L.NFUNC - 1, dtype, algo, proto, root,
                           nch, count, seq))
    out.sort()
    return out


def decode_peers(buf: bytes, off: int, nranks: int) -> list[Peer]:
    values = L.PEERS.unpack_from(buf, off)
    n = len(L.PEER_NAMES)
    limit = nranks if nranks > 0 else MAX_RANKS
    out = []
    for i in range(L.NPEERS):
        v = values[i * n:(i + 1) * n]
        key = v[0]
        if key == 0 or key > limit:
            continue
        out.append(Peer(key - 1, v[1], v[2], v[3], v[4], v[5], v[6], tuple(v[7:13]), v[13], v[14], v[15]))
    return out


_H = {name: i for i, name in enumerate(L.HEADER_NAMES)}
_REC_GET = itemgetter(*(_H[n] for n in ("pid", "global_rank", "create_rt_ns", "create_mono_ns", "nslots_used")))


class RankRecord:
    """One file: the process's identity (header fields by the same names as in
    layout.HEADER_FIELDS) and its valid communicator slots."""

    __slots__ = ("path", "node", "h", "pid", "global_rank", "create_rt_ns", "create_mono_ns",
                 "nslots_used", "lanes_used", "slots", "problems")

    def __init__(self, path: str, node: str, h: tuple):
        self.path = path  # relative to the bundle root
        self.node = node  # the bundle's node directory it was collected from
        self.h = h
        # rank -1: unknown
        self.pid, self.global_rank, self.create_rt_ns, self.create_mono_ns, self.nslots_used = _REC_GET(h)
        # pool lanes to merge (version 1 has none; its bytes there are reserved zeros)
        self.lanes_used = h[_LANES] if h[_VER] >= 2 else 0
        self.slots: list[Slot] = []
        self.problems: list[str] = []  # slots skipped, and why

    def __getattr__(self, name: str) -> Any:
        """The other header fields, by name (hostname and node_name as safe text)."""
        i = _H.get(name)
        if i is None:
            raise AttributeError(name)
        value = self.h[i]
        return _text(value, len(value)) if isinstance(value, bytes) else value

    def rt_ns(self, mono_ns: int) -> int | None:
        """A CLOCK_MONOTONIC stamp of this process as wall-clock ns (None for 0)."""
        if not mono_ns:
            return None
        return self.create_rt_ns + (mono_ns - self.create_mono_ns)

    def rt_ms(self, ms_stamp: int) -> int | None:
        """A peer's ms stamp (ms after creation + 1; 0 = never) as wall-clock ns."""
        if not ms_stamp:
            return None
        return self.create_rt_ns + (ms_stamp - 1) * 1_000_000


_MAGIC, _VER, _USED, _GRANK = _H["magic"], _H["layout_ver"], _H["nslots_used"], _H["global_rank"]
_LANES = _H["lanes_used"]
_SIZE_IDX = slice(_H["hdr_size"], _H["file_size"] + 1)
assert tuple(L.HEADER_NAMES[_SIZE_IDX]) == ("hdr_size", "slot_size", "nslots", "file_size")


def parse_header(buf: bytes, path: str, node: str) -> RankRecord:
    """Validate the header page; raises ProbeFormatError."""
    if len(buf) < L.HEADER.size:
        raise ProbeFormatError(f"short file ({len(buf)} bytes)")
    h = L.HEADER.unpack_from(buf, 0)
    if h[_MAGIC] != L.MAGIC:
        if h[_MAGIC] == bytes(8):
            raise ProbeFormatError("never initialised (no magic): the process died during its first NCCL init")
        raise ProbeFormatError("not a probe record (bad magic)")
    sizes = L.VERSION_SIZES.get(h[_VER])
    if sizes is None:
        raise ProbeFormatError(f"unsupported layout version {h[_VER]}")
    if h[_SIZE_IDX] != sizes:
        raise ProbeFormatError(f"layout sizes do not match version {h[_VER]}")
    if h[_USED] > L.NSLOTS:
        raise ProbeFormatError(f"nslots_used {h[_USED]} out of range")
    if h[_VER] >= 2 and h[_LANES] > L.NLANES:
        raise ProbeFormatError(f"lanes_used {h[_LANES]} out of range")
    if not -1 <= h[_GRANK] < MAX_RANKS:
        raise ProbeFormatError(f"global rank {h[_GRANK]} out of range")
    return RankRecord(path, node, h)


def parse_slots(rec: RankRecord, buf: bytes, off: int = 0) -> None:
    """Decode the used slots from ``buf`` starting at ``off`` (the first slot)."""
    n = rec.nslots_used
    if len(buf) - off < n * L.SLOT_SIZE:
        raise ProbeFormatError(f"truncated: {n} slots announced, {len(buf) - off} bytes after the header")
    keep = rec.slots
    for i in range(n):
        slot = Slot(rec, i, buf, off + i * L.SLOT_SIZE)
        st, nr = slot.state, slot.nranks
        # Slot.valid() inline for the usual good slot: 4096 ranks x several slots
        if (st == L.SLOT_ACTIVE or st == L.SLOT_FINALIZED) and 0 <= nr <= MAX_RANKS and -1 <= slot.rank < (nr or MAX_RANKS):
            keep.append(slot)
        elif st != 0:  # state 0: init was interrupted, nothing to say
            rec.problems.append(slot.valid() or f"slot {i}")


def parse_lanes(rec: RankRecord, buf: bytes, off: int = 0) -> None:
    """Merge the used pool lanes, read into ``buf`` from ``off`` (the first lane), into
    the slots they are bound to. A lane bound to no valid slot is dropped, named."""
    n = rec.lanes_used
    if len(buf) - off < n * L.LANE_SIZE:
        raise ProbeFormatError(f"truncated: {n} lanes announced, {len(buf) - off} bytes for them")
    by_index = {s.index: s for s in rec.slots}
    for k in range(n):
        lo = off + k * L.LANE_SIZE
        values = L.LANE.unpack_from(buf, lo)
        target = values[_L_BIND] & 0xFFFFFFFF
        if target == 0:
            continue  # never bound
        slot = by_index.get(target - 1)
        if slot is None:
            if target > rec.nslots_used:
                rec.problems.append(f"lane {k}: bound to slot {target - 1} of {rec.nslots_used}")
            continue
        slot.add_lane(values, buf, lo + L.LANE_PEERS_OFF)


def parse(data: bytes, path: str = "", node: str = "") -> RankRecord:
    """A whole file's bytes -> RankRecord."""
    rec = parse_header(data, path, node)
    parse_slots(rec, data, L.HDR_SIZE)
    if rec.lanes_used:
        parse_lanes(rec, data, L.LANES_OFF)
    return rec


def ring(data: bytes) -> list[dict[str, int]]:
    """The header's recent-operations ring (all communicators), oldest first: for dumps."""
    out = []
    for i in range(L.HRING):
        e = dict(zip(L.HRING_NAMES, L.HRING_ENT.unpack_from(data, L.RING_OFF + i * L.HRING_ENT.size)))
        if e["tag"] and (e["tag"] - 1) % L.HRING == i:
            out.append(e)
    out.sort(key=lambda e: e["tag"])
    return out
