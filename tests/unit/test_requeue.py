"""Requeue around the broken node (slurm_attr/requeue.py, [requeue] in rules/policy.toml): which
verdicts requeue, with which Slurm call, how often, and that every refusal is recorded, not raised."""
from __future__ import annotations

import copy
import sys
from typing import Any

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from slurm_attr import drain, render, requeue
from slurm_attr.errors import RuleError, SlurmError
from slurm_attr.model import Evidence, Symptom, Verdict
from slurm_attr.reason import policy
from slurm_attr.store import Store

from test_drain_fakes import FakeSlurm, drain_cfg, hw_verdict

FINAL = ("COMPLETED", "FAILED", "NODE_FAIL", "TIMEOUT", "CANCELLED")


class JobSlurm(FakeSlurm):
    """FakeSlurm plus one job as `scontrol -o show job` shows it, requeued as 22.05 does: a finished
    batch job that allows requeue goes back to PENDING with Restarts+1; ExcNodeList only while pending."""

    def __init__(self, batch: bool = True, requeue_ok: bool = True, release: str = "22.05", **kw: Any):
        super().__init__(**kw)
        self.job = {"JobId": "1234", "JobState": "FAILED", "Reason": "NonZeroExitCode", "Restarts": "0",
                    "BatchFlag": "1" if batch else "0", "Requeue": "1" if requeue_ok else "0",
                    "ExcNodeList": "(null)", "NodeList": "n[1-2]"}
        if release >= "25.11":
            self.job["ExpeditedRequeue"] = "No"
        self.refuse = ""

    def show_job(self, job_id: str) -> dict[str, str] | None:
        self.calls.append(("show_job", job_id))
        self._check()
        return dict(self.job) if job_id == self.job["JobId"] else None

    def requeue(self, job_id: str, expedite: bool = False) -> None:
        self.calls.append(("requeue", job_id, expedite))
        self._check()
        if self.refuse:
            raise SlurmError(f"scontrol requeue {job_id}: {self.refuse}")
        if expedite:  # scontrol release of the job Slurm's expedited requeue holds
            if self.job["JobState"] != "REQUEUE_HOLD":
                raise SlurmError("Job is not held")
            # 26.05: released, it is the highest priority there is and runs at the next pass
            self.job["JobState"] = "RUNNING"
            return
        if self.job["BatchFlag"] != "1" or self.job["Requeue"] != "1":
            raise SlurmError("Requested operation is presently disabled")
        if self.job["JobState"] not in FINAL:
            raise SlurmError("Job is pending execution")
        self.job.update(JobState="PENDING", Reason="BeginTime", Restarts=str(int(self.job["Restarts"]) + 1))

    def exclude_nodes(self, job_id: str, nodes: str) -> None:
        self.calls.append(("exclude_nodes", job_id, nodes))
        if self.job["JobState"] not in ("PENDING", "REQUEUE_HOLD"):
            raise SlurmError("Job is no longer pending execution")
        self.job["ExcNodeList"] = nodes


@pytest.fixture
def store():
    return Store(memory=True)


def cfg(**actions: Any):
    c = drain_cfg()
    c.actions.requeue_on = ["hardware", "node_failure"]
    for k, v in actions.items():
        setattr(c.actions, k, v)
    return c


def drained_verdict(c, slurm, store, job_id: str = "1234", node: str = "n2") -> Verdict:
    v = hw_verdict(job_id, node)
    v.actions = drain.apply_policy(c, v, {}, slurm=slurm, store=store)
    return v


def user_verdict(job_id: str = "1234") -> Verdict:
    s = Symptom(id="py.traceback", cause="user_error", role="root", trusted=False, node="n1", rank=0,
                summary="ValueError", evidence=[Evidence(source="stdout", path="output/stdout", line=9,
                                                         text="ValueError: bad")])
    return Verdict(job_id=job_id, cause="user_error", culprit_nodes=["n1"], symptoms=[s])


def job(restarts: int = 0) -> dict[str, Any]:
    return {"job_id": "1234", "slurm_job_id": "1234", "restart_count": restarts}


def no_sleep(_s: float) -> None:
    return None


def asked(slurm: JobSlurm) -> list[tuple]:
    return [c for c in slurm.calls if c[0] in ("requeue", "exclude_nodes")]


# -- the policy table ------------------------------------------------------------------------


def test_the_shipped_requeue_table_and_its_cases_hold():
    p = policy.load()
    assert policy.requeue_failures(p) == [] and len(p.requeue.cases) >= 6
    assert {"user", "scheduler", "none", "unknown"} <= p.requeue.never_domains
    assert any(c.expect for c in p.requeue.cases) and any(not c.expect for c in p.requeue.cases)


def test_a_requeue_case_that_does_not_hold_is_reported():
    data = tomllib.loads(policy._policy_bytes().decode())
    data["requeue"]["cases"] = [{"name": "wrong on purpose", "cause": "gpu_hardware", "drains": ["circuit breaker"],
                                 "expect": True}]
    got = policy.check_cases(policy.parse(data))
    assert len(got) == 1 and got[0].startswith("requeue case 'wrong on purpose': expected requeue, got none")


@pytest.mark.parametrize("edit, why", [
    (lambda d: d["requeue"].update(colour="red"), "unknown key 'colour'"),
    (lambda d: d["requeue"].update(never_domains=["weather"]), "unknown domain 'weather'"),
    (lambda d: d["requeue"].update(slurm_removes_node=["gremlins"]), "'gremlins' is no cause here"),
    (lambda d: d["requeue"]["cases"].append({"cause": "gpu_hardware", "expect": "yes"}), "expect"),
])
def test_a_broken_requeue_table_is_refused(edit, why):
    data = copy.deepcopy(tomllib.loads(policy._policy_bytes().decode()))
    edit(data)
    with pytest.raises(RuleError, match=why):
        policy.parse(data)


def test_without_a_requeue_table_nothing_requeues():
    data = tomllib.loads(policy._policy_bytes().decode())
    del data["requeue"]
    p = policy.parse(data)
    assert p.requeue.why_not("gpu_hardware", "hardware", True, ["applied"]) != ""


# -- decisions on the fake Slurm -----------------------------------------------------------------


def test_eligible_hardware_verdict_is_requeued_plain_on_2205_and_the_node_excluded(store):
    slurm, c = JobSlurm(), cfg()
    v = drained_verdict(c, slurm, store)
    d = requeue.apply(c, v, job(), slurm=slurm, store=store, sleep=no_sleep)
    assert d is not None and d.requeued, d
    assert (d.attempt, d.next_attempt, d.excluded, d.expedite) == (1, 2, ["n2"], False)
    assert asked(slurm) == [("requeue", "1234", False), ("exclude_nodes", "1234", "n2")]
    assert slurm.job["JobState"] == "PENDING" and slurm.job["Restarts"] == "1" and slurm.job["ExcNodeList"] == "n2"
    assert d.line() == "requeued as attempt 2; n2 excluded"
    [row] = store.requeues("1234")
    assert row["ok"] == 1 and row["attempt"] == 1 and row["excluded"] == "n2" and row["cause"] == "gpu_hardware"


def test_an_existing_exclusion_is_kept_and_appended_to(store):
    slurm, c = JobSlurm(), cfg()
    slurm.job["ExcNodeList"] = "n[3-4]"
    d = requeue.apply(c, drained_verdict(c, slurm, store), job(), slurm=slurm, store=store, sleep=no_sleep)
    assert d.requeued and slurm.job["ExcNodeList"] == "n3,n4,n2"


def test_expedited_requeue_job_held_by_slurm_2511_is_released(store):
    # 25.11: a job submitted with --requeue=expedite that failed while its epilogs all passed (ours
    # drains and exits 0) waits in REQUEUE_HOLD: Slurm requeued it, we let it go.
    slurm, c = JobSlurm(release="25.11"), cfg()
    slurm.job.update(ExpeditedRequeue="Yes", JobState="REQUEUE_HOLD", Restarts="1")
    d = requeue.apply(c, drained_verdict(c, slurm, store), job(), slurm=slurm, store=store, sleep=no_sleep)
    assert d.requeued and d.expedite and d.line() == "requeued as attempt 2; n2 excluded (expedited)"
    # excluded while still held: once released it starts before an update could reach it
    assert asked(slurm)[:2] == [("exclude_nodes", "1234", "n2"), ("requeue", "1234", True)]
    assert slurm.job["ExcNodeList"] == "n2" and d.detail == "requeued as attempt 2; n2 excluded (expedited)"


def test_2511_job_without_expedite_is_requeued_plain(store):
    slurm, c = JobSlurm(release="25.11"), cfg()
    d = requeue.apply(c, drained_verdict(c, slurm, store), job(), slurm=slurm, store=store, sleep=no_sleep)
    assert d.requeued and not d.expedite and asked(slurm)[0] == ("requeue", "1234", False)


def test_expedite_turned_off_never_releases_slurms_hold(store):
    slurm, c = JobSlurm(release="25.11"), cfg(requeue_expedite=False)
    slurm.job.update(ExpeditedRequeue="Yes", JobState="REQUEUE_HOLD", Restarts="1")
    d = requeue.apply(c, drained_verdict(c, slurm, store), job(), slurm=slurm, store=store, sleep=no_sleep)
    assert not d.requeued and "requeued already" in d.why and asked(slurm) == []


def test_user_error_with_the_same_settings_is_not_requeued(store):
    slurm, c = JobSlurm(), cfg(requeue_on=["hardware", "user", "user_error"])
    d = requeue.apply(c, user_verdict(), job(), slurm=slurm, store=store, sleep=no_sleep)
    assert not d.requeued and "user cause (user_error) never requeues" in d.why
    assert asked(slurm) == [] and slurm.job["JobState"] == "FAILED"
    assert [r["ok"] for r in store.requeues("1234")] == [0]


def test_cause_the_site_did_not_opt_into_is_not_requeued(store):
    slurm, c = JobSlurm(), cfg(requeue_on=["node_failure"])
    d = requeue.apply(c, drained_verdict(c, slurm, store), job(), slurm=slurm, store=store, sleep=no_sleep)
    assert not d.requeued and "not in [actions] requeue_on" in d.why and asked(slurm) == []


def test_requeue_off_decides_and_records_nothing(store):
    slurm, c = JobSlurm(), cfg(requeue_on=[])
    assert requeue.apply(c, drained_verdict(c, slurm, store), job(), slurm=slurm, store=store) is None
    assert asked(slurm) == [] and store.requeues() == []


def test_the_cap_holds_across_attempts(store):
    slurm, c = JobSlurm(), cfg(max_requeues=1)
    assert requeue.apply(c, drained_verdict(c, slurm, store), job(), slurm=slurm, store=store, sleep=no_sleep).requeued
    # attempt 2 runs, fails on another broken node: ours were 1 requeue already
    slurm.job.update(JobState="FAILED", ExcNodeList="n2")
    d = requeue.apply(c, drained_verdict(c, slurm, store, node="n3"), job(restarts=1), slurm=slurm, store=store,
                      sleep=no_sleep)
    assert not d.requeued and d.why == "[actions] max_requeues (1) reached for this job"
    assert [c[0] for c in asked(slurm)] == ["requeue", "exclude_nodes"]
    assert [r["ok"] for r in store.requeues("1234")] == [1, 0]


def test_a_reanalysis_of_the_same_attempt_does_not_requeue_twice(store):
    slurm, c = JobSlurm(), cfg(max_requeues=5)
    first = requeue.apply(c, drained_verdict(c, slurm, store), job(), slurm=slurm, store=store, sleep=no_sleep)
    again = requeue.apply(c, drained_verdict(c, slurm, store), job(), slurm=slurm, store=store, sleep=no_sleep)
    assert first.requeued and again.requeued and again.line() == first.line()
    assert [x[0] for x in asked(slurm)] == ["requeue", "exclude_nodes"] and len(store.requeues("1234")) == 1


def test_non_batch_job_is_not_requeued(store):
    slurm, c = JobSlurm(batch=False), cfg()
    d = requeue.apply(c, drained_verdict(c, slurm, store), job(), slurm=slurm, store=store, sleep=no_sleep)
    assert not d.requeued and d.why.startswith("not a batch job") and asked(slurm) == []


def test_job_that_does_not_allow_requeue_is_not_requeued(store):
    slurm, c = JobSlurm(requeue_ok=False), cfg()
    d = requeue.apply(c, drained_verdict(c, slurm, store), job(), slurm=slurm, store=store, sleep=no_sleep)
    assert not d.requeued and "does not allow requeue" in d.why and asked(slurm) == []


@pytest.mark.parametrize("how, blocked", [("dry_run", "dry-run"), ("breaker", "circuit breaker")])
def test_drain_blocked_by_dry_run_or_breaker_means_no_requeue(store, how, blocked):
    slurm, c = JobSlurm(), cfg()
    if how == "dry_run":
        c.drain.dry_run = True
    else:
        store.trip_breaker("test: tripped by hand")
    v = drained_verdict(c, slurm, store)
    assert [a.blocked_by for a in v.actions] == [blocked] and slurm.drained() == []
    d = requeue.apply(c, v, job(), slurm=slurm, store=store, sleep=no_sleep)
    assert not d.requeued and f"still in service ({blocked})" in d.why and asked(slurm) == []


def test_node_drained_by_someone_else_does_not_count(store):
    slurm, c = JobSlurm(), cfg()
    slurm.admin_drain("n2", "bad fan")
    d = requeue.apply(c, drained_verdict(c, slurm, store), job(), slurm=slurm, store=store, sleep=no_sleep)
    assert not d.requeued and "not our drain" in d.why


def test_slurm_refusing_is_recorded_not_raised(store):
    slurm, c = JobSlurm(), cfg()
    slurm.refuse = "Access/permission denied"
    d = requeue.apply(c, drained_verdict(c, slurm, store), job(), slurm=slurm, store=store, sleep=no_sleep)
    assert not d.requeued and d.why.startswith("slurm refused:") and "permission denied" in d.why
    [row] = store.requeues("1234")
    assert row["ok"] == 0 and "permission denied" in row["detail"]


def test_slurm_unreachable_is_recorded_not_raised(store):
    slurm, c = JobSlurm(), cfg()
    v = drained_verdict(c, slurm, store)
    slurm.unreachable = True
    d = requeue.apply(c, v, job(), slurm=slurm, store=store, sleep=no_sleep)
    assert not d.requeued and "Unable to contact slurm controller" in d.why


def test_job_gone_from_slurmctld_is_not_requeued(store):
    slurm, c = JobSlurm(), cfg()
    v = drained_verdict(c, slurm, store, job_id="999")
    d = requeue.apply(c, v, {"job_id": "999"}, slurm=slurm, store=store, sleep=no_sleep)
    assert not d.requeued and "MinJobAge" in d.why


def test_a_job_slurm_requeued_itself_is_left_alone(store):
    # NODE_FAIL with Requeue=1: slurmctld requeues the job on its own; no second requeue.
    slurm, c = JobSlurm(), cfg()
    slurm.job.update(JobState="PENDING", Restarts="1")
    d = requeue.apply(c, drained_verdict(c, slurm, store), job(), slurm=slurm, store=store, sleep=no_sleep)
    assert not d.requeued and d.why == "the job was requeued already (Restarts=1)" and asked(slurm) == []


def test_offline_analysis_decides_but_records_nothing(store):
    v = hw_verdict()
    v.actions = drain.apply_policy(cfg(), v, {}, slurm=None, store=None, path="offline")
    d = requeue.apply(cfg(), v, job(), slurm=None, store=store)
    assert not d.requeued and "offline analysis" in d.why and store.requeues() == []


# -- what `sattr JOB` shows ------------------------------------------------------------------------


def test_sattr_job_shows_the_requeue_and_the_next_attempt_names_it(store):
    slurm, c = JobSlurm(), cfg()
    v = drained_verdict(c, slurm, store)
    v.requeue = requeue.for_verdict(c, v, job(), slurm=slurm, store=store)
    text = render.verdict_text(Verdict.from_dict(v.to_dict()), job())
    assert "Requeue: requeued as attempt 2; n2 excluded" in text
    assert "No need to resubmit" in text and v.to_dict()["requeue"]["requeued"] is True
    # attempt 2 completes: its verdict says which attempt it is and why it exists
    ok = Verdict(job_id="1234", cause="none", summary="completed")
    ok.requeue = requeue.for_verdict(c, ok, job(restarts=1), slurm=slurm, store=store)
    text2 = render.verdict_text(ok, job(restarts=1))
    assert "Requeue: attempt 2: slurm-attr requeued the job after attempt 1 (gpu_hardware; n2 excluded)" in text2


def test_a_verdict_without_requeue_keeps_the_contract_keys():
    v = hw_verdict()
    assert "requeue" not in v.to_dict()
    assert not [ln for ln in render.verdict_text(v, {}).splitlines() if ln.startswith("Requeue:")]


def test_both_attempts_verdicts_stay_readable(tmp_path):
    """Attempt 2's verdict replaces the job's row; attempt 1's is kept in `attempts` and read
    back (a re-analysis of the same attempt adds nothing; going back to attempt 1 swaps them)."""
    from slurm_attr.model import Verdict
    from slurm_attr.store import Store

    st = Store(str(tmp_path / "s.db"))
    job = {"job_id": "123", "slurm_job_id": "123", "state": "FAILED"}
    st.save(job, Verdict(job_id="123", cause="gpu_hardware", summary="Xid 79 on n2", culprit_nodes=["n2"]),
            bundle_path=str(tmp_path / "bundles" / "123"))
    assert st.earlier_attempts("123") == []
    st.save(job, Verdict(job_id="123", cause="none", summary="completed"), bundle_path=str(tmp_path / "bundles" / "123.r1"))
    st.save(job, Verdict(job_id="123", cause="none", summary="completed"), bundle_path=str(tmp_path / "bundles" / "123.r1"))
    earlier = st.earlier_attempts("123")
    assert [(e["bundle_key"], e["cause"], e["culprit_nodes"]) for e in earlier] == [("123", "gpu_hardware", ["n2"])]
    assert st.verdict("123").cause == "none"
    st.save(job, Verdict(job_id="123", cause="gpu_hardware", summary="again"), bundle_path=str(tmp_path / "bundles" / "123"))
    assert [e["bundle_key"] for e in st.earlier_attempts("123")] == ["123.r1"]
