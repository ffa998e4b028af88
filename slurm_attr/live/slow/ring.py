"""The node's part of the slow anomalies (anomalies.py): every local record's header ring, read
again from its file (the post-mortem reader keeps only the slots), into the summary's
``slow`` key: per communicator and comm rank, [[opi, entry time in wall-clock us, func], ...].

The records are the job's: hostile. One bounded positioned read per file, opened relative to
the probe directory without following links (O_NOFOLLOW, O_NONBLOCK); a torn or foreign
ring entry is dropped.

Bounded whatever the job: a node sends only entries whose opi is a multiple of a power of two:
at least ``stride(nranks)`` (1 up to 256 ranks), and in a large job (its largest communicator
over 256 ranks) large enough that each communicator's ring entries thin to about
``HRING * 256 / job ranks`` (at least PER_COMM) per rank and cycle: the leader then joins about
the same number of entries per cycle at 4096 ranks as at 256. Powers of two nest, so when
two nodes pick different strides the coarser one's collectives still join; intervals are per
collective ((t - t_prev) / (opi - opi_prev)) whatever the stride.
"""
from __future__ import annotations

import os
from typing import Any, Iterable

from ... import safefs
from ...errors import UnsafePath
from ...probe import layout as L
from ...probe.record import RankRecord

VERSION = 1
STRIDE_RANKS = 256  # above this many ranks a communicator's collectives are sampled
PER_COMM = 4  # ring entries a node sends per communicator, rank and cycle, at the least (large jobs)
MAX_SPAN = 1024  # opis between two sampled entries of a rank beyond which no interval is taken
_RFLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
_RING_BYTES = L.HRING * L.HRING_ENT.size
_HI = {n: i for i, n in enumerate(L.HRING_NAMES)}
_TAG, _SLOT, _FUNC, _KIND, _HASH, _START, _OPI = (_HI[n] for n in ("tag", "slot", "func", "kind", "comm_hash",
                                                                  "start_ns", "opi"))


def stride(nranks: int) -> int:
    return max(1, nranks // STRIDE_RANKS)


def ring_entries(rec: RankRecord, ring: bytes, thin: bool = True) -> dict[tuple[int, int], list[list[int]]]:
    """(comm hash, comm rank) -> [[opi, entry time in wall-clock us, func], ...] of the
    collectives in one record's header ring. A torn or foreign entry is dropped: its tag must
    sit at its ring position, its slot must be this record's slot of the same communicator and
    its opi one that slot has launched. ``thin``: the large-job budget (the post-mortem's one
    read keeps every entry of communicators up to 256 ranks)."""
    slots = {s.index: s for s in rec.slots}
    out: dict[tuple[int, int], list[list[int]]] = {}
    seen: dict[int, int] = {}  # slot index -> its collectives in the ring
    for i, e in enumerate(L.HRING_ENT.iter_unpack(ring[:_RING_BYTES])):
        tag = e[_TAG]
        if not tag or (tag - 1) % L.HRING != i or e[_KIND] != 1:
            continue
        s = slots.get(e[_SLOT])
        opi = e[_OPI]
        if s is None or s.comm_hash != e[_HASH] or s.rank < 0 or not 0 <= opi < s.op_count:
            continue
        t = rec.rt_ns(e[_START])
        if t is None:
            continue
        seen[s.index] = seen.get(s.index, 0) + 1
        out.setdefault((s.comm_hash, s.rank), []).append([opi, t // 1000, min(e[_FUNC], L.NFUNC - 1)])
    scale = max((s.nranks for s in slots.values()), default=1)
    cap = max(PER_COMM, L.HRING * STRIDE_RANKS // max(1, scale)) if thin else 1 << 30
    for s in slots.values():
        key = (s.comm_hash, s.rank)
        if key in out:
            k = max(stride(s.nranks), 1 << max(0, (seen[s.index] - 1) // cap).bit_length())
            if k > 1:
                out[key] = [e for e in out[key] if e[0] % k == 0]
    return out


def node_part(jobdir: str, records: Iterable[RankRecord], subdir: str = "probe", thin: bool = True) -> dict[str, Any]:
    """The summary's ``slow`` key: every record's ring entries, read again from its file (the
    reader keeps only the slots): one bounded positioned read each, no link followed."""
    ents: list[list[Any]] = []
    problems = 0
    try:
        dfd = safefs.open_dir(jobdir, subdir)
    except UnsafePath:
        return {"v": VERSION, "e": []}
    try:
        for rec in records:
            name = rec.path.rsplit("/", 1)[-1]
            try:
                fd = os.open(name, _RFLAGS, dir_fd=dfd)
            except OSError:
                problems += 1
                continue
            try:
                ring = os.pread(fd, _RING_BYTES, L.RING_OFF)
            except OSError:
                problems += 1
                continue
            finally:
                os.close(fd)
            if len(ring) < _RING_BYTES:
                problems += 1
                continue
            for (h, cr), lst in ring_entries(rec, ring, thin).items():
                ents.append([f"{h:016x}", cr, lst])
    finally:
        os.close(dfd)
    return {"v": VERSION, "e": ents, "unread": problems}
