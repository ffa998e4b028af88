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
from dataclasses import dataclass, field
from typing import Any

from .groups import Group, build_groups, order_key, world_ranks
from .loader import DumpSet
from .types import NO_SIG
from .vote import vote

MISMATCH_KINDS = ("skip", "op", "size", "dtype", "order")


@dataclass
class Finding:
    """One divergence in one group at one sequence number."""

    kind: str  # skip | op | size | dtype | not_reached | hang | order
    pg: str
    seq: int
    rank: int | None  # the culprit; None for a hang nobody can be blamed for
    sig: int | None = None  # culprit's signature id at seq (None: it never got there)
    majority_sig: int | None = None
    majority_ranks: tuple[int, ...] = ()
    waiting: tuple[int, ...] = ()  # ranks that reached seq and wait in it
    ambiguous: bool = False
    no_dump: bool = False
    role: str = "root"  # root | cascade
    at_window_start: bool = False
    confidence: str = "high"
    also: list[tuple[str, int]] = field(default_factory=list)  # other groups this root rank is missing from
    behind: tuple[int, ...] = ()  # cascade: every rank behind in this group
    blocked_in: dict[int, tuple[str, int]] = field(default_factory=dict)  # cascade: rank -> where it waits
    blocked_by: tuple[int, ...] = ()  # cascade: root culprit ranks
    tied_with: tuple[int, ...] = ()  # an undecided tie: the ranks on the other side
    weak: bool = False  # no_dump: the others' op may have ended (Gloo): a root only if it blocks someone
    membership_inferred: bool = False  # no_dump: the rank's membership of the group is inferred, not listed
    tie_break: str = ""  # how a tied vote was decided (history | siblings | later | frequency), "" if it was not tied
    first_compared: bool = False  # mismatch: compared with no other rank before seq (it may have diverged earlier)
    abstained: tuple[int, ...] = ()  # mismatch: members with a dump whose window does not hold seq (they did not vote)


@dataclass
class Analysis:
    """The result of matching all groups of one job."""

    groups: dict[str, Group]
    roots: list[Finding] = field(default_factory=list)
    cascades: list[Finding] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    windows: dict[str, tuple[int, int]] = field(default_factory=dict)
    needs_history: set[int] = field(default_factory=set)
    # weak no-dump suspects nobody is blocked behind: said, not blamed
    context: list[Finding] = field(default_factory=list)


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
    # is blocked behind it (_attribute); a job that simply ended names nobody.
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


def _pos(ds: DumpSet, rank: int, pg: str, seq: int) -> tuple[int | None, int]:
    """(position in the rank's dump, time_created_ns) of its entry for (pg, seq)."""
    tr = ds.traces.get(rank)
    st = tr.streams.get(pg) if tr else None
    i = st.index(seq) if st else None
    if i is None:
        return None, 0
    return st.pos[i], st.times[i]


def program_order(ds: DumpSet, a: Finding, b: Finding) -> int:
    """<0 when a's collective comes before b's: by the shared waiting ranks' record order, then time."""
    if a.pg == b.pg:
        return a.seq - b.seq
    shared = sorted(set(a.waiting) & set(b.waiting))[:64]
    votes = 0
    for w in shared:
        pa, _ = _pos(ds, w, a.pg, a.seq)
        pb, _ = _pos(ds, w, b.pg, b.seq)
        if pa is not None and pb is not None and pa != pb:
            votes += 1 if pa < pb else -1
    if votes:
        return -votes
    ta = min((t for t in (_pos(ds, w, a.pg, a.seq)[1] for w in a.waiting[:64]) if t), default=0)
    tb = min((t for t in (_pos(ds, w, b.pg, b.seq)[1] for w in b.waiting[:64]) if t), default=0)
    if ta and tb and ta != tb:
        return -1 if ta < tb else 1
    return -1 if order_key(a.pg) < order_key(b.pg) else 1


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
    _attribute(ds, an, votes, behind)
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


def _attribute(ds: DumpSet, an: Analysis, votes: list[Finding], behind: list[Finding]) -> None:
    """Roots and cascades: mismatches are roots; a rank behind that waits on nothing is stuck (a
    root); a rank behind that waits in another finding is its cascade."""
    an.roots.extend(_first_mismatches(ds, votes))
    per_rank: dict[int, list[Finding]] = {}
    for f in behind:
        per_rank.setdefault(f.rank, []).append(f)
    stuck_roots, cascades, blocked_map = _split_stuck(ds, an.groups, votes + behind, per_rank)
    stuck_roots = _drop_weak_suspects(an, stuck_roots, per_rank, cascades)
    if not an.roots and not stuck_roots and blocked_map:
        stuck_roots = _order_cycle(ds, blocked_map, per_rank, cascades)
    an.roots.extend(stuck_roots)
    an.cascades.extend(_cascade_groups(cascades, {f.rank for f in an.roots}))


def _by_program_order(ds: DumpSet) -> Any:
    return functools.cmp_to_key(lambda a, b: program_order(ds, a, b))


def _first_mismatches(ds: DumpSet, votes: list[Finding]) -> list[Finding]:
    """One root per culprit rank: its earliest mismatch in its own program order."""
    first: dict[int, Finding] = {}
    for f in votes:
        cur = first.get(f.rank)
        if cur is None or (_pos(ds, f.rank, f.pg, f.seq)[0] or 0) < (_pos(ds, f.rank, cur.pg, cur.seq)[0] or 0):
            first[f.rank] = f
    return list(first.values())


def _split_stuck(ds: DumpSet, groups: dict[str, Any], findings: list[Finding], per_rank: dict[int, list[Finding]]
                 ) -> tuple[list[Finding], dict[int, list[tuple[Finding, Finding]]], dict[int, list[Finding]]]:
    """(stuck roots, {rank: [(its finding, the finding it waits in)]}, {rank: what blocks it})."""
    by_group: dict[str, list[Finding]] = {}
    for f in findings:
        by_group.setdefault(f.pg, []).append(f)

    def blockers(r: int) -> list[Finding]:
        """Findings other than r's own 'not reached' in which r reached the collective (so waits there)."""
        tr = ds.traces.get(r)
        names = set(tr.streams) | set(tr.pg_status) if tr else set()
        out = []
        for name in names:
            g = groups.get(name)
            for f in by_group.get(name, ()):
                if f.kind == "not_reached" and f.rank == r:
                    continue
                if f.rank == r or (g is not None and g.reach.get(r, -1) >= f.seq):
                    out.append(f)
        return out

    cascades: dict[int, list[tuple[Finding, Finding]]] = {}
    stuck_roots: list[Finding] = []
    blocked_map: dict[int, list[Finding]] = {}
    for r, fs in sorted(per_rank.items()):
        fs.sort(key=_by_program_order(ds))
        bl = blockers(r)
        if not bl:
            root = fs[0]
            root.also = [(f.pg, f.seq) for f in fs[1:]]
            stuck_roots.append(root)
        else:
            blocked_map[r] = bl
            bl.sort(key=_by_program_order(ds))
            for f in fs:
                cascades.setdefault(r, []).append((f, bl[0]))
    return stuck_roots, cascades, blocked_map


def _drop_weak_suspects(an: Analysis, stuck_roots: list[Finding], per_rank: dict[int, list[Finding]],
                        cascades: dict[int, list[tuple[Finding, Finding]]]) -> list[Finding]:
    """A weak no-dump suspect stands only if some dumped rank is blocked behind it."""
    blocking = {blocker.rank for pairs in cascades.values() for _, blocker in pairs}
    dropped = [f for f in stuck_roots if f.weak and all(x.weak for x in per_rank[f.rank]) and f.rank not in blocking]
    if not dropped:
        return stuck_roots
    gone = {f.rank for f in dropped}
    an.findings = [f for f in an.findings if not (f.no_dump and f.rank in gone)]
    for f in dropped:
        f.role = "context"
    an.context.extend(dropped)
    return [f for f in stuck_roots if f.rank not in gone]


def _order_cycle(ds: DumpSet, blocked_map: dict[int, list[Finding]], per_rank: dict[int, list[Finding]],
                 cascades: dict[int, list[tuple[Finding, Finding]]]) -> list[Finding]:
    """Everyone waits on someone: ranks waiting on each other (collectives issued in a different
    order on different groups). The ranks in the cycle split by where they wait; the largest set
    kept the common order, the others are the ones whose order differs. An even split (two
    ranks, one each way) names them all, ambiguous. Their findings leave ``cascades``."""
    cycle = _cycle_ranks(blocked_map)
    where = {r: (blocked_map[r][0].pg, blocked_map[r][0].seq) for r in cycle}
    count = Counter(where.values())
    top = max(count.values(), default=0)
    common = [w for w, c in count.items() if c == top]
    odd = [r for r in cycle if where[r] != common[0]] if len(common) == 1 and len(count) > 1 else cycle
    roots = []
    for r in odd:
        f = sorted(per_rank[r], key=_by_program_order(ds))[0]
        f.kind = "order"
        f.confidence = "medium" if odd is not cycle else "low"
        f.ambiguous = odd is cycle
        f.blocked_in = {r: where[r]}
        if odd is cycle:
            f.tied_with = tuple(x for x in cycle if x != r)
        roots.append(f)
        cascades.pop(r, None)
    return roots


def _cascade_groups(cascades: dict[int, list[tuple[Finding, Finding]]], root_ranks: set[int]) -> list[Finding]:
    """One cascade finding per process group: who is behind there, where each waits, and the
    root ranks they wait on."""
    down: dict[str, Finding] = {}
    for r, pairs in sorted(cascades.items()):
        for f, blocker in pairs:
            d = down.get(f.pg)
            if d is None:
                d = down[f.pg] = Finding(kind="not_reached", pg=f.pg, seq=f.seq, rank=r, majority_sig=f.majority_sig,
                                         majority_ranks=f.majority_ranks, role="cascade")
            d.seq = min(d.seq, f.seq)
            d.behind = tuple(sorted(set(d.behind) | {r}))
            d.waiting = tuple(sorted(set(d.waiting) | set(f.waiting)))
            d.blocked_in[r] = (blocker.pg, blocker.seq)
            culprit = blocker.rank if blocker.rank in root_ranks else None
            if culprit is not None:
                d.blocked_by = tuple(sorted(set(d.blocked_by) | {culprit}))
    return [down[name] for name in sorted(down, key=order_key)]


def _cycle_ranks(blocked: dict[int, list[Finding]]) -> list[int]:
    edges = {r: {f.rank for f in fs if f.rank is not None and f.rank in blocked} for r, fs in blocked.items()}
    out = []
    for start in edges:
        seen, stack = set(), list(edges[start])
        while stack:
            n = stack.pop()
            if n == start:
                out.append(start)
                break
            if n in seen:
                continue
            seen.add(n)
            stack.extend(edges.get(n, ()))
    return sorted(out)
