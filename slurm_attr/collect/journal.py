"""Journal records of root system units, trusted by journald's own fields.

Some fatal hardware evidence is not in the kernel ring: Fabric Manager
(``nvidia-fabricmanager.service``) reports NVSwitch fatal errors through the
journal. Such a line is trusted only by the fields journald itself sets and a
client cannot choose (``_UID``, ``_SYSTEMD_UNIT``, ``_TRANSPORT``,
``__REALTIME_TIMESTAMP``): the record must come from uid 0 in one of the units the
site named (``[collect] journal_units``) through the journal/stdout/syslog
transport. A user's ``logger -t nv-fabricmanager ...`` has the user's ``_UID`` and
a session or ``user@`` unit, and is dropped. The record's text (MESSAGE) is the
root process's own; newlines and control characters in it are flattened so one
record is one line.

Written as ``nodes/<node>/journal.log``, one line per record in the shape the
rules know: ``<ISO time> <host> <identifier>[<pid>]: <message>``.
"""
from __future__ import annotations

import json
import re
import subprocess
from datetime import datetime, timezone
from typing import Any, Callable, Iterable, Optional

from .kernel import KernelWindow

TRUSTED_TRANSPORTS = frozenset({"journal", "stdout", "syslog"})
MAX_RECORDS = 20000
_UNIT = re.compile(r"^[A-Za-z0-9@._:\\-]{1,200}\.service$")
_CTRL = re.compile(r"[\x00-\x1f\x7f]+")


def parse_units(spec: str) -> list[str]:
    """`[collect] journal_units` as a list of systemd service names (bad names dropped)."""
    return [u for u in (s.strip() for s in spec.split(",")) if _UNIT.match(u)]


def _text(value: Any) -> Optional[str]:
    """journald prints MESSAGE as a string, or as a list of byte values when not UTF-8."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(b, int) and 0 <= b < 256 for b in value):
        return bytes(value).decode("utf-8", errors="replace")
    return None


def render(records: Iterable[str], units: list[str]) -> tuple[bytes, int, int]:
    """(lines, kept, dropped) from `journalctl -o json` output lines."""
    want = set(units)
    out: list[str] = []
    dropped = 0
    for raw in records:
        try:
            rec = json.loads(raw)
        except ValueError:
            dropped += 1
            continue
        if not isinstance(rec, dict):
            dropped += 1
            continue
        # Fields with a leading underscore are journald's, not the client's.
        if (rec.get("_UID") != "0" or rec.get("_SYSTEMD_UNIT") not in want
                or rec.get("_TRANSPORT") not in TRUSTED_TRANSPORTS):
            dropped += 1
            continue
        msg = _text(rec.get("MESSAGE"))
        ts = rec.get("__REALTIME_TIMESTAMP")
        if msg is None or not isinstance(ts, str) or not ts.isdigit():
            dropped += 1
            continue
        when = datetime.fromtimestamp(int(ts) / 1e6, timezone.utc).isoformat(timespec="seconds")
        ident = _text(rec.get("SYSLOG_IDENTIFIER")) or _text(rec.get("_COMM")) or "?"
        pid = rec.get("_PID") if isinstance(rec.get("_PID"), str) and rec["_PID"].isdigit() else "0"
        host = _text(rec.get("_HOSTNAME")) or "?"
        line = f"{when} {_CTRL.sub(' ', host)[:64]} {_CTRL.sub(' ', ident)[:64]}[{pid}]: {_CTRL.sub(' ', msg)[:16384]}"
        out.append(line)
        if len(out) >= MAX_RECORDS:
            break
    data = ("\n".join(out) + "\n").encode("utf-8", errors="replace") if out else b""
    return data, len(out), dropped


def read_units(units: list[str], start: float, end: float, cap: int, timeout: float,
               run: Optional[Callable[..., Any]] = None) -> KernelWindow:
    """Records of the named root units in [start, end], at most ``cap`` bytes (the end kept)."""
    run = run or subprocess.run
    if not units:
        return KernelWindow(b"", "missing", "no [collect] journal_units")
    # Same field twice = OR, different fields = AND: (unit a OR unit b) AND uid 0.
    matches = [f"_SYSTEMD_UNIT={u}" for u in units] + ["_UID=0"]
    cmd = ["journalctl", "-q", "--no-pager", "-o", "json", "-n", str(MAX_RECORDS),
           "--since", f"@{int(start)}", "--until", f"@{int(end) + 1}", *matches]
    try:
        proc = run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout, stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        return KernelWindow(b"", "missing", "journalctl not installed")
    except subprocess.TimeoutExpired:
        return KernelWindow(b"", "error", f"journalctl timed out after {timeout:.0f}s")
    if proc.returncode != 0:
        err = proc.stderr[:200].decode(errors="replace").strip()
        return KernelWindow(b"", "error", f"journalctl exit {proc.returncode}: {err}")
    text, kept, dropped = render(proc.stdout.decode("utf-8", errors="replace").splitlines(), units)
    detail = f"{kept} record(s) of {', '.join(units)}" + (f"; {dropped} not from a root unit, dropped" if dropped else "")
    if len(text) > cap:
        cut = text[-cap:]
        return KernelWindow(cut[cut.find(b"\n") + 1:], "truncated", detail + f"; kept the last {cap} bytes")
    return KernelWindow(text, "ok", detail)
