"""The hang threshold each communicator learns from its own rhythm, down as well as up.

Each watcher cycle in which a communicator's progress is observed adds one *gap*: how long
it had been pending (a collective under way) without progress before that, 0 when it
progressed in the cycle before too. A communicator at rest (nothing under way: compute,
I/O) adds nothing, so a long compute phase is no gap. Once ``MIN_SAMPLES`` gaps are in,
the threshold is ``MARGIN`` x their ``QUANTILE`` (nearest rank over the last ``WINDOW``),
floored at ``[live] hang_floor_s`` and capped by the ceiling (``[live] hang_after_s``,
raised by detect.py's ADAPT x the longest stall the job recovered from); with fewer gaps,
the ceiling itself. A stall the job recovers from is a gap like any other: a recurring
20 s collective raises the threshold of its communicator to 60 s, and nothing else's.

Why these numbers (README "The threshold, learned", measured by bench/bench_live_nearmiss.py
--gaps): in the healthy scenarios 76-100 % of the gaps at one-second cycles are 0, and the
largest gap against the p99 of the gaps before it was 2.0x (evaluation, gradual slowdown),
so MARGIN 3 keeps 1.5x over it; with up to 256 gaps the p99 is the third largest, so one
rare long stall does not hold the threshold up for minutes (a checkpoint is the busy
check's, busy.py, and is not learned at all).

Memory: WINDOW floats per communicator in an ``array`` ring (2 KiB), for at most
``MAX_COMMS`` communicators per tracker; one beyond them keeps the ceiling.
"""
from __future__ import annotations

from array import array

QUANTILE = 0.99
MARGIN = 3.0
WINDOW = 256
MIN_SAMPLES = 10
MAX_COMMS = 1024


class Gaps:
    """The last WINDOW gaps of one communicator, in a fixed ring."""

    __slots__ = ("ring", "n")

    def __init__(self) -> None:
        self.ring = array("d")
        self.n = 0  # gaps ever added

    def add(self, gap: float) -> None:
        if len(self.ring) < WINDOW:
            self.ring.append(gap)
        else:
            self.ring[self.n % WINDOW] = gap
        self.n += 1

    def quantile(self, q: float = QUANTILE) -> float | None:
        """Nearest-rank quantile of the gaps held; None while fewer than MIN_SAMPLES."""
        if len(self.ring) < MIN_SAMPLES:
            return None
        xs = sorted(self.ring)
        k = max(0, min(len(xs) - 1, -int(-q * len(xs) // 1) - 1))
        return xs[k]


def learned(gaps: Gaps | None, floor_s: float, ceiling_s: float) -> float:
    """The threshold for a communicator with these gaps: MARGIN x their high quantile,
    within [floor_s, ceiling_s]; the ceiling while there is too little history."""
    q = gaps.quantile() if gaps is not None else None
    if q is None:
        return ceiling_s
    return min(ceiling_s, max(floor_s, MARGIN * q))
