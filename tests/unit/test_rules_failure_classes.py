"""Failure classes the catalog names from real formats (issue 22 item 5), whole bundles through
analyze() and decide(): training divergence is the program's own failure, plain crashes are not
`unknown`, a rank stuck in its own code is named, and context lines stay context."""
from __future__ import annotations

import json

import pytest

from slurm_attr.bundle import Bundle
from slurm_attr.config import Config
from slurm_attr.rules import analyze
from slurm_attr.verdict import decide


def verdict_of(tmp_path, stdout="", kernel=None, state="FAILED", exit_code=1, nodes=("n1", "n2")):
    root = tmp_path / "bundle"
    (root / "output").mkdir(parents=True)
    (root / "output" / "stdout").write_text(stdout)
    ranks = {str(r): nodes[r // 4] for r in range(4 * len(nodes))}
    (root / "job.json").write_text(json.dumps({"job_id": "901", "nodes": list(nodes), "state": state,
                                               "exit_code": exit_code, "ranks": ranks}))
    for n in nodes:
        (root / "nodes" / n).mkdir(parents=True)
        (root / "nodes" / n / "kernel.log").write_text((kernel or {}).get(n, ""))
        (root / "nodes" / n / "collect.json").write_text('{"sources": {"kernel": {"status": "ok"}}}')
    b = Bundle(str(root))
    symptoms, coverage = analyze(b, Config())
    return decide(b.job, symptoms, coverage)


def roles(v, sid):
    return {s.role for s in v.symptoms if s.id == sid}


@pytest.mark.parametrize("line,rank", [
    ("5: [rank5]: AssertionError: Rank 5: found NaN in local grad norm in backward pass before data-parallel "
     "communication collective. Device: 5, node: n2", 5),
    ("2: [rank2]: RuntimeError: Function 'MulBackward0' returned nan values in its 0th output.", 2),
    ("6: [rank6]: RuntimeError: The total norm of order 2.0 for gradients from `parameters` is non-finite, so it "
     "cannot be clipped.", 6),
    ("0: Loss is nan, stopping training", 0),
    ("3: [rank3]: Exception: Current loss scale already at minimum - cannot decrease scale anymore. Exiting run.", 3),
])
def test_training_divergence_is_the_programs_own_failure_on_its_rank(tmp_path, line, rank):
    out = "0: [rank0]: step 1200 | loss 2.31 | grad_norm 0.4\n" + line + "\n" + \
          f"srun: error: {'n1' if rank < 4 else 'n2'}: task {rank}: Exited with exit code 1\n"
    v = verdict_of(tmp_path, out)
    assert v.cause == "user_error"
    assert v.culprit_ranks == [rank]
    assert any(s.id.startswith("train.") and s.role == "root" for s in v.symptoms)


def test_logged_nan_and_skipped_fp16_steps_are_no_failure_of_their_own(tmp_path):
    out = ("[2024-05-02 10:01:11,123] [INFO] [loss_scaler.py:183:update_scale] [deepspeed] OVERFLOW! Rank 0 "
           "Skipping step. Attempted loss scale: 65536, reducing to 32768\n"
           "{'loss': nan, 'grad_norm': nan, 'learning_rate': 1.9e-05, 'epoch': 0.42}\n")
    v = verdict_of(tmp_path, out, state="COMPLETED", exit_code=0)
    assert not any(s.id.startswith("train.") for s in v.symptoms)
    assert v.cause == "none"


@pytest.mark.parametrize("out,sid", [
    ("Traceback (most recent call last):\n  File \"train.py\", line 9, in <module>\n    assert ok\nAssertionError\n",
     "python.exception_bare"),
    ("Segmentation fault (core dumped)\n", "python.crash"),
    ("zsh: segmentation fault (core dumped)  python train.py\n", "python.crash"),
    ("terminate called after throwing an instance of 'std::bad_alloc'\n  what():  std::bad_alloc\n"
     "Aborted (core dumped)\n", "python.cpp_terminate"),
])
def test_plain_failures_are_the_programs_not_unknown(tmp_path, out, sid):
    v = verdict_of(tmp_path, out)
    assert v.cause == "user_error"
    assert roles(v, sid) == {"root"}


def test_watchdog_abort_is_not_taken_for_a_program_crash(tmp_path):
    # old torch: the watchdog's timeout rethrown as std::runtime_error, then SIGABRT
    out = ("1: [rank1]:[E ProcessGroupNCCL.cpp:821] [Rank 1] Watchdog caught collective operation timeout: "
           "WorkNCCL(SeqNum=1234, OpType=ALLREDUCE, Timeout(ms)=1800000) ran for 1800427 milliseconds before timing out.\n"
           "1: terminate called after throwing an instance of 'std::runtime_error'\n"
           "1:   what():  [Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1234, "
           "OpType=ALLREDUCE, Timeout(ms)=1800000) ran for 1800427 milliseconds before timing out.\n"
           "1: Fatal Python error: Aborted\n")
    v = verdict_of(tmp_path, out)
    assert v.cause != "user_error"
    assert not any(s.id in ("python.crash", "python.cpp_terminate") for s in v.symptoms)


def test_rank_stuck_in_its_own_code_while_the_others_time_out_is_named(tmp_path):
    timeout = ("{r}: [rank{r}]:[E0502 10:41:12.123456789 ProcessGroupNCCL.cpp:616] [Rank {r}] Watchdog caught "
               "collective operation timeout: WorkNCCL(SeqNum=4242, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, "
               "Timeout(ms)=1800000) ran for 1800012 milliseconds before timing out.\n")
    out = "".join(timeout.format(r=r) for r in (0, 1, 2, 4, 5, 6, 7)) + (
        "3: Timeout (0:30:00)!\n"
        "3: Thread 0x00007f3d1c8b5740 (most recent call first):\n"
        "3:   File \"/home/alice/train/data.py\", line 88 in _load_shard\n"
        "3:   File \"/home/alice/train/train.py\", line 301 in <module>\n")
    v = verdict_of(tmp_path, out)
    assert v.cause == "rank_stuck" and v.culprit_ranks == [3]
    [dump] = [s for s in v.symptoms if s.id == "python.stack_dump"]
    assert dump.fields["path"] == "/home/alice/train/data.py" and dump.fields["message"] == "_load_shard"
    assert roles(v, "torch.watchdog_timeout") == {"cascade"}


def test_a_recovered_nfs_blip_does_not_take_the_blame(tmp_path):
    kernel = {"n1": "May 02 10:06:01 n1 kernel: nfs: server nfs01.cluster not responding, still trying\n"
                    "May 02 10:06:40 n1 kernel: nfs: server nfs01.cluster OK\n"}
    v = verdict_of(tmp_path, "0: [rank0]: KeyError: 'labels'\n", kernel=kernel)
    assert v.cause == "user_error"
    assert roles(v, "fs.nfs_recovered") == {"context"} and not roles(v, "fs.nfs_not_responding")


def test_versions_and_slowdowns_are_context_never_a_cause_or_a_drain(tmp_path):
    kernel = {
        "n1": "[ 5.1] NVRM: loading NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 01:15:15 UTC 2023\n"
              "[ 9.2] CPU12: Core temperature above threshold, cpu clock throttled (total events = 1234)\n",
        "n2": "[ 5.1] NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:15:33 UTC 2024\n"
              "[ 6.4] mlx5_core 0000:3b:00.0: 63.012 Gb/s available PCIe bandwidth, limited by 16.0 GT/s PCIe x4 link "
              "at 0000:3a:00.0 (capable of 252.048 Gb/s with 16.0 GT/s PCIe x16 link)\n"}
    out = ("n1:1201:1201 [0] NCCL INFO NCCL version 2.18.5+cuda12.2\n"
           "n2:3301:3301 [0] NCCL INFO NCCL version 2.21.5+cuda12.4\n"
           "            HW Power Brake Slowdown           : Active\n"
           "slurmstepd: error: *** JOB 901 ON n1 CANCELLED AT 2024-05-02T12:00:00 DUE TO TIME LIMIT ***\n")
    v = verdict_of(tmp_path, out, kernel=kernel, state="TIMEOUT", exit_code=0)
    assert v.cause == "time_limit"
    ctx = ("gpu.driver_version", "nccl.version", "host.thermal_throttle", "host.pcie_link_degraded",
           "gpu.clocks_slowdown")
    for sid in ctx:
        assert roles(v, sid) == {"context"}, sid
    assert {s.fields["value"] for s in v.symptoms if s.id == "nccl.version"} == {"2.18.5+cuda12.2", "2.21.5+cuda12.4"}
    assert all(a["kind"] != "drain" for a in v.to_dict()["actions"])
