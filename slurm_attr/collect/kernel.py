"""The node's kernel messages for the job's time window.

Sources: ``journalctl -k`` (times asked of journald), ``dmesg`` (wall-clock
times via ``--time-format iso``), or a file (what the test cluster uses; lines as
journalctl or ``dmesg -T`` print them). Lines whose time cannot be read are kept:
losing a fatal Xid matters more than a few extra lines.
"""
from __future__ import annotations

import hashlib
import os
import re
import subprocess
import time
from dataclasses import dataclass, field
from datetime import datetime

from .. import safefs
from ..errors import UnsafePath

# Timestamps the three sources print at the start of a line.
_ISO = re.compile(r"^\[?(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:[.,]\d+)?(?:[+-]\d\d:?\d\d|Z)?)")
_DMESG_T = re.compile(r"^\[(?:\w{3} )?(\w{3})\s+(\d+) (\d\d:\d\d:\d\d) (\d{4})\]")
_SYSLOG = re.compile(r"^(\w{3})\s+(\d+) (\d\d:\d\d:\d\d) ")
_MONTHS = {m: i for i, m in enumerate("Jan Feb Mar Apr May Jun Jul Aug Sep Oct Nov Dec".split(), 1)}


@dataclass
class KernelWindow:
    text: bytes
    status: str  # ok | missing | error | truncated
    detail: str = ""
    # Filled by the node collector (collect/node.py read_kernel), not by the readers here:
    span: dict = field(default_factory=dict)  # window.Window.to_dict(): where start/end came from
    attributed: bytes = b""  # lines an earlier job already owns (ledger.py), moved out of text
    attributed_lines: list = field(default_factory=list)  # [{line, key, job_id, recorded}] for those
    ledger: dict = field(default_factory=dict)  # {status, detail} of the ledger step, when it ran


def line_time(line: str, year: int) -> float | None:
    """Epoch seconds of a kernel line's leading timestamp, or None."""
    m = _ISO.match(line)
    if m:
        stamp = m.group(1).replace(",", ".")
        if stamp.endswith("Z"):
            stamp = stamp[:-1] + "+00:00"
        try:
            dt = datetime.fromisoformat(stamp)
        except ValueError:
            return None
        return dt.timestamp()
    m = _DMESG_T.match(line)
    if m:
        mon, day, hms, yr = m.groups()
        return _local_epoch(int(yr), _MONTHS.get(mon, 0), int(day), hms)
    m = _SYSLOG.match(line)
    if m:
        mon, day, hms = m.groups()
        return _local_epoch(year, _MONTHS.get(mon, 0), int(day), hms)
    return None


def _local_epoch(year: int, month: int, day: int, hms: str) -> float | None:
    if not month:
        return None
    try:
        h, mi, s = (int(x) for x in hms.split(":"))
        return time.mktime((year, month, day, h, mi, s, 0, 0, -1))
    except (ValueError, OverflowError):
        return None


def filter_window(data: bytes, start: float, end: float) -> bytes:
    """Keep lines inside [start, end]; lines without a readable time are kept."""
    year = time.localtime(end).tm_year
    out = []
    for raw in data.split(b"\n"):
        if not raw:
            continue
        t = line_time(safefs.decode(raw[:64]), year)
        if t is None or start <= t <= end:
            out.append(raw)
    return b"\n".join(out) + (b"\n" if out else b"")


def _run(cmd: list[str], cap: int, timeout: float) -> KernelWindow:
    try:
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout,
                              stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        return KernelWindow(b"", "missing", f"{cmd[0]} not installed")
    except subprocess.TimeoutExpired:
        return KernelWindow(b"", "error", f"{cmd[0]} timed out after {timeout:.0f}s")
    if proc.returncode != 0:
        return KernelWindow(b"", "error", f"{cmd[0]} exit {proc.returncode}: {proc.stderr[:200].decode(errors='replace').strip()}")
    data = proc.stdout
    if len(data) > cap:
        # Keep the end: the failure is at the end of the job's window.
        cut = data[-cap:]
        return KernelWindow(cut[cut.find(b"\n") + 1:], "truncated", f"kept last {cap} of {len(data)} bytes")
    return KernelWindow(data, "ok")


def read_window(source: str, kernel_file: str, node: str, start: float, end: float,
                cap: int, timeout: float) -> KernelWindow:
    """Kernel lines of [start, end] from the configured source, at most ``cap`` bytes."""
    if source == "journalctl":
        return _run(["journalctl", "-k", "-q", "--no-pager", "-o", "short-iso",
                     "--since", f"@{int(start)}", "--until", f"@{int(end) + 1}"], cap, timeout)
    if source == "dmesg":
        win = _run(["dmesg", "--time-format", "iso"], cap * 4, timeout)
        if win.status in ("ok", "truncated"):
            win.text = filter_window(win.text, start, end)
            if len(win.text) > cap:
                win.text = win.text[-cap:]
                win.status = "truncated"
        return win
    path = kernel_file.replace("%n", node)
    # The file is admin-owned (not job-written), but still bounded and not followed if a link.
    try:
        res = safefs.read_file(os.path.dirname(path) or "/", os.path.basename(path), cap * 4, tail=True)
    except UnsafePath as err:
        return KernelWindow(b"", "missing", str(err))
    text = filter_window(res.data, start, end)
    status = "truncated" if res.truncated else "ok"
    if len(text) > cap:
        text = text[-cap:]
        status = "truncated"
    return KernelWindow(text, status, f"{path}")


# "<time> <host> kernel: <message>" (journalctl short-iso / syslog) or "[<time>] <message>" (dmesg).
_PREFIX = re.compile(r"^(?:\[[^\]]{1,64}\]\s*|\S{10,40}\s+(?:\S+\s+kernel:\s*)?)")


def _message(line: str) -> str:
    """The line without its time and host prefix, whitespace collapsed."""
    m = _PREFIX.match(line)
    msg = line[m.end():] if m else line
    idx = msg.find("kernel: ")
    if 0 <= idx < 64:
        msg = msg[idx + 8:]
    return " ".join(msg.split())


def line_key(node: str, line: str, year: "int | None" = None) -> str:
    """Stable identity of one kernel event on one node: sha256(node, whole seconds, message)[:32]."""
    t = line_time(line, year or time.localtime().tm_year)
    stamp = str(int(t)) if t is not None else ""
    raw = "\0".join((node, stamp, _message(line if t is not None else line.strip())))
    return hashlib.sha256(raw.encode("utf-8", errors="replace")).hexdigest()[:32]
