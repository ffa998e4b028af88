"""Step two of a verdict: which cause the roots name (rank), by the policy's table.

A clean exit stands; roots that only say who or how (weak roots) decide only when nothing
else does; among the rest the first failure in time wins across ranks (firstfailure), then
the cause the policy ranks highest (by the evidence's trust); a rank found stuck because it
failed on its own takes that failure's cause. Every decision is written to ``notes`` as a
sentence the verdict keeps (its ``reasoning``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

from ..model import Symptom
from . import firstfailure, policy
from .contradiction import is_weak_path_claim
from .timeline import Clock


@dataclass
class Choice:
    cause: str
    primary: list[Symptom]
    ambiguous: bool = False
    note: str = ""
    notes: list[str] = field(default_factory=list)  # the decisions, as the verdict's reasoning


def tier(s: Symptom) -> int:
    """How strongly a root of this cause explains a job's end (higher wins): the policy's rank
    (rules/policy.toml), by the evidence's trust."""
    return policy.load().rank(s.cause, s.trusted, unconfirmed_path=is_weak_path_claim(s))


def where(s: Symptom) -> str:
    """ "gpu.xid_74 on n7", "cuda.oom on rank 3": a symptom named for a sentence."""
    if s.node:
        return f"{s.id} on {s.node}" + (f" (rank {s.rank})" if s.rank is not None else "")
    return s.id + (f" on rank {s.rank}" if s.rank is not None else "")


def _clean_end(syms: list[Symptom], roots: list[Symptom]) -> bool:
    sp = policy.load().special
    return (any(s.id == sp.clean_exit for s in roots)
            and not any(s.id.startswith(sp.clean_exit_unless) and s.role != "context" for s in syms))


def _first_failure(strong: list[Symptom], syms: list[Symptom], job: Mapping[str, Any],
                   clock: Optional[Clock], notes: list[str]) -> list[Symptom]:
    """Among ranks, the first failure in time wins: what came after it is its aftermath."""
    first = firstfailure.order(strong, syms, job, clock)
    later = {id(s) for s in first.later}
    if first.first is not None:
        f = first.first
        who = f.id + (f" on rank {f.rank}" if f.rank is not None else f" on {f.node}" if f.node else "")
        for s in first.later:
            s.status.after_first_failure = who
        f.status.first_failure = first.how
        if first.later:
            notes.append(f"{where(f)} failed first (by {first.how}); "
                         + ", ".join(sorted({where(s) for s in first.later})[:4]) + " came after it")
    return [s for s in strong if id(s) not in later] or strong


def _own_failure(best: Symptom, pool: list[Symptom], ranks: Mapping[int, str], notes: list[str]) -> Symptom:
    """A rank found stuck because it failed on its own (exception, OOM) takes that failure's cause."""
    not_own = policy.load().cause(best.cause).yields_to_own_failure
    if not not_own:
        return best
    stuck = {s.rank for s in pool if s.cause == best.cause and s.rank is not None}
    stuck_nodes = {ranks.get(r) for r in stuck} - {None}
    own = [s for s in pool if s.cause not in not_own and (s.rank in stuck or (s.rank is None and s.node in stuck_nodes))]
    if not own:
        return best
    mine = max(own, key=lambda s: (tier(s), s.priority))
    notes.append(f"{where(mine)} over {where(best)}: the stuck rank failed on its own")
    return mine


def choose(syms: list[Symptom], ranks: Mapping[int, str], job: Mapping[str, Any],
           clock: Optional[Clock] = None, complete: bool = True) -> Choice:
    """The cause and its primary roots."""
    p = policy.load()
    sp = p.special
    notes: list[str] = []
    roots = [s for s in syms if s.role == "root"]
    clean = _clean_end(syms, roots)
    if clean:
        roots = [s for s in roots if s.id == sp.clean_exit]
        notes.append(f"{sp.clean_exit}: the job ended cleanly; what it printed and survived is context")
    strong = [s for s in roots if s.id not in p.weak_roots and s.cause != sp.completed]
    hang = [s for s in syms if s.role == "cascade" and s.cause == sp.hang]
    if not strong and hang and not clean:
        return Choice(sp.hang, hang, ambiguous=True, note=sp.hang_note,
                      notes=[f"{sp.hang}: {len(hang)} timeout(s) and no root that localises them"])
    if strong:
        strong = _first_failure(strong, syms, job, clock, notes)
    pool = strong or roots
    if not pool or (not complete and all(s.id in p.no_why for s in pool)):
        # A non-zero exit says that the job failed, not why: with evidence missing it is unknown
        # (issue 12 item 8). With the output read and every node's kernel log clean, nothing but
        # the program itself is left, and the weak root stands.
        why = "no root" if not pool else "only a non-zero exit, and evidence is missing"
        return Choice(sp.no_evidence, [], notes=notes + [f"{sp.no_evidence}: {why}"])
    best = max(pool, key=lambda s: (tier(s), s.priority, s.trusted))
    rivals = sorted({s.cause for s in pool if s.cause != best.cause}, key=lambda c: -p.cause(c).rank)
    over = f" over {', '.join(rivals[:3])}" if rivals else ""
    notes.append(f"{best.cause}: {where(best)}{over}, {'trusted' if best.trusted else 'untrusted'} evidence; "
                 f"{p.cause(best.cause).why}")
    best = _own_failure(best, pool, ranks, notes)
    primary = [s for s in pool if s.cause == best.cause and tier(s) == tier(best)]
    return Choice(best.cause, primary, notes=notes)
