"""First failure wins among ranks (issue 10).

When one rank dies, every other rank reports something: watchdog timeouts, NCCL "remote process
exited", closed sockets, teardown exceptions, and sometimes a real fault minutes later during
teardown. The static cause tier cannot tell the first from the echo; time can. Each rank-level
failure (a root with a rank or a node) gets a time: its own timestamp, or, for an untimed line
in a shared output file, the time of the last timed line above it (srun forwards lines in
arrival order, so a line is no earlier than the ones before it). The earliest failure is the
root; a failure clearly later than it (any time for job output, over a minute for trusted kernel
lines, whose clocks and dmesg -T conversions drift) is its aftermath, not a rival cause.

torchrun's "Root Cause (first observed failure)" block times the failure of the rank it names.
Where no line carries a time, srun's own order of task exits names the first task that exited
with an error; the roots on that task's node go first. Where a trusted kernel event on another
node falls within the clocks' margin after the first failure, and srun says the first task to
exit was on the first failure's node, the event came with the teardown that exit started.
"""
from __future__ import annotations

from bisect import bisect_left, bisect_right
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

from ..model import Symptom
from . import policy
from .timeline import Clock, clock_of, first_line, symptom_time

# Causes a single rank or node can fail with (the policy's "rank_level"); scheduler ends (time
# limit, cancel, preemption, node loss, launch) are job-wide and keep their rank. What a rank
# reports when another rank died first is the policy's "echo": untimed, those cannot outrank a
# timed first failure.
TRUSTED_MARGIN_S = 60.0


@dataclass
class Order:
    first: Optional[Symptom]
    later: list[Symptom]
    how: str = ""  # "time" | "srun exit order" | ""


_INF = float("inf")


def _intervals(cands: Sequence[Symptom], syms: Sequence[Symptom], clock: Clock) -> dict[int, tuple[float, float]]:
    """id(candidate) -> (earliest, latest) time it can have happened.

    A line with its own time is exact. An untimed line in a shared output file happened no
    earlier than the last timed line above it and no later than the first timed line below it
    (srun and the launchers forward lines in arrival order): the timed lines of the file itself
    (``time_bounds``, set by analysis.run_bundle) or, failing that, the other symptoms' lines."""
    out: dict[int, tuple[float, float]] = {}
    marks: dict[str, tuple[list[int], list[float]]] = {}  # path -> sorted line numbers, their times

    def file_marks(path: str) -> tuple[list[int], list[float]]:
        if path not in marks:
            pairs = sorted((e.line, t) for x in syms for e in x.evidence[:1] if e.path == path and e.line
                           for t in [symptom_time(x, clock)] if t is not None)
            marks[path] = ([ln for ln, _ in pairs], [t for _, t in pairs])
        return marks[path]

    # torchrun's "Root Cause (first observed failure)" block times the failure of the rank it names
    died: dict[int, float] = {}
    for x in syms:
        t = symptom_time(x, clock) if x.id == "torch.root_cause" and x.rank is not None else None
        if t is not None:
            died[x.rank] = min(t, died.get(x.rank, t))  # type: ignore[index]
    for s in cands:
        t = symptom_time(s, clock)
        if t is not None:
            out[id(s)] = (t, t)
            continue
        lo, hi = -_INF, died.get(s.rank, _INF) if s.rank is not None else _INF
        bounds = s.fields.get("time_bounds")
        if isinstance(bounds, list) and len(bounds) == 2:
            lo = float(bounds[0]) if isinstance(bounds[0], (int, float)) else lo
            hi = min(hi, float(bounds[1])) if isinstance(bounds[1], (int, float)) else hi
        else:
            path, line = first_line(s)
            lines, times = file_marks(path)
            i = bisect_left(lines, line)
            if i > 0:
                lo = max(times[:i])
            j = bisect_right(lines, line)
            if j < len(lines):
                hi = min(hi, min(times[j:]))
        out[id(s)] = (lo, hi)
    return out


def _is_candidate(s: Symptom) -> bool:
    return s.cause in policy.load().group("rank_level") and (s.rank is not None or s.node is not None) and not s.id.startswith(("fr.", "probe."))


def _srun_first_exit(syms: Sequence[Symptom]) -> Optional[Symptom]:
    exits = [s for s in syms if s.id == "slurm.task_exit" and isinstance(s.fields.get("exitcode"), int)
             and s.fields["exitcode"] != 0 and s.evidence]
    if not exits:
        return None
    return min(exits, key=lambda s: (first_line(s)[0], first_line(s)[1]))


def order(pool: Sequence[Symptom], syms: Sequence[Symptom], job: Mapping[str, Any],
          clock: Optional[Clock] = None) -> Order:
    """The first failing rank's root among ``pool`` and the pool members that came after it."""
    cands = [s for s in pool if _is_candidate(s)]
    if len(cands) < 2:
        return Order(cands[0] if cands else None, [])
    span = _intervals(cands, syms, clock or clock_of(job))

    def est(s: Symptom) -> float:
        # an untimed line is taken at the timed line just above it (a traceback is printed as the
        # rank dies, right after its last log line); with nothing above, at the one below
        lo, hi = span[id(s)]
        return lo if lo > -_INF else hi

    if any(est(s) < _INF for s in cands):
        first = min(cands, key=lambda s: (est(s), span[id(s)][1], not s.trusted, first_line(s)))
        t0 = est(first)
        exact0 = span[id(first)][0] == span[id(first)][1]
        # srun's own order of task exits breaks what the clocks cannot: a trusted event within the
        # margin on another node than the task srun says exited first, whose node is the first
        # failure's, came with the teardown that exit started
        ex = _srun_first_exit(syms)
        exited_here = ex is not None and ex.node is not None and ex.node == first.node
        later = []
        for s in cands:
            if s is first or (s.cause == first.cause and s.node is not None and s.node == first.node):
                continue  # the same failure seen from another source (the kernel's and the rank's view)
            if f"{s.id} on {s.node}" in first.status.confirmed_by:
                continue  # the trusted event that confirms the first failure is that failure
            if s.trusted and not first.trusted and first.cause in policy.load().group("echo"):
                # the job's own word for a network or hang symptom cannot put a node's kernel event
                # after it: that is what a dying peer makes the survivors print, the nodes' clocks
                # differ by seconds to minutes, and the output is buffered
                continue
            lo, _ = span[id(s)]
            t = lo if lo > -_INF else est(s)
            margin = TRUSTED_MARGIN_S if s.trusted else 0.0
            same_file_after = first_line(s)[0] == first_line(first)[0] and first_line(s)[1] > first_line(first)[1]
            if t > t0 + margin or (not s.trusted and t >= t0 and same_file_after):
                later.append(s)
            elif s.trusted and exited_here and t >= t0 and s.node and s.node != first.node:
                later.append(s)
            elif t == _INF and not s.trusted and s.cause in policy.load().group("echo") and s.cause != first.cause and exact0:
                later.append(s)  # an untimed echo cannot outrank a failure whose time is known
        return Order(first, later, "time")
    # No times: srun's report of which task exited first with an error, if it names a node.
    ex = _srun_first_exit(syms)
    if ex is None or not ex.node:
        return Order(None, [])
    mine = [s for s in cands if s.node == ex.node]
    if not mine:
        return Order(None, [])
    first = max(mine, key=lambda s: (s.rank == ex.rank, s.trusted, s.priority))
    # srun's order is coarser than a timestamp: only echoes elsewhere yield to it, not program errors
    later = [s for s in cands if s.node != ex.node and not s.trusted and s.cause in policy.load().group("echo")]
    return Order(first, later, "srun exit order")
