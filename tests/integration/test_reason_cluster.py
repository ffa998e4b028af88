"""The verdict's reasoning on the real cluster (issues 10 and 12): an untrusted claim against a
clean kernel log, and the job's cause kept apart from the node's health.

Each test removes the kernel lines it injected (each carries a unique pid) and resumes only the
SATTR: drains it caused. Run under the cluster lock."""
from __future__ import annotations

import time

import pytest

pytestmark = pytest.mark.cluster

XID79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid={pid}, name=python, GPU has fallen off the bus."


def test_output_claiming_an_xid_with_a_clean_kernel_log_is_the_programs_traceback(cluster, kernel_lines):
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
    assert not cluster.ours("n2")


def test_completed_job_with_an_xid_during_it_is_none_and_the_node_is_drained(cluster, kernel_lines):
    # Issue 12 item 7: the job's cause (it completed) and the node's health (a fatal Xid) are separate.
    job = cluster.sbatch("#!/bin/bash\n#SBATCH -N1 -w n3\nsleep 3\necho done\n", user="sattrtest")
    cluster.wait_running(job)
    time.sleep(0.5)
    kernel_lines.add("n3", XID79)
    assert cluster.wait_state(job) == "COMPLETED"
    v = cluster.verdict(job)
    assert v["cause"] == "none", v["summary"]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not cluster.ours("n3"):
        time.sleep(0.3)
    assert cluster.ours("n3"), cluster.node_state("n3")
