"""What the step's slurmstepd tells a watcher, read from the kernel, never from the job.

The plugin starts each watcher from a task that slurmstepd just forked (as root, before
the user's program), passing that slurmstepd's pid. From it, through /proc:

- whether the step still runs (the pid, with its start time, so a reused pid differs);
- which processes are the step's: the ones that descend from it (a rank's worker server
  answers for its own step only; a process that left the tree, by double fork, is nobody's);
- the node's Slurm name: slurmstepd listens on ``<SlurmdSpoolDir>/<node>_<job>.<step>``
  (Slurm's stepd socket, 22.05 and later), and /proc/net/unix names the path bound to each
  socket inode that /proc/<pid>/fd holds. The job's environment (SLURM_STEP_NODELIST, which
  Slurm does not set for the batch step and a user may export) is never read for it.
"""
from __future__ import annotations

import os
import re

MAX_DEPTH = 64  # parent links followed from a process up to its slurmstepd
_FD_CAP = 4096
_NET_UNIX_CAP = 64 << 20


def _stat_fields(pid: int) -> list[bytes] | None:
    """/proc/PID/stat after the command (which may hold spaces and parentheses)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read(4096)
    except OSError:
        return None
    if b")" not in data:
        return None
    return data.rsplit(b")", 1)[-1].split()


def proc_start(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (field 22): a pid reused later differs."""
    fields = _stat_fields(pid)
    return fields[19].decode(errors="replace") if fields and len(fields) > 19 else None


def parent(pid: int) -> int | None:
    fields = _stat_fields(pid)
    try:
        return int(fields[1]) if fields and len(fields) > 1 else None
    except ValueError:
        return None


def process_start_ns(pid: int) -> int | None:
    """When the process started, in wall-clock ns (boot time, 1 s resolution, plus its start
    in clock ticks); None when unreadable."""
    start = proc_start(pid)
    try:
        with open("/proc/stat", "rb") as f:
            btime = next(int(ln.split()[1]) for ln in f.read(65536).splitlines() if ln.startswith(b"btime "))
        return btime * 10**9 + int(start or "x") * 10**9 // os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, StopIteration, IndexError):
        return None


class Stepd:
    """One step's slurmstepd, identified by pid and start time."""

    def __init__(self, pid: int):
        self.pid = pid
        self.start = proc_start(pid)

    def alive(self) -> bool:
        return self.start is not None and proc_start(self.pid) == self.start

    def owns(self, pid: int) -> str | None:
        """None when ``pid`` descends from this slurmstepd; else why it is not this step's."""
        cur, depth = pid, 0
        while cur > 1 and depth < MAX_DEPTH:
            if cur == self.pid:
                return None if self.alive() else "the step's slurmstepd is gone"
            nxt = parent(cur)
            if nxt is None:
                return f"process {pid} is gone"
            cur, depth = nxt, depth + 1
        return f"served by process {pid}, not of this step"

    def node_name(self, job: str, step_id: int) -> str | None:
        """The node's Slurm name from slurmstepd's own listening socket; None when not found."""
        inodes = _socket_inodes(self.pid)
        if not inodes:
            return None
        # <spool>/<node>_<job>.<step>, and .<component> after it for a heterogeneous job's step
        pat = re.compile(rf"/([A-Za-z0-9][A-Za-z0-9._-]{{0,63}})_{re.escape(job)}\.{step_id}(?:\.\d+)?$")
        for inode, path in _unix_paths(inodes):
            m = pat.search(path)
            if m and self.alive():
                return m.group(1)
        return None


def _socket_inodes(pid: int) -> set[str]:
    try:
        names = os.listdir(f"/proc/{pid}/fd")[:_FD_CAP]
    except OSError:
        return set()
    out = set()
    for n in names:
        try:
            link = os.readlink(f"/proc/{pid}/fd/{n}")
        except OSError:
            continue
        if link.startswith("socket:["):
            out.add(link[8:-1])
    return out


def _unix_paths(inodes: set[str]) -> list[tuple[str, str]]:
    """(inode, bound path) of the unix sockets among ``inodes`` (/proc/net/unix: Num RefCount
    Protocol Flags Type St Inode Path)."""
    out = []
    try:
        with open("/proc/net/unix", "rb") as f:
            data = f.read(_NET_UNIX_CAP)
    except OSError:
        return out
    for ln in data.splitlines()[1:]:
        parts = ln.split(None, 7)
        if len(parts) == 8 and parts[6].decode() in inodes:
            out.append((parts[6].decode(), parts[7].decode(errors="replace")))
    return out
