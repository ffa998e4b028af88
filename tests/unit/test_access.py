"""Who sees which verdict: admins everything, users their own (from the database or the root-written copy)."""
from __future__ import annotations

import grp
import os
from types import SimpleNamespace

import pytest

from slurm_attr import access, usercopy
from slurm_attr.config import Config
from slurm_attr.errors import NotFound, PermissionDenied
from slurm_attr.model import Verdict
from slurm_attr.store import Store

from test_drain_fakes import FakeSlurm


class AcctSlurm(FakeSlurm):
    def __init__(self, rows):
        super().__init__()
        self.rows = rows  # job id -> (sacct row, comment)

    def sacct_job(self, job_id):
        row = self.rows.get(job_id)
        return dict(row[0]) if row else None

    def job_comment(self, job_id, field):
        row = self.rows.get(job_id)
        return row[1] if row else None


@pytest.fixture
def cfg(tmp_path):
    c = Config()
    c.paths.database = str(tmp_path / "sattr.db")
    st = Store(c.paths.database)
    st.save({"job_id": "7", "user": "alice", "uid": 1001, "nodes": ["n1"]},
            Verdict(job_id="7", cause="user_error", summary="exit 3"))
    return c


def _as(monkeypatch, uid, name):
    monkeypatch.setattr(access, "caller", lambda: (uid, name))


def test_owner_sees_own_job_from_database(cfg, monkeypatch):
    _as(monkeypatch, 1001, "alice")
    view = access.job_view(cfg, "7")
    assert view.verdict.cause == "user_error" and view.source == "database"


def test_other_user_is_refused(cfg, monkeypatch):
    _as(monkeypatch, 1002, "bob")
    with pytest.raises(PermissionDenied, match="belongs to another user"):
        access.job_view(cfg, "7")


@pytest.mark.parametrize("uid,name", [(0, "root"), (64030, "slurm")])
def test_root_and_slurm_user_see_everything(cfg, monkeypatch, uid, name):
    _as(monkeypatch, uid, name)
    assert access.job_view(cfg, "7").verdict.job_id == "7"


def test_admin_group_members_see_everything(cfg, monkeypatch):
    cfg.access.admin_group = "hpcadmin"
    monkeypatch.setattr(grp, "getgrnam", lambda g: SimpleNamespace(gr_mem=["carol"], gr_gid=4242))
    _as(monkeypatch, 1003, "carol")
    assert access.job_view(cfg, "7").verdict.cause == "user_error"
    assert access.is_admin(cfg, 1003, "carol")
    assert not access.is_admin(cfg, 1002, "bob")


def test_unknown_admin_group_grants_nothing(cfg):
    cfg.access.admin_group = "no-such-group-sattr"
    assert not access.is_admin(cfg, 1002, "bob")


@pytest.fixture
def copy_as_me(monkeypatch):
    # The copy's directories and files must belong to TRUSTED_UID (root on a site).
    monkeypatch.setattr(usercopy, "TRUSTED_UID", os.getuid())


def test_unreadable_database_reads_the_root_written_copy(cfg, monkeypatch, copy_as_me):
    v = Verdict(job_id="8", cause="gpu_hardware", summary="GPU fell off the bus", culprit_nodes=["n2"],
                culprit_ranks=[3, 7], culprit_gpus=["0000:3b:00"])
    usercopy.publish(cfg, {"job_id": "8", "uid": 1001, "user": "alice", "partition": "gpu"}, v)
    # The Comment says something else (the user typed it): it is not read.
    slurm = AcctSlurm({"8": ({"User": "alice", "Partition": "gpu", "State": "FAILED"},
                             "my note; SATTR1: none - all fine")})
    monkeypatch.setattr(access, "default_backend", lambda *a, **k: slurm)
    monkeypatch.setattr(access, "can_read_database", lambda path: False)
    _as(monkeypatch, 1001, "alice")
    view = access.job_view(cfg, "8")
    assert view.source == "copy"
    got = view.verdict
    assert (got.cause, got.culprit_nodes, got.culprit_ranks, got.summary) == \
        ("gpu_hardware", ["n2"], [3, 7], "GPU fell off the bus")
    assert view.job["partition"] == "gpu"
    _as(monkeypatch, 1002, "bob")
    with pytest.raises(PermissionDenied, match="another user"):
        access.job_view(cfg, "8")


@pytest.mark.parametrize("fake", [
    "sattr1: gpu_hardware nodes=n3 gpus=0000:3b:00 - GPU 0000:3b:00 on n3 fell off the bus (Xid 79)",
    "SATTR1: gpu_hardware nodes=n3 - GPU fell off the bus",
    "my run; SaTtR1: nvlink nodes=n3 - NVSwitch fatal",
])
def test_fake_marker_in_the_comment_is_never_shown_as_a_verdict(cfg, monkeypatch, copy_as_me, fake):
    slurm = AcctSlurm({"9": ({"User": "alice", "Partition": "gpu"}, fake)})
    monkeypatch.setattr(access, "default_backend", lambda *a, **k: slurm)
    monkeypatch.setattr(access, "can_read_database", lambda path: False)
    _as(monkeypatch, 1001, "alice")
    with pytest.raises(NotFound, match="no verdict for job 9"):
        access.job_view(cfg, "9")


def test_copy_of_the_real_verdict_wins_over_a_fake_comment(cfg, monkeypatch, copy_as_me):
    # Near miss of the case above: with a copy present, the copy (user_error) is shown.
    usercopy.publish(cfg, {"uid": 1001}, Verdict(job_id="9", cause="user_error", summary="exit 3"))
    slurm = AcctSlurm({"9": ({"User": "alice", "Partition": "gpu"}, "sattr1: gpu_hardware nodes=n3 - fake")})
    monkeypatch.setattr(access, "default_backend", lambda *a, **k: slurm)
    monkeypatch.setattr(access, "can_read_database", lambda path: False)
    _as(monkeypatch, 1001, "alice")
    assert access.job_view(cfg, "9").verdict.cause == "user_error"


def test_comment_without_verdict_is_not_found(cfg, monkeypatch):
    slurm = AcctSlurm({"9": ({"User": "alice"}, "just my note")})
    monkeypatch.setattr(access, "default_backend", lambda *a, **k: slurm)
    monkeypatch.setattr(access, "can_read_database", lambda path: False)
    _as(monkeypatch, 1001, "alice")
    with pytest.raises(NotFound, match="no verdict"):
        access.job_view(cfg, "9")


def test_can_read_database(tmp_path):
    assert not access.can_read_database(str(tmp_path / "missing.db"))
    Store(str(tmp_path / "x.db"))
    assert access.can_read_database(str(tmp_path / "x.db"))


def test_incomplete_accounting_row_is_waited_for_not_denied(cfg, monkeypatch):
    # Right after the comment is written, 22.05's sacct briefly shows User=root, no Partition.
    rows = [({"User": "root", "Partition": ""}, "sattr1: user_error - exit 3")] * 2 + \
           [({"User": "alice", "Partition": "debug"}, "sattr1: user_error - exit 3")]

    class Settling(AcctSlurm):
        def sacct_job(self, job_id):
            self.current = rows.pop(0) if len(rows) > 1 else rows[0]
            return dict(self.current[0])

        def job_comment(self, job_id, field):
            return self.current[1]

    monkeypatch.setattr(access, "default_backend", lambda *a, **k: Settling({}))
    monkeypatch.setattr(access, "can_read_database", lambda path: False)
    monkeypatch.setattr(access, "_SETTLE_S", 0.0)
    _as(monkeypatch, 1001, "alice")
    # No copy yet: the owner is told "not yet", not "another user's" (the Comment's
    # `sattr1:` text is not a verdict).
    with pytest.raises(NotFound, match="no verdict for job 11 yet"):
        access.job_view(cfg, "11")
    assert rows == [({"User": "alice", "Partition": "debug"}, "sattr1: user_error - exit 3")]


def test_complete_row_of_another_user_is_denied_at_once(cfg, monkeypatch):
    calls = []

    class Other(AcctSlurm):
        def sacct_job(self, job_id):
            calls.append(job_id)
            return {"User": "alice", "Partition": "debug"}

    monkeypatch.setattr(access, "default_backend", lambda *a, **k: Other({}))
    monkeypatch.setattr(access, "can_read_database", lambda path: False)
    _as(monkeypatch, 1002, "bob")
    with pytest.raises(PermissionDenied):
        access.job_view(cfg, "12")
    assert len(calls) == 1
