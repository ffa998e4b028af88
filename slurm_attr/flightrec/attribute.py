"""Roots and cascades among the Flight Recorder findings: a mismatch is a root; a rank behind
that waits on nothing is stuck (a root); one that waits in another finding is its cascade; ranks
waiting on each other are split by where they wait (research §7.5)."""
from __future__ import annotations

import functools
from collections import Counter
from typing import Any

from .divergences import Analysis, Finding, position, program_order
from .groups import order_key
from .loader import DumpSet


def attribute(ds: DumpSet, an: Analysis, votes: list[Finding], behind: list[Finding]) -> None:
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
        if cur is None or (position(ds, f.rank, f.pg, f.seq)[0] or 0) < (position(ds, f.rank, cur.pg, cur.seq)[0] or 0):
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
