"""The node Prolog's gate on the real cluster (issue 24 item 4): a GPU that failed while its node
was idle drains the node before the next job lands on it; that job is requeued and runs elsewhere.

The job is not pinned with ``-w`` (a pinned job could only wait for the drained node): the test
asks Slurm where a plain one-node job would start now (``sbatch --test-only``), writes the Xid
into that node's kernel log, and submits the same job. Slurm delays a requeued batch job by its
credential lifetime (~121 s, research/slurm.md §3), so the first test takes about two minutes.
Run under the cluster's lock (no other suite's job can take the node in between).
"""
from __future__ import annotations

import json
import random
import re
import statistics
import time

import pytest

pytestmark = pytest.mark.cluster

NODES = ["n1", "n2", "n3", "n4"]
FATAL = "NVRM: Xid (PCI:0000:3b:00): 79, pid={pid}, name=python, GPU has fallen off the bus."
# A program's Xid on a GPU of its own each run: the same Xid 13 on one GPU across three jobs is a
# recurrence the central analysis drains for (rulebook/gpu_recurrence.py), not what this tests.
NONFATAL = ("NVRM: Xid (PCI:0000:{bus:02x}:00): 13, pid={{pid}}, name=python, Graphics SM Warp Exception on "
            "(GPC 0, TPC 0, SM 0): Out Of Range Address")


def _next_node(cluster) -> str:
    """The node Slurm would give a plain one-node job now."""
    cluster.wait_idle(NODES)
    proc = cluster.run(["sbatch", "--test-only", "-N1", "--wrap", "true"], check=False)
    m = re.search(r" on nodes (\S+)", proc.stdout + proc.stderr)
    assert m and m.group(1) in NODES, proc.stdout + proc.stderr
    return m.group(1)


def _prolog_runs(cluster, job: str, timeout: float = 60) -> dict[str, tuple[float, str]]:
    """{node: (seconds, exit code)} of this job's Prolog runs, from the wrappers' timing log."""
    log = cluster.base / "log" / "prolog-times.log"
    deadline = time.monotonic() + timeout
    out: dict[str, tuple[float, str]] = {}
    while time.monotonic() < deadline:
        for ln in log.read_text().splitlines() if log.exists() else []:
            parts = ln.split()
            if len(parts) == 5 and parts[0] == job:
                out[parts[1]] = (float(parts[3]) - float(parts[2]), parts[4])
        if out:
            return out
        time.sleep(0.2)
    return out


def _attempts(cluster, job: str) -> list[tuple[str, str]]:
    """(state, node list) of each of the job's attempts, oldest first (sacct -D)."""
    out = cluster.run(["sacct", "-n", "-P", "-X", "-D", "-j", job, "-o", "State,NodeList"], check=False).stdout
    return [tuple(ln.split("|", 1)) for ln in out.splitlines() if "|" in ln]


def _ledger_owner(cluster, node: str, needle: str) -> str | None:
    """Who the node's ledger says owns the kernel line holding ``needle``."""
    from slurm_attr.collect.kernel import line_key

    path = cluster.base / "nodes" / node / "state" / f"attributed.{node}.json"
    line = next(ln for ln in (cluster.base / "kernel" / f"{node}.log").read_text().splitlines() if needle in ln)
    entry = json.loads(path.read_text())["lines"].get(line_key(node, line)) if path.exists() else None
    return entry[0] if entry else None


def _wait_reason(cluster, node: str, timeout: float = 60) -> tuple[str, str]:
    deadline = time.monotonic() + timeout
    state, reason = cluster.node_state(node)
    while time.monotonic() < deadline and not reason.startswith("SATTR:"):
        time.sleep(0.2)
        state, reason = cluster.node_state(node)
    return state, reason


def test_gpu_failed_while_idle_drains_before_the_job_which_runs_elsewhere(cluster, kernel_lines):
    node = _next_node(cluster)
    written = kernel_lines.add(node, FATAL)
    pid = re.search(r"pid=(\d+),", written).group(1)
    job = cluster.sbatch("#!/bin/bash\n#SBATCH -N1\nhostname\n", user="sattrtest")

    state, reason = _wait_reason(cluster, node)
    assert "drain" in state and reason == f"SATTR: gpu_hardware xid79 gpu3b:00 idle before job {job}", (state, reason)
    runs = _prolog_runs(cluster, job)
    assert runs[node][1] == "1", runs  # the deliberate failure: Slurm requeues the job, keeps our reason
    assert _ledger_owner(cluster, node, f"pid={pid},") == f"prolog:{job}"

    final = cluster.wait_state(job, timeout=400)
    attempts = _attempts(cluster, job)
    print(f"\nprolog gate: job {job} -> {node} drained ({reason}); attempts {attempts}; "
          f"gate on {node} took {runs[node][0] * 1000:.0f} ms")
    assert final == "COMPLETED", attempts
    v = cluster.verdict(job)  # the central analysis has decided too: it must not add a drain
    assert not [a for a in v["actions"] if a["applied"] and a["node"] != node], v["actions"]
    assert attempts[0] == ("REQUEUED", node) and attempts[-1][1] not in ("", node), attempts
    assert cluster.node_state(node)[1] == reason  # still ours, as the gate set it
    assert not any(cluster.ours(n) for n in NODES if n != node)
    assert _gate_decisions(cluster, job) == [(node, True, None)]


def test_xid_an_epilog_already_attributed_does_not_drain_the_next_job(cluster, kernel_lines):
    node = _next_node(cluster)
    gate = cluster.gate()
    first = cluster.sbatch(f"#!/bin/bash\n#SBATCH -N1 -w {node} --exclusive\n{gate.wait}\nexit 1\n", user="sattrtest")
    cluster.wait_running(first)
    written = kernel_lines.add(node, FATAL)
    pid = re.search(r"pid=(\d+),", written).group(1)
    gate.open()
    state, reason = _wait_reason(cluster, node)
    assert reason.endswith(f"job {first}"), (state, reason)  # the epilog's fast path, for its job
    cluster.wait_state(first)
    cluster.verdict(first)  # the central analysis has decided too (it would drain a resumed node again)
    assert _ledger_owner(cluster, node, f"pid={pid},") == first
    # An admin repaired the GPU and resumed the node; its kernel log still holds the Xid. Without
    # its last-read mark the gate reads the last hour, the Xid included: the ledger must stop it.
    assert cluster.sattr("undrain", node, "--reason", "gate test: repaired").returncode == 0
    (cluster.base / "nodes" / node / "state" / f"lastread.{node}").unlink(missing_ok=True)
    cluster.wait_idle([node])

    second = cluster.sbatch(f"#!/bin/bash\n#SBATCH -N1 -w {node}\ntrue\n", user="sattrtest")
    assert cluster.wait_state(second) == "COMPLETED"
    assert not [a for a in cluster.verdict(second)["actions"] if a["applied"]]
    runs = _prolog_runs(cluster, second)
    assert runs.get(node, (0, "?"))[1] == "0", runs
    assert not cluster.ours(node), cluster.node_state(node)
    assert _ledger_owner(cluster, node, f"pid={pid},") == first


def _gate_decisions(cluster, job: str) -> list[tuple[str, bool, str | None]]:
    """(node, applied, blocked_by) of the gate's decisions for job in `sattr drains`, after the
    timer's `sattr retry` took the nodes' records from the spool into the store."""
    cluster.sattr("retry", check=True)
    rows = json.loads(cluster.sattr("drains", "--since", "1h", "--json", check=True).stdout)["decisions"]
    return [(r["node"], r["applied"], r["blocked_by"]) for r in rows if r["path"] == "gate" and r["job_id"] == job]


def test_a_held_back_gate_decision_reaches_the_store(cluster, kernel_lines):
    """Dry-run: the gate drains nothing and the job runs where it landed, but the drain it held
    back is in `sattr drains` (the node's record through the spool), not only in that node's
    syslog. Near miss beside it: the deliberate drain of the first test is recorded as applied."""
    node = _next_node(cluster)
    kernel_lines.add(node, FATAL)
    with cluster.settings(drain=dict(dry_run=True)):
        job = cluster.sbatch("#!/bin/bash\n#SBATCH -N1\ntrue\n", user="sattrtest")
        assert cluster.wait_state(job) == "COMPLETED"
        decisions = _gate_decisions(cluster, job)
        # The job's analysis must conclude under the same dry-run: it drains a node whose kernel
        # log shows Xid 79 ("separately, ... the node needs attention"), and a worker that
        # re-reads the restored settings first carries that drain out (seen on 24.11: the next
        # test found n1 drained by sattr).
        v = cluster.verdict(job)
    assert decisions == [(node, False, "dry-run")], decisions
    assert not [a for a in v["actions"] if a["applied"]], v["actions"]
    assert [a[1] for a in _attempts(cluster, job)] == [node] and not cluster.ours(node)


def test_non_fatal_xid_while_idle_does_not_drain(cluster, kernel_lines):
    node = _next_node(cluster)
    kernel_lines.add(node, NONFATAL.format(bus=random.randrange(0x10, 0xf0)))
    job = cluster.sbatch("#!/bin/bash\n#SBATCH -N1\ntrue\n", user="sattrtest")
    assert cluster.wait_state(job) == "COMPLETED"
    runs = _prolog_runs(cluster, job)
    assert runs.get(node, (0, "?"))[1] == "0", runs
    assert [a[1] for a in _attempts(cluster, job)] == [node]  # ran where it landed, once
    v = cluster.verdict(job)  # the central analysis too has decided before the node is looked at
    assert not [a for a in v["actions"] if a["applied"]], v["actions"]
    assert not cluster.ours(node), cluster.node_state(node)


def test_ordinary_job_start_cost_of_the_prolog(cluster):
    """Not timed as an assertion: prints what the Prolog cost ordinary job starts."""
    cluster.wait_idle(NODES)
    jobs = []
    for _ in range(10):  # one after the other: an ordinary start, not eight Prologs on two cores
        jobs.append(cluster.sbatch("#!/bin/bash\n#SBATCH -N1\ntrue\n", user="sattrtest"))
        assert cluster.wait_state(jobs[-1]) == "COMPLETED"
    ms = []
    for job in jobs:
        runs = _prolog_runs(cluster, job)
        assert runs and all(rc == "0" for _, rc in runs.values()), runs
        ms += [sec * 1000 for sec, _ in runs.values()]
    ms.sort()
    print(f"\nprolog (wrapper + gate) per ordinary job start: p50 {statistics.median(ms):.0f} ms, "
          f"max {ms[-1]:.0f} ms over {len(ms)} starts, one at a time (goal <= 100 ms)")
