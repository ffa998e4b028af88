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

A trusted event that the clocks put first by less than their margin does not outrank the
program's own failure on another node (the policy's "own_code": an exception, an OOM): a fault
on one node reaches the others only through the collectives, as errors of the "echo" group, so
it cannot have raised that failure, and the clocks cannot say it came first. Nor does it
outrank, on any node, an exception of a class no device fault raises (a ValueError, a
ModuleNotFoundError; the policy's device_raised lists the classes CUDA and NCCL errors take). The program's
failure is then the first; the event is the node's health (it still drains), unless a rank on
the event's node failed first-hand before it.
"""
from __future__ import annotations

from bisect import bisect_left, bisect_right
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional, Sequence

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


def _not_device_raised(s: Symptom) -> bool:
    """An exception whose class no device or link fault raises (the policy's device_raised)."""
    exc = s.fields.get("exc")
    if not isinstance(exc, str) or not exc:
        return False
    return exc.rsplit(".", 1)[-1] not in policy.load().special.device_raised  # torch.AcceleratorError: its last part


def _independent(own: Symptom, event: Symptom, cands: Sequence[Symptom], est: Callable[[Symptom], float],
                 earliest: Callable[[Symptom], float]) -> bool:
    """``own``, the program's own failure, cannot have been caused by ``event``, a trusted fault
    within the kernel clocks' margin of it, or another node's echo that its untimed failure may
    have preceded: it ran on another node, or (for a fault) no device fault raises its class; and
    no rank on the event's node failed first-hand before it (not an echo of a lost peer)."""
    p = policy.load()
    # a trusted fault, or the job's own word for what a rank prints when a peer died (its node's
    # clock differs from the other nodes' by seconds to minutes, like the kernel's)
    kind = (event.trusted and event.cause not in p.group("own_code")) or (not event.trusted and event.cause in p.group("echo"))
    if (own.trusted or own.cause not in p.group("own_code") or own.id.startswith(p.special.collective_borne)
            or not kind or event.node is None or abs(est(own) - est(event)) > TRUSTED_MARGIN_S):
        return False
    if not event.trusted and (own.node is None or own.node == event.node or earliest(own) > est(event)):
        # an echo on the failure's own node or a node not known to differ, or one the failure's
        # own time puts before it (the job's clocks are the nodes' system clocks: the output's
        # times order lines across nodes; only an untimed failure may have come first)
        return False
    if not ((own.node is not None and own.node != event.node) or _not_device_raised(own)):
        return False
    return not any(s.node == event.node and not s.trusted and s.cause not in p.group("echo") and est(s) < est(own)
                   for s in cands)


def _own_code_first(first: Symptom, cands: Sequence[Symptom], est: Callable[[Symptom], float],
                    earliest: Callable[[Symptom], float]) -> Optional[Symptom]:
    """The program's own failure that ``first``, an event the clocks put before it by less than
    their margin, cannot have caused; None when there is none."""
    t0 = est(first)
    own = [s for s in cands if est(s) >= t0 and _independent(s, first, cands, est, earliest)]
    return min(own, key=lambda s: (est(s), first_line(s))) if own else None


def _exited_first(first: Symptom, cands: Sequence[Symptom], ex: Optional[Symptom],
                  est: Callable[[Symptom], float], earliest: Callable[[Symptom], float]) -> Optional[Symptom]:
    """The program's own failure of the task srun says exited first with an error, where the
    earliest timed failure is only an echo (what a rank prints when a peer died) on another node
    and the failure, untimed, may have come before it: the echo is that exit's consequence."""
    p = policy.load()
    if (ex is None or not ex.node or first.trusted or first.cause not in p.group("echo")
            or first.node is None or first.node == ex.node):
        return None
    mine = [s for s in cands if not s.trusted and s.cause in p.group("own_code")]
    # a failure printed without its node is the exiting task's when it is the job's only one
    # (its process died of it: srun's first exit with an error says where)
    own = [s for s in mine if (s.node == ex.node or (s.node is None and len(mine) == 1))
           and (s.rank is None or ex.rank is None or s.rank == ex.rank) and earliest(s) < est(first)
           and earliest(s) != est(s)]
    return max(own, key=lambda s: (s.rank == ex.rank, s.priority)) if own else None


def order(pool: Sequence[Symptom], syms: Sequence[Symptom], job: Mapping[str, Any],
          clock: Optional[Clock] = None) -> Order:
    """The first failing rank's root among ``pool`` and the pool members that came after it."""
    cands = [s for s in pool if _is_candidate(s)]
    own = policy.load().group("own_code")
    # the program's own failure printed without its rank or node still has a time: an event
    # clearly after it cannot have caused it, wherever it ran
    unplaced = [s for s in pool if s.rank is None and s.node is None and not s.trusted and s.cause in own]
    span = _intervals(cands + unplaced, syms, clock or clock_of(job))
    cands += [s for s in unplaced if max(span[id(s)]) < _INF or min(span[id(s)]) > -_INF]
    if len(cands) < 2:
        return Order(cands[0] if cands else None, [])

    def est(s: Symptom) -> float:
        # an untimed line is taken at the timed line just above it (a traceback is printed as the
        # rank dies, right after its last log line); with nothing above, at the one below
        lo, hi = span[id(s)]
        return lo if lo > -_INF else hi

    if any(est(s) < _INF for s in cands):
        first = min(cands, key=lambda s: (est(s), span[id(s)][1], not s.trusted, first_line(s)))
        def earliest(s: Symptom) -> float:
            return span[id(s)][0]

        displaced = _own_code_first(first, cands, est, earliest)
        how = "time"
        if displaced is not None:
            first, displaced = displaced, first
            how = "time, and a fault on another node cannot have caused it"
        ex = _srun_first_exit(syms)
        exited = _exited_first(first, cands, ex, est, earliest)
        if exited is not None:
            first, how = exited, "srun exit order: its task exited first, the others' errors are its peers' echo"
        t0 = est(first)
        exact0 = span[id(first)][0] == span[id(first)][1]
        # srun's own order of task exits breaks what the clocks cannot: a trusted event within the
        # margin on another node than the task srun says exited first, whose node is the first
        # failure's, came with the teardown that exit started
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
            elif displaced is not None and s.trusted and s.node == displaced.node and abs(t - t0) <= TRUSTED_MARGIN_S:
                later.append(s)  # the displaced event and its node's other lines within the clocks' margin
            elif t >= t0 and _independent(first, s, cands, est, earliest):
                later.append(s)  # a fault close after a failure it cannot have caused came with the teardown
            elif t == _INF and not s.trusted and s.cause in policy.load().group("echo") and s.cause != first.cause and exact0:
                later.append(s)  # an untimed echo cannot outrank a failure whose time is known
            elif exited is not None and not s.trusted and s.cause in policy.load().group("echo") and s.node != first.node:
                later.append(s)  # what the peers of the task that exited first printed
        return Order(first, later, how)
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
