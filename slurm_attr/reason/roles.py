"""Step three of a verdict: every other symptom's final role, by the policy's table.

Consequences of the chosen cause become cascade (NCCL errors and watchdog timeouts on
healthy nodes), support for it becomes confirmation (an analyser's finding on the culprit's
node or rank, the kernel's OOM line under Slurm's), the rest is context, and roots that fit
another cause are listed as alternatives.
"""
from __future__ import annotations

from typing import Mapping, Optional

from ..model import Symptom
from . import policy
from .rank import Choice
from .timeline import first_line


def node_of(s: Symptom, ranks: Mapping[int, str]) -> Optional[str]:
    return s.node or (ranks.get(s.rank) if s.rank is not None else None)


def _confirms(s: Symptom, choice: Choice, near: bool) -> bool:
    """An analyser's finding (FR, probe) near the culprit, or its hang beside a cause that
    explains hangs wherever they are."""
    p = policy.load()
    return s.id.startswith(p.special.analysers) and (
        near or (s.cause == p.special.hang and choice.cause in p.group("hang_explained")))


def _primary_support(s: Symptom, choice: Choice) -> None:
    """Among the primary roots: another source's word for the same kill confirms the deciding one."""
    conf = policy.load().cause(choice.cause).confirmed_by
    if conf and s.id.startswith(conf[1]) and any(p.id.startswith(conf[0]) for p in choice.primary):
        s.role = "confirmation"


def assign(syms: list[Symptom], choice: Choice, ranks: Mapping[int, str]) -> list[dict[str, str]]:
    """Final roles; returns the alternatives (roots that fit another cause)."""
    p = policy.load()
    row = p.cause(choice.cause)
    primary_ids = {id(s) for s in choice.primary}
    culprit_nodes = {node_of(s, ranks) for s in choice.primary} - {None}
    culprit_ranks = {s.rank for s in choice.primary if s.rank is not None}
    chosen_at = {first_line(s) for s in choice.primary if s.evidence} if row.earlier_is_alternative else set()
    health = frozenset().union(*(p.group(g) for g in row.health)) if row.health else frozenset()
    alternatives: dict[str, str] = {}
    for s in syms:
        if id(s) in primary_ids:
            _primary_support(s, choice)
            continue
        near = node_of(s, ranks) in culprit_nodes or (s.rank is not None and s.rank in culprit_ranks)
        if s.status.supports and s.role == "confirmation":
            continue  # set by a history rule: this symptom is what the escalation rests on
        if _confirms(s, choice, near):
            s.role = "confirmation"  # FR/probe pointing where the node evidence points
            continue
        if s.cause == choice.cause and s.role in ("root", "confirmation"):
            s.role = "confirmation"
            continue
        if s.role != "root":
            if s.role == "confirmation":
                s.role = "context"  # it confirms a cause the verdict is not
            continue
        path, line = first_line(s)
        earlier = s.cause in row.earlier_is_alternative and any(pp == path and line < ln for pp, ln in chosen_at)
        if s.cause in row.cascades and not earlier:
            s.role = "cascade"
        elif s.status.after_first_failure or s.cause in health:
            # it came after the failure that ended the job, or the job ended anyway: the node's
            # health (a drain), not a rival cause
            s.role = "context"
        else:
            s.role = "context"
            if s.cause not in (p.special.completed, p.special.no_evidence) and s.id not in p.weak_roots:
                alternatives.setdefault(s.cause, s.summary or s.id)
    return [{"cause": c, "why": w} for c, w in alternatives.items()]
