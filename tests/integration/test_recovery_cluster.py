"""The recovery action after a drain, on the real cluster (recovery.py): the driver's Xid 154
"Node Reboot Required" reboots the node through Slurm's RebootProgram (the test cluster's
restarts the pretend node's slurmd) and Slurm resumes it; "GPU Reset Required" runs the site's
reset command with the node and the GPU and keeps the node drained; a storm of them stops at
the breaker. Each test injects Xid 154 on a GPU address no other test uses (recurrence)."""
from __future__ import annotations

import os
import random
import time

import pytest

from kernel_inject import KernelLines

pytestmark = pytest.mark.cluster

NODES = ["n1", "n2", "n3", "n4"]
XID154 = "NVRM: Xid (PCI:0000:{bus}:00): 154, GPU recovery action changed from 0x0 (None) to {to}"
REBOOT = "0x2 (Node Reboot Required)"
RESET = "0x1 (GPU Reset Required)"


def _bus() -> str:
    return f"{random.randint(0x40, 0xfe):02x}"


@pytest.fixture
def clean(cluster):
    lines = KernelLines(cluster)
    assert not any(cluster.ours(n) for n in NODES), "a node is still drained by sattr"
    assert cluster.sattr("breaker", "reset", "--reason", "recovery test start").returncode == 0
    try:
        yield lines
    finally:
        lines.remove()
        for n in NODES:
            if cluster.ours(n):
                cluster.sattr("undrain", n, "--reason", "recovery test cleanup")
        cluster.sattr("breaker", "reset", "--reason", "recovery test end")


def _failing_job_with(cluster, lines: KernelLines, nodes: list[str], line: str) -> str:
    """A job on ``nodes`` that exits 1 after ``line`` was written to each node's kernel log."""
    gate = cluster.gate()
    # A step on every node first: without PrologFlags=Alloc a node runs its Prolog at its first step.
    job = cluster.sbatch(f"#!/bin/bash\n#SBATCH -N{len(nodes)} -w {','.join(nodes)} --exclusive\n"
                         f"srun -N{len(nodes)} true\n{gate.wait}\nsleep 0.5\nexit 1\n", user="sattrtest")
    cluster.wait_running(job)
    _wait_prologs(cluster, job, nodes)
    for n in nodes:
        lines.add(n, line)
    gate.open()
    return job


def _wait_prologs(cluster, job: str, nodes: list[str]) -> None:
    """Until each node's Prolog for ``job`` has ended: a line written before that is an idle
    node's event for the Prolog gate, not the job's (RUNNING in squeue comes before the Prolog)."""
    log = cluster.base / "log" / "prolog-times.log"

    def done() -> bool:
        rows = [r.split() for r in log.read_text().splitlines()] if log.exists() else []
        return {r[1] for r in rows if len(r) == 5 and r[0] == job} >= set(nodes)
    _wait(done, 60, f"job {job}'s Prologs")


def _wait(pred, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(0.3)
    raise AssertionError(f"{what} not seen after {timeout}s")


def _reboots_since(cluster, t0: float, node: str) -> list[str]:
    log = cluster.base / "log" / "reboots.log"
    rows = log.read_text().splitlines() if log.exists() else []
    return [r for r in rows if float(r.split()[0]) >= t0 and f"node={node}" in r]


def test_node_reboot_required_reboots_through_slurm_and_resumes(cluster, clean):
    t0 = time.time()
    with cluster.settings(actions=dict(reboot=True), drain=dict(max_partition_percent=50.0)):
        job = _failing_job_with(cluster, clean, ["n3"], XID154.format(bus=_bus(), to=REBOOT))
        v = cluster.verdict(job)
        assert v["cause"] == "gpu_hardware", v["cause"]
        acts = {(a["kind"], a["node"]): a for a in v["actions"]}
        assert acts[("reboot", "n3")]["applied"], v["actions"]
        # The RebootProgram ran for n3 (the pretend node's slurmd restarted) ...
        calls = _wait(lambda: _reboots_since(cluster, t0, "n3"), 60, "the RebootProgram's call for n3")
        assert any("back: slurmd=" in c for c in _wait(
            lambda: [c for c in _reboots_since(cluster, t0, "n3") if "back" in c], 60, "n3's slurmd back"))
        # ... and Slurm resumed it when it registered again: in service, no reason left.
        state = _wait(lambda: cluster.node_state("n3")[0] == "idle" and cluster.node_state("n3"), 90, "n3 idle")
        assert state[1] in ("", "none"), state
        clean.remove("n3")
        ctld = (cluster.base / "log" / "slurmctld.log").read_text()[-200000:]
        assert "node n3 returned to service" in ctld
        shown = cluster.sattr("show", job).stdout
        assert "reboot requested" in shown, shown
    print(f"\nreboot: job {job}: RebootProgram called {len(calls)}x; n3 back in service "
          f"{time.time() - t0:.1f}s after the test started")


def test_gpu_reset_required_runs_the_reset_command_and_keeps_the_node_drained(cluster, clean, tmp_path):
    record = f"/tmp/sattr-reset-{os.urandom(4).hex()}"
    script = cluster.base / "hooks" / "test-gpu-reset"
    script.write_text(f"#!/bin/sh\necho \"$@\" >> {record}\necho reset ok\n")
    script.chmod(0o755)
    bus = _bus()
    try:
        with cluster.settings(actions=dict(reset_command=f"{script} --node %n --gpu %g"),
                              drain=dict(max_partition_percent=50.0)):
            job = _failing_job_with(cluster, clean, ["n2"], XID154.format(bus=bus, to=RESET))
            v = cluster.verdict(job)
            assert v["cause"] == "gpu_hardware"
            reset = [a for a in v["actions"] if a["kind"] == "reset"]
            assert [(a["node"], a["applied"]) for a in reset] == [("n2", True)], v["actions"]
            assert open(record).read().split() == ["--node", "n2", "--gpu", f"0000:{bus}:00"]
            state, reason = cluster.node_state("n2")
            assert "drain" in state and reason.startswith("SATTR: gpu_hardware xid154"), (state, reason)
            # Near miss: the same job analysed again does not reset the GPU a second time.
            assert cluster.sattr("reanalyze", job).returncode == 0
            assert len(open(record).read().splitlines()) == 1
    finally:
        if os.path.exists(record):
            os.unlink(record)


def test_a_storm_of_reset_requests_stops_at_the_breaker(cluster, clean):
    """Three nodes ask for a GPU reset at once. Within the breaker's budget each is drained and
    reset; past it (max_drains 1) the breaker trips and no reset runs at all: a tripped breaker
    means "something systemic, stop acting" for every action, not only for drains."""
    record = f"/tmp/sattr-reset-{os.urandom(4).hex()}"
    script = cluster.base / "hooks" / "test-gpu-reset"
    script.write_text(f"#!/bin/sh\necho \"$@\" >> {record}\n")
    script.chmod(0o755)
    nodes = ["n1", "n2", "n4"]
    try:
        with cluster.settings(actions=dict(reset_command=f"{script} %n %g"),
                              drain=dict(max_drains=3, window_s=3600, max_partition_percent=100.0)):
            job = _failing_job_with(cluster, clean, nodes, XID154.format(bus=_bus(), to=RESET))
            v = cluster.verdict(job)
            assert sorted(a["node"] for a in v["actions"] if a["kind"] == "reset" and a["applied"]) == nodes
            assert sorted(ln.split()[0] for ln in open(record).read().splitlines()) == nodes
        for n in nodes:
            clean.remove(n)
            cluster.sattr("undrain", n, "--reason", "storm test: first part done")
        assert cluster.sattr("breaker", "reset", "--reason", "storm test: second part").returncode == 0
        os.unlink(record)
        with cluster.settings(actions=dict(reset_command=f"{script} %n %g"),
                              drain=dict(max_drains=1, window_s=3600, max_partition_percent=100.0)):
            job = _failing_job_with(cluster, clean, nodes, XID154.format(bus=_bus(), to=RESET))
            v = cluster.verdict(job)
            resets = [a for a in v["actions"] if a["kind"] == "reset"]
            assert resets and not any(a["applied"] for a in resets), v["actions"]
            assert {a["blocked_by"] for a in resets} == {"circuit breaker"}, v["actions"]
            assert not os.path.exists(record)
            assert sum(cluster.ours(n) for n in NODES) == 1  # the one drain within the budget
            assert cluster.sattr("breaker", "status").stdout.count("TRIPPED") >= 1
    finally:
        if os.path.exists(record):
            os.unlink(record)
