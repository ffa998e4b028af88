"""Node epilog wall time and job-end-to-Comment latency on the real test cluster.

    python bench/bench_epilog.py [--jobs 20]

Needs the local cluster (`bash cluster/testcluster.sh up`, as root). For each of
N jobs with nothing to collect and N jobs that leave 8 Flight Recorder dumps
of 2000 entries each (bench/gen_fr.py, torch's schema, ~340 KB per rank) in
their evidence dir, it reads the node epilog's
wall time from the test cluster's hook timing log (the hook wrapper records start
and end), and for every job the time from srun returning (the job's end, as the
user sees it) to `sacct -o Comment` showing the SATTR1: verdict.
"""
from __future__ import annotations

import argparse
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BASE = Path(os.environ.get("SATTR_CLUSTER_BASE", "/var/lib/sattr-testcluster"))


def env() -> dict[str, str]:
    e = dict(os.environ)
    out = subprocess.run(["bash", str(REPO / "cluster" / "testcluster.sh"), "env"], capture_output=True, text=True,
                         check=True).stdout
    for part in out.split():
        if "=" in part:
            k, v = part.split("=", 1)
            e[k] = v
    return e


def epilog_times() -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    log = BASE / "log" / "epilog-times.log"
    if log.exists():
        for ln in log.read_text().splitlines():
            p = ln.split()
            if len(p) == 5:
                out.setdefault(p[0], []).append(float(p[3]) - float(p[2]))
    return out


def run_job(e: dict[str, str], script: str) -> tuple[str, float]:
    """Run a 1-node srun job; return (job id, monotonic time srun returned)."""
    proc = subprocess.run(["srun", "-N1", "-w", "n3", "bash", "-c", f"echo JOB=$SLURM_JOB_ID; {script}"],
                          capture_output=True, text=True, env=e, timeout=120)
    t_end = time.monotonic()
    job = next(ln.split("=", 1)[1] for ln in proc.stdout.splitlines() if ln.startswith("JOB="))
    return job, t_end


def wait_comment(e: dict[str, str], job: str, t_end: float, timeout: float = 120) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        out = subprocess.run(["sacct", "-n", "-P", "-X", "-j", job, "-o", "Comment"], capture_output=True,
                             text=True, env=e).stdout
        if "SATTR1:" in out:
            return time.monotonic() - t_end
        time.sleep(0.1)
    return float("nan")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=20)
    args = ap.parse_args()
    e = env()
    src = BASE / "bench-fr8"
    if not (src / "nccl_trace_rank_7").exists():
        subprocess.run([sys.executable, str(REPO / "bench" / "gen_fr.py"), str(src), "--ranks", "8",
                        "--entries", "2000", "--fault-rank", "3"], check=True)
    dumps = sorted(src.glob("nccl_trace_rank_*"))[:8]
    size = sum(d.stat().st_size for d in dumps)
    copy = "; ".join(f"cp {shlex.quote(str(d))} \"$SLURM_ATTR_DIR/fr/nccl_trace_rank_{i}\"" for i, d in enumerate(dumps))
    results: dict[str, dict[str, list[float]]] = {}
    for name, script in (("empty", "exit 1"), ("8 FR dumps", f"{copy}; exit 1")):
        jobs = []
        for _ in range(args.jobs):
            job, t_end = run_job(e, script)
            jobs.append((job, wait_comment(e, job, t_end)))
        times = epilog_times()
        results[name] = {"epilog": [times[j][0] for j, _ in jobs if j in times],
                         "comment": [c for _, c in jobs if c == c]}
    print(f"node epilog wall time and job end -> Comment visible, {args.jobs} jobs each (test cluster, 2 cores);"
          f" FR dumps: {len(dumps)} files, {size / 1e6:.1f} MB")
    for name, r in results.items():
        ep, cm = r["epilog"], r["comment"]
        print(f"  {name:12s} epilog median {statistics.median(ep) * 1000:7.0f} ms  (min {min(ep) * 1000:.0f}, "
              f"max {max(ep) * 1000:.0f}, n={len(ep)})   comment median {statistics.median(cm):5.2f} s "
              f"(max {max(cm):.2f}, n={len(cm)})")
    if results["empty"]["epilog"] and results["8 FR dumps"]["epilog"]:
        ratio = statistics.median(results["8 FR dumps"]["epilog"]) / statistics.median(results["empty"]["epilog"])
        print(f"  8 FR dumps / empty epilog: {ratio:.2f}x")


if __name__ == "__main__":
    main()
