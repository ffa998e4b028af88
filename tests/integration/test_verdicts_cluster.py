"""Issue 22 on the real cluster: verdicts whose evidence comes from Slurm and the kernel source.

- a job's own word for an NVLink fault, confirmed by a fatal Xid 74 in its node's kernel log
  a minute and a half later, is `nvlink` on that node, and the node is drained (the trusted line
  is the root; before, the claim won by time and named a rank and no node);
- a job cancelled before the network errors its teardown prints is `cancelled`;
- a loss that became NaN, the program stopping on it, is the program's own failure; on one rank
  alone it is suspected silent data corruption beside that verdict, and again on the same GPU in
  a second job the verdict (never a drain);
- one node on another NVIDIA driver than the rest, where the job failed at launch, is the cause
  and drained (kernel evidence of both); under a job that completes it is only said beside;
- a GPU fault on one node that the kernel's clock puts seconds before the program's ValueError on
  another is not its cause (it cannot reach there but as communication errors): user_error, and
  the faulty node still drained; near miss: the CUDA error on the faulty node itself.

Each has its near miss. Kernel lines are removed afterwards and SATTR: drains undone
(conftest's kernel_lines). Run under the cluster lock.
"""
from __future__ import annotations

import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.cluster

USER = "sattrtest"
XID74 = ("NVRM: Xid (PCI:0000:b9:00): 74, pid={pid}, name=python, NVLink: fatal error detected on link 6"
         "(0x100, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0)")


def _sattr(cluster, *args):
    return cluster.run([cluster.env["SATTR_BIN"], *args], check=False)


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


def test_a_claim_the_kernel_confirms_is_the_kernels_event_on_its_node_and_drains(cluster, kernel_lines):
    gate = cluster.gate()
    job = _claim_job(cluster, gate.wait)
    cluster.wait_running(job)
    kernel_lines.add("n3", XID74)  # the kernel's word for it, after the job's own
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
    assert cluster.ours("n3") and "xid74" in cluster.node_state("n3")[1], cluster.node_state("n3")
    assert any("gpu.xid_74 on n3" in r for r in v["reasoning"]), v["reasoning"]
    assert "Why:" in _sattr(cluster, job, "--why").stdout


def test_near_miss_the_same_claim_with_a_clean_kernel_log_drains_nothing(cluster, kernel_lines):
    gate = cluster.gate()
    job = _claim_job(cluster, gate.wait)
    gate.open()
    assert cluster.wait_state(job) == "FAILED"
    v = cluster.verdict(job)
    claim = next(s for s in v["symptoms"] if s["id"] == "cuda.nvlink_error")
    assert claim["status"]["claim"] == "contradicted" and claim["role"] != "root"
    assert v["cause"] != "nvlink" and not [a for a in v["actions"] if a["kind"] == "drain"]
    assert not cluster.ours("n3")


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


def _one_rank_nan_job(cluster, bus: int, bad_rank: int) -> str:
    """Four ranks on n1 and n2 (two each); every rank prints NCCL's init line (its GPU's busId),
    then ``bad_rank`` alone stops on a NaN loss while the others finish their step."""
    script = f"""#!/bin/bash
#SBATCH -N2 -n4 --ntasks-per-node=2 -w n1,n2
srun -l bash -c '
r=$SLURM_PROCID
echo "$(hostname -s):4242:4300 [$SLURM_LOCALID] NCCL INFO comm 0x55d2a8c0 rank $r nranks 4 cudaDev $SLURM_LOCALID busId $(printf %x $(( {bus} + r )))000 commId 0x3fa1 - Init COMPLETE"
if [ "$r" = {bad_rank} ]; then echo "Loss is nan, stopping training"; exit 1; fi
sleep 1'
"""
    return cluster.sbatch(script, user=USER)


def _unused_bus(cluster) -> int:
    """A PCI bus whose four GPU addresses (ranks 0..3) no stored verdict names: a bus drawn at
    random met an earlier run's GPU about once in 25 runs, and that GPU's history made the first
    job a recurrence."""
    import sqlite3

    con = sqlite3.connect(f"file:{cluster.db_path}?mode=ro", uri=True, timeout=5)
    try:
        stored = "\n".join(r[0] for r in con.execute("select verdict_json from verdicts"))
    finally:
        con.close()
    start = time.time_ns() % 0xc0
    for i in range(0xc0):
        bus = 0x20 + (start + i) % 0xc0
        if bus + 3 <= 0xff and not any(f"0000:{bus + k:02x}:00" in stored for k in range(4)):
            return bus
    pytest.fail("every GPU address of the test's range is in the store's history")


def test_nan_on_one_rank_alone_is_suspected_corruption_and_again_on_its_gpu_the_verdict(cluster):
    bus = _unused_bus(cluster)  # a GPU address of this run's own: the store keeps other runs' (30 days)
    first = _one_rank_nan_job(cluster, bus, bad_rank=2)
    assert cluster.wait_state(first) == "FAILED"
    v = cluster.verdict(first)
    assert v["cause"] == "user_error" and v["culprit"]["ranks"] == [2], v["summary"]
    gpu = f"0000:{bus + 2:02x}:00"
    sdc = [a for a in v["alternatives"] if a["cause"] == "gpu_hardware"]
    assert sdc and "suspected silent data corruption" in sdc[0]["why"] and gpu in sdc[0]["why"], v["alternatives"]
    # the same on the same GPU in a second job: the verdict, and still no drain
    second = _one_rank_nan_job(cluster, bus, bad_rank=2)
    assert cluster.wait_state(second) == "FAILED"
    v2 = cluster.verdict(second)
    assert (v2["cause"], v2["culprit"]["gpus"]) == ("gpu_hardware", [gpu]), v2["summary"]
    assert "2 jobs" in v2["summary"] and not [a for a in v2["actions"] if a["kind"] == "drain"], v2["actions"]
    assert not any(cluster.node_state(n)[1].startswith("SATTR:") for n in ("n1", "n2"))
    # near miss: rank 0 alone (where programs check for every rank) on a third run: no suspicion
    third = _one_rank_nan_job(cluster, bus, bad_rank=0)
    assert cluster.wait_state(third) == "FAILED"
    v3 = cluster.verdict(third)
    assert v3["cause"] == "user_error" and not any(a["cause"] == "gpu_hardware" for a in v3["alternatives"]), v3


MISMATCH = ("NVRM: API mismatch: the client has the version 535.161.08, but",
            "NVRM: this kernel module has the version 550.54.15.  Please make sure that this kernel module and all "
            "NVIDIA driver components have the same version.")


@pytest.fixture
def n4_on_another_driver(cluster, kernel_lines):
    """Each pretend node's /proc/driver/nvidia/version: n4 on 550.54.15, the others on 535.161.08;
    removed afterwards (kernel_lines removes the kernel lines and undoes any SATTR: drain)."""
    files = []
    for n in ("n1", "n2", "n3", "n4"):
        f = cluster.base / "nodes" / n / "nvidia-version"
        f.write_text(f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {'550.54.15' if n == 'n4' else '535.161.08'}  "
                     "Tue Mar  5 22:42:15 UTC 2024\nGCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n")
        files.append(f)
    try:
        with cluster.settings(collect={"driver_version_file": str(cluster.base / "nodes" / "%n" / "nvidia-version")}):
            yield kernel_lines
    finally:
        for f in files:
            f.unlink(missing_ok=True)


def test_one_node_on_another_driver_where_the_job_failed_at_launch_is_drained(cluster, n4_on_another_driver):
    # near miss first: the same skew under a job that completes is said beside its verdict, no drain
    ok = cluster.sbatch("#!/bin/bash\n#SBATCH -N4 -w n1,n2,n3,n4\nsrun true\n", user=USER)
    assert cluster.wait_state(ok) == "COMPLETED"
    v = cluster.verdict(ok)
    assert v["cause"] == "none" and not [a for a in v["actions"] if a["kind"] == "drain"], v
    assert any("n4 runs NVIDIA driver 550.54.15" in a["why"] for a in v["alternatives"]), v["alternatives"]
    assert not cluster.ours("n4")
    # the kernel module on n4 refuses the user-space driver the job brings: the job fails there
    gate = cluster.gate()
    job = cluster.sbatch(f"#!/bin/bash\n#SBATCH -N4 -w n1,n2,n3,n4\necho starting\n{gate.wait}\n"
                         "echo 'RuntimeError: Found no NVIDIA driver on your system.'\nexit 1\n", user=USER)
    cluster.wait_running(job)
    for line in MISMATCH:
        n4_on_another_driver.add("n4", line)
    gate.open()
    assert cluster.wait_state(job) == "FAILED"
    v = cluster.verdict(job)
    assert (v["cause"], v["culprit"]["nodes"]) == ("launch_failure", ["n4"]), v["summary"]
    skew = next(s for s in v["symptoms"] if s["id"] == "infra.version_skew")
    assert skew["role"] == "root" and skew["trusted"] and "535.161.08" in skew["summary"], skew
    n4 = [a for a in v["actions"] if a["node"] == "n4" and a["kind"] == "drain"]
    assert n4 and n4[0]["applied"], v["actions"]
    assert cluster.ours("n4") and cluster.node_state("n4")[0].startswith("drain"), cluster.node_state("n4")


@pytest.mark.torch  # real torchrun: the versions stage's roots have no torch wheel
def test_the_failure_after_torchruns_restart_decides_the_one_before_it_was_survived(cluster):
    """Real torchrun (--max-restarts 1): a CUDA OOM on local rank 1, the restart, then the program's
    ValueError on local rank 0 ends the job. At torchrun's default log level the restart line is
    not printed: the agent's report of the first failure, a pid its final summary does not name,
    says it (torch.restart_inferred); with LOGLEVEL=INFO the agent says so itself. Near miss: no
    restart allowed, the OOM ends it."""
    import sys
    from pathlib import Path

    job_py = Path(__file__).resolve().parents[2] / "cluster" / "jobs" / "elastic_restart.py"
    script = ("#!/bin/bash\n#SBATCH -N1 -t 3\n{env}"
              f"{sys.executable} -m torch.distributed.run --standalone --nproc_per_node=2 --max-restarts={{n}} {job_py}\n")
    for env, marker in (("", "torch.restart_inferred"), ("export LOGLEVEL=INFO\n", "torch.elastic_restart")):
        job = cluster.sbatch(script.format(env=env, n=1))
        assert cluster.wait_state(job) == "FAILED"
        v = cluster.verdict(job)
        assert v["cause"] == "user_error" and "ValueError" in v["summary"], (env, v["summary"])
        oom = [s for s in v["symptoms"] if s["cause"] == "cuda_oom"]
        assert oom and all(s["role"] == "context" and "lived through" in (s.get("status") or {}).get("earlier", "")
                           for s in oom), (env, oom)
        assert any(s["id"] == marker for s in v["symptoms"]), (env, [s["id"] for s in v["symptoms"]])
    near = cluster.sbatch(script.format(env="", n=0))
    assert cluster.wait_state(near) == "FAILED"
    v = cluster.verdict(near)
    assert v["cause"] == "cuda_oom" and not any(s["id"].startswith("torch.restart") for s in v["symptoms"]), v["summary"]


XID79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid={pid}, name=python, GPU has fallen off the bus."


def _own_failure_job(cluster, gate, task: int, exc: str) -> str:
    """Two tasks on n1 and n2 (srun --label); each says it runs, task ``task`` waits for the
    gate, prints a timed log line and the traceback ``exc`` and exits 1; the other sleeps until
    srun ends it."""
    body = (f'echo running; if [ "$SLURM_PROCID" = {task} ]; then {gate.wait}; '
            f'echo "$(date "+%Y-%m-%d %H:%M:%S,%3N") ERROR step 1201: batch failed"; '
            f'echo "Traceback (most recent call last):"; echo "  File \\"/home/u/train.py\\", line 88, in <module>"; '
            f'echo "{exc}"; sleep 1; exit 1; else sleep 300; fi')
    return cluster.sbatch(f"#!/bin/bash\n#SBATCH -N2 -w n1,n2 --exclusive\nsrun -l --kill-on-bad-exit=1 bash -c '{body}'\n", user=USER)


def _both_tasks_run(cluster, job: str, gate) -> None:
    """Until both tasks run: n2's Prolog (its gate reads the kernel log) runs when srun starts
    the step there, after the batch host's; an Xid written before it would rightly stop the job
    from starting there."""
    cluster.wait_running(job)
    out = Path(cluster.workdir(USER)) / f"slurm-{job}.out"
    deadline = time.monotonic() + 120
    while not all(f"{t}: running" in (out.read_text() if out.exists() else "") for t in (0, 1)):
        assert time.monotonic() < deadline, f"job {job}: its tasks did not both start"
        time.sleep(0.1)


def _beside_an_xid_on_n2(cluster, kernel_lines, task: int, exc: str) -> dict:
    """The job of ``_own_failure_job``; once both tasks run, n2's kernel log gets an Xid 79 stamped
    five seconds back (within the kernel clocks' margin of the exception that follows); the
    stored verdict."""
    gate = cluster.gate()
    job = _own_failure_job(cluster, gate, task, exc)
    _both_tasks_run(cluster, job, gate)
    time.sleep(8)  # the Xid's stamp, five seconds back, must still fall inside the job's run
    kernel_lines.add("n2", XID79, at=time.time() - 5)
    gate.open()
    assert cluster.wait_state(job) == "FAILED"
    return cluster.verdict(job)


def test_a_gpu_fault_just_before_an_exception_on_another_node_did_not_cause_it_and_drains(cluster, kernel_lines):
    """n2's Xid 79, five seconds before task 0's ValueError on n1: a GPU fault reaches other nodes
    only through the collectives, so the ValueError is the job's own failure (user_error on n1)
    and n2 is drained for its GPU."""
    v = _beside_an_xid_on_n2(cluster, kernel_lines, 0, "ValueError: Expected input batch_size (32) to match target batch_size (16).")
    assert (v["cause"], v["culprit"]["nodes"]) == ("user_error", ["n1"]), v["summary"]
    xid = next(s for s in v["symptoms"] if s["id"] == "gpu.xid_79")
    assert xid["node"] == "n2" and xid["role"] == "context" and xid["status"]["after_first_failure"], xid
    assert any("a fault on another node cannot have caused it" in r for r in v["reasoning"]), v["reasoning"]
    drains = [a for a in v["actions"] if a["kind"] == "drain"]
    assert [a["node"] for a in drains] == ["n2"] and all(a["applied"] or a["blocked_by"] == "already drained" for a in drains)
    assert cluster.ours("n2") and not cluster.ours("n1")


def test_near_miss_a_cuda_error_on_the_faulty_node_itself_is_the_gpus(cluster, kernel_lines):
    """The same Xid, and the failing task is n2's, with the RuntimeError CUDA errors are raised
    as: the GPU's fault (gpu_hardware on n2)."""
    v = _beside_an_xid_on_n2(cluster, kernel_lines, 1, "RuntimeError: CUDA error: unknown error")
    assert (v["cause"], v["culprit"]["nodes"]) == ("gpu_hardware", ["n2"]), v["summary"]
    assert cluster.ours("n2")
