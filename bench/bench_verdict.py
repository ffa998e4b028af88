"""Benchmark: the verdict's reasoning (verdict.decide: attempt, contradiction, first failure, the
network vote) against the rule extraction of the same bundle (rules.analyze), in one run.

Not a test. Writes a large incident bundle into a temporary directory: N nodes x 8 ranks, each
node's kernel log (noise, one Xid 79 during teardown on one node), job output with every rank's
NCCL IB completion errors naming peers, glog-stamped watchdog timeouts, NCCL bootstrap INFO
lines, and one rank's traceback first. Prints the time of each step and decide/extract.

    python bench/bench_verdict.py [--nodes 128] [--repeat 5]
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

from slurm_attr.bundle import Bundle
from slurm_attr.config import Config
from slurm_attr.rules import analyze
from slurm_attr.verdict import decide


def write_bundle(root: str, nodes: int) -> None:
    names = [f"gpu-{i:03d}" for i in range(nodes)]
    job = {"job_id": "1", "nodes": names, "state": "FAILED", "exit_code": 1, "signal": 0,
           "start_time": "2024-05-02T09:00:00+00:00", "end_time": "2024-05-02T10:20:00+00:00",
           "ranks": {str(r): names[r // 8] for r in range(nodes * 8)}}
    os.makedirs(os.path.join(root, "output"))
    with open(os.path.join(root, "job.json"), "w") as f:
        json.dump(job, f)
    out = []
    for r in range(nodes * 8):
        n = names[r // 8]
        out.append(f"{r}: {n}:{4000 + r}:{4000 + r} [{r % 8}] NCCL INFO Bootstrap : Using ib0:10.0.{r // 8 // 250}.{r // 8 % 250}<0>")
    out.append("5: [rank5]:[W502 10:00:00.100000 4005 train.py:1] step 9000")
    out += ["5: [rank5]: Traceback (most recent call last):", "5: [rank5]:   File \"train.py\", line 9, in <module>",
            "5: [rank5]: KeyError: 'labels'"]
    for r in range(nodes * 8):
        n, peer = names[r // 8], (r // 8 + 1) % nodes
        out.append(f"[2024-05-02 10:00:0{1 + r % 8}] {n}:{4000 + r}:{4100 + r} [{r % 8}] transport/net_ib.cc:1295 NCCL WARN NET/IB : "
                   f"Got completion from peer 10.0.{peer // 250}.{peer % 250}<5{r % 10000:04d}> with status=12 opcode=0 len=0 vendor err 129 (Send)")
        out.append(f"{r}: [rank{r}]:[E502 10:10:0{r % 8}.100000 {4000 + r} ProcessGroupNCCL.cpp:616] [Rank {r}] Watchdog caught collective "
                   f"operation timeout: WorkNCCL(SeqNum=77, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600009 milliseconds before timing out.")
    with open(os.path.join(root, "output", "stdout"), "w") as f:
        f.write("\n".join(out) + "\n")
    for i, n in enumerate(names):
        d = os.path.join(root, "nodes", n)
        os.makedirs(d)
        lines = [f"2024-05-02T09:{m:02d}:00+00:00 {n} kernel: audit: type=1400 audit(1714641040.112:213): apparmor=\"DENIED\"" for m in range(60)]
        if i == 3:
            lines.append(f"2024-05-02T10:04:00+00:00 {n} kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=python, GPU has fallen off the bus.")
        with open(os.path.join(d, "kernel.log"), "w") as f:
            f.write("\n".join(lines) + "\n")
        with open(os.path.join(d, "collect.json"), "w") as f:
            json.dump({"sources": {"kernel": {"status": "ok"}}}, f)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        write_bundle(tmp, a.nodes)
        b = Bundle(tmp)
        cfg = Config()
        analyze(b, cfg)  # warm the catalog
        t_ex, t_de = [], []
        for _ in range(a.repeat):
            t0 = time.perf_counter()
            syms, cov = analyze(b, cfg)
            t1 = time.perf_counter()
            v = decide(b.job, syms, cov)
            t2 = time.perf_counter()
            t_ex.append(t1 - t0)
            t_de.append(t2 - t1)
        ex, de = min(t_ex), min(t_de)
        print(f"bundle: {a.nodes} nodes, {a.nodes * 8} ranks, {len(syms)} symptoms -> {v.cause} {v.culprit_nodes[:3]} ranks {v.culprit_ranks[:3]}")
        print(f"rules.analyze (extraction, the peer): {ex * 1000:8.1f} ms")
        print(f"verdict.decide (reasoning):           {de * 1000:8.1f} ms")
        print(f"decide / extract: {de / ex:.2f}")


if __name__ == "__main__":
    main()
