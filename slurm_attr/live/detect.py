"""The job-wide view: every node's summary combined, and hang detection on it.

A communicator *hangs* when some rank has a collective under way (on the GPU, steps
waiting, inside NCCL, or the ranks disagree on how many they launched) and no rank of it
has progressed for the threshold: ``[live] hang_after_s``, raised to ADAPT x the longest
stall that ended in progress so far in this job (a job whose collectives legitimately
take 30 s is not hung at 60 s). Progress is a change of a rank's progress counter as
*this* watcher observed it, in its own monotonic clock: nodes' clocks never meet.

A slow job that keeps progressing never reaches the threshold; a communicator at rest
(no collective under way: compute, I/O, a side communicator not used) is never a hang.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .nodeview import pending

ADAPT = 4.0  # the threshold is at least this many times the longest stall seen to end


@dataclass
class Hang:
    comm: str  # hash, hex
    label: str
    nranks: int
    quiet_s: float  # how long no rank has progressed
    threshold_s: float
    since_wall_ns: int | None  # the latest event any rank recorded (the records' clock)
    members: dict[int, dict[str, Any]]  # comm rank -> member summary (with "node")
    missing: list[int] = field(default_factory=list)  # comm ranks with no summary


@dataclass
class _CommState:
    changed: dict[int, tuple[int, float]] = field(default_factory=dict)  # crank -> (prog, when)
    longest_s: float = 0.0  # the longest pending-and-quiet span that ended in progress
    quiet_s: float = 0.0  # the current one (while pending)
    reported: float | None = None  # the stall (its start) already reported


def combine(summaries: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """comm hash -> {label, nranks, members: {crank: member + node}} across nodes."""
    comms: dict[str, dict[str, Any]] = {}
    for s in summaries:
        node = s.get("node")
        for c in s.get("comms") or ():
            h = c.get("hash")
            if not isinstance(h, str):
                continue
            entry = comms.setdefault(h, {"label": c.get("label") or h, "nranks": 0, "members": {}})
            n = c.get("nranks")
            if isinstance(n, int) and not isinstance(n, bool):
                entry["nranks"] = max(entry["nranks"], n)
            for m in c.get("members") or ():
                cr = m.get("cr")
                if not isinstance(cr, int) or isinstance(cr, bool) or cr < 0:
                    continue
                old = entry["members"].get(cr)
                if old is not None and (old.get("act") or 0) >= (m.get("act") or 0):
                    continue  # two processes claim one comm rank: the newer wins, as post-mortem
                entry["members"][cr] = dict(m, node=node)
    return comms


class Tracker:
    """Keeps, across cycles, when each rank of each communicator last progressed."""

    def __init__(self, hang_after_s: float, adapt: float = ADAPT):
        self.hang_after_s = hang_after_s
        self.adapt = adapt
        self.state: dict[str, _CommState] = {}

    def threshold(self, comm: str) -> float:
        st = self.state.get(comm)
        return max(self.hang_after_s, self.adapt * st.longest_s) if st else self.hang_after_s

    def update(self, summaries: list[dict[str, Any]], now: float) -> list[Hang]:
        """New hangs at monotonic time ``now`` (each stall reported once)."""
        hangs = []
        for h, c in combine(summaries).items():
            st = self.state.setdefault(h, _CommState())
            members = c["members"]
            latest = None
            for cr, m in members.items():
                old = st.changed.get(cr)
                prog = m.get("prog")
                when = old[1] if old is not None and old[0] == prog else now
                st.changed[cr] = (prog, when)
                latest = when if latest is None else max(latest, when)
            if latest is None:
                continue
            quiet = now - latest
            busy = any(pending(m) for m in members.values()) or len({tuple(m.get("fs") or ()) for m in members.values()}) > 1
            if quiet == 0 and st.quiet_s > 0:
                st.longest_s = max(st.longest_s, st.quiet_s)  # a stall that ended: a slow collective
            st.quiet_s = quiet if busy else 0.0
            if not busy or quiet < self.threshold(h) or st.reported == latest:
                continue
            st.reported = latest
            acts = [m.get("act") for m in members.values() if isinstance(m.get("act"), int)]
            nranks = max(c["nranks"], max(members) + 1)
            hangs.append(Hang(h, c["label"], nranks, round(quiet, 3), self.threshold(h),
                              max(acts) if acts else None, members,
                              [r for r in range(nranks) if r not in members][:64]))
        return hangs
