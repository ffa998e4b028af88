"""Socket servers for the live tests: a thread accepts and hands each connection to
``answer`` (the subclass says what a worker server, RAS, or a hostile one, replies).
UnixServer listens on a path (the worker servers), TcpServer on 127.0.0.1 (NCCL's RAS)."""
from __future__ import annotations

import socket
import threading


class Server:
    def __init__(self, sock: socket.socket, backlog: int = 8):
        self.conns: list[socket.socket] = []
        self.sock = sock
        self.sock.listen(backlog)
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(c)
            try:
                self.answer(c)
            except OSError:
                pass

    def answer(self, conn: socket.socket) -> None:
        raise NotImplementedError

    def close(self) -> None:
        for c in self.conns:
            try:
                c.close()
            except OSError:
                pass
        self.sock.close()


class UnixServer(Server):
    def __init__(self, path: str, backlog: int = 8):
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(path)
        super().__init__(sock, backlog)


class TcpServer(Server):
    """127.0.0.1, an ephemeral port unless given (``self.port``)."""

    def __init__(self, backlog: int = 8, port: int = 0):
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        self.port = sock.getsockname()[1]
        super().__init__(sock, backlog)


class RasServer(TcpServer):
    """Each connection is answered as rasClientEventLoop does: one reply per newline-terminated
    command, the status report streamed, then closed. ``reports`` are served in turn (the
    last one again); ``json`` says whether SET FORMAT json is known (2.28.7+); ``mute``
    accepts and never answers."""

    def __init__(self, reports=(), json_ok=False, mute=False, hello=b"SERVER PROTOCOL 2\n", port=0):
        self.reports, self.json_ok, self.mute, self.hello = list(reports), json_ok, mute, hello
        self.commands: list[str] = []
        self.served = 0
        super().__init__(port=port)

    def answer(self, c: socket.socket) -> None:
        if not self.mute:
            threading.Thread(target=self._client, args=(c,), daemon=True).start()
    def _client(self, c: socket.socket) -> None:
        buf, fmt = b"", "text"
        with c:
            while True:
                try:
                    data = c.recv(4096)
                except OSError:
                    return
                if not data:
                    return
                buf += data
                while b"\n" in buf:
                    cmd, _, buf = buf.partition(b"\n")
                    cmd = cmd.decode().rstrip("\r")
                    self.commands.append(cmd)
                    low = cmd.lower()
                    if low.startswith("client protocol "):
                        c.sendall(self.hello)
                    elif low.startswith("timeout "):
                        c.sendall(b"OK\n")
                    elif low.startswith("set format ") and self.json_ok:
                        fmt = low.split()[-1]
                        c.sendall(b"OK\n")
                    elif low in ("status", "verbose status"):
                        text = self.reports[min(self.served, len(self.reports) - 1)]
                        self.served += 1
                        body = text[fmt] if isinstance(text, dict) else text
                        head, _, rest = body.partition("Communicators...")  # NCCL sends the banner first
                        c.sendall(head.encode())
                        c.sendall(("Communicators..." + rest).encode() if rest else b"")
                        return  # RAS closes once the report is out
                    else:
                        c.sendall(f"ERROR: Unknown command {cmd}\n".encode())
