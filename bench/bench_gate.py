"""Benchmark: the node Prolog gate's wall time per job start (issue 24 item 4; goal <= 100 ms).

Not a test. Times ``python -m slurm_attr.gate`` as the Prolog runs it (a fresh interpreter each
time, the file kernel source, a node state dir with the last job's mark), alternating, on:

  quiet     a node with no kernel lines since its last job (the ordinary case),
  long      the same with a long kernel history before the last job (``--long-mb``, default 64 MB),
  benign    a few new lines since the last job, none of which a drain rule can match,
  xid13     a new non-fatal Xid since the last job: the catalog is loaded (not the ordinary case),

beside ``python -c pass`` (the interpreter's floor). The keyword cache is warmed by one run
before timing; the gate never drains here (no fatal line, so no Slurm call).

    python bench/bench_gate.py [--repeat 30] [--python /opt/slurm-attr/bin/python]
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

GOAL_MS = 100.0
NODE = "n1"


def stamp(t: float) -> str:
    s = time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(t))
    return f"{s[:-2]}:{s[-2:]} bench kernel: "


def make_case(root: str, name: str, long_mb: int) -> dict[str, str]:
    """A node state dir with a mark 10 minutes ago and a kernel log for this case; its env."""
    d = os.path.join(root, name)
    os.makedirs(os.path.join(d, "state"), mode=0o700)
    now = time.time()
    reset_mark(d, now)
    with open(os.path.join(d, f"kern-{NODE}.log"), "w") as f:
        if name == "long":
            line = "usb 1-1: new high-speed USB device number 2 using xhci_hcd, an old kernel line\n"
            n = long_mb * (1 << 20) // (len(line) + 26)
            t0 = now - 30 * 86400
            step = (30 * 86400 - 900) / n
            f.writelines(f"{stamp(t0 + i * step)}{line}" for i in range(n))
        if name in ("benign", "xid13"):
            f.write(f"{stamp(now - 60)}IPv6: ADDRCONF(NETDEV_CHANGE): ib0: link becomes ready\n")
            f.write(f"{stamp(now - 50)}perf: interrupt took too long (2504 > 2500), lowering kernel.perf_event_max_sample_rate\n")
        if name == "xid13":
            f.write(f"{stamp(now - 40)}NVRM: Xid (PCI:0000:3b:00): 13, pid=2331, name=python, Graphics SM Warp "
                    "Exception on (GPC 0, TPC 0, SM 0)\n")
    with open(os.path.join(d, "c.toml"), "w") as f:
        f.write(f'[paths]\nnode_state = "{d}/state"\n[collect]\nkernel_source = "file"\n'
                f'kernel_file = "{d}/kern-%n.log"\nwindow_slack_s = 2\n')
    return dict(os.environ, SLURM_ATTR_CONFIG=f"{d}/c.toml", SLURMD_NODENAME=NODE, SLURM_JOB_ID="4712",
                BENCH_CASE_DIR=d)


def reset_mark(d: str, now: float) -> None:
    """The last job's epilog read the log 10 minutes ago (a gate that judged new lines moves the
    mark to its own start: each timed run must see the same lines)."""
    with open(os.path.join(d, "state", f"lastread.{NODE}"), "w") as f:
        f.write(f"{now - 600:.3f} 4711\n")


def wall(cmd: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, check=False)
    dt = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"the gate exited {proc.returncode}: {proc.stderr.decode()[-500:]}")
    return dt


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--python", default=sys.executable, help="the hooks' interpreter (a site's venv)")
    ap.add_argument("--long-mb", type=int, default=64)
    args = ap.parse_args()
    gate = [args.python, "-m", "slurm_attr.gate"]
    with tempfile.TemporaryDirectory(prefix="bench-gate-") as root:
        cases = {name: make_case(root, name, args.long_mb) for name in ("quiet", "long", "benign", "xid13")}
        times: dict[str, list[float]] = {"python -c pass": []}
        times.update({name: [] for name in cases})
        for env in cases.values():
            reset_mark(env["BENCH_CASE_DIR"], time.time())
            wall(gate, env)  # warms the keyword cache and the page cache, not timed
        for _ in range(args.repeat):
            times["python -c pass"].append(wall([args.python, "-c", "pass"], dict(os.environ)))
            for name, env in cases.items():
                reset_mark(env["BENCH_CASE_DIR"], time.time())
                times[name].append(wall(gate, env))
    print(f"prolog gate wall time, {args.repeat} runs each, {args.python} on {os.cpu_count()} CPUs "
          f"(load {os.getloadavg()[0]:.2f}):")
    for name, xs in times.items():
        ms = [x * 1000 for x in xs]
        print(f"  {name:16s} p50 {statistics.median(ms):6.1f} ms   p99 {pct(ms, 99):6.1f} ms   max {max(ms):6.1f} ms")
    quiet = statistics.median(times["quiet"]) * 1000
    print(f"goal: an ordinary node's gate <= {GOAL_MS:.0f} ms: quiet p50 {quiet:.0f} ms "
          f"({'met' if quiet <= GOAL_MS else 'NOT met'})")


if __name__ == "__main__":
    main()
