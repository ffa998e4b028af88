"""drain.undrain: resume only our own drains, one node at a time, judged by re-reading state."""
from __future__ import annotations

from slurm_attr import drain
from slurm_attr.store import Store

from test_drain_fakes import FakeSlurm


def test_undrain_resumes_only_sattr_nodes_and_records_who_and_why():
    slurm, store = FakeSlurm(), Store(memory=True)
    slurm.drain("n1", "SATTR: gpu_hardware xid79 gpu3b:00 job 1234")
    slurm.admin_drain("n2", "bad PSU")
    res = drain.undrain(slurm, store, ["n1", "n2"], "dcgmi diag passed", "alice", settle_s=0)
    assert [(r.node, r.ok) for r in res] == [("n1", True), ("n2", False)]
    assert "drained by someone else (bad PSU)" in res[1].message and "SATTR:" in res[1].message
    assert slurm.state("n1") == "IDLE" and slurm.state("n2") == "IDLE+DRAIN"
    assert slurm.reason("n2").startswith("bad PSU")  # untouched
    # One node at a time: resume was called for n1 only, then its state re-read.
    resumes = [c for c in slurm.calls if c[0] == "resume"]
    assert resumes == [("resume", "n1")]
    i = slurm.calls.index(("resume", "n1"))
    assert slurm.calls[i + 1] == ("show_node", "n1")
    rows = {r["node"]: r for r in store.undrains()}
    assert rows["n1"]["ok"] == 1 and rows["n1"]["actor"] == "alice" and rows["n1"]["why"] == "dcgmi diag passed"
    assert rows["n1"]["job_id"] == "1234" and rows["n1"]["drain_reason"].startswith("SATTR:")
    assert rows["n2"]["ok"] == 0 and rows["n2"]["detail"] == "not our drain"


def test_undrain_down_node_with_our_reason():
    slurm, store = FakeSlurm(), Store(memory=True)
    slurm.set_state("n3", "DOWN+DRAIN+REBOOT_REQUESTED", "SATTR: gpu_hardware xid79 job 5 reboot issued")
    res = drain.undrain(slurm, store, ["n3"], "rebooted, healthy", "root", settle_s=0)
    assert res[0].ok and slurm.state("n3") == "IDLE"


def test_undrain_idle_node_is_a_no_op_not_a_failure():
    slurm, store = FakeSlurm(), Store(memory=True)
    res = drain.undrain(slurm, store, ["n4"], "x", "root", settle_s=0)
    assert res[0].ok and res[0].skipped and "not drained" in res[0].message
    assert not [c for c in slurm.calls if c[0] == "resume"]


def test_undrain_judges_by_state_not_by_exit_code():
    slurm, store = FakeSlurm(), Store(memory=True)
    slurm.drain("n1", "SATTR: x job 1")

    real = slurm.resume

    def resume_then_fail(node):
        real(node)
        from slurm_attr.errors import SlurmError

        raise SlurmError("slurm_update error: Invalid node state specified")  # as a list resume does

    slurm.resume = resume_then_fail
    res = drain.undrain(slurm, store, ["n1"], "ok", "root", settle_s=0)
    assert res[0].ok

    # And a resume that "succeeds" but leaves the node drained is a failure.
    slurm2 = FakeSlurm()
    slurm2.drain("n1", "SATTR: x job 1")
    slurm2.resume = lambda node: None
    res = drain.undrain(slurm2, store, ["n1"], "ok", "root", settle_s=0.05, poll_s=0.01)
    assert not res[0].ok and "did not take" in res[0].message


def test_undrain_unknown_node():
    res = drain.undrain(FakeSlurm(), Store(memory=True), ["zz9"], "x", "root", settle_s=0)
    assert not res[0].ok and "unknown" in res[0].message
