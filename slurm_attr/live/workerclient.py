"""A bounded HTTP/1.1 client for torch's worker servers (unix sockets), many at once.

The servers run in a job's ranks, so everything about them is hostile: a socket planted
under the job's ``ws`` dir, a server that never answers, one that answers 16 MiB of
``{},{},...`` to every poll, a reply nested 200,000 levels deep. The watcher asking them
runs as root on a node other jobs share, so what one job can make it hold is bounded here:

- time: every exchange in one call shares one deadline (and each also its own
  ``per_request_s``); the sockets are served together by one ``selectors`` loop, so 256
  silent servers cost one timeout, not 256 of them one after another;
- memory: a reply is read only once it is *admitted*: its Content-Length (or, without
  one, the cap) must fit ``held_cap`` beside the replies already held, else it waits
  (the server blocks on its own send) and, still not admitted at the deadline, is
  refused; a reply over ``cap`` is refused at its headers, before its body is read;
- identity: the peer's credentials (SO_PEERCRED) must be the job's user, and
  ``accept_peer`` (the watcher's step check: the serving process descends from this
  step's slurmstepd) must agree, before a byte is sent.

Each finished reply goes to ``on_reply`` at once, in this thread, and is dropped after,
so decoding and saving happen one reply at a time.
"""
from __future__ import annotations

import errno
import os
import re
import selectors
import socket
import stat
import struct
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

from .. import safefs
from ..errors import UnsafePath

SOCK_DIR = "ws"
SOCK_RE = re.compile(r"^rank_(\d{1,7})\.sock$")
TIMEOUT_S = 3.0  # one request, connect to last byte
HEAD_CAP = 16 << 10
ERROR_BODY_CAP = 4 << 10  # what a non-200 reply may say
_CLOEXEC = getattr(socket, "SOCK_CLOEXEC", 0)
_NONBLOCK = getattr(socket, "SOCK_NONBLOCK", 0)

PeerCheck = Callable[[int], Optional[str]]


class DumpError(Exception):
    """One rank's channel failed (refused, no answer, too big, not what was asked)."""


@dataclass
class Reply:
    key: tuple[int, str]  # (rank, handler)
    data: bytes | bytearray | None = None
    error: str | None = None


def peer_cred(sock: socket.socket) -> tuple[int, int]:
    """(pid, uid) of the process that listens on the other end."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, _gid = struct.unpack("3i", creds)
    return pid, uid


def _request(handler: str) -> bytes:
    if not re.fullmatch(r"[a-z_]{1,40}", handler):
        raise ValueError(f"bad handler {handler!r}")
    return (f"POST /handler/{handler} HTTP/1.1\r\nHost: localhost\r\nContent-Length: 0\r\n"
            f"Connection: close\r\n\r\n").encode()


@dataclass
class _Conn:
    key: tuple[int, str]
    sock: socket.socket
    until: float
    out: bytes
    buf: bytearray = field(default_factory=bytearray)
    got: int = 0  # body bytes in buf (preallocated to the Content-Length once admitted)
    early: bytes = b""  # body bytes that came with the headers, before admission
    status: str = ""
    length: int | None = None
    need: int = 0  # bytes reserved once admitted
    phase: str = "send"  # send -> head -> wait -> body


def parse_head(head: bytes, cap: int) -> tuple[str, int | None]:
    """(status code, Content-Length or None) of a reply's header block; DumpError otherwise."""
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
    length = None
    if "content-length" in headers:
        if not headers["content-length"].isdigit() or len(headers["content-length"]) > 15:
            raise DumpError("bad Content-Length")
        length = int(headers["content-length"])
        if length > cap and m.group(1) == "200":
            raise DumpError(f"reply of {length} bytes is over the {cap}-byte cap")
    return m.group(1), length


class Fetch:
    """One round of requests: ``targets`` maps (rank, handler) to a socket path."""

    def __init__(self, targets: dict[tuple[int, str], str], *, uid: int | None, deadline: float,
                 caps: dict[str, int], held_cap: int, on_reply: Callable[[Reply], None],
                 accept_peer: PeerCheck | None = None, per_request_s: float = TIMEOUT_S, window: int = 512):
        self.todo = list(targets.items())
        self.uid, self.deadline, self.caps, self.held_cap = uid, deadline, caps, held_cap
        self.on_reply, self.accept_peer, self.per_request_s = on_reply, accept_peer, per_request_s
        self.window = max(1, window)
        self.sel = selectors.DefaultSelector()
        self.conns: dict[int, _Conn] = {}
        self.waiting: list[_Conn] = []  # headers read, body not admitted yet
        self.held = 0

    # ---- the loop ------------------------------------------------------------------------
    def run(self) -> None:
        try:
            while True:
                self._start_more()
                self._admit()
                if not self.conns and not self.todo:
                    return
                now = time.monotonic()
                if now >= self.deadline:
                    break
                self._expire(now)
                if not self.sel.get_map():
                    if self.waiting or self.todo:
                        time.sleep(0.01)  # waiting on the memory budget only; _expire ends it
                    continue
                until = min([self.deadline] + [c.until for c in self.conns.values()])
                for sk, _ev in self.sel.select(max(0.0, min(0.5, until - now))):
                    c = self.conns.get(sk.fd)
                    if c is not None:
                        self._step(c)
            for c in list(self.conns.values()):
                why = ("not read in time: it waited for the watcher's memory budget" if c.phase == "wait"
                       else "no complete reply in time (the round's deadline)")
                self._fail(c, why)
            for key, _path in self.todo:
                self.on_reply(Reply(key, error="not asked: the collection's deadline passed"))
            self.todo = []
        finally:
            for c in list(self.conns.values()):
                self._close(c)
            self.sel.close()

    def _start_more(self) -> None:
        while self.todo and len(self.conns) < self.window and time.monotonic() < self.deadline:
            key, path = self.todo.pop(0)
            try:
                self._open(key, path)
            except DumpError as err:
                self.on_reply(Reply(key, error=str(err)))

    def _open(self, key: tuple[int, str], path: str) -> None:
        out = _request(key[1])
        try:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | _CLOEXEC | _NONBLOCK)
        except OSError as err:  # EMFILE: this round's other sockets hold the descriptors
            raise DumpError(f"socket: {err.strerror or err}") from err
        try:
            sock.connect(path)  # AF_UNIX connects at once or fails (EAGAIN: backlog full)
        except OSError as err:
            sock.close()
            raise DumpError(f"connect: {err.strerror or err}") from err
        try:
            pid, uid = peer_cred(sock)
            if self.uid is not None and uid != self.uid:
                raise DumpError(f"server runs as uid {uid}, not the job's {self.uid}")
            why = self.accept_peer(pid) if self.accept_peer is not None else None
            if why:
                raise DumpError(why)
        except (DumpError, OSError) as err:
            sock.close()
            raise DumpError(str(err)) from err
        c = _Conn(key, sock, min(self.deadline, time.monotonic() + self.per_request_s), out)
        self.conns[sock.fileno()] = c
        self.sel.register(sock, selectors.EVENT_WRITE)

    def _expire(self, now: float) -> None:
        for c in [c for c in self.conns.values() if c.until <= now]:
            self._fail(c, "not read in time: it waited for the watcher's memory budget" if c.phase == "wait"
                       else "no complete reply in time")

    def _admit(self) -> None:
        while self.waiting and self.held + self.waiting[0].need <= self.held_cap:
            c = self.waiting.pop(0)
            self.held += c.need
            c.phase = "body"
            # one byte past the need: a reply without a length that runs past its cap shows it
            c.buf = bytearray(c.need + (1 if c.length is None else 0))
            c.got = min(len(c.early), len(c.buf))
            c.buf[:c.got] = c.early[:c.got]
            c.early = b""
            self.sel.register(c.sock, selectors.EVENT_READ)
            if c.got >= len(c.buf):
                self._done(c)

    # ---- one connection ------------------------------------------------------------------
    def _step(self, c: _Conn) -> None:
        try:
            if c.phase == "send":
                n = c.sock.send(c.out)
                c.out = c.out[n:]
                if not c.out:
                    c.phase = "head"
                    self.sel.modify(c.sock, selectors.EVENT_READ)
                return
            if c.phase == "head":
                self._head(c, c.sock.recv(HEAD_CAP))
                return
            # into the buffer admitted for it: no reallocation, so a reply is held once
            n = c.sock.recv_into(memoryview(c.buf)[c.got:], min(1 << 20, len(c.buf) - c.got))
        except (BlockingIOError, InterruptedError):
            return
        except OSError as err:
            self._fail(c, f"recv: {err.strerror or err}" if err.errno != errno.EPIPE else "server closed early")
            return
        c.got += n
        if n and c.got >= len(c.buf):
            self._done(c)
        elif not n and (c.length is None or c.status != "200"):
            self._done(c)  # no Content-Length: the reply ends where the connection does
        elif not n:
            self._fail(c, f"reply cut at {c.got} of {c.length} bytes")

    def _head(self, c: _Conn, chunk: bytes) -> None:
        if not chunk:
            self._fail(c, "connection closed before the headers")
            return
        c.buf += chunk
        end = c.buf.find(b"\r\n\r\n")
        if end < 0:
            if len(c.buf) > HEAD_CAP:
                self._fail(c, "reply headers too long")
            return
        head, body = bytes(c.buf[:end]), bytes(c.buf[end + 4:])
        cap = self.caps.get(c.key[1], min(self.caps.values()))
        try:
            c.status, c.length = parse_head(head, cap)
        except DumpError as err:
            self._fail(c, str(err))
            return
        c.buf = bytearray(body[:0])
        c.need = (min(c.length, ERROR_BODY_CAP) if c.status != "200" and c.length is not None
                  else ERROR_BODY_CAP if c.status != "200" else c.length if c.length is not None else cap)
        if c.need > self.held_cap:
            self._fail(c, f"reply of {c.need} bytes is over the watcher's {self.held_cap}-byte memory budget")
            return
        c.early = body[:c.need + 1]  # what came with the headers
        c.phase = "wait"
        self.sel.unregister(c.sock)
        self.waiting.append(c)

    def _done(self, c: _Conn) -> None:
        """The reply is whole (its length read, or the connection closed), or past its cap."""
        data, got = c.buf, c.got
        if c.status != "200":
            self._close(c)
            self.on_reply(Reply(c.key, error=f"HTTP {c.status}: {bytes(data[:min(got, 120)]).decode('utf-8', 'replace')}"))
            return
        if got > c.need:
            self._fail(c, f"reply over the {c.need}-byte cap")
            return
        self._close(c)
        del data[got:]
        c.buf = bytearray()
        self.on_reply(Reply(c.key, data=data))

    def _fail(self, c: _Conn, why: str) -> None:
        self._close(c)
        self.on_reply(Reply(c.key, error=why))

    def _close(self, c: _Conn) -> None:
        if c.phase in ("body",) and c.need:
            self.held -= c.need
            c.need = 0
        if c in self.waiting:
            self.waiting.remove(c)
        fd = c.sock.fileno()
        if fd >= 0:
            try:
                self.sel.unregister(c.sock)
            except (KeyError, ValueError):
                pass
            self.conns.pop(fd, None)
        c.sock.close()
        c.phase = "closed"


def post(path: str, handler: str, uid: int | None = None, timeout: float = TIMEOUT_S, cap: int = 16 << 20,
         accept_peer: PeerCheck | None = None) -> bytes:
    """One request to one server: the body of a 200 reply, or DumpError (why not)."""
    got: list[Reply] = []
    Fetch({(0, handler): path}, uid=uid, deadline=time.monotonic() + timeout, caps={handler: cap},
          held_cap=cap, on_reply=got.append, accept_peer=accept_peer, per_request_s=timeout).run()
    if not got or got[0].error is not None or got[0].data is None:
        raise DumpError(got[0].error if got else "no reply")
    return bytes(got[0].data)


@dataclass
class Sockets:
    """The job's ``ws`` directory held open; paths through /proc/self/fd/<fd> (the names
    are resolved in the directory we checked, whatever the job renames meanwhile)."""

    jobdir: str
    uid: int
    max_sockets: int = 64
    fd: int = -1
    ranks: dict[int, str] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    def __enter__(self) -> "Sockets":
        try:
            self.fd = safefs.open_dir(self.jobdir, SOCK_DIR)
        except UnsafePath:
            return self  # no opt-in, or no torch process started a server
        try:
            names = os.listdir(self.fd)
        except OSError as err:
            self.problems.append(f"ws: {os.strerror(err.errno or 0)}")
            return self
        skipped = 0
        for name in sorted(names, key=_rank_order)[:safefs.MAX_ENTRIES]:
            m = SOCK_RE.match(name)
            if not m:
                continue
            if len(self.ranks) >= self.max_sockets:
                skipped += 1
                continue
            try:
                st = os.stat(name, dir_fd=self.fd, follow_symlinks=False)
            except OSError:
                continue
            if not stat.S_ISSOCK(st.st_mode) or st.st_uid != self.uid:
                self.problems.append(f"{name}: not a socket of the job's user")
                continue
            self.ranks[int(m.group(1))] = f"/proc/self/fd/{self.fd}/{name}"
        if skipped:
            self.problems.append(f"{skipped} socket(s) over the node's cap of {self.max_sockets} not asked")
        return self

    def __exit__(self, *exc: object) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _rank_order(name: str) -> tuple[int, str]:
    m = SOCK_RE.match(name)
    return (int(m.group(1)) if m else 1 << 30, name)
