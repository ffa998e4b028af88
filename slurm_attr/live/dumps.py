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
as the job's user (SO_PEERCRED; a planted link to a system socket is refused before a byte
is sent), every reply is bounded in bytes and time, and what comes back is parsed, never
executed. Results go to the live spool (root's), never back into the job dir.
"""
from __future__ import annotations

import errno
import json
import os
import re
import socket
import stat
import struct
import time
from dataclasses import dataclass, field
from typing import Any

from .. import safefs
from ..errors import UnsafePath

PIPE_DIR = "fr"
PIPE_RE = re.compile(r"^pipe_rank_(\d{1,7})\.pipe$")
SOCK_DIR = "ws"
SOCK_RE = re.compile(r"^rank_(\d{1,7})\.sock$")
MAX_RANKS = 256  # local ranks one node's watcher talks to
FR_CAP = 16 << 20  # one rank's fr_trace_json (2000 entries with stacks is a few MiB)
STACK_CAP = 256 << 10
HEAD_CAP = 16 << 10
TIMEOUT_S = 3.0  # one request, connect to last byte
_PIPE_FLAGS = os.O_WRONLY | os.O_NONBLOCK | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOCTTY", 0)


class DumpError(Exception):
    """One rank's channel failed (refused, no answer, too big, not what was asked)."""


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


# ---- the worker server: a bounded HTTP/1.1 client over a unix socket -------------------
def _peer_uid(sock: socket.socket) -> int:
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[1]


def post(path: str, handler: str, uid: int | None = None, timeout: float = TIMEOUT_S,
         cap: int = FR_CAP) -> bytes:
    """POST /handler/<handler> to the server at ``path``; the body of a 200 reply.

    ``uid``: the server process must run as this user (checked before anything is sent).
    Raises DumpError on anything else: refused, wrong peer, a reply over ``cap`` bytes or
    ``timeout`` seconds (one deadline for the whole exchange), a status other than 200."""
    if not re.fullmatch(r"[a-z_]{1,40}", handler):
        raise ValueError(f"bad handler {handler!r}")
    deadline = time.monotonic() + timeout
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | getattr(socket, "SOCK_CLOEXEC", 0))
    try:
        sock.settimeout(timeout)
        try:
            sock.connect(path)
        except OSError as err:
            raise DumpError(f"connect: {err.strerror or err}") from err
        if uid is not None and (peer := _peer_uid(sock)) != uid:
            raise DumpError(f"server runs as uid {peer}, not the job's {uid}")
        req = (f"POST /handler/{handler} HTTP/1.1\r\nHost: localhost\r\nContent-Length: 0\r\n"
               f"Connection: close\r\n\r\n").encode()
        try:
            sock.sendall(req)
        except OSError as err:
            raise DumpError(f"send: {err.strerror or err}") from err
        return _read_reply(sock, deadline, cap)
    finally:
        sock.close()


def _recv(sock: socket.socket, deadline: float, n: int) -> bytes:
    left = deadline - time.monotonic()
    if left <= 0:
        raise DumpError("no complete reply in time")
    sock.settimeout(left)
    try:
        return sock.recv(n)
    except TimeoutError as err:
        raise DumpError("no complete reply in time") from err
    except OSError as err:
        raise DumpError(f"recv: {err.strerror or err}") from err


def _read_reply(sock: socket.socket, deadline: float, cap: int) -> bytes:
    buf = b""
    while b"\r\n\r\n" not in buf:
        if len(buf) > HEAD_CAP:
            raise DumpError("reply headers too long")
        chunk = _recv(sock, deadline, 4096)
        if not chunk:
            raise DumpError("connection closed before the headers")
        buf += chunk
    head, _, body = buf.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    m = re.match(r"HTTP/1\.[01] (\d{3})", lines[0])
    if not m:
        raise DumpError(f"not an HTTP reply: {lines[0][:80]!r}")
    headers = {}
    for ln in lines[1:]:
        k, sep, v = ln.partition(":")
        if sep:
            headers[k.strip().lower()] = v.strip()
    if "chunked" in headers.get("transfer-encoding", "").lower():
        raise DumpError("chunked replies are not read")  # torch's server sends Content-Length
    length: int | None = None
    if "content-length" in headers:
        if not headers["content-length"].isdigit():
            raise DumpError("bad Content-Length")
        length = int(headers["content-length"])
        if length > cap:
            raise DumpError(f"reply of {length} bytes is over the {cap}-byte cap")
    chunks, got = [body], len(body)
    while length is None or got < length:
        if got > cap:
            raise DumpError(f"reply over the {cap}-byte cap")
        chunk = _recv(sock, deadline, min(1 << 20, cap + 1 - got if length is None else length - got))
        if not chunk:
            if length is None:
                break
            raise DumpError(f"reply cut at {got} of {length} bytes")
        chunks.append(chunk)
        got += len(chunk)
    data = b"".join(chunks)
    if len(data) > cap:
        raise DumpError(f"reply over the {cap}-byte cap")
    if m.group(1) != "200":
        raise DumpError(f"HTTP {m.group(1)}: {data[:120].decode('utf-8', 'replace')}")
    return data[:length] if length is not None else data


@dataclass
class _Sockets:
    """The job's ``ws`` directory held open; paths through /proc/self/fd/<fd>."""

    jobdir: str
    uid: int
    fd: int = -1
    ranks: dict[int, str] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    def __enter__(self) -> "_Sockets":
        try:
            self.fd = safefs.open_dir(self.jobdir, SOCK_DIR)
        except UnsafePath:
            return self  # no opt-in, or no torch process started a server
        try:
            names = os.listdir(self.fd)
        except OSError as err:
            self.problems.append(f"ws: {os.strerror(err.errno)}")
            return self
        for name in sorted(names)[:safefs.MAX_ENTRIES]:
            m = SOCK_RE.match(name)
            if not m or len(self.ranks) >= MAX_RANKS:
                continue
            try:
                st = os.stat(name, dir_fd=self.fd, follow_symlinks=False)
            except OSError:
                continue
            if not stat.S_ISSOCK(st.st_mode) or st.st_uid != self.uid:
                self.problems.append(f"{name}: not a socket of the job's user")
                continue
            self.ranks[int(m.group(1))] = f"/proc/self/fd/{self.fd}/{name}"
        return self

    def __exit__(self, *exc: object) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


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


def stuck_at(threads: list[Thread]) -> dict[str, Any] | None:
    """Where the rank's main thread is: its innermost frame in the job's own code ("at"),
    and its innermost frame at all ("inner", e.g. torch's all_reduce). The main thread
    is the one whose outermost frame is ``<module>`` (the program), else the last listed
    with frames (faulthandler lists the main thread last); the server's own thread (the
    current one, no Python frame) never is."""
    cands = [t for t in threads if t.frames and not t.current] or [t for t in threads if t.frames]
    if not cands:
        return None
    main = next((t for t in cands if t.frames[-1].func == "<module>"), cands[-1])
    own = next((f for f in main.frames if not _is_lib(f.file)), main.frames[0])
    return {"at": own.text(), "file": own.file, "line": own.line, "func": own.func,
            "inner": main.frames[0].text(), "depth": len(main.frames)}


# ---- fr_trace_json: what each group had enqueued and completed -------------------------
def fr_status(doc: Any) -> dict[str, list[int]]:
    """pg id -> [last enqueued, last completed] collective seq.

    From the entries (the highest seq, the highest *retired* seq), which are current; Gloo's
    ``pg_status`` lags (captured: a rank that had finished collective 3 still said
    ``last_completed_collective: 2``). ``pg_status`` only for a group with no entry left in
    the ring."""
    out: dict[str, list[int]] = {}
    if not isinstance(doc, dict):
        return out
    entries = doc.get("entries")
    for e in entries[-4096:] if isinstance(entries, list) else ():
        if not isinstance(e, dict) or e.get("is_p2p") is True:
            continue
        seq, pg = e.get("collective_seq_id"), e.get("pg_id")
        if not isinstance(seq, int) or isinstance(seq, bool) or not isinstance(pg, (int, str)) or len(str(pg)) > 64:
            continue
        if str(pg) not in out and len(out) >= 256:
            continue
        cur = out.setdefault(str(pg), [0, 0])
        cur[0] = max(cur[0], seq)
        if e.get("retired") is True:
            cur[1] = max(cur[1], seq)
    st = doc.get("pg_status")
    for pg, v in list(st.items())[:256] if isinstance(st, dict) else ():
        if not isinstance(pg, str) or len(pg) > 64 or not isinstance(v, dict) or pg in out:
            continue
        try:
            enq, comp = int(v.get("last_enqueued_collective")), int(v.get("last_completed_collective"))
        except (TypeError, ValueError):
            continue
        out[pg] = [enq, comp]
    return out


def fr_pending(doc: Any) -> str | None:
    """The first entry not retired (a collective under way), as "gloo:all_reduce #4"."""
    entries = doc.get("entries") if isinstance(doc, dict) else None
    for e in (entries or [])[-4096:] if isinstance(entries, list) else ():
        if isinstance(e, dict) and e.get("retired") is False and e.get("state") != "completed":
            name = e.get("profiling_name")
            seq = e.get("collective_seq_id")
            if isinstance(name, str) and isinstance(seq, int):
                return f"{name[:64]} #{seq}"
    return None


def poll_fr(jobdir: str, uid: int, timeout: float = TIMEOUT_S) -> dict[int, dict[str, Any]]:
    """rank -> {"pg": fr_status, "pend": fr_pending} from every local server (for detection)."""
    out: dict[int, dict[str, Any]] = {}
    with _Sockets(jobdir, uid) as ss:
        for rank, path in ss.ranks.items():
            try:
                doc = json.loads(post(path, "fr_trace_json", uid, timeout))
            except (DumpError, ValueError, OSError):
                continue
            out[rank] = {"pg": fr_status(doc), "pend": fr_pending(doc)}
    return out


# ---- one node's pre-kill collection ----------------------------------------------------
def collect(jobdir: str, uid: int, save: Any, timeout: float = TIMEOUT_S) -> dict[str, Any]:
    """Trigger the pipes, then pull ``fr_trace_json`` and ``dump_traceback`` from every local
    worker server. ``save(kind, rank, data)`` stores one item (kind "fr" or "stack") in the
    spool. Returns what was done, per rank: the stuck line, the FR status, or the error."""
    t0 = time.monotonic()
    out: dict[str, Any] = {"pipes": {str(r): s for r, s in trigger_pipes(jobdir, uid).items()}, "ranks": {}}
    with _Sockets(jobdir, uid) as ss:
        out["problems"] = ss.problems[:10]
        for rank, path in sorted(ss.ranks.items()):
            r: dict[str, Any] = {}
            try:
                text = post(path, "dump_traceback", uid, timeout, STACK_CAP).decode("utf-8", "replace")
                save("stack", rank, text.encode())
                r["stack"] = stuck_at(parse_traceback(text))
            except DumpError as err:
                r["stack_error"] = str(err)[:200]
            try:
                data = post(path, "fr_trace_json", uid, timeout, FR_CAP)
                doc = json.loads(data)
                if not isinstance(doc, dict):
                    raise ValueError("not a JSON object")
                save("fr", rank, data)
                r["fr"] = {"pg": fr_status(doc), "pend": fr_pending(doc)}
            except (DumpError, ValueError) as err:
                r["fr_error"] = str(err)[:200]
            out["ranks"][str(rank)] = r
    out["ms"] = round((time.monotonic() - t0) * 1000, 1)
    return out
