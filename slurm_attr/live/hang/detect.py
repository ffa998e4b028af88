"""The job-wide view: every node's summary combined, and hang detection on it.

A communicator *hangs* when some rank has a collective under way (on the GPU, steps
waiting, inside NCCL, or the ranks disagree on how many they launched) and no rank of it
has progressed for the threshold. The threshold is learned per communicator from its own
gaps (threshold.py: a high quantile x a margin, floored at ``[live] hang_floor_s``) under a
ceiling: ``[live] hang_after_s``, raised to ADAPT x the longest stall that ended in
progress so far in this job (a job whose collectives legitimately take 30 s is not hung
at 60 s); the ceiling is also the threshold while a communicator has too little history.
Progress is a change of a rank's progress counter as *this* watcher observed it, in its
own monotonic clock: nodes' clocks never meet.

Below the ceiling, a stall may still be a rank that is busy rather than stuck (rank 0
writing a checkpoint while the others wait in a barrier): ``update``'s ``defer`` (busy.py)
is asked first and, when it says why the named ranks are busy, the stall is a note, not a
hang, and is judged again next cycle; at the ceiling it is reported whatever ``defer`` says.

A slow job that keeps progressing never reaches the threshold; a communicator at rest
(no collective under way: compute, I/O, a side communicator not used) is never a hang.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from ..nodeview import pending
from .threshold import MAX_COMMS, Gaps, learned

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
    ceiling_s: float = 0.0  # the threshold without learning: at it, no deferral

    def idle_ranks(self) -> list[int]:
        """Comm ranks with nothing under way while others have: the ranks the rest wait for
        (off in a checkpoint, a data loader, or stuck), whom a finding would name."""
        if not any(pending(m) for m in self.members.values()):
            return []
        return sorted(cr for cr, m in self.members.items() if not pending(m))


@dataclass
class _CommState:
    changed: dict[int, tuple[int, float]] = field(default_factory=dict)  # crank -> (prog, when)
    longest_s: float = 0.0  # the longest pending-and-quiet span that ended in progress
    quiet_s: float = 0.0  # the current one (while pending)
    reported: float | None = None  # the stall (its start) already reported
    gaps: Gaps | None = None  # the learned rhythm (threshold.py); None beyond MAX_COMMS
    deferred: bool = False  # the current stall was judged busy: not the communicator's rhythm


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

    def __init__(self, hang_after_s: float, adapt: float = ADAPT, floor_s: float | None = None):
        self.hang_after_s = hang_after_s
        self.adapt = adapt
        self.floor_s = hang_after_s if floor_s is None else min(floor_s, hang_after_s)
        self.state: dict[str, _CommState] = {}
        self.learning = 0  # communicators with a Gaps ring (at most MAX_COMMS)
        self.notes: list[tuple[Hang, str]] = []  # this cycle's deferred stalls: (stall, why)
        self.suspects: list[Hang] = []  # this cycle's stalls past half their threshold

    def ceiling(self, comm: str) -> float:
        st = self.state.get(comm)
        return max(self.hang_after_s, self.adapt * st.longest_s) if st else self.hang_after_s

    def threshold(self, comm: str) -> float:
        st = self.state.get(comm)
        return learned(st.gaps if st else None, self.floor_s, self.ceiling(comm))

    def _state(self, h: str) -> _CommState:
        st = self.state.get(h)
        if st is None:
            st = self.state[h] = _CommState()
            if self.learning < MAX_COMMS:
                st.gaps, self.learning = Gaps(), self.learning + 1
        return st

    def update(self, summaries: list[dict[str, Any]], now: float,
               defer: Callable[[Hang], str | None] | None = None) -> list[Hang]:
        """New hangs at monotonic time ``now`` (each stall reported once). A stall past its
        threshold but under its ceiling goes to ``defer`` first: a reason there makes it a
        note (``self.notes``) instead, judged again next cycle."""
        hangs: list[Hang] = []
        self.notes, self.suspects = [], []
        for h, c in combine(summaries).items():
            st = self._state(h)
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
            if quiet == 0 and st.quiet_s > 0 and not st.deferred:
                # a stall that ended: a slow collective. Not one judged busy (a checkpoint the
                # others waited for): on the test cluster a 33 s checkpoint raised the ceiling
                # to 132 s, past which the next busy-looking stall waited instead of 60 s
                st.longest_s = max(st.longest_s, st.quiet_s)
            if quiet == 0 and st.gaps is not None and (busy or st.quiet_s > 0) and not st.deferred:
                st.gaps.add(st.quiet_s)  # progress seen: the pending span it ended (0: steady)
            if quiet == 0:
                st.deferred = False
            st.quiet_s = quiet if busy else 0.0
            if not busy or st.reported == latest or quiet < self.floor_s / 2:  # the floor bounds every threshold
                continue
            threshold, ceiling = self.threshold(h), self.ceiling(h)
            acts = [m.get("act") for m in members.values() if isinstance(m.get("act"), int)]
            nranks = max(c["nranks"], max(members) + 1)
            hang = Hang(h, c["label"], nranks, round(quiet, 3), threshold, max(acts) if acts else None, members,
                        [r for r in range(nranks) if r not in members][:64], ceiling)
            if quiet < threshold:
                if 2 * quiet >= threshold:
                    self.suspects.append(hang)  # the busy check may ask its ranks' stacks now
                continue
            why = defer(hang) if defer is not None and quiet < ceiling else None
            if why:
                st.deferred = True  # a checkpoint is not the rhythm: its span is not learned
                self.notes.append((hang, why))
                self.suspects.append(hang)
                continue
            st.reported = latest
            hangs.append(hang)
        return hangs
