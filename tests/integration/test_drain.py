"""Drains on the real cluster: the epilog fast path, etiquette, undrain, the breaker, dry-run, trust, privacy.

Each test leaves the cluster as it found it: it resumes only the SATTR: drains it
caused (and the admin drain it set itself), resets the breaker, restores the
config, and removes the kernel lines it injected as soon as its own jobs'
epilogs have collected them. Fatal jobs run --exclusive so no other job ends on
that node while the injected line is in its kernel source.
"""
from __future__ import annotations

import json
import threading
import time

import pytest

from kernel_inject import KernelLines

pytestmark = pytest.mark.cluster

NODES = ["n1", "n2", "n3", "n4"]
FATAL = "NVRM: Xid (PCI:0000:3b:00): 79, pid={pid}, name=python, GPU has fallen off the bus."


# -- helpers -------------------------------------------------------------------------------


class StatePoller(threading.Thread):
    """sinfo every 100 ms for one node: (monotonic time, state, reason) samples."""

    def __init__(self, cluster, node: str, interval: float = 0.1):
        super().__init__(daemon=True)
        self.cluster, self.node, self.interval = cluster, node, interval
        self.samples: list[tuple[float, str, str]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            t = time.monotonic()
            try:
                state, reason = self.cluster.node_state(self.node)
            except Exception:  # noqa: BLE001 - a failed sample is just missing
                state, reason = "?", ""
            self.samples.append((t, state, reason))
            self.stop.wait(max(0.0, self.interval - (time.monotonic() - t)))


def sattr(cluster, *args, user=None):
    """The installed `sattr` (the venv the hooks use, readable by every user), as root or a user."""
    return cluster.run([cluster.env.get("SATTR_BIN", "sattr"), *args], user=user, check=False)


def _sattr_json(cluster, *args):
    proc = sattr(cluster, *args, "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _job_decisions(cluster, jobs):
    data = _sattr_json(cluster, "drains", "--since", "1h")
    return [d for d in data["decisions"] if d["job_id"] in set(jobs)]


def _wait_collected(cluster, job: str, node: str, timeout: float = 60) -> None:
    path = cluster.bundle(job) / "nodes" / node / "collect.json"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            return
        time.sleep(0.1)
    raise AssertionError(f"{node} never collected job {job}")


def _epilog_ends(cluster, job: str) -> dict[str, tuple[float, float, str]]:
    out = {}
    log = cluster.base / "log" / "epilog-times.log"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for ln in log.read_text().splitlines() if log.exists() else []:
            parts = ln.split()
            if len(parts) == 5 and parts[0] == job:
                out[parts[1]] = (float(parts[2]), float(parts[3]), parts[4])
        if out:
            return out
        time.sleep(0.2)
    return out


def _held_job(cluster, node: str, gate) -> str:
    """A job on `node` alone that runs until `gate` opens, then exits 1."""
    return cluster.sbatch(f"#!/bin/bash\n#SBATCH -N1 -w {node} --exclusive\n{gate.wait}\nsleep 0.5\nexit 1\n",
                          user="sattrtest")


def _fatal_job(cluster, lines: KernelLines, node: str) -> str:
    """A job on `node` alone whose kernel log gets a fatal Xid while it runs; returns its id."""
    gate = cluster.gate()
    job = _held_job(cluster, node, gate)
    cluster.wait_running(job)
    lines.add(node, FATAL)
    gate.open()
    return job


def _wait_comment(cluster, job: str, timeout: float = 60) -> str:
    # Case-insensitive: sacctmgr (22.05) stores the modified comment in lower case.
    deadline = time.monotonic() + timeout
    c = ""
    while time.monotonic() < deadline:
        c = cluster.sacct(job, "Comment%400").get("Comment", "")
        if "sattr1:" in c.lower():
            return c
        time.sleep(0.5)
    raise AssertionError(f"job {job}: no verdict in its Comment after {timeout}s: {c!r}")


def _ours(reason: str) -> bool:
    return reason.startswith("SATTR:")


@pytest.fixture
def clean(cluster):
    """Breaker reset before and after; our drains resumed and injected lines removed afterwards."""
    lines = KernelLines(cluster)
    _wait_no_sattr_drains(cluster)
    assert sattr(cluster, "breaker", "reset", "--reason", "integration test start").returncode == 0
    try:
        yield lines
    finally:
        lines.remove()
        for n in NODES:
            state, reason = cluster.node_state(n)
            if _ours(reason):
                sattr(cluster, "undrain", n, "--reason", "integration test cleanup")
        sattr(cluster, "breaker", "reset", "--reason", "integration test end")
        _wait_no_sattr_drains(cluster)


def _wait_no_sattr_drains(cluster, timeout: float = 60) -> None:
    # Not wait_idle: other suites may be running jobs on the cluster at the same time.
    deadline = time.monotonic() + timeout
    left = []
    while time.monotonic() < deadline:
        left = [n for n in NODES if _ours(cluster.node_state(n)[1])]
        if not left:
            return
        time.sleep(0.2)
    raise AssertionError(f"nodes still drained by sattr: {left}")


# -- the fast path -----------------------------------------------------------------------------


def test_fatal_xid_drains_node_before_its_epilog_ends_never_idle(cluster, clean):
    with cluster.settings(drain=dict(max_partition_percent=50.0)):  # robust to another suite's drain meanwhile
        _fast_path_scenario(cluster, clean)


def _fast_path_scenario(cluster, clean):
    gate = cluster.gate()
    job = _held_job(cluster, "n2", gate)
    cluster.wait_running(job)
    poller = StatePoller(cluster, "n2")
    poller.start()
    clean.add("n2", FATAL)
    gate.open()
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not any("drain" in s for _, s, _ in poller.samples):
            time.sleep(0.1)
        time.sleep(0.5)
    finally:
        poller.stop.set()
        poller.join()
    _wait_collected(cluster, job, "n2")
    clean.remove("n2")

    samples = poller.samples
    drain_at = next((i for i, (_, s, _) in enumerate(samples) if "drain" in s), None)
    assert drain_at is not None, f"n2 never showed DRAIN: {samples[-5:]}"
    # The job's end: the first sample where the node is no longer running it.
    end_at = next(i for i, (_, s, _) in enumerate(samples) if s not in ("allocated", "mixed"))
    between = [s for _, s, _ in samples[end_at:drain_at + 1]]
    assert "idle" not in between, f"n2 was IDLE between the job's end and DRAIN: {between}"
    assert all(s != "idle" for _, s, _ in samples[drain_at:]), "n2 went idle after the drain"
    latency = samples[drain_at][0] - samples[end_at][0]
    print(f"\nfast path: job {job} end -> n2 DRAIN in sinfo after {latency * 1000:.0f} ms "
          f"(sequence {list(dict.fromkeys(s for _, s, _ in samples))}); never idle in between")
    (cluster.base / "log" / "drain-latency.log").open("a").write(
        f"{job} n2 end_to_drain_ms={latency * 1000:.0f} states={'>'.join(dict.fromkeys(s for _, s, _ in samples))}\n")

    state, reason = cluster.node_state("n2")
    assert "drain" in state
    assert reason.startswith("SATTR: gpu_hardware xid79") and reason.endswith(f"job {job}"), reason
    sinfo_r = cluster.run(["sinfo", "-R", "-h", "-o", "%N|%E"]).stdout
    assert f"n2|{reason}" in sinfo_r
    # The epilog drained its node itself, and still exited 0.
    ends = _epilog_ends(cluster, job)
    assert ends["n2"][2] == "0", ends
    # Every other node is untouched by us.
    for n in ("n1", "n3", "n4"):
        assert not _ours(cluster.node_state(n)[1])

    v = cluster.verdict(job)
    assert v["cause"] == "gpu_hardware" and "n2" in v["culprit"]["nodes"], v
    n2_actions = [a for a in v["actions"] if a["node"] == "n2"]
    assert len(n2_actions) == 1 and n2_actions[0]["blocked_by"] == "already drained", v["actions"]
    decisions = _job_decisions(cluster, [job])
    fast = [d for d in decisions if d["path"] == "fast"]
    assert [(d["node"], d["applied"]) for d in fast] == [("n2", True)], decisions
    assert len([d for d in decisions if d["applied"]]) == 1  # drained once, not twice
    # The person-readable view says what happened and what to do next.
    out = sattr(cluster, job).stdout
    assert "n2 drained" in out and "sattr undrain n2" in out


def test_admin_drained_node_stays_exactly_as_it_was(cluster, clean):
    gate = cluster.gate()
    job = _held_job(cluster, "n3", gate)
    cluster.wait_running(job)
    admin_reason = "admin: bad fan, ticket 4711"
    cluster.run(["scontrol", "update", "NodeName=n3", "State=DRAIN", f"Reason={admin_reason}"])
    try:
        clean.add("n3", FATAL)
        gate.open()
        v = cluster.verdict(job)
        _wait_collected(cluster, job, "n3")
        clean.remove("n3")
        state, reason = cluster.node_state("n3")
        assert "drain" in state and reason == admin_reason
        detail = cluster.run(["scontrol", "-o", "show", "node", "n3"]).stdout
        assert f"Reason={admin_reason} [root@" in detail
        blocked = [a["blocked_by"] for a in v["actions"] if a["node"] == "n3"]
        assert blocked == [f"not our drain: {admin_reason}"], v["actions"]
        fast = [d for d in _job_decisions(cluster, [job]) if d["path"] == "fast"]
        assert [d["blocked_by"] for d in fast] == [f"not our drain: {admin_reason}"]
        # sattr refuses to resume someone else's drain, and says why.
        proc = sattr(cluster, "undrain", "n3", "--reason", "trying")
        assert proc.returncode != 0
        assert "drained by someone else" in proc.stderr + proc.stdout
        assert cluster.node_state("n3") == (state, admin_reason)
    finally:
        cluster.run(["scontrol", "update", "NodeName=n3", "State=RESUME"], check=False)


def test_undrain_resumes_only_our_nodes_and_records_who_and_why(cluster, clean):
    ours = "SATTR: gpu_hardware xid79 gpu3b:00 job 1"
    cluster.run(["scontrol", "update", "NodeName=n1", "State=DRAIN", f"Reason={ours}"])
    cluster.run(["scontrol", "update", "NodeName=n4", "State=DRAIN", "Reason=admin: firmware update"])
    try:
        proc = sattr(cluster, "undrain", "n1", "n4", "--reason", "dcgmi diag -r 3 passed")
        assert proc.returncode != 0
        assert "n1 resumed" in proc.stdout + proc.stderr and "n4 refused" in proc.stdout + proc.stderr
        deadline = time.monotonic() + 30
        while "drain" in cluster.node_state("n1")[0] and time.monotonic() < deadline:
            time.sleep(0.2)
        assert "drain" not in cluster.node_state("n1")[0]
        state4, reason4 = cluster.node_state("n4")
        assert "drain" in state4 and reason4 == "admin: firmware update"
        undrains = [d for d in _sattr_json(cluster, "drains", "--since", "10m")["decisions"] if d["event"] == "undrain"]
        mine = [d for d in undrains if d["reason"] == "dcgmi diag -r 3 passed"]
        assert {(d["node"], d["applied"], d["actor"]) for d in mine} == {("n1", True, "root"), ("n4", False, "root")}
    finally:
        cluster.run(["scontrol", "update", "NodeName=n4", "State=RESUME"], check=False)
        cluster.run(["scontrol", "update", "NodeName=n1", "State=RESUME"], check=False)


# -- the breaker and dry-run ---------------------------------------------------------------------


def test_cap_two_five_hardware_verdicts_two_drains_three_blocked(cluster, clean):
    with cluster.settings(drain=dict(max_drains=2, window_s=3600, max_partition_percent=100.0)):
        # Four at once (their epilogs race for the breaker), then a fifth on a node left idle.
        gate = cluster.gate()  # all four end together, after each got its Xid
        jobs = [_held_job(cluster, n, gate) for n in NODES]
        for job, n in zip(jobs, NODES):
            cluster.wait_running(job)
            clean.add(n, FATAL)
        gate.open()
        for job, n in zip(jobs, NODES):
            cluster.verdict(job)
            _wait_collected(cluster, job, n)
            clean.remove(n)
        idle = [n for n in NODES if "drain" not in cluster.node_state(n)[0]]
        assert len(idle) == 2, [cluster.node_state(n) for n in NODES]
        jobs.append(_fatal_job(cluster, clean, idle[0]))
        cluster.verdict(jobs[-1])
        _wait_collected(cluster, jobs[-1], idle[0])
        clean.remove(idle[0])

        drained = [n for n in NODES if _ours(cluster.node_state(n)[1])]
        assert len(drained) == 2
        decisions = _job_decisions(cluster, jobs)
        per_job = {j: [d for d in decisions if d["job_id"] == j] for j in jobs}
        applied = [j for j, ds in per_job.items() if any(d["applied"] for d in ds)]
        blocked = [j for j, ds in per_job.items() if ds and all(d["blocked_by"] == "circuit breaker" for d in ds)]
        assert len(applied) == 2 and len(blocked) == 3, per_job
        for j in jobs:
            assert cluster.verdict(j)["cause"] == "gpu_hardware"
        text = sattr(cluster, "drains", "--since", "1h").stdout
        assert "TRIPPED" in text and "blocked: circuit breaker" in text
        st = _sattr_json(cluster, "breaker", "status")
        assert st["tripped"] is True and "max 2" in st["why"]


def test_dry_run_drains_nothing_and_records_everything(cluster, clean):
    with cluster.settings(drain=dict(dry_run=True)):
        gate = cluster.gate()
        job = _held_job(cluster, "n2", gate)
        cluster.wait_running(job)
        poller = StatePoller(cluster, "n2", interval=0.2)
        poller.start()
        clean.add("n2", FATAL)
        gate.open()
        try:
            v = cluster.verdict(job)
            _wait_collected(cluster, job, "n2")
        finally:
            poller.stop.set()
            poller.join()
        clean.remove("n2")
        assert not any("drain" in s for _, s, _ in poller.samples)
        assert not _ours(cluster.node_state("n2")[1])
        assert v["cause"] == "gpu_hardware"
        assert [(a["node"], a["applied"], a["blocked_by"]) for a in v["actions"]] == [("n2", False, "dry-run")]
        decisions = _job_decisions(cluster, [job])
        assert {d["path"] for d in decisions} == {"fast", "central"}
        assert all(not d["applied"] and d["blocked_by"] == "dry-run" for d in decisions)


# -- trust and privacy ---------------------------------------------------------------------------


def test_fatal_xid_only_in_job_stdout_drains_nothing(cluster, clean):
    line = FATAL.format(pid=4242)
    job = cluster.sbatch(f"#!/bin/bash\n#SBATCH -N1 -w n4\necho '{line}'\nexit 1\n", user="sattrtest")
    cluster.wait_state(job)
    v = cluster.verdict(job)
    assert not any(a["applied"] for a in v["actions"]), v["actions"]
    assert not _ours(cluster.node_state("n4")[1])
    assert not [d for d in _job_decisions(cluster, [job]) if d["applied"]]
    # The line is in the evidence, marked untrusted: it may point, never drain.
    ev = [s for s in v["symptoms"] if any(e["source"] == "stdout" for e in s["evidence"])]
    assert all(not s["trusted"] and s["action"] == "none" for s in ev)


def test_other_user_cannot_read_the_verdict(cluster):
    job = cluster.sbatch("#!/bin/bash\n#SBATCH -N1\necho 'ValueError: bad learning rate' >&2\nexit 3\n",
                         user="sattrtest")
    cluster.wait_state(job)
    cause = cluster.verdict(job)["cause"]
    _wait_comment(cluster, job)
    other = sattr(cluster, job, user="sattrother")
    assert other.returncode == 5, (other.stdout, other.stderr)
    assert "belongs to another user" in other.stderr
    assert cause not in other.stdout
    # The owner reads the root-written copy of the verdict (never the free-text Comment).
    owner = sattr(cluster, job, user="sattrtest")
    assert owner.returncode == 0, owner.stderr
    assert f"Verdict: {cause}" in owner.stdout and f"Job {job}" in owner.stdout
    # Operators' commands say clearly that they are for admins.
    denied = sattr(cluster, "drains", user="sattrother")
    assert denied.returncode == 5 and "for admins" in denied.stderr
