"""Filling a rule's summary template without placeholder text (issue 9).

A template names fields (``rank {rank}: {exc}``, ``lost GPU {gpu}``, ``({reason}{value}{rc})``);
a line does not always carry them all. A missing field is left out together with the words that
only introduce it, never shown as "?":

- ``rank {rank}: {exc}: {message}`` without a rank  -> ``ValueError: ...``
- ``the job saw a lost GPU {gpu}`` without a GPU    -> ``the job saw a lost GPU``
- ``talking to {peer}`` without a peer              -> ``talking to a peer``
- ``({reason}{value}{rc})`` with only a reason      -> ``(port error)``
- ``(pid {pid})`` without a pid                      -> dropped
"""
from __future__ import annotations

import re
from typing import Any, Mapping

_HOLE = "\x00"
# Words that name the missing value itself ("rank 3", "GPU 0000:3b:00"): dropped with it when
# they end a clause, kept when the sentence reads on ("task on n1 exited").
_LABELS = r"(?:[Rr]ank|[Rr]anks|GPU|gpu|[Tt]ask|[Nn]ode|[Pp]ort|pid|[Jj]ob|seq|status|[Dd]evice|[Pp]eer|[Hh]ost|nvswitch|MC|CPU|code)"
# Prepositions before a missing object get a neutral object instead.
_OBJECT = {"peer": "a peer", "node": "a node", "host": "a host", "gpu": "a GPU", "rank": "a rank",
           "job": "the job", "device": "a device", "path": "a file", "comm": "a process", "server": "a server",
           "plugin": "a plugin"}
_PREPS = r"(?:to|from|with|on|by|of|for|in|at)"


class _Holes(dict):
    def __missing__(self, key: str) -> str:
        return f"{_HOLE}{key}{_HOLE}"


def fill(template: str, values: Mapping[str, Any]) -> str:
    """``template.format_map(values)`` with the missing fields' words removed (see module doc)."""
    try:
        text = template.format_map(_Holes(values))
    except (ValueError, IndexError, AttributeError, KeyError):
        return template
    if _HOLE not in text:
        return text
    hole = rf"{_HOLE}(\w+){_HOLE}"
    # "rank ?: ..." at the start of a clause: the label and its colon go.
    text = re.sub(rf"(^|[;(]\s*)(?:{_LABELS}\s*)?{hole}\s*:\s*", r"\1", text)
    # "(pid ?)", "(?)": a parenthesis that held only the missing value goes.
    text = re.sub(rf"\s*\((?:{_LABELS}\s*)?{hole}\)", "", text)
    # "after ? ms", "(? events)": a missing quantity goes with its unit.
    text = re.sub(rf"[:/]{hole}", "", text)  # "comm:pid", "ibdev/port": the attached part goes
    text = re.sub(rf"(?:\b(?:after|for|of|(?:more|less) than) )?{hole} ?(?:ms|s|seconds|bytes|[KMG]iB|events?)\b", "", text)
    # "talking to ?" -> "talking to a peer"; "on GPU ?" -> "on a GPU" when the field has a neutral word.
    text = re.sub(rf"\b({_PREPS}) (?:{_LABELS} )?{hole}",
                  lambda m: f"{m.group(1)} {_OBJECT[m.group(2)]}" if m.group(2) in _OBJECT else m.group(0), text)
    # whatever is left: the value goes, its label stays ("lost GPU", "task on n1").
    text = re.sub(rf" ?{hole}", "", text)
    # tidy what the removals left behind
    text = re.sub(r"\(\s*\)|\[\s*\]", "", text)
    text = re.sub(r"\(\s+", "(", text)
    text = re.sub(r"\s+\)", ")", text)
    text = re.sub(r"\s+([,;:])", r"\1", text)
    text = re.sub(r"\s{2,}", " ", text)
    text = re.sub(r"[\s,;:]+$", "", text)
    text = re.sub(rf"\b({_PREPS})$", "", text).rstrip()
    return text.strip() or template.split("{")[0].strip()
