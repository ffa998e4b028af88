"""The literal anchors of one source's rules, found in one pass over a buffer.

Every rule lists keywords; every line a rule can match contains one (catalog.py).
So the lines worth a regex are exactly those holding a keyword, and the rules
worth trying on such a line are those whose keywords it holds. Both answers come
from one Aho-Corasick pass over the lower-cased buffer (ahocorasick_rs: the Rust
aho-corasick crate, SIMD-accelerated, which releases the GIL) that reports every
keyword occurrence, overlapping ones included, with its offset. The same pass
finds the literals each rule's regex cannot match without (literals.py): a rule
that has them sees a line only when one of them is there too, so benign lines that
merely share a keyword ("mlx5_core", "NCCL INFO") never reach Python.

Profile that motivated it (129 MB bundle, 2-core machine): one ``bytes.find``
pass per trigger fragment plus a per-line keyword check took ~60% of extraction;
one automaton pass costs about what a single ``find`` pass did.

With few keywords (``ANCHORS_MAX``, the kernel's) it runs in two steps. The first
searches the keywords alone, leftmost-first (the automaton's SIMD searcher), and
decides most lines at once: what it cannot see (a keyword overlapping a reported one)
is worked out per anchor when the catalog loads (``_init_anchors``). Only lines whose
rules need a required literal, or that may hide a keyword, get a second search, over
those lines alone. Profile of the 129 MB bundle's 4 MiB kernel tails (instructions
counted with valgrind, one tail): 180 M for the earlier every-occurrence second pass
over every keyword line, 153-162 M now; half of what is left is Python per keyword
line (~8,300 of them: Xid lines and mlx5_core chatter), the rest lower-casing and
the automata.

Without ahocorasick_rs (a broken install) a combined regex of the escaped
patterns selects the lines instead, and each selected line is checked for every
pattern; slower on large buffers, same result.

The buffer is lower-cased and searched in slices of about ``SLICE`` bytes cut at
line ends, so a hostile file full of keywords costs bounded memory per slice
rather than one match tuple per keyword for the whole file at once.
"""
from __future__ import annotations

import re
from itertools import accumulate
from typing import Iterable, Iterator, Mapping, Optional, Sequence

try:  # a declared dependency; the fallback only keeps a broken install analysing
    from ahocorasick_rs import BytesAhoCorasick, MatchKind
except ImportError:  # pragma: no cover - exercised by forcing the fallback in tests
    BytesAhoCorasick = MatchKind = None

SLICE = 1 << 20  # bytes lower-cased and searched at once (a line longer than this is one slice)
# Up to this many keywords, a first pass looks for the keywords alone, leftmost-first: the
# automaton then uses its SIMD literal searcher (~2 GB/s here, against ~0.3 GB/s for the
# every-occurrence search over keywords and literals, which then runs on the lines found only).
ANCHORS_MAX = 64

# (start offset, end offset, rule positions) of one line holding a keyword; end excludes the newline.
LineHit = tuple[int, int, "frozenset[int]"]


class Prefilter:
    """Keywords (lower-case) -> the positions of the rules that list them, and their matcher.

    ``factors`` (optional): rule position -> literals.required_any of its regex; such a
    rule is handed a line only when the line also holds one of those literals.
    """

    def __init__(self, by_kw: Mapping[str, Sequence[int]], factors: Optional[Mapping[int, Iterable[str]]] = None,
                 use_automaton: bool = True, use_anchors: bool = True):
        self.keywords: list[str] = sorted(by_kw)
        # frozensets: a line with one keyword (most of them) reuses its keyword's set as is
        self.positions: list[frozenset[int]] = [frozenset(by_kw[k]) for k in self.keywords]
        factors = factors or {}
        kw_pos: dict[str, set[int]] = {k: set(v) for k, v in by_kw.items()}
        sat: dict[str, set[int]] = {}
        for pos, lits in factors.items():
            for lit in lits:
                sat.setdefault(lit.lower(), set()).add(pos)
        # One table of everything searched: pattern i is a keyword of the rules kw_of[i]
        # and/or a required literal of the rules sat_of[i].
        self.patterns: list[str] = sorted(set(kw_pos) | set(sat))
        self.kw_of: list[frozenset[int]] = [frozenset(kw_pos.get(p, ())) for p in self.patterns]
        self.sat_of: list[frozenset[int]] = [frozenset(sat.get(p, ())) for p in self.patterns]
        self.guarded: frozenset[int] = frozenset(factors)
        self._encoded = [p.encode("ascii") for p in self.patterns]
        self._ac = BytesAhoCorasick(self._encoded) if self.keywords and use_automaton and BytesAhoCorasick else None
        self._anchors = None
        if self._ac is not None and use_anchors and len(self.keywords) <= ANCHORS_MAX:
            self._init_anchors(sat)
        self._known: dict[tuple[int, ...], frozenset[int]] = {}  # patterns found in a line -> its rules
        self._re = None
        if self.keywords and self._ac is None:
            # Longest first, so the alternation prefers the longer of two patterns at one offset.
            self._re = re.compile(b"|".join(re.escape(k) for k in sorted(self._encoded, key=len, reverse=True)))

    def _init_anchors(self, sat: Mapping[str, set[int]]) -> None:
        """The first pass: the keywords alone, leftmost-first, longest first at one offset.

        It reports every keyword occurrence but those overlapping a reported one. Those are
        accounted for here: a keyword inside the reported one (``implied``) is surely there
        too; one that starts inside it and ends beyond it is there when the text after the
        reported one goes on as that keyword does (``tails``: one ``startswith`` per match),
        and such a line goes to the second pass over every pattern."""
        anchors = sorted(self.keywords, key=lambda k: (-len(k), k))
        by_kw = dict(zip(self.keywords, self.positions))
        self._anchor_implied: list[frozenset[int]] = [
            frozenset().union(*[by_kw[k] for k in self.keywords if k in a]) for a in anchors]
        self._anchor_tails: list[tuple[bytes, ...]] = [
            # k starts with the last j characters of a and goes on: k[j:] would follow a
            tuple(sorted({k[j:].encode("ascii") for k in self.keywords if k != a for j in range(1, len(a))
                          if len(k) > j and k.startswith(a[len(a) - j:])}))
            for a in anchors]
        self._anchors = BytesAhoCorasick([a.encode("ascii") for a in anchors], matchkind=MatchKind.LeftmostFirst)
        # The required literals alone: for a line whose rules are known and guarded, which literals it holds.
        self._literals: list[str] = sorted(sat)
        self._lit_sat: list[frozenset[int]] = [frozenset(sat[x]) for x in self._literals]
        self._lit_ac = BytesAhoCorasick([x.encode("ascii") for x in self._literals]) if self._literals else None
        self._line_kind: dict[tuple[int, ...], tuple[int, frozenset[int]]] = {}

    # What the first pass tells about a line: its rules, or that a second pass must decide.
    _DONE, _GUARD, _FULL = 0, 1, 2

    def _kind_of(self, seen: tuple[int, ...]) -> tuple[int, frozenset[int]]:
        picked = frozenset().union(*[self._anchor_implied[a] for a in seen])
        if picked & self.guarded:
            return self._GUARD, picked
        return self._DONE, picked

    @property
    def engine(self) -> str:
        return "aho-corasick" if self._ac is not None else "regex" if self._re is not None else "none"

    def _resolve(self, picked: frozenset[int], satisfied: frozenset[int]) -> frozenset[int]:
        """The rules of ``picked`` (keywords seen) whose required literal was seen too, if they have one."""
        guarded = picked & self.guarded
        return picked - (guarded - satisfied) if guarded else picked

    def lines(self, buf: bytes, max_line: int) -> Iterator[LineHit]:
        """Every line of ``buf`` (lines end at b"\\n") that a rule must look at, in order, with those
        rules' positions. Only a line's first ``max_line`` bytes count (the part the rules see)."""
        if not self.keywords or not buf:
            return
        size = len(buf)
        pos = 0
        while pos < size:
            cut = buf.find(b"\n", min(pos + SLICE, size - 1))
            stop = size if cut < 0 else cut + 1
            yield from self._slice(buf, pos, stop, max_line)  # a list: one generator level per line
            pos = stop

    def _rules_of(self, seen: tuple[int, ...]) -> frozenset[int]:
        """The rules a line must see, given the patterns found in it (indexes, repeats allowed)."""
        picked = frozenset().union(*[self.kw_of[i] for i in seen])
        if not picked:
            return picked
        return self._resolve(picked, frozenset().union(*[self.sat_of[i] for i in seen]))

    def _anchored(self, low: bytes, base: int, max_line: int) -> list[LineHit]:
        """Both passes over one slice: the keyword lines first, then what they leave open."""
        assert self._anchors is not None
        find, rfind = low.find, low.rfind
        kinds = self._line_kind
        # First pass: per line, the anchors found. A line is uncertain (``cut``) where one was cut
        # off at max_line (a keyword inside it may still count) or may hide an overlapping
        # keyword; the full pass over every pattern decides those.
        lines: list[list] = []  # [start, end, rules]; rules None: a second pass decides
        full: list[int] = []  # indexes into lines: every pattern decides
        guard: list[tuple[int, frozenset[int]]] = []  # (index, its rules before the literals)
        seen: list[int] = []
        cur_start = cur_end = -1
        cut = False
        done, guarded, tails = self._DONE, self._GUARD, self._anchor_tails
        startswith = low.startswith
        # One more (end-of-slice) anchor settles the last line: the loop body is written once.
        matches = self._anchors.find_matches_as_indexes(low)
        matches.append((-1, len(low) + 1, len(low) + 1))
        for a, start, end in matches:
            if start >= cur_end:  # the first anchor of a later line: settle this one
                if seen or cut:
                    key = tuple(seen)
                    got = None if cut else kinds.get(key)
                    if got is None:
                        if len(kinds) > 4096:
                            kinds.clear()  # bounded: a hostile mix of keywords cannot grow it forever
                        got = (self._FULL, frozenset()) if cut else self._kind_of(key)
                        if not cut:
                            kinds[key] = got
                    kind, rules = got
                    if kind == done:
                        lines.append([cur_start, cur_end, rules])
                    else:
                        if kind == guarded:
                            guard.append((len(lines), rules))
                        else:
                            full.append(len(lines))
                        lines.append([cur_start, cur_end, None])
                if a < 0:
                    break
                cur_start = rfind(b"\n", 0, start) + 1
                cur_end = find(b"\n", end)
                if cur_end < 0:
                    cur_end = len(low)
                seen = []
                cut = False
            if end - cur_start <= max_line and not (tails[a] and startswith(tails[a], end)):
                seen.append(a)
            else:
                cut = True  # a keyword cut off at max_line, or one overlapping this anchor: the full pass decides
        if full:
            spans = [(lines[k][0], lines[k][1]) for k in full]
            for k, rules in zip(full, self._second_pass(low, spans, max_line)):
                lines[k][2] = rules
        if guard:
            spans = [(lines[k][0], lines[k][1]) for k, _r in guard]
            for (k, picked), satisfied in zip(guard, self._literals_in(low, spans, max_line)):
                lines[k][2] = self._resolve(picked, satisfied)
        return [(base + s, base + e, r) for s, e, r in lines if r]

    def _line_walk(self, ac: "BytesAhoCorasick", low: bytes, spans: Sequence[tuple[int, int]],
                   max_line: int) -> list[list[int]]:
        """Per span, the indexes of the patterns of ``ac`` found in it (overlapping, within
        max_line), from one search over the spans joined by newlines."""
        out: list[list[int]] = [[] for _ in spans]
        joined = b"\n".join([low[a:b] for a, b in spans])
        ends = list(accumulate([b - a + 1 for a, b in spans]))  # line j ends (its newline) at ends[j] - 1
        j, j_start, j_end = 0, 0, ends[0] - 1
        seen = out[0]
        for i, start, end in ac.find_matches_as_indexes(joined, overlapping=True):
            if start > j_end:  # a later line (a match never holds the newline between two)
                while start > j_end:
                    j += 1
                    j_start, j_end = j_end + 1, ends[j] - 1
                seen = out[j]
            if end - j_start <= max_line:
                seen.append(i)
        return out

    def _second_pass(self, low: bytes, spans: Sequence[tuple[int, int]], max_line: int) -> list[frozenset[int]]:
        """The rules of each span, from every pattern (keywords and literals) it holds."""
        known = self._known
        out = []
        for seen in self._line_walk(self._ac, low, spans, max_line):  # type: ignore[arg-type]
            key = tuple(seen)
            rules = known.get(key)
            if rules is None:
                if len(known) > 4096:
                    known.clear()  # bounded, as above
                rules = known[key] = self._rules_of(key) if key else frozenset()
            out.append(rules)
        return out

    def _literals_in(self, low: bytes, spans: Sequence[tuple[int, int]], max_line: int) -> list[frozenset[int]]:
        """Per span, the guarded rules whose required literal it holds."""
        if self._lit_ac is None:
            return [frozenset() for _ in spans]
        sat = self._lit_sat
        return [frozenset().union(*[sat[i] for i in seen]) if seen else frozenset()
                for seen in self._line_walk(self._lit_ac, low, spans, max_line)]

    def _slice(self, buf: bytes, base: int, stop: int, max_line: int) -> list[LineHit]:
        """The lines of ``buf[base:stop]`` (whole lines) a rule must see, with absolute offsets."""
        low = buf[base:stop].lower()
        if self._anchors is not None:
            return self._anchored(low, base, max_line)
        out: list[LineHit] = []
        find, rfind = low.find, low.rfind
        kw_of, sat_of, resolve = self.kw_of, self.sat_of, self._resolve
        if self._ac is not None:
            empty: frozenset[int] = frozenset()
            cur_start = cur_end = -1
            picked = satisfied = empty
            # Matches come ordered by their end; a pattern never spans a newline, so one
            # line's matches are consecutive and each starts at or after its line's start.
            for i, start, end in self._ac.find_matches_as_indexes(low, overlapping=True):
                if start >= cur_end:
                    if picked:
                        rules = resolve(picked, satisfied)
                        if rules:
                            out.append((base + cur_start, base + cur_end, rules))
                    cur_start = rfind(b"\n", 0, start) + 1
                    cur_end = find(b"\n", end)
                    if cur_end < 0:
                        cur_end = len(low)
                    picked = satisfied = empty
                if end - cur_start > max_line:
                    continue
                kp, sp = kw_of[i], sat_of[i]
                if kp and not kp <= picked:
                    picked = picked | kp
                if sp and not sp <= satisfied:
                    satisfied = satisfied | sp
            if picked:
                rules = resolve(picked, satisfied)
                if rules:
                    out.append((base + cur_start, base + cur_end, rules))
            return out
        assert self._re is not None
        search = self._re.search
        i = 0
        while True:
            m = search(low, i)
            if m is None:
                return out
            start = rfind(b"\n", 0, m.start()) + 1
            end = find(b"\n", m.end())
            if end < 0:
                end = len(low)
            line = low[start:min(end, start + max_line)]
            present = [j for j, p in enumerate(self._encoded) if p in line]
            picked = frozenset().union(*(kw_of[j] for j in present))
            if picked:
                rules = resolve(picked, frozenset().union(*(sat_of[j] for j in present)))
                if rules:
                    out.append((base + start, base + end, rules))
            i = end + 1
