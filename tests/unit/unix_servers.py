"""Unix-socket servers for the live dump tests: a thread accepts and hands each connection
to ``answer`` (the subclass says what a worker server, or a hostile one, replies)."""
from __future__ import annotations

import socket
import threading


class UnixServer:
    def __init__(self, path: str, backlog: int = 8):
        self.conns: list[socket.socket] = []
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.bind(path)
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
            c.close()
        self.sock.close()
