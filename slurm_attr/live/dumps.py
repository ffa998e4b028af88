"""Evidence before the kill: pull a live rank's Flight Recorder and Python stacks.

Two channels, both driven by this node's watcher (root) against its local ranks:

- the **FR debug pipe**: ProcessGroupNCCL (uid-0 PG) creates the FIFO
  ``$TORCH_NCCL_DEBUG_INFO_PIPE_FILE<rank>.pipe`` (the plugin sets the stem to
  ``<jobdir>/fr/pipe_rank_``) and dumps its FR buffer to ``TORCH_FR_DUMP_TEMP_FILE<rank>``
  (``<jobdir>/fr/``, collected by the epilog) when any byte is written to it. NCCL only.
- torch's **worker server** (``_WorkerServer(path)``, started in every rank by the opt-in
  start-up hook ``pyhook/sitecustomize.py`` at ``<jobdir>/ws/rank_<N>.sock``): HTTP/1.1 on
  a unix socket, handlers ``fr_trace_json`` and ``dump_traceback``. Works with Gloo.

Everything under the job dir is the job's, so hostile: the pipe and socket directories are
opened without following links, only FIFOs / sockets owned by the job's user are used, a
FIFO is opened O_NONBLOCK (no reader: skipped, never blocks), the socket's server must run
as the job's user and belong to this step (workerclient.py: SO_PEERCRED, checked before a
byte is sent), every round is bounded in sockets, bytes held and time (``Limits``), and
what comes back is decoded within a budget (frjson.py), never executed. A rank whose
answer is refused gets its reason in the result; the round and the cycle go on. Results
go to the live spool (root's), never back into the job dir.
"""
from __future__ import annotations

import errno
import os
import re
import stat
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from .. import safefs
from ..errors import UnsafePath
from . import frjson
from .workerclient import Fetch, PeerCheck, Reply, Sockets

PIPE_DIR = "fr"
PIPE_RE = re.compile(r"^pipe_rank_(\d{1,7})\.pipe$")
MAX_RANKS = 256  # local FR pipes one node's watcher writes to
FR_CAP = 16 << 20  # one rank's fr_trace_json (2000 entries with stacks is a few MiB)
STACK_CAP = 256 << 10
_PIPE_FLAGS = os.O_WRONLY | os.O_NONBLOCK | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOCTTY", 0)


@dataclass
class Limits:
    """What one collection or poll may cost the watcher (``[live]`` budgets)."""

    uid: int
    max_sockets: int = 64
    timeout_s: float = 10.0  # the whole round, every socket together
    held_cap: int = 128 << 20  # reply bytes held at once
    owner: PeerCheck | None = None  # the step check (stepd.Stepd.owns); None: any process


# ---- the FR debug pipe ----------------------------------------------------------------
def trigger_pipes(jobdir: str, uid: int) -> dict[int, str]:
    """Write one byte to every local rank's FR debug pipe: rank -> "sent" or why not.

    A FIFO with no reader (the rank is gone, or not NCCL) opens with ENXIO: skipped, never
    waited on. A full FIFO (EAGAIN) already holds an unread request: that is a dump asked."""
    out: dict[int, str] = {}
    try:
        entries = safefs.list_dir(jobdir, PIPE_DIR)
    except UnsafePath:
        return out
    try:
        dfd = safefs.open_dir(jobdir, PIPE_DIR)
    except UnsafePath:
        return out
    try:
        for name, _kind in entries:
            m = PIPE_RE.match(name)
            if not m or len(out) >= MAX_RANKS:
                continue
            out[int(m.group(1))] = _poke(dfd, name, uid)
    finally:
        os.close(dfd)
    return out


def _poke(dfd: int, name: str, uid: int) -> str:
    try:
        st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
    except OSError as err:
        return f"stat: {os.strerror(err.errno)}"
    if not stat.S_ISFIFO(st.st_mode):
        return "not a FIFO"  # a symlink, regular file or socket planted under the name
    if st.st_uid != uid:
        return f"owned by uid {st.st_uid}, not the job's"
    try:
        fd = os.open(name, _PIPE_FLAGS, dir_fd=dfd)
    except OSError as err:
        return "no reader" if err.errno == errno.ENXIO else f"open: {os.strerror(err.errno)}"
    try:
        now = os.fstat(fd)
        if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino) or not stat.S_ISFIFO(now.st_mode):
            return "replaced while opening"
        os.write(fd, b"1")
        return "sent"
    except OSError as err:
        return "sent" if err.errno == errno.EAGAIN else f"write: {os.strerror(err.errno)}"
    finally:
        os.close(fd)


# ---- dump_traceback: the line each rank is on -----------------------------------------
_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-fA-F]+)(?: \[[^\]]*\])? \(most recent call first\):\s*$")
_FRAME = re.compile(r'^\s+File "(?P<file>[^"\n]{1,4096})", line (?P<line>\d{1,9}) in (?P<func>\S.{0,255})$')
_LIB = ("/site-packages/", "/dist-packages/", "/lib/python3")
MAX_THREADS = 256
MAX_FRAMES = 100


@dataclass
class Frame:
    file: str
    line: int
    func: str

    def text(self) -> str:
        return f"{self.file}:{self.line} in {self.func}"


@dataclass
class Thread:
    ident: str
    current: bool
    frames: list[Frame] = field(default_factory=list)  # innermost first, as printed


def parse_traceback(text: str) -> list[Thread]:
    """faulthandler's format, as torch's ``dump_traceback`` returns it::

        Thread 0x00007f6253b23040 (most recent call first):
          File "/x/train.py", line 13 in <module>

    Lines that are not a thread header or a frame are skipped (``<no Python frame>``,
    ``...`` for a cut stack): the text is the job's and may be anything."""
    threads: list[Thread] = []
    cur: Thread | None = None
    for ln in text.splitlines()[:MAX_THREADS * (MAX_FRAMES + 3)]:
        h = _THREAD.match(ln)
        if h:
            if len(threads) >= MAX_THREADS:
                break
            cur = Thread(h.group(2), h.group(1) == "Current thread")
            threads.append(cur)
            continue
        f = _FRAME.match(ln)
        if f and cur is not None and len(cur.frames) < MAX_FRAMES:
            cur.frames.append(Frame(f.group("file"), int(f.group("line")), f.group("func").strip()))
    return threads


def _is_lib(path: str) -> bool:
    return any(s in path for s in _LIB)


def main_thread(threads: list[Thread]) -> Thread | None:
    """The program's thread: the one whose outermost frame is ``<module>``, else the last
    listed with frames; the server's own (current, no Python frame) never is."""
    cands = [t for t in threads if t.frames and not t.current] or [t for t in threads if t.frames]
    if not cands:
        return None
    return next((t for t in cands if t.frames[-1].func == "<module>"), cands[-1])


def stuck_at(threads: list[Thread]) -> dict[str, Any] | None:
    """Where the rank's main thread is: its innermost frame in the job's own code ("at"),
    and its innermost frame at all ("inner", e.g. torch's all_reduce). The main thread
    is the one whose outermost frame is ``<module>`` (the program), else the last listed
    with frames (faulthandler lists the main thread last); the server's own thread (the
    current one, no Python frame) never is."""
    main = main_thread(threads)
    if main is None:
        return None
    own = next((f for f in main.frames if not _is_lib(f.file)), main.frames[0])
    return {"at": own.text(), "file": own.file, "line": own.line, "func": own.func,
            "inner": main.frames[0].text(), "depth": len(main.frames)}




# ---- rounds against the worker servers --------------------------------------------------
def _round(jobdir: str, lim: Limits, handlers: dict[str, int],
           on_reply: Callable[[Reply], None]) -> list[str]:
    """Ask every local server each of ``handlers`` (name -> byte cap), all at once under one
    deadline; problems with the socket directory itself are returned."""
    with Sockets(jobdir, lim.uid, lim.max_sockets) as ss:
        targets = {(rank, h): path for rank, path in ss.ranks.items() for h in handlers}
        Fetch(targets, uid=lim.uid, deadline=time.monotonic() + lim.timeout_s, caps=handlers,
              held_cap=lim.held_cap, on_reply=on_reply, accept_peer=lim.owner).run()
        return ss.problems[:10]


def fr_summary(data: bytes | bytearray) -> dict[str, Any]:
    """{"pg": status, "pend": pending} of one reply; {"error": why} when it is refused."""
    try:
        doc = frjson.decode(data)
    except frjson.FrReplyError as err:
        return {"error": str(err)[:200]}
    return {"pg": frjson.status(doc), "pend": frjson.pending(doc)}


def poll_fr(jobdir: str, lim: Limits) -> tuple[dict[int, dict[str, Any]], list[str]]:
    """rank -> {"pg", "pend"} (or {"error"}) from every local server, for detection; and the
    socket directory's problems."""
    out: dict[int, dict[str, Any]] = {}

    def got(r: Reply) -> None:
        out[r.key[0]] = fr_summary(r.data) if r.data is not None else {"error": str(r.error)[:200]}

    problems = _round(jobdir, lim, {"fr_trace_json": FR_CAP}, got)
    return out, problems


def fetch_stacks(jobdir: str, lim: Limits, ranks: set[int]) -> dict[int, str | Exception]:
    """``dump_traceback`` of these local ranks' worker servers only (the busy check,
    hang/busy.py): rank -> the text, or the error why not. Ranks without a socket are left out."""
    out: dict[int, str | Exception] = {}

    def got(r: Reply) -> None:
        out[r.key[0]] = (r.data.decode("utf-8", "replace") if r.data is not None
                         else OSError(str(r.error)[:200]))

    with Sockets(jobdir, lim.uid, lim.max_sockets) as ss:
        targets = {(rank, "dump_traceback"): path for rank, path in ss.ranks.items() if rank in ranks}
        if targets:
            Fetch(targets, uid=lim.uid, deadline=time.monotonic() + lim.timeout_s, caps={"dump_traceback": STACK_CAP},
                  held_cap=max(STACK_CAP, lim.held_cap), on_reply=got, accept_peer=lim.owner).run()
    return out


def collect(jobdir: str, lim: Limits, save: Callable[[str, int, bytes | bytearray], str | None]) -> dict[str, Any]:
    """Trigger the pipes, then pull ``dump_traceback`` and ``fr_trace_json`` from every local
    worker server. ``save(kind, rank, data)`` stores one item (kind "fr" or "stack") in the
    spool, or says why it did not (the node's budget). Returns what was done, per rank: the
    stuck line, the FR status, or why not."""
    t0 = time.monotonic()
    out: dict[str, Any] = {"pipes": {str(r): s for r, s in trigger_pipes(jobdir, lim.uid).items()}, "ranks": {}}

    def got(r: Reply) -> None:
        rank, handler = r.key
        row = out["ranks"].setdefault(str(rank), {})
        kind = "stack" if handler == "dump_traceback" else "fr"
        if r.data is None:
            row[f"{kind}_error"] = str(r.error)[:200]
            return
        if kind == "stack":
            text = r.data.decode("utf-8", "replace")
            row["stack"] = stuck_at(parse_traceback(text))
        else:
            fr = fr_summary(r.data)
            if "error" in fr:
                row["fr_error"] = fr["error"]
                return
            row["fr"] = fr
        why = save(kind, rank, r.data)
        if why:
            row[f"{kind}_dropped"] = why

    out["problems"] = _round(jobdir, lim, {"dump_traceback": STACK_CAP, "fr_trace_json": FR_CAP}, got)
    out["ranks"] = dict(sorted(out["ranks"].items(), key=lambda kv: int(kv[0])))
    out["ms"] = round((time.monotonic() - t0) * 1000, 1)
    return out
