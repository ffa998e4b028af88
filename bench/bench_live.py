"""Benchmark of the live watch (slurm_attr/live): one aggregation cycle at 4096 ranks and the
watcher's CPU per node at 8 ranks, each against a named peer measured in the same run.

    python3 bench/bench_live.py [--ranks 4096] [--per-node 8] [--runs 5] [--cycles 200] [--dir DIR]
        [--slow-runs N [--slow-scenario slowphase,straggler,healthy] [--phase-delay-us 30000]]
    python3 bench/bench_live.py --cluster-runs N [--scenario nonentry,count,linkstall] [--hang-ms 8000]

1. Aggregation: --ranks synthetic records (bench_probe.make_records: three communicators per
   rank, realistic counters) in one evidence dir per node; every node's watcher writes its
   summary, then the leader's cycle (read every summary from the spool, combine, update the
   hang tracker) is timed, steady state (after a first cycle). Peer: the post-mortem probe
   analysis (slurm_attr.probe.analyze) over the same records as one bundle. Goal: <= 1 s.
2. Node CPU: one node's --per-node records, its watcher's cycle (read the records, summarise,
   write the summary) repeated --cycles times; CPU seconds per cycle = share of one core at
   interval_s = 1. Peer: the post-mortem reader (probe.reader.read_node) on the same files.
   Goal: <= 1 % of one core.
3. Straggler (slow/anomalies.py, S1): the same --ranks records with header rings (world, tp and dp
   collectives; one rank enters every world collective 30 ms late); the node cycles read the
   rings into the summaries once, then --straggler-cycles leader cycles each join 16 newer
   collectives per communicator (the summaries' entries shifted between cycles, untimed;
   16: the world communicator's sampling stride at 4096 ranks).
   Timed: the whole leader cycle, and slow/anomalies.py's part of it. Peer: probe.analyze as in 1.
   Goal: the leader cycle <= 1 s at 4096 ranks. Skipped with --straggler-cycles 0.
4. With --latency-runs N: the probe harness (spank/build/tests/probe_harness, `make -C spank
   test`) plays an 8-rank job here that stalls (--scenario, default nonentry) after ~300
   collectives; two watchers (4 ranks each, interval_s 0.5, hang_after_s --hang-after) run
   beside it; detection latency = finding time - the stall's last recorded event, p50/p99/max
   over N runs per scenario (comma-separated --scenario), printed against hang_after_s (the
   floor: the stall must last that long) and against PyTorch's NCCL watchdog (600 s by
   default), with the runs whose hang class was not the injected one counted. With
   --defaults the watchers run the default [live] settings (hang_after_s 60 as the ceiling,
   the learned threshold down to hang_floor_s 5, interval_s 1); the job must then run
   healthy long enough to be learned (threshold.MIN_SAMPLES cycles): e.g. --lat-ops 1200
   --lat-inject 1000 (about 14 s here). Near misses: bench_live_nearmiss.py.
5. With --cluster-runs N (and nothing else): the stalls of 4 as real 2-node jobs on the
   test cluster (`eval $(bash cluster/testcluster.sh env)`), partition live, where the
   installed plugin starts the watchers; N jobs per --scenario, p50/p99 as in 4.
6. With --slow-runs N: the harness plays an 8-rank job that COMPLETES, only slower, per
   --slow-scenario (comma-separated; default slowphase,straggler,healthy) with two watchers
   beside it as in 4, until it ends: per run the slow findings that came (class, ranks), and
   for slowphase (every rank pauses --phase-delay-us before each collective from collective
   --slow-inject on: S3) the time from the slowdown (the first pause: the entry of collective
   --slow-inject, read from rank 0's record, less the pause) to the S3 finding, p50/max over N.
   The near misses: straggler must give S1 and no S3, healthy nothing.
"""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
from datetime import datetime
import statistics
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_probe import make_records  # noqa: E402

from slurm_attr.bundle import Bundle  # noqa: E402
from slurm_attr.config import Config  # noqa: E402
from slurm_attr.live.watcher import Watcher  # noqa: E402
from slurm_attr.probe import analyze  # noqa: E402
from slurm_attr.probe.reader import read_node  # noqa: E402
from slurm_attr.probe.synth import write_bundle  # noqa: E402

JOB = "4242"


def _layout(root: str, ranks: int, per_node: int) -> tuple[Config, dict[str, str], str]:
    return _write_layout(root, make_records(ranks, per_node, victim=ranks // 2 + 3))


def _write_layout(root: str, recs: dict) -> tuple[Config, dict[str, str], str]:
    """The records as a bundle and as each node's job dir, and a config whose spool is under root."""
    bundle = os.path.join(root, "bundle")
    write_bundle(bundle, recs, {"job_id": JOB})
    jobdirs: dict[str, str] = {}
    for (node, rank), data in recs.items():
        d = jobdirs.setdefault(node, os.path.join(root, "ev", node, JOB))
        os.makedirs(os.path.join(d, "probe"), exist_ok=True)
        with open(os.path.join(d, "probe", f"rank{rank}.probe"), "wb") as f:
            f.write(data.rstrip(b"\0"))
            f.truncate(len(data))
    cfg = Config()
    cfg.paths.spool = os.path.join(root, "spool")
    os.makedirs(cfg.paths.spool)
    cfg.live.hang_after_s = 1e9  # time the aggregation, not a classification
    return cfg, jobdirs, bundle


def _stats(v: list[float]) -> dict:
    return {"min": round(min(v), 4), "median": round(statistics.median(v), 4)}


EXPECTED = {"nonentry": "H1", "count": "H2", "linkstall": "H3"}
WATCHDOG_S = 600.0  # PyTorch's NCCL watchdog default (TORCH_NCCL_... timeout 10 min): the peer to beat


def _pct(xs: list[float], q: float) -> float:
    """Nearest-rank percentile (with 20 runs, p99 is the largest)."""
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, -(-int(q * len(xs) * 100) // 100) - 1))]


def latency(runs: int, scenarios: str, hang_after: float | None, root: str, ops: int = 400, inject: int = 300) -> None:
    """hang_after None: the default Config ([live] hang_after_s 60, hang_floor_s 5, interval_s 1)."""
    harness = os.path.join(REPO, "spank", "build", "tests", "probe_harness")
    lib = os.path.join(REPO, "spank", "build", "libnccl-profiler-sattr.so")
    for scenario in scenarios.split(","):
        lat, wrong = [], 0
        for i in range(runs):
            out, spool = os.path.join(root, f"{scenario}-h{i}"), os.path.join(root, f"{scenario}-s{i}")
            os.makedirs(spool)
            cfg = Config()
            cfg.paths.spool = spool
            if hang_after is not None:
                cfg.live.hang_after_s, cfg.live.interval_s = hang_after, 0.5
            period = cfg.live.interval_s
            p = subprocess.Popen([harness, "run", "--plugin", lib, "--out", out, "--scenario", scenario, "--ops", str(ops),
                                  "--inject", str(inject), "--hang-ms", "60000", "--per-node", "4"],
                                 stdout=subprocess.DEVNULL, start_new_session=True)  # its rank processes go with it (killpg)
            try:
                while not os.path.isdir(os.path.join(out, "nodes", "node1")) and p.poll() is None:
                    time.sleep(0.05)
                ws = [Watcher(cfg, "1", f"n{j}", os.path.join(out, "nodes", f"node{j}"), leader=(j == 0), nnodes=2)
                      for j in (1, 0)]
                found: list[dict] = []
                t0, extra = time.monotonic(), 2  # two more cycles: a side communicator may come first
                while extra and time.monotonic() - t0 < 180:
                    c0 = time.monotonic()
                    for w in ws:
                        found += [f for f in w.cycle() if f.get("kind") != "slow"]
                    extra -= bool(found)
                    time.sleep(max(0.0, period - (time.monotonic() - c0)))
            finally:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
            found = [f for f in found if not f.get("behind")]  # the cause, not a cascade behind it
            wrong += _one_run(f"{scenario} run {i}", scenario, found[0] if found else None, lat)
        cfg = Config()
        _latency_line(f"{scenario}, {len(lat)} of {runs} runs found, {wrong} misclassified", lat,
                      cfg.live.hang_after_s if hang_after is None else hang_after,
                      cfg.live.interval_s if hang_after is None else 0.5)


def _one_run(what: str, scenario: str, f: dict | None, lat: list[float]) -> int:
    """Print one run's finding, add its latency to lat; 1 when its class is not the injected one."""
    if f is None:
        print(f"  {what}: no finding", flush=True)
        return 0
    lat.append(f["detected_ns"] / 1e9 - datetime.fromisoformat(f["waiting_since"]).timestamp())
    ok = f["class"] == EXPECTED.get(scenario, f["class"])
    print(f"  {what}: {f['class']}{'' if ok else ' (WRONG CLASS)'} ranks {f['ranks']} nodes {f.get('nodes')} "
          f"after {lat[-1]:.2f} s", flush=True)
    return int(not ok)


def _latency_line(what: str, lat: list[float], hang_after: float, interval: float) -> None:
    if not lat:
        return
    p50, p99 = statistics.median(lat), _pct(lat, 0.99)
    print(f"detection latency ({what}): p50 {p50:.2f} s, p90 {_pct(lat, 0.9):.2f} s, p99 {p99:.2f} s, max {max(lat):.2f} s; against "
          f"hang_after_s = {hang_after} (interval_s {interval}): p50 {p50 - hang_after:+.2f} s beyond it; "
          f"PyTorch's watchdog ({WATCHDOG_S:.0f} s) / p99 = {WATCHDOG_S / p99:.0f}x", flush=True)


def cluster_latency(runs: int, scenarios: str, hang_ms: int) -> None:
    """The same stalls as a real 2-node job on the test cluster (`eval $(bash
    cluster/testcluster.sh env)` first): partition live, where the installed plugin starts
    the watchers (one harness process per node; the cluster's own [live] settings). Latency
    = the finding's time - the stall's last recorded event, read from the leader's findings."""
    from slurm_attr import config as config_mod
    from slurm_attr.live import findings

    cfg = config_mod.load(os.environ.get("SLURM_ATTR_CONFIG"))
    harness = os.path.join(REPO, "spank", "build", "tests", "probe_harness")
    shm = "/dev/shm/sattr-bench-$SLURM_JOB_ID"
    work = tempfile.mkdtemp(prefix="sattr-bench-")
    for scenario in scenarios.split(","):
        lat, wrong = [], 0
        for i in range(runs):
            script = os.path.join(work, f"{scenario}-{i}.sh")
            with open(script, "w") as f:
                f.write(f"#!/bin/bash\n#SBATCH -N2 -p live -t 5 -o /dev/null\nrm -f {shm}\n"
                        f"srun -N2 --ntasks-per-node=1 bash -c 'exec {harness} run --plugin "
                        f"\"$(echo \"$LD_LIBRARY_PATH\" | cut -d: -f1)/$NCCL_PROFILER_PLUGIN\" --shm {shm} "
                        f"--node-index $SLURM_NODEID --scenario {scenario} --ops 400 --inject 300 --per-node 4 "
                        f"--hang-ms {hang_ms}'\nrm -f {shm}\n")
            job = subprocess.run(["sbatch", "--parsable", script], capture_output=True, text=True,
                                 check=True, cwd=work).stdout.strip().split(";")[0]
            found, t0 = None, time.monotonic()
            while found is None and time.monotonic() - t0 < 180:
                doc = findings.load(cfg.paths.spool, job) or {}
                found = next((f for f in doc.get("findings", [])
                              if f.get("kind") != "slow" and not f.get("behind") and "world" in str(f.get("label"))), None)
                time.sleep(0.2)
            subprocess.run(["scancel", job], capture_output=True)
            while subprocess.run(["squeue", "-h", "-j", job], capture_output=True, text=True).stdout.strip():
                time.sleep(0.5)  # the next run gets idle nodes
            wrong += _one_run(f"{scenario} job {job}", scenario, found, lat)
        _latency_line(f"on the cluster, plugin-started watchers; {scenario}, {len(lat)} of {runs} jobs found, "
                      f"{wrong} misclassified", lat, cfg.live.hang_after_s, cfg.live.interval_s)


WORLD = 0x9e3779b97f4a7c15  # the harness's world communicator (probe_harness.h WORLD_HASH)
SLOW_EXPECTED = {"slowphase": {"S3"}, "straggler": {"S1"}, "healthy": set(), "slowlink": {"S2"}}


def _entry_us(out: str, opi: int) -> int | None:
    """Wall-clock entry (us) of world collective ``opi`` in rank 0's header ring, if it is there."""
    from slurm_attr.probe import layout as L
    from slurm_attr.probe.record import parse
    from slurm_attr.live.slow.ring import ring_entries

    d = os.path.join(out, "nodes", "node0", "probe")
    for name in os.listdir(d) if os.path.isdir(d) else ():
        try:
            with open(os.path.join(d, name), "rb") as f:
                data = f.read()
            rec = parse(data, name, "node0")
        except (OSError, ValueError):
            continue
        if rec.global_rank != 0:
            continue
        ents = ring_entries(rec, data[L.RING_OFF:L.RING_OFF + L.HRING * L.HRING_ENT.size], thin=False)
        for e in ents.get((WORLD, 0), ()):
            if e[0] == opi:
                return e[1]
    return None


def slow_runs(runs: int, scenarios: str, ops: int, inject: int, delay_us: int, root: str) -> None:
    harness = os.path.join(REPO, "spank", "build", "tests", "probe_harness")
    lib = os.path.join(REPO, "spank", "build", "libnccl-profiler-sattr.so")
    for scenario in scenarios.split(","):
        lat, right, durations = [], 0, []
        for i in range(runs):
            out, spool = os.path.join(root, f"{scenario}-h{i}"), os.path.join(root, f"{scenario}-s{i}")
            os.makedirs(spool)
            cfg = Config()
            cfg.paths.spool, cfg.live.interval_s = spool, 0.5
            extra = ["--delay-us", str(delay_us)] if scenario == "slowphase" else []
            t_start = time.monotonic()
            p = subprocess.Popen([harness, "run", "--plugin", lib, "--out", out, "--scenario", scenario, "--ops",
                                  str(ops), "--inject", str(inject), "--per-node", "4"] + extra,
                                 stdout=subprocess.DEVNULL, start_new_session=True)
            found: list[dict] = []
            inject_us = None
            try:
                while not os.path.isdir(os.path.join(out, "nodes", "node1")) and p.poll() is None:
                    time.sleep(0.05)
                ws = [Watcher(cfg, "1", f"n{j}", os.path.join(out, "nodes", f"node{j}"), leader=(j == 0), nnodes=2,
                              show_job=lambda j: None) for j in (1, 0)]
                tail = 2  # two cycles after the job ended: its last collectives' entries
                next_cycle = time.monotonic()
                while tail and time.monotonic() - t_start < 300:
                    if time.monotonic() >= next_cycle:
                        next_cycle += 0.5
                        tail -= p.poll() is not None
                        for w in ws:
                            found += [f for f in w.cycle()  # a refresh returns the same dict again
                                      if f.get("kind") == "slow" and all(f is not g for g in found)]
                    if inject_us is None and scenario == "slowphase":
                        inject_us = _entry_us(out, inject)  # polled: rank 0's ring holds it ~2 s
                    time.sleep(0.02 if inject_us is None and scenario == "slowphase" else 0.1)
            finally:
                try:
                    os.killpg(p.pid, signal.SIGKILL)  # normally long gone: the job completed
                except ProcessLookupError:
                    pass
                p.wait()
            durations.append(time.monotonic() - t_start)
            classes = sorted({f["class"] for f in found})
            ok = set(classes) == SLOW_EXPECTED.get(scenario, set(classes)) and p.returncode == 0
            right += ok
            line = (f"  {scenario} run {i}: exit {p.returncode}, findings "
                    f"{[(f['class'], f['ranks'], str(f['label']).split()[0]) for f in found]}")
            s3 = [f for f in found if f["class"] == "S3"]
            if s3 and inject_us is not None:
                lat.append(s3[0]["detected_ns"] / 1e9 - (inject_us - delay_us) / 1e6)
                st = s3[0]["stats"]
                line += (f"; S3 ({str(s3[0]['label']).split()[0]}) {lat[-1]:.2f} s after the slowdown "
                         f"(period {st['period_ms']} ms, base {st['base_ms']} ms)")
            elif scenario == "slowphase":
                line += f"; inject entry {'not seen' if inject_us is None else 'seen'}"
            print(line + ("" if ok else "  (NOT AS EXPECTED)"), flush=True)
        summary = f"slow {scenario}: {right} of {runs} runs gave exactly {sorted(SLOW_EXPECTED.get(scenario, ()))}"
        if lat:
            summary += (f"; S3 after the slowdown: p50 {statistics.median(lat):.2f} s, max {max(lat):.2f} s "
                        f"({len(lat)} runs; phase_window {Config().live.phase_window}, interval_s 0.5)")
        print(summary + f"; job {statistics.median(durations):.1f} s (median)", flush=True)


def _with_rings(recs: dict, victim: int, late_ms: float = 30.0) -> dict:
    """Header rings for make_records' records: the last 20 collectives of each of the three
    communicators (world slot 0, tp 1, dp 2), 50 ms apart; ``victim`` enters world ones late."""
    from slurm_attr.probe import layout as L
    from slurm_attr.probe.record import parse_header

    out = {}
    for key, data in recs.items():
        rec = parse_header(data, "", "")
        buf = bytearray(data)
        mono0 = rec.create_mono_ns
        pos = 0
        for slot, base in ((0, 1980), (1, 9980), (2, 280)):
            h = L.SLOT_FIXED.unpack_from(data, L.HDR_SIZE + slot * L.SLOT_SIZE)[0]
            for opi in range(base, base + 20):
                late = int(late_ms * 1e6) if (slot == 0 and key[1] == victim) else (key[1] * 7919 % 1000) * 1000
                v = dict.fromkeys(L.HRING_NAMES, 0)
                v.update(tag=pos + 1, slot=slot, func=4, kind=1, comm_hash=h, seq=opi, count=1 << 20,
                         start_ns=mono0 + opi * 50_000_000 + late, opi=opi)
                L.HRING_ENT.pack_into(buf, L.RING_OFF + pos * L.HRING_ENT.size, *(v[n] for n in L.HRING_NAMES))
                pos += 1
        out[key] = bytes(buf)
    return out


def straggler(ranks: int, per_node: int, cycles: int, runs: int, root: str) -> None:
    import json

    victim = ranks // 2 + 5
    cfg, jobdirs, bundle = _write_layout(root, _with_rings(make_records(ranks, per_node, victim=-1), victim))
    nodes = sorted(jobdirs)
    ws = [Watcher(cfg, JOB, n, jobdirs[n], leader=(n == nodes[0]), nnodes=len(nodes), show_job=lambda j: None)
          for n in nodes]
    t0 = time.perf_counter()
    for w in ws:
        w.node_cycle(0.0)
    node_s = (time.perf_counter() - t0) / len(ws)
    leader = ws[0]
    sdir = os.path.join(leader.live_dir, leader.sum_dir)
    base = {n: json.load(open(os.path.join(sdir, f"{n}.json"))) for n in nodes}
    slow_t: list[float] = []
    orig = leader.slow.cycle

    def timed(*args, **kw):
        t = time.perf_counter()
        try:
            return orig(*args, **kw)
        finally:
            slow_t.append(time.perf_counter() - t)

    leader.slow.cycle = timed
    whole, found = [], []
    for i in range(cycles):
        for n, s in base.items():  # 16 newer collectives per communicator since the last cycle
            s2 = dict(s, now_ns=time.time_ns(), slow=dict(s["slow"], e=[
                [h, cr, [[o + 16 * i, t + 16 * i * 50_000, fn] for o, t, fn in ents]] for h, cr, ents in s["slow"]["e"]]))
            with open(os.path.join(sdir, f".{n}.tmp"), "w") as f:
                json.dump(s2, f)
            os.rename(os.path.join(sdir, f".{n}.tmp"), os.path.join(sdir, f"{n}.json"))
        t = time.perf_counter()
        found += [f for f in leader.leader_cycle(float(i + 1)) if f.get("kind") == "slow"]
        whole.append(time.perf_counter() - t)
    peer = []
    for _ in range(runs):
        t = time.perf_counter()
        analyze(Bundle(bundle), cfg)
        peer.append(time.perf_counter() - t)
    s1 = [f for f in found if f["class"] == "S1"]
    steady = whole[1:] or whole
    print(f"straggler, {ranks} ranks on {len(nodes)} nodes, {cycles} leader cycles: leader cycle {_stats(steady)} s "
          f"(slow/anomalies.py part {_stats(slow_t[1:] or slow_t)} s); peer probe.analyze {_stats(peer)} s; "
          f"ratio leader/peer (median) {statistics.median(steady) / statistics.median(peer):.2f}; goal <= 1 s; "
          f"node cycle with rings {node_s * 1e3:.1f} ms per node")
    print(f"  S1: {s1[0]['what'] if s1 else 'none'} (victim rank {victim}; error {leader.slow.error})")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=4096)
    ap.add_argument("--per-node", type=int, default=8)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--cycles", type=int, default=200)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--latency-runs", type=int, default=0)
    ap.add_argument("--scenario", default="nonentry", help="comma-separated: nonentry,count,linkstall")
    ap.add_argument("--hang-after", type=float, default=5.0)
    ap.add_argument("--defaults", action="store_true", help="--latency-runs with the default [live] settings")
    ap.add_argument("--lat-ops", type=int, default=400, help="--latency-runs: the harness's --ops")
    ap.add_argument("--lat-inject", type=int, default=300, help="--latency-runs: the harness's --inject")
    ap.add_argument("--straggler-cycles", type=int, default=40)
    ap.add_argument("--slow-runs", type=int, default=0)
    ap.add_argument("--slow-scenario", default="slowphase,straggler,healthy")
    ap.add_argument("--slow-ops", type=int, default=400)
    ap.add_argument("--slow-inject", type=int, default=300)
    ap.add_argument("--phase-delay-us", type=int, default=30000)
    ap.add_argument("--cluster-runs", type=int, default=0, help="jobs per --scenario on the test cluster, then stop")
    ap.add_argument("--hang-ms", type=int, default=8000, help="--cluster-runs: how long a hung job stays")
    a = ap.parse_args()
    if a.cluster_runs:
        cluster_latency(a.cluster_runs, a.scenario, a.hang_ms)
        return 0
    if a.slow_runs:
        with tempfile.TemporaryDirectory(dir=a.dir) as root:
            slow_runs(a.slow_runs, a.slow_scenario, a.slow_ops, a.slow_inject, a.phase_delay_us, root)
    if a.straggler_cycles:
        with tempfile.TemporaryDirectory(dir=a.dir) as root:
            straggler(a.ranks, a.per_node, a.straggler_cycles, a.runs, root)
    if a.latency_runs:
        with tempfile.TemporaryDirectory(dir=a.dir) as root:
            latency(a.latency_runs, a.scenario, None if a.defaults else a.hang_after, root, a.lat_ops, a.lat_inject)
    with tempfile.TemporaryDirectory(dir=a.dir) as root:
        cfg, jobdirs, bundle = _layout(root, a.ranks, a.per_node)
        nodes = sorted(jobdirs)
        watchers = [Watcher(cfg, JOB, n, jobdirs[n], leader=(n == nodes[0]), nnodes=len(nodes)) for n in nodes]
        t0 = time.perf_counter()
        for w in watchers:
            w.node_cycle(0.0)
        all_nodes_s = time.perf_counter() - t0
        leader = watchers[0]
        leader.leader_cycle(0.0)  # first cycle: the tracker learns every rank
        live, peer = [], []
        for i in range(a.runs):
            t0 = time.perf_counter()
            leader.leader_cycle(float(i + 1))
            live.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            analyze(Bundle(bundle), cfg)
            peer.append(time.perf_counter() - t0)
        sums, _ = leader.summaries()
        size = sum(os.path.getsize(os.path.join(leader.live_dir, leader.sum_dir, f"{n}.json")) for n in nodes)
        print(f"aggregation cycle, {a.ranks} ranks on {len(nodes)} nodes ({len(sums)} summaries, "
              f"{size / len(nodes) / 1024:.1f} KiB each): {_stats(live)} s; "
              f"peer probe.analyze (post-mortem, same records): {_stats(peer)} s; "
              f"ratio live/peer (median) {statistics.median(live) / statistics.median(peer):.2f}; goal <= 1 s")
        print(f"  (all {len(nodes)} node cycles run serially here: {all_nodes_s:.2f} s; on a cluster each node runs its own)")

        # ---- node CPU at --per-node ranks ----
        w = watchers[1] if len(watchers) > 1 else watchers[0]
        w.leader = False
        c0 = time.process_time()
        for i in range(a.cycles):
            w.node_cycle(float(i))
        cyc = (time.process_time() - c0) / a.cycles
        b = Bundle(bundle)
        c0 = time.process_time()
        for _ in range(a.cycles):
            read_node(b, w.node, time.monotonic() + 30)
        rd = (time.process_time() - c0) / a.cycles
        print(f"node watcher, {a.per_node} ranks: {cyc * 1e3:.2f} ms CPU per cycle = {cyc * 100:.2f} % of one core "
              f"at interval_s = 1; peer read_node (post-mortem reader, same files): {rd * 1e3:.2f} ms; "
              f"ratio {cyc / rd:.1f}; goal <= 1 %")
    return 0


if __name__ == "__main__":
    sys.exit(main())
