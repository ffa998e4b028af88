"""Benchmark: start-up, `sattr analyze` of a one-log bundle (issue 15, row 3).

Not a test. Writes a bundle with one node and one short kernel log (real Xid 79 format), then
times, alternating in one run, each in a fresh interpreter:

  1. ``python -c pass``                   the interpreter's own floor,
  2. ``sattr --help``                     the peer figure of the issue (loads every command),
  3. ``sattr analyze BUNDLE --json``      the measure: start-up + catalog load + analysis.

The rule catalog's on-disk cache (``SLURM_ATTR_CACHE_DIR``, a fresh temporary directory) is
empty for the first analyze run, which is reported on its own line as the cold figure; the
others read it. Goal: analyze <= 0.25 s.

    python bench/bench_startup.py [--repeat 10]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

GOAL_S = 0.25
KERNEL = (
    "[Thu May  2 10:00:01 2024] nvidia-nvswitch0: Link 3: ACTIVE\n"
    "[Thu May  2 10:00:03 2024] NVRM: Xid (PCI:0000:3b:00): 79, pid=48213, name=python, GPU has fallen off the bus.\n"
)


def make_bundle(root: str) -> None:
    os.makedirs(os.path.join(root, "nodes", "n1"))
    with open(os.path.join(root, "job.json"), "w") as f:
        json.dump({"job_id": "4711", "state": "FAILED", "exit_code": "1:0", "nodes": ["n1"]}, f)
    with open(os.path.join(root, "nodes", "n1", "kernel.log"), "w") as f:
        f.write(KERNEL)


def wall(cmd: list[str], env: dict[str, str]) -> tuple[float, bytes]:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, check=False)
    dt = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[-3:])} exited {proc.returncode}")
    return dt, proc.stdout


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=10)
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="sattr-startup-")
    try:
        bundle = os.path.join(tmp, "bundle")
        make_bundle(bundle)
        cache = os.path.join(tmp, "cache")
        os.mkdir(cache, 0o700)
        env = {**os.environ, "SLURM_ATTR_CACHE_DIR": cache}
        sattr = [sys.executable, "-c", "import sys; from slurm_attr.cli import main; sys.exit(main())"]
        cmds = {
            "python -c pass": [sys.executable, "-c", "pass"],
            "sattr --help": [*sattr, "--help"],
            "sattr analyze (one log)": [*sattr, "analyze", bundle, "--json"],
        }
        cold, out = wall(cmds["sattr analyze (one log)"], env)
        verdict = json.loads(out)
        if verdict.get("cause") != "gpu_hardware" or verdict.get("culprit", {}).get("nodes") != ["n1"]:
            raise SystemExit(f"unexpected verdict: {verdict.get('summary')!r}")
        times: dict[str, list[float]] = {k: [] for k in cmds}
        for _ in range(max(1, args.repeat)):
            for name, cmd in cmds.items():
                times[name].append(wall(cmd, env)[0])
        print(f"{args.repeat} runs each, alternating; {os.cpu_count()} CPUs")
        for name, ts in times.items():
            print(f"{name:26s} min {min(ts):.3f} s, median {statistics.median(ts):.3f} s")
        print(f"{'sattr analyze, cold cache':26s} {cold:.3f} s (first run: catalog parsed and cached)")
        med = statistics.median(times["sattr analyze (one log)"])
        help_med = statistics.median(times["sattr --help"])
        floor = statistics.median(times["python -c pass"])
        print(f"ratio analyze / --help: {med / help_med:.2f}x; analyze / bare interpreter: {med / floor:.2f}x")
        print(f"analyze median {med:.3f} s (goal <= {GOAL_S} s): {'met' if med <= GOAL_S else 'NOT met'}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
