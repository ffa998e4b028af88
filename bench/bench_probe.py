"""Benchmark of the NCCL profiler probe: callback cost (C) and hang localisation (Python).

    python3 bench/bench_probe.py [--ranks 4096] [--per-node 8] [--dir DIR] [--runs 7] [--skip-c]
                                 [--peer-lib OTHER.so]

1. builds spank/build/libnccl-profiler-sattr.so and bench/bench_probe.c, and runs the
   latter: ns per callback on the application, proxy and kernel paths, single thread and
   8 threads (proxy: each on its own communicator, and all on one; application: each on
   its own), the send steps the record lost with 8 threads on one communicator (0 unless
   they share a written cache line), plus the record's size; with --peer-lib, the same
   on another build of the plugin (e.g. an older commit's) in the same run, and the
   ratios ours / peer;
2. writes a bundle of --ranks records (one per rank, --per-node per node; three
   communicators per rank: world, a node-local one and a cross-node one, realistic
   counters, one rank that never launched AllReduce #1000 while the others hang in it)
   and times ``slurm_attr.probe.analyze`` over it (page cache warm, as right after the
   epilog copied the files). Goals: <= 20 ns per event in every threading case, a bounded
   record (110,592 B per rank since layout version 2), <= 150 ms median.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from slurm_attr.bundle import Bundle  # noqa: E402
from slurm_attr.config import Config  # noqa: E402
from slurm_attr.probe import analyze  # noqa: E402
from slurm_attr.probe import layout as L  # noqa: E402
from slurm_attr.probe.reader import read_bundle  # noqa: E402
from slurm_attr.probe.synth import SlotSpec, record_bytes, write_bundle  # noqa: E402

AR, AG, RS = 4, 2, 3
BF16 = 10
WORLD = 0x9E3779B97F4A7C15


def bench_c(iterations: int, lib: str | None = None) -> dict:
    subprocess.run(["make", "-s", "-C", os.path.join(REPO, "spank"), "-f", "probe.mk", "all"], check=True)
    exe = os.path.join(REPO, "spank", "build", "bench_probe")
    subprocess.run(["cc", "-O2", "-std=c11", "-D_GNU_SOURCE", "-Wall", "-Wextra", "-Werror",
                    "-I", os.path.join(REPO, "spank", "probe"), os.path.join(REPO, "bench", "bench_probe.c"),
                    "-o", exe, "-ldl", "-lpthread"], check=True)
    lib = lib or os.path.join(REPO, "spank", "build", "libnccl-profiler-sattr.so")
    out = subprocess.run([exe, lib, str(iterations)], check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def ratios(ours: dict, peer: dict) -> dict:
    """ours / peer for every timed path (min and median): below 1 = we are faster."""
    return {k: {s: round(v[s] / peer[k][s], 2) for s in ("min", "median") if peer[k][s]}
            for k, v in ours.items() if k.endswith("_ns") and k in peer}


def _ring(last_opi: int, funcs: list[tuple[int, int]], seq_of) -> list[tuple[int, int, int, int, int, int]]:
    """The last 16 collectives up to last_opi; funcs alternate (func, count)."""
    out = []
    for opi in range(max(0, last_opi - L.OPRING + 1), last_opi + 1):
        func, count = funcs[opi % len(funcs)]
        out.append((opi, func, count, BF16, -1, seq_of(opi)))
    return out


def make_records(ranks: int, per_node: int, victim: int) -> dict[tuple[str, int], bytes]:
    """One record per rank; rank ``victim`` never launched world AllReduce #1000."""
    nodes = ranks // per_node
    base_mono = 5_000_000_000_000
    rt0 = time.time_ns() - 3600 * 10**9
    records = {}
    for r in range(ranks):
        node, local = divmod(r, per_node)
        last = base_mono + 3_000_000_000 + (r * 7919) % 40_000_000  # within 40 ms of each other
        # world: AllReduce and AllGather alternate; 2000 done; the others ran 1-3 ahead
        ahead = 0 if r == victim else 1 + r % 3
        n_world = 2000 + ahead
        world = SlotSpec(
            comm_hash=WORLD, rank=r, nranks=ranks, name="world",
            launched={AR: (n_world + 1) // 2, AG: n_world // 2}, op_count=n_world,
            ops=_ring(n_world - 1, [(AR, 25_000_000), (AG, 4_000_000)], lambda o: o // 2),
            digest=(n_world * 0x9E3779B97F4A7C15) & (2**64 - 1),
            kernel=(AG, 999) if r == victim else (AR, 1000), kernel_done=(AG, 999),
            inflight=0 if r == victim else 0xFFFF, api=(n_world, n_world, n_world, n_world),
            in_state=(0, 0, 0, 8, 0, 0) if local in (0, per_node - 1) else (0,) * 6,
            last_ns=last - (10**9 if r == victim else 0), pop_started=40 if local in (0, per_node - 1) else 0,
            peers=[{"peer": (r + 1) % ranks, "kind": L.PK_NET_SEND, "send_posted": 48000, "send_done": 48000,
                    "last_ch": 3, "last_send_ms": 3000}] if local == per_node - 1 else
                  [{"peer": (r - 1) % ranks, "kind": L.PK_NET_RECV, "recv_posted": 48008, "recv_done": 48000,
                    "wait": (0, 0, 0, 8, 0, 0), "last_recv_ms": 3000}] if local == 0 else [],
        )
        # node-local tensor-parallel group: NVLink only, nothing in flight
        tp = SlotSpec(
            comm_hash=0x1000 + node, rank=local, nranks=per_node, name="tp",
            launched={RS: 5000, AG: 5000}, op_count=10000,
            ops=_ring(9999, [(RS, 1_000_000), (AG, 1_000_000)], lambda o: o // 2),
            digest=12345, kernel_done=(AG, 4999), last_ns=last,
        )
        # data-parallel group across nodes: network peers both ways, receives posted ahead
        dp = SlotSpec(
            comm_hash=0x2000 + local, rank=node, nranks=nodes, name="dp",
            launched={AR: 300}, op_count=300, ops=_ring(299, [(AR, 50_000_000)], lambda o: o),
            digest=777, kernel_done=(AR, 299), in_state=(0, 0, 0, 8, 0, 0), last_ns=last, pop_started=9600,
            peers=[{"peer": (node + 1) % nodes, "kind": L.PK_NET_SEND, "send_posted": 72000, "send_done": 72000,
                    "last_ch": 1, "last_send_ms": 2990},
                   {"peer": (node - 1) % nodes, "kind": L.PK_NET_RECV, "recv_posted": 72008, "recv_done": 72000,
                    "wait": (0, 0, 0, 8, 0, 0), "last_recv_ms": 2990}],
        )
        records[(f"gpu{node:04d}", r)] = record_bytes(r, [world, tp, dp], pid=10000 + r, node=f"gpu{node:04d}",
                                                      job_id=777, rt_ns=rt0, mono_ns=base_mono)
    return records


def bench_python(ranks: int, per_node: int, root: str, runs: int) -> dict:
    victim = ranks * 3 // 10 + 5
    if not os.path.exists(os.path.join(root, "job.json")):
        t = time.perf_counter()
        recs = make_records(ranks, per_node, victim)
        end = time.time_ns() - 3600 * 10**9 + 3 * 10**9 + 600 * 10**9  # 10 min after the hang
        job = {"job_id": "777", "end_time": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(end / 1e9)),
               "nodes": sorted({n for n, _ in recs}), "ranks": {str(r): n for n, r in recs}}
        write_bundle(root, recs, job)
        print(f"wrote {len(recs)} records to {root} in {time.perf_counter() - t:.1f} s", file=sys.stderr)
    bundle = Bundle(root)
    cfg = Config()
    read_t, total_t, total_cpu = [], [], []
    symptoms = []
    for _ in range(runs):
        t = time.perf_counter()
        records, _cov = read_bundle(Bundle(root))
        read_t.append(time.perf_counter() - t)
        t, c = time.perf_counter(), time.process_time()
        symptoms, _cov = analyze(Bundle(root), cfg)
        total_t.append(time.perf_counter() - t)
        total_cpu.append(time.process_time() - c)
    named = sorted({s.rank for s in symptoms})
    return {
        "ranks": ranks, "files": len(records), "victim": victim, "named": named,
        "symptoms": [s.id for s in symptoms], "read_ms": _ms(read_t), "analyze_ms": _ms(total_t),
        # CPU time (user + system) of the analysis: what the wall time is without other load
        "analyze_cpu_ms": _ms(total_cpu), "bundle_nodes": len(bundle.nodes()),
    }


def _ms(v: list[float]) -> dict:
    return {"min": round(min(v) * 1000, 1), "median": round(statistics.median(v) * 1000, 1)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=4096)
    ap.add_argument("--per-node", type=int, default=8)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--iterations", type=int, default=7_000_000)
    ap.add_argument("--skip-c", action="store_true")
    ap.add_argument("--peer-lib", help="another build of the plugin to measure in the same run")
    args = ap.parse_args()
    out = {}
    if not args.skip_c:
        out["c"] = bench_c(args.iterations)
        if args.peer_lib:
            out["c_peer"] = dict(bench_c(args.iterations, args.peer_lib), lib=args.peer_lib)
            out["c_ratio_vs_peer"] = ratios(out["c"], out["c_peer"])
    root = args.dir or f"/tmp/sattr-bench-probe-{args.ranks}"
    out["python"] = bench_python(args.ranks, args.per_node, root, args.runs)
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
