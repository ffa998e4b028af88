"""The leader's join of the nodes' ring entries (ring.py) into collectives, per
communicator, for the slow anomalies (anomalies.py: S1 straggler, S3 slow phase).

Ranks agree on a collective's per-communicator index (opi), so the same opi across every
rank of a communicator is one collective; once every rank's entry of it is in, it moves to
the history with its latest entry, the rank that entered last (when it led the next-latest
by the minimum gap), that gap, and the period (the median over ranks of each one's interval
since its previous entry). Everything here came from job-written records: entries are
type-checked, and what waits for a rank's entry is bounded (MAX_PENDING).
"""
from __future__ import annotations

from collections import Counter, deque
from typing import Any

from .ring import MAX_SPAN

MAX_PENDING = 64  # collectives waiting for some rank's entry, per communicator


class Joined:
    """One communicator's joined collectives. ``hist``: (opi, last entry us, last comm rank or
    None, gap to the next-latest us, period us or None, 10th-percentile interval or None,
    func) of the last ``window`` collectives every rank entered."""

    def __init__(self, window: int):
        self.prev: dict[int, tuple[int, int]] = {}  # crank -> (opi, t) of its latest entry
        self.pend: dict[int, dict[int, tuple[int, int | None, int]]] = {}  # opi -> crank -> (t, d, func)
        self.done: deque[int] = deque(maxlen=4 * window)
        self.done_set: set[int] = set()
        self.hist: deque[tuple] = deque(maxlen=window)
        self.lasts: Counter = Counter()  # last comm rank -> collectives of hist it was last in
        self.nranks = 0
        self.phase_at = 0  # hist appends when S3 was last looked at
        self.phase_since: int | None = None  # entry (us) that began the standing slow phase
        self.appended = 0

    def add(self, cr: int, ents: list[Any]) -> None:
        # type() is int: no bool, no float, no str (hostile JSON); the hot loop at 4096 ranks
        good = sorted(e for e in ents if type(e) is list and len(e) == 3 and type(e[0]) is int
                      and type(e[1]) is int and type(e[2]) is int)
        for opi, t, func in good:  # in launch order: each entry's interval from the one before
            if opi in self.done_set:
                continue
            p = self.prev.get(cr)
            d = (t - p[1]) // (opi - p[0]) if p is not None and 0 < opi - p[0] <= MAX_SPAN and t >= p[1] else None
            if p is None or opi > p[0]:
                self.prev[cr] = (opi, t)
            slot = self.pend.get(opi)
            if slot is None:
                if len(self.pend) >= MAX_PENDING:
                    del self.pend[min(self.pend)]  # a rank's entry of it was never seen: give up
                slot = self.pend[opi] = {}
            old = slot.get(cr)
            slot[cr] = (t, d if d is not None else (old[1] if old else None), func)

    def finalize(self, min_gap_us: int) -> int:
        """Move the collectives every rank has entered into the history; forget those some
        rank's ring lost (the newest is far past them)."""
        if self.pend:
            stale = max(self.pend) - 2 * MAX_SPAN
            for opi in [o for o in self.pend if o < stale]:
                del self.pend[opi]
        n = 0
        for opi in sorted(o for o, s in self.pend.items() if len(s) >= self.nranks):
            s = self.pend.pop(opi)
            t1 = t2 = -1  # the latest and the next-latest entry (one pass: this runs per collective)
            c1 = -1
            for cr, v in s.items():
                t = v[0]
                if t > t1:
                    t1, t2, c1 = t, t1, cr
                elif t > t2:
                    t2 = t
            gap = t1 - t2 if t2 >= 0 else 0
            last = c1 if gap >= min_gap_us else None
            ds = sorted(d for _t, d, _f in s.values() if d is not None)
            period = lo = None
            if len(ds) * 2 > len(s):  # most ranks' previous entry was seen: the interval is known
                period, lo = ds[len(ds) // 2], ds[len(ds) // 10]
            if len(self.hist) == self.hist.maxlen and self.hist[0][2] is not None:
                self.lasts[self.hist[0][2]] -= 1  # leaves the window
            self.hist.append((opi, t1, last, gap, period, lo, s[c1][2]))
            self.appended += 1
            if last is not None:
                self.lasts[last] += 1
            if len(self.done) == self.done.maxlen:
                self.done_set.discard(self.done[0])
            self.done.append(opi)
            self.done_set.add(opi)
            n += 1
        return n
