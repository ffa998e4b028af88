"""Who issued a different collective: one group's members aligned by sequence number, and a majority vote.

Members are aligned by ``collective_seq_id`` over every seq that any member's
dump holds. Ring buffers wrap differently per rank (a rank that also talks on
other groups keeps fewer of this one's collectives), so windows differ: a
member whose window does not hold a seq (its ring wrapped past it, or its dump
ends before it) abstains there. It neither agrees nor disagrees, and it is
never a culprit for that seq. At each seq the members that hold it vote on the
signature (op, sizes, dtypes); the minority is the culprit, never "whoever
sorted first".

A tie (a two-member group, or the only two ranks whose windows reach back that
far) is broken by the group's own history: what followed the previous
collective, learnt only where at least two ranks agreed (one rank alone is no
history, and a rank's own stream after it diverged would vouch for itself).
Then by sibling groups of the same shape (siblings.py). Otherwise the tie
waits for later seqs. A member whose window begins later may join the vote, and
the side that is outvoted then diverged at the tie: a rank that skipped a
collective stays shifted. A tie that nothing decides (at the end, or at once
when every rank still in the vote is in it) is broken by how common each side's
signature is over the seqs that all of its ranks hold (a longer window earns
nothing). If that does not decide it either, both sides are named, ambiguous.

The first divergence is classified: a skipped collective (the culprit issued
what the others issue next), a different op, size or dtype.
"""
from __future__ import annotations

from array import array
from collections import Counter
from dataclasses import dataclass, field

from .groups import Group
from .loader import DumpSet
from .siblings import sibling_votes
from .types import NO_SIG, Sig


@dataclass
class Divergence:
    """The first divergence of one set of ranks (identical streams) in one group."""

    kind: str  # skip | op | size | dtype
    seq: int
    ranks: tuple[int, ...]
    sig: int
    majority_sig: int
    majority_ranks: tuple[int, ...]
    ambiguous: bool = False
    tie_break: str = ""  # history | siblings | later | frequency, "" if the vote was not tied
    # a member with only its newest entries read does not hold this seq or the one before: re-read before concluding
    at_window_start: bool = False
    # the culprits were compared with nobody before this seq (the others' windows begin here, or
    # theirs does): they may have diverged earlier, where no other dump reaches
    first_compared: bool = False
    abstained: tuple[int, ...] = ()  # members with a dump whose window does not hold this seq


@dataclass
class Vote:
    """One group's vote: the window compared and the divergences found in it."""

    window: tuple[int, int] | None = None
    divergences: list[Divergence] = field(default_factory=list)


@dataclass
class _Class:
    """Members of a group with the same window and the same signatures in it."""

    lo: int
    sigs: array
    ranks: list[int]
    truncated: bool = False  # some member's dump was read only in part (its newest entries)

    @property
    def hi(self) -> int:
        return self.lo + len(self.sigs) - 1

    def at(self, seq: int) -> int:
        i = seq - self.lo
        return self.sigs[i] if 0 <= i < len(self.sigs) else NO_SIG


@dataclass
class _Tie:
    """A tied vote nothing has decided yet: sig -> the classes that issued it at ``seq``."""

    seq: int
    sides: dict[int, list[int]]
    uncompared: set[int]  # classes that had never agreed with another class before seq


@dataclass
class _Blame:
    seq: int
    ci: int
    sig: int
    maj: int
    maj_cis: list[int]
    tie_break: str = ""
    ambiguous: bool = False
    first_compared: bool = False


def _classes(ds: DumpSet, g: Group) -> list[_Class]:
    by_key: dict[tuple[int, bytes], _Class] = {}
    for r in g.members:
        tr = ds.traces.get(r)
        st = tr.streams.get(g.name) if tr is not None else None
        if st is None or not st.sigs:
            continue
        key = (st.lo, st.sigs.tobytes())
        c = by_key.get(key)
        if c is None:
            c = by_key[key] = _Class(lo=st.lo, sigs=st.sigs, ranks=[])
        c.ranks.append(r)
        c.truncated = c.truncated or tr.history_truncated
    return sorted(by_key.values(), key=lambda c: c.ranks[0])


def _consistent(classes: list[_Class], lo: int, hi: int) -> bool:
    """One sequence of signatures explains every class: they differ only in their windows."""
    ref = array("q", [NO_SIG]) * (hi - lo + 1)
    for c in sorted(classes, key=lambda c: -len(c.sigs)):
        a = c.lo - lo
        seg = ref[a : a + len(c.sigs)]
        if seg == c.sigs:
            continue
        for i, s in enumerate(c.sigs):
            t = seg[i]
            if t == NO_SIG:
                ref[a + i] = s
            elif s != NO_SIG and s != t:
                return False
    return True


def _sig_diff(a: Sig, b: Sig) -> str:
    if a.op != b.op:
        return "op"
    if a.input_sizes != b.input_sizes or a.output_sizes != b.output_sizes:
        return "size"
    if a.input_dtypes != b.input_dtypes or a.output_dtypes != b.output_dtypes:
        return "dtype"
    return "op"


class _Ballot:
    """One group's vote, seq by seq over the union of the members' windows."""

    def __init__(self, ds: DumpSet, groups: dict[str, Group], g: Group, classes: list[_Class]):
        self.ds, self.groups, self.g, self.classes = ds, groups, g, classes
        self.weight = [len(c.ranks) for c in classes]
        self.lo = min(c.lo for c in classes)
        self.hi = max(c.hi for c in classes)
        self.out: set[int] = set()  # classes that diverged: their later entries say nothing
        self.consensus: dict[int, int] = {}
        self.agreed: set[int] = set()  # seqs at least two ranks agreed on: the group's history
        self.succ: dict[int, set[int]] = {}  # signature -> what the group's history issued next
        self.compared: set[int] = set()  # classes seen agreeing with another class
        self.ties: list[_Tie] = []  # undecided ties, oldest first
        self.ties_of: dict[int, list[_Tie]] = {}  # class -> the undecided ties it is in, oldest first
        self.unsettled: list[int] = []  # seqs with no consensus while a tie was open
        self.blames: dict[int, _Blame] = {}  # class -> its first divergence

    def run(self) -> None:
        classes, out = self.classes, self.out
        for k in range(self.lo, self.hi + 1):
            votes: dict[int, list[int]] = {}
            for ci, c in enumerate(classes):
                i = k - c.lo
                if ci not in out and 0 <= i < len(c.sigs) and c.sigs[i] != NO_SIG:
                    votes.setdefault(c.sigs[i], []).append(ci)
            if len(votes) == 1:
                s, cis = next(iter(votes.items()))
                self.settle(k, s, cis)
            elif votes:
                self.decide(k, votes)
        self.close_ties()

    def settle(self, k: int, maj: int, cis: list[int]) -> None:
        self.consensus[k] = maj
        if sum(self.weight[ci] for ci in cis) < 2:
            return  # one rank alone: nobody to agree with, so no history
        if k - 1 in self.agreed:
            self.succ.setdefault(self.consensus[k - 1], set()).add(maj)
        self.agreed.add(k)
        if len(cis) > 1:
            self.compared.update(cis)

    def decide(self, k: int, votes: dict[int, list[int]]) -> None:
        wsum = {s: sum(self.weight[ci] for ci in cis) for s, cis in votes.items()}
        top = max(wsum.values())
        tops = [s for s in votes if wsum[s] == top]
        if len(tops) == 1:
            maj, tie_break = tops[0], ""
        elif all(self.ties_of.get(ci) for cis in votes.values() for ci in cis):
            self.unsettled.append(k)  # only ranks already in an undecided tie (a shifted stream): nothing new
            return
        else:
            maj, tie_break = self.break_tie(k, tops, votes)
        if maj is None:
            for s, cis in votes.items():
                if s not in tops:  # below a tied top: outvoted all the same
                    for ci in cis:
                        self.blame(ci, k, s, tops[0], [c for t in tops for c in votes[t]], "")
            self.open_tie(k, {s: votes[s] for s in tops})
            if all(ci in self.out or self.ties_of.get(ci) for ci in range(len(self.classes))):
                self.close_ties()  # every rank is in the tie: no later voter can decide it
            return
        for s, cis in votes.items():
            if s != maj:
                for ci in cis:
                    self.blame(ci, k, s, maj, votes[maj], tie_break)
        self.settle(k, maj, votes[maj])

    def break_tie(self, k: int, tops: list[int], votes: dict[int, list[int]]) -> tuple[int | None, str]:
        """A tie decided by this group's own history, then by sibling groups; (None, "") if neither can."""
        # What the group issued after the previous collective, if at least two ranks agreed on that
        # one: a collective only one side holds would let that side vouch for itself.
        follows = self.succ.get(self.consensus[k - 1], set()) if k - 1 in self.agreed else set()
        sib = sibling_votes(self.ds, self.groups, self.g, k, self.consensus, self.lo)

        def score(s: int) -> tuple[bool, int]:
            return (s in follows, sib[s])

        ranked = sorted(tops, key=lambda s: (*score(s), -min(self.classes[ci].ranks[0] for ci in votes[s])), reverse=True)
        a, b = score(ranked[0]), score(ranked[1])
        if a == b:
            return None, ""
        return ranked[0], "history" if a[0] != b[0] else "siblings"

    def open_tie(self, k: int, sides: dict[int, list[int]]) -> None:
        self.unsettled.append(k)
        classes = [ci for cis in sides.values() for ci in cis]
        if all(self.ties_of.get(ci) for ci in classes):
            return  # each of them already diverged at an earlier tie
        t = _Tie(seq=k, sides=sides, uncompared={ci for ci in classes if ci not in self.compared})
        self.ties.append(t)
        for ci in classes:
            self.ties_of.setdefault(ci, []).append(t)

    def blame(self, ci: int, k: int, s: int, maj: int, maj_cis: list[int], tie_break: str) -> None:
        """Class ci was outvoted at k. If it was in an undecided tie, that tie is where it diverged."""
        t = self.ties_of[ci][0] if self.ties_of.get(ci) else None
        if t is None:
            self._out(ci, _Blame(k, ci, s, maj, list(maj_cis), tie_break, first_compared=ci not in self.compared))
            return
        mine = self.classes[ci].at(t.seq)
        others = {x: cis for x, cis in t.sides.items() if x != mine}
        maj_t = max(others, key=lambda x: sum(self.weight[c] for c in others[x] if c not in self.out))
        self._out(ci, _Blame(t.seq, ci, mine, maj_t, list(others[maj_t]), "later", first_compared=ci in t.uncompared))

    def _out(self, ci: int, blame: _Blame) -> None:
        """Class ci leaves the vote with ``blame`` as its first divergence; ties it was in may be decided now."""
        self.out.add(ci)
        self.blames.setdefault(ci, blame)
        for t in list(self.ties_of.get(ci, ())):
            alive = [x for x, cis in t.sides.items() if any(c not in self.out for c in cis)]
            if len(alive) <= 1:
                self._drop(t)
                if alive:
                    self.consensus[t.seq] = alive[0]
                self.resettle(t.seq)

    def _drop(self, t: _Tie) -> None:
        if t in self.ties:
            self.ties.remove(t)
        for cis in t.sides.values():
            for c in cis:
                self.ties_of[c].remove(t)

    def resettle(self, since: int) -> None:
        """Seqs left without a consensus by a tie now decided: what the classes still in the vote issued."""
        for k in [x for x in self.unsettled if x > since]:
            sigs = {c.at(k) for ci, c in enumerate(self.classes) if ci not in self.out} - {NO_SIG}
            if len(sigs) == 1:
                self.consensus[k] = sigs.pop()
                self.unsettled.remove(k)

    def close_ties(self) -> None:
        """Ties no later voter decided: how common each side's signature is where all of them hold, else all named."""
        while self.ties:
            t = self.ties[0]
            self._drop(t)
            freq = self._frequency(t)
            ranked = sorted(t.sides, key=lambda s: freq[s], reverse=True)
            if freq[ranked[0]] > freq[ranked[1]]:
                self.consensus[t.seq] = ranked[0]
                for s in ranked[1:]:
                    for ci in t.sides[s]:
                        self._out(ci, _Blame(t.seq, ci, s, ranked[0], list(t.sides[ranked[0]]), "frequency",
                                             first_compared=ci in t.uncompared))
                self.resettle(t.seq)
                continue
            for s, side in t.sides.items():
                other = next(x for x in ranked if x != s)
                rest = [c for x, cis in t.sides.items() if x != s for c in cis]
                for ci in side:
                    self._out(ci, _Blame(t.seq, ci, s, other, rest, "", ambiguous=True, first_compared=ci in t.uncompared))

    def _frequency(self, t: _Tie) -> Counter[int]:
        """How often each side's signature occurs over the seqs every tied class holds (a longer window earns nothing)."""
        cis = [ci for side in t.sides.values() for ci in side]
        lo, hi = max(self.classes[ci].lo for ci in cis), min(self.classes[ci].hi for ci in cis)
        total: Counter[int] = Counter()
        for ci in cis:
            c = self.classes[ci]
            for s, n in Counter(c.sigs[lo - c.lo : hi - c.lo + 1]).items():
                total[s] += n * self.weight[ci]
        return Counter({s: total[s] for s in t.sides})

    def divergences(self) -> list[Divergence]:
        out = []
        seen: dict[int, tuple[bool, tuple[int, ...]]] = {}  # seq -> (edge, abstained): many culprits share one seq
        for b in sorted(self.blames.values(), key=lambda b: (b.seq, b.ci)):
            nxt = self.consensus.get(b.seq + 1)
            skipped = b.sig == nxt if nxt is not None else b.sig in self.succ.get(b.maj, set()) and b.sig != b.maj
            x, y = self.ds.sigs.get(b.sig), self.ds.sigs.get(b.maj)
            kind = "skip" if skipped else (_sig_diff(x, y) if x and y else "op")
            if b.seq not in seen:
                seen[b.seq] = (self.edge(b.seq), self.abstained(b.seq))
            edge, abstained = seen[b.seq]
            out.append(Divergence(
                kind=kind, seq=b.seq, ranks=tuple(self.classes[b.ci].ranks), sig=b.sig, majority_sig=b.maj,
                majority_ranks=tuple(sorted(r for c in b.maj_cis for r in self.classes[c].ranks)),
                ambiguous=b.ambiguous, tie_break=b.tie_break, first_compared=b.first_compared and b.seq > 1,
                at_window_start=edge, abstained=abstained))
        return out

    def edge(self, k: int) -> bool:
        """A member read only in part (its newest entries) does not hold the seq before k: its older entries may vote."""
        if any(c.truncated and c.lo >= k for c in self.classes):
            return True
        held = {r for c in self.classes for r in c.ranks}
        return any(self.ds.traces[r].history_truncated for r in self.g.members if r in self.ds.traces and r not in held)

    def abstained(self, k: int) -> tuple[int, ...]:
        held = {r for c in self.classes if c.at(k) != NO_SIG for r in c.ranks}
        return tuple(r for r in self.g.members if r in self.ds.traces and r not in held)


def vote(ds: DumpSet, groups: dict[str, Group], g: Group) -> Vote:
    """Majority vote per seq over the union of the members' windows; each diverging set of ranks at its first divergence."""
    classes = _classes(ds, g)
    if sum(len(c.ranks) for c in classes) < 2:
        return Vote()
    lo, hi = min(c.lo for c in classes), max(c.hi for c in classes)
    if len(classes) == 1 or _consistent(classes, lo, hi):
        return Vote(window=(lo, hi))  # they differ only in how far back or forward they reach (_behind)
    ballot = _Ballot(ds, groups, g, classes)
    ballot.run()
    return Vote(window=(lo, hi), divergences=ballot.divergences())
