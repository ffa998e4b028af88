"""Watcher processes per node, bounded: a few slots, and steps adopted beyond them.

The plugin starts one watcher per node and step. A job may start as many steps as it
likes (50 ``srun --overlap`` steps made 51 root watchers, 1.48 GB), so a process that
starts takes one of ``[live] max_watchers`` slots (an flock on a file in the node's
root-only state dir, released by the kernel however the process ends) and *hosts* its
step. A process that finds every slot taken writes its step into the node's queue and
exits at once; a host with room (``steps_per_watcher``) adopts it on its next cycle,
first the hosts already watching that job (another job's host waits ``GRACE_CYCLES``
before taking it, so one job's steps stay together). A host runs its steps' cycles one
after the other and ends when its last step has ended and nothing waits.

A host that dies leaves its adopted steps in ``claimed/<slot>/``; the next process to take
that slot adopts them again. A queued step whose slurmstepd is gone is removed. A starting
process waits a moment for a slot before it queues its step (a host whose steps just ended
frees its slot within a cycle). Each host writes into its slot file which steps it watches
(``{"pid": ..., "steps": ["<job>.<step>", ...]}``): an admin, or a test, finds a step's watcher.
"""
from __future__ import annotations

import fcntl
import json
import os
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Optional

from . import livespool
from .stepd import Stepd

QUEUE = "queue"
CLAIMED = "claimed"
GRACE_CYCLES = 3
REQ_CAP = 16 << 10
MAX_QUEUED = 4096


@dataclass
class StepArgs:
    """Everything a watcher of one step needs, as the plugin's facts gave it."""

    job: str
    node: str
    step: str
    jobdir: str
    leader: bool = False
    nnodes: int = 0
    gid: Optional[int] = None
    stepd_pid: Optional[int] = None
    since_ns: Optional[int] = None

    @property
    def name(self) -> str:
        return f"{self.job}.{self.step}.{self.node}.json"

    @classmethod
    def from_dict(cls, d: Any) -> "StepArgs | None":
        try:
            a = cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})
        except (TypeError, KeyError):
            return None
        ok = (livespool.valid_job(a.job) and livespool.valid_step(a.step) and livespool.valid_node(a.node)
              and isinstance(a.jobdir, str) and os.path.isabs(a.jobdir)
              and all(v is None or (isinstance(v, int) and not isinstance(v, bool))
                      for v in (a.gid, a.stepd_pid, a.since_ns)))
        return a if ok else None


class Slots:
    """``max_watchers`` slot files in ``<node_state>/live``, one flock each."""

    def __init__(self, state_dir: str, count: int):
        self.dir = os.path.join(state_dir, "live")
        self.count = count
        self.fd = -1
        self.index: int | None = None

    def take(self, wait_s: float = 0.0) -> int | None:
        """A free slot, trying again for ``wait_s`` seconds; None when every one stays taken."""
        until = time.monotonic() + wait_s
        while True:
            got = self._take_once()
            if got is not None or time.monotonic() >= until:
                return got
            time.sleep(0.2)

    def _take_once(self) -> int | None:
        os.makedirs(os.path.join(self.dir, QUEUE), mode=0o700, exist_ok=True)
        for i in range(self.count):
            fd = os.open(os.path.join(self.dir, f"slot.{i}"),
                         os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                continue
            self.fd, self.index = fd, i
            os.makedirs(self.claimed_dir(), mode=0o700, exist_ok=True)
            return i
        return None

    def publish(self, steps: list[str]) -> None:
        """Say in the held slot file which steps this process watches (best effort)."""
        if self.fd < 0:
            return
        try:
            data = json.dumps({"pid": os.getpid(), "steps": sorted(steps)}).encode()
            os.ftruncate(self.fd, 0)
            os.pwrite(self.fd, data, 0)
        except OSError:
            pass

    def close(self) -> None:
        """Give the slot back (the kernel does it too when the process ends)."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd, self.index = -1, None

    def claimed_dir(self) -> str:
        return os.path.join(self.dir, CLAIMED, str(self.index))

    def enqueue(self, args: StepArgs) -> None:
        """Leave the step to a host (written whole, then renamed into the queue)."""
        qdir = os.path.join(self.dir, QUEUE)
        tmp = os.path.join(qdir, f".{args.name}.{os.getpid()}.tmp")
        with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600), "w") as f:
            json.dump(asdict(args), f)
        os.rename(tmp, os.path.join(qdir, args.name))

    def queued(self) -> list[tuple[str, float]]:
        """(name, age in seconds) of the waiting steps, oldest first."""
        qdir, now = os.path.join(self.dir, QUEUE), time.time()
        out = []
        try:
            names = os.listdir(qdir)[:MAX_QUEUED]
        except OSError:
            return out
        for n in names:
            if n.startswith("."):
                continue
            try:
                out.append((n, now - os.lstat(os.path.join(qdir, n)).st_mtime))
            except OSError:
                continue
        return sorted(out, key=lambda x: -x[1])

    def claim(self, name: str, src: str | None = None) -> StepArgs | None:
        """Move a waiting step to this slot (one host wins the rename); its args, or None
        when another took it, it is unreadable, or its step is gone."""
        path = os.path.join(self.claimed_dir(), name)
        if src is not None:
            try:
                os.rename(src, path)
            except OSError:
                return None
        try:
            with open(os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)) as f:
                args = StepArgs.from_dict(json.loads(f.read(REQ_CAP)))
        except (OSError, ValueError):
            args = None
        if args is None or (args.stepd_pid is not None and not Stepd(args.stepd_pid).alive()):
            self.release(name)
            return None
        return args

    def release(self, name: str) -> None:
        try:
            os.unlink(os.path.join(self.claimed_dir(), name))
        except OSError:
            pass


class Host:
    """The steps one watcher process runs, cycled every ``interval`` seconds."""

    def __init__(self, interval: float, make: Callable[[StepArgs], Any], slots: Slots | None = None,
                 steps_per_watcher: int = 16, clock: Callable[[], float] = time.monotonic):
        self.interval, self.make, self.slots, self.cap, self.clock = interval, make, slots, steps_per_watcher, clock
        self.watchers: list[tuple[str | None, Any]] = []  # (claimed file name or None, watcher)

    def add(self, w: Any, claimed: str | None = None) -> None:
        self.watchers.append((claimed, w))
        self._publish()

    def _publish(self) -> None:
        if self.slots is not None:
            self.slots.publish([f"{w.job}.{getattr(w, 'step', '?')}" for _, w in self.watchers])

    def adopt(self) -> None:
        """Take waiting steps while there is room: this host's jobs' at once, others' after
        GRACE_CYCLES intervals (their own job's host, if any, goes first)."""
        if self.slots is None:
            return
        if not self.watchers:  # a new holder of this slot: what the last one left behind
            for name in _names(self.slots.claimed_dir()):
                self._start(name, None)
        jobs = {w.job for _, w in self.watchers}
        grace = GRACE_CYCLES * self.interval if self.watchers else 0.0  # a host with nothing left takes any
        for name, age in self.slots.queued():
            if len(self.watchers) >= self.cap:
                return
            if name.split(".", 1)[0] in jobs or age >= grace:
                self._start(name, os.path.join(self.slots.dir, QUEUE, name))

    def _start(self, name: str, src: str | None) -> None:
        args = self.slots.claim(name, src) if self.slots is not None else None
        if args is None:
            return
        try:
            self.add(self.make(args), name)
        except (ValueError, OSError):
            self.slots.release(name)  # type: ignore[union-attr]

    def cycle(self) -> None:
        for claimed, w in list(self.watchers):
            if not w.step_alive():
                self._end(claimed, w)
                continue
            try:
                w.cycle()
            except Exception as err:  # noqa: BLE001 - one bad cycle must not end the watch
                w.note(f"cycle failed: {type(err).__name__}: {err}")

    def _end(self, claimed: str | None, w: Any) -> None:
        self.watchers.remove((claimed, w))
        self._publish()
        w.leave()
        if claimed is not None and self.slots is not None:
            self.slots.release(claimed)

    def run(self, max_cycles: int | None = None) -> None:
        cycles = 0
        try:
            self.adopt()
            while self.watchers and (max_cycles is None or cycles < max_cycles):
                t0 = self.clock()
                self.cycle()
                self.adopt()
                cycles += 1
                time.sleep(max(0.05, self.interval - (self.clock() - t0)))
        finally:
            for claimed, w in list(self.watchers):
                self._end(claimed, w)


def _names(d: str) -> list[str]:
    try:
        return sorted(n for n in os.listdir(d) if not n.startswith("."))[:MAX_QUEUED]
    except OSError:
        return []
