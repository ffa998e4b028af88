"""Stand-in worker servers in a process of their own (tests/unit/test_live_budgets.py), so the
client under test shares no interpreter, GIL or descriptors with them.

    python worker_servers.py DIR

For every ``DIR/reply_<rank>`` it serves ``DIR/ws/rank_<rank>.sock``: each connection gets
the file's bytes after an HTTP head (``reply_<rank>.nolength``: no Content-Length), or
nothing ever (``reply_<rank>.never``). Each connection is answered by a thread of its own;
every request line is appended to ``DIR/requests_<rank>``. Prints "ready" once listening.
"""
import os
import re
import socket
import sys
import threading
import time

d = sys.argv[1]


def serve(rank: int, body: bytes | None, length: bool) -> None:
    s = socket.socket(socket.AF_UNIX)
    s.bind(f"{d}/ws/rank_{rank}.sock")
    s.listen(128)

    def one(c: socket.socket) -> None:
        try:
            req = c.recv(4096)
            with open(f"{d}/requests_{rank}", "ab") as f:
                f.write(req.split(b"\r\n", 1)[0] + b"\n")
            if body is None:
                time.sleep(600)
                return
            head = b"HTTP/1.1 200 OK\r\n" + (b"Content-Length: %d\r\n" % len(body) if length else b"")
            c.sendall(head + b"\r\n" + body)
        except OSError:
            pass
        finally:
            c.close()

    while True:
        c, _ = s.accept()
        threading.Thread(target=one, args=(c,), daemon=True).start()


for name in sorted(os.listdir(d)):
    m = re.fullmatch(r"reply_(\d+)(\.never|\.nolength)?", name)
    if m:
        body = None if m.group(2) == ".never" else open(f"{d}/{name}", "rb").read()
        threading.Thread(target=serve, args=(int(m.group(1)), body, m.group(2) != ".nolength"), daemon=True).start()
time.sleep(0.5)
print("ready", flush=True)
time.sleep(3600)
