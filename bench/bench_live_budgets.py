"""What a hostile job's worker servers cost one node's watcher (issue 21), against peers in
the same run:

    python3 bench/bench_live_budgets.py [--slow 256] [--hostile 16] [--runs 3]

- **Slow sockets**: ``--slow`` servers accept and never answer. Timed: one pre-kill collection
  (``dumps.collect``: ``dump_traceback`` and ``fr_trace_json`` of every socket, one round under
  one deadline). Peer: ``curl --unix-socket ... --max-time 3`` for the same 2 x N requests, all
  started at once (``xargs -P``), the best a shell does with the same per-request timeout. The
  client before issue 21 asked one socket after another: 2 x N x 3 s, printed for reference.
- **Replies built to cost memory**: ``--hostile`` servers answer every ``fr_trace_json`` with
  16 MiB of ``{"entries":[{},{},...]}``. Measured in a child each: the peak RSS of one FR poll
  of every socket (``dumps.poll_fr``, the watcher's path), and of the same replies read whole
  and decoded with ``json.loads`` (the watcher before issue 21), one after another.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
SERVERS = os.path.join(HERE, "..", "tests", "unit", "worker_servers.py")

from slurm_attr.live import dumps  # noqa: E402

POLL = r"""
import os, sys, json
sys.path.insert(0, sys.argv[3])
from slurm_attr.live import dumps, workerclient
d, how = sys.argv[1], sys.argv[2]
n = len([x for x in os.listdir(d + "/ws")])
if how == "ours":
    got, _ = dumps.poll_fr(d, dumps.Limits(os.getuid()))
    bad = sum(1 for v in got.values() if "error" in v)
else:  # the watcher before: read whole (16 MiB cap), json.loads, one after another
    bad = 0
    for r in range(n):
        doc = json.loads(workerclient.post(f"{d}/ws/rank_{r}.sock", "fr_trace_json", os.getuid(), cap=16 << 20))
        bad += isinstance(doc, dict)
        del doc
# VmHWM: this image's own peak (ru_maxrss carries the forking parent's across exec)
print(int(open("/proc/self/status").read().split("VmHWM:")[1].split()[0]) / 1024, bad)
"""


def _servers(d: str, n: int, body: bytes | None) -> subprocess.Popen:
    os.mkdir(f"{d}/ws")
    for r in range(n):
        with open(f"{d}/reply_{r}" + (".never" if body is None else ""), "wb") as f:
            f.write(body or b"")
    p = subprocess.Popen([sys.executable, SERVERS, d], stdout=subprocess.PIPE, text=True)
    if p.stdout.readline().strip() != "ready":
        raise SystemExit("servers did not start")
    return p


def slow(n: int, runs: int) -> None:
    d = tempfile.mkdtemp(prefix="sattr-bb-", dir="/tmp")
    p = _servers(d, n, None)
    try:
        ours, peer = [], []
        for _ in range(runs):
            t0 = time.perf_counter()
            res = dumps.collect(d, dumps.Limits(os.getuid(), max_sockets=n, timeout_s=30), lambda *a: None)
            ours.append(time.perf_counter() - t0)
            assert len(res["ranks"]) == n and all("fr_error" in r for r in res["ranks"].values())
            urls = "".join(f"{d}/ws/rank_{r}.sock {h}\n" for r in range(n) for h in ("dump_traceback", "fr_trace_json"))
            t0 = time.perf_counter()
            subprocess.run(["xargs", "-P", str(2 * n), "-n", "2", "sh", "-c",
                            'curl -s -o /dev/null --max-time 3 --unix-socket "$0" -X POST "http://localhost/handler/$1"'],
                           input=urls, text=True, check=False)
            peer.append(time.perf_counter() - t0)
        print(f"{n} silent sockets, one collection (2 x {n} requests): dumps.collect min {min(ours):.2f} s, "
              f"median {statistics.median(ours):.2f} s; curl --max-time 3 all at once (peer) min {min(peer):.2f} s, "
              f"median {statistics.median(peer):.2f} s; ratio {statistics.median(ours) / statistics.median(peer):.2f} "
              f"(median); one socket after another (before issue 21): {2 * n * 3} s")
    finally:
        p.kill()
        shutil.rmtree(d, ignore_errors=True)


def hostile(n: int) -> None:
    d = tempfile.mkdtemp(prefix="sattr-bb-", dir="/tmp")
    body = b'{"entries":[' + b",".join([b"{}"] * ((16 << 20) // 3 - 10)) + b"]}"
    p = _servers(d, n, body)
    try:
        out = {}
        for how in ("ours", "json.loads"):
            r = subprocess.run([sys.executable, "-c", POLL, d, how, os.path.join(HERE, "..")],
                               capture_output=True, text=True, check=True)
            mb, bad = r.stdout.split()
            out[how] = (float(mb), int(bad))
        print(f"{n} sockets answering 16 MiB of {{}},{{}},...: one FR poll's peak RSS {out['ours'][0]:.0f} MB "
              f"({out['ours'][1]} of {n} refused, each with its reason); whole replies through json.loads "
              f"(peer, the watcher before issue 21) {out['json.loads'][0]:.0f} MB; ratio "
              f"{out['ours'][0] / out['json.loads'][0]:.2f}")
    finally:
        p.kill()
        shutil.rmtree(d, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--slow", type=int, default=256)
    ap.add_argument("--hostile", type=int, default=16)
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    if shutil.which("curl") is None or shutil.which("xargs") is None:
        print("curl and xargs are needed for the peer")
        return 1
    if a.slow:
        slow(a.slow, a.runs)
    if a.hostile:
        hostile(a.hostile)
    return 0


if __name__ == "__main__":
    sys.exit(main())
