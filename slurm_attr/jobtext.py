"""Text a job wrote, made safe to show: in a terminal, the HTML report, a Slurm Comment.

Everything a job can write is hostile (DESIGN.md §5): its output lines, Flight Recorder
names, the stacks its worker server answers, file paths, exception messages. Printed raw,
``ESC[2K ESC[1A`` erases and rewrites lines of ours, ``ESC]0;...BEL`` retitles the admin's
window, and a bidi override (U+202E) shows a line in another order than it reads. So job
text goes through here on its way to any reader:

- ``line`` (one field on one line) and ``block`` (several lines, e.g. a stack) make every
  control character visible as an escape (``\\x1b``, ``\\x9b``, ``\\u202e``, ``\\n``): C0, DEL, C1
  (so no CSI or OSC sequence survives), Unicode format controls (bidi embeddings, overrides
  and isolates, zero-width characters, U+FEFF), line and paragraph separators, and lone
  surrogates (undecodable bytes, which would also make ``print`` raise). In ``line`` a newline
  or carriage return is an escape too: job text never starts a line that looks like ours.
  A tab is a space in ``line`` and stays in ``block``. Letters, CJK, accents and spaces of
  every script pass unchanged.
- ``quote`` is for job text inside a sentence of ours (a headline, a summary): a plain
  token (``gloo:all_reduce``, ``/home/ü/train.py``, ``<module>``) stays bare, anything else
  becomes ``"the job's words"``: its first line only, cut to a bounded length, with ``"`` and
  ``\\`` escaped, so a copied ``NVRM: Xid ...`` line reads as something the job said and not
  as kernel evidence of ours.

Colours are ours: callers sanitise the data first and style it afterwards.
"""
from __future__ import annotations

import re
import unicodedata
from typing import Any

CUT = "…"
# Categories made visible: controls, format controls (bidi, zero-width), lone surrogates,
# line and paragraph separators. Spaces (Zs), private use and unassigned code points stay:
# they move no cursor and hide nothing.
_ESCAPED = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})
# One plain token: nothing a sentence, a quote or a line break can be built from.
_TOKEN = re.compile(r"[\w.:/<>@+~=#-]+")


_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(ch: str) -> str:
    if ch in _NAMED:
        return _NAMED[ch]
    n = ord(ch)
    if n < 0x100:
        return f"\\x{n:02x}"
    return f"\\u{n:04x}" if n < 0x10000 else f"\\U{n:08x}"


def _show(ch: str, multiline: bool) -> str:
    if ch.isprintable():
        return ch
    if ch == "\t":
        return ch if multiline else " "
    if ch == "\n" and multiline:
        return ch
    return _escape(ch) if unicodedata.category(ch) in _ESCAPED else ch


def _printable(text: Any, multiline: bool) -> str:
    s = text if isinstance(text, str) else str(text)
    if s.isprintable():  # the common case: nothing to look at character by character
        return s
    return "".join(_show(ch, multiline) for ch in s)


def line(text: Any) -> str:
    """One field of job text for one line: every control character visible, newlines too."""
    return _printable(text, multiline=False)


def block(text: Any) -> str:
    """Job text of several lines (a stack, a log excerpt): newlines and tabs kept, every
    other control character visible."""
    return _printable(text, multiline=True)


def quote(text: Any, cap: int = 120) -> str:
    """Job text inside a sentence of ours: bare when one plain token of at most ``cap``
    characters, else its first line in double quotes, cut to ``cap`` characters (``…``
    inside the quotes says it was cut), quotes and backslashes escaped."""
    s = text if isinstance(text, str) else str(text)
    if len(s) <= cap and _TOKEN.fullmatch(s):
        return s
    first, _nl, rest = s.partition("\n")
    first = first.rstrip("\r")
    cut = bool(rest.strip()) or len(first) > cap
    body = line(first[:cap].replace("\\", "\\\\").replace('"', '\\"'))
    return f'"{body}{CUT if cut else ""}"'


def deep(value: Any) -> Any:
    """A copy of a JSON-shaped value (dicts, lists, strings, numbers) with every string,
    keys included, made a ``line``: for renderers that show many fields of a record."""
    if isinstance(value, str):
        return line(value)
    if isinstance(value, dict):
        return {(line(k) if isinstance(k, str) else k): deep(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [deep(v) for v in value]
    return value
