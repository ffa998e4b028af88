"""What one node may keep of one job in the live spool: bytes, counted and enforced.

The spool is shared by every job and the controller, so a job's ranks must not be able to
fill it through the root watcher (a red team's job wrote 1,041 MB into its live dir in
10 s: 16 worker sockets answering 16 MiB, polled by 4 steps' watchers). Each node's
watchers write only under their own node's names, so the budget is kept per node:
``min([live] node_cap_bytes, [live] job_cap_bytes / the step's nodes)``, over every step
of the job on this node (the sum over a job's nodes then stays within the job's cap).

The node's usage is read from the spool itself (the files under this node's names), so
watchers of several steps on one node, or a watcher restarted, agree without shared
state; each write is decided and done under one node-local lock (``locked``), so two
steps' collections at once cannot both take the same room. A new dump that does not fit
first pushes out this node's older dumps (oldest first, the largest first among equally
old), never one of its own collection; what still does not fit is not written, and the
collection's result says what was dropped.
"""
from __future__ import annotations

import fcntl
import os
import stat
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator

from ..errors import UnsafePath
from . import livespool

# where a node's dumps lie (droppable) and its other files (counted, never dropped)
DUMP_DIRS = ("dumps/{step}/nodes/{node}/fr", "dumps/{step}/nodes/{node}/stacks")
KEPT_DIRS = ("steps/{step}/nodes/{node}/probe",)
MAX_STEPS = 1024  # step dirs listed per accounting


@dataclass
class _File:
    rel: str
    size: int
    mtime_ns: int


@contextmanager
def locked(state_dir: str | None) -> Iterator[None]:
    """One writer at a time on this node: ``<node_state>/live/budget.lock`` (root-only,
    node-local). None: no lock (one process alone, as in the tests)."""
    if state_dir is None:
        yield
        return
    d = os.path.join(state_dir, "live")
    os.makedirs(d, mode=0o700, exist_ok=True)
    fd = os.open(os.path.join(d, "budget.lock"), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def share(job_cap: int, node_cap: int, nnodes: int) -> int:
    """This node's part of the job's budget."""
    return max(1, min(node_cap, job_cap // max(1, nnodes)))


@dataclass
class NodeBudget:
    live_dir: str
    node: str
    cap: int
    files: list[_File] = field(default_factory=list)
    kept_bytes: int = 0
    fresh: set[str] = field(default_factory=set)  # written by the collection under way
    dropped: list[str] = field(default_factory=list)

    @classmethod
    def read(cls, live_dir: str, node: str, cap: int, fresh: set[str] | None = None) -> "NodeBudget":
        """This node's files in the job's live dir, as they are now; ``fresh``: what the
        collection under way wrote already (never dropped for more of it)."""
        b = cls(live_dir, node, cap, fresh=set(fresh or ()))
        steps = _steps(live_dir)
        for step in steps:
            for pattern in DUMP_DIRS:
                b.files += _listed(live_dir, pattern.format(step=step, node=node))
            for pattern in KEPT_DIRS:
                b.kept_bytes += sum(f.size for f in _listed(live_dir, pattern.format(step=step, node=node)))
        for step in steps:  # the small files: summaries, collection results
            for rel in (f"summary/{step}/{node}.json", f"dumps/{step}/{node}.json"):
                b.kept_bytes += _size(live_dir, rel)
        return b

    def used(self) -> int:
        return self.kept_bytes + sum(f.size for f in self.files)

    def room_for(self, rel: str, size: int) -> bool:
        """Make room for ``size`` bytes at ``rel`` (replacing what is there); False when even
        without every older dump of this node it would not fit."""
        old = next((f for f in self.files if f.rel == rel), None)
        need = size - (old.size if old else 0)
        if self.used() + need <= self.cap:
            return True
        others = [f for f in self.files if f.rel not in self.fresh and f.rel != rel]
        if self.used() - sum(f.size for f in others) + need > self.cap:
            return False
        for f in sorted(others, key=lambda f: (f.mtime_ns, -f.size)):
            if self.used() + need <= self.cap:
                break
            self._drop(f)
        return self.used() + need <= self.cap

    def wrote(self, rel: str, size: int, mtime_ns: int) -> None:
        self.files = [f for f in self.files if f.rel != rel] + [_File(rel, size, mtime_ns)]
        self.fresh.add(rel)

    def _drop(self, f: _File) -> None:
        try:
            os.unlink(os.path.join(self.live_dir, f.rel))
        except FileNotFoundError:
            pass
        except OSError:
            return
        self.files.remove(f)
        self.dropped.append(f"{f.rel.split('/nodes/', 1)[-1]} of step {f.rel.split('/')[1]} "
                            f"({f.size} bytes, older)")


def _steps(live_dir: str) -> list[str]:
    out: set[str] = set()
    for top in ("dumps", "steps", "summary"):
        try:
            names = os.listdir(os.path.join(live_dir, top))
        except OSError:
            continue
        out.update(n for n in names[:MAX_STEPS] if livespool.valid_step(n))
    return sorted(out)


def _listed(live_dir: str, rel_dir: str) -> list[_File]:
    """Regular files directly in live_dir/rel_dir (the spool is root's: only watchers write
    there; lstat, links are not followed)."""
    try:
        names = os.listdir(os.path.join(live_dir, rel_dir))
    except OSError:
        return []
    out = []
    for name in names:
        try:
            st = os.lstat(os.path.join(live_dir, rel_dir, name))
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode):
            out.append(_File(f"{rel_dir}/{name}", st.st_size, st.st_mtime_ns))
    return out


def _size(live_dir: str, rel: str) -> int:
    try:
        st = os.lstat(os.path.join(live_dir, rel))
    except (OSError, UnsafePath):
        return 0
    return st.st_size if stat.S_ISREG(st.st_mode) else 0
