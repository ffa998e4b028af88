"""Whole incidents: bundles with noisy multi-node kernel logs and interleaved rank output,
through analyze() and decide(), checked by cause, culprit and roles."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from slurm_attr.bundle import Bundle
from slurm_attr.config import Config
from slurm_attr.rules import analyze
from slurm_attr.rules.jobwide import before_verdict
from slurm_attr.verdict import decide

BUNDLES = Path(__file__).resolve().parents[1] / "fixtures" / "bundles"
NOISE = "\n".join([
    "[Thu May  2 09:00:01 2024] IPv6: ADDRCONF(NETDEV_CHANGE): ib0: link becomes ready",
    "[Thu May  2 09:00:02 2024] mlx5_core 0000:18:00.0 mlx5_0: Port: 1 Link ACTIVE",
    "[Thu May  2 09:10:40 2024] audit: type=1400 audit(1714641040.112:213): apparmor=\"DENIED\" operation=\"open\"",
    "[Thu May  2 09:11:00 2024] nfs: server nfs01.cluster OK",
]) + "\n"


def verdict_of(path):
    b = Bundle(str(path))
    symptoms, coverage = analyze(b, Config())
    return decide(b.job, before_verdict(symptoms, b.job), coverage)  # as analysis.run_bundle does


def roles(v, sid):
    return {s.role for s in v.symptoms if s.id == sid}


def make(tmp_path, job, kernel=None, stdout=None, drop_nodes=()):
    root = tmp_path / "bundle"
    root.mkdir()
    (root / "job.json").write_text(json.dumps(job))
    for node in job.get("nodes", []):
        if node in drop_nodes:
            continue
        (root / "nodes" / node).mkdir(parents=True)
        (root / "nodes" / node / "kernel.log").write_text(NOISE + (kernel or {}).get(node, ""))
        (root / "nodes" / node / "collect.json").write_text('{"sources": {"kernel": {"status": "ok"}}}')
    if stdout is not None:
        (root / "output").mkdir()
        (root / "output" / "stdout").write_text(stdout)
    return root


def job(state="FAILED", exit_code=1, signal=0, n=2, per=4):
    nodes = [f"n{i + 1}" for i in range(n)]
    return {"job_id": "777", "nodes": nodes, "state": state, "exit_code": exit_code, "signal": signal,
            "ranks": {str(r): nodes[r // per] for r in range(n * per)}, "end_time": "2024-05-02T10:20:00"}


def test_verdict_bundle_xid79_on_one_node_of_four():
    v = verdict_of(BUNDLES / "xid79_cascade")
    assert v.cause == "gpu_hardware"
    assert v.culprit_nodes == ["gpu-003"] and v.culprit_gpus == ["0000:3b:00"] and v.culprit_ranks == [17]
    assert roles(v, "gpu.xid_79") == {"root"} and roles(v, "gpu.xid_45") == {"cascade"}
    assert roles(v, "torch.watchdog_timeout") == {"cascade"} and roles(v, "nccl.remote_error") == {"cascade"}
    assert {s.node for s in v.symptoms if s.id == "torch.watchdog_timeout"} == {"gpu-001", "gpu-002", "gpu-004"}
    roots = [s for s in v.symptoms if s.role == "root"]
    assert all(s.node == "gpu-003" and s.trusted for s in roots)
    assert {s.action for s in roots} == {"reboot"}
    assert all(s.action == "none" for s in v.symptoms if not s.trusted)
    assert not v.ambiguous


def test_verdict_bundle_ib_link_flap():
    v = verdict_of(BUNDLES / "ib_link_flap")
    assert v.cause == "network" and v.domain == "network"
    assert v.culprit_nodes == ["gpu-012"]
    assert roles(v, "net.ib_link_down") == {"root"} and roles(v, "nccl.ib_completion_error") == {"confirmation"}
    assert all(s.action == "none" for s in v.symptoms)  # a network verdict never drains


def test_verdict_bundle_slurm_oom_confirmed_by_the_kernel():
    v = verdict_of(BUNDLES / "oom_slurm")
    assert v.cause == "host_oom" and v.culprit_nodes == ["cpu-002"] and v.culprit_ranks == [5]
    assert roles(v, "host.oom_kill") == {"confirmation"} and roles(v, "slurm.task_oom") == {"root"}
    assert roles(v, "slurm.cancelled") == {"cascade"} and roles(v, "nccl.remote_error") == {"cascade"}


def test_verdict_bundle_is_the_same_when_copied_anywhere(tmp_path):
    copy = tmp_path / "elsewhere"
    shutil.copytree(BUNDLES / "xid79_cascade", copy)
    assert verdict_of(copy).to_dict()["culprit"] == verdict_of(BUNDLES / "xid79_cascade").to_dict()["culprit"]


def test_verdict_bundle_time_limit_with_teardown_noise(tmp_path):
    out = "\n".join([
        "0: [rank0]: step 9000 | loss 1.2",
        "slurmstepd: error: *** JOB 777 ON n1 CANCELLED AT 2024-05-02T10:00:01 DUE TO TIME LIMIT ***",
        "0: W0502 10:00:02.1 140234 torch/distributed/elastic/multiprocessing/api.py:897] Sending process 101 closing signal SIGTERM",
        "0: torch.distributed.elastic.multiprocessing.api.SignalException: Process 100 got signal: 15",
        "3: [rank3]: RuntimeError: DataLoader worker (pid(s) 4411) exited unexpectedly",
        "srun: error: n1: tasks 0-3: Terminated", "srun: error: n2: tasks 4-7: Terminated"]) + "\n"
    v = verdict_of(make(tmp_path, job("TIMEOUT", 0, 15), stdout=out))
    assert v.cause == "time_limit" and v.culprit_nodes == [] and not v.ambiguous
    assert roles(v, "slurm.task_killed") == {"cascade"} and roles(v, "torch.teardown") == {"cascade"}


def test_verdict_bundle_xid13_then_109_with_illegal_access(tmp_path):
    kernel = {"n2": "[Thu May  2 10:00:01 2024] NVRM: Xid (PCI:0000:5e:00): 13, pid=4242, name=python, Graphics SM Warp Exception on (GPC 4, TPC 1, SM 0): Out Of Range Address\n"
                    "[Thu May  2 10:00:06 2024] NVRM: Xid (PCI:0000:5e:00): 109, pid=4242, name=python, Ch 00000008, errorString CTX SWITCH TIMEOUT, Info 0x1c001\n"}
    out = "5: [rank5]: RuntimeError: CUDA error: an illegal memory access was encountered\n" + \
          "".join(f"{r}: [rank{r}]: torch.distributed.DistBackendError: NCCL error in: x.cpp:1, remote process exited or there was a network error, NCCL version 2.19.3\n" for r in (0, 1, 2, 3))
    v = verdict_of(make(tmp_path, job(), kernel=kernel, stdout=out))
    assert v.cause == "user_error"
    assert roles(v, "gpu.xid_109") == {"cascade"} and roles(v, "gpu.xid_13") == {"root"}
    assert "n2" in v.culprit_nodes and v.culprit_gpus == ["0000:5e:00"] and 5 in v.culprit_ranks
    assert all(s.action == "none" for s in v.symptoms)


def test_verdict_bundle_container_failed_to_start(tmp_path):
    out = "\n".join([
        "0: slurmstepd: error: pyxis: printing enroot log file:",
        "0: slurmstepd: error: pyxis:     [ERROR] /etc/enroot/hooks.d/98-nvidia.sh exited with return code 1",
        "0: slurmstepd: error: pyxis: couldn't start container",
        "0: slurmstepd: error: spank: required plugin spank_pyxis.so: task_init() failed with rc=-1",
        "0: slurmstepd: error: Failed to invoke spank plugin stack",
        "srun: error: n1: task 0: Exited with exit code 1"]) + "\n"
    v = verdict_of(make(tmp_path, job(), stdout=out))
    assert v.cause == "launch_failure" and v.domain == "infrastructure"
    assert roles(v, "slurm.task_exit") == {"cascade"}
    assert all(s.action == "none" for s in v.symptoms)


def test_verdict_bundle_bare_kill_is_not_called_an_oom(tmp_path):
    out = "\n".join([
        "/var/spool/slurmd/job777/slurm_script: line 22: 443552 Killed                  python main.py",
        "3: [rank3]: RuntimeError: DataLoader worker (pid 48213) is killed by signal: Killed. ",
        "srun: error: n1: task 3: Killed"]) + "\n"
    v = verdict_of(make(tmp_path, job("FAILED", 0, 9), stdout=out))
    assert v.cause != "host_oom"
    assert v.cause == "unknown" and any(a["cause"] == "host_oom" for a in v.alternatives)


def test_verdict_bundle_successful_job_with_survived_errors(tmp_path):
    out = "\n".join([
        "[rank2]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 2 has a total capacity of 79.11 GiB",
        "[rank2]: INFO retrying the step with micro-batch 4",
        "slurmstepd: error: Exceeded job memory limit at some point.",
        "[rank0]: training finished"]) + "\n"
    v = verdict_of(make(tmp_path, job("COMPLETED", 0, 0), stdout=out))
    assert v.cause == "none"
    assert roles(v, "slurm.memory_warning") == {"context"}


def test_verdict_bundle_watchdog_only_hang(tmp_path):
    out = "".join(f"{r}: [rank{r}]:[E502 10:10:03.1 ProcessGroupNCCL.cpp:616] [Rank {r}] Watchdog caught collective operation timeout: "
                  f"WorkNCCL(SeqNum=77, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600009 milliseconds before timing out.\n"
                  for r in range(8))
    v = verdict_of(make(tmp_path, job(), stdout=out))
    assert v.cause == "comm_hang" and v.ambiguous and v.culprit_nodes == []
    assert v.cause not in ("gpu_hardware", "nvlink", "host_hardware")


def test_verdict_bundle_node_failure_names_the_silent_node(tmp_path):
    out = "srun: error: Node failure on n2\n" + "0: [rank0]: torch.distributed.DistBackendError: NCCL error in: x.cpp:1, remote process exited or there was a network error, NCCL version 2.19.3\n"
    v = verdict_of(make(tmp_path, job("NODE_FAIL", 0, 9), stdout=out, drop_nodes=("n2",)))
    assert v.cause == "node_failure" and v.culprit_nodes == ["n2"]
    assert any(c.node == "n2" and c.status == "missing" for c in v.coverage)


def test_verdict_bundle_one_rank_raises_the_others_follow(tmp_path):
    out = "\n".join([
        "0: [rank0]: step 10 | loss 2.0", "6: [rank6]: step 10 | loss 2.0",
        "6: [rank6]: Traceback (most recent call last):",
        "6: [rank6]:   File \"/home/alice/train.py\", line 212, in main",
        "6: [rank6]: KeyError: 'labels'",
        "0: [rank0]: torch.distributed.DistBackendError: NCCL error in: x.cpp:1, remote process exited or there was a network error, NCCL version 2.19.3",
        "1: [rank1]: torch.distributed.DistBackendError: NCCL error in: x.cpp:1, remote process exited or there was a network error, NCCL version 2.19.3",
        "srun: error: n2: task 6: Exited with exit code 1", "srun: error: n1: tasks 0-3: Terminated"]) + "\n"
    v = verdict_of(make(tmp_path, job(), stdout=out))
    assert v.cause == "user_error" and v.culprit_ranks == [6] and v.culprit_nodes == ["n2"]
    assert roles(v, "python.exception") == {"root"} and roles(v, "nccl.remote_error") == {"cascade"}


@pytest.mark.parametrize("state,cause", [("TIMEOUT", "time_limit"), ("PREEMPTED", "preempted"),
                                         ("CANCELLED by 1000", "cancelled"), ("OUT_OF_MEMORY", "host_oom"),
                                         ("NODE_FAIL", "node_failure"), ("COMPLETED", "none")])
def test_verdict_bundle_job_state_alone(tmp_path, state, cause):
    v = verdict_of(make(tmp_path, job(state, 0, 0), stdout=""))
    assert v.cause == cause


def test_verdict_bundle_failed_exit_1_alone_is_the_program(tmp_path):
    v = verdict_of(make(tmp_path, job("FAILED", 1, 0), stdout="training...\n"))
    assert v.cause == "user_error" and v.domain == "user"


def test_verdict_bundle_failed_exit_1_with_the_evidence_missing_is_unknown(tmp_path):
    # Issue 12 item 8: without the output and the nodes' parts, a non-zero exit says nothing of why.
    v = verdict_of(make(tmp_path, job("FAILED", 1, 0), drop_nodes=("n1", "n2")))
    assert v.cause == "unknown" and v.domain == "unknown"
    assert "on its own" not in v.summary and "no evidence" in v.summary


def test_verdict_bundle_failed_exit_1_with_an_empty_but_collected_output_is_the_program(tmp_path):
    # Near-miss of the above: `exit 3` prints nothing, and nothing is missing either.
    v = verdict_of(make(tmp_path, job("FAILED", 3, 0), stdout=""))
    assert v.cause == "user_error"
