"""A job's ranks that answer the root watcher with whatever a red team chose (issue 21).

Run by each task of a step in partition ``live`` (where the plugin's worker_hook= sets
TORCH_WORKER_SERVER_SOCKET=<jobdir>/ws/rank_<N>.sock). It never imports torch: it serves
torch's worker-server protocol itself, on ``--count`` sockets ``rank_<first + i>.sock`` in the
job's ``ws`` dir, from this one process (so they are this step's: they descend from its
slurmstepd). Each ``fr_trace_json`` answer is ``--kind``:

- ``pad``: a real-shaped FR document (one collective enqueued, never retired, so the watcher's
  FR poll sees a hang) padded with one string field to ``--fr-bytes``;
- ``flat``: 16 MiB of ``{"entries":[{},{},...]}``;
- ``deep``: an object nested 200,000 levels deep.

``dump_traceback`` answers a small faulthandler stack. Prints "serving N" and runs until killed.
"""
import argparse
import json
import os
import socket
import threading
import time

p = argparse.ArgumentParser()
p.add_argument("--first", type=int, required=True)
p.add_argument("--count", type=int, default=16)
p.add_argument("--kind", choices=("pad", "flat", "deep"), default="pad")
p.add_argument("--fr-bytes", type=int, default=16 << 20)
a = p.parse_args()

ws = os.path.dirname(os.environ["TORCH_WORKER_SERVER_SOCKET"])
os.makedirs(ws, mode=0o700, exist_ok=True)  # torch's server makes it when it starts; we stand in
if a.kind == "flat":
    fr = b'{"entries":[' + b",".join([b"{}"] * ((16 << 20) // 3 - 10)) + b"]}"
elif a.kind == "deep":
    fr = b'{"entries":[{"collective_seq_id":1,"x":' + b"[" * 200000 + b"]" * 200000 + b"}]}"
else:
    doc = {"version": "2.10", "entries": [
        {"collective_seq_id": 7, "pg_id": 0, "is_p2p": False, "retired": False, "state": "scheduled",
         "profiling_name": "gloo:all_reduce"}], "pg_status": {}, "pad": ""}
    base = len(json.dumps(doc).encode())
    doc["pad"] = "p" * max(0, a.fr_bytes - base)
    fr = json.dumps(doc).encode()
STACK = ('Thread 0x00007f0000000001 (most recent call first):\n'
         '  File "/home/u/train.py", line 12 in <module>\n').encode()


def answer(c: socket.socket) -> None:
    try:
        req = c.recv(4096)
        body = STACK if b"dump_traceback" in req else fr
        c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body))
        c.sendall(body)  # apart: no 16 MiB copy per connection
    except OSError:
        pass
    finally:
        c.close()


def listen(path: str) -> socket.socket:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    s = socket.socket(socket.AF_UNIX)
    s.bind(path)  # here, not in a thread: a failure ends the task with its traceback
    s.listen(64)
    return s


def serve(s: socket.socket) -> None:
    while True:
        c, _ = s.accept()
        threading.Thread(target=answer, args=(c,), daemon=True).start()


for s in [listen(f"{ws}/rank_{a.first + i}.sock") for i in range(a.count)]:
    threading.Thread(target=serve, args=(s,), daemon=True).start()
print(f"serving {a.count}", flush=True)
while True:
    time.sleep(60)
