"""The rules of one source in priority order, with their keyword prefilter (scan.py reads it).

Built by the catalog (``Catalog.index``) once per source; it holds the rules as the catalog
made them and needs nothing of the catalog's but their priority, id, keywords and factors.
"""
from __future__ import annotations

from typing import Any, Sequence

from .prefilter import Prefilter


class SourceIndex:
    """The rules of one source in priority order, with their keyword prefilter."""

    def __init__(self, rules: Sequence[Any]):
        self.rules = sorted(rules, key=lambda r: (-r.priority, r.id))
        by_kw: dict[str, list[int]] = {}
        factors: dict[int, frozenset[str]] = {}
        for pos, rule in enumerate(self.rules):
            for kw in rule.keywords:
                by_kw.setdefault(kw.lower(), []).append(pos)
            if rule.required:
                factors[pos] = rule.required
        self.prefilter = Prefilter(by_kw, factors)
        # Lines of one kind repeat by the thousand: the rule list of a set of positions is built once.
        self._ordered: dict[frozenset[int], list[Any]] = {}

    def ordered(self, positions: "frozenset[int]") -> list[Any]:
        """The rules at these positions, highest priority first."""
        rules = self._ordered.get(positions)
        if rules is None:
            if len(self._ordered) > 4096:
                self._ordered.clear()  # bounded: a hostile mix of keywords cannot grow it forever
            rules = self._ordered[positions] = [self.rules[i] for i in sorted(positions)]
        return rules
