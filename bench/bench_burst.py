"""A burst of job ends on the real test cluster, with slurm-attr's controller side off and on.

    python bench/bench_burst.py [--tasks 2000]

Needs the local cluster (`bash cluster/testcluster.sh up`, as root); holds the cluster lock. For
each mode it submits one job array of trivial tasks (every other task exits 1), and while it
runs samples `squeue` latency (every 0.5 s) and the slurm_attr processes on the controller
(every 0.1 s); it reads slurmctld's RPC counts and mean times (`sdiag`) before and after, each
EpilogSlurmctld's wall time (the test cluster's hook timing log), and the workers' own CPU time
(their "worker done" log lines). Mode "off" is `[analysis] enabled = false` (the hook records
nothing: the baseline); mode "on" waits until every task's verdict is stored and commented.

    python bench/bench_burst.py --split-cores

keeps the controller's daemons (slurmctld, slurmdbd, MariaDB, and so the hooks and workers they
start) on CPU 0 and the pretend nodes' slurmd (so their steps, tasks and node epilogs) on the
other CPUs, as a cluster keeps its jobs off the controller's host; the affinities are restored
after the run. Without it everything shares every CPU, the tasks' load landing beside slurmctld.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import re
import sqlite3
import statistics
import subprocess
import sys
import threading
import time
import tomllib
from pathlib import Path

from bench_epilog import env as cluster_env

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from slurm_attr.pipeline.batch import cpu_pressure  # noqa: E402

BASE = Path(os.environ.get("SATTR_CLUSTER_BASE", "/var/lib/sattr-testcluster"))
CONFIG = BASE / "etc" / "slurm_attr.toml"


@contextlib.contextmanager
def analysis_enabled(on: bool):
    original = CONFIG.read_text()
    body = re.sub(r"(?ms)^\[analysis\][^\[]*", "", original).rstrip("\n")
    section = dict(tomllib.loads(original).get("analysis") or {}, enabled=on)
    # The functional suite turns the workers' yielding off; a burst is measured at the site default.
    section.pop("yield_pressure", None)
    body += "\n\n[analysis]\n" + "".join(f"{k} = {_toml(v)}\n" for k, v in section.items())
    _write(CONFIG, body)
    try:
        yield
    finally:
        _write(CONFIG, original)


def _toml(v: object) -> str:
    return ("true" if v else "false") if isinstance(v, bool) else repr(v) if isinstance(v, (int, float)) \
        else '"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"'


def _write(path: Path, text: str) -> None:
    tmp = path.with_suffix(".bench.tmp")
    tmp.write_text(text)
    os.chmod(tmp, path.stat().st_mode)
    os.replace(tmp, path)


def sdiag(env: dict[str, str]) -> dict[str, tuple[int, int]]:
    """{RPC type: (count, total microseconds)} from slurmctld's statistics."""
    out = subprocess.run(["sdiag"], capture_output=True, text=True, env=env, check=True).stdout
    part = out.split("by message type", 1)[1].split("by user", 1)[0]
    return {m.group(1): (int(m.group(2)), int(m.group(3))) for m in
            re.finditer(r"^\s*(\w+)\s+\(\s*\d+\)\s+count:(\d+)\s+ave_time:\d+\s+total_time:(\d+)", part, re.M)}

def _delta(a: dict[str, tuple[int, int]], b: dict[str, tuple[int, int]]) -> dict[str, tuple[int, int]]:
    d = {k: (b[k][0] - a.get(k, (0, 0))[0], b[k][1] - a.get(k, (0, 0))[1]) for k in b}
    return {k: v for k, v in d.items() if v[0] > 0}


@contextlib.contextmanager
def fresh_controller(env: dict[str, str]):
    """slurmctld without the finished jobs it keeps for MinJobAge: every squeue packs all of them, so
    a mode run after another would answer slower for the other's 2,000 records alone. MinJobAge
    is lowered until they are purged, then restored (slurm.conf and `scontrol reconfigure`)."""
    conf = Path(env["SLURM_CONF"])
    original = conf.read_text()
    _write(conf, re.sub(r"(?m)^MinJobAge=.*$", "MinJobAge=10", original))
    try:
        subprocess.run(["scontrol", "reconfigure"], env=env, check=True)
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            out = subprocess.run(["scontrol", "-o", "show", "jobs"], capture_output=True, text=True, env=env).stdout
            if sum(ln.startswith("JobId=") for ln in out.splitlines()) == 0:
                break
            time.sleep(5)
    finally:
        _write(conf, original)
        subprocess.run(["scontrol", "reconfigure"], env=env, check=True)
    time.sleep(5)
    yield


class Sampler(threading.Thread):
    def __init__(self, env: dict[str, str]):
        super().__init__(daemon=True)
        self.env, self.stop = env, threading.Event()
        self.squeue: list[tuple[float, float]] = []  # (monotonic when, seconds it took)
        self.psi: list[tuple[float, float]] = []  # (when, the host's CPU pressure: PSI some avg10, %)
        self.procs: list[tuple[int, int]] = []  # (hooks, workers) at once

    def run(self) -> None:
        last_q = 0.0
        while not self.stop.is_set():
            now = time.monotonic()
            if now - last_q >= 0.5:
                last_q = now
                subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, env=self.env)
                self.squeue.append((now, time.monotonic() - now))
                p = cpu_pressure()
                if p is not None:
                    self.psi.append((now, p))
            self.procs.append(count_processes())
            self.stop.wait(0.1)


def _ours(pid: str) -> bool:
    """A process of this test cluster, not another's of the same name in a versions root
    (cluster/versions.sh), whose processes the host's /proc shows too: its root is not ours."""
    try:
        return os.readlink(f"/proc/{pid}/root") == os.readlink("/proc/self/root")
    except OSError:
        return False


def count_processes() -> tuple[int, int]:
    """(controller hooks, analysis workers) alive now. A worker is counted once per session: the
    sacct it forks carries the worker's command line until it execs."""
    hooks, sessions = 0, set()
    for d in os.listdir("/proc"):
        if not d.isdigit() or not _ours(d):
            continue
        try:
            cmd = Path(f"/proc/{d}/cmdline").read_bytes()
            sid = Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()[3]
        except (OSError, IndexError):
            continue
        if b"slurm_attr.hooks\0work" in cmd or b"slurm_attr.hooks\0analyze" in cmd:
            sessions.add(sid)
        elif b"slurm_attr.hooks\0controller" in cmd or cmd.startswith(b"/") and b"sattr-record" in cmd:
            hooks += 1
    return hooks, len(sessions)


def hook_times(since: float, until: float) -> list[float]:
    out = []
    for ln in (BASE / "log" / "epilog_slurmctld-times.log").read_text().splitlines():
        p = ln.split()
        if len(p) == 5 and since <= float(p[2]) <= until:
            out.append(float(p[3]) - float(p[2]))
    return out


def worker_cpu(since: float) -> tuple[float, int, str]:
    """(cpu seconds, workers, last line) of the workers that ended after ``since``."""
    cpu, n, last = 0.0, 0, ""
    log = BASE / "log" / "sattr-epilog_slurmctld.log"
    for ln in log.read_text(errors="replace").splitlines():
        m = re.match(r"(\S+ \S+),\d+ .*worker done: (.*); cpu ([\d.]+)s", ln)
        if m and time.mktime(time.strptime(m.group(1), "%Y-%m-%d %H:%M:%S")) >= since - 1:
            cpu, n, last = cpu + float(m.group(3)), n + 1, m.group(2)
    return cpu, n, last


def burst(env: dict[str, str], tasks: int, on: bool) -> dict[str, object]:
    outdir = Path("/tmp/sattr-burst")
    subprocess.run(["rm", "-rf", str(outdir)])
    outdir.mkdir()
    os.chown(outdir, int(subprocess.run(["id", "-u", "sattrtest"], capture_output=True, text=True).stdout),
             -1)
    before = sdiag(env)
    sampler = Sampler(env)
    sampler.start()
    t0, m0 = time.time(), time.monotonic()
    arrays = []
    for first in range(0, tasks, 1000):  # Slurm's default MaxArraySize 1001: indexes up to 1000
        last = min(tasks, first + 1000) - 1 - first
        arrays.append(subprocess.run(
            ["su", "sattrtest", "-c", f"cd /tmp && sbatch --parsable -N1 -t 5 --array=0-{last} "
             f"-o {outdir}/%A_%a.out --wrap 'exit $((SLURM_ARRAY_TASK_ID % 2))'"],
            capture_output=True, text=True, env=env, check=True).stdout.strip().split(";")[0])
    while subprocess.run(["squeue", "-h", "-r", "-j", ",".join(arrays), "-o", "%i"], capture_output=True, text=True,
                         env=env).stdout.strip():
        time.sleep(1.0)
    ended, t_end = time.monotonic(), time.time()
    mid = sdiag(env)  # slurmctld's figures for the burst itself; what the workers do after, apart
    stored_at = None
    if on:
        db = tomllib.loads(CONFIG.read_text())["paths"]["database"]
        while time.monotonic() - ended < 900:
            with contextlib.closing(sqlite3.connect(db, timeout=30)) as c:
                n = sum(c.execute("select count(*) from verdicts where job_id like ?", [f"{a}_%"]).fetchone()[0]
                        for a in arrays)
            if n >= tasks:
                stored_at = time.monotonic()
                break
            time.sleep(0.5)
    quiet = time.monotonic() + 60  # the last workers' comment sweep, retention pass and exit
    while time.monotonic() < quiet and count_processes()[1]:
        time.sleep(0.2)
    sampler.stop.set()
    sampler.join()
    after = sdiag(env)
    rpcs, rpcs_after = _delta(before, mid), _delta(mid, after)
    comments = right = 0
    if on:
        out = subprocess.run(["sacct", "-n", "-X", "-P", "-j", ",".join(arrays), "-o", "State,Comment%300"],
                             capture_output=True, text=True, env=env).stdout
        want = {"COMPLETED": "sattr1: none", "FAILED": "sattr1: user_error"}
        for ln in out.splitlines():
            state, _, text = ln.partition("|")
            comments += "sattr1:" in text.lower()
            # right: this task's own verdict, once (not another task's written over it)
            right += text.lower().count("sattr1:") == 1 and text.lower().startswith(want.get(state.split(" ")[0], "?"))
    hooks = hook_times(t0, t_end + 5)
    cpu, workers, last = worker_cpu(t0) if on else (0.0, 0, "")
    q = sorted(d for when, d in sampler.squeue if when <= ended)  # during the burst
    q_after = sorted(d for when, d in sampler.squeue if when > ended)  # while the workers drain it
    psi = [p for when, p in sampler.psi if when <= ended]
    return {"squeue_after_p50": statistics.median(q_after) if q_after else None,
            "squeue_after_p90": q_after[int(0.9 * (len(q_after) - 1))] if q_after else None,
            "rpcs_after": rpcs_after, "arrays": arrays, "burst_s": ended - m0, "stored_after_end_s": (stored_at - ended) if stored_at else None,
            "comments": comments, "comments_right": right,
            "psi_p50": statistics.median(psi) if psi else None,
            "psi_max": max(psi) if psi else None, "peak_workers": max((w for _h, w in sampler.procs), default=0),
            "peak_hooks": max((h for h, _w in sampler.procs), default=0),
            "peak_python": max((h + w for h, w in sampler.procs), default=0),
            "squeue_p50": statistics.median(q) if q else 0.0, "squeue_p90": q[int(0.9 * (len(q) - 1))] if q else 0.0,
            "rpcs": rpcs, "hook_p50": statistics.median(hooks) if hooks else 0.0,
            "hook_p99": sorted(hooks)[int(0.99 * (len(hooks) - 1))] if hooks else 0.0, "hooks": len(hooks),
            "cpu_s": cpu, "worker_runs": workers, "drain_rate": tasks / max(0.001, (stored_at or ended) - m0)}


def _pair(a: float | None, b: float | None, fmt: str = "{:.0f}") -> str:
    return "-" if a is None or b is None else f"{fmt.format(a)} / {fmt.format(b)}"


CONTROLLER_DAEMONS = ("slurmctld", "slurmdbd", "mariadbd", "mysqld")


def _pids(name: str) -> list[int]:
    """This test cluster's processes of that name (_ours)."""
    out = subprocess.run(["pgrep", "-x", name], capture_output=True, text=True).stdout
    return [int(p) for p in out.split() if _ours(p)]


@contextlib.contextmanager
def split_cores(enabled: bool):
    """The controller's daemons on CPU 0, the nodes' slurmd on the rest (inherited by what each
    forks from then on: hooks and workers on the controller's CPU, steps and epilogs on the
    nodes'); every affinity back to all CPUs afterwards."""
    cpus = sorted(os.sched_getaffinity(0))
    if not enabled or len(cpus) < 2:
        yield None
        return
    ctl, nodes = {cpus[0]}, set(cpus[1:])
    pinned = [(p, ctl) for n in CONTROLLER_DAEMONS for p in _pids(n)] + [(p, nodes) for p in _pids("slurmd")]
    try:
        for pid, cpuset in pinned:
            for tid in os.listdir(f"/proc/{pid}/task"):  # every thread, as `taskset -a`
                with contextlib.suppress(OSError):
                    os.sched_setaffinity(int(tid), cpuset)
        yield {"controller": sorted(ctl), "nodes": sorted(nodes)}
    finally:
        for pid, _ in pinned:
            with contextlib.suppress(OSError):
                for tid in os.listdir(f"/proc/{pid}/task"):
                    with contextlib.suppress(OSError):
                        os.sched_setaffinity(int(tid), set(cpus))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tasks", type=int, default=2000)
    ap.add_argument("--split-cores", action="store_true",
                    help="controller daemons on CPU 0, the nodes' slurmd on the others")
    args = ap.parse_args()
    env = cluster_env()  # bench_epilog's: the test cluster's environment
    res = {}
    for name, on in (("off", False), ("on", True)):
        with fresh_controller(env), analysis_enabled(on), split_cores(args.split_cores) as split:
            res[name] = burst(env, args.tasks, on)
        print(f"{name}: {res[name]}", file=sys.stderr)
    off, on = res["off"], res["on"]
    where = (f"controller daemons, hooks and workers on CPU {split['controller']}, the nodes on {split['nodes']}"
             if split else "every process on every CPU")
    print(f"\nburst of {args.tasks} array tasks (half exit 1), slurm-attr's controller side off vs on; {where}\n")
    rows = [("array tasks ended (s)", off["burst_s"], on["burst_s"]),
            ("verdicts stored after the last end (s)", None, on["stored_after_end_s"]),
            ("comments written / each task's own verdict", None, f"{on['comments']} / {on['comments_right']}"),
            ("host CPU pressure p50 / max (PSI avg10 %)", _pair(off["psi_p50"], off["psi_max"]),
             _pair(on["psi_p50"], on["psi_max"])),
            ("peak analysis processes (workers)", off["peak_workers"], on["peak_workers"]),
            ("peak slurm_attr processes (hooks + workers)", off["peak_python"], on["peak_python"]),
            ("squeue p50 (s)", off["squeue_p50"], on["squeue_p50"]),
            ("squeue p90 (s)", off["squeue_p90"], on["squeue_p90"]),
            ("squeue p50 / p90 after the burst, workers draining (s)", None,
             _pair(on["squeue_after_p50"], on["squeue_after_p90"], "{:.3f}")),
            ("EpilogSlurmctld p50 (ms)", off["hook_p50"] * 1e3, on["hook_p50"] * 1e3),
            ("EpilogSlurmctld p99 (ms)", off["hook_p99"] * 1e3, on["hook_p99"] * 1e3),
            ("jobs/s to verdict (all stored)", None, on["drain_rate"]),
            ("worker CPU s per job", None, on["cpu_s"] / args.tasks)]
    for label, a, b in rows:
        fa = "-" if a is None else f"{a:.3f}" if isinstance(a, float) else str(a)
        fb = "-" if b is None else f"{b:.3f}" if isinstance(b, float) else str(b)
        print(f"  {label:<46} off {fa:>10}   on {fb:>10}")
    print("\nslurmctld RPCs during the burst, from submission to the last task's end (count, mean µs): off | on")
    for k in sorted(set(off["rpcs"]) | set(on["rpcs"])):
        a, b = off["rpcs"].get(k, (0, 0)), on["rpcs"].get(k, (0, 0))
        print(f"  {k:<36} {a[0]:>6} {a[1] / max(1, a[0]):>8.0f} | {b[0]:>6} {b[1] / max(1, b[0]):>8.0f}")
    ta = sum(v[1] for v in off["rpcs"].values()) / max(1, sum(v[0] for v in off["rpcs"].values()))
    tb = sum(v[1] for v in on["rpcs"].values()) / max(1, sum(v[0] for v in on["rpcs"].values()))
    print(f"\n  all RPCs mean time: off {ta:.0f} µs, on {tb:.0f} µs (ratio {tb / max(1.0, ta):.2f}); "
          f"squeue p50 ratio {on['squeue_p50'] / max(1e-9, off['squeue_p50']):.2f}, "
          f"p90 ratio {on['squeue_p90'] / max(1e-9, off['squeue_p90']):.2f}")
    after = on["rpcs_after"]
    print("\nafter the burst, while the workers drained it (count, mean µs): "
          + ", ".join(f"{k} {v[0]} {v[1] / max(1, v[0]):.0f}" for k, v in sorted(after.items())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
