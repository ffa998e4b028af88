"""pyslurm backend vs Slurm CLI backend, measured in one run on the real test cluster.

    flock -o /var/lock/sattr-cluster.lock python bench/bench_backends.py [--jobs 5] [--writes 20]

Needs the local cluster up (`bash cluster/testcluster.sh up`, as root) with pyslurm installed
in its venv and in this interpreter (cluster/pyslurm.sh). Alternating the two backends job by
job, so both see the same machine load:

1. node epilog wall time on the path where the epilog talks to Slurm: each job writes a fatal
   Xid line into its node's kernel source, the epilog's fast path reads the node, the breaker's
   view (every node) and drains it (the hook wrapper's timing log gives the wall time); the
   bench then resumes that drain (ours: reason SATTR:) and waits for the node to be idle;
2. job end -> the verdict visible in `sacct -o Comment` (the analysis reads job facts and writes
   the Comment through the backend);
3. comment-write latency alone: AdminComment writes on a finished job, in this process
   (library loaded) and from a fresh interpreter per write (what one hook run pays).

The hooks' backend is switched with `[slurm] backend` in the cluster's slurm_attr.toml,
which is restored afterwards (no daemon reads that file; nothing restarts).
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
BASE = Path(os.environ.get("SATTR_CLUSTER_BASE", "/var/lib/sattr-testcluster"))
TOML = BASE / "etc" / "slurm_attr.toml"
NODE = "n3"
XID = "NVRM: Xid (PCI:0000:3b:00): 79, pid={pid}, name=python, GPU has fallen off the bus."
BACKENDS = ("cli", "pyslurm")


def cluster_env() -> dict[str, str]:
    e = dict(os.environ)
    out = subprocess.run(["bash", str(REPO / "cluster" / "testcluster.sh"), "env"], capture_output=True,
                         text=True, check=True).stdout
    for part in out.split():
        if "=" in part:
            k, v = part.split("=", 1)
            e[k] = v
    return e


def sh(e: dict[str, str], *args: str, check: bool = True) -> str:
    return subprocess.run(list(args), capture_output=True, text=True, env=e, check=check, timeout=120).stdout


def set_backend(original: str, backend: str) -> None:
    tmp = TOML.with_suffix(".bench")
    tmp.write_text(original.rstrip("\n") + f'\n\n[slurm]\nbackend = "{backend}"\n')
    os.replace(tmp, TOML)


def epilog_time(job: str, timeout: float = 60) -> float:
    deadline = time.monotonic() + timeout
    log = BASE / "log" / "epilog-times.log"
    while time.monotonic() < deadline:
        for ln in log.read_text().splitlines() if log.exists() else []:
            p = ln.split()
            if len(p) == 5 and p[0] == job:
                return float(p[3]) - float(p[2])
        time.sleep(0.1)
    return float("nan")


def node_state(e: dict[str, str]) -> tuple[str, str]:
    out = sh(e, "sinfo", "-h", "-N", "-n", NODE, "-o", "%T|%E").strip().splitlines()
    st, _, reason = (out[0] if out else "|").partition("|")
    return st, reason


def wait_idle(e: dict[str, str], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if node_state(e)[0] == "idle":
            return
        time.sleep(0.2)
    raise SystemExit(f"{NODE} not idle: {node_state(e)}")


def fatal_job(e: dict[str, str]) -> tuple[str, float, float, str]:
    """(job id, epilog wall s, job end -> SATTR1: Comment s, the drain reason seen)."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    line = f"{stamp[:-2]}:{stamp[-2:]} {os.uname().nodename} kernel: {XID.format(pid=os.getpid())}"
    kern = BASE / "kernel" / f"{NODE}.log"
    script = f"echo JOB=$SLURM_JOB_ID; echo {line!r} >> {kern}; sleep 0.3; exit 1"
    out = sh(e, "srun", "-N1", "-w", NODE, "bash", "-c", script, check=False)
    t_end = time.monotonic()
    job = next(ln.split("=", 1)[1] for ln in out.splitlines() if ln.startswith("JOB="))
    comment = float("nan")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if "SATTR1:" in sh(e, "sacct", "-n", "-P", "-X", "-j", job, "-o", "Comment%400", check=False):
            comment = time.monotonic() - t_end
            break
        time.sleep(0.1)
    ep = epilog_time(job)
    st, reason = node_state(e)
    if reason.startswith("SATTR:") and f"job {job}" in reason:
        sh(e, "scontrol", "update", f"NodeName={NODE}", "State=RESUME")  # our own drain only
    wait_idle(e)
    return job, ep, comment, reason


def write_latency(e: dict[str, str], job: str, writes: int) -> dict[str, dict[str, list[float]]]:
    from slurm_attr import config
    from slurm_attr.slurm import select

    cfg = config.load(str(TOML))
    made = {b: select.choose(b, cfg.paths.slurm_bin, cfg.paths.slurm_conf, comment_tool=cfg.paths.comment_tool)[0]
            for b in BACKENDS}
    out: dict[str, dict[str, list[float]]] = {b: {"in-process": [], "fresh process": []} for b in BACKENDS}
    py = str(BASE / "venv" / "bin" / "python")
    code = ("import sys; from slurm_attr import config; from slurm_attr.slurm import select; "
            "c = config.load(sys.argv[1]); b = select.choose(sys.argv[2], c.paths.slurm_bin, c.paths.slurm_conf, "
            "comment_tool=c.paths.comment_tool)[0]; b.set_job_comment(sys.argv[3], 'AdminComment', sys.argv[4])")
    for i in range(writes):
        for b in BACKENDS:
            t0 = time.perf_counter()
            made[b].set_job_comment(job, "AdminComment", f"Bench Write {i} via {b}")
            out[b]["in-process"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            subprocess.run([py, "-c", code, str(TOML), b, job, f"Bench Fresh {i} via {b}"], env=e, check=True)
            out[b]["fresh process"].append(time.perf_counter() - t0)
    got = made["pyslurm"].job_comment(job, "AdminComment")
    assert got == f"Bench Fresh {writes - 1} via pyslurm", got  # the last write landed, case kept
    return out


def med_ms(xs: list[float]) -> str:
    xs = [x for x in xs if x == x]
    return f"{statistics.median(xs) * 1000:7.1f} ms (min {min(xs) * 1000:.1f}, max {max(xs) * 1000:.1f}, n={len(xs)})"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=5, help="fatal-Xid jobs per backend")
    ap.add_argument("--writes", type=int, default=20, help="AdminComment writes per backend and mode")
    args = ap.parse_args()
    e = cluster_env()
    os.environ["SLURM_CONF"] = e["SLURM_CONF"]
    wait_idle(e)
    if node_state(e)[1] not in ("", "none"):
        raise SystemExit(f"{NODE} has a reason set ({node_state(e)[1]!r}): not touching it")
    original = TOML.read_text()
    epilog: dict[str, list[float]] = {b: [] for b in BACKENDS}
    comment: dict[str, list[float]] = {b: [] for b in BACKENDS}
    last_job = ""
    try:
        for _ in range(args.jobs):
            for b in BACKENDS:
                set_backend(original, b)
                job, ep, cm, reason = fatal_job(e)
                if not reason.startswith("SATTR:"):
                    print(f"  warning: job {job} ({b}): {NODE} not drained by the fast path ({reason!r})")
                epilog[b].append(ep)
                comment[b].append(cm)
                last_job = job
    finally:
        tmp = TOML.with_suffix(".bench")
        tmp.write_text(original)
        os.replace(tmp, TOML)
    writes = write_latency(e, last_job, args.writes)
    print(f"Slurm backends on the test cluster (2 cores shared), {args.jobs} fatal-Xid jobs and "
          f"{args.writes} AdminComment writes per backend, alternating")
    for b in BACKENDS:
        print(f"  {b:8s} node epilog (fast-path drain)  {med_ms(epilog[b])}")
        print(f"  {b:8s} job end -> Comment visible    {med_ms(comment[b])}")
        for mode, xs in writes[b].items():
            print(f"  {b:8s} comment write, {mode:13s} {med_ms(xs)}")
    for what, a, c in (("node epilog", epilog["pyslurm"], epilog["cli"]),
                       ("job end -> Comment", comment["pyslurm"], comment["cli"]),
                       ("comment write in-process", writes["pyslurm"]["in-process"], writes["cli"]["in-process"]),
                       ("comment write fresh process", writes["pyslurm"]["fresh process"],
                        writes["cli"]["fresh process"])):
        a2, c2 = [x for x in a if x == x], [x for x in c if x == x]
        print(f"  pyslurm / cli, {what}: {statistics.median(a2) / statistics.median(c2):.2f}x")


if __name__ == "__main__":
    main()
