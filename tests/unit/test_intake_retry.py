"""Every ended job ends with a stored verdict: locked database, accounting down, timeout, crash, no bundle."""
from __future__ import annotations

import json
import sqlite3
import time

import pytest

from slurm_attr.pipeline import attempt, batch, finish, intake, settle
from slurm_attr import store as store_mod
from slurm_attr.config import Config
from slurm_attr.errors import SlurmUnavailable
from slurm_attr.store import Store

from test_drain_fakes import XID79, FakeSlurm


class JobSlurm(FakeSlurm):
    """FakeSlurm plus a job: sacct answers or not; scontrol shows the given state."""

    def __init__(self, sacct_state="COMPLETED", ctl_state="COMPLETED", exit_code="0:0"):
        super().__init__()
        self.sacct_state, self.ctl_state, self.exit_code = sacct_state, ctl_state, exit_code
        self.accounting_down = False
        self.comments: dict[str, str] = {}

    def sacct_job(self, job_id):
        if self.accounting_down:
            raise SlurmUnavailable("sacct: error: Problem talking to the database: Connection refused")
        return {"JobID": job_id, "JobIDRaw": job_id, "State": self.sacct_state, "ExitCode": self.exit_code,
                "NodeList": "n1"}

    def job_comment(self, job_id, field):
        return self.comments.get(job_id, "")

    def set_job_comment(self, job_id, field, text):
        if self.accounting_down:
            raise SlurmUnavailable("sacctmgr: Problem talking to the database")
        self.comments[job_id] = text

    def show_job(self, job_id):
        if self.ctl_state is None:
            return None
        return {"JobId": job_id, "JobState": self.ctl_state, "ExitCode": self.exit_code, "NodeList": "n1",
                "UserId": "alice(1000)"}


@pytest.fixture
def cfg(tmp_path, monkeypatch):
    c = Config()
    c.paths.spool = str(tmp_path / "spool")
    c.paths.database = str(tmp_path / "db" / "sattr.db")
    c.intake.queue_dir = str(tmp_path / "q")
    c.analysis.node_wait_s = 0.0
    c.analysis.yield_pressure = 0  # `sattr retry` goes through the workers' batches, which yield to a loaded host
    c.drain.max_partition_percent = 100.0
    monkeypatch.setattr(settle, "SACCT_SETTLE_S", 0.0)
    monkeypatch.setattr(store_mod, "BUSY_TIMEOUT_MS", 100)  # a locked write fails in 0.1 s, not 10
    return c


def _job(cfg, key="100", kernel: str | None = None, job_json=True):
    facts = {"job_id": key, "slurm_job_id": key, "nodes": ["n1"], "user": "alice", "uid": 1000,
             "state": None, "exit_code": 0, "signal": 0}
    bdir = finish.bundle_for(cfg, key)
    if job_json:
        import os

        os.makedirs(f"{bdir}/nodes/n1", exist_ok=True)
        with open(f"{bdir}/job.json", "w") as f:
            json.dump(facts, f)
        with open(f"{bdir}/nodes/n1/collect.json", "w") as f:
            json.dump({"node": "n1", "sources": {}}, f)
        if kernel is not None:
            with open(f"{bdir}/nodes/n1/kernel.log", "w") as f:
                f.write(kernel)
    intake.record(cfg, key, facts)
    return facts


def _stored(cfg, job_id):
    return Store(cfg.paths.database).verdict(job_id)


def test_plain_job_is_stored_and_leaves_the_queue(cfg):
    _job(cfg)
    assert attempt.process(cfg, "100", slurm=JobSlurm()) == "stored"
    assert _stored(cfg, "100").cause == "none" and intake.load(cfg, "100") is None


def test_locked_database_is_retried_not_fatal(cfg):
    Store(cfg.paths.database)  # exists, WAL
    _job(cfg)
    holder = sqlite3.connect(cfg.paths.database, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    errors = []

    def sleep(s):  # the lock is released while the analyser backs off
        errors.append(intake.load(cfg, "100")["last_error"])
        holder.execute("COMMIT")

    assert attempt.process(cfg, "100", slurm=JobSlurm(), sleep=sleep, retry_for_s=60) == "stored"
    assert errors and "database is locked" in errors[0]
    v = _stored(cfg, "100")
    assert v.cause == "none" and intake.load(cfg, "100") is None
    assert [c.detail.split(";")[0] for c in v.coverage if c.source == "intake"] == ["stored after 1 failed attempt(s)"]


def test_locked_past_the_retry_window_stays_pending_then_a_retry_stores_it(cfg):
    Store(cfg.paths.database)
    _job(cfg)
    holder = sqlite3.connect(cfg.paths.database, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    assert attempt.process(cfg, "100", slurm=JobSlurm(), retry_for_s=0) == "pending"
    doc = intake.load(cfg, "100")
    assert doc["attempts"] == 1 and "database is locked" in doc["last_error"]
    holder.execute("COMMIT")
    holder.close()
    with pytest.raises(Exception):
        _stored(cfg, "100")
    assert batch.retry_due(cfg, slurm=JobSlurm(), everything=True) == {"100": "stored"}
    assert _stored(cfg, "100").cause == "none"


def test_accounting_down_takes_the_state_from_slurmctld(cfg):
    _job(cfg)
    slurm = JobSlurm(ctl_state="COMPLETED")
    slurm.accounting_down = True
    assert attempt.process(cfg, "100", slurm=slurm) == "stored"
    v = _stored(cfg, "100")
    assert v.cause == "none"
    assert any(c.source == "accounting" and c.status == "error" for c in v.coverage)


def test_accounting_down_and_slurmctld_undecided_is_never_stored_as_unknown(cfg):
    _job(cfg)
    slurm = JobSlurm(ctl_state=None)  # slurmctld forgot the job (MinJobAge), accounting down
    slurm.accounting_down = True
    assert attempt.process(cfg, "100", slurm=slurm) == "pending"
    assert "accounting unavailable" in intake.load(cfg, "100")["last_error"]
    with pytest.raises(Exception):
        _stored(cfg, "100")
    slurm.accounting_down = False  # accounting answers again: re-analysed
    assert batch.retry_due(cfg, slurm=slurm, everything=True) == {"100": "stored"}
    assert _stored(cfg, "100").cause == "none"


def test_timeout_stores_a_partial_verdict_with_the_kernel_finding(cfg, monkeypatch):
    _job(cfg, kernel=XID79 + "\n")
    cfg.analysis.timeout_s = 0.2

    def slow(*a, **k):
        time.sleep(5)

    monkeypatch.setattr(finish, "run_bundle", slow)
    failed = JobSlurm(sacct_state="FAILED", ctl_state="FAILED", exit_code="1:0")
    assert attempt.process(cfg, "100", slurm=failed) == "partial"
    v = _stored(cfg, "100")
    assert v.cause == "gpu_hardware" and v.culprit_nodes == ["n1"], v.coverage
    cov = [c for c in v.coverage if c.source == "analysis"]
    assert cov and cov[0].status == "error" and "timed out after 0.2s" in cov[0].detail
    doc = intake.load(cfg, "100")
    assert doc["partial_stored"] and "timed out" in doc["last_error"]
    # The fault clears: a retry replaces the partial verdict with the full one.
    monkeypatch.undo()
    monkeypatch.setattr(settle, "SACCT_SETTLE_S", 0.0)
    cfg.analysis.timeout_s = 120
    assert batch.retry_due(cfg, slurm=failed, everything=True) == {"100": "stored"}
    v2 = _stored(cfg, "100")
    assert v2.cause == "gpu_hardware" and not [c for c in v2.coverage if c.source == "analysis"]
    assert intake.load(cfg, "100") is None


def test_crash_of_a_completed_job_stores_none_not_unknown(cfg, monkeypatch):
    _job(cfg, kernel="2026-11-30T10:00:00+00:00 host kernel: usb 1-1: new device\n")

    def boom(*a, **k):
        raise RuntimeError("analyser bug")

    monkeypatch.setattr(finish, "run_bundle", boom)
    assert attempt.process(cfg, "100", slurm=JobSlurm()) == "partial"
    v = _stored(cfg, "100")
    # The state was settled (sacct: COMPLETED) before the crash: the partial says so, never `unknown`.
    assert v.cause == "none"
    assert any("analysis crashed: RuntimeError: analyser bug" in c.detail for c in v.coverage)


def test_job_without_a_bundle_is_analysed_from_its_pending_facts(cfg):
    _job(cfg, job_json=False)
    assert attempt.process(cfg, "100", slurm=JobSlurm()) == "stored"
    v = _stored(cfg, "100")
    assert v.cause == "none"
    assert any(c.source == "spool" and c.status == "missing" for c in v.coverage)
    row = Store(cfg.paths.database).job("100")
    assert row["bundle_path"] == ""


def test_a_second_analyser_of_the_same_job_stands_aside(cfg):
    _job(cfg)
    with intake.claim(cfg, "100"):
        import threading

        out = []
        t = threading.Thread(target=lambda: out.append(attempt.transient(RuntimeError("x"))))
        t.start(); t.join()
        # claim() is per process+fd: a second claim from here is refused while held.
        with intake.claim(cfg, "100") as again:
            assert again is False
    assert out == [False]
    assert attempt.transient(sqlite3.OperationalError("database is locked"))
    assert not attempt.transient(sqlite3.OperationalError("no such table: x"))


def test_spool_lost_the_kernel_window_the_drain_reason_carries_the_finding(cfg):
    """Issue 11: a full spool kept no kernel.log; the fast path's SATTR: reason in Slurm is the
    trusted finding the central verdict rests on."""
    _job(cfg, job_json=False)
    slurm = JobSlurm(sacct_state="FAILED", ctl_state="FAILED", exit_code="1:0")
    slurm.drain("n1", "SATTR: gpu_hardware xid79 gpu3b:00 job 100")
    assert attempt.process(cfg, "100", slurm=slurm) == "stored"
    v = _stored(cfg, "100")
    assert v.cause == "gpu_hardware" and v.culprit_nodes == ["n1"]
    assert [a.blocked_by for a in v.actions] == ["already drained"]
    rows = Store(cfg.paths.database).actions("100")
    assert {(r["path"], r["applied"], r["actor"]) for r in rows} == {("fast", 1, "slurm reason"), ("central", 0, "sattr")}
    # Near miss: another job's drain reason on the same node is not this job's finding.
    _job(cfg, key="101", job_json=False)
    assert attempt.process(cfg, "101", slurm=slurm) == "stored"
    assert _stored(cfg, "101").cause != "gpu_hardware"


def test_a_failure_after_the_verdict_is_stored_never_replaces_it_with_a_partial(cfg, monkeypatch):
    _job(cfg)

    def comment_timeout(*a, **k):
        raise attempt.AnalysisTimeout("analysis exceeded [analysis] timeout_s")

    monkeypatch.setattr(finish, "flush_comments", comment_timeout)
    assert attempt.process(cfg, "100", slurm=JobSlurm()) == "stored"
    v = _stored(cfg, "100")
    assert v.cause == "none" and not [c for c in v.coverage if c.source == "analysis"]
    assert intake.load(cfg, "100") is None
    # Near miss: the same timeout before the verdict is stored gives a partial one.
    _job(cfg, key="101")
    monkeypatch.setattr(finish, "run_bundle", comment_timeout)
    assert attempt.process(cfg, "101", slurm=JobSlurm()) == "partial"


def test_crash_with_the_kernel_window_lost_still_names_the_drained_gpu(cfg, monkeypatch):
    """Spool full and the analysis crashing (as an analyser that fails to import does): the partial
    verdict takes the fast path's finding from Slurm's reason."""
    _job(cfg, job_json=False)
    slurm = JobSlurm(sacct_state="FAILED", ctl_state="FAILED", exit_code="1:0")
    slurm.drain("n1", "SATTR: gpu_hardware xid79 gpu3b:00 job 100")

    def boom(*a, **k):
        raise ModuleNotFoundError("No module named 'slurm_attr.live'")

    monkeypatch.setattr(finish, "run_bundle", boom)
    assert attempt.process(cfg, "100", slurm=slurm) == "partial"
    v = _stored(cfg, "100")
    assert v.cause == "gpu_hardware" and v.culprit_nodes == ["n1"]
    assert [(r["path"], r["applied"]) for r in Store(cfg.paths.database).actions("100")] == [("fast", 1)]
    # Near miss: without the drain reason the same crash gives no hardware verdict.
    _job(cfg, key="101", job_json=False)
    assert attempt.process(cfg, "101", slurm=JobSlurm(sacct_state="FAILED", ctl_state="FAILED",
                                                    exit_code="1:0")) == "partial"
    assert _stored(cfg, "101").cause != "gpu_hardware"


def test_accounting_catching_up_without_a_final_state_asks_slurmctld(cfg):
    """After an outage slurmdbd answers but has no final state yet: slurmctld's word is taken."""
    _job(cfg)
    slurm = JobSlurm(sacct_state="RUNNING", ctl_state="COMPLETED")
    assert attempt.process(cfg, "100", slurm=slurm) == "stored"
    v = _stored(cfg, "100")
    assert v.cause == "none" and Store(cfg.paths.database).job("100")["state"] == "COMPLETED"
    # Near miss: neither says the state -> not stored as `unknown`, left pending ...
    _job(cfg, key="101")
    undecided = JobSlurm(sacct_state="RUNNING", ctl_state=None)
    assert attempt.process(cfg, "101", slurm=undecided) == "pending"
    assert "no final state" in intake.load(cfg, "101")["last_error"]
    with pytest.raises(Exception):
        _stored(cfg, "101")
    # ... until its last attempt, which stores what there is (partial over nothing).
    cfg.intake.max_attempts = 2
    assert batch.retry_due(cfg, slurm=undecided, everything=True) == {"101": "stored"}
    assert _stored(cfg, "101").cause == "unknown"


def test_retry_leaves_alone_an_entry_a_worker_finished_since_its_listing(cfg, monkeypatch):
    """`sattr retry` lists the pending entries, then takes them one by one; a worker may store one
    meanwhile. That one is done: not re-recorded from its bundle and analysed again as a first
    attempt (which replaced the stored verdict, losing its note of the fault it came through)."""
    _job(cfg, "300")
    _job(cfg, "301")
    intake.failed(cfg, "300", "analysis timed out")
    listed = intake.entries(cfg)
    assert attempt.process(cfg, "300", slurm=JobSlurm(), pending_only=True) == "stored"  # the worker
    first = _stored(cfg, "300")
    assert any(c.source == "intake" and "timed out" in c.detail for c in first.coverage)
    monkeypatch.setattr(intake, "entries", lambda c: listed)  # retry's listing, taken before
    got = batch.retry_due(cfg, slurm=JobSlurm(), everything=True)
    assert got == {"300": "gone", "301": "stored"}
    again = _stored(cfg, "300")
    assert any(c.source == "intake" and "timed out" in c.detail for c in again.coverage)
    assert intake.load(cfg, "300") is None
