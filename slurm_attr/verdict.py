"""From symptoms to one verdict: correlate across nodes and ranks, refine, decide.

Every analyser (rules, Flight Recorder, native probe) hands over Symptoms with a
catalog role. ``decide`` then works job-wide:

1. refine relations the catalog cannot see line by line: Xid 109 right after
   Xid 13 on one GPU is one program fault; an OOM kill of another job's task on
   a shared node is not ours; a program-side Xid recurring on one GPU across
   jobs (history) is a lemon GPU;
2. pick the cause: root symptoms are ranked by cause tier (trusted hardware
   first, then node loss, launch, trusted network, memory, filesystem, ...,
   job-state facts last), then by rule priority;
3. give every other symptom its final role: consequences of the chosen cause
   become cascade (NCCL errors and watchdog timeouts on healthy nodes), support
   for it becomes confirmation (an FR-blamed rank on the culprit node, a kernel
   OOM under a Slurm OOM), the rest is context, and roots that fit another
   cause are listed as alternatives.
"""
from __future__ import annotations

import copy
import dataclasses
import logging
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Protocol, Sequence

from .model import CAUSES, ROLES, Coverage, Symptom, Verdict
from .bundle import parse_ranks
from .reason import attempt, contradiction, firstfailure, netloc, notes, policy, timeline
from .reason.contradiction import is_weak_path_claim

log = logging.getLogger("slurm_attr")

_ROLE_ORDER = {"root": 0, "confirmation": 1, "cascade": 2, "context": 3}


class HistoryLookup(Protocol):
    """What the verdict store answers about other jobs (the store implements it)."""

    def gpu_symptom_jobs(self, node: str, gpu: str, symptom_id: str, since_epoch: float, exclude_job: str) -> set[str]:
        """Ids of other jobs that had ``symptom_id`` on ``node``/``gpu`` since ``since_epoch``."""
        ...


def tier(s: Symptom) -> int:
    """How strongly a root of this cause explains a job's end (higher wins): the policy's rank
    (rules/policy.toml), by the evidence's trust."""
    return policy.load().rank(s.cause, s.trusted, unconfirmed_path=is_weak_path_claim(s))


_ANALYSER_PREFIXES = ("fr.", "probe.")
_XID_CASCADE_WINDOW_S = 60.0


def _ranks(job: Mapping[str, Any]) -> dict[int, str]:
    return parse_ranks(job.get("ranks"))


def _seconds(s: Symptom) -> Optional[float]:
    up = s.fields.get("uptime")
    if isinstance(up, (int, float)):
        return float(up)
    if s.time:
        from datetime import datetime

        try:
            return datetime.fromisoformat(s.time.replace("Z", "+00:00")).timestamp()
        except ValueError:
            return None
    return None


def _first_line(s: Symptom) -> tuple[str, int]:
    ev = s.evidence[0] if s.evidence else None
    return (ev.path or "", ev.line or 0) if ev else ("", 0)


def _refine(syms: list[Symptom], job_id: str) -> None:
    """Relations between symptoms that no single line shows."""
    xid13 = [s for s in syms if s.id == "gpu.xid_13" and s.gpu]
    for s in syms:
        if s.id == "gpu.xid_109" and s.role == "root":
            for first in xid13:
                if first.node != s.node or first.gpu != s.gpu:
                    continue
                a, b = _seconds(first), _seconds(s)
                same_file_before = _first_line(first)[0] == _first_line(s)[0] and _first_line(first)[1] <= _first_line(s)[1]
                if (a is not None and b is not None and 0 <= b - a <= _XID_CASCADE_WINDOW_S) or (
                        (a is None or b is None) and same_file_before):
                    # A context-switch timeout seconds after a graphics exception on the same GPU is
                    # the same program fault, not a second (hardware) one.
                    s.role, s.action, s.status.caused_by = "cascade", "none", "gpu.xid_13"
        if s.cause == "host_oom" and s.fields.get("job") and str(s.fields["job"]) != job_id.split("_")[0]:
            s.role, s.status.other_job = "context", True  # a kill in another job's cgroup on a shared node


@dataclass
class _Choice:
    cause: str
    primary: list[Symptom]
    ambiguous: bool = False
    note: str = ""


def _choose(syms: list[Symptom], ranks: dict[int, str], job: Mapping[str, Any],
            clock: Optional[timeline.Clock] = None, complete: bool = True) -> _Choice:
    roots = [s for s in syms if s.role == "root"]
    completed = any(s.id == "job.completed" for s in roots)
    failure_words = any(s.id.startswith("slurm.") and s.role != "context" for s in syms)
    if completed and not failure_words:
        # A clean exit stands: the cause is what ended the job, and nothing did. A fault on a node
        # (trusted hardware) is the node's health, a separate answer (drain) that the verdict keeps
        # as context; errors a program printed and survived are context too. (Slurm has recorded
        # COMPLETED 0:0 for failed steps, hence the exception for Slurm's own failure lines.)
        roots = [s for s in roots if s.id == "job.completed"]
    strong = [s for s in roots if s.id not in policy.load().weak_roots and s.cause != "none"]
    hang = [s for s in syms if s.role == "cascade" and s.cause == "comm_hang"]
    if not strong and hang and not (completed and not failure_words):
        return _Choice("comm_hang", hang, ambiguous=True,
                       note="collectives timed out and no node, rank or Flight Recorder evidence explains why")
    if strong:
        # First failure wins among ranks where the lines carry times (or srun's exit order does).
        first = firstfailure.order(strong, syms, job, clock)
        later = {id(s) for s in first.later}
        if first.first is not None:
            f = first.first
            who = f.id + (f" on rank {f.rank}" if f.rank is not None else f" on {f.node}" if f.node else "")
            for s in first.later:
                s.status.after_first_failure = who
            f.status.first_failure = first.how
        strong = [s for s in strong if id(s) not in later] or strong
    pool = strong or roots
    if not pool or (not complete and all(s.id in policy.load().no_why for s in pool)):
        # A non-zero exit says that the job failed, not why: with evidence missing it is unknown
        # (issue 12 item 8). With the output read and every node's kernel log clean, nothing but
        # the program itself is left, and the weak root stands.
        return _Choice("unknown", [])
    best = max(pool, key=lambda s: (tier(s), s.priority, s.trusted))
    not_own = policy.load().causes[best.cause].yields_to_own_failure if best.cause in policy.load().causes else ()
    if not_own:
        # A rank found stuck because it failed on its own (exception, OOM) takes that failure's cause.
        stuck = {s.rank for s in pool if s.cause == best.cause and s.rank is not None}
        stuck_nodes = {ranks.get(r) for r in stuck} - {None}
        own = [s for s in pool if s.cause not in not_own
               and (s.rank in stuck or (s.rank is None and s.node in stuck_nodes))]
        if own:
            best = max(own, key=lambda s: (tier(s), s.priority))
    primary = [s for s in pool if s.cause == best.cause and tier(s) == tier(best)]
    return _Choice(best.cause, primary)


def _node_of(s: Symptom, ranks: dict[int, str]) -> Optional[str]:
    return s.node or (ranks.get(s.rank) if s.rank is not None else None)


def _assign_roles(syms: list[Symptom], choice: _Choice, ranks: dict[int, str]) -> list[dict[str, str]]:
    """Final roles; returns the alternatives (roots that fit another cause)."""
    primary_ids = {id(s) for s in choice.primary}
    culprit_nodes = {_node_of(s, ranks) for s in choice.primary} - {None}
    culprit_ranks = {s.rank for s in choice.primary if s.rank is not None}
    slurm_oom = choice.cause == "host_oom" and any(s.id.startswith(("slurm.", "job.")) for s in choice.primary)
    cancel_at = {_first_line(s) for s in choice.primary if s.cause == "cancelled" and s.evidence}
    consequences = policy.load().cascades(choice.cause)
    hardware = policy.load().group("hardware")
    alternatives: dict[str, str] = {}
    for s in syms:
        if id(s) in primary_ids:
            if slurm_oom and s.id.startswith("host."):
                s.role = "confirmation"  # the kernel's OOM line confirms Slurm's
            continue
        near = _node_of(s, ranks) in culprit_nodes or (s.rank is not None and s.rank in culprit_ranks)
        if s.status.supports and s.role == "confirmation":
            continue  # set by a history rule: this symptom is what the escalation rests on
        if s.id.startswith(_ANALYSER_PREFIXES) and (near or (s.cause == "comm_hang" and choice.cause in hardware | {"network"})):
            s.role = "confirmation"  # FR/probe pointing where the node evidence points
            continue
        if s.cause == choice.cause and s.role in ("root", "confirmation"):
            s.role = "confirmation"
            continue
        if s.role != "root":
            if s.role == "confirmation":
                s.role = "context"  # it confirms a cause the verdict is not
            continue
        earlier = any(p == _first_line(s)[0] and _first_line(s)[1] < ln for p, ln in cancel_at)
        if s.cause in consequences and not (choice.cause == "cancelled" and s.cause == "user_error" and earlier):
            s.role = "cascade"
        elif s.status.after_first_failure or (choice.cause == "none" and s.cause in hardware):
            # it came after the failure that ended the job, or the job completed anyway: the node's
            # health (a drain), not a rival cause
            s.role = "context"
        else:
            s.role = "context"
            if s.cause not in ("none", "unknown") and s.id not in policy.load().weak_roots:
                alternatives.setdefault(s.cause, s.summary or s.id)
    return [{"cause": c, "why": w} for c, w in alternatives.items()]


def _evidence_complete(coverage: Sequence[Coverage], nodes: Sequence[str]) -> bool:
    """The job's output was read (even if empty: `exit 3` prints nothing) and every node sent its
    part with a kernel log: nothing is missing, so a bare non-zero exit is the program's."""
    got = {(c.source, c.node) for c in coverage if c.status == "ok"}
    gaps = {(c.source, c.node) for c in coverage if c.status != "ok" and c.source in ("stdout", "node", "kernel")}
    return ("stdout", None) in got and not gaps and all(("kernel", n) in got for n in nodes)


def _job_nodes(job: Mapping[str, Any], ranks: dict[int, str]) -> list[str]:
    nodes = job.get("nodes")
    if isinstance(nodes, list) and nodes:
        return [str(n) for n in nodes]
    return sorted(set(ranks.values()))


def _summary(choice: _Choice, syms: list[Symptom], ranks: dict[int, str], coverage: Sequence[Coverage]) -> str:
    if choice.cause == "unknown":
        gaps = sorted({f"{c.source}{'@' + c.node if c.node else ''}" for c in coverage if c.status != "ok"})
        return "no evidence of why the job ended" + (f"; missing or unreadable: {', '.join(gaps[:8])}" if gaps else "")
    if choice.cause == "comm_hang":
        r = sorted({s.rank for s in choice.primary if s.rank is not None})
        return f"{choice.note}" + (f" (timeouts on ranks {_span(r)})" if r else "")
    # the most specific root speaks: one that names a node and a rank says more than a job state
    best = max(choice.primary, key=lambda s: (_node_of(s, ranks) is not None, s.rank is not None, s.priority, s.trusted))
    where = _node_of(best, ranks)
    text = best.summary or best.id
    if where and where not in text:
        text += f" on {where}"
    cascades = [s for s in syms if s.role == "cascade"]
    elsewhere = {_node_of(s, ranks) for s in cascades} - {where, None}
    if elsewhere:
        text += f"; the errors on {len(elsewhere)} other node{'s' if len(elsewhere) > 1 else ''} are its cascade"
    elif cascades:
        text += f"; {len(cascades)} later error{'s are' if len(cascades) > 1 else ' is'} its cascade"
    return text


def _fold(syms: list[Symptom]) -> list[Symptom]:
    """One cascade/context symptom per (rule, node) with the ranks listed: 512 identical
    watchdog timeouts are one finding, not 512."""
    out: list[Symptom] = []
    groups: dict[tuple[Any, ...], Symptom] = {}
    for s in syms:
        if s.role not in ("cascade", "context"):
            out.append(s)
            continue
        key = (s.id, s.node, s.role, s.cause, s.gpu)
        first = groups.get(key)
        if first is None:
            groups[key] = s
            out.append(s)
            if s.rank is not None:
                s.fields.setdefault("ranks", [s.rank])
            continue
        if s.rank is not None:
            first.fields.setdefault("ranks", [])
            if s.rank not in first.fields["ranks"]:
                first.fields["ranks"].append(s.rank)
        if first.rank != s.rank:
            first.rank = None
        first.fields["occurrences"] = first.fields.get("occurrences", 1) + s.fields.get("occurrences", 1)
        first.evidence.extend(s.evidence[: max(0, 5 - len(first.evidence))])
    for s in out:
        if isinstance(s.fields.get("ranks"), list):
            s.fields["ranks"] = sorted(s.fields["ranks"])
            if len(s.fields["ranks"]) == 1:
                del s.fields["ranks"]
    return out


def _span(values: Sequence[int]) -> str:
    return ", ".join(str(v) for v in values[:8]) + (f" and {len(values) - 8} more" if len(values) > 8 else "")


_FLAT = frozenset({str, int, float, bool, type(None)})


def _own_copy(s: Symptom) -> Symptom:
    """copy.deepcopy(s), ~5x faster (a large bundle's 2,000 symptoms took 0.1-0.2 s): evidence
    is frozen (shared, not copied); fields are copied deeply only when a value is not a scalar
    (a list of ranks, say)."""
    c = copy.copy(s)
    flat = all(type(v) in _FLAT for v in s.fields.values())
    c.fields = dict(s.fields) if flat else copy.deepcopy(s.fields)
    c.evidence = list(s.evidence)
    c.status = dataclasses.replace(s.status, confirmed_by=list(s.status.confirmed_by))
    return c


def decide(job: Mapping[str, Any], symptoms: Sequence[Symptom], coverage: Sequence[Coverage],
           history: Optional[HistoryLookup] = None) -> Verdict:
    """The verdict for one job from all analysers' symptoms (DESIGN §4)."""
    job_id = str(job.get("job_id", "unknown"))
    ranks = _ranks(job)
    syms = [_own_copy(s) for s in symptoms]  # callers keep their own symptoms untouched
    for s in syms:
        if s.cause not in CAUSES:
            s.cause = "unknown"
        if s.role not in ROLES:
            s.role = "context"
        if not s.trusted:
            s.action = "none"  # untrusted evidence may point, never drain (DESIGN §5)
        if s.node is None and s.rank is not None:
            s.node = ranks.get(s.rank)
    if history is not None:
        syms.extend(_history(syms, job, history))
    _refine(syms, job_id)
    nodes = _job_nodes(job, ranks)
    clock = timeline.clock_of(job)  # one clock for every step: it remembers each symptom's time
    attempt.mark_earlier(syms, job, clock)  # this attempt's evidence decides; older lines are context
    attempt.mark_after_end(syms, job, clock)  # nor can what came after the end have ended the job
    book = netloc.AddressBook(job, nodes)
    book.add_hosts(netloc.hosts_from_symptoms(syms))  # what NCCL INFO lines said, below Slurm's record
    netloc.resolve_peers(syms, book)
    netloc.assign_ranks(syms)  # NCCL's own files name host and device; its init lines map them to ranks
    contradiction.check(syms, coverage, job, nodes, clock)
    for s in syms:
        if contradiction.is_contradicted(s) and s.role in ("root", "confirmation"):
            s.role = "context"  # an untrusted claim the trusted log contradicts cannot be the root
        if s.status.claim_note and s.status.claim != "confirmed" and "not confirmed" not in s.summary:
            s.summary = f"{s.summary or s.id} ({s.status.claim_note})"
    vote = netloc.vote(syms)
    choice = _choose(syms, ranks, job, clock, complete=_evidence_complete(coverage, nodes))
    vote_sym, choice.primary = netloc.place_vote(choice.cause, choice.primary, vote, syms)
    # what indirect evidence hints at, before roles are final (for an unknown verdict)
    hints = {s.cause: s.summary or s.id for s in syms
             if s.role in ("confirmation", "cascade") and s.cause not in ("unknown", "none")}
    alternatives = _assign_roles(syms, choice, ranks)
    if choice.cause == "comm_hang":
        alternatives.append({"cause": "rank_stuck", "why": "without Flight Recorder dumps a stuck rank looks the same"})
    if choice.cause == "unknown":
        alternatives += [{"cause": c, "why": f"only indirect evidence: {w}"} for c, w in hints.items()]
    if choice.cause in policy.load().group("hardware") and any(s.id == "job.completed" for s in syms):
        alternatives.append({"cause": "none", "why": "the job itself completed with exit code 0"})
    verdict = Verdict(job_id=job_id, cause=choice.cause)
    # Scheduler ends and an unlocalised hang have no culprit: the nodes in those lines only report.
    unlocalised = choice.cause in policy.load().group("unlocalised")
    verdict.culprit_nodes = sorted({n for s in choice.primary for n in [_node_of(s, ranks)] if n} if not unlocalised else [])
    primary_ids = {id(s) for s in choice.primary}
    located = choice.cause in policy.load().group("located")
    verdict.culprit_ranks = [] if unlocalised else sorted({s.rank for s in syms if s.rank is not None and (id(s) in primary_ids or (
        s.role == "confirmation" and s.id.startswith(_ANALYSER_PREFIXES)) or (
        # ranks on the culprit node that saw the failure first-hand
        located and s.role in ("cascade", "confirmation") and s.cause != "comm_hang" and s.node in verdict.culprit_nodes))})
    verdict.culprit_gpus = sorted({s.gpu for s in choice.primary if s.gpu})
    if choice.cause == "time_limit":
        # A straggler: every other rank waited for this one when time ran out (issue 12 item 9).
        lagging = {s.rank for s in syms if s.id == "fr.rank_stuck" and s.rank is not None and s.role != "context"}
        if len(lagging) == 1:
            verdict.culprit_ranks = sorted(lagging)
            verdict.culprit_nodes = sorted({n for n in (ranks.get(r) for r in lagging) if n})
    if vote_sym is not None and choice.cause == "network" and any(p is vote_sym for p in choice.primary) and not vote_sym.node:
        # one edge: both ends, ambiguous; an address no record maps: no node named
        verdict.culprit_nodes = sorted(vote_sym.fields.get("nodes") or [])
        choice.ambiguous = choice.ambiguous or len(vote.winners) > 1
    if choice.cause == "node_failure" and not verdict.culprit_nodes:
        lost = sorted({c.node for c in coverage if c.node and c.status == "missing" and c.source in ("node", "kernel")})
        verdict.culprit_nodes = lost if len(lost) == 1 else []
    verdict.ambiguous = choice.ambiguous or any(a["cause"] != "none" for a in alternatives if choice.cause not in ("unknown",))
    verdict.alternatives = alternatives
    verdict.summary = _summary(choice, syms, ranks, coverage) + notes.beside_cause(
        choice.cause, choice.primary, syms, lambda s: _node_of(s, ranks))
    verdict.symptoms = sorted(_fold(syms), key=lambda s: (_ROLE_ORDER.get(s.role, 9), -s.priority, s.id))
    verdict.coverage = list(coverage)
    return verdict


def _history(syms: list[Symptom], job: Mapping[str, Any], history: HistoryLookup) -> list[Symptom]:
    from .rules import load_catalog  # the catalog's history rules (e.g. the lemon-GPU rule)

    new: list[Symptom] = []
    for rule in load_catalog().history_rules:
        if rule.status == "deprecated":
            continue
        try:
            found = rule.run(syms, job, history)
        except Exception as err:  # noqa: BLE001 - a store problem costs the recurrence check, not the verdict
            log.warning("history rule %s failed for job %s: %s", rule.id, job.get("job_id"), err)
            continue
        for s in found:
            for old in syms:
                if old.node == s.node and old.gpu == s.gpu and old.id.startswith("gpu.xid_") and old.cause != s.cause:
                    old.role, old.status.supports = "confirmation", s.id  # the escalated Xid now supports it
        new.extend(found)
    return new
