"""When did a symptom happen? Wall-clock seconds from the line's own timestamp.

Log lines carry time in many spellings; these are the ones training jobs and nodes print:
ISO 8601 (journalctl -o short-iso, Python logging ``2024-05-02 10:00:01,123``), dmesg -T
``[Thu May  2 10:00:01 2024]``, syslog ``May  2 10:00:01`` and glog (PyTorch C++,
torchrun) ``E502 10:00:01.123456`` (month not padded: ``E1206`` is Dec 6), which has no year.
All times become UTC seconds: a time with an offset (journalctl short-iso, job.json) is exact; a
local time without one (dmesg -T, glog, Python logging) is taken in the cluster's local offset,
which job.json's ISO times carry (the ``Clock``). A line without a time gets none; an untimed
line of the job's output may still be bounded by the timed lines around it (``bound_untimed``).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Mapping, Optional

from ..model import Symptom

_MONTHS = {m: i for i, m in enumerate("Jan Feb Mar Apr May Jun Jul Aug Sep Oct Nov Dec".split(), 1)}
# "_" between date and time: torchrun's "Root Cause" block (time : 2024-05-02_10:11:12)
_ISO = re.compile(r"(?<!\d)(?P<y>\d{4})-(?P<mo>\d\d)-(?P<d>\d\d)[T _](?P<h>\d\d):(?P<mi>\d\d):(?P<s>\d\d)(?:[.,](?P<f>\d{1,9}))?"
                  r"(?P<tz>Z|[+-]\d\d:?\d\d)?")
_CTIME = re.compile(r"\[?[A-Z][a-z]{2} (?P<mon>[A-Z][a-z]{2}) +(?P<d>\d{1,2}) (?P<h>\d\d):(?P<mi>\d\d):(?P<s>\d\d)(?:\.\d+)? (?P<y>\d{4})")
_SYSLOG = re.compile(r"^(?:<\d{1,3}>)?(?P<mon>[A-Z][a-z]{2}) +(?P<d>\d{1,2}) (?P<h>\d\d):(?P<mi>\d\d):(?P<s>\d\d)\s")
# glog: severity letter, MMDD, time; PyTorch puts it behind "[rankN]:[" and launchers behind "N: ".
# glog does not pad the month: E1206 is Dec 6, E321 is Mar 21.
_GLOG = re.compile(r"(?:^|[\s\[:])[IWEF](?P<mo>1[012]|0?[1-9])(?P<d>[0-3]\d) (?P<h>\d\d):(?P<mi>\d\d):(?P<s>\d\d)(?:\.(?P<f>\d{1,9}))?\s")
_HEAD = 64  # a timestamp is a prefix: a date inside a message (an exception text) is not the line's time


@dataclass(frozen=True)
class Clock:
    """How to read a job's log times: the year glog and syslog leave out, and the local UTC
    offset of times printed without one. One clock serves one decision: it remembers each
    symptom's time (by identity), which several reasoning steps ask for."""

    year: Optional[int] = None
    offset_s: float = 0.0
    # job.json without an offset (hand-made bundles): read every time as wall clock, offsets
    # dropped, rather than mix a naive job window with lines that name their zone
    honour_offsets: bool = True
    memo: dict = field(default_factory=dict, compare=False, hash=False, repr=False)


def _aware(value: str) -> Optional[datetime]:
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def clock_of(job: Mapping[str, Any]) -> Clock:
    year, offset, aware = None, 0.0, False
    for key in ("end_time", "start_time"):
        v = job.get(key)
        dt = _aware(v) if isinstance(v, str) and v else None
        if dt is None:
            continue
        year = year or dt.year
        if dt.utcoffset() is not None:
            offset, aware = dt.utcoffset().total_seconds(), True  # type: ignore[union-attr]
            break
    return Clock(year, offset, honour_offsets=aware)


def parse_iso(value: Any, clock: Optional[Clock] = None) -> Optional[float]:
    """An ISO 8601 time (job.json) as UTC seconds; without an offset it is the clock's local time."""
    if not isinstance(value, str) or not value:
        return None
    dt = _aware(value)
    if dt is None:
        return None
    clock = clock or Clock()
    if dt.tzinfo is None or not clock.honour_offsets:
        dt = dt.replace(tzinfo=timezone(timedelta(seconds=clock.offset_s)))
    return dt.timestamp()


def _mk(y: int, mo: int, d: int, h: str, mi: str, s: str, frac: Optional[str], offset_s: float) -> Optional[float]:
    try:
        dt = datetime(y, mo, d, int(h), int(mi), int(s), tzinfo=timezone(timedelta(seconds=offset_s)))
    except ValueError:
        return None
    return dt.timestamp() + (float("0." + frac) if frac else 0.0)


def _tz_seconds(tz: Optional[str], clock: Clock) -> float:
    if not tz or not clock.honour_offsets:
        return clock.offset_s
    if tz == "Z":
        return 0.0
    sign = -1 if tz[0] == "-" else 1
    digits = tz[1:].replace(":", "")
    return sign * (int(digits[:2]) * 3600 + int(digits[2:4]) * 60)


# What may stand before a line's timestamp: launcher labels and rank tags, pids in brackets, a level.
_BEFORE = re.compile(r"(?:[\s\d:\[\]<>|.,-]|rank|time|INFO|WARNING|WARN|ERROR|DEBUG|CRITICAL)*")


def _prefix_ok(head: str, m: "re.Match[str]") -> bool:
    return _BEFORE.fullmatch(head[:m.start()]) is not None


def line_time(text: str, clock: Optional[Clock] = None) -> Optional[float]:
    """UTC seconds of one log line's timestamp prefix, or None."""
    clock = clock or Clock()
    head = text[:_HEAD]
    m = _ISO.search(head)
    if m and _prefix_ok(head, m):
        return _mk(int(m["y"]), int(m["mo"]), int(m["d"]), m["h"], m["mi"], m["s"], m["f"], _tz_seconds(m["tz"], clock))
    m = _CTIME.search(head)
    if m and m["mon"] in _MONTHS and _prefix_ok(head, m):
        return _mk(int(m["y"]), _MONTHS[m["mon"]], int(m["d"]), m["h"], m["mi"], m["s"], None, clock.offset_s)
    if clock.year is None:
        return None  # the remaining spellings have no year: without the job's, no comparable time
    m = _SYSLOG.search(head)
    if m and m["mon"] in _MONTHS:
        return _mk(clock.year, _MONTHS[m["mon"]], int(m["d"]), m["h"], m["mi"], m["s"], None, clock.offset_s)
    m = _GLOG.search(head)
    if m and _prefix_ok(head, m):
        return _mk(clock.year, int(m["mo"]), int(m["d"]), m["h"], m["mi"], m["s"], m["f"], clock.offset_s)
    return None


def symptom_time(s: Symptom, clock: Optional[Clock] = None) -> Optional[float]:
    """The earliest time any of the symptom's evidence lines carries (its ISO ``time`` first)."""
    clock = clock or Clock()
    key = id(s)
    if key in clock.memo:
        return clock.memo[key]
    t = parse_iso(s.time, clock) if s.time else None
    if t is None:
        times = [x for x in (line_time(e.text, clock) for e in s.evidence if e.text) if x is not None]
        t = min(times) if times else None
    clock.memo[key] = t
    return t


def first_line(s: Symptom) -> tuple[str, int]:
    ev = s.evidence[0] if s.evidence else None
    return (ev.path or "", ev.line or 0) if ev else ("", 0)


_SEARCH_LINES = 400  # how far above and below an untimed line to look for a timed one


def bound_untimed(syms: list[Symptom], path: str, lines: list[str], clock: Clock) -> None:
    """Give untimed symptoms from ``path`` the times of the nearest timed lines around them.

    ``lines`` are the file's lines numbered as the analysers numbered them (1-based). Sets
    ``fields['time_bounds'] = [earliest, latest]`` (UTC seconds, None for unbounded): a
    traceback line is no earlier than the log line above it and no later than the one below."""
    cache: dict[int, Optional[float]] = {}

    def at(i: int) -> Optional[float]:
        if i not in cache:
            cache[i] = line_time(lines[i - 1], clock)
        return cache[i]

    for s in syms:
        ev = s.evidence[0] if s.evidence else None
        if ev is None or ev.path != path or not ev.line or not (1 <= ev.line <= len(lines)):
            continue
        if symptom_time(s, clock) is not None:
            continue
        lo = next((t for i in range(ev.line - 1, max(0, ev.line - _SEARCH_LINES), -1) if (t := at(i)) is not None), None)
        last = ev.line + len(s.evidence) - 1 if all(e.path == path for e in s.evidence) else ev.line
        hi = next((t for i in range(last + 1, min(len(lines), last + _SEARCH_LINES) + 1) if (t := at(i)) is not None), None)
        if lo is not None or hi is not None:
            s.fields["time_bounds"] = [lo, hi]
