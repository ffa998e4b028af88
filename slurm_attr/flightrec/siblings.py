"""Sibling groups: how a tie in a two-member group is broken (issue 12 item 3).

Two ranks cannot outvote each other. Tensor-parallel groups TP0, TP1, ... run
the same program on different ranks, so what TP1 issued at collective #k says
what TP0 should have issued there. A sibling is a group with as many members,
the same description shape (digits aside) and the same recent collectives as
the tied group; only a signature every dumped member of the sibling agrees on
counts as its vote.
"""
from __future__ import annotations

import re
from collections import Counter

from .groups import Group
from .loader import DumpSet
from .types import NO_SIG

MAX_SIBLINGS = 256


def _shape(desc: str) -> str:
    """'TP0' and 'TP1' have one shape ('TP#'); so have two groups with no description."""
    return re.sub(r"\d+", "#", desc)


def _unanimous(ds: DumpSet, g: Group, seq: int) -> int | None:
    """The signature every dumped member of g that recorded ``seq`` agrees on, else None."""
    seen = NO_SIG
    for r in g.members:
        tr = ds.traces.get(r)
        st = tr.streams.get(g.name) if tr else None
        s = st.sig(seq) if st else NO_SIG
        if s == NO_SIG:
            continue
        if seen != NO_SIG and s != seen:
            return None
        seen = s
    return seen if seen != NO_SIG else None


def sibling_votes(ds: DumpSet, groups: dict[str, Group], g: Group, seq: int, consensus: dict[int, int], lo: int) -> Counter[int]:
    """sig -> how many sibling groups issued it, unanimously, at ``seq``.

    Siblings: other groups with as many members and the same description shape
    (TP0, TP1, ...; the default group is never one), whose recent collectives
    before ``seq`` match this group's consensus wherever both recorded them.
    """
    out: Counter[int] = Counter()
    shape = _shape(g.desc)
    if g.desc == "default_pg":
        return out
    n = 0
    for h in groups.values():
        if h.name == g.name or len(h.members) != len(g.members) or _shape(h.desc) != shape or h.desc == "default_pg":
            continue
        n += 1
        if n > MAX_SIBLINGS:
            break
        same = True
        for j in range(max(lo, seq - 8), seq):
            mine = consensus.get(j)
            theirs = _unanimous(ds, h, j) if mine is not None else None
            if mine is not None and theirs is not None and theirs != mine:
                same = False
                break
        if not same:
            continue
        s = _unanimous(ds, h, seq)
        if s is not None:
            out[s] += 1
    return out
