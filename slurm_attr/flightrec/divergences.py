"""The Flight Recorder analysis's findings (one divergence each, in one group at one sequence
number), the analysis they make up, and their program order across groups."""
from __future__ import annotations

from dataclasses import dataclass, field

from .groups import Group, order_key
from .loader import DumpSet


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


def position(ds: DumpSet, rank: int, pg: str, seq: int) -> tuple[int | None, int]:
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
        pa, _ = position(ds, w, a.pg, a.seq)
        pb, _ = position(ds, w, b.pg, b.seq)
        if pa is not None and pb is not None and pa != pb:
            votes += 1 if pa < pb else -1
    if votes:
        return -votes
    ta = min((t for t in (position(ds, w, a.pg, a.seq)[1] for w in a.waiting[:64]) if t), default=0)
    tb = min((t for t in (position(ds, w, b.pg, b.seq)[1] for w in b.waiting[:64]) if t), default=0)
    if ta and tb and ta != tb:
        return -1 if ta < tb else 1
    return -1 if order_key(a.pg) < order_key(b.pg) else 1
