"""Issue 22 on the real cluster: verdicts whose evidence comes from Slurm and the kernel source.

- a job's own word for an NVLink fault, confirmed by a fatal Xid 74 in its node's kernel log
  a minute and a half later, is `nvlink` on that node, and the node is drained (the trusted line
  is the root; before, the claim won by time and named a rank and no node);
- a job cancelled before the network errors its teardown prints is `cancelled`;
- a loss that became NaN, the program stopping on it, is the program's own failure.

Each has its near miss. Kernel lines carry a unique pid and are removed afterwards; SATTR:
drains this file caused are undone. Run under the cluster lock.
"""
from __future__ import annotations

import time

import pytest

pytestmark = pytest.mark.cluster

USER = "sattrtest"
XID74 = ("NVRM: Xid (PCI:0000:b9:00): 74, pid={pid}, name=python, NVLink: fatal error detected on link 6"
         "(0x100, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0)")


def _sattr(cluster, *args):
    return cluster.run([cluster.env["SATTR_BIN"], *args], check=False)


def _ours(cluster, node: str) -> bool:
    return cluster.node_state(node)[1].startswith("SATTR:")


@pytest.fixture
def kernel(cluster):
    """Write kernel lines for a node; removed afterwards, SATTR: drains of n3 undone."""
    marks: dict[str, list[str]] = {}
    assert not _ours(cluster, "n3"), "n3 is still drained by sattr"
    _sattr(cluster, "breaker", "reset", "--reason", "test_verdicts start")

    def add(node: str, template: str) -> None:
        pid = str(600000 + time.time_ns() % 99999)
        cluster.kernel_log(node, template.format(pid=pid))
        marks.setdefault(node, []).append(f"pid={pid},")

    try:
        yield add
    finally:
        for node, ms in marks.items():
            path = cluster.base / "kernel" / f"{node}.log"
            path.write_text("".join(ln for ln in path.read_text().splitlines(keepends=True) if not any(m in ln for m in ms)))
        if _ours(cluster, "n3"):
            _sattr(cluster, "undrain", "n3", "--reason", "test_verdicts cleanup")
        _sattr(cluster, "breaker", "reset", "--reason", "test_verdicts end")


def _claim_job(cluster, gate: str) -> str:
    """n3's rank prints a timed log line stamped 90 s ago and then the NVLink error (the claim),
    waits for the test to write the kernel's line, and fails."""
    script = f"""#!/bin/bash
#SBATCH -N1 -w n3 --exclusive
echo "$(date -d '-90 seconds' '+%Y-%m-%d %H:%M:%S,%3N') INFO step 1200 loss 2.31"
echo "Traceback (most recent call last):"
echo '  File "/home/u/train.py", line 88, in <module>'
echo "RuntimeError: CUDA error: uncorrectable NVLink error detected during the execution"
{gate}
exit 1
"""
    return cluster.sbatch(script, user=USER)


def test_a_claim_the_kernel_confirms_is_the_kernels_event_on_its_node_and_drains(cluster, kernel):
    gate = cluster.gate()
    job = _claim_job(cluster, gate.wait)
    cluster.wait_running(job)
    kernel("n3", XID74)  # the kernel's word for it, after the job's own
    gate.open()
    assert cluster.wait_state(job) == "FAILED"
    v = cluster.verdict(job)
    assert (v["cause"], v["culprit"]["nodes"]) == ("nvlink", ["n3"]), v["summary"]
    root = next(s for s in v["symptoms"] if s["role"] == "root")
    assert root["id"] == "gpu.xid_74" and root["trusted"] and root["node"] == "n3"
    claim = next(s for s in v["symptoms"] if s["id"] == "cuda.nvlink_error")
    assert claim["status"]["claim"] == "confirmed" and claim["node"] == "n3" and claim["role"] == "confirmation"
    # the node's epilog drained it at once on the trusted line (fast path); the verdict agrees
    n3 = [a for a in v["actions"] if a["node"] == "n3"]
    assert n3 and all(a["applied"] or a["blocked_by"] == "already drained" for a in n3), v["actions"]
    assert _ours(cluster, "n3") and "xid74" in cluster.node_state("n3")[1], cluster.node_state("n3")
    assert any("gpu.xid_74 on n3" in r for r in v["reasoning"]), v["reasoning"]
    assert "Why:" in _sattr(cluster, job, "--why").stdout


def test_near_miss_the_same_claim_with_a_clean_kernel_log_drains_nothing(cluster, kernel):
    gate = cluster.gate()
    job = _claim_job(cluster, gate.wait)
    gate.open()
    assert cluster.wait_state(job) == "FAILED"
    v = cluster.verdict(job)
    claim = next(s for s in v["symptoms"] if s["id"] == "cuda.nvlink_error")
    assert claim["status"]["claim"] == "contradicted" and claim["role"] != "root"
    assert v["cause"] != "nvlink" and not [a for a in v["actions"] if a["kind"] == "drain"]
    assert not _ours(cluster, "n3")


def _net_teardown_job(cluster, cancel_first: bool) -> str:
    """Two ranks; on SIGTERM (scancel) rank 0 prints the NCCL IB errors a torn-down peer causes.
    Near miss: the same errors with no cancel, then the program's exit."""
    ib = ("echo \"n1:4242:4300 [0] transport/net_ib.cc:1696 NCCL WARN NET/IB : Got completion from peer "
          "127.0.0.1<45123> with status=12 opcode=0 len=0 vendor err 129 (Recv) localGid ::ffff:127.0.0.1 "
          "remoteGids::ffff:127.0.0.1\"")
    body = (f"trap '{ib}; exit 143' TERM; echo ready; sleep 300 & wait" if cancel_first
            else f"echo ready; sleep 2; {ib}; exit 1")
    return cluster.sbatch(f"#!/bin/bash\n#SBATCH -N1 -w n1\n{body}\n", user=USER)


def test_a_cancel_before_the_link_errors_it_causes_is_cancelled(cluster):
    job = _net_teardown_job(cluster, cancel_first=True)
    cluster.wait_running(job)
    time.sleep(2)
    cluster.run(["scancel", job], user=USER)
    assert cluster.wait_state(job).startswith("CANCELLED")
    v = cluster.verdict(job)
    assert v["cause"] == "cancelled", v["summary"]
    net = [s for s in v["symptoms"] if s["id"] == "nccl.ib_completion_error"]
    assert net and all(s["role"] in ("cascade", "context") for s in net), net
    # near miss: the same errors without a cancel are the job's word for a network fault
    job2 = _net_teardown_job(cluster, cancel_first=False)
    assert cluster.wait_state(job2) == "FAILED"
    assert cluster.verdict(job2)["cause"] == "network"


def test_a_nan_loss_is_the_programs_own_failure(cluster):
    script = """#!/bin/bash
#SBATCH -N1 -w n2
echo "Epoch: [3]  [ 200/1251]  lr: 0.000100  loss: 4.1234 (4.2011)"
echo "Loss is nan, stopping training"
echo "{'loss': nan, 'class_error': 100.0}"
exit 1
"""
    job = cluster.sbatch(script, user=USER)
    assert cluster.wait_state(job) == "FAILED"
    v = cluster.verdict(job)
    assert v["cause"] == "user_error" and v["domain"] == "user", v["summary"]
    assert any(s["id"] == "train.nonfinite_loss" and s["role"] == "root" for s in v["symptoms"]), v["symptoms"]
    # near miss: skipped steps of a loss scaler, and the job completes
    ok = cluster.sbatch("#!/bin/bash\n#SBATCH -N1 -w n2\necho 'OVERFLOW! Rank 0 Skipping step. Attempted loss scale: "
                        "65536, reducing to 32768'\nexit 0\n", user=USER)
    assert cluster.wait_state(ok) == "COMPLETED"
    assert cluster.verdict(ok)["cause"] == "none"
