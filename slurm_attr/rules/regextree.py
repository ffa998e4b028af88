"""A Python regex's parse tree: as much of it as literals.py reads, by public means.

literals.py proves which literals every match of a rule's regex contains by walking the
regex's parse tree. The standard library has such a parser, but it is private
(``re._parser``, ``sre_parse`` before 3.11, deprecated aliases since) and its node kinds
change between the Pythons this project runs on (3.13 added FAILURE, 3.11 moved the
module). So this is a small parser of its own, a copy of the shape of ``re._parser``'s
``_parse_sub``/``_parse`` (CPython 3.11-3.14) in what decides the literals:

- a run of literal characters, anchors between them, and escapes decoded as ``re`` decodes
  them (``\\x41`` is "A", ``\\d`` a class, ``\\1`` a back-reference, ``\\012`` octal);
- a one-character set is that character (``[.]`` is "."), and a branch of single
  characters is a set (``a|b``): neither is a literal run;
- a branch's common leading items move out in front of it (``foo(?:barX|barY)`` requires
  "foobar" and one of "x", "y"), compared as ``re`` compares them: leaves by value, groups,
  repeats and branches never;
- a non-capturing group without flags is part of the sequence around it.

Only patterns that ``re.compile`` accepts are parsed (``parse`` compiles first), so syntax
errors are ``re``'s to report; what this parser does not expect raises ValueError, and
literals.py then proves nothing. tests/unit/test_rules_regextree.py compares this tree with
the running Python's own parser on every rule of the catalog.
"""
from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass, field
from typing import Any, Union

_SPECIAL = ".\\[{()*+?^$|"
_REPEAT = "*+?{"
_DIGITS = "0123456789"
_OCTAL = "01234567"
_HEX = "0123456789abcdefABCDEF"
_WHITESPACE = " \t\n\r\v\f"
_SIMPLE_ESCAPES = {"a": "\a", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v", "\\": "\\"}
_ANCHOR_ESCAPES = frozenset("AbBZz")  # \z: 3.14's spelling of \Z (re.compile refuses it before)
_CLASS_ESCAPES = frozenset("dDsSwW")
_FLAG_LETTERS = "aiLmsux"


# Leaves are tuples, equal by value as re's leaves are:
#   ("lit", "c")  ("notlit", "c")  ("at", "^")  ("any",)  ("ref", 1)
#   ("set", negated, (("lit", "c") | ("range", lo, hi) | ("cat", "d"), ...))
Leaf = tuple


@dataclass(eq=False)
class Group:
    """A capturing group, or one with scoped flags (``(?i:...)``); equal only to itself."""

    items: list["Node"]
    ignorecase: bool = False


@dataclass(eq=False)
class Repeat:
    """``x*``, ``x+``, ``x?``, ``x{m,n}`` (greedy, lazy or possessive): ``lo`` is the minimum."""

    lo: int
    items: list["Node"]


@dataclass(eq=False)
class Branch:
    alternatives: list[list["Node"]]


@dataclass(eq=False)
class Atomic:
    items: list["Node"]


@dataclass(eq=False)
class Opaque:
    """A lookaround or a conditional group: nothing of it is required of a match. (An empty
    negative lookahead, ``(?!)``, is one too; 3.13's tree calls it FAILURE. It never
    matches, so what a branch of it requires does not matter.)"""

    items: list["Node"] = field(default_factory=list)


Node = Union[Leaf, Group, Repeat, Branch, Atomic, Opaque]


@dataclass
class Tree:
    items: list[Node]
    flags: int  # the compiled pattern's flags: the caller's and a leading (?aiLmsux)


def parse(pattern: str, flags: int = 0) -> Tree:
    """The tree of ``pattern``; re.error (from re.compile) when ``re`` refuses it, ValueError
    when this parser meets what it does not expect, RecursionError when nested too deep."""
    compiled = re.compile(pattern, flags)
    parser = _Parser(pattern)
    items = parser.alternation(bool(compiled.flags & re.VERBOSE))
    if parser.pos != len(pattern):
        raise ValueError(f"unparsed text at {parser.pos}")
    return Tree(items, compiled.flags)


class _Parser:
    def __init__(self, text: str):
        self.text = text
        self.pos = 0
        self.groups = 1  # the next capturing group's number, as re counts them
        self.names: dict[str, int] = {}

    # -- tokens: one character, or a backslash and the one after it ----------------------

    def peek(self) -> str:
        if self.pos >= len(self.text):
            return ""
        return self.text[self.pos:self.pos + 2] if self.text[self.pos] == "\\" else self.text[self.pos]

    def get(self) -> str:
        tok = self.peek()
        if not tok:
            raise ValueError("unexpected end of pattern")
        self.pos += len(tok)
        return tok

    def match(self, tok: str) -> bool:
        if self.peek() == tok:
            self.pos += len(tok)
            return True
        return False

    def take_while(self, limit: int, chars: str) -> str:
        out = ""
        while len(out) < limit and self.peek() and self.peek() in chars:
            out += self.get()
        return out

    def skip_through(self, end: str) -> None:
        """Past the next ``end`` token (an escaped one does not count), or to the end."""
        while self.peek() and self.get() != end:
            pass

    def take_until(self, end: str) -> str:
        stop = self.text.find(end, self.pos)
        if stop < 0:
            raise ValueError(f"missing {end}")
        out, self.pos = self.text[self.pos:stop], stop + 1
        return out

    # -- alternation and sequence --------------------------------------------------------

    def alternation(self, verbose: bool) -> list[Node]:
        alts = [self.sequence(verbose)]
        while self.match("|"):
            alts.append(self.sequence(verbose))
        if len(alts) == 1:
            return alts[0]
        out: list[Node] = []
        while all(alts) and all(a[0] == alts[0][0] for a in alts[1:]):
            out.append(alts[0][0])  # a common leading item stands in front of the branch
            for a in alts:
                del a[0]
        members: list[Any] = []
        for a in alts:
            if len(a) != 1 or not isinstance(a[0], tuple):
                break
            if a[0][0] == "lit":
                members.append(a[0])
            elif a[0][0] == "set" and not a[0][1]:
                members.extend(a[0][2])
            else:
                break
        else:
            out.append(("set", False, tuple(dict.fromkeys(members))))
            return out
        out.append(Branch(alts))
        return out

    def sequence(self, verbose: bool) -> list[Node]:
        items: list[Node] = []
        while self.peek() and self.peek() not in "|)":
            tok = self.get()
            if verbose and tok in _WHITESPACE:
                continue
            if verbose and tok == "#":
                self.skip_through("\n")  # a comment, to the end of its line
                continue
            if tok[0] == "\\":
                items.append(self.escape(tok))
            elif tok not in _SPECIAL:
                items.append(("lit", tok))
            elif tok == "[":
                items.append(self.char_set())
            elif tok in _REPEAT:
                self.repeat(tok, items)
            elif tok == ".":
                items.append(("any",))
            elif tok == "(":
                self.group(items, verbose)
            else:  # ^ $
                items.append(("at", tok))
        # a non-capturing group without flags is part of the sequence around it
        out: list[Node] = []
        for item in items:
            out.extend(item.items if type(item) is _Plain else [item])
        return out

    def repeat(self, tok: str, items: list[Node]) -> None:
        lo = {"?": 0, "*": 0, "+": 1}.get(tok)
        if tok == "{":
            here = self.pos
            if self.peek() == "}":
                items.append(("lit", "{"))
                return
            low = self.take_while(len(self.text), _DIGITS)
            if self.match(","):
                self.take_while(len(self.text), _DIGITS)
            if not self.match("}"):
                items.append(("lit", "{"))  # not a repeat: a literal brace
                self.pos = here
                return
            lo = int(low) if low else 0
        if not items or isinstance(items[-1], (Repeat,)) or (isinstance(items[-1], tuple) and items[-1][0] == "at"):
            raise ValueError("nothing to repeat")
        last = items[-1]
        body = last.items if type(last) is _Plain else [last]
        self.match("?") or self.match("+")  # lazy or possessive: the same minimum
        items[-1] = Repeat(int(lo or 0), body)

    # -- groups ----------------------------------------------------------------------------

    def group(self, items: list[Node], verbose: bool) -> None:
        if not self.match("?"):
            items.append(Group(self.group_body(verbose, capture=True)))
            return
        char = self.get()
        if char == "P" and self.match("<"):
            self.names[self.take_until(">")] = self.groups
            items.append(Group(self.group_body(verbose, capture=True)))
        elif char == "P" and self.match("="):
            items.append(("ref", self.names[self.take_until(")")]))
        elif char == ":":
            items.append(_Plain(self.group_body(verbose)))
        elif char == "#":
            self.skip_through(")")
        elif char in "=!<":
            if char == "<":
                self.get()
            items.append(Opaque(self.group_body(verbose)))
        elif char == "(":
            self.take_until(")")
            yes = self.sequence(verbose)
            no = self.sequence(verbose) if self.match("|") else []
            self.close()
            items.append(Opaque(yes + no))
        elif char == ">":
            items.append(Atomic(self.group_body(verbose)))
        elif char in _FLAG_LETTERS or char == "-":
            self.flag_group(char, items, verbose)
        else:
            raise ValueError(f"unknown extension ?{char}")

    def flag_group(self, char: str, items: list[Node], verbose: bool) -> None:
        add = char + self.take_while(len(self.text), _FLAG_LETTERS) if char != "-" else ""
        remove = ""
        if char == "-" or self.match("-"):
            remove = self.take_while(len(self.text), _FLAG_LETTERS)
        if self.match(")"):
            return  # global flags, at the start: re.compile's flags say them
        if not self.match(":"):
            raise ValueError("bad flags")
        sub_verbose = (verbose or "x" in add) and "x" not in remove
        body = self.alternation(sub_verbose)
        self.close()
        items.append(Group(body, ignorecase="i" in add))

    def group_body(self, verbose: bool, capture: bool = False) -> list[Node]:
        if capture:
            self.groups += 1
        body = self.alternation(verbose)
        self.close()
        return body

    def close(self) -> None:
        if not self.match(")"):
            raise ValueError("missing )")

    # -- escapes and sets --------------------------------------------------------------------

    def escape(self, tok: str) -> Leaf:
        c = tok[1]
        if c in _ANCHOR_ESCAPES:
            return ("at", "\\Z" if c == "z" else tok)
        if c in _CLASS_ESCAPES:
            return ("set", False, (("cat", c),))
        if c == "0":
            return ("lit", chr(int(c + self.take_while(2, _OCTAL), 8)))
        if c in _DIGITS:
            digits = c
            if self.peek() and self.peek() in _DIGITS:
                digits += self.get()
                if digits[0] in _OCTAL and digits[1] in _OCTAL and self.peek() and self.peek() in _OCTAL:
                    return ("lit", chr(int(digits + self.get(), 8)))
            return ("ref", int(digits))
        return ("lit", self.escaped_char(tok))

    def escaped_char(self, tok: str) -> str:
        """The character of an escape that stands for one: ``\\n``, ``\\x41``, ``\\N{...}``, ``\\.``."""
        c = tok[1]
        if c in _SIMPLE_ESCAPES:
            return _SIMPLE_ESCAPES[c]
        width = {"x": 2, "u": 4, "U": 8}.get(c)
        if width:
            digits = self.take_while(width, _HEX)
            if len(digits) != width:
                raise ValueError(f"incomplete escape {tok}{digits}")
            return chr(int(digits, 16))
        if c == "N":
            if not self.match("{"):
                raise ValueError("missing {")
            return unicodedata.lookup(self.take_until("}"))
        if c.isascii() and c.isalpha():
            raise ValueError(f"bad escape {tok}")
        return c

    def class_member(self, tok: str) -> tuple:
        if tok[0] != "\\":
            return ("lit", tok)
        c = tok[1]
        if c in _CLASS_ESCAPES:
            return ("cat", c)
        if c == "b":
            return ("lit", "\b")  # in a set, \b is a backspace
        if c in _OCTAL:
            return ("lit", chr(int(c + self.take_while(2, _OCTAL), 8)))
        return ("lit", self.escaped_char(tok))

    def char_set(self) -> Leaf:
        negated = self.match("^")
        members: list[tuple] = []
        while True:
            tok = self.get()
            if tok == "]" and members:
                break
            first = self.class_member(tok)
            if not self.match("-"):
                members.append(first)
                continue
            tok2 = self.get()
            if tok2 == "]":
                members += [first, ("lit", "-")]
                break
            second = self.class_member(tok2)
            if first[0] != "lit" or second[0] != "lit":
                raise ValueError("bad character range")
            members.append(("range", first[1], second[1]))
        unique = tuple(dict.fromkeys(members))
        if len(unique) == 1 and unique[0][0] == "lit":
            return ("notlit" if negated else "lit", unique[0][1])
        return ("set", negated, unique)


@dataclass(eq=False)
class _Plain:
    """A non-capturing group without flags while its sequence is parsed (then spliced in)."""

    items: list[Node]
