"""Who broke the collective: matching ranks per group, majority vote, root vs cascade.

Per process group the members vote on the signature at each sequence number
(vote.py); one whose dump window does not hold it abstains and is never its culprit.

A member whose last enqueued collective is below the others', while the others
wait in the next one, never reached it. Such a rank is the root (``rank_stuck``)
unless it is itself waiting in some other group's broken collective: then it
is a downstream consequence. Where a rank is missing from several groups, the
one it fails first in program order (the waiting ranks' own record order, time
only as a tie-breaker) is reported (research §7.5). A member that left no dump,
while every dumped member waits in the same collective, is the one they wait
for. Ranks that wait on each other across groups (collectives issued in a
different order) are split by where they wait: the ranks outside the largest
set are the ones whose order differs.
"""
from __future__ import annotations

import functools
from collections import Counter

from .attribute import attribute
from .divergences import Analysis, Finding, program_order
from .groups import Group, build_groups, order_key, world_ranks
from .loader import DumpSet
from .types import NO_SIG
from .vote import vote

MISMATCH_KINDS = ("skip", "op", "size", "dtype", "order")


def _vote(ds: DumpSet, g: Group, an: Analysis) -> list[Finding]:
    """The group's majority vote (vote.py): a Finding for each rank at its first divergence."""
    v = vote(ds, an.groups, g)
    if v.window is not None:
        an.windows[g.name] = v.window
    return [Finding(kind=d.kind, pg=g.name, seq=d.seq, rank=r, sig=d.sig, majority_sig=d.majority_sig,
                    majority_ranks=d.majority_ranks, waiting=d.majority_ranks, ambiguous=d.ambiguous,
                    at_window_start=d.at_window_start,
                    confidence="low" if d.ambiguous else "medium" if d.tie_break == "frequency" else "high",
                    tied_with=d.majority_ranks if d.ambiguous else (), tie_break=d.tie_break,
                    first_compared=d.first_compared, abstained=d.abstained)
            for d in v.divergences for r in d.ranks]


def _waits(ds: DumpSet, g: Group, a: int, seq: int) -> int | None:
    """a's signature at ``seq`` if a shows it waits there (pending, or its last op), else None."""
    tr = ds.traces.get(a)
    st = tr.streams.get(g.name) if tr else None
    if st is None:
        return None
    i = st.index(seq)
    if i is None:
        return None
    if st.completed[i]:
        return None  # it finished there: a dump taken a moment apart, not a hang
    status = g.status.get(a)
    if st.pending[i] or tr.newest == (g.name, seq) or (status is not None and 0 <= status.last_completed < seq):
        # pending, or (Gloo marks failed ops retired) the last thing this rank ever did
        return st.sigs[i]
    return None


def _first_wait(ds: DumpSet, g: Group) -> int | None:
    """Lowest seq at which any member waits (for a rank that shows no progress at all)."""
    best = None
    for r in g.members:
        tr = ds.traces.get(r)
        st = tr.streams.get(g.name) if tr else None
        if st is None:
            continue
        for i, p in enumerate(st.pending):
            if p and st.sigs[i] != NO_SIG:
                seq = st.lo + i
                best = seq if best is None else min(best, seq)
                break
    return best


def _waiters(ds: DumpSet, g: Group, seq: int) -> tuple[list[int], Counter[int]]:
    waiting, sigs = [], Counter()
    for a in g.members:
        if g.reach.get(a, -1) >= seq:
            s = _waits(ds, g, a, seq)
            if s is not None:
                waiting.append(a)
                sigs[s] += 1
    return waiting, sigs


def _behind(ds: DumpSet, g: Group) -> list[Finding]:
    """Members that never reached a collective the others wait in."""
    if not g.reach:
        return []
    top = max(g.reach.values())
    out = []
    for r in g.members:
        rr = g.reach.get(r)
        if rr is None or rr >= top:
            continue
        seq, confidence = rr + 1, "high"
        waiting, sigs = _waiters(ds, g, seq)
        if not waiting and (rr < 0 or ds.traces[r].n_entries == 0):
            # It shows no progress on this group at all: the others' first pending op is
            # what it did not reach (seq ids need not start at 1 in a wrapped buffer).
            first = _first_wait(ds, g)
            if first is not None and first > rr:
                seq, confidence = first, "medium"
                waiting, sigs = _waiters(ds, g, seq)
        if not waiting:
            continue  # nobody is stuck waiting for r: it is just slower (a healthy dump)
        ahead = tuple(a for a in g.members if g.reach.get(a, -1) >= seq)
        out.append(Finding(kind="not_reached", pg=g.name, seq=seq, rank=r, majority_sig=sigs.most_common(1)[0][0],
                           majority_ranks=ahead, waiting=tuple(waiting), confidence=confidence))
    return out


def _no_dump(ds: DumpSet, g: Group, absent: tuple[int, ...]) -> list[Finding]:
    """Members without a dump, when every dumped member waits in the same collective.

    If all ranks that did dump entered collective #N of the group and none
    completed it, the member that left no dump is the one they wait for: it
    crashed, was killed, or is stuck outside the collective. Only a minority of
    missing members is named (when half or more are missing, FR cannot say who;
    a two-member group is the exception: one waits, the other left nothing).
    A group whose dumped members completed their last collective names nobody.
    """
    missing = [r for r in g.members if r not in ds.traces]
    known = [r for r in g.members if r in g.reach]
    inferred = False
    if not missing and g.members_from == "entries" and absent:
        # Members known only from entries (stock Gloo's broken pg_config): a member that left
        # no dump is invisible here, but a group whose every member waits is waiting for
        # someone. The job's ranks without a usable dump are then the candidates.
        missing = list(absent)
        inferred = True
    if not missing or not known or (len(missing) >= len(known) and len(g.members) > 2):
        return []  # half or more of a group without dumps (a node's collection failed): nobody to name
    top = max(g.reach[r] for r in known)
    if top < 0 or any(g.reach[r] != top for r in known):
        return []
    strict = all(_strictly_pending(ds, g, r, top) for r in known)
    # Gloo retires a failed op like a finished one: "it is the last thing this rank did" is
    # all a dump can say then. Such a weak finding names the rank only if some other rank
    # is blocked behind it (attribute.py); a job that simply ended names nobody.
    if not strict and not all(_waits(ds, g, r, top) is not None for r in known):
        return []
    sigs = {ds.traces[r].streams[g.name].sig(top) for r in known if g.name in ds.traces[r].streams}
    if len(sigs) != 1 or NO_SIG in sigs:
        return []
    sig = next(iter(sigs))
    return [Finding(kind="not_reached", pg=g.name, seq=top, rank=r, majority_sig=sig, majority_ranks=tuple(known),
                    waiting=tuple(known), no_dump=True, confidence="low" if inferred or not strict else "medium",
                    membership_inferred=inferred, weak=not strict) for r in missing]


def _strictly_pending(ds: DumpSet, g: Group, r: int, seq: int) -> bool:
    tr = ds.traces.get(r)
    st = tr.streams.get(g.name) if tr else None
    i = st.index(seq) if st else None
    if i is None:
        return False
    status = g.status.get(r)
    return bool(st.pending[i]) or (status is not None and 0 <= status.last_completed < seq)


def _hang(ds: DumpSet, g: Group) -> list[Finding]:
    """Everyone with a dump entered the last collective and none completed it."""
    if not g.reach:
        return []
    top = max(g.reach.values())
    known = [r for r in g.members if r in g.reach]
    if any(g.reach[r] != top for r in known) or not all(_strictly_pending(ds, g, r, top) for r in known):
        return []
    sigs = Counter(ds.traces[r].streams[g.name].sig(top) for r in known)
    if len(sigs) != 1:
        return []
    sig = next(iter(sigs))
    if any(r not in ds.traces for r in g.members):
        return []  # some members left no dump: _no_dump names them, or nobody can be named
    return [Finding(kind="hang", pg=g.name, seq=top, rank=None, majority_sig=sig, majority_ranks=tuple(known), waiting=tuple(known))]


def analyse(ds: DumpSet) -> Analysis:
    """Match every group, then separate root causes from downstream consequences."""
    groups = build_groups(ds)
    an = Analysis(groups=groups)
    votes: list[Finding] = []
    behind: list[Finding] = []
    absent = tuple(sorted(world_ranks(ds) - set(ds.traces)))  # ranks of the job without a usable dump
    for name in sorted(groups, key=order_key):
        g = groups[name]
        votes.extend(_vote(ds, g, an))
        behind.extend(_behind(ds, g))
        behind.extend(_no_dump(ds, g, absent))
    for f in votes:
        if f.at_window_start:
            an.needs_history.update(groups[f.pg].members)
    an.findings = votes + behind
    attribute(ds, an, votes, behind)
    if not an.roots:
        hangs = [f for name in sorted(groups, key=order_key) for f in _hang(ds, groups[name])]
        an.findings.extend(hangs)
        if hangs:
            hangs.sort(key=functools.cmp_to_key(lambda a, b: program_order(ds, a, b)))
            an.roots.append(hangs[0])
            for f in hangs[1:]:
                f.role = "cascade"
                f.blocked_by = ()
                an.cascades.append(f)
    return an
