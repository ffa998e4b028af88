"""regextree.parse: the same tree as the running Python's own regex parser, where literals.py reads it.

The package does not import ``re._parser`` (private, and it changes between 3.11, 3.13 and
3.14); this test does, as the reference: on each Python that `make test` runs (3.11 here,
3.13 and 3.14 in the versions stage) every rule of the catalog and every pattern below must
parse to the same shape. When a release changes the stdlib's tree, this test names the
pattern and both shapes; literals.py keeps working on regextree's own tree meanwhile.
"""
from __future__ import annotations

import re
import sys
import warnings

import pytest

from slurm_attr.rules import load_catalog
from slurm_attr.rules.literals import required_any
from slurm_attr.rules.regextree import Atomic, Branch, Group, Opaque, Repeat, parse

sre = pytest.importorskip("re._parser", reason="this Python has no re._parser to compare with")
from re import _constants as C  # noqa: E402  (the reference, in the test only)

_AT = {C.AT_BEGINNING: "^", C.AT_END: "$", C.AT_BEGINNING_STRING: "\\A", C.AT_END_STRING: "\\Z",
       C.AT_BOUNDARY: "\\b", C.AT_NON_BOUNDARY: "\\B"}
_CAT = {C.CATEGORY_DIGIT: "d", C.CATEGORY_NOT_DIGIT: "D", C.CATEGORY_SPACE: "s", C.CATEGORY_NOT_SPACE: "S",
        C.CATEGORY_WORD: "w", C.CATEGORY_NOT_WORD: "W"}
_REPEATS = {C.MAX_REPEAT, C.MIN_REPEAT, getattr(C, "POSSESSIVE_REPEAT", C.MAX_REPEAT)}


def _member(op, av):
    if op is C.LITERAL:
        return ("lit", chr(av))
    if op is C.RANGE:
        return ("range", chr(av[0]), chr(av[1]))
    if op is C.CATEGORY:
        return ("cat", _CAT[av])
    raise AssertionError(f"set member {op} {av!r}: the stdlib's set changed")


def _stdlib_shape(items):
    out = []
    for op, av in items:
        if op is C.LITERAL:
            out.append(("lit", chr(av)))
        elif op is C.NOT_LITERAL:
            out.append(("notlit", chr(av)))
        elif op is C.AT:
            out.append(("at", _AT[av]))
        elif op is C.ANY:
            out.append(("any",))
        elif op is C.IN:
            negated = av[0][0] is C.NEGATE
            out.append(("set", negated, tuple(_member(o, a) for o, a in av[1 if negated else 0:])))
        elif op is C.GROUPREF:
            out.append(("ref", av))
        elif op is C.SUBPATTERN:
            out.append(("group", bool(av[1] & re.IGNORECASE), _stdlib_shape(av[3])))
        elif op is getattr(C, "ATOMIC_GROUP", None):
            out.append(("atomic", _stdlib_shape(av)))
        elif op in _REPEATS:
            out.append(("repeat", av[0], _stdlib_shape(av[2])))
        elif op is C.BRANCH:
            out.append(("branch", tuple(_stdlib_shape(alt) for alt in av[1])))
        elif op in (C.ASSERT, C.ASSERT_NOT):
            out.append(("opaque",))
        elif op is C.GROUPREF_EXISTS or op is getattr(C, "FAILURE", None):
            out.append(("opaque",))
        else:
            raise AssertionError(f"node {op} {av!r}: the stdlib's tree has a kind regextree does not know")
    return tuple(out)


def _our_shape(items):
    out = []
    for item in items:
        if isinstance(item, tuple):
            out.append(item)
        elif isinstance(item, Group):
            out.append(("group", item.ignorecase, _our_shape(item.items)))
        elif isinstance(item, Atomic):
            out.append(("atomic", _our_shape(item.items)))
        elif isinstance(item, Repeat):
            out.append(("repeat", item.lo, _our_shape(item.items)))
        elif isinstance(item, Branch):
            out.append(("branch", tuple(_our_shape(alt) for alt in item.alternatives)))
        else:
            assert isinstance(item, Opaque)
            out.append(("opaque",))
    return tuple(out)


def _same(pattern, flags=0):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "possible nested set" and the like: the tree is what counts
        reference = sre.parse(pattern, flags)
        ours = parse(pattern, flags)
    assert _our_shape(ours.items) == _stdlib_shape(reference), pattern
    assert ours.flags & (re.IGNORECASE | re.VERBOSE) == reference.state.flags & (re.IGNORECASE | re.VERBOSE)


def test_rules_regextree_matches_the_stdlib_on_every_catalog_rule():
    rules = load_catalog().rules
    assert len(rules) > 100
    for rule in rules:
        _same(rule.pattern)


# Each construct whose tree decides literals, with the near miss beside it.
TRICKY = [
    r"foo(?:barX|barY)", r"foo(?:barX|bazY)", r"foo(?:barX|quxY)",  # common prefix moved out, up to the first difference
    r"(?:a|b|[cd])x", r"(?:a|bc)x", r"(?:a|[^b])x",  # a branch of single characters is a set / is not
    r"(?:(?:ab)c|(?:ab)d)", r"(?:(ab)c|(ab)d)",  # a plain group is spliced in / a capture never equal
    r"(?:[ab]cd1|[ab]cd2)", r"(?:[ab]cd1|[ba]cd2)",  # sets compared by value, in order
    r"(x)(?:\1foo1|\1foo2)", r"(?P<n>x)(?:(?P=n)ab|\1ac)",  # a back-reference by number or name
    r"[.]x", r"[^.]x", r"[aa]", r"[a-]", r"[]a]", r"[^]a]", r"[\b]", r"[\d]x", r"\dx",
    r"\x41\u00e9\N{EM DASH}\0\012\101", r"(a)\1\123", r"x{2}", r"x{,3}", r"x{}", r"x{a}", r"x{2,}?", r"x++",
    r"(?:ab)+c", r"(?:ab)*?c", r"(?i:ab)cd", r"(?-i:ab)cd", r"(?s:a.b)", r"(?>abc)d", r"(?=abc)d", r"(?<!ab)cd",
    r"(a)?(?(1)ab|cd)ef", r"a(?#com\)ment)b", r"\bfoo\B\Abar\Z$^",
    "(?x) a b # comment \\\n c \\  d [ ]", "(?x:a b)c d", "(?x)a(?-x: b )c",
    r"(?i)abc", r"(?s)a.c",
]


@pytest.mark.parametrize("pattern", TRICKY)
def test_rules_regextree_matches_the_stdlib_on_tricky_constructs(pattern):
    _same(pattern)


def test_rules_regextree_prefix_moves_out_of_a_branch_only_when_shared():
    # the literals that come out show it: "foobar" (then one of x/y), against one of barx/quxy
    assert required_any(r"foo(?:barX|barY)") == {"foobar"}
    assert required_any(r"foo(?:barX|bazY)") == {"fooba"}
    assert required_any(r"foo(?:barX|quxY)") == {"barx", "quxy"}


def test_rules_regextree_escapes_are_decoded_and_classes_are_not_literals():
    assert required_any(r"\x4eCCL WARN") == {"nccl warn"}
    assert required_any(r"\dCCL WARN") == {"ccl warn"}  # \d is a class: the run starts after it
    assert required_any(r"NCC[L] WARN") == {"nccl warn"}  # a one-character set is that character
    assert required_any(r"NCC[LM] WARN") == {" warn"}  # two are a class


def test_rules_regextree_refuses_what_re_refuses():
    with pytest.raises(re.error):
        parse(r"(?P<x>a")
    with pytest.raises(re.error):
        parse(r"\q")
    assert parse(r"\.").items == [("lit", ".")]


def test_rules_regextree_end_of_string_as_each_python_spells_it():
    if sys.version_info >= (3, 14):  # \z is \Z there: one anchor, so the shared prefix moves out
        _same(r"(?:x\zfoo1|x\Zfoo2)")
        assert parse(r"a\z").items == [("lit", "a"), ("at", "\\Z")]
    else:
        with pytest.raises(re.error):  # near miss: before 3.14 re refuses it, and so does parse
            parse(r"a\z")
    assert parse(r"a\Z").items == [("lit", "a"), ("at", "\\Z")]
