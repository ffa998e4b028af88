"""Busy is not stuck: before a stall below the ceiling becomes a hang, look at the ranks it
would name (the ones the others wait for: nothing under way themselves).

Node side (``NodeBusy``, every cycle): each local rank's CPU and storage-I/O counters
(procstat.py; its children's too, its data-loader workers, when the rank itself is still;
while the leader's questions are fresh, its GPU's utilisation where the node has GPUs:
gpustat.py, a computing GPU moves like a counter, no nvidia-smi no signal) and, for the
ranks the leader asks about in ``busyreq.<step>.json``, the Python stack through its worker
server (dumps.fetch_stacks: ``dump_traceback``). The node's summary
carries per local rank how long its counters have been still and what its stack is in.

Leader side (``LeaderBusy``): asks the stacks of a stall's idle ranks once it is past half
its threshold (so the answer is there when the threshold passes), and ``judge``s: a rank is
*busy* when its counters moved within ``FROZEN_S`` and its stack is in checkpoint I/O,
evaluation or data loading, or when no stack is to be had (no worker server, no answer):
then moving is all we know, and a rank spinning in a stuck loop waits for the ceiling as
before. A rank whose counters are still is stuck whatever its stack says (a checkpoint
hung on a dead file server). Every named rank busy: a note, no hang yet. The stack's words are the job's:
at worst a job that dresses a stuck rank as a checkpoint delays its own finding to the
ceiling (``[live] hang_after_s``), which no busy rank can pass.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any

from ...errors import UnsafePath
from .. import livespool
from ..dumps import Limits, fetch_stacks, main_thread, parse_traceback
from ..nodeview import pending
from . import gpustat, procstat

FROZEN_S = 5.0  # counters still this long: the rank is not moving
CPU_SHARE = 0.05  # of one core over a cycle: less is a sleeping (or blocked) process
STACK_WAIT_S = 4.0  # how long a stall is deferred for a stack asked and not answered yet
REFRESH_S = 5.0  # the leader asks again this often while a stall lasts (a stack goes stale)
STACK_TIMEOUT_S = 2.0  # one node's stack round (the cycle waits on it)
MAX_PIDS = 64
REQ_CAP = 64 << 10
BUSY_KINDS = ("checkpoint", "data", "eval")
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
# words of a frame's file name and function that say what the rank is doing
_WORDS = {
    "checkpoint": {"save", "checkpoint", "checkpointing", "ckpt", "serialization", "safetensors", "fsync", "savez"},
    "data": {"dataloader", "loader", "dataset", "datasets", "collate", "prefetch", "fetch", "batch", "webdataset"},
    "eval": {"eval", "evaluate", "evaluation", "validate", "validation", "val", "predict", "inference", "metrics"},
}


def req_name(step: str) -> str:
    return f"busyreq.{step}.json"


def stack_kind(text: str) -> tuple[str | None, str | None]:
    """(kind, "file:line in func") of a ``dump_traceback`` text: "collective" when the main
    thread is inside torch.distributed (waiting like the others), a BUSY_KINDS entry for the
    innermost frame that names one, None for anything else."""
    main = main_thread(parse_traceback(text))
    if main is None:
        return None, None
    for f in main.frames[:3]:
        if "/torch/distributed/" in f.file:
            return "collective", f.text()
    for f in main.frames:
        if "/torch/utils/data/" in f.file:
            return "data", f.text()
        name = os.path.basename(f.file).rsplit(".", 1)[0]
        words = set(re.split(r"[^a-z0-9]+", f"{name} {f.func}".lower()))
        for kind in BUSY_KINDS:
            if words & _WORDS[kind]:
                return kind, f.text()
    return None, main.frames[0].text()


@dataclass
class _Proc:
    start: int
    cpu: int
    io: int | None
    seen: float
    moved: float | None = None  # when its counters (or its children's) last moved
    io_moved: float | None = None
    gpu_moved: float | None = None  # its GPU last seen computing (gpustat.py); None: never
    kids: dict[int, tuple[int, int, int | None]] = field(default_factory=dict)  # pid -> (start, cpu, io)
    kids_at: float | None = None  # the cycle the children were read in
    kind: str | None = None
    at: str | None = None
    stack_seq: int = 0  # the request its stack answers
    stack_error: str | None = None


class NodeBusy:
    """One node's side: counters every cycle, stacks when the leader asks."""

    def __init__(self, live_dir: str, job: str, step: str, node: str, jobdir: str, limits: Any,
                 counters: Any = procstat.counters, children: Any = procstat.children, stacks: Any = fetch_stacks,
                 gpu: Any = None):
        self.live_dir, self.job, self.step, self.node, self.jobdir = live_dir, job, step, node, jobdir
        self.limits = limits  # uid -> dumps.Limits (the node's worker-socket budgets)
        # what reads the processes (procstat, the worker servers); the tests' and bench's stand-ins
        self.counters, self.children, self.stacks = counters, children, stacks
        self.gpu = gpu if gpu is not None else gpustat.GpuProbe()
        self.gpu_now: dict[int, gpustat.GpuUse] = {}
        self.asked_at: float | None = None  # when this node last answered the leader's stack request
        self.procs: dict[int, _Proc] = {}
        self.done_seq = 0
        self.last: float | None = None

    def cycle(self, now: float, ranks: dict[int, int | None], uid: int | None) -> dict[str, Any]:
        """pid -> what the leader needs, for the local ranks ``ranks`` (pid -> global rank)."""
        dt = now - self.last if self.last is not None else None
        self.last = now
        # nvidia-smi only while the leader judges a stall here: it costs a process per call
        fresh = self.asked_at is not None and now - self.asked_at <= 2 * REFRESH_S
        self.gpu_now = (self.gpu.sample(now) or {}) if fresh else {}
        procs: dict[int, _Proc] = {}
        for pid in sorted(ranks)[:MAX_PIDS]:
            c = self.counters(pid)
            if c is None or (uid is not None and c.uid != uid):
                continue  # gone, or not the job's process: nothing to say about it
            old = self.procs.get(pid)
            p = old if old is not None and old.start == c.start else _Proc(c.start, c.cpu_ticks, c.io_bytes, now)
            if p is old and dt:
                self._moved(pid, p, c, now, dt, uid)
            p.cpu, p.io = c.cpu_ticks, c.io_bytes
            procs[pid] = p
        self.procs = procs
        self._stacks(ranks, uid, now)
        return {str(pid): self._row(p, ranks.get(pid), now) for pid, p in procs.items()}

    def _moved(self, pid: int, p: _Proc, c: procstat.Counters, now: float, dt: float, uid: int | None) -> None:
        cpu = c.cpu_ticks - p.cpu >= max(1.0, CPU_SHARE * dt * _TICK)
        io = c.io_bytes is not None and p.io is not None and c.io_bytes > p.io
        if not (cpu or io):
            cpu, io = self._kids_moved(pid, p, now, dt, uid)  # the rank waits on its workers?
        else:
            p.kids, p.kids_at = {}, None
        gpu = gpustat.active(self.gpu_now.get(pid))
        if gpu:
            p.gpu_moved = now
        if cpu or io or gpu:
            p.moved = now
        if io:
            p.io_moved = now

    def _kids_moved(self, pid: int, p: _Proc, now: float, dt: float, uid: int | None) -> tuple[bool, bool]:
        """Whether the rank's children moved since the last cycle (only counted when they
        were read in that cycle too)."""
        fresh = p.kids_at is not None and now - p.kids_at <= 2.5 * dt
        kids: dict[int, tuple[int, int, int | None]] = {}
        cpu = io = False
        for kid in self.children(pid):
            c = self.counters(kid)
            if c is None or (uid is not None and c.uid != uid):
                continue
            kids[kid] = (c.start, c.cpu_ticks, c.io_bytes)
            old = p.kids.get(kid)
            if fresh and old is not None and old[0] == c.start:
                cpu = cpu or c.cpu_ticks - old[1] >= max(1.0, CPU_SHARE * dt * _TICK)
                io = io or (c.io_bytes is not None and old[2] is not None and c.io_bytes > old[2])
        p.kids, p.kids_at = kids, now
        return cpu, io

    def _stacks(self, ranks: dict[int, int | None], uid: int | None, now: float) -> None:
        """Answer a new request of the leader's for this node's ranks' stacks."""
        try:
            req = livespool.read_json(self.live_dir, req_name(self.step), REQ_CAP)
        except (UnsafePath, ValueError, OSError):
            return
        seq = req.get("seq") if isinstance(req, dict) and req.get("job") == self.job else None
        if not isinstance(seq, int) or isinstance(seq, bool) or seq <= self.done_seq or uid is None:
            return
        self.done_seq = seq
        want: dict[int, int] = {}  # global rank -> pid
        for e in (req.get("ranks") or [])[:MAX_PIDS] if isinstance(req.get("ranks"), list) else ():
            if isinstance(e, list) and len(e) == 3 and e[0] == self.node and e[1] in self.procs \
                    and isinstance(e[2], int) and ranks.get(e[1]) == e[2]:
                want[e[2]] = e[1]
        if not want:
            return
        self.asked_at = now
        lim: Limits = self.limits(uid)
        lim.timeout_s = min(lim.timeout_s, STACK_TIMEOUT_S)
        got = self.stacks(self.jobdir, lim, set(want))
        for g, pid in want.items():
            p = self.procs[pid]
            # answering costs the rank CPU and storage writes of its own (torch's worker server
            # dumps the traceback through a file): counted from here, they made a rank blocked
            # for good look busy again after every request, until the ceiling
            c = self.counters(pid)
            if c is not None and c.start == p.start:
                p.cpu, p.io = c.cpu_ticks, c.io_bytes
            p.stack_seq, res = seq, got.get(g)
            if isinstance(res, str):
                (p.kind, p.at), p.stack_error = stack_kind(res), None
            else:
                p.kind, p.at = None, None
                p.stack_error = str(res)[:120] if res is not None else "no worker server"

    @staticmethod
    def _row(p: _Proc, g: int | None, now: float) -> dict[str, Any]:
        row: dict[str, Any] = {"g": g, "still_s": round(now - p.moved, 2) if p.moved is not None else None,
                               "io_still_s": round(now - p.io_moved, 2) if p.io_moved is not None else None}
        if p.gpu_moved is not None:
            row["gpu_still_s"] = round(now - p.gpu_moved, 2)
        if p.stack_seq:
            row.update(seq=p.stack_seq, kind=p.kind, at=(p.at or "")[:200] or None, stack_error=p.stack_error)
        return row


def rank_busy(b: Any, awaiting: bool) -> str | None:
    """Why one rank (its node's row, ``NodeBusy._row``) is busy, None when it is not."""
    if not isinstance(b, dict):
        return None
    still, io_still = b.get("still_s"), b.get("io_still_s")
    if not isinstance(still, (int, float)) or still >= FROZEN_S:
        return None  # still (or never seen moving): stuck, as far as we can tell
    kind = b.get("kind")
    if kind in BUSY_KINDS:
        return f"{kind} at {str(b.get('at'))[:200]}, counters moving"
    if awaiting and not b.get("seq"):
        return "counters moving, its stack asked"
    if kind is None and b.get("stack_error"):  # no stack to tell busy from spinning: moving is busy
        gpu_still = b.get("gpu_still_s")
        what = ("storage I/O" if isinstance(io_still, (int, float)) and io_still < FROZEN_S
                else "GPU" if isinstance(gpu_still, (int, float)) and gpu_still < FROZEN_S else "CPU")
        return f"{what} moving (no stack: {str(b.get('stack_error'))[:80]})"
    return None


class LeaderBusy:
    """The leader's side: asks the stacks of suspected ranks, judges stalls."""

    def __init__(self, live_dir: str, job: str, step: str):
        self.live_dir, self.job, self.step = live_dir, job, step
        try:
            old = livespool.read_json(live_dir, req_name(step), REQ_CAP)
            self.seq = old["seq"] if isinstance(old, dict) and isinstance(old.get("seq"), int) else 0
        except (UnsafePath, ValueError, OSError, KeyError):
            self.seq = 0
        self.asked: set[tuple[str, int, int]] = set()
        self.asked_at = float("-inf")
        self.by_node: dict[str, dict[str, Any]] = {}

    def see(self, summaries: list[dict[str, Any]]) -> None:
        """This cycle's node summaries: their busy rows, by node."""
        self.by_node = {s["node"]: s["busy"] for s in summaries
                        if isinstance(s.get("node"), str) and isinstance(s.get("busy"), dict)}

    def ask(self, suspects: list[Any], now: float) -> None:
        """Ask the nodes for the stacks of the suspects' idle ranks: when the set changes,
        and again every REFRESH_S while it lasts."""
        want: set[tuple[str, int, int]] = set()
        for hang in suspects:
            for cr in hang.idle_ranks()[:MAX_PIDS]:
                m = hang.members[cr]
                node, pid, g = m.get("node"), m.get("pid"), m.get("g")
                if isinstance(node, str) and isinstance(pid, int) and isinstance(g, int):
                    want.add((node, pid, g))
        if not want or (want <= self.asked and now - self.asked_at < REFRESH_S):
            return
        self.seq += 1
        self.asked, self.asked_at = want, now
        livespool.write_json(self.live_dir, "", req_name(self.step),
                         {"job": self.job, "step": self.step, "seq": self.seq,
                          "ranks": [list(x) for x in sorted(want)[:MAX_PIDS]]})

    def judge(self, members: dict[int, dict[str, Any]], now: float) -> str | None:
        """Why every rank the others wait for is busy ("rank 0: checkpoint at ...; ..."),
        None when one of them is not (or nobody is idle: all inside the collective)."""
        if not any(pending(m) for m in members.values()):
            return None
        idle = sorted(cr for cr, m in members.items() if not pending(m))
        whys = []
        for cr in idle:
            m = members[cr]
            row = self.by_node.get(str(m.get("node")), {}).get(str(m.get("pid")))
            awaiting = now - self.asked_at < STACK_WAIT_S
            why = rank_busy(row, awaiting)
            if why is None:
                return None
            g = m.get("g") if isinstance(m.get("g"), int) else cr
            whys.append(f"rank {g}: {why}")
        return "; ".join(whys[:4]) + (f"; and {len(whys) - 4} more" if len(whys) > 4 else "") if whys else None
