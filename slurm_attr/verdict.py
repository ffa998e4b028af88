"""From symptoms to one verdict: refine, rank, assign roles, with the decisions recorded.

Every analyser (rules, Flight Recorder, native probe) hands over Symptoms with a catalog
role; the catalog's job-wide rules (rules/jobwide.py) have already run. ``decide`` then:

1. refines across the job (reason/): which attempt and time window each line belongs to,
   which node each network error's peer is, whether the kernel log confirms or contradicts
   each untrusted claim (a confirmed claim takes the kernel's node);
2. ranks the roots by the cause policy (rules/policy.toml, reason/rank.py): first failure in
   time among ranks, then the cause the policy ranks highest by the evidence's trust;
3. assigns every other symptom its role (reason/roles.py): cascade, confirmation, context,
   alternatives; and says the outcome (reason/outcome.py): culprits, summary, folded symptoms.

Its decisions are kept in the verdict's ``reasoning``. No cause or rule is named here: the
policy table and the reasoning steps own them.
"""
from __future__ import annotations

import copy
import dataclasses
import logging
from typing import Any, Mapping, Sequence

from .bundle import parse_ranks
from .model import CAUSES, NO_ACTION, ROLES, UNKNOWN_JOB, Coverage, Symptom, Verdict
from .reason import contradiction, jobattempt, netloc, outcome, policy, rank, roles, timeline

log = logging.getLogger("slurm_attr")

_ROLE_ORDER = {"root": 0, "confirmation": 1, "cascade": 2, "context": 3}


tier = rank.tier  # how strongly a root explains a job's end (the policy's rank by trust)


def _ranks(job: Mapping[str, Any]) -> dict[int, str]:
    return parse_ranks(job.get("ranks"))


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


def decide(job: Mapping[str, Any], symptoms: Sequence[Symptom], coverage: Sequence[Coverage]) -> Verdict:
    """The verdict for one job from all analysers' symptoms (DESIGN §4), after the catalog's
    job-wide rules (rules/jobwide.py: history, refiners), which its callers run."""
    job_id = str(job.get("job_id", UNKNOWN_JOB))
    ranks = _ranks(job)
    syms = [_own_copy(s) for s in symptoms]  # callers keep their own symptoms untouched
    for s in syms:
        if s.cause not in CAUSES:
            s.cause = policy.load().special.no_evidence
        if s.role not in ROLES:
            s.role = "context"
        if not s.trusted:
            s.action = NO_ACTION  # untrusted evidence may point, never drain (DESIGN §5)
        if s.node is None and s.rank is not None:
            s.node = ranks.get(s.rank)
    nodes = _job_nodes(job, ranks)
    clock = timeline.clock_of(job)  # one clock for every step: it remembers each symptom's time
    jobattempt.mark_earlier(syms, job, clock)  # this attempt's evidence decides; older lines are context
    jobattempt.mark_survived(syms, clock)  # so does the error after the workers' last restart
    jobattempt.mark_after_end(syms, job, clock)  # nor can what came after the end have ended the job
    book = netloc.AddressBook(job, nodes)
    book.add_hosts(netloc.hosts_from_symptoms(syms))  # what NCCL INFO lines said, below Slurm's record
    netloc.resolve_peers(syms, book)
    netloc.assign_ranks(syms)  # NCCL's own files name host and device; its init lines map them to ranks
    contradiction.check(syms, coverage, job, nodes, clock)
    claim_notes = [f"{rank.where(s)}: {s.status.claim} ({s.status.claim_note})" for s in syms
                   if s.status.claim == "confirmed" and s.status.confirmed_by][:5]
    for s in syms:
        if contradiction.is_contradicted(s) and s.role in ("root", "confirmation"):
            s.role = "context"  # an untrusted claim the trusted log contradicts cannot be the root
        if s.status.claim_note and s.status.claim != "confirmed" and "not confirmed" not in s.summary:
            s.summary = f"{s.summary or s.id} ({s.status.claim_note})"
    vote = netloc.vote(syms)
    died = netloc.explain_by_a_death(syms, vote, ranks, policy.load().group("rank_level"))
    if died is not None:
        claim_notes.append(f"{rank.where(died)}: the process that died; the failing connections all end at "
                           f"{vote.winners[0]}, which no record maps, on no other node's side")
    choice = rank.choose(syms, ranks, job, clock, complete=_evidence_complete(coverage, nodes))
    vote_sym, choice.primary = netloc.place_vote(choice.cause, choice.primary, vote, syms)
    sp = policy.load().special
    # what indirect evidence hints at, before roles are final (for a verdict without evidence)
    hints = {s.cause: s.summary or s.id for s in syms
             if s.role in ("confirmation", "cascade") and s.cause not in (sp.no_evidence, sp.completed)}
    alternatives = outcome.alternatives(choice, syms, roles.assign(syms, choice, ranks), hints)
    verdict = Verdict(job_id=job_id, cause=choice.cause)
    outcome.culprits(verdict, choice, syms, ranks, coverage, vote_sym, vote)
    verdict.ambiguous = choice.ambiguous or (choice.cause != sp.no_evidence
                                             and any(a["cause"] != sp.completed for a in alternatives))
    verdict.alternatives = alternatives
    verdict.summary = outcome.summary(choice, syms, ranks, coverage)
    verdict.symptoms = sorted(outcome.fold(syms), key=lambda s: (_ROLE_ORDER.get(s.role, 9), -s.priority, s.id))
    verdict.coverage = list(coverage)
    verdict.reasoning = claim_notes + choice.notes
    return verdict
