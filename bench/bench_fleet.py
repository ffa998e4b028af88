"""Benchmark: the fleet view on a large store (issue 25): report + HTML, memory, page size, metrics.

Not a test: it reports, it does not fail on a missed goal (only on an error). On a synthetic
store of 100,000 verdicts over 500 nodes and 30 days (bench/fleetdata.py, cached in /var/tmp):

  report+html   fleet_report(...) then render_fleet_html(...), in this process, median of
                ``--repeat`` runs after one untimed warm-up run       goal <= 2 s
  peak RSS      of a fresh child process that opens the store, builds the report and renders
                the page (wait4's ru_maxrss: the child's own peak resident set, interpreter
                and imports included)                                  goal <= 300 MiB
  HTML size     the page's UTF-8 bytes                                  goal <= 5 MB
  metrics       render_text(...), the Prometheus exposition, median of ``--repeat`` runs
                                                                        goal <= 200 ms

beside a floor: one SQL pass grouping every verdict of the window by cause (the least any
report of the window must read). Ratio is measured / goal (<= 1.0: met).

    python bench/bench_fleet.py [--verdicts 100000] [--nodes 500] [--days 30] [--repeat 5]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from slurm_attr.fleet.facts import fleet_report
from slurm_attr.fleet.html import render_fleet_html
from slurm_attr.fleet.metrics import render_text
from slurm_attr.store import Store

import fleetdata  # beside this file (a script's directory is on sys.path)

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)

MiB = 1 << 20
GOALS = {"report+html": (2.0, "s"), "peak RSS": (300.0, "MiB"), "HTML size": (5.0, "MB"), "metrics": (200.0, "ms")}
CLUSTER = "bench"

# The child measured for memory: what `sattr report --fleet --html` does, nothing else.
CHILD = """
import json, resource, sys, time
t0 = time.monotonic()
from slurm_attr.fleet.facts import fleet_report
from slurm_attr.fleet.html import render_fleet_html
from slurm_attr.store import Store
args = json.loads(sys.argv[1])
rep = fleet_report(Store(args["path"]), args["since"], cluster=args["cluster"], pending=tuple(args["pending"]),
                   slurm_nodes=args["slurm_nodes"], admin=True, now=args["now"])
page = render_fleet_html(rep)
print(json.dumps({"seconds": time.monotonic() - t0, "bytes": len(page.encode()),
                  "maxrss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))
"""


def child_peak(args: dict) -> dict:
    """Run CHILD in a fresh interpreter; its peak RSS from wait4 (the kernel's own account)."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen([sys.executable, "-c", CHILD, json.dumps(args)], stdout=out, stderr=err, text=True, cwd=REPO)
        _, status, ru = os.wait4(proc.pid, 0)
        out.seek(0)
        err.seek(0)
        if os.waitstatus_to_exitcode(status) != 0:
            raise SystemExit(f"the report child failed: {err.read()[-2000:]}")
        got = json.loads(out.read())
    got["wait4_maxrss"] = ru.ru_maxrss * 1024
    return got


def timed(fn, repeat: int) -> tuple[list[float], object]:
    fn()  # warm-up: SQLite's page cache and the policy table loaded, as in a running server
    times, last = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        last = fn()
        times.append(time.perf_counter() - t0)
    return times, last


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    fleetdata.store_args(ap)
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args()
    # Built (when not cached) in a child: the build holds every row in memory, and the memory
    # child below, forked from this process, would start with those pages in its peak RSS.
    built = subprocess.run([sys.executable, os.path.join(HERE, "fleetdata.py"), "--verdicts", str(a.verdicts), "--nodes",
                            str(a.nodes), "--days", str(a.days), "--seed", str(a.seed), "--quiet"],
                           stdout=subprocess.PIPE, text=True, check=True)
    with open(built.stdout.strip() + ".json") as fh:
        info = json.load(fh)
    now = info["anchor"]
    since = now - a.days * 86400
    pending = (4, now - 300.0)  # the intake queue as `sattr report --fleet` would pass it
    store = Store(info["path"])

    def report_html() -> str:
        rep = fleet_report(store, since, cluster=CLUSTER, pending=pending, slurm_nodes=info["slurm_nodes"], admin=True, now=now)
        return render_fleet_html(rep)

    def floor() -> list:
        return list(store.db.query("select cause, count(*) from verdicts where analyzed_at >= ? group by 1", [since]))

    # The memory child first, while this process is still small (it forks from here).
    peak = child_peak({"path": info["path"], "since": since, "now": now, "cluster": CLUSTER, "pending": list(pending),
                       "slurm_nodes": info["slurm_nodes"]})
    floor_s, _ = timed(floor, a.repeat)
    rep_s, page = timed(report_html, a.repeat)
    met_s, text = timed(lambda: render_text(store, CLUSTER, pending, now=now), max(a.repeat, 7))
    size = len(str(page).encode())
    measured = {"report+html": statistics.median(rep_s), "peak RSS": peak["wait4_maxrss"] / MiB, "HTML size": size / 1e6,
                "metrics": statistics.median(met_s) * 1000}

    db_mib = os.path.getsize(info["path"]) / MiB
    print(f"fleet view on {info['verdicts']} verdicts over {info['nodes']} nodes, {info['days']} days "
          f"({db_mib:.0f} MiB store, {info['symptoms']} symptoms, {info['drain_ledger']} drains); "
          f"{sys.executable} on {os.cpu_count()} CPUs (load {os.getloadavg()[0]:.2f})")
    print(f"  {'':14s} {'measured':>12s} {'goal':>12s} {'ratio':>7s}")
    for name, (goal, unit) in GOALS.items():
        v = measured[name]
        print(f"  {name:14s} {v:9.2f} {unit:3s} {goal:9.1f} {unit:3s} {v / goal:6.2f}x  {'met' if v <= goal else 'NOT met'}")
    print(f"  report+html runs: {', '.join(f'{x:.2f}' for x in rep_s)} s; the child's own run {peak['seconds']:.2f} s "
          f"(fresh interpreter and imports included); metrics runs: {', '.join(f'{x * 1000:.0f}' for x in met_s)} ms "
          f"({len(bytes(text))} bytes)")  # type: ignore[arg-type]
    print(f"  floor: one SQL pass grouping the window's verdicts by cause {statistics.median(floor_s) * 1000:.0f} ms; "
          f"report+html = {statistics.median(rep_s) / max(statistics.median(floor_s), 1e-9):.1f}x the floor")


if __name__ == "__main__":
    main()
