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
    """127.0.0.1, an ephemeral port (``self.port``)."""

    def __init__(self, backlog: int = 8):
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        super().__init__(sock, backlog)
