"""What Slurm itself says about nodes, reduced to what the drain policy and breaker need.

Every node (and the controller) reads the same state from slurmctld, so a decision
made from it needs no shared database: the drains we hold are the nodes whose reason
starts with ``SATTR:``, when each was set is the reason's timestamp (``sinfo -R``'s
``%H``, or the ``[user@time]`` that ``scontrol show node`` appends), and partition
sizes come from the node records. This module imports nothing else of the package but
errors: drain.py and breaker.py build on it, never the other way round.
"""
from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Iterable

PREFIX = "SATTR:"

# State words (scontrol's State=BASE+FLAG+...) that mean a node is out of service or set
# aside on purpose. A node in any of these for a reason that is not ours is never touched.
_OUT_WORDS = frozenset({
    "DRAIN", "DRAINED", "DRAINING", "DOWN", "FAIL", "FAILING", "MAINT", "RESERVED", "REBOOT_REQUESTED",
    "REBOOT_ISSUED", "POWERED_DOWN", "POWERING_DOWN", "POWER_DOWN", "POWERING_UP", "FUTURE", "ERROR",
    "PLANNED", "INVALID_REG",
})
_DRAINED_WORDS = frozenset({"DRAIN", "DRAINED", "DRAINING", "DOWN", "REBOOT_REQUESTED", "REBOOT_ISSUED"})
_REASON_STAMP = re.compile(r"\s*\[([^\]@]*)@([^\]]*)\]\s*$")  # "... [root@2024-05-01T10:00:00]"
_JOB_IN_REASON = re.compile(r"\bjob (\S+)")

BLOCK_ALREADY = "already drained"
BLOCK_BREAKER = "circuit breaker"
NOT_OURS = "not our drain"


def slurm_time(value: str | None) -> float | None:
    """Epoch seconds of Slurm's local ``YYYY-MM-DDTHH:MM:SS`` (sinfo %H, scontrol's reason stamp)."""
    value = (value or "").strip()
    if not value or value in ("Unknown", "None", "N/A"):
        return None
    try:
        return datetime.strptime(value[:19], "%Y-%m-%dT%H:%M:%S").timestamp()
    except ValueError:
        return None


def is_ours(reason: str | None) -> bool:
    return (reason or "").lstrip().startswith(PREFIX)


def reason_job(reason: str | None) -> str | None:
    """The job id a SATTR: reason names, if any."""
    m = _JOB_IN_REASON.search(reason or "")
    return m.group(1) if m else None


@dataclass(frozen=True)
class NodeState:
    """What Slurm says about one node, reduced to what the policy needs."""

    name: str
    words: frozenset[str]
    reason: str  # without Slurm's trailing "[user@time]"
    partitions: tuple[str, ...]
    reason_time: float | None = None  # when the reason was set (epoch), if Slurm said

    @classmethod
    def from_record(cls, rec: dict[str, Any]) -> "NodeState":
        state = str(rec.get("State") or rec.get("state") or "")
        words = frozenset(w for w in re.split(r"[+\s,]", state.upper().rstrip("*~#!%$@^-")) if w)
        raw = str(rec.get("Reason") or rec.get("reason") or "")
        m = _REASON_STAMP.search(raw)
        when = slurm_time(m.group(2)) if m else None
        reason = _REASON_STAMP.sub("", raw).strip()
        if reason in ("(null)", "none", "None"):
            reason = ""
        parts = rec.get("Partitions") or rec.get("partitions") or ""
        if isinstance(parts, str):
            parts = [p for p in parts.split(",") if p and p != "(null)"]
        return cls(name=str(rec.get("NodeName") or rec.get("name") or ""), words=words, reason=reason,
                   partitions=tuple(parts), reason_time=when)

    @property
    def out_of_service(self) -> bool:
        """Drained, down, reserved, in maintenance or being rebooted."""
        return bool(self.words & _OUT_WORDS)

    @property
    def drained(self) -> bool:
        return bool(self.words & _DRAINED_WORDS)

    @property
    def ours(self) -> bool:
        return is_ours(self.reason)

    def describe(self) -> str:
        """The reason someone else set, or the state words when there is none."""
        if self.reason:
            return self.reason
        shown = sorted(self.words & _OUT_WORDS) or sorted(self.words)
        return "+".join(shown).lower() or "unknown state"


@dataclass(frozen=True)
class ReasonRow:
    """One node of ``sinfo -R -o '%N|%H|%E'``."""

    node: str
    at: float | None
    reason: str

    @property
    def ours(self) -> bool:
        return is_ours(self.reason)


def parse_sinfo_reasons(text: str) -> list[ReasonRow]:
    """Rows of ``sinfo -R -h -o '%N|%H|%E'`` (hostlists expanded; the reason last, so a '|' in an
    admin's reason stays in it). Lines that do not fit are skipped."""
    from .slurm.hostlist import expand

    out: list[ReasonRow] = []
    for line in text.splitlines():
        parts = line.split("|", 2)
        if len(parts) != 3 or not parts[0].strip():
            continue
        try:
            names = expand(parts[0].strip())
        except ValueError:
            continue
        at = slurm_time(parts[1])
        out.extend(ReasonRow(n, at, parts[2].strip()) for n in names)
    return out


def partition_allowance(total: int, percent: float) -> int:
    """How many of a partition's ``total`` nodes we may hold drained at once (at least 1)."""
    if total <= 0:
        return 1
    return max(1, math.floor(total * percent / 100.0 + 1e-9))


@dataclass
class SlurmView:
    """The cluster as the breaker sees it: node states and, per node we drained, since when."""

    nodes: dict[str, NodeState]
    reason_times: dict[str, float]

    @classmethod
    def build(cls, records: Iterable[dict[str, Any]], reasons: Iterable[ReasonRow] = ()) -> "SlurmView":
        nodes = {st.name: st for st in (NodeState.from_record(r) for r in records) if st.name}
        times = {n: st.reason_time for n, st in nodes.items() if st.reason_time is not None}
        for row in reasons:  # sinfo -R's %H is authoritative where both exist
            if row.at is not None:
                times[row.node] = row.at
        return cls(nodes=nodes, reason_times=times)

    def ours(self) -> list[NodeState]:
        """Nodes out of service with a SATTR: reason (ours, whoever of us set it)."""
        return [st for st in self.nodes.values() if st.out_of_service and st.ours]

    def drains_since(self, since: float) -> list[str]:
        """Our drains whose reason was set at or after ``since``."""
        return sorted(st.name for st in self.ours() if self.reason_times.get(st.name, 0.0) >= since)

    def partition_usage(self, extra: Iterable[tuple[str, Iterable[str]]] = ()) -> dict[str, dict[str, Any]]:
        """Per partition: total nodes and the set drained by us (plus ``extra`` (node, partitions))."""
        usage: dict[str, dict[str, Any]] = {}
        for st in self.nodes.values():
            for p in st.partitions:
                u = usage.setdefault(p, {"partition": p, "total": 0, "ours": set()})
                u["total"] += 1
                if st.out_of_service and st.ours:
                    u["ours"].add(st.name)
        for node, parts in extra:
            for p in parts:
                if p in usage:
                    usage[p]["ours"].add(node)
        return usage


def limit_check(view: SlurmView, node: str, partitions: Iterable[str], max_drains: int, window_s: float,
                max_partition_percent: float, since: float | None = None,
                now: float | None = None) -> str:
    """'' when draining ``node`` stays within the breaker's limits as Slurm shows them, else why not.

    Counts our drains whose reason is younger than ``window_s`` (or than ``since``, a breaker
    reset, when later) and our share of each of the node's partitions.
    """
    now = time.time() if now is None else now
    start = max(now - window_s, since or 0.0)
    recent = [n for n in view.drains_since(start) if n != node]
    if len(recent) >= max_drains:
        return (f"{len(recent)} automatic drains in the last {int(window_s)}s per Slurm's reasons "
                f"(max {max_drains}): {','.join(recent[:8])}")
    usage = view.partition_usage()
    for p in partitions:
        u = usage.get(p)
        if u is None:
            continue
        allowed = partition_allowance(u["total"], max_partition_percent)
        after = u["ours"] | {node}
        if len(after) > allowed:
            return (f"draining {node} would hold {len(after)} of {u['total']} nodes of partition {p} "
                    f"(max {max_partition_percent:g}% = {allowed})")
    return ""


def beyond_caps(view: SlurmView, node: str, max_drains: int, window_s: float, max_partition_percent: float,
                since: float | None = None, now: float | None = None) -> str:
    """After ``node`` drained itself: '' when it is within the caps, else why it is one too many.

    Epilogs that run at the same moment all pass ``limit_check`` before any of them drains:
    there is no shared database to claim a slot in. Slurm's reasons are the one record every
    node sees, so each node, once its own drain shows, ranks all our drains in the window by
    (reason time, node name): the same order on every node. The ones past a cap undo their own
    drain, and exactly the first ``max_drains`` stay.
    """
    now = time.time() if now is None else now
    start = max(now - window_s, since or 0.0)
    def order(n: str) -> tuple[float, str]:
        return (view.reason_times.get(n, now), n)
    recent = sorted(set(view.drains_since(start)) | {node}, key=order)
    if recent.index(node) >= max_drains:
        return (f"{recent.index(node) + 1}th automatic drain in the last {int(window_s)}s per Slurm's reasons "
                f"(max {max_drains}): {','.join(recent[:8])}")
    st = view.nodes.get(node)
    usage = view.partition_usage()
    for p in (st.partitions if st else ()):
        u = usage.get(p)
        if u is None:
            continue
        allowed = partition_allowance(u["total"], max_partition_percent)
        ranked = sorted(set(u["ours"]) | {node}, key=order)
        if ranked.index(node) >= allowed:
            return (f"{node} would be drain {ranked.index(node) + 1} of {u['total']} nodes of partition {p} "
                    f"(max {max_partition_percent:g}% = {allowed})")
    return ""
