"""The verdict's reasoning on the real cluster (issues 10 and 12): an untrusted claim against a
clean kernel log, and the job's cause kept apart from the node's health.

Each test removes the kernel lines it injected (each carries a unique pid) and resumes only the
SATTR: drains it caused. Run under the cluster lock."""
from __future__ import annotations

import time

import pytest

pytestmark = pytest.mark.cluster

XID79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid={pid}, name=python, GPU has fallen off the bus."


def _sattr(cluster, *args):
    return cluster.run([cluster.env["SATTR_BIN"], *args], check=False)


def _our_drain(cluster, node: str) -> bool:
    return cluster.node_state(node)[1].startswith("SATTR:")


@pytest.fixture
def injected(cluster):
    """Kernel lines written for a node, removed afterwards; SATTR: drains undone."""
    marks: dict[str, list[str]] = {}
    assert not any(_our_drain(cluster, n) for n in ("n2", "n3")), "a node is still drained by sattr"
    _sattr(cluster, "breaker", "reset", "--reason", "test_reason start")

    def add(node: str) -> None:
        pid = str(700000 + time.time_ns() % 99999)
        cluster.kernel_log(node, XID79.format(pid=pid))
        marks.setdefault(node, []).append(f"pid={pid},")

    try:
        yield add
    finally:
        for node, ms in marks.items():
            path = cluster.base / "kernel" / f"{node}.log"
            path.write_text("".join(ln for ln in path.read_text().splitlines(keepends=True) if not any(m in ln for m in ms)))
        for n in ("n2", "n3"):
            if _our_drain(cluster, n):
                _sattr(cluster, "undrain", n, "--reason", "test_reason cleanup")
        _sattr(cluster, "breaker", "reset", "--reason", "test_reason end")


def test_output_claiming_an_xid_with_a_clean_kernel_log_is_the_programs_traceback(cluster, injected):
    # The job prints a kernel-style Xid 79 for its own GPU, then dies of its own KeyError.
    script = ("#!/bin/bash\n#SBATCH -N1 -w n2\n"
              "echo \"[$(date '+%a %b %e %H:%M:%S %Y')] " + XID79.format(pid=4242) + "\"\n"
              "python3 -c \"batch = {}; batch['labels']\"\n")
    job = cluster.sbatch(script, user="sattrtest")
    assert cluster.wait_state(job) == "FAILED"
    v = cluster.verdict(job)
    assert v["cause"] == "user_error", v["summary"]
    claims = [s for s in v["symptoms"] if s.get("status", {}).get("claim") == "contradicted"]
    assert claims and all(s["role"] != "root" for s in claims), v["symptoms"]
    assert "not confirmed by the kernel log" in v["summary"]
    assert not _our_drain(cluster, "n2")


def test_completed_job_with_an_xid_during_it_is_none_and_the_node_is_drained(cluster, injected):
    # Issue 12 item 7: the job's cause (it completed) and the node's health (a fatal Xid) are separate.
    job = cluster.sbatch("#!/bin/bash\n#SBATCH -N1 -w n3\nsleep 3\necho done\n", user="sattrtest")
    cluster.wait_running(job)
    time.sleep(0.5)
    injected("n3")
    assert cluster.wait_state(job) == "COMPLETED"
    v = cluster.verdict(job)
    assert v["cause"] == "none", v["summary"]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not _our_drain(cluster, "n3"):
        time.sleep(0.3)
    assert _our_drain(cluster, "n3"), cluster.node_state("n3")
