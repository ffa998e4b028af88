"""Nothing lost (issue 11): faults injected while jobs end, on the real cluster.

Each test injects one fault, ends a few jobs during it (one with a fresh fatal Xid on n4),
clears the fault and checks: every node epilog exited 0; n4 was DRAIN before it was ever
IDLE (sinfo every 100 ms); every job got a stored verdict once the fault cleared, with a
coverage entry naming the fault; nothing is left in the evidence roots. Each prints its
figures (FIGURE lines; run with -s to see them). The soak test runs only under `make soak`.
"""
from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from test_drain import FATAL, NODES, KernelLines, _held_job, _ours, _wait_no_sattr_drains, sattr

pytestmark = pytest.mark.cluster

FATAL_NODE = "n4"
PLAIN_NODES = ["n1", "n2", "n3"]


# -- helpers ------------------------------------------------------------------------------------


class Poller(threading.Thread):
    """sinfo every 100 ms for one node: (epoch, state) samples."""

    def __init__(self, cluster, node):
        super().__init__(daemon=True)
        self.cluster, self.node = cluster, node
        self.samples: list[tuple[float, str]] = []
        self.halt = threading.Event()

    def run(self):
        while not self.halt.is_set():
            t = time.time()
            try:
                state = self.cluster.node_state(self.node)[0]
            except Exception:  # noqa: BLE001 - a failed sample is just missing
                state = "?"
            self.samples.append((t, state))
            self.halt.wait(max(0.0, 0.1 - (time.time() - t)))

    def stop(self):
        self.halt.set()
        self.join(5)


def _epilog_rows(cluster, jobs):
    rows = {}
    log = cluster.base / "log" / "epilog-times.log"
    for ln in log.read_text().splitlines() if log.exists() else []:
        p = ln.split()
        if len(p) == 5 and p[0] in jobs:
            rows[(p[0], p[1])] = (float(p[2]), float(p[3]), p[4])
    return rows


def _wait_ended(cluster, jobs, timeout=120):
    """Ended per slurmctld (works while accounting is stopped): not in squeue any more."""
    deadline = time.monotonic() + timeout
    left = set(jobs)
    while left and time.monotonic() < deadline:
        out = cluster.run(["squeue", "-h", "-o", "%i", "-j", ",".join(sorted(left))], check=False).stdout.split()
        left = {j for j in left if j in out}
        if left:
            time.sleep(0.3)
    assert not left, f"jobs still queued or running: {sorted(left)}"


def _wait_epilogs(cluster, jobs, nodes_of, timeout=90):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rows = _epilog_rows(cluster, set(jobs))
        if all((j, n) in rows for j in jobs for n in nodes_of[j]):
            return rows
        time.sleep(0.3)
    raise AssertionError(f"node epilogs missing: {[(j, n) for j in jobs for n in nodes_of[j] if (j, n) not in rows]}")


def _verdicts(cluster, jobs):
    if not cluster.db_path.exists():
        return {}
    try:
        con = sqlite3.connect(f"file:{cluster.db_path}?mode=ro", uri=True, timeout=1)
        marks = ",".join("?" for _ in jobs)
        rows = con.execute(f"select job_id, verdict_json, analyzed_at from verdicts where job_id in ({marks})",
                           list(jobs)).fetchall()
        con.close()
    except sqlite3.Error:
        return {}
    return {r[0]: (json.loads(r[1]), r[2]) for r in rows}


def _wait_verdicts(cluster, jobs, timeout, want=lambda v: True, retry_every=None):
    """Wait until every job has a stored verdict that `want` accepts; optionally run the timer's
    `sattr retry` every `retry_every` seconds (as cron would). Returns {job: (verdict, stored_at)}."""
    deadline = time.monotonic() + timeout
    last_retry = time.monotonic()
    got = {}
    while time.monotonic() < deadline:
        got = {j: vt for j, vt in _verdicts(cluster, jobs).items() if want(vt[0])}
        if len(got) == len(jobs):
            return got
        if retry_every and time.monotonic() - last_retry >= retry_every:
            sattr(cluster, "retry")
            last_retry = time.monotonic()
        time.sleep(0.5)
    missing = sorted(set(jobs) - set(got))
    pend = sattr(cluster, "list", "--pending").stdout
    log = cluster.base / "log" / "sattr-epilog.log"
    tail = log.read_text()[-4000:] if log.exists() else ""
    raise AssertionError(f"no acceptable verdict for {missing} after {timeout}s; pending:\n{pend}\n{tail}")


def _check_causes(got, jobs, fatal, fatal_may_be_unknown=False):
    """The jobs that exited 0 are `none` (a COMPLETED job is never `unknown`), the one that exited 1
    is not `none`, the Xid job is `gpu_hardware` (or, in a partial verdict made before its node's
    part arrived, `unknown` with the analysis named in the coverage)."""
    for j in jobs[1:-1]:
        assert got[j][0]["cause"] == "none", (j, got[j][0]["summary"], got[j][0]["coverage"])
    assert got[jobs[0]][0]["cause"] != "none", got[jobs[0]][0]
    v = got[fatal][0]
    if fatal_may_be_unknown and v["cause"] == "unknown":
        assert any(c["source"] == "analysis" for c in v["coverage"]), v
    else:
        assert v["cause"] == "gpu_hardware", v


def _pending(cluster, jobs):
    proc = sattr(cluster, "list", "--pending", "--json")
    assert proc.returncode == 0, proc.stderr
    return [d for d in json.loads(proc.stdout) if d["job_id"] in set(jobs)]


def _evidence_left(cluster, jobs):
    left = []
    for n in NODES:
        root = cluster.base / "nodes" / n / "evidence"
        for name in os.listdir(root) if root.is_dir() else []:
            if name.split(".")[0] in jobs:
                left.append(f"{n}:{name}")
    return left


def _drained_before_idle(poller: Poller, since: float):
    """(first DRAIN sample's time, whether any IDLE sample came before it) after `since`."""
    idle_first = False
    for t, state in poller.samples:
        if t < since:
            continue
        if "drain" in state:
            return t, idle_first
        if state.startswith("idle"):
            idle_first = True
    return None, idle_first


@pytest.fixture
def scene(cluster):
    """Breaker reset, our drains resumed and injected lines removed afterwards; the jobs' comments
    and the pending queue are the tests' own to check."""
    lines = KernelLines(cluster)
    _wait_no_sattr_drains(cluster)
    assert sattr(cluster, "breaker", "reset", "--reason", "durability test start").returncode == 0
    try:
        yield lines
    finally:
        lines.remove()
        for n in NODES:
            if _ours(cluster.node_state(n)[1]):
                sattr(cluster, "undrain", n, "--reason", "durability test cleanup")
        sattr(cluster, "breaker", "reset", "--reason", "durability test end")
        _wait_no_sattr_drains(cluster)


def _run_jobs_with_fatal(cluster, lines, plain=3, fail_one=True):
    """`plain` short jobs on n1-n3 (the first exits 1) and a job on n4 that gets a fresh Xid 79.
    Returns (jobs, nodes_of, fatal_job, poller, fatal_running_at); jobs[1:-1] exit 0."""
    jobs, nodes_of = [], {}
    for i in range(plain):
        node = PLAIN_NODES[i % len(PLAIN_NODES)]
        code = 1 if (fail_one and i == 0) else 0
        j = cluster.sbatch(f"#!/bin/bash\n#SBATCH -N1 -w {node}\nsleep 2\nexit {code}\n", user="sattrtest")
        jobs.append(j)
        nodes_of[j] = [node]
    gate = cluster.gate()
    fatal = _held_job(cluster, FATAL_NODE, gate)
    jobs.append(fatal)
    nodes_of[fatal] = [FATAL_NODE]
    cluster.wait_running(fatal)
    poller = Poller(cluster, FATAL_NODE)
    poller.start()
    running_at = time.time()
    lines.add(FATAL_NODE, FATAL)
    gate.open()
    return jobs, nodes_of, fatal, poller, running_at


def _check_epilogs_and_drain(cluster, jobs, nodes_of, fatal, poller, running_at, lines, label):
    rows = _wait_epilogs(cluster, jobs, nodes_of)
    time.sleep(1.0)  # a few more samples after the fatal node's epilog
    poller.stop()
    lines.remove(FATAL_NODE)
    bad = {k: v for k, v in rows.items() if v[2] != "0"}
    assert not bad, f"node epilogs that did not exit 0: {bad}"
    drained_at, idle_first = _drained_before_idle(poller, running_at)
    assert drained_at is not None, f"{FATAL_NODE} never drained: {poller.samples[-10:]}"
    assert not idle_first, f"{FATAL_NODE} was IDLE before DRAIN: {poller.samples}"
    end = rows[(fatal, FATAL_NODE)][0]  # the node epilog's start: the job's end on that node
    print(f"FIGURE {label}: fatal node DRAIN {drained_at - end:.2f}s after the job's end, never IDLE before; "
          f"node epilogs max {max(v[1] - v[0] for v in rows.values()):.2f}s")
    return rows


# -- the faults -----------------------------------------------------------------------------------


def test_database_locked_30s_loses_nothing_and_the_fast_path_still_drains(cluster, scene):
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sqlite3, sys, time\n"
         "c = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=30)\n"
         "c.execute('BEGIN EXCLUSIVE')\n"
         "print('locked', flush=True)\n"
         "time.sleep(float(sys.argv[2]))\n"
         "c.execute('COMMIT')\n", str(cluster.db_path), "30"],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        jobs, nodes_of, fatal, poller, running_at = _run_jobs_with_fatal(cluster, scene)
        _check_epilogs_and_drain(cluster, jobs, nodes_of, fatal, poller, running_at, scene, "db locked")
        assert holder.poll() is None and _verdicts(cluster, jobs) == {}  # nothing could be stored yet
        pend = {d["job_id"] for d in _pending(cluster, jobs)}
        assert pend == set(jobs), f"jobs not recorded as pending while the database is locked: {pend}"
        # Which analyses the lock made fail (under load some only start writing as it ends).
        bitten = set()
        while holder.poll() is None:
            bitten |= {d["job_id"] for d in _pending(cluster, jobs) if "locked" in d["last_error"]}
            time.sleep(1)
        assert bitten, "no analysis met the locked database: the fault was not injected"
    finally:
        holder.wait(60)
    cleared = time.time()
    got = _wait_verdicts(cluster, jobs, timeout=150)
    last = max(t for _, t in got.values())
    print(f"FIGURE db locked: {len(got)}/{len(jobs)} verdicts; last verdict {last - cleared:.1f}s after the lock ended")
    print(f"FIGURE db locked: {len(bitten)} of {len(jobs)} analyses failed on the lock and were retried")
    for j in bitten:
        v = got[j][0]
        assert any(c["source"] == "intake" and "locked" in c["detail"] for c in v["coverage"]), (j, v["coverage"])
    _check_causes(got, jobs, fatal)
    decisions = [a for a in got[fatal][0]["actions"]]
    assert decisions and decisions[0]["blocked_by"] == "already drained"  # the fast path did it
    _wait_gone_from_queue(cluster, jobs)
    assert _evidence_left(cluster, jobs) == []


def _wait_gone_from_queue(cluster, jobs, timeout=30):
    deadline = time.monotonic() + timeout
    left = []
    while time.monotonic() < deadline:
        left = _pending(cluster, jobs)
        if not left:
            return
        time.sleep(0.5)
    raise AssertionError(f"still pending after their verdicts were stored: {left}")


def _slurmd_pids(cluster):
    return {n: int((cluster.base / "run" / f"slurmd-{n}.pid").read_text().split()[0]) for n in NODES}


@contextmanager
def spool_fault(cluster, kind):
    """The spool full (a 1 MiB tmpfs, filled) or read-only, seen by every node and the controller.

    Each slurmd lives in a private mount namespace: the tmpfs is mounted in each of them (nsenter)
    and on the host, over the spool, and unmounted afterwards (its bundles go with it)."""
    spool_dir = cluster.base / "attr" / "spool"
    opts = "size=1m,mode=0755" + (",ro" if kind == "readonly" else "")
    pids = _slurmd_pids(cluster)
    mounted = []
    try:
        for target in [None, *pids.values()]:
            pre = [] if target is None else ["nsenter", "-t", str(target), "-m", "--"]
            subprocess.run([*pre, "mount", "-t", "tmpfs", "-o", opts, "sattr-spool-fault", str(spool_dir)], check=True)
            mounted.append(pre)
            if kind == "full":
                # Fill it: the bundles dir exists, then no byte is left.
                subprocess.run([*pre, "sh", "-c", f"mkdir -p {spool_dir}/bundles && "
                                f"dd if=/dev/zero of={spool_dir}/filler bs=64k 2>/dev/null; true"], check=True)
        yield
    finally:
        for pre in reversed(mounted):
            subprocess.run([*pre, "umount", "-l", str(spool_dir)], check=False)


@pytest.mark.parametrize("kind", ["full", "readonly"])
def test_spool_full_or_readonly_still_drains_stores_and_cleans(cluster, scene, kind):
    with spool_fault(cluster, kind):
        jobs, nodes_of, fatal, poller, running_at = _run_jobs_with_fatal(cluster, scene)
        _check_epilogs_and_drain(cluster, jobs, nodes_of, fatal, poller, running_at, scene, f"spool {kind}")
        got = _wait_verdicts(cluster, jobs, timeout=120)
    print(f"FIGURE spool {kind}: {len(got)}/{len(jobs)} verdicts stored during the fault "
          f"(last {max(t for _, t in got.values()) - running_at:.1f}s after the fatal job started)")
    for j, (v, _) in got.items():
        assert any(c["source"] == "spool" for c in v["coverage"]), (j, v["coverage"])
    _check_causes(got, jobs, fatal)
    assert got[fatal][0]["culprit"]["nodes"] == [FATAL_NODE]
    _wait_gone_from_queue(cluster, jobs)
    assert _evidence_left(cluster, jobs) == []


def test_analysis_timeout_stores_a_partial_verdict_then_retry_replaces_it(cluster, scene):
    # 1 ms: the limit always strikes before the verdict is stored (a normal analysis of these
    # small jobs now takes well under 0.5 s, which would let it finish).
    with cluster.settings(analysis={"timeout_s": 0.001}):
        jobs, nodes_of, fatal, poller, running_at = _run_jobs_with_fatal(cluster, scene)
        _check_epilogs_and_drain(cluster, jobs, nodes_of, fatal, poller, running_at, scene, "analysis timeout")
        partial = _wait_verdicts(cluster, jobs, timeout=90, want=lambda v: any(
            c["source"] == "analysis" and "timed out" in c["detail"] for c in v["coverage"]))
        # The limit strikes before the fatal node's part may have arrived: its partial verdict
        # has the hardware finding only if the part (or Slurm's drain reason) was already there.
        _check_causes(partial, jobs, fatal, fatal_may_be_unknown=True)
        assert {d["job_id"] for d in _pending(cluster, jobs)} == set(jobs)
    cleared = time.time()
    proc = sattr(cluster, "retry", "--all")
    assert proc.returncode == 0, proc.stderr
    full = _wait_verdicts(cluster, jobs, timeout=120, retry_every=5, want=lambda v: not any(
        c["source"] == "analysis" for c in v["coverage"]))
    print(f"FIGURE analysis timeout: {len(partial)}/{len(jobs)} partial verdicts during the fault, "
          f"{len(full)}/{len(jobs)} full after; last {max(t for _, t in full.values()) - cleared:.1f}s after the fault cleared")
    _check_causes(full, jobs, fatal)
    for j, (v, _) in full.items():
        assert any(c["source"] == "intake" and "timed out" in c["detail"] for c in v["coverage"]), (j, v["coverage"])
    _wait_gone_from_queue(cluster, jobs)
    assert _evidence_left(cluster, jobs) == []


def test_accounting_stopped_completed_jobs_are_never_unknown(cluster, scene):
    pid = int((cluster.base / "run" / "slurmdbd.pid").read_text().split()[0])
    os.kill(pid, signal.SIGSTOP)
    stopped = True
    try:
        jobs, nodes_of, fatal, poller, running_at = _run_jobs_with_fatal(cluster, scene)
        _check_epilogs_and_drain(cluster, jobs, nodes_of, fatal, poller, running_at, scene, "slurmdbd stopped")
        _wait_ended(cluster, jobs)
        during = _wait_verdicts(cluster, jobs, timeout=150)
        os.kill(pid, signal.SIGCONT)
        stopped = False
        cleared = time.time()
    finally:
        if stopped:
            os.kill(pid, signal.SIGCONT)
    print(f"FIGURE slurmdbd stopped: {len(during)}/{len(jobs)} verdicts stored while accounting was down")
    _check_causes(during, jobs, fatal)
    for j in jobs[1:-1]:
        assert any(c["source"] == "accounting" for c in during[j][0]["coverage"]), (j, during[j][0]["coverage"])
    # Once accounting answers, the queued comments go out (the timer's `sattr comments --retry`).
    deadline = time.monotonic() + 120
    missing = list(jobs)
    while missing and time.monotonic() < deadline:
        cluster.run([cluster.env["SATTR_BIN"], "comments", "--retry"], check=False)
        missing = [j for j in jobs if "sattr1:" not in cluster.sacct(j, "Comment%400").get("Comment", "").lower()]
        if missing:
            time.sleep(2)
    assert not missing, f"no comment after accounting came back: {missing}"
    print(f"FIGURE slurmdbd stopped: last comment {time.time() - cleared:.1f}s after SIGCONT")
    _wait_gone_from_queue(cluster, jobs)
    assert _evidence_left(cluster, jobs) == []


def _bundle_bytes(path: Path) -> int:
    total = 0
    for root, dirs, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_blocks * 512
            except OSError:
                pass
    return total


def test_hostile_sparse_job_writes_little_to_the_spool(cluster, scene):
    script = ("#!/bin/bash\n#SBATCH -N1 -w n1\n"
              'for r in 0 1 2 3; do truncate -s 2G "$SLURM_ATTR_DIR/fr/nccl_trace_rank_$r"; done\n'
              'truncate -s 1G "$SLURM_ATTR_DIR/probe/rank0.probe"\n'
              'truncate -s 1G "$SLURM_ATTR_DIR/nccl/nccl.n1.1.log"\n'
              'head -c 100000 /dev/urandom > "$SLURM_ATTR_DIR/fr/nccl_trace_rank_9"\n'
              "exit 1\n")
    job = cluster.sbatch(script, user="sattrtest")
    got = _wait_verdicts(cluster, [job], timeout=90)
    v = got[job][0]
    used = _bundle_bytes(cluster.bundle(job))
    print(f"FIGURE hostile sparse job: {used / (1 << 20):.2f} MiB written to the spool "
          f"(issue 11 measured 329 MiB before)")
    assert used < 4 << 20, used
    notes = [c for c in v["coverage"] if "sparse" in (c.get("detail") or "")]
    assert notes, v["coverage"]
    assert _evidence_left(cluster, [job]) == []


# -- the soak (make soak) --------------------------------------------------------------------------


@pytest.mark.skipif(os.environ.get("SATTR_SOAK") != "1", reason="long: run with `make soak`")
def test_soak_many_jobs_with_lock_accounting_stop_and_full_spool(cluster, scene):
    """N jobs (SATTR_SOAK_JOBS, default 200) ending together while the database is locked for 30 s,
    slurmdbd is stopped for 60 s and the spool is full: 0 lost verdicts, 0 wrong drains, 0 missed drains."""
    n = int(os.environ.get("SATTR_SOAK_JOBS", "200"))
    pid = int((cluster.base / "run" / "slurmdbd.pid").read_text().split()[0])
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sqlite3, sys, time\n"
         "c = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=30)\n"
         "c.execute('BEGIN EXCLUSIVE'); print('locked', flush=True); time.sleep(30); c.execute('COMMIT')\n",
         str(cluster.db_path)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "locked"
    os.kill(pid, signal.SIGSTOP)
    t_stop = time.time()
    resume = threading.Timer(60.0, os.kill, (pid, signal.SIGCONT))  # slurmdbd back after 60 s
    resume.start()
    try:
        with spool_fault(cluster, "full"):
            jobs = [cluster.sbatch(f"#!/bin/bash\n#SBATCH -N1 -w {PLAIN_NODES[i % 3]} --oversubscribe\n"
                                   f"sleep 1\nexit {i % 2}\n", user="sattrtest") for i in range(n)]
            fj, nodes_of, fatal, poller, running_at = _run_jobs_with_fatal(cluster, scene, plain=0)
            jobs += fj
            _check_epilogs_and_drain(cluster, fj, nodes_of, fatal, poller, running_at, scene, "soak")
            # This test cluster starts ~12 such jobs a minute (6 CPUs, the scheduler's pace): 200 take long.
            _wait_ended(cluster, jobs, timeout=1500)
        resume.join()
        holder.wait(60)
        cleared = time.time()  # lock over, accounting back, spool unmounted
        got = _wait_verdicts(cluster, jobs, timeout=900, retry_every=30)
    finally:
        resume.cancel()
        os.kill(pid, signal.SIGCONT)
        if holder.poll() is None:
            holder.wait(60)
    last = max(t for _, t in got.values())
    print(f"FIGURE soak: {len(got)}/{len(jobs)} verdicts; last {last - cleared:.1f}s after every fault had cleared "
          f"({time.time() - t_stop:.0f}s since the faults began)")
    assert len(got) == len(jobs)
    plain = [j for j in jobs if j not in fj]
    assert all(got[j][0]["cause"] == "none" for i, j in enumerate(plain) if i % 2 == 0)
    assert got[fatal][0]["cause"] == "gpu_hardware"
    drained = [node for node in NODES if _ours(cluster.node_state(node)[1])]
    assert drained == [FATAL_NODE], f"wrong or missed drains: {drained}"
