"""A rank's CPU and storage-I/O counters from /proc, read boundedly.

The processes are a job's, so hostile: a process may name itself ``x) R 1 2 ...`` (the
``comm`` field of /proc/PID/stat is free text in parentheses), exit and have its PID
reused between two reads, or fork thousands of children. Each file is read once, at most
``READ_CAP`` bytes, without following links; the fields after ``comm`` are found from the
*last* ``)``; a process is known by (pid, start time), so a reused PID is a new process;
at most ``MAX_CHILDREN`` children of a rank are read (its data-loader workers).

CPU is utime + stime in clock ticks; I/O is ``read_bytes + write_bytes`` of /proc/PID/io,
the bytes that went to or from storage (a checkpoint, a dataset): the bytes through
sockets and terminals (``rchar``/``wchar``) are left out, since a stuck rank's logging
thread, or our own stack request, would move them. The stack request moves the storage
bytes and the CPU too (torch's worker server dumps the traceback through a file, seen on
the test cluster): busy.py reads the asked ranks' counters again after asking.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

READ_CAP = 4096
MAX_CHILDREN = 16
_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


@dataclass(frozen=True)
class Counters:
    start: int  # the process's start time (ticks since boot): with the pid, its identity
    uid: int  # the owner of /proc/PID
    cpu_ticks: int
    io_bytes: int | None  # None where /proc/PID/io is not ours to read


def _read(path: str) -> bytes | None:
    try:
        fd = os.open(path, _FLAGS)
    except OSError:
        return None
    try:
        return os.read(fd, READ_CAP)
    except OSError:
        return None
    finally:
        os.close(fd)


def parse_stat(data: bytes) -> tuple[int, int] | None:
    """(start time, utime + stime) from /proc/PID/stat's text, None when it is not one."""
    end = data.rfind(b")")
    if end < 0:
        return None
    fields = data[end + 1:].split()
    # after comm: state(0) ppid(1) ... utime(11) stime(12) ... starttime(19)
    if len(fields) < 20:
        return None
    try:
        return int(fields[19]), int(fields[11]) + int(fields[12])
    except ValueError:
        return None


def parse_io(data: bytes) -> int | None:
    """read_bytes + write_bytes of /proc/PID/io's text."""
    total, seen = 0, 0
    for line in data.splitlines()[:16]:
        key, _, val = line.partition(b":")
        if key in (b"read_bytes", b"write_bytes"):
            try:
                total += int(val.strip())
            except ValueError:
                return None
            seen += 1
    return total if seen == 2 else None


def counters(pid: int) -> Counters | None:
    """The process's counters now, None when it is gone or its files are not readable."""
    if not isinstance(pid, int) or isinstance(pid, bool) or not 0 < pid < 1 << 22:
        return None
    base = f"/proc/{pid}"
    try:
        uid = os.stat(base, follow_symlinks=False).st_uid
    except OSError:
        return None
    st = parse_stat(_read(f"{base}/stat") or b"")
    if st is None:
        return None
    io = _read(f"{base}/io")
    return Counters(st[0], uid, st[1], parse_io(io) if io is not None else None)


def children(pid: int) -> list[int]:
    """The rank's direct children (its main thread's list), at most MAX_CHILDREN."""
    data = _read(f"/proc/{pid}/task/{pid}/children") or b""
    out = []
    for tok in data.split()[:MAX_CHILDREN]:
        if tok.isdigit() and len(tok) < 9:
            out.append(int(tok))
    return out
