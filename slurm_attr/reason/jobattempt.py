"""Which attempt of the job a symptom belongs to (issue 12 item 4) and stale evidence (issue 10):
also kernel lines the node ledger says an earlier job already owns (``fields['attributed_to']``).

A requeued job (``restart_count > 0``) appends its new output to the old file and keeps its id:
the bundle of attempt 2 can hold attempt 1's node failure. The verdict judges this attempt's
evidence; earlier lines are context. An old log pasted into the output is the same case with no
requeue. A line belongs to an earlier attempt when its own time is before this attempt started
(``start_time``, give or take a slack), or when it sits above such a line in the same file.
Without any time, a requeued job's node-failure lines are taken as the earlier attempt's when
Slurm does not record this attempt as NODE_FAIL (that is what the requeue was for).
"""
from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

from ..model import Symptom
from . import policy
from .timeline import Clock, clock_of, first_line, parse_iso, symptom_time

UNTRUSTED_SLACK_S = 120.0
TRUSTED_SLACK_S = 300.0  # dmesg -T converts uptime with the boot time: it drifts


def restart_count(job: Mapping[str, Any]) -> int:
    try:
        return max(0, int(job.get("restart_count") or 0))
    except (TypeError, ValueError):
        return 0


def mark_earlier(syms: Sequence[Symptom], job: Mapping[str, Any], clock: Optional[Clock] = None) -> list[Symptom]:
    """Set ``status.earlier`` (why) on symptoms from before this attempt; return them."""
    clock = clock or clock_of(job)
    start = parse_iso(job.get("start_time"), clock)
    restarts = restart_count(job)
    what = "an earlier attempt of this requeued job" if restarts else "before the job started"
    stale: list[Symptom] = []
    seen: set[int] = set()
    last_stale_line: dict[str, int] = {}
    if start is not None:
        for s in syms:
            if s.id.startswith("job."):
                continue  # facts about this attempt from job.json
            t = symptom_time(s, clock)
            if t is None:
                continue
            if t < start - (TRUSTED_SLACK_S if s.trusted else UNTRUSTED_SLACK_S):
                stale.append(s)
                seen.add(id(s))
                path, line = first_line(s)
                if path and not s.trusted:
                    last_stale_line[path] = max(line, last_stale_line.get(path, 0))
        for s in syms:
            if id(s) in seen or s.trusted or s.id.startswith("job."):
                continue
            path, line = first_line(s)
            if path in last_stale_line and line < last_stale_line[path] and symptom_time(s, clock) is None:
                stale.append(s)
                seen.add(id(s))
    if restarts and str(job.get("state") or "").upper() != "NODE_FAIL":
        for s in syms:
            if s.cause == "node_failure" and not s.id.startswith("job.") and id(s) not in seen and symptom_time(s, clock) is None:
                stale.append(s)
                seen.add(id(s))
    for s in syms:
        if s.fields.get("attributed_to") and id(s) not in seen:
            stale.append(s)  # the node ledger: an earlier job's verdict or drain already used this line
            seen.add(id(s))
    for s in stale:
        s.status.earlier = (f"already attributed to job {s.fields['attributed_to']}" if s.fields.get("attributed_to")
                            else what)
        if s.role in ("root", "confirmation"):
            s.role = "context"
        s.action = "none"  # a line that an earlier attempt (or job) already had is no reason to drain now
    return stale


def mark_survived(syms: Sequence[Symptom], clock: Optional[Clock] = None) -> list[Symptom]:
    """Failures the job lived through: its launcher restarted the workers after them (policy
    ``restarts``: torchrun's "will restart worker group") and the job went on; the error that
    ended it comes after the last restart. Untrusted findings only: a fatal kernel event before
    a restart still says the node is broken. Before means above the last restart line in the
    same output file, or, in another file, timed before it."""
    marks = policy.load().special.restarts
    restarts = [s for s in syms if s.id in marks]
    if not restarts:
        return []
    clock = clock or Clock()
    last_line: dict[str, int] = {}
    last_time: Optional[float] = None
    for r in restarts:
        path, line = first_line(r)
        if path:
            last_line[path] = max(line, last_line.get(path, 0))
        t = symptom_time(r, clock)
        if t is not None:
            last_time = t if last_time is None else max(last_time, t)
    survived = []
    for s in syms:
        if s.id in marks or s.trusted or s.id.startswith("job.") or s.status.earlier:
            continue
        path, line = first_line(s)
        if path in last_line:
            before = line < last_line[path]
        else:
            t = symptom_time(s, clock)
            before = t is not None and last_time is not None and t < last_time
        if before:
            s.status.earlier = "a failure the job lived through: its workers were restarted after it"
            if s.role in ("root", "confirmation"):
                s.role = "context"
            s.action = "none"
            survived.append(s)
    return survived


AFTER_END_SLACK_S = 30.0  # kernel clocks (dmesg -T) drift; a line this far past the end is past it


def mark_after_end(syms: Sequence[Symptom], job: Mapping[str, Any], clock: Optional[Clock] = None) -> list[Symptom]:
    """Set ``status.after_end`` on symptoms timed after the job ended (issue 12 item 7).

    What happened after the job's end cannot be what ended it: such a line is never the root.
    A fatal hardware line keeps its action, so the drain policy still takes the node out."""
    clock = clock or clock_of(job)
    end = parse_iso(job.get("end_time"), clock)
    if end is None:
        return []
    late = []
    for s in syms:
        if s.id.startswith("job.") or s.status.earlier:
            continue
        t = symptom_time(s, clock)
        if t is not None and t > end + AFTER_END_SLACK_S:
            s.status.after_end = True
            if s.role in ("root", "confirmation"):
                s.role = "context"
            late.append(s)
    return late
