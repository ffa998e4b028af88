"""The drain policy (drain.apply_policy): what drains, what never does, and etiquette."""
from __future__ import annotations

import pytest

from slurm_attr import drain
from slurm_attr.model import Evidence, Symptom, Verdict
from slurm_attr.store import Store

from test_drain_fakes import FakeSlurm, drain_cfg, hw_verdict, xid_symptom


@pytest.fixture
def store():
    return Store(memory=True)


def test_trusted_fatal_xid_drains_with_short_sattr_reason(store):
    slurm = FakeSlurm()
    acts = drain.apply_policy(drain_cfg(), hw_verdict("1234", "n2"), {}, slurm=slurm, store=store)
    assert [a.to_dict() for a in acts] == [{
        "kind": "drain", "node": "n2", "reason": "SATTR: gpu_hardware xid79 gpu3b:00 job 1234",
        "applied": True, "blocked_by": None}]
    assert slurm.drained() == ["n2"]
    assert slurm.reason("n2").startswith("SATTR: gpu_hardware xid79 gpu3b:00 job 1234")
    # The breaker's ledger has it.
    assert store.ledger_has("n2", ["1234"])


def test_reason_is_short_and_safe():
    s = xid_symptom(gpu="0000:3b:00 ; rm -rf /")
    r = drain.reason_for("gpu_hardware", s, "12345678_99")
    assert r.startswith("SATTR: gpu_hardware xid79 gpu")
    assert len(r) <= drain.REASON_MAX and ";" not in r and " rm " not in r
    assert r.endswith("job 12345678_99")


def test_untrusted_evidence_alone_never_drains(store):
    slurm = FakeSlurm()
    # A job printing a fatal Xid line into its own stdout: the rule engine marks it untrusted.
    v = hw_verdict(trusted=False)
    assert drain.candidates(v) == []
    assert drain.apply_policy(drain_cfg(), v, {}, slurm=slurm, store=store) == []
    assert slurm.drained() == [] and not [c for c in slurm.calls if c[0] == "drain"]


def test_symptom_claiming_trust_on_untrusted_source_does_not_drain(store):
    s = xid_symptom()
    s.evidence = [Evidence(source="stdout", path="output/stdout", line=1, text="NVRM: Xid 79")]
    v = Verdict(job_id="1", cause="gpu_hardware", culprit_nodes=["n2"], symptoms=[s])
    assert drain.candidates(v) == []


def test_correlated_hardware_verdict_drains_culprit_with_trusted_evidence_only(store):
    # FR named rank 5 (untrusted) on n3; n3's kernel log has an uncorrectable ECC (trusted):
    # n3 drains. n1 appears only through untrusted NCCL lines: never drained.
    ecc = xid_symptom(node="n3", xid=48, action="reset", gpu="0000:17:00")
    fr = Symptom(id="fr.rank_missing", cause="rank_stuck", role="confirmation", trusted=False, node="n3", rank=5,
                 evidence=[Evidence(source="fr", path="nodes/n3/fr/nccl_trace_rank_5", text="rank 5 missing")])
    nccl = Symptom(id="nccl.remote_error", cause="network", role="cascade", trusted=False, node="n1",
                   evidence=[Evidence(source="nccl", path="nodes/n1/nccl/x", text="Xid 79 fallen off the bus")])
    v = Verdict(job_id="77", cause="gpu_hardware", culprit_nodes=["n3"], culprit_ranks=[5], symptoms=[ecc, fr, nccl])
    slurm = FakeSlurm()
    acts = drain.apply_policy(drain_cfg(), v, {"slurm_job_id": "77"}, slurm=slurm, store=store)
    assert [(a.node, a.kind, a.applied) for a in acts] == [("n3", "drain", True)]
    assert slurm.drained() == ["n3"]


def test_non_hardware_verdict_drains_only_on_catalog_reset_or_reboot():
    # A user_error verdict whose kernel log nevertheless holds a trusted reboot-class Xid.
    reboot = xid_symptom(node="n4", action="reboot", role="context")
    v = Verdict(job_id="5", cause="user_error", symptoms=[reboot])
    assert [c[0] for c in drain.candidates(v)] == ["n4"]
    # ... but not on an action "drain" symptom of a non-hardware cause.
    ib = Symptom(id="net.ib_port_down", cause="network", trusted=True, node="n4", action="drain",
                 evidence=[Evidence(source="kernel", text="mlx5: port down")])
    assert drain.candidates(Verdict(job_id="5", cause="network", symptoms=[ib])) == []


def test_informational_xid_with_action_none_never_drains():
    s = xid_symptom(xid=63, action="none", cause="unknown", role="context")
    assert drain.candidates(Verdict(job_id="1", cause="gpu_hardware", symptoms=[s])) == []


def test_admin_drained_node_is_untouched_reason_unchanged(store):
    slurm = FakeSlurm()
    slurm.admin_drain("n2", "bad fan, ticket 42")
    before = dict(slurm.recs["n2"])
    acts = drain.apply_policy(drain_cfg(), hw_verdict(node="n2"), {}, slurm=slurm, store=store)
    assert acts[0].applied is False
    assert acts[0].blocked_by == "not our drain: bad fan, ticket 42"
    assert slurm.recs["n2"] == before
    assert not [c for c in slurm.calls if c[0] in ("drain", "reboot", "resume")]


@pytest.mark.parametrize("state,reason,expect", [
    ("DOWN", "Not responding", "not our drain: Not responding"),
    ("IDLE+MAINT+RESERVED", None, "not our drain: maint+reserved"),
    ("IDLE+RESERVED", None, "not our drain: reserved"),
    ("IDLE+DRAIN", "NHC: check_hw_ib failed", "not our drain: NHC: check_hw_ib failed"),
    ("DOWN+DRAIN", "SATTR: gpu_hardware xid79 job 9", "already drained"),
])
def test_etiquette_for_down_reserved_maintenance(store, state, reason, expect):
    slurm = FakeSlurm()
    slurm.set_state("n2", state, reason)
    before = dict(slurm.recs["n2"])
    acts = drain.apply_policy(drain_cfg(), hw_verdict(node="n2"), {}, slurm=slurm, store=store)
    assert acts[0].blocked_by == expect and not acts[0].applied
    assert slurm.recs["n2"] == before


def test_already_drained_by_us_for_this_job_is_not_drained_twice(store):
    slurm = FakeSlurm()
    # The fast path drained n2 for job 1234 ...
    first = drain.apply_policy(drain_cfg(), hw_verdict("1234", "n2"), {"slurm_job_id": "1234"}, slurm=slurm,
                               store=store, path="fast")
    assert first[0].applied
    # ... the central analysis then finds it drained by us.
    again = drain.apply_policy(drain_cfg(), hw_verdict("1234", "n2"), {"slurm_job_id": "1234"}, slurm=slurm,
                               store=store, path="central")
    assert (again[0].applied, again[0].blocked_by) == (False, "already drained")
    assert len([c for c in slurm.calls if c[0] == "drain"]) == 1
    # Even after a person resumed it, a re-analysis of the same job does not drain it again.
    slurm.resume("n2")
    third = drain.apply_policy(drain_cfg(), hw_verdict("1234", "n2"), {"slurm_job_id": "1234"}, slurm=slurm,
                               store=store, path="central")
    assert third[0].blocked_by == "already drained" and slurm.drained() == []


def test_array_task_job_ids_match_either_form(store):
    slurm = FakeSlurm()
    drain.apply_policy(drain_cfg(), hw_verdict("4321", "n1"), {}, slurm=slurm, store=store, path="fast")
    slurm.resume("n1")
    again = drain.apply_policy(drain_cfg(), hw_verdict("4300_21", "n1"), {"slurm_job_id": "4321"}, slurm=slurm,
                               store=store)
    assert again[0].blocked_by == "already drained"


def test_offline_lists_decisions_without_touching_anything():
    acts = drain.apply_policy(drain_cfg(), hw_verdict(), {}, slurm=None, store=None, path="offline")
    assert [(a.node, a.applied, a.blocked_by) for a in acts] == [("n2", False, "offline analysis")]


def test_disabled_and_missing_store(store):
    slurm = FakeSlurm()
    assert drain.apply_policy(drain_cfg(enabled=False), hw_verdict(), {}, slurm=slurm, store=store)[0].blocked_by \
        == "drain disabled"
    assert drain.apply_policy(drain_cfg(), hw_verdict(), {}, slurm=slurm, store=None)[0].blocked_by \
        == "no verdict database"
    assert slurm.drained() == []


def test_dry_run_records_everything_drains_nothing(store):
    slurm = FakeSlurm()
    cfg = drain_cfg(dry_run=True, max_drains=1)
    decided = []
    for i, node in enumerate(["n1", "n2", "n3"]):
        acts = drain.apply_policy(cfg, hw_verdict(str(100 + i), node), {}, slurm=slurm, store=store)
        store.record_actions(str(100 + i), acts, path="central")
        decided += acts
    assert [(a.node, a.applied, a.blocked_by) for a in decided] == [
        ("n1", False, "dry-run"), ("n2", False, "dry-run"), ("n3", False, "dry-run")]
    assert slurm.drained() == []
    assert not [c for c in slurm.calls if c[0] in ("drain", "reboot")]
    # Every decision is in the store; the breaker neither counted nor tripped.
    assert len(store.actions()) == 3 and all(r["blocked_by"] == "dry-run" for r in store.actions())
    assert store.ledger_count(0) == 0 and not store.breaker()["tripped"]


def test_dry_run_still_reports_etiquette(store):
    slurm = FakeSlurm()
    slurm.admin_drain("n2", "rma")
    acts = drain.apply_policy(drain_cfg(dry_run=True), hw_verdict(node="n2"), {}, slurm=slurm, store=store)
    assert acts[0].blocked_by == "not our drain: rma"


def test_reboot_mapping_default_is_drain_only(store):
    slurm = FakeSlurm(reboot_program=True)
    acts = drain.apply_policy(drain_cfg(), hw_verdict(action="reboot"), {}, slurm=slurm, store=store)
    assert acts[0].kind == "drain" and acts[0].applied
    assert [c[0] for c in slurm.calls if c[0] in ("drain", "reboot")] == ["drain"]


@pytest.mark.parametrize("action", ["reset", "reboot"])
def test_reboot_mapping_with_reboot_enabled(store, action):
    slurm = FakeSlurm(reboot_program=True)
    acts = drain.apply_policy(drain_cfg(reboot=True), hw_verdict(action=action), {}, slurm=slurm, store=store)
    assert (acts[0].kind, acts[0].applied) == ("reboot", True)
    call = [c for c in slurm.calls if c[0] == "reboot"][0]
    assert call[1:] == ("n2", acts[0].reason, "DOWN")
    assert "REBOOT_REQUESTED" in slurm.state("n2")


def test_reboot_enabled_but_catalog_says_drain_drains(store):
    slurm = FakeSlurm(reboot_program=True)
    acts = drain.apply_policy(drain_cfg(reboot=True), hw_verdict(xid=64, action="drain"), {}, slurm=slurm, store=store)
    assert acts[0].kind == "drain"
    assert not [c for c in slurm.calls if c[0] == "reboot"]


def test_reboot_refused_falls_back_to_drain(store):
    slurm = FakeSlurm(reboot_program=False)  # no RebootProgram: scontrol reboot fails
    acts = drain.apply_policy(drain_cfg(reboot=True), hw_verdict(action="reboot"), {}, slurm=slurm, store=store)
    assert (acts[0].kind, acts[0].applied) == ("drain", True)
    assert slurm.drained() == ["n2"]


def test_slurm_errors_block_and_release_the_claim(store):
    slurm = FakeSlurm()
    slurm.fail_drain = True
    acts = drain.apply_policy(drain_cfg(), hw_verdict(), {}, slurm=slurm, store=store)
    assert not acts[0].applied and acts[0].blocked_by.startswith("slurm error:")
    assert store.ledger_count(0) == 0  # a refused drain does not use up the breaker
    slurm.fail_drain = False
    slurm.unreachable = True
    acts = drain.apply_policy(drain_cfg(), hw_verdict(), {}, slurm=slurm, store=store)
    assert acts[0].blocked_by.startswith("slurm error:") and "Unable to contact" in acts[0].blocked_by


def test_unknown_node(store):
    acts = drain.apply_policy(drain_cfg(), hw_verdict(node="gpu99"), {}, slurm=FakeSlurm(), store=store)
    assert acts[0].blocked_by == "node unknown to Slurm"


def test_one_decision_per_node_worst_symptom_names_the_reason(store):
    a = xid_symptom(node="n1", xid=64, action="drain", priority=92)
    b = xid_symptom(node="n1", xid=79, action="reboot", priority=95)
    c = xid_symptom(node="n2", xid=48, action="reset", priority=94)
    v = Verdict(job_id="9", cause="gpu_hardware", culprit_nodes=["n2"], symptoms=[a, b, c])
    cands = drain.candidates(v)
    # Culprit nodes first; one entry per node; the reboot-class Xid names n1's reason.
    assert [(n, act) for n, act, _ in cands] == [("n2", "reset"), ("n1", "reboot")]
    assert "xid79" in cands[1][2]


@pytest.mark.parametrize("rec,words,reason,out", [
    ({"NodeName": "n1", "State": "MIXED+DRAIN", "Reason": "SATTR: a job 1 [root@2024-05-01T10:00:00]"},
     {"MIXED", "DRAIN"}, "SATTR: a job 1", True),
    ({"NodeName": "n1", "State": "IDLE", "Reason": "(null)"}, {"IDLE"}, "", False),
    ({"NodeName": "n1", "State": "DOWN*", "Reason": "Not responding [slurm@2024]"}, {"DOWN"}, "Not responding", True),
    ({"NodeName": "n1", "State": "ALLOCATED+COMPLETING"}, {"ALLOCATED", "COMPLETING"}, "", False),
])
def test_node_state_parsing(rec, words, reason, out):
    st = drain.NodeState.from_record(rec)
    assert st.words == frozenset(words) and st.reason == reason and st.out_of_service is out


def test_reason_job():
    assert drain.reason_job("SATTR: gpu_hardware xid79 gpu3 job 1234") == "1234"
    assert drain.reason_job("bad fan") is None
