"""Communicators across ranks: the records regrouped by comm hash, and the shared pieces
the probe's rules use (time conversion, naming, building the Symptom).

NCCL gives every rank of a communicator the same commHash, so slots with equal hashes
from different files are one communicator, indexed by the comm-local rank each slot
carries. Times are converted per file (each process's monotonic clock is anchored to
wall-clock time at the record's creation) before any comparison across processes.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from .. import jobtext
from ..bundle import Bundle
from ..model import Evidence, Symptom
from . import layout as L
from .reader import SOURCE
from .record import RankRecord, Slot

# A stall younger than this at the job's end is a job killed mid-flight, not a hang.
MIN_STALL_S = 2.0


# A communicator's member is one rank's slot; its record is ``slot.rec``.
Member = Slot


def grank(m: Member) -> int | None:
    """The member's global rank, None when its process had none."""
    return m.rec.global_rank if m.rec.global_rank >= 0 else None


def member_activity_ns(m: Member) -> int | None:
    """Wall-clock ns of this rank's last event on the communicator (its init at worst)."""
    known = [t for t in m.stamps if t]
    return m.rec.rt_ns(max(known)) if known else None


@dataclass
class Comm:
    hash: int
    members: dict[int, Member] = field(default_factory=dict)  # comm rank -> member
    nranks: int = 0
    duplicates: int = 0  # two files claiming the same comm rank (kept the newer)

    @property
    def label(self) -> str:
        """The name its lowest rank gave it, and the hash (how NCCL's RAS names it too). The
        name is the job's: quoted where it is more than a plain token ("world" stays bare),
        so it never reads as words of the summaries and headlines that embed the label."""
        name = self.members[min(self.members)].name
        return f"{jobtext.quote(name, 64)} {self.hash:016x}" if name else f"{self.hash:016x}"

    def last_activity_ns(self, cranks: list[int] | None = None) -> int | None:
        """The latest event of the given members (all by default) on this communicator."""
        pick = self.members.values() if cranks is None else (self.members[c] for c in cranks)
        known = [t for t in map(member_activity_ns, pick) if t is not None]
        return max(known) if known else None

    def global_of(self, crank: int) -> int | None:
        m = self.members.get(crank)
        return grank(m) if m is not None else None


def group(records: list[RankRecord]) -> list[Comm]:
    """Slots regrouped into communicators (unknown hash 0, v3 before any op, skipped)."""
    comms: dict[int, Comm] = {}
    for rec in records:
        for slot in rec.slots:
            if slot.comm_hash == 0 or slot.rank < 0:
                continue
            c = comms.get(slot.comm_hash)
            if c is None:
                c = comms[slot.comm_hash] = Comm(slot.comm_hash)
            c.nranks = max(c.nranks, slot.nranks)
            old = c.members.get(slot.rank)
            if old is not None:
                c.duplicates += 1
                if old.rec.create_rt_ns >= rec.create_rt_ns:
                    continue
            c.members[slot.rank] = slot
    for c in comms.values():
        c.nranks = max(c.nranks, max(c.members) + 1)
    return sorted(comms.values(), key=lambda c: c.hash)


def job_end_ns(bundle: Bundle) -> int | None:
    """The job's end (job.json end_time) as wall-clock ns, when known and parseable."""
    value = bundle.job.get("end_time")
    if not isinstance(value, str) or not value:
        return None
    try:
        dt = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return int(dt.timestamp() * 1e9)


def stalled_s(end_ns: int | None, since_ns: int | None) -> float | None:
    if end_ns is None or since_ns is None:
        return None
    return round((end_ns - since_ns) / 1e9, 3)


def iso(ns: int | None) -> str | None:
    if ns is None:
        return None
    try:
        return datetime.fromtimestamp(ns / 1e9, tz=timezone.utc).isoformat(timespec="milliseconds")
    except (OverflowError, OSError, ValueError):
        return None


def node_of(bundle: Bundle, member: Member | None, rank: int | None) -> str | None:
    """The node a rank ran on. The record's node directory first: the epilog put the file
    there from the node it was written on, whereas job.json's rank map follows Slurm's task
    ids, which are not the framework's ranks under torchrun (one task per node)."""
    if member is not None:
        return member.rec.node
    return bundle.node_of_rank(rank)


def who(member: Member | None, crank: int) -> str:
    g = grank(member) if member is not None else None
    return f"rank {g}" if g is not None else f"comm rank {crank}"


def func_op(func: int, seq: int) -> str:
    return f"{L.func_name(func)} #{seq}"


def fact(member: Member) -> str:
    """A compact line of what a rank's slot says, for the evidence text."""
    s = member
    waits = ", ".join(f"{L.WAITS[i]}={n}" for i, n in enumerate(s.in_state) if n) or "no steps waiting"
    cur = s.kch_op(s.kch_cur)
    kern = f"kernel in {func_op(*cur)} on {bin(s.kch_inflight).count('1')} channel(s)" if cur and s.kch_inflight else "no kernel in flight"
    launched = ", ".join(f"{L.func_name(f)}={n}" for f, n in enumerate(s.func_seq) if n) or "none"
    if s.ce_tasks:  # NCCL 2.29+: collectives the copy engines run show no kernel channels
        launched += f" ({s.ce_tasks} by the copy engines)"
    return (f"{who(member, s.rank)} pid {member.rec.pid} comm {s.comm_hash:016x} rank {s.rank}/{s.nranks}: "
            f"launched {launched}; {kern}; {waits}")


def make_symptom(bundle: Bundle, sid: str, cause: str, priority: int, member: Member | None,
                 crank: int, summary: str, fields: dict[str, Any], evidence: list[Member],
                 time_ns: int | None = None) -> Symptom:
    g = grank(member) if member is not None else None
    return Symptom(
        id=sid, cause=cause, role="root", priority=priority, trusted=False,
        node=node_of(bundle, member, g), rank=g, time=iso(time_ns), action="none",
        summary=summary, fields=fields,
        evidence=[Evidence(source=SOURCE, path=m.rec.path, text=fact(m)) for m in evidence],
    )
