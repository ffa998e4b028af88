"""The recovery action after a drain (recovery.py through drain.apply_policy): Xid 154's own
words and the catalog's action map to a reboot into RESUME or the site's GPU reset command,
only where the site turned them on, at most once per job and node, never past the breaker."""
from __future__ import annotations

import sys

import pytest

from slurm_attr import drain, recovery
from slurm_attr.rules.catalog import load_catalog
from slurm_attr.rules.extract import extract_lines
from slurm_attr.store import Store

from test_drain_fakes import FakeSlurm, drain_cfg, hw_verdict

XID154 = "NVRM: Xid (PCI:0000:3b:00): 154, GPU recovery action changed from 0x0 (None) to {to}"


@pytest.fixture
def store():
    return Store(memory=True)


def _cfg(**actions):
    cfg = drain_cfg()
    for k, v in actions.items():
        setattr(cfg.actions, k, v)
    return cfg


@pytest.mark.parametrize("to,action,recovery_kind", [
    ("0x2 (Node Reboot Required)", "reboot", "reboot"),
    ("0x1 (GPU Reset Required)", "reset", "reset"),
    ("0x4 (Drain and Reset)", "reset", "reset"),
    ("0x3 (Drain P2P)", "drain", ""),
])
def test_xid154_text_decides_the_recovery(to, action, recovery_kind):
    # The driver's own word, read by the catalog's rule, not by a pattern of ours.
    syms = extract_lines(load_catalog(), "kernel", "n2", "nodes/n2/kernel.log", [(1, XID154.format(to=to))])
    assert [s.action for s in syms if s.id == "gpu.xid_154"] == [action]
    cfg = _cfg(reboot=True, reset_command="/bin/true %n %g")
    assert recovery.wanted(cfg, action) == recovery_kind
    # Near miss: the same action with the site's settings off -> drain only.
    assert recovery.wanted(_cfg(), action) == ""


def test_reboot_requested_into_resume_after_the_drain(store):
    slurm = FakeSlurm(reboot_program=True)
    acts = drain.apply_policy(_cfg(reboot=True), hw_verdict(action="reboot"), {}, slurm=slurm, store=store)
    assert [(a.kind, a.applied) for a in acts] == [("drain", True), ("reboot", True)]
    assert [c for c in slurm.calls if c[0] == "reboot"] == [("reboot", "n2", acts[0].reason, "RESUME")]
    rec = store.recoveries("1234")
    assert [(r["node"], r["kind"], r["ok"]) for r in rec] == [("n2", "reboot", 1)]
    # A second analysis of the same job (retry, reanalyze) does not reboot twice.
    again = drain.apply_policy(_cfg(reboot=True), hw_verdict(action="reboot"), {}, slurm=slurm, store=store)
    assert [(a.kind, a.applied, a.blocked_by) for a in again][1] == ("reboot", False, "already done for this job")
    assert len([c for c in slurm.calls if c[0] == "reboot"]) == 1


def test_no_reboot_program_leaves_the_node_drained(store):
    slurm = FakeSlurm(reboot_program=False)
    acts = drain.apply_policy(_cfg(reboot=True), hw_verdict(action="reboot"), {}, slurm=slurm, store=store)
    assert acts[0].applied and slurm.drained() == ["n2"]
    assert not acts[1].applied and "slurm refused" in acts[1].blocked_by


def test_reset_command_gets_node_and_gpu_as_arguments(store, tmp_path):
    out = tmp_path / "called"
    script = tmp_path / "reset.sh"
    script.write_text(f"#!/bin/sh\nprintf '%s|' \"$@\" > {out}\necho reset done\n")
    script.chmod(0o755)
    cfg = _cfg(reset_command=f"{script} --node %n --gpu %g")
    acts = drain.apply_policy(cfg, hw_verdict(action="reset"), {}, slurm=FakeSlurm(), store=store)
    assert [(a.kind, a.applied) for a in acts] == [("drain", True), ("reset", True)]
    assert out.read_text() == "--node|n2|--gpu|0000:3b:00|"
    row = store.recoveries("1234")[0]
    assert row["rc"] == 0 and "reset done" in row["detail"]


def test_failing_or_slow_reset_is_recorded_and_the_node_stays_drained(store, tmp_path):
    slurm = FakeSlurm()
    acts = drain.apply_policy(_cfg(reset_command="/bin/false %n"), hw_verdict(action="reset"), {}, slurm=slurm,
                              store=store)
    assert not acts[1].applied and "rc 1" in acts[1].blocked_by and slurm.drained() == ["n2"]
    rc, text = recovery.run_command([sys.executable, "-c", "import time; time.sleep(30)"], timeout_s=0.5)
    assert rc == -9 and "killed after" in text


def test_gpu_address_cannot_smuggle_arguments():
    args = recovery.argv("reset --gpu %g --why %r", "n2", "0000:3b:00", "SATTR: a b; rm -rf /")
    assert args == ["reset", "--gpu", "0000:3b:00", "--why", "SATTR: a b; rm -rf /"]  # one argument each
    # Not a PCI address: no command at all (an empty GPU argument could mean "every GPU").
    assert recovery.argv("reset --gpu %g", "n2", "0000:3b:00 -a", "r") is None
    assert recovery.argv("reset --gpu %g", "n2", "", "r") is None
    assert recovery.argv("reset-node %n", "n2", "", "r") == ["reset-node", "n2"]  # no %g: none needed


def test_breaker_tripped_blocks_recovery_of_an_already_drained_node(store):
    slurm = FakeSlurm(reboot_program=True)
    slurm.drain("n2", "SATTR: gpu_hardware xid79 gpu3b:00 job 1234")  # the fast path got there first
    store.trip_breaker("storm")
    acts = drain.apply_policy(_cfg(reboot=True), hw_verdict(action="reboot"), {}, slurm=slurm, store=store)
    assert [(a.kind, a.applied, a.blocked_by) for a in acts] == [
        ("drain", False, "already drained"), ("reboot", False, "circuit breaker")]
    assert not [c for c in slurm.calls if c[0] == "reboot"]


def test_fast_path_drain_for_this_job_gets_the_recovery_another_jobs_does_not(store):
    slurm = FakeSlurm(reboot_program=True)
    slurm.drain("n2", "SATTR: gpu_hardware xid79 gpu3b:00 job 1234")
    acts = drain.apply_policy(_cfg(reboot=True), hw_verdict(action="reboot"), {}, slurm=slurm, store=store)
    assert [(a.kind, a.applied) for a in acts] == [("drain", False), ("reboot", True)]
    # Near miss: drained by us, but for another job -> that job's analysis owns the recovery.
    other = FakeSlurm(reboot_program=True)
    other.drain("n2", "SATTR: gpu_hardware xid79 gpu3b:00 job 999")
    acts = drain.apply_policy(_cfg(reboot=True), hw_verdict(action="reboot"), {}, slurm=other, store=Store(memory=True))
    assert [a.kind for a in acts] == ["drain"]


def test_dry_run_and_legacy_drain_reboot_do_no_recovery(store):
    slurm = FakeSlurm(reboot_program=True)
    cfg = _cfg(reboot=True)
    cfg.drain.dry_run = True
    assert [a.kind for a in drain.apply_policy(cfg, hw_verdict(action="reboot"), {}, slurm=slurm, store=store)] == ["drain"]
    legacy = _cfg(reboot=True)
    legacy.drain.reboot = True  # the older key: the drain itself is the reboot (into DOWN)
    acts = drain.apply_policy(legacy, hw_verdict(action="reboot"), {}, slurm=FakeSlurm(reboot_program=True),
                              store=Store(memory=True))
    assert [(a.kind, a.applied) for a in acts] == [("reboot", True)]


def test_restart_the_application_is_no_action():
    # Xid 13 (RESTART_APP bucket): no drain, so nothing to recover either.
    assert recovery.wanted(_cfg(reboot=True, reset_command="x"), "none") == ""
