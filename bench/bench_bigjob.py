"""Benchmark: what analysing a big job costs (issue 23 item 5, "Big jobs").

For each size it writes a bundle of N nodes x 8 GPUs with bench/bigjob/gen.py (Xid 79 on one
GPU, the cascade on every other rank, a Flight Recorder dump per rank) into a temporary
directory, then measures, each in a fresh child process:

1. bundle -> verdict: ``analysis.run_bundle`` and the offline drain policy, the calls `sattr
   analyze DIR` and the central analysis make (bench/accuracy/engine.py), with the process's wall
   time and peak RSS, and whether the verdict is right (gpu_hardware, the node, its drain);
2. the Flight Recorder analysis alone (``flightrec.inspect``, what ``flightrec.analyze`` runs
   for the verdict) on the dumps of ``--fr-ranks`` ranks, and whether its culprits are the
   dead node's ranks;
3. the node epilogs of a ``--epilog-nodes`` job writing their parts to one spool at once:
   one forked process per node (``--epilog-procs`` fewer: each does several in turn), released
   together, each calling ``collect.node.collect_node`` as the node epilog does, on that node's
   kernel log and FR dumps from the generated bundle staged as its evidence dir.

Generation is timed apart and not counted. Peak RSS is the analysis process's own plus two
workers at the largest worker's peak (its worker pools have two processes on this machine).

    python bench/bench_bigjob.py                      # 512 and 4096 nodes, 32,768 ranks, 512 epilogs (many minutes)
    python bench/bench_bigjob.py --quick              # 64 nodes, 4,096 ranks, 64 epilogs (about a minute)
    python bench/bench_bigjob.py --nodes 512 --fr-ranks 4096 --epilog-nodes 512

Goals (2-core machine): 512 nodes <= 10 s; 4096 nodes <= 60 s and <= 2 GiB; 32,768 ranks of FR
dumps <= 15 s and <= 2 GiB with the culprit right; 512 parallel node-epilog writes <= 5 s in all.
Not a test: nothing here asserts a time.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
import traceback
from datetime import datetime

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, REPO)

from accuracy import fmt_job  # noqa: E402
from bench_flightrec import measure  # noqa: E402
from bigjob import gen  # noqa: E402

GiB, MiB = 1 << 30, 1 << 20
KEPT = "bench-params.json"  # beside a --keep bundle: what it was generated with
WORKERS = 2  # flightrec._workers() and the rules' forked readers on a 2-core machine

# The verdict as the central analysis reaches it, in a fresh interpreter (as the hook starts it).
VERDICT = """
import json, resource, sys, time
sys.path.insert(0, sys.argv[2])
from accuracy import engine
analyze = engine.in_process()
t0 = time.monotonic()
v = analyze(sys.argv[1])
secs = time.monotonic() - t0
me, kids = (resource.getrusage(w).ru_maxrss * 1024 for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
print(json.dumps({"seconds": secs, "rss_self": me, "rss_kids": kids, "error": v.get("error"),
                  "cause": v.get("cause"), "nodes": (v.get("culprit") or {}).get("nodes"),
                  "drains": sorted(a["node"] for a in v.get("actions", []) if a["kind"] in ("drain", "reboot")),
                  "summary": v.get("summary"), "symptoms": len(v.get("symptoms", []))}))
"""

FR_ALONE = """
import json, resource, sys, time
t0 = time.monotonic()
from slurm_attr import flightrec
from slurm_attr.bundle import Bundle
from slurm_attr.config import Config
rep = flightrec.inspect(Bundle(sys.argv[1]), Config())
secs = time.monotonic() - t0
roots = [s for s in rep.symptoms if s.role == "root"]
me, kids = (resource.getrusage(w).ru_maxrss * 1024 for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
print(json.dumps({"seconds": secs, "load_seconds": rep.dumps.seconds, "rss_self": me, "rss_kids": kids,
                  "roots": sorted({(s.id, s.node) for s in roots}), "root_ranks": sorted(s.rank for s in roots),
                  "loaded": len(rep.dumps.traces), "problems": len(rep.dumps.problems),
                  "coverage": [c.detail for c in rep.coverage if c.status != "ok"][:3]}))
"""


def child(script: str, args: list[str], timeout: float) -> dict:
    r = measure([sys.executable, "-c", script, *args], timeout)
    try:
        info = json.loads(r["stdout"].strip().splitlines()[-1])
    except (ValueError, IndexError):
        info = {"error": f"exit {r['rc']}{' (timed out)' if r['timed_out'] else ''}: {r['stderr'][-600:]}"}
    info["wall"] = r["wall"]  # the whole process: interpreter, imports, analysis
    info["peak"] = info.get("rss_self", r["maxrss"]) + WORKERS * info.get("rss_kids", 0)
    info["largest"] = r["maxrss"]
    return info


def fastest(runs: list[dict]) -> dict:
    """The fastest of repeated runs (others on a shared machine only ever add time), with the
    highest peak memory of all of them and every wall time."""
    best = dict(min(runs, key=lambda r: r["wall"]))
    best["peak"] = max(r.get("peak", 0) for r in runs)
    best["walls"] = [round(r["wall"], 1) for r in runs]
    return best


def verdict_row(path: str, truth: dict, timeout: float, repeat: int = 1) -> dict:
    v = fastest([child(VERDICT, [path, HERE], timeout) for _ in range(repeat)])
    v["right"] = (v.get("cause") == truth["cause"] and v.get("nodes") == truth["nodes"]
                  and v.get("drains") == truth["drain"])
    return v


def fr_row(path: str, truth: dict, ranks: int, timeout: float, repeat: int = 1) -> dict:
    f = fastest([child(FR_ALONE, [path], timeout) for _ in range(repeat)])
    # The FR sees only the job's side: right when every root it names is a rank of the dead node.
    nodes = {n for _id, n in f.get("roots", [])}
    f["right"] = nodes == set(truth["nodes"]) and truth["ranks"][0] in f.get("root_ranks", [])
    f["complete"] = f.get("loaded") == ranks
    return f


# -- the node epilogs of one job, all at once -------------------------------------------------
def stage_epilogs(bundle: str, stage: str) -> tuple[dict, list[str]]:
    """Each node's evidence dir and kernel log as its epilog finds them (hard links into the
    bundle), with the plugin's root-owned rank map; returns (job.json, nodes)."""
    with open(os.path.join(bundle, "job.json")) as f:
        job = json.load(f)
    nodes, jid = job["nodes"], job["job_id"]
    hosts = fmt_job.hostlist(nodes)
    for i, node in enumerate(nodes):
        src = os.path.join(bundle, "nodes", node)
        ev = os.path.join(stage, node, "ev")
        os.makedirs(os.path.join(ev, jid, "fr"), mode=0o755)
        for name in os.listdir(os.path.join(src, "fr")):
            os.link(os.path.join(src, "fr", name), os.path.join(ev, jid, "fr", name))
        os.link(os.path.join(src, "kernel.log"), os.path.join(stage, node, "kern.log"))
        with open(os.path.join(src, "collect.json")) as f:
            ranks = json.load(f)["ranks"]["0"]
        fd = os.open(os.path.join(ev, f"{jid}.ranks.0.{i}"), os.O_WRONLY | os.O_CREAT, 0o600)
        os.write(fd, "".join(f"0 {r} {i} {hosts}\n" for r in ranks).encode())
        os.close(fd)
    return job, nodes


def write_part(bundle: str, spool_dir: str, jid: str, node: str) -> None:
    """The node's files from the generated bundle onto the spool the way collect_node writes
    them (its directories, then write_private each, collect.json last): the writes alone."""
    from slurm_attr import spool
    from slurm_attr.collect.node import write_private

    src, dst = os.path.join(bundle, "nodes", node), os.path.join(spool.bundle_dir(spool_dir, jid), "nodes", node)
    spool.ensure_dir(os.path.join(dst, "fr"))
    for rel in ["kernel.log"] + [f"fr/{n}" for n in sorted(os.listdir(os.path.join(src, "fr")))] + ["collect.json"]:
        with open(os.path.join(src, rel), "rb") as f:
            write_private(os.path.join(dst, rel), f.read())


def epilog_storm(bundle: str, tmp: str, procs: int, collect: bool = True) -> dict:
    """Fork one process per node (or per group of nodes), release them together, each writing
    its node's part: ``collect`` with collect_node (the whole node epilog's collection: kernel
    window, ledger, copies), else the same files alone (write_part). Wall time from the
    release to the last exit."""
    from slurm_attr.collect import ledger
    from slurm_attr.collect.node import NodeJob, collect_node
    from slurm_attr.config import Config

    stage, spool_dir = os.path.join(tmp, "epilog-stage"), os.path.join(tmp, "epilog-spool")
    shutil.rmtree(stage, ignore_errors=True)
    shutil.rmtree(spool_dir, ignore_errors=True)
    job, nodes = stage_epilogs(bundle, stage)
    jid = job["job_id"]
    start, end = (datetime.fromisoformat(job[k]).timestamp() for k in ("start_time", "end_time"))

    def run(node: str) -> None:
        if not collect:
            write_part(bundle, spool_dir, jid, node)
            return
        cfg = Config()
        cfg.paths.spool, cfg.paths.evidence_root = spool_dir, os.path.join(stage, node, "ev")
        cfg.paths.node_state = os.path.join(stage, node, "state")
        cfg.collect.kernel_source, cfg.collect.kernel_file = "file", os.path.join(stage, "%n", "kern.log")
        collect_node(cfg, NodeJob(job_id=jid, node=node, bundle_key=jid, start=start, end=end + 5))

    ledger.matched_line_indexes(b"warm-up\n")  # imports done once before the forks
    procs = max(1, min(procs, len(nodes)))
    gate_r, gate_w = os.pipe()
    pids = []
    for i in range(procs):
        pid = os.fork()
        if pid == 0:  # an epilog: wait for the gate, write its node(s), exit
            os.close(gate_w)
            os.read(gate_r, 1)
            code = 0
            try:
                for node in nodes[i::procs]:
                    run(node)
            except BaseException:  # noqa: BLE001 - report it, and the exit code counts it
                traceback.print_exc()
                code = 1
            os._exit(code)
        pids.append(pid)
    os.close(gate_r)
    t0 = time.monotonic()
    os.close(gate_w)  # every child's read returns at once
    failed, largest = 0, 0
    for pid in pids:
        _, status, ru = os.wait4(pid, 0)
        failed += os.waitstatus_to_exitcode(status) != 0
        largest = max(largest, ru.ru_maxrss * 1024)
    wall = time.monotonic() - t0
    parts = os.path.join(spool_dir, "bundles", jid, "nodes")
    done = sum(os.path.exists(os.path.join(parts, n, "collect.json")) for n in nodes)
    # An epilog out of time (collect.time_budget_s) stops copying: its part is written but cut.
    cut = sum(any(src.get("detail") == "time budget exhausted" for src in _sources(parts, n)) for n in nodes)
    written = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(parts) for f in fs)
    shutil.rmtree(stage, ignore_errors=True)
    shutil.rmtree(spool_dir, ignore_errors=True)
    return {"wall": wall, "nodes": len(nodes), "procs": procs, "failed": failed, "done": done, "cut": cut,
            "bytes": written, "largest": largest}


def _sources(parts: str, node: str) -> list[dict]:
    try:
        with open(os.path.join(parts, node, "collect.json")) as f:
            return list(json.load(f)["sources"].values())
    except (OSError, ValueError, KeyError):
        return []


# -- the run -----------------------------------------------------------------------------------
def reuse(path: str, nodes: int, seed: int, entries: int) -> dict | None:
    """The truth of a bundle --keep left at ``path`` with these parameters, or None (generate it)."""
    try:
        with open(os.path.join(path, "truth.json")) as f:
            truth = json.load(f)
        with open(os.path.join(path, KEPT)) as f:
            made_with = json.load(f)
    except (OSError, ValueError):
        return None
    return truth if made_with == {"nodes": nodes, "seed": seed, "entries": entries} else None


def fmt_s(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f} s" if x < 10 else f"{x:.1f} s"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", default="512,4096", help="bundle sizes (nodes x 8 GPUs) analysed into a verdict")
    ap.add_argument("--fr-ranks", type=int, default=32768, help="ranks whose FR dumps are analysed alone (0: skip)")
    ap.add_argument("--epilog-nodes", type=int, default=512, help="node epilogs writing at once (0: skip)")
    ap.add_argument("--epilog-procs", type=int, default=0, help="processes for them (default: one per node)")
    ap.add_argument("--entries", type=int, default=2000, help="Flight Recorder entries per rank (torch's ring)")
    ap.add_argument("--quick", action="store_true", help="64 nodes, 4,096 ranks of 500 entries, 64 epilogs")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=2, help="processes generating the bundles")
    ap.add_argument("--dir", default="/var/tmp", help="where the temporary bundles go (GBs: 32,768 ranks ~ 20 GB)")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds one analysis may run")
    ap.add_argument("--repeat", type=int, default=1, help="runs of each measurement; the fastest is kept")
    ap.add_argument("--keep", metavar="DIR", help="write the bundles to DIR/b<nodes> and keep them; a bundle already "
                    "there (its truth.json written last) is reused, so a before/after comparison skips generation")
    a = ap.parse_args(argv)
    if a.quick:
        a.nodes, a.fr_ranks, a.entries, a.epilog_nodes = "64", 4096, 500, 64
    sizes = [int(x) for x in a.nodes.split(",") if x]
    fr_nodes = a.fr_ranks // gen.GPUS
    tmp = tempfile.mkdtemp(prefix="sattr-bigjob-", dir=a.dir)
    keep = os.path.abspath(a.keep) if a.keep else None
    rows: dict[str, dict] = {}
    made: list[str] = []
    try:
        for n in sorted(set(sizes) | {fr_nodes, a.epilog_nodes} - {0}):
            path = os.path.join(keep or tmp, f"b{n}")
            t0 = time.monotonic()
            truth = reuse(path, n, a.seed, a.entries) if keep else None
            if truth is None:
                shutil.rmtree(path, ignore_errors=True)
                truth = gen.generate(path, n, a.seed, a.entries, workers=a.workers)
                if keep:
                    with open(os.path.join(path, KEPT), "w") as f:
                        json.dump({"nodes": n, "seed": a.seed, "entries": a.entries}, f)
            size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)
            made.append(f"{n} nodes: {time.monotonic() - t0:.0f} s, {size / GiB:.2f} GiB")
            print(f"generated {n} nodes x {gen.GPUS} GPUs ({size / GiB:.2f} GiB) in {time.monotonic() - t0:.0f} s; "
                  f"fault: Xid 79 on {truth['nodes'][0]}, rank {truth['ranks'][0]}", flush=True)
            if n in sizes:
                rows[f"v{n}"] = v = verdict_row(path, truth, a.timeout, a.repeat)
                print(f"  bundle -> verdict: {v['wall']:.1f} s ({v.get('seconds', 0):.1f} s in run_bundle; runs {v['walls']}), "
                      f"peak {v['peak'] / MiB:.0f} MiB; {v.get('cause')} {v.get('nodes')} drain {v.get('drains')} "
                      f"({'right' if v['right'] else 'WRONG'}){' ' + v['error'] if v.get('error') else ''}", flush=True)
            if n == fr_nodes:
                rows["fr"] = f = fr_row(path, truth, a.fr_ranks, a.timeout, a.repeat)
                print(f"  FR alone: {f['wall']:.1f} s (load {f.get('load_seconds', 0):.1f} s; runs {f['walls']}), peak {f['peak'] / MiB:.0f} MiB, "
                      f"{f.get('loaded')}/{a.fr_ranks} ranks read; roots {f.get('roots')} "
                      f"({'right' if f['right'] else 'WRONG'}){' ' + f['error'] if f.get('error') else ''}", flush=True)
            if n == a.epilog_nodes:
                for kind, collect in (("epilog", True), ("writes", False)):
                    rows[kind] = e = fastest([epilog_storm(path, tmp, a.epilog_procs or n, collect) for _ in range(a.repeat)])
                    what = "node epilogs (collect_node)" if collect else "node parts' spool writes alone"
                    print(f"  {n} {what} in {e['procs']} processes at once: {e['wall']:.1f} s (runs {e['walls']}), {e['done']}/{n} parts "
                          f"({e['cut']} cut short by the epilog's time budget), {e['bytes'] / GiB:.2f} GiB, "
                          f"{e['failed']} failed, largest process {e['largest'] / MiB:.0f} MiB", flush=True)
            if not keep:
                shutil.rmtree(path, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"\nbig jobs on {os.cpu_count()} cores; generation (not counted): " + "; ".join(made))
    print(f"{'figure':48} {'measured':30} {'goal':34} ok")
    for n in sizes:
        v = rows.get(f"v{n}", {})
        goal = "<= 10 s" if n <= 512 else "<= 60 s, <= 2 GiB"
        ok = v.get("right") and v["wall"] <= (10 if n <= 512 else 60) and (n <= 512 or v["peak"] <= 2 * GiB)
        got = f"{fmt_s(v.get('wall'))}, {v.get('peak', 0) / MiB:.0f} MiB, {'right' if v.get('right') else 'WRONG'}"
        label = f"{n}-node bundle -> verdict"
        print(f"{label:48} {got:30} {goal + ', verdict right':34} {'yes' if ok else 'NO'}")
    if "fr" in rows:
        f = rows["fr"]
        ok = f["right"] and f["complete"] and f["wall"] <= 15 and f["peak"] <= 2 * GiB
        got = f"{fmt_s(f['wall'])}, {f['peak'] / MiB:.0f} MiB, {'right' if f['right'] else 'WRONG'}"
        label = f"{a.fr_ranks:,}-rank FR dumps (FR analysis alone)"
        print(f"{label:48} {got:30} {'<= 15 s, <= 2 GiB, culprit right':34} {'yes' if ok else 'NO'}")
    for kind, what in (("epilog", "node-epilog writes (collect_node)"), ("writes", "node-part writes alone")):
        if kind in rows:
            e = rows[kind]
            ok = e["wall"] <= 5 and not e["failed"] and not e["cut"] and e["done"] == e["nodes"]
            label = f"{e['nodes']} parallel {what}"
            cut = f", {e['cut']} cut short" if e["cut"] else ""
            got = f"{fmt_s(e['wall'])} ({e['procs']} procs{cut})"
            print(f"{label:48} {got:30} {'<= 5 s in all':34} {'yes' if ok else 'NO'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
