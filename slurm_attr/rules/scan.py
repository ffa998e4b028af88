"""Finding rule matches in a buffer of log lines, fast.

Logs are mostly noise. Running every rule's regex on every line would cost
~150 regex searches per line; instead each source has a prefilter (prefilter.py):
the rules' literal keywords, and the literals their regexes cannot match without,
found by Aho-Corasick passes over the lower-cased buffer (C speed, no per-line
Python loop). Only lines a rule must see are decoded, and on those only those
rules run, highest priority first. The first rule that matches owns the line
(and, for a multi-line rule, the lines its match spans).

``matches`` is the per-line loop of a large analysis (the 129 MB bench bundle: ~33,000
matching lines in its 4 MiB kernel tails), so it counts no line numbers (the caller
counts newlines only up to the matches it keeps) and looks up each line's rule plan
once per set of rules.
"""
from __future__ import annotations

import re
from typing import Any, Iterator, Optional

from ..bundle import MAX_LINE
from ..safefs import decode
from .ruleindex import SourceIndex

# A catalog rule (catalog.Rule). The catalog builds the indexes scan reads (ruleindex.py), so
# scan takes its rules as they come and names no catalog type: data flows catalog -> scan.
Rule = Any

# Log prefixes to strip from continuation lines of a multi-line block, and to read a time from.
PREFIX = re.compile(
    r"""^(?:<\d{1,3}>)?(?:
        (?P<iso>\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?)\s+(?:\S+\s+)?kernel:\s?
      | (?P<syslog>[A-Z][a-z]{2}\s+\d{1,2}\s\d\d:\d\d:\d\d)\s+\S+\s+kernel:\s?
      | \[(?P<iso2>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?)\]\s
    )?
    (?:\[\s*(?P<uptime>\d+\.\d+)\]\s?
      | \[(?P<ctime>[A-Z][a-z]{2}\s[A-Z][a-z]{2}\s+\d{1,2}\s\d\d:\d\d:\d\d\s\d{4})\]\s?
    )?""",
    re.X,
)
# Rank prefixes launchers put on job output: srun --label, torchrun, Open MPI --tag-output; and
# torchrun's --tee/--log-dir prefix of older releases, `[default3]:`, whose number is the worker's
# local rank (stripped from continuation lines; it names no global rank).
RANK_PREFIX = re.compile(
    r"^\s*(?:(?P<label>\d{1,6}): |\[rank(?P<torch>\d{1,6})\]:?\s?|\[\d+,(?P<mpi>\d{1,6})\]<std(?:out|err)>:\s?"
    r"|\[default(?P<local>\d{1,4})\]:)"
)

# NCCL's own prefix on its debug lines: host:pid:tid [cudaDev].
NCCL_PREFIX = re.compile(r"(?:^|[\s\]])(?P<host>[A-Za-z0-9][\w.-]{0,127}):(?P<pid>\d+):(?P<tid>\d+) \[(?P<dev>\d+)\]")


# The collector's "<log file>: " prefix on a scheduler line (collect/controller.py), for a node
# daemon's own log file: SlurmdLogFile with %n or %h (slurmd-n07.log, slurmd.n07.log).
DAEMON_LOG = re.compile(r"^slurmd[-._](?P<node>[A-Za-z0-9][\w.-]{0,127}?)\.log: ")


def daemon_log_node(line: str) -> Optional[str]:
    """The node whose slurmd wrote this scheduler line, when its log file is named for the node."""
    m = DAEMON_LOG.match(line)
    return m.group("node") if m else None


def nccl_origin(line: str) -> tuple[Optional[str], Optional[int]]:
    """(host, CUDA device) from an NCCL debug line's prefix, after any rank prefix."""
    m = RANK_PREFIX.match(line)
    # launchers and loggers may put a timestamp first: look near the start, not only at it
    m2 = NCCL_PREFIX.search((line[m.end():] if m else line)[:200])
    if not m2:
        return None, None
    return m2.group("host"), int(m2.group("dev"))


def strip_prefix(line: str) -> str:
    """The message of a log line without its timestamp, host or rank prefix."""
    m = PREFIX.match(line)
    if m and m.end():
        line = line[m.end():]
    for _ in range(3):  # launchers stack them: srun's `4: ` before torch's `[rank4]: `
        m = RANK_PREFIX.match(line)
        if not m:
            break
        line = line[m.end():]
    return line.strip()


class RawHit:
    """A rule match: the first line's index in the buffer and the lines it spans.

    A plain class with slots: one is made per matching line, tens of thousands per bundle."""

    __slots__ = ("line_index", "rule", "match", "texts")

    def __init__(self, line_index: int, rule: Rule, match: "re.Match[str]", texts: list[str]):
        self.line_index = line_index
        self.rule = rule
        self.match = match
        self.texts = texts

    def __repr__(self) -> str:
        return f"RawHit({self.line_index}, {self.rule.id}, {self.texts[0][:60]!r})"


def _line_at(buf: bytes, start: int) -> tuple[str, int]:
    end = buf.find(b"\n", start)
    if end < 0:
        end = len(buf)
    raw = buf[start:min(end, start + MAX_LINE)]
    return decode(raw).rstrip("\r"), end


# One rule match: (byte offset of its first line, rule, match, the lines it spans).
Found = tuple[int, Rule, "re.Match[str]", list[str]]


def matches(index: SourceIndex, buf: bytes) -> Iterator[Found]:
    """Every rule match in ``buf`` (lines separated by b"\\n"), in line order, by byte offset.

    The per-line loop of an analysis: tens of thousands of matching lines in a large
    bundle, so it does no more per line than it must (no line numbers: a caller counts
    newlines only for the matches it keeps; safefs.decode inlined)."""
    if not index.rules or not buf:
        return
    skip_until = -1  # lines owned by a multi-line match are not looked at again
    plans: dict[frozenset[int], list[tuple[Rule, Any]]] = {}  # rules of a line -> (rule, its search when one line)
    for start, end, picked in index.prefilter.lines(buf, MAX_LINE):
        if start < skip_until:
            continue
        # safefs.decode, then the CR of a CRLF line; the checks skip the copies most lines need not
        line = (buf[start:end] if end - start <= MAX_LINE else buf[start:start + MAX_LINE]).decode("utf-8", "replace")
        if "\x00" in line:
            line = line.replace("\x00", "")
        if line.endswith("\r"):
            line = line.rstrip("\r")
        plan = plans.get(picked)
        if plan is None:
            if len(plans) > 4096:
                plans.clear()  # bounded, like SourceIndex.ordered
            plan = plans[picked] = [(r, r.regex.search if r.window == 1 else None) for r in index.ordered(picked)]
        for rule, search in plan:
            if search is not None:
                m = search(line)
                if m:
                    yield start, rule, m, [line]
                    break
                continue
            texts, next_start = [line], end + 1
            for _ in range(rule.window - 1):
                if next_start > len(buf):
                    break
                nxt, nend = _line_at(buf, next_start)
                texts.append(nxt)
                next_start = nend + 1
            window = "\n".join([line] + [strip_prefix(t) for t in texts[1:]])
            m = rule.regex.search(window)
            if m:
                used = 1 + window.count("\n", 0, m.end())
                yield start, rule, m, texts[:used]
                skip_until = start
                for _ in range(used):
                    nl = buf.find(b"\n", skip_until)
                    skip_until = len(buf) + 1 if nl < 0 else nl + 1
                break


def scan(index: SourceIndex, buf: bytes) -> Iterator[RawHit]:
    """Every rule match in ``buf`` (lines separated by b"\\n"), in line order, with its line index."""
    count = buf.count
    line_index = counted = 0  # newlines are counted up to here, lazily
    for start, rule, m, texts in matches(index, buf):
        line_index += count(b"\n", counted, start)
        counted = start
        yield RawHit(line_index, rule, m, texts)


_MONTHS = {m: i for i, m in enumerate("Jan Feb Mar Apr May Jun Jul Aug Sep Oct Nov Dec".split(), 1)}


def parse_time(line: str) -> tuple[Optional[str], Optional[float]]:
    """(ISO 8601 time, seconds since boot) a log line's prefix carries, each or None."""
    m = PREFIX.match(line)
    if not m:
        return None, None
    iso = m.group("iso") or m.group("iso2")
    if iso:
        iso = iso.replace(",", ".").replace(" ", "T", 1)
    elif m.group("ctime"):
        # dmesg -T: "Thu May  2 10:00:01 2024" (strptime is ten times slower than this)
        parts = m.group("ctime").split()
        month = _MONTHS.get(parts[1])
        iso = f"{parts[4]}-{month:02d}-{int(parts[2]):02d}T{parts[3]}" if month else None
    up = float(m.group("uptime")) if m.group("uptime") else None
    return iso, up


# A PG tag inside a PyTorch message: "[Rank 3]", "[PG 0 Rank 3]", "[PG ID 0 PG GUID 0(default_pg) Rank 3]".
PG_TAG = re.compile(r"\[(?:PG (?:ID )?(?P<pg>\d+)[^\]]{0,120}? )?Rank (?P<rank>\d{1,6})\]")


def rank_prefix(line: str) -> Optional[int]:
    """The global rank a line is from, by the launcher's prefixes and PyTorch's PG tag.

    torch's ``[rankN]:`` names the global rank; a PG tag does when it is the default group
    (a sub-group's tag gives the rank inside that group); Open MPI's tag and srun's
    ``--label`` give the task id, which under torchrun is one task per node, not a rank.
    """
    m = RANK_PREFIX.match(line)
    if m is None and "Rank " not in line:
        return None  # neither a launcher's prefix nor a PG tag: most lines, decided with one regex call
    torch = mpi = label = None
    rest = line
    for k in range(3):
        if k:
            m = RANK_PREFIX.match(rest)
        if not m:
            break
        if m.group("torch") is not None:
            torch = int(m.group("torch"))
        elif m.group("mpi") is not None:
            mpi = int(m.group("mpi"))
        elif m.group("label") is not None and label is None:
            label = int(m.group("label"))
        rest = rest[m.end():]
    if torch is not None:
        return torch
    tag = PG_TAG.search(rest[:400]) if "Rank " in rest else None
    if tag and tag.group("pg") in (None, "0"):
        return int(tag.group("rank"))
    return mpi if mpi is not None else label
