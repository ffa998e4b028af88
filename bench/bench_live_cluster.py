"""The live watcher at its DEFAULT settings on real jobs of the test cluster: hangs found
(latency, class) and near misses left alone (false hangs, cancelled jobs). A benchmark: it
prints figures and asserts nothing timed.

    flock-free: python3 bench/bench_live_cluster.py [--runs 10] [--near-runs 50] [--episodes 5]
        [--scenarios H1,H2,H3,ckpt_hang,checkpoint,eval,dataload,gc,slowdown] [--parallel 2]
        [--no-torch] [--quick]

The bench takes /var/lock/sattr-cluster.lock itself, once per batch of jobs (at most
--parallel 2-node jobs at a time on the 4 nodes), and only for that batch: it writes the
[live] defaults into the cluster's slurm_attr.toml (Config().live: hang_after_s 60,
hang_floor_s 5, interval_s 1; on_hang "dump" for the hangs, "cancel" for the near misses),
runs the batch, and restores the file exactly (tests/integration/conftest.py's
``Cluster.settings``, in a finally). Every job runs in partition ``live``: the plugin starts
each node's watcher, reading the records of the plugin's probe library.

Hangs (--runs jobs each; latency = the finding's detected_ns - the onset):
H1, H2, H3: the probe harness (spank/build/tests/probe_harness, real probe library), one
process per node (4 ranks each), scenarios nonentry (rank 3 never launches AllReduce #450),
count (rank 5 issues another count at #450), linkstall (rank 3's send to rank 4 never
completes), after ~25 s of healthy collectives (the learned threshold needs 10 gaps first);
the onset is the stall's last recorded event (the finding's waiting_since).
ckpt_hang: cluster/jobs/live_scenario.py, 8 ranks: after 30-50 s of training, rank 0's
20-40 s checkpoint blocks in its last write; the onset (when its counters stop) is what the
job writes in its info file.

Near misses (cluster/jobs/live_scenario.py, --episodes episodes per job, jobs until
--near-runs episodes): checkpoint, eval, dataload, gc, slowdown, with on_hang = cancel. A
false hang is a hang finding (H*, not the slow S1-S3) in the job's live findings; a
cancelled job is one whose final state is CANCELLED (the bench cancels none of them).
With torch installed (and not --no-torch), the checkpoint, eval, dataload and ckpt_hang
ranks import torch.distributed, so the plugin's worker_hook starts torch's worker server in
each and the busy check reads their stacks; without it, their counters alone.

--quick: one run of each hang, one job of 2 episodes of each near miss (a smoke check).
"""
from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests" / "integration"))

from conftest import BASE, FINAL, SCRIPT, Cluster  # noqa: E402  (the integration tests' cluster helper)
from slurm_attr import config as config_mod  # noqa: E402
from slurm_attr.live import findings  # noqa: E402

LOCK = "/var/lock/sattr-cluster.lock"
HARNESS = REPO / "spank" / "build" / "tests" / "probe_harness"
JOBPY = REPO / "cluster" / "jobs" / "live_scenario.py"
PYTHON = sys.executable
PLUGIN = '"$(echo "$LD_LIBRARY_PATH" | cut -d: -f1)/$NCCL_PROFILER_PLUGIN"'
# hang -> (harness scenario or None for live_scenario.py, class expected, ranks expected)
HANGS = {"H1": ("nonentry", "H1", [3]), "H2": ("count", "H2", [5]), "H3": ("linkstall", "H3", [3, 4]),
         "ckpt_hang": (None, "H1", [0])}
NEAR = ("checkpoint", "eval", "dataload", "gc", "slowdown")
TORCH_SCENARIOS = ("checkpoint", "eval", "dataload", "ckpt_hang")  # where the busy check asks stacks
START_S = 20  # the ranks' common start, after the script starts (torch's import on a loaded machine)
# seconds of one job beyond its plan: scheduling, start, the end
SLACK_S = 120


def cluster() -> Cluster:
    env = dict(os.environ)
    out = subprocess.run(["bash", str(SCRIPT), "env"], capture_output=True, text=True, check=True).stdout
    for part in out.split():
        if "=" in part:
            k, v = part.split("=", 1)
            env[k] = v.strip("'\"")
    return Cluster(base=BASE, env=env)


@contextlib.contextmanager
def batch(c: Cluster, on_hang: str):
    """The cluster lock and the [live] defaults, for one batch of jobs."""
    d = config_mod.Config().live
    with open(LOCK, "a") as lk:
        fcntl.flock(lk, fcntl.LOCK_EX)
        try:
            with c.settings(live={"hang_after_s": d.hang_after_s, "hang_floor_s": d.hang_floor_s,
                                  "interval_s": d.interval_s, "on_hang": on_hang}):
                yield
        finally:
            fcntl.flock(lk, fcntl.LOCK_UN)


def harness_script(scenario: str) -> str:
    shm = "/dev/shm/sattr-bench-$SLURM_JOB_ID"
    return f"""#!/bin/bash
#SBATCH -N2 -p live -t 5 -J bench-{scenario}
rm -f {shm}
srun -N2 --ntasks-per-node=1 bash -c 'exec {HARNESS} run --plugin {PLUGIN} --shm {shm} --node-index $SLURM_NODEID \\
    --scenario {scenario} --ops 600 --inject 450 --step-us 2500 --per-node 4 --hang-ms 60000'
rc=$?
rm -f {shm}
exit $rc
"""


def scenario_script(scenario: str, seed: int, episodes: int, info: str, use_torch: bool, minutes: int) -> str:
    torch = " --torch" if use_torch else ""
    return f"""#!/bin/bash
#SBATCH -N2 -n8 -O -p live -t {minutes} -J bench-{scenario}
t0=$(( $(date +%s) + {START_S} ))
srun {PYTHON} {JOBPY} {scenario} --t0 $t0 --seed {seed} --episodes {episodes} --info {info}{torch}
"""


def has_torch() -> bool:
    return subprocess.run([PYTHON, "-c", "import torch"], capture_output=True).returncode == 0


def read_info(path: Path) -> dict:
    try:
        with open(path, "rb") as f:
            doc = json.loads(f.read(4096))
        return doc if isinstance(doc, dict) else {}
    except (OSError, ValueError):
        return {}


def live_doc(spool: str, job: str) -> dict:
    return findings.load(spool, job) or {}


def hang_findings(doc: dict) -> list[dict]:
    """The job's hang findings (not the slow S1-S3), first-reported (not 'behind' another) first."""
    hs = [f for f in doc.get("findings", []) if isinstance(f, dict) and str(f.get("class", "")).startswith("H")]
    return sorted(hs, key=lambda f: (bool(f.get("behind")), f.get("detected_ns") or 0))


class Running:
    """One submitted job and what the bench knows of it."""

    def __init__(self, c: Cluster, name: str, script: str, info: Path | None, limit_s: float):
        self.name, self.info = name, info
        self.job = c.sbatch(script)
        self.deadline = time.monotonic() + limit_s
        self.found: dict | None = None
        self.state = ""


def _ended(c: Cluster, job: str) -> str:
    st = c.sacct(job, "State").get("State", "").split(" ")[0]
    return st if st in FINAL else ""


def run_hangs(c: Cluster, spool: str, names: list[str], runs: int, parallel: int, use_torch: bool) -> None:
    """Round robin over the scenarios (a batch may mix them), so that a bench stopped early on
    a busy shared cluster still has some runs of each; the summaries also when stopped."""
    work = Path(c.workdir())
    todo = [(name, i) for i in range(runs) for name in names]
    rows: dict[str, list[dict]] = {name: [] for name in names}
    try:
        while todo:
            now, todo = todo[:parallel], todo[parallel:]
            with batch(c, "dump"):
                jobs = []
                for name, i in now:
                    scen = HANGS[name][0]
                    if scen is not None:
                        jobs.append(Running(c, name, harness_script(scen), None, 240))
                    else:
                        info = work / f"bench-live-{time.time_ns()}.json"
                        t = name in TORCH_SCENARIOS and use_torch
                        jobs.append(Running(c, name, scenario_script(name, 100 + i, 1, str(info), t, 5), info, 240))
                _watch_hangs(c, spool, jobs)
            for r in jobs:
                rows[r.name].append(_hang_row(r, *HANGS[r.name][1:]))
                print(f"  {r.name} job {r.job}: {rows[r.name][-1]['text']}", flush=True)
    finally:
        for name in names:
            if rows[name]:
                _hang_summary(name, HANGS[name][1], rows[name])


def _watch_hangs(c: Cluster, spool: str, jobs: list[Running]) -> None:
    """Until each job's first hang finding (then cancel it), its end, or its deadline."""
    try:
        while any(not r.state for r in jobs):
            for r in jobs:
                if r.state:
                    continue
                # the world communicator's: a stuck rank also stalls its side communicator (harness),
                # whose unlocalised H0 may come a cycle earlier
                hs = [f for f in hang_findings(live_doc(spool, r.job)) if str(f.get("label")).startswith("world ")]
                if hs:
                    r.found = hs[0]
                    c.run(["scancel", r.job], check=False)
                    r.state = "found"
                elif time.monotonic() > r.deadline:
                    r.state = "timeout"
                elif _ended(c, r.job):
                    r.state = "ended"
            time.sleep(0.5)
    finally:
        for r in jobs:
            c.run(["scancel", r.job], check=False)
        for r in jobs:
            with contextlib.suppress(AssertionError):
                c.wait_state(r.job, timeout=60)


def _hang_row(r: Running, cls: str, ranks: list[int]) -> dict:
    f = r.found
    if f is None:
        return {"job": r.job, "latency": None, "right": False, "text": f"no finding ({r.state})"}
    det = f["detected_ns"] / 1e9
    info = read_info(r.info) if r.info is not None else {}
    if r.info is not None:
        onset, what = info.get("onset"), "job-written onset"
        with contextlib.suppress(OSError):
            os.unlink(r.info)
    else:
        from datetime import datetime
        onset, what = datetime.fromisoformat(f["waiting_since"]).timestamp(), "stall's last event"
    lat = det - onset if isinstance(onset, (int, float)) else None
    right = f.get("class") == cls and f.get("ranks") == ranks
    text = (f"{f.get('class')} ranks {f.get('ranks')} nodes {f.get('nodes')} "
            f"{'' if lat is None else f'{lat:.2f} s after the {what}'}; threshold {f.get('threshold_s')} s"
            f"{'; busy: ' + str(f.get('busy'))[:80] if f.get('busy') else ''}{'' if right else '  WRONG'}")
    return {"job": r.job, "latency": lat, "right": right, "text": text}


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, math.ceil(q * len(xs)) - 1))]


def _hang_summary(name: str, cls: str, rows: list[dict]) -> None:
    lat = [r["latency"] for r in rows if r["latency"] is not None]
    right = sum(r["right"] for r in rows)
    head = f"hang {name}: {len(lat)} of {len(rows)} jobs found, {right} classified right ({cls})"
    if lat:
        head += (f"; latency after onset p50 {statistics.median(lat):.2f} s, p90 {pct(lat, 0.9):.2f} s, "
                 f"max {max(lat):.2f} s")
    print(head, flush=True)


def run_near(c: Cluster, spool: str, names: list[str], total: int, episodes: int, parallel: int,
             use_torch: bool) -> None:
    work = Path(c.workdir())
    for name in names:
        eps = max(1, min(episodes, total))
        njobs = max(1, math.ceil(total / eps))
        stats = {"jobs": 0, "episodes": 0, "false": 0, "false_jobs": 0, "cancelled": 0, "notes": 0, "slow": 0,
                 "states": {}}
        seed = 0
        left = njobs
        while left:
            n, left = min(parallel, left), left - min(parallel, left)
            with batch(c, "cancel"):
                jobs = []
                for _ in range(n):
                    seed += 1
                    info = work / f"bench-live-{time.time_ns()}.json"
                    t = name in TORCH_SCENARIOS and use_torch
                    minutes = 3 + math.ceil(_plan_s(name, eps) / 60)
                    jobs.append(Running(c, name, scenario_script(name, seed, eps, str(info), t, minutes), info,
                                        _plan_s(name, eps) + START_S + SLACK_S))
                _watch_near(c, jobs)
            for r in jobs:
                _near_row(spool, r, stats)
        print(f"near miss {name}: {stats['episodes']} episodes in {stats['jobs']} jobs (on_hang = cancel): "
              f"{stats['false']} false hang finding(s) in {stats['false_jobs']} job(s), {stats['cancelled']} "
              f"job(s) cancelled; {stats['notes']} busy notes; {stats['slow']} slow (S*) findings; "
              f"final states {stats['states']}", flush=True)


def _plan_s(name: str, eps: int) -> int:
    """The longest a plan of ``eps`` episodes runs (live_scenario.plan's upper bounds)."""
    per = {"checkpoint": 60, "eval": 4 * 6 + 12 + 15, "dataload": 25, "gc": 20, "slowdown": 125}[name]
    return 30 + eps * per


def _watch_near(c: Cluster, jobs: list[Running]) -> None:
    try:
        while any(not r.state for r in jobs):
            for r in jobs:
                if r.state:
                    continue
                st = _ended(c, r.job)
                if st:
                    r.state = st
                elif time.monotonic() > r.deadline:
                    r.state = "bench-timeout"
            time.sleep(2)
    finally:
        for r in jobs:
            if r.state == "bench-timeout":
                c.run(["scancel", r.job], check=False)
                with contextlib.suppress(AssertionError):
                    c.wait_state(r.job, timeout=60)


def _near_row(spool: str, r: Running, stats: dict) -> None:
    doc = live_doc(spool, r.job)
    info = read_info(r.info) if r.info is not None else {}
    hs = hang_findings(doc)
    stats["jobs"] += 1
    stats["episodes"] += int(info.get("episodes") or 0)
    stats["false"] += len(hs)
    stats["false_jobs"] += bool(hs)
    stats["cancelled"] += r.state == "CANCELLED"
    stats["notes"] += len(doc.get("notes") or [])
    stats["slow"] += sum(1 for f in doc.get("findings", []) if str(f.get("class", "")).startswith("S"))
    stats["states"][r.state] = stats["states"].get(r.state, 0) + 1
    text = f"{r.state}, {info.get('episodes')} episodes, {len(hs)} hang finding(s), {len(doc.get('notes') or [])} notes"
    for f in hs[:3]:
        text += (f"\n    FALSE HANG {f.get('class')} ranks {f.get('ranks')} quiet {f.get('quiet_s')} s threshold "
                 f"{f.get('threshold_s')} s busy {str(f.get('busy'))[:100]} cancel {f.get('cancel')}")
    print(f"  {r.name} job {r.job}: {text}", flush=True)
    with contextlib.suppress(OSError):
        os.unlink(r.info)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=10, help="jobs per hang scenario")
    ap.add_argument("--near-runs", type=int, default=50, help="episodes per near-miss scenario")
    ap.add_argument("--episodes", type=int, default=5, help="near-miss episodes per job")
    ap.add_argument("--scenarios", default=",".join(list(HANGS) + list(NEAR)))
    ap.add_argument("--parallel", type=int, default=2, help="jobs per batch (2 nodes each, 4 nodes)")
    ap.add_argument("--no-torch", action="store_true", help="no worker server in the ranks: counters only")
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    if a.quick:
        a.runs, a.near_runs, a.episodes = 1, 2, 2
    names = [n for n in a.scenarios.split(",") if n]
    bad = [n for n in names if n not in HANGS and n not in NEAR]
    if bad:
        ap.error(f"unknown scenarios {bad}")
    if any(HANGS.get(n, (None,))[0] for n in names) and not HARNESS.exists():
        print(f"{HARNESS} missing: `make -C spank build/tests/probe_harness`", file=sys.stderr)
        return 2
    # a stopped bench still restores the config and cancels its jobs (the finally blocks);
    # SIGINT too when started in the background, where it is ignored by default
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    signal.signal(signal.SIGINT, signal.default_int_handler)
    c = cluster()
    spool = config_mod.load(str(c.config_path)).paths.spool
    use_torch = not a.no_torch and has_torch()
    d = config_mod.Config().live
    print(f"live watch at the defaults: hang_after_s {d.hang_after_s}, hang_floor_s {d.hang_floor_s}, "
          f"interval_s {d.interval_s}; worker servers (torch) in {', '.join(TORCH_SCENARIOS) if use_torch else 'none'}; "
          f"{a.parallel} job(s) at a time; {os.cpu_count()} cores, shared with other work", flush=True)
    t0 = time.monotonic()
    run_hangs(c, spool, [n for n in names if n in HANGS], a.runs, a.parallel, use_torch)
    run_near(c, spool, [n for n in names if n in NEAR], a.near_runs, a.episodes, a.parallel, use_torch)
    print(f"bench wall {time.monotonic() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
