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

Without ahocorasick_rs (a broken install) a combined regex of the escaped
patterns selects the lines instead, and each selected line is checked for every
pattern; slower on large buffers, same result.

The buffer is lower-cased and searched in slices of about ``SLICE`` bytes cut at
line ends, so a hostile file full of keywords costs bounded memory per slice
rather than one match tuple per keyword for the whole file at once.
"""
from __future__ import annotations

import re
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
            self._anchors = BytesAhoCorasick([k.encode("ascii") for k in self.keywords], matchkind=MatchKind.LeftmostFirst)
        self._re = None
        if self.keywords and self._ac is None:
            # Longest first, so the alternation prefers the longer of two patterns at one offset.
            self._re = re.compile(b"|".join(re.escape(k) for k in sorted(self._encoded, key=len, reverse=True)))

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

    def _keyword_lines(self, low: bytes) -> list[tuple[int, int]]:
        """(start, end) of every line of ``low`` holding a keyword (first pass, leftmost-first).

        Non-overlapping matches still find every such line: the scan reaches each line's start
        with no match in progress (keywords hold no newline), and from there the leftmost
        keyword of the line is found."""
        assert self._anchors is not None
        find, rfind = low.find, low.rfind
        spans = []
        cur_end = -1
        for _i, start, end in self._anchors.find_matches_as_indexes(low):
            if start < cur_end:
                continue
            line_start = rfind(b"\n", 0, start) + 1
            cur_end = find(b"\n", end)
            if cur_end < 0:
                cur_end = len(low)
            spans.append((line_start, cur_end))
        return spans

    def _two_pass(self, low: bytes, base: int, max_line: int) -> list[LineHit]:
        out: list[LineHit] = []
        spans = self._keyword_lines(low)
        if not spans:
            return out
        kw_of, sat_of, resolve = self.kw_of, self.sat_of, self._resolve
        # The second pass runs over the keyword lines alone, joined by newlines; a match's
        # offset there maps back to its line by walking the spans in order.
        joined = b"\n".join([low[a:b] for a, b in spans])
        empty: frozenset[int] = frozenset()
        picked = satisfied = empty
        j = 0
        j_start, j_end = 0, spans[0][1] - spans[0][0]
        for i, start, end in self._ac.find_matches_as_indexes(joined, overlapping=True):  # type: ignore[union-attr]
            while start > j_end:  # a later line (a match never holds the newline between them)
                if picked:
                    rules = resolve(picked, satisfied)
                    if rules:
                        out.append((base + spans[j][0], base + spans[j][1], rules))
                picked = satisfied = empty
                j += 1
                j_start = j_end + 1
                j_end = j_start + spans[j][1] - spans[j][0]
            if end - j_start > max_line:
                continue
            kp, sp = kw_of[i], sat_of[i]
            if kp and not kp <= picked:
                picked = picked | kp
            if sp and not sp <= satisfied:
                satisfied = satisfied | sp
        if picked:
            rules = resolve(picked, satisfied)
            if rules:
                out.append((base + spans[j][0], base + spans[j][1], rules))
        return out

    def _slice(self, buf: bytes, base: int, stop: int, max_line: int) -> list[LineHit]:
        """The lines of ``buf[base:stop]`` (whole lines) a rule must see, with absolute offsets."""
        low = buf[base:stop].lower()
        if self._anchors is not None:
            return self._two_pass(low, base, max_line)
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
