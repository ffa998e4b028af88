"""Benchmark of evidence before the kill (slurm_attr/live/dumps.py): pulling every local
rank's Flight Recorder and stacks from torch's worker server, against curl in the same run.

    python3 bench/bench_live_dumps.py [--ranks 4] [--entries 2000] [--runs 5]

--ranks real torch processes (Gloo, one rank each, their own group) fill their FR ring with
--entries all_reduces, start ``_WorkerServer`` at ``<dir>/ws/rank_<N>.sock`` and park. Timed,
min and median over --runs: ``dumps.collect`` (pipes, then ``dump_traceback`` and
``fr_trace_json`` from every rank, each parsed: stuck line, FR status) -- what one node's
watcher does on a request. Peer: ``curl --unix-socket PATH -X POST
http://localhost/handler/<name>`` for the same two handlers of every rank, one curl process
each, sequentially (the issue's own example), output discarded. Also printed: the bytes of one
rank's FR reply, and the watcher's own CPU for one FR poll of every rank (``dumps.poll_fr``,
what a node does every poll period for a job without probe records). Needs torch and curl.
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

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from slurm_attr.live import dumps, workerclient  # noqa: E402
from slurm_attr.live.hang.frdetect import poll_period  # noqa: E402

RANK = r"""
import sys, time
import torch, torch.distributed as dist
from torch._C._distributed_c10d import _WorkerServer
sock, store, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
dist.init_process_group("gloo", rank=0, world_size=1, init_method="file://" + store)
t = torch.ones(16)
for _ in range(n):
    dist.all_reduce(t)
s = _WorkerServer(sock)
print("ready", flush=True)
time.sleep(3600)
"""


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--entries", type=int, default=2000)
    ap.add_argument("--runs", type=int, default=5)
    a = ap.parse_args()
    if shutil.which("curl") is None:
        print("curl not found: the peer cannot run")
        return 1
    d = tempfile.mkdtemp(prefix="sattr-bd-", dir="/tmp")
    os.mkdir(f"{d}/ws")
    script = f"{d}/rank.py"
    with open(script, "w") as f:
        f.write(RANK)
    procs = []
    try:
        for r in range(a.ranks):
            p = subprocess.Popen([sys.executable, script, f"{d}/ws/rank_{r}.sock", f"{d}/store{r}", str(a.entries)],
                                 stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            procs.append(p)
        for p in procs:
            if p.stdout.readline().strip() != "ready":
                print("a rank did not start")
                return 1
        time.sleep(0.5)
        uid = os.getuid()
        ours, peer = [], []
        for _ in range(a.runs):
            t0 = time.perf_counter()
            res = dumps.collect(d, dumps.Limits(uid), lambda *x: None)
            ours.append(time.perf_counter() - t0)
            assert len(res["ranks"]) == a.ranks, res
            t0 = time.perf_counter()
            for r in range(a.ranks):
                for h in ("dump_traceback", "fr_trace_json"):
                    subprocess.run(["curl", "-s", "-o", "/dev/null", "--unix-socket", f"{d}/ws/rank_{r}.sock",
                                    "-X", "POST", f"http://localhost/handler/{h}"], check=True)
            peer.append(time.perf_counter() - t0)
        size = len(workerclient.post(f"{d}/ws/rank_0.sock", "fr_trace_json", uid))
        cpu = []
        for _ in range(a.runs):  # the FR poll of a job without probe records (hang/frdetect.py)
            c0 = time.process_time()
            assert len(dumps.poll_fr(d, dumps.Limits(uid))[0]) == a.ranks
            cpu.append(time.process_time() - c0)
        period = poll_period(1.0, 60.0)  # at the defaults interval_s = 1, hang_after_s = 60
        print(f"FR poll of {a.ranks} ranks: watcher CPU min {min(cpu) * 1000:.1f} ms, median "
              f"{statistics.median(cpu) * 1000:.1f} ms per poll = {statistics.median(cpu) / period * 100:.2f} % "
              f"of one core at one poll per {period:.0f} s")
        om, pm = min(ours), min(peer)
        print(f"collect from {a.ranks} ranks ({a.entries} FR entries each, FR reply {size / 1024:.0f} KiB/rank): "
              f"dumps.collect min {om * 1000:.1f} ms, median {statistics.median(ours) * 1000:.1f} ms; "
              f"curl (peer) min {pm * 1000:.1f} ms, median {statistics.median(peer) * 1000:.1f} ms; "
              f"ratio ours/curl {om / pm:.2f} (min), {statistics.median(ours) / statistics.median(peer):.2f} (median)")
    finally:
        for p in procs:
            p.kill()
            p.wait()
        shutil.rmtree(d, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
