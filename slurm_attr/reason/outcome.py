"""What a verdict says once its cause and roles are decided: culprits, alternatives, the
summary a person reads first, and the symptoms folded (512 identical timeouts are one).

Which causes name no culprit (job-wide ends), which name the node the evidence sits on, the
straggler of a time limit and the lost node of a node failure are the policy's
(rules/policy.toml), not this module's.
"""
from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

from ..model import Coverage, Symptom, Verdict
from . import netloc, notes, policy
from .rank import Choice
from .roles import node_of


def culprits(verdict: Verdict, choice: Choice, syms: list[Symptom], ranks: Mapping[int, str],
             coverage: Sequence[Coverage], vote_sym: Optional[Symptom], vote: netloc.Vote) -> None:
    """Set the verdict's culprit nodes, ranks and GPUs."""
    p = policy.load()
    row = p.cause(choice.cause)
    if choice.cause in p.group("unlocalised"):
        # scheduler ends and an unlocalised hang have no culprit: the nodes in those lines only report
        verdict.culprit_nodes, verdict.culprit_ranks = [], []
    else:
        verdict.culprit_nodes = sorted({n for s in choice.primary for n in [node_of(s, ranks)] if n})
        verdict.culprit_ranks = _first_hand_ranks(choice, syms, verdict.culprit_nodes)
    verdict.culprit_gpus = sorted({s.gpu for s in choice.primary if s.gpu})
    if row.localised_by:
        # the analysers that compare every rank's record name the culprit; the ranks whose own
        # error reported it only detected it
        found = sorted({s.rank for s in syms if s.rank is not None and s.role in ("root", "confirmation")
                        and s.id.startswith(row.localised_by) and not s.status.earlier})
        if found:
            verdict.culprit_ranks = found
            verdict.culprit_nodes = sorted({n for n in (ranks.get(r) for r in found) if n})
    if row.straggler:
        # the one rank every other waited for when it ended (issue 12 item 9)
        lagging = {s.rank for s in syms if s.id == row.straggler and s.rank is not None and s.role != "context"}
        if len(lagging) == 1:
            verdict.culprit_ranks = sorted(lagging)
            verdict.culprit_nodes = sorted({n for n in (ranks.get(r) for r in lagging) if n})
    if vote_sym is not None and any(pp is vote_sym for pp in choice.primary) and not vote_sym.node:
        # one edge: both ends, ambiguous; an address no record maps: no node named
        verdict.culprit_nodes = sorted(vote_sym.fields.get("nodes") or [])
        choice.ambiguous = choice.ambiguous or len(vote.winners) > 1
    if not verdict.culprit_nodes and choice.cause in p.group("placed_by_peers"):
        _place_by_peers(verdict, choice, syms, ranks, vote)
    if row.lost_node_sources and not verdict.culprit_nodes:
        lost = sorted({c.node for c in coverage if c.node and c.status == "missing" and c.source in row.lost_node_sources})
        verdict.culprit_nodes = lost if len(lost) == 1 else []


def _first_hand_ranks(choice: Choice, syms: list[Symptom], nodes: list[str]) -> list[int]:
    """The ranks that saw the failure first-hand, from the strongest word down: the roots' own,
    those whose own error confirms a root (the rank on the failed GPU, the rank whose DataLoader
    worker was killed) and the analysers' (Flight Recorder, probe); without any, the task Slurm
    or the launcher says exited on a culprit node (every rank of a failed job may say so, so
    only then); and, for a cause located by its node, every rank on it that failed with it (a
    machine check takes all of them)."""
    p = policy.load()
    primary_ids = {id(s) for s in choice.primary}
    confirming = [s for s in syms if s.rank is not None and s.role == "confirmation"
                  and (s.id.startswith(p.special.analysers) or not nodes or s.node in nodes)]
    ranks = {s.rank for s in syms if s.rank is not None and id(s) in primary_ids}
    ranks |= {s.rank for s in confirming if s.id not in p.weak_roots}
    if not ranks:
        ranks = {s.rank for s in confirming}
    if not ranks and choice.cause in p.group("located"):
        ranks = {s.rank for s in syms if s.rank is not None and s.role == "cascade"
                 and s.cause != p.special.hang and s.node in nodes}
    return sorted(r for r in ranks if r is not None)


def _place_by_peers(verdict: Verdict, choice: Choice, syms: list[Symptom], ranks: Mapping[int, str],
                    vote: netloc.Vote) -> None:
    """A root with no node (output without a launcher label) is placed where its process died:
    on the one node whose tasks Slurm says exited on their own (the policy's weak roots: "task
    N: Exited with exit code 1" while the others were killed), else on the one node every
    failing connection shares (its peers report the connection it closed)."""
    p = policy.load()
    exited = {s.node for s in syms if s.id in p.weak_roots and s.node and s.role != "context"}
    if len(exited) == 1:
        node = exited.pop()
        why = f"Slurm says only the tasks on {node} exited on their own"
    elif vote.decisive and not vote.winners[0].startswith(netloc.ADDRESS):
        node = vote.winners[0]
        why = f"{node} is on every failing connection ({vote.describe()})"
    else:
        return
    verdict.culprit_nodes = [node]
    there = sorted(r for r, n in ranks.items() if n == node)
    if not verdict.culprit_ranks and len(there) == 1:
        verdict.culprit_ranks = there
    choice.notes.append(f"the root names no node; {why}: the process that failed ran there")


def alternatives(choice: Choice, syms: list[Symptom], rivals: list[dict[str, str]],
                 hints: Mapping[str, str]) -> list[dict[str, str]]:
    """The roots of other causes, what the policy always says beside this cause, and, for a
    verdict without evidence, what indirect evidence hinted at."""
    p = policy.load()
    sp = p.special
    out = list(rivals) + [dict(a) for a in p.cause(choice.cause).alternatives]
    if choice.cause == sp.no_evidence:
        out += [{"cause": c, "why": f"only indirect evidence: {w}"} for c, w in hints.items()]
    said = {(a["cause"], a["why"]) for a in out}
    for s in syms:  # a suspicion never decides, and is always said (silent data corruption)
        if s.id in sp.suspicions and s.cause != choice.cause and (s.cause, s.summary or s.id) not in said:
            said.add((s.cause, s.summary or s.id))
            out.append({"cause": s.cause, "why": s.summary or s.id})
    if choice.cause in p.group("hardware") and any(s.id == sp.clean_exit for s in syms):
        out.append({"cause": sp.completed, "why": sp.clean_exit_alternative})
    return out


def summary(choice: Choice, syms: list[Symptom], ranks: Mapping[int, str], coverage: Sequence[Coverage]) -> str:
    sp = policy.load().special
    if choice.cause == sp.no_evidence:
        gaps = sorted({f"{c.source}{'@' + c.node if c.node else ''}" for c in coverage if c.status != "ok"})
        text = "no evidence of why the job ended" + (f"; missing or unreadable: {', '.join(gaps[:8])}" if gaps else "")
    elif choice.note:
        r = sorted({s.rank for s in choice.primary if s.rank is not None})
        text = f"{choice.note}" + (f" (timeouts on ranks {_span(r)})" if r else "")
    else:
        text = _from_the_root(choice, syms, ranks)
    return text + notes.beside_cause(choice.cause, choice.primary, syms, lambda s: node_of(s, ranks))


def _from_the_root(choice: Choice, syms: list[Symptom], ranks: Mapping[int, str]) -> str:
    # the most specific root speaks: one that names a node and a rank says more than a job state
    best = max(choice.primary, key=lambda s: (node_of(s, ranks) is not None, s.rank is not None, s.priority, s.trusted))
    where = node_of(best, ranks)
    text = best.summary or best.id
    if where and where not in text:
        text += f" on {where}"
    cascades = [s for s in syms if s.role == "cascade"]
    elsewhere = {node_of(s, ranks) for s in cascades} - {where, None}
    if elsewhere:
        text += f"; the errors on {len(elsewhere)} other node{'s' if len(elsewhere) > 1 else ''} are its cascade"
    elif cascades:
        text += f"; {len(cascades)} later error{'s are' if len(cascades) > 1 else ' is'} its cascade"
    return text


def fold(syms: list[Symptom]) -> list[Symptom]:
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
