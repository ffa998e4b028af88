"""Claims, not flags (issue 22 items 1-2): the reasoning's decisions live in a symptom's typed
``status``, apart from its rule's captures, and a claim confirmed by trusted evidence takes that
evidence's node, so the trusted event is the root that drains."""
from __future__ import annotations

from slurm_attr.model import Coverage, Evidence, Status, Symptom
from slurm_attr.verdict import decide

JOB = {"job_id": "7401", "nodes": ["n6", "n7"], "state": "FAILED", "exit_code": 1,
       "start_time": "2026-12-01T10:00:00+00:00", "end_time": "2026-12-01T10:20:00+00:00"}
CLEAN = [Coverage("kernel", "n6", "ok", "journalctl -k"), Coverage("kernel", "n7", "ok", "journalctl -k"),
         Coverage("stdout", None, "ok", "")]
XID74 = ("2026-12-01T10:11:20+00:00 n7 kernel: NVRM: Xid (PCI:0000:b9:00): 74, pid=4242, name=python, "
         "NVLink: fatal error detected on link 6(0x100, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0)")


def claim(rank: int = 19, time: str | None = "2026-12-01T10:09:40") -> Symptom:
    """rank 19's output: the job's own word for an NVLink fault, a minute and a half before the kernel's"""
    return Symptom(id="cuda.nvlink_error", cause="nvlink", role="root", priority=70, rank=rank, time=time,
                   summary="the job hit an NVLink error",
                   evidence=[Evidence("stderr", "output/stderr", 5, "[rank19]: RuntimeError: CUDA error: "
                                                                   "uncorrectable NVLink error detected")])


def xid(node: str = "n7", text: str = XID74, time: str = "2026-12-01T10:11:20") -> Symptom:
    return Symptom(id="gpu.xid_74", cause="nvlink", role="root", priority=95, trusted=True, node=node, gpu="0000:b9:00",
                   time=time, action="drain", summary="Xid 74 on GPU 0000:b9:00: NVLink error",
                   evidence=[Evidence("kernel", f"nodes/{node}/kernel.log", 1, text)])


def test_a_confirmed_claim_takes_the_kernels_node_and_the_trusted_event_drains():
    v = decide(JOB, [claim(), xid()], CLEAN)
    assert (v.cause, v.culprit_nodes, v.culprit_ranks) == ("nvlink", ["n7"], [19])
    root = v.root()
    assert root is not None and root.id == "gpu.xid_74" and root.trusted and root.action == "drain"
    c = next(s for s in v.symptoms if s.id == "cuda.nvlink_error")
    assert c.role == "confirmation" and c.node == "n7"
    assert (c.status.claim, c.status.confirmed_by) == ("confirmed", ["gpu.xid_74 on n7"])
    assert "claim" not in c.fields  # the rule's namespace holds captures only


def test_near_miss_an_unconfirmed_claim_names_no_node_and_drains_nothing():
    v = decide(JOB, [claim()], CLEAN)  # both kernel logs read, neither holds the event
    c = v.symptoms[0]
    assert c.status.claim == "contradicted" and c.node is None and c.role != "root"
    assert v.cause != "nvlink" and not v.culprit_nodes


def test_near_miss_events_on_two_nodes_leave_the_claims_subject_open():
    v = decide(JOB, [claim(), xid("n6", XID74.replace(" n7 ", " n6 ")), xid()], CLEAN)
    c = next(s for s in v.symptoms if s.id == "cuda.nvlink_error")
    assert c.status.claim == "confirmed" and c.node is None
    assert v.cause == "nvlink" and set(v.culprit_nodes) == {"n6", "n7"}


def test_a_connections_errors_with_a_hardware_fault_at_one_end_are_explained_by_it():
    """NCCL errors between n6 and n7 while n7's kernel log holds the Xid: not "both ends clean"."""
    net = Symptom(id="nccl.remote_error", cause="network", role="root", priority=60, node="n6",
                  fields={"peer_node": "n7"}, summary="NCCL: remote process exited or there was a network error",
                  evidence=[Evidence("stderr", "output/stderr", 9, "n6:1:2 [0] NCCL WARN NET/IB : Got completion "
                                                                   "from peer 10.0.0.7<4321> with error 12")])
    v = decide(JOB, [net, xid()], CLEAN)
    n = next(s for s in v.symptoms if s.id == "nccl.remote_error")
    assert n.status.claim == "confirmed" and n.status.confirmed_by == ["gpu.xid_74 on n7"]
    assert not n.status.kernel_clean and n.role == "cascade"
    assert v.cause == "nvlink" and v.culprit_nodes == ["n7"]
    # near miss: both ends clean, the path claim stays unconfirmed and says so
    v = decide(JOB, [net], CLEAN)
    n = next(s for s in v.symptoms if s.id == "nccl.remote_error")
    assert n.status.claim == "unconfirmed" and n.status.kernel_clean


def test_a_stored_verdict_from_before_keeps_its_reasoning():
    """Verdicts stored before the status existed kept the reasoning among the fields."""
    old = {"id": "cuda.nvlink_error", "cause": "nvlink", "fields": {"claim": "contradicted", "claim_note": "x",
                                                                    "unconfirmed": True, "peer": "10.0.0.7"}}
    s = Symptom.from_dict(old)
    assert s.status == Status(claim="contradicted", claim_note="x") and s.fields == {"peer": "10.0.0.7"}
    assert Symptom.from_dict(s.to_dict()) == s
