"""Literals a regex cannot match without: a second, finer anchor for the prefilter.

A rule's keywords say which lines may concern it; its regex often demands more. In
real logs the difference is most of the work: ``mlx5_core`` opens thousands of
benign kernel lines, while the rule wants one of "Fatal error", "health
compromised", ...; NCCL's INFO chatter holds "NCCL" but not the WARN text a rule
needs. Every such line cost a decode and a regex search in Python.

``required_any(pattern)`` reads the regex's parse tree (regextree.py: a small parser of
the syntax ``re`` accepts, since the standard library's own parser is private) and returns
a set of lower-cased ASCII literals of which every match contains at least one - or None
when it cannot prove one. The prefilter finds those literals in the same Aho-Corasick pass
as the keywords and hands a line to a rule only when both are there. Like grep's and
ripgrep's literal extraction, it only ever skips lines the regex could not match: when in
doubt (case-insensitive parts, anything it does not understand) it returns None and the
keywords alone decide.
"""
from __future__ import annotations

import re
from typing import Iterable, Optional, Sequence

from .regextree import Atomic, Branch, Group, Node, Repeat, parse

MIN_LEN = 4  # shorter literals hit too many lines to be worth a check
_EDGES = " \t:;,.=-_()[]<>'\"/"  # trimmed before asking whether a keyword already holds a literal
Factor = frozenset  # of str: a match contains at least one of them


def _score(f: Factor) -> tuple[int, int]:
    """Longer shortest literal first (fewer chance hits), then fewer alternatives."""
    return (min(len(s) for s in f), -len(f))


class _Walk:
    """Collects the factors of one mandatory sequence; a run of literals is one factor."""

    def __init__(self) -> None:
        self.factors: list[Factor] = []
        self.run: list[str] = []

    def flush(self) -> None:
        if self.run:
            self.factors.append(frozenset(["".join(self.run)]))
            self.run = []

    def items(self, items: Sequence[Node]) -> None:
        for item in items:
            if isinstance(item, tuple) and item[0] == "lit" and item[1].isascii() and item[1] != "\n":
                self.run.append(item[1].lower())  # not a newline: lines are searched one by one
            elif isinstance(item, tuple) and item[0] == "at":
                continue  # an anchor consumes nothing: the literals around it stay adjacent
            elif isinstance(item, Group):
                if item.ignorecase:
                    self.flush()  # (?i:...) may match non-ASCII case variants: prove nothing there
                    continue
                self.items(item.items)  # a group is mandatory, and adjacent to what surrounds it
            elif isinstance(item, Atomic):
                self.items(item.items)
            elif isinstance(item, Repeat):
                self.flush()
                if item.lo >= 1:
                    best = best_factor(item.items)
                    if best:
                        self.factors.append(best)
            elif isinstance(item, Branch):
                self.flush()
                alts = [best_factor(alt) for alt in item.alternatives]
                if alts and all(alts):
                    self.factors.append(frozenset().union(*alts))  # type: ignore[arg-type]
            else:
                self.flush()  # a class, any-char, back-reference, lookaround: the run ends here


def _factors(items: Sequence[Node]) -> list[Factor]:
    walk = _Walk()
    walk.items(items)
    walk.flush()
    return [f for f in walk.factors if f and all(f)]


def best_factor(items: Sequence[Node]) -> Optional[Factor]:
    """The most selective factor of a parsed sequence, or None when it has none."""
    found = _factors(items)
    return max(found, key=_score) if found else None


def required_any(pattern: str, flags: int = 0, keywords: Iterable[str] = ()) -> Optional[Factor]:
    """Lower-cased ASCII literals, at least one in every match of ``pattern``; None if unproven.

    Only factors whose every literal has at least ``MIN_LEN`` characters are returned, and
    none that a keyword already implies (a literal inside a keyword, like "_core " in
    "mlx5_core": every line the keyword selects has it, so it filters nothing).
    """
    try:
        tree = parse(pattern, flags)
    except (re.error, RecursionError, OverflowError, ValueError, KeyError):
        return None
    if tree.flags & re.IGNORECASE:
        return None  # unicode case folding ('K' for k, 'ſ' for s): a lowered byte search could miss
    kws = [k.lower() for k in keywords]

    def implied(lit: str) -> bool:  # "_core " around "mlx5_core": the keyword's own text
        core = lit.strip(_EDGES)
        return not core or any(core in kw for kw in kws)

    found = [f for f in _factors(tree.items)
             if min(len(s) for s in f) >= MIN_LEN and not any(implied(lit) for lit in f)]
    return max(found, key=_score) if found else None
