"""Symptoms and coverage as plain JSON values, to cross the pipe from a forked helper (parallel.py).

The analysis runs as root on job-written logs, so nothing that crosses a pipe is ever
unpickled: a helper sends JSON, which can only ever become lists, dicts, strings and
numbers, and this module rebuilds the model objects from that by position.

Exactness: a helper's result must equal what this process would have computed. So a
result whose values JSON cannot carry as they are (a tuple in ``fields`` would come back a
list, a str subclass a str, an attribute set on a symptom would be lost) is not encoded:
``encode`` returns None and the parent redoes that file itself.
"""
from __future__ import annotations

from dataclasses import fields as dc_fields
from typing import Any, Optional

from ..model import Coverage, Evidence, Status, Symptom

# A rule's symptom carries no reasoning yet (its Status is the default): not sent, made anew.
_SYM = tuple(f.name for f in dc_fields(Symptom) if f.name != "status")
_NO_STATUS = Status()
_EV = tuple(f.name for f in dc_fields(Evidence))
_COV = tuple(f.name for f in dc_fields(Coverage))
_SYM_KEYS = frozenset(_SYM)
_SCALAR = frozenset({str, int, float, bool, type(None)})  # exact types: a subclass is not carried


def _plain(value: Any, depth: int = 0) -> bool:
    """Whether JSON gives ``value`` back equal and of the same types."""
    t = type(value)
    if t in _SCALAR:
        return True
    if depth > 16:
        return False
    if t is list:
        return all(_plain(v, depth + 1) for v in value)
    if t is dict:
        return all(type(k) is str and _plain(v, depth + 1) for k, v in value.items())
    return False


def _scalars(values: Any) -> bool:
    return _SCALAR.issuperset(map(type, values))


def encode(result: tuple[list[Symptom], list[Coverage]]) -> Optional[list[Any]]:
    """[symptoms, coverage] as JSON values by position; None when it cannot be carried exactly."""
    symptoms, coverage = result
    out_s = []
    for s in symptoms:
        d = dict(s.__dict__)
        if type(s) is not Symptom or d.pop("status", None) != _NO_STATUS or tuple(d) != _SYM:
            return None  # an extra or reordered attribute, or reasoning already: not ours to carry
        row = list(d.values())  # in field order: _SYM, checked above
        evidence = row[-1]
        if not _scalars(row[:-2]) or type(row[-2]) is not dict or not _plain(row[-2]) or type(evidence) is not list:
            return None
        if not all(type(e) is Evidence for e in evidence):
            return None
        evs = [list(e.__dict__.values()) for e in evidence]  # frozen: always in field order
        if not all(len(ev) == len(_EV) and _scalars(ev) for ev in evs):
            return None
        row[-1] = evs
        out_s.append(row)
    out_c = []
    for c in coverage:
        if type(c) is not Coverage or tuple(c.__dict__) != _COV:
            return None
        row = list(c.__dict__.values())
        if not _scalars(row):
            return None
        out_c.append(row)
    return [out_s, out_c]


def _evidence(values: list[Any]) -> Evidence:
    """Evidence(*values) without the frozen dataclass's per-field object.__setattr__ (thousands per
    bundle); the same object: a frozen dataclass keeps its fields in __dict__ like any other."""
    if type(values) is not list or len(values) != len(_EV) or not _scalars(values):
        raise ValueError("evidence row")
    e = object.__new__(Evidence)
    e.__dict__.update(zip(_EV, values))
    return e


def decode(value: Any) -> tuple[list[Symptom], list[Coverage]]:
    """The inverse of ``encode``; ValueError on anything else (the parent then redoes the file)."""
    try:
        rows_s, rows_c = value
        symptoms = []
        n = len(_SYM)
        for row in rows_s:
            if (type(row) is not list or len(row) != n or not _scalars(row[:-2]) or type(row[-2]) is not dict
                    or type(row[-1]) is not list):
                raise ValueError("symptom row")
            row[-1] = [_evidence(ev) for ev in row[-1]]
            s = object.__new__(Symptom)
            s.__dict__.update(zip(_SYM, row))
            s.__dict__["status"] = Status()
            symptoms.append(s)
        coverage = [Coverage(*row) for row in rows_c]
    except (TypeError, ValueError) as err:
        raise ValueError(f"malformed helper result: {err}") from err
    return symptoms, coverage
