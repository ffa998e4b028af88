"""Benchmark: slurm-attr's Flight Recorder analysis against torch's own analyser (torchfrtrace).

Dumps come from bench/gen_fr.py (torch 2.13 schema, torch's pickle layout):
N ranks x 2000 entries, tensor-parallel groups of 8, data-parallel groups, the
world group, 24-frame stacks, a size fault in the last step on one rank. Each
analyser runs in a fresh process; wall time and the peak resident memory of its
whole process tree (workers included, sampled from /proc) are reported, and
the answer is checked: our culprit must be the faulty rank.

Usage::

    python bench/bench_flightrec.py                      # 1024 and 4096 ranks, torchfrtrace on 1024
    python bench/bench_flightrec.py --ranks 1024 --no-torchfrtrace
    python bench/bench_flightrec.py --peer-timeout 400   # cap torchfrtrace's run (seconds)

Goal on a 2-core machine: 4096 ranks in <= 10 s and <= 2 GiB. Not a test.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import gen_fr  # noqa: E402

GiB = 1 << 30

OURS = """
import json, sys, time
t0 = time.monotonic()
from slurm_attr import flightrec
rep = flightrec.inspect(sys.argv[1])
roots = [s for s in rep.symptoms if s.role == "root"]
import resource
me, kids = (resource.getrusage(w).ru_maxrss * 1024 for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
print(json.dumps({"seconds_inside": time.monotonic() - t0, "load_seconds": rep.dumps.seconds,
                  "rss_bound": me + flightrec._workers() * kids,
                  "roots": [[s.id, s.rank, s.fields.get("pg"), s.fields.get("collective_seq_id"), s.fields.get("kind")] for s in roots],
                  "cascades": sum(1 for s in rep.symptoms if s.role != "root"),
                  "tail_read": sum(t.history_truncated for t in rep.dumps.traces.values()), "ranks": len(rep.dumps.traces)}))
"""


def measure(cmd: list[str], timeout: float, env: dict[str, str] | None = None) -> dict:
    """Run cmd; wall seconds, the largest resident set in its process tree, exit code, output.

    Memory comes from wait4's rusage (ru_maxrss: the peak of the biggest process
    among the child and its waited-for descendants). Sampling /proc while it runs
    was tried and slowed the analysis down twofold (it takes each process's mm lock).
    """
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        t0 = time.monotonic()
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, text=True, env=env, cwd=REPO)
        killed = threading.Event()

        def kill() -> None:
            killed.set()
            proc.kill()

        timer = threading.Timer(timeout, kill)
        timer.start()
        _, status, ru = os.wait4(proc.pid, 0)
        timer.cancel()
        wall = time.monotonic() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        return {"wall": wall, "cpu": ru.ru_utime + ru.ru_stime, "maxrss": ru.ru_maxrss * 1024, "rc": proc.returncode, "timed_out": killed.is_set(),
                "stdout": out.read(), "stderr": err.read()}


def ensure_dumps(outdir: str, ranks: int) -> tuple[str, int]:
    d = os.path.join(outdir, f"fr_{ranks}")
    fault = ranks * 3 // 4 + 3
    marker = os.path.join(d, ".complete")
    if not os.path.exists(marker):
        t = time.monotonic()
        print(f"generating {ranks} dumps in {d} ...", flush=True)
        gen_fr.generate(d, ranks, 2000, fault)
        open(marker, "w").close()
        print(f"  generated in {time.monotonic() - t:.0f}s", flush=True)
    return d, fault


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", type=int, nargs="*", default=[1024, 4096], help="dump set sizes for our analyser (none: skip it)")
    ap.add_argument("--outdir", default=os.path.join(HERE, "out"))
    ap.add_argument("--no-torchfrtrace", action="store_true", help="do not time torch's analyser")
    ap.add_argument("--torchfrtrace-ranks", type=int, default=1024, help="dump set torchfrtrace runs on")
    ap.add_argument("--peer-timeout", type=float, default=400.0, help="seconds torchfrtrace may run")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds our analyser may run")
    ap.add_argument("--repeat", type=int, default=1, help="runs of our analyser per size (the fastest is kept)")
    a = ap.parse_args(argv)
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    results: dict[int, dict] = {}
    ok = True
    for n in a.ranks:
        d, fault = ensure_dumps(a.outdir, n)
        size = sum(e.stat().st_size for e in os.scandir(d) if e.is_file())
        runs = [measure([sys.executable, "-c", OURS, d], a.timeout, env) for _ in range(max(1, a.repeat))]
        if len(runs) > 1:
            print(f"  {n} ranks, all runs: " + ", ".join(f"{x['wall']:.2f} s wall / {x['cpu']:.2f} s cpu" for x in runs))
        r = min(runs, key=lambda x: x["wall"])
        info = json.loads(r["stdout"]) if r["rc"] == 0 else {}
        want = [["fr.collective_mismatch", fault, "0", 2000 // 6 + 67, "size"]]
        correct = info.get("roots") == want
        # peak of the tree: at most the parent's peak plus each worker at the largest worker's peak
        r["peak_rss"] = info.get("rss_bound", r["maxrss"])
        ok &= correct and r["wall"] <= 10 and r["peak_rss"] <= 2 * GiB if n == 4096 else correct
        results[n] = r
        print(f"slurm-attr  {n:5d} ranks ({size / 2**20:.0f} MiB): {r['wall']:6.2f} s wall, {r['cpu']:.2f} s cpu, peak RSS <= {r['peak_rss'] / 2**20:4.0f} MiB "
              f"(largest process {r['maxrss'] / 2**20:.0f} MiB), "
              f"culprit {'OK' if correct else 'WRONG'} {info.get('roots')} (+{info.get('cascades')} downstream; "
              f"{info.get('tail_read')}/{info.get('ranks')} ranks read head+tail; load {info.get('load_seconds', 0):.2f} s)", flush=True)
        if r["rc"] != 0:
            print(r["stderr"][-2000:])
    if not a.no_torchfrtrace:
        n = a.torchfrtrace_ranks
        d, fault = ensure_dumps(a.outdir, n)
        print(f"torchfrtrace on {n} ranks (timeout {a.peer_timeout:.0f} s) ...", flush=True)
        r = measure([sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", d, "-p", gen_fr.PREFIX], a.peer_timeout)
        r["peak_rss"] = r["maxrss"]  # one process
        status = "TIMED OUT" if r["timed_out"] else f"exit {r['rc']}"
        log = os.path.join(a.outdir, f"torchfrtrace_{n}.log")
        with open(log, "w") as f:
            f.write(r["stderr"])
        # torchfrtrace logs a mismatch with the ranks it blames; find the lines that name the faulty rank
        blame = [ln for ln in r["stderr"].splitlines() if "mismatch" in ln.lower() or "culprit" in ln.lower() or "missing ranks" in ln.lower()]
        names = any(str(fault) in ln for ln in blame)
        print(f"torchfrtrace {n:5d} ranks: {r['wall']:6.2f} s wall ({status}), {r['cpu']:.1f} s cpu, peak RSS {r['peak_rss'] / 2**20:6.0f} MiB, "
              f"blames rank {fault}: {names} ({len(blame)} mismatch lines; full output in {log})", flush=True)
        for ln in blame[:4]:
            print("  " + ln[:200])
        if n in results:
            ours = results[n]
            print(f"ratio at {n} ranks: torchfrtrace {r['wall']:.1f} s / slurm-attr {ours['wall']:.2f} s = "
                  f"{r['wall'] / ours['wall']:.0f}x wall, {r['cpu'] / ours['cpu']:.0f}x cpu{' (at least: it timed out)' if r['timed_out'] else ''}; "
                  f"peak RSS {r['peak_rss'] / 2**20:.0f} MiB vs {ours['peak_rss'] / 2**20:.0f} MiB")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
