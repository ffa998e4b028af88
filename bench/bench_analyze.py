"""Benchmark: `sattr analyze BUNDLE --json` on the shared 129 MB log bundle against grep (issue 15, row 1).

Not a test. Uses the shared workload (``../shared/bench`` beside the checkout, see its README):
the bundle made by ``gen_log_corpus.py`` (generated once into ``--corpus`` if missing) and the
32 signal-family patterns of ``grep_patterns.txt``. In one run, alternating, it times

  1. ``LC_ALL=C grep -E -c -f grep_patterns.txt`` over the bundle's files (everything but job.json), and
  2. ``sattr analyze BUNDLE --json`` (a fresh interpreter each time, as a user or the controller runs it),

checks the verdict each time (gpu_hardware, Xid 79, culprit gpu-0005 and nothing else), and prints
min and median wall time of both, sattr's CPU time (its worker processes included) and peak RSS
(the main process), and the ratio to grep (wall, and CPU), with the load average. Goal: sattr within 3x grep's wall time.

sattr runs as installed: an install (``pip install .``, ``make install``) leaves compiled bytecode
beside the package, so the bench lets Python keep it (in ``--pycache``, outside the checkout) even
where the environment says PYTHONDONTWRITEBYTECODE; without it every run compiles ~130 modules
first (~0.1 s here), which no installed sattr does. ``--no-bytecode`` measures that case.

    python bench/bench_analyze.py [--repeat 5] [--corpus /var/tmp/sattr-bench/corpus] [--shared DIR] [--no-bytecode]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_SHARED = os.path.normpath(os.path.join(HERE, "..", "..", "shared", "bench"))
GOAL = 3.0


def bundle_files(root: str) -> list[str]:
    out = []
    for d, _dirs, files in os.walk(root):
        out.extend(os.path.join(d, f) for f in files if f != "job.json")
    return sorted(out)


def timed(cmd: list[str], env: dict[str, str] | None = None) -> tuple[float, float, int, bytes]:
    """(wall s, CPU s of the process and the children it waited for, its peak RSS KiB, stdout)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
    out = proc.stdout.read() if proc.stdout else b""
    _pid, status, ru = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode not in (0, 1):  # grep -c exits 1 when a file has no match
        raise SystemExit(f"{cmd[0]} failed with {proc.returncode}")
    return wall, ru.ru_utime + ru.ru_stime, ru.ru_maxrss, out


def check_verdict(raw: bytes) -> str:
    v = json.loads(raw)
    culprit = v.get("culprit") or {}
    roots = [s for s in v.get("symptoms", []) if s.get("role") == "root" and s.get("trusted")]
    ok = (v.get("cause") == "gpu_hardware" and culprit.get("nodes") == ["gpu-0005"]
          and any(s.get("id") == "gpu.xid_79" and s.get("node") == "gpu-0005" for s in roots))
    if not ok:
        raise SystemExit(f"verdict changed: cause={v.get('cause')} culprit={culprit} summary={v.get('summary')!r}")
    return v.get("summary", "")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--corpus", default="/var/tmp/sattr-bench/corpus", help="the bundle (generated here if missing)")
    ap.add_argument("--shared", default=DEFAULT_SHARED, help="the shared bench directory (gen_log_corpus.py, grep_patterns.txt)")
    ap.add_argument("--pycache", default="/var/tmp/sattr-bench/pycache", help="where sattr's bytecode is kept")
    ap.add_argument("--no-bytecode", action="store_true", help="compile every module on every run (no bytecode kept)")
    args = ap.parse_args()
    patterns = os.path.join(args.shared, "grep_patterns.txt")
    if not os.path.isfile(os.path.join(args.corpus, "job.json")):
        print(f"generating the bundle into {args.corpus} ...", flush=True)
        subprocess.run([sys.executable, os.path.join(args.shared, "gen_log_corpus.py"), args.corpus], check=True)
    files = bundle_files(args.corpus)
    total = sum(os.path.getsize(f) for f in files)
    for f in files:  # warm the page cache for both contenders
        with open(f, "rb") as fh:
            while fh.read(1 << 24):
                pass
    grep_cmd = ["grep", "-E", "-c", "-f", patterns, *files]
    grep_env = {**os.environ, "LC_ALL": "C"}
    sattr_cmd = [sys.executable, "-c", "import sys; from slurm_attr.cli import main; sys.exit(main())",
                 "analyze", args.corpus, "--json"]
    sattr_env = dict(os.environ)
    if args.no_bytecode:
        sattr_env["PYTHONDONTWRITEBYTECODE"] = "1"
    else:
        sattr_env.pop("PYTHONDONTWRITEBYTECODE", None)
        sattr_env["PYTHONPYCACHEPREFIX"] = args.pycache
    timed(sattr_cmd, sattr_env)  # once untimed: the catalog's cache and the bytecode are written as an install has them
    g_wall, g_cpu, s_wall, s_cpu, s_rss = [], [], [], [], []
    summary = ""
    for _ in range(max(1, args.repeat)):
        w, c, _r, _o = timed(grep_cmd, grep_env)
        g_wall.append(w)
        g_cpu.append(c)
        w, c, r, out = timed(sattr_cmd, sattr_env)
        summary = check_verdict(out)
        s_wall.append(w)
        s_cpu.append(c)
        s_rss.append(r)
    mb = total / 1e6
    print(f"bundle: {len(files)} files, {mb:.1f} MB ({args.corpus}); {os.cpu_count()} CPUs; {args.repeat} runs each, alternating; "
          f"sattr {'compiling every module (--no-bytecode)' if args.no_bytecode else 'with bytecode kept, as installed'}")
    print(f"grep -E -c -f grep_patterns.txt: min {min(g_wall):.3f} s, median {statistics.median(g_wall):.3f} s, "
          f"CPU median {statistics.median(g_cpu):.3f} s")
    print(f"sattr analyze --json:            min {min(s_wall):.3f} s, median {statistics.median(s_wall):.3f} s "
          f"({mb / statistics.median(s_wall):.0f} MB/s), CPU median {statistics.median(s_cpu):.3f} s, "
          f"peak RSS {max(s_rss) / 1024:.0f} MiB")
    print(f"verdict: {summary}")
    ratio_med = statistics.median(s_wall) / statistics.median(g_wall)
    ratio_min = min(s_wall) / min(g_wall)
    print(f"ratio sattr/grep: median {ratio_med:.2f}x, min {ratio_min:.2f}x (goal <= {GOAL:.0f}x): "
          f"{'met' if ratio_med <= GOAL else 'NOT met'}; CPU time {statistics.median(s_cpu) / statistics.median(g_cpu):.2f}x "
          f"(sattr's on {os.cpu_count()} cores, grep's on one)")
    print(f"load average during the run: {os.getloadavg()[0]:.2f} (others' work on this machine inflates both)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
