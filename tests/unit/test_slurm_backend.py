"""The pyslurm backend's translation and error typing, and the backend selection.

pyslurm itself is replaced by a small stand-in with pyslurm 22.5's names (db.Jobs.load,
db.Jobs.modify, db.JobFilter, db.Job, Node, Nodes, RPCError): the real binding is exercised
against the real cluster in tests/integration/test_slurm_backends.py.
"""
from __future__ import annotations

import os
import time
import types

import pytest

from slurm_attr import config
from slurm_attr.collect import jobstate
from slurm_attr.errors import ConfigError, SlurmError, SlurmUnavailable
from slurm_attr.slurm import pyslurm_backend as pb
from slurm_attr.slurm import select
from slurm_attr.slurm.cli import SACCT_FIELDS, CliSlurm
from slurm_attr.slurmstate import NodeState


class RPCError(Exception):
    pass


class FakeDbJob:
    def __init__(self, job_id=0, **kw):
        self.id = job_id
        self.kw = kw
        for k, v in kw.items():
            setattr(self, k, v)


class FakeJobs:
    rows: list = []
    modified: list = []
    modify_error: Exception | None = None

    def __init__(self, jobs):
        self._jobs = jobs

    def values(self):
        return list(self._jobs)

    @classmethod
    def load(cls, flt):
        return cls([j for j in cls.rows if j.id in flt.ids or getattr(j, "array_id", None) in flt.ids])

    @classmethod
    def modify(cls, flt, changes):
        if cls.modify_error is not None:
            raise cls.modify_error
        cls.modified.append((list(flt.ids), dict(changes.kw)))
        return list(flt.ids)


class FakeNode:
    table: dict = {}
    changes: list = []

    def __init__(self, name=None, **kw):
        self.name = name
        self.kw = kw

    @classmethod
    def load(cls, name):
        if name not in cls.table:
            raise RPCError(f"Node '{name}' does not exist")
        return cls.table[name]

    def modify(self, changes):
        FakeNode.changes.append((self.name, dict(changes.kw)))


def fake_pyslurm():
    FakeJobs.rows, FakeJobs.modified, FakeJobs.modify_error = [], [], None
    FakeNode.table, FakeNode.changes = {}, []
    db = types.SimpleNamespace(Jobs=FakeJobs, Job=FakeDbJob,
                               JobFilter=lambda ids: types.SimpleNamespace(ids=list(ids)))
    nodes = types.SimpleNamespace(load=lambda: types.SimpleNamespace(values=lambda: list(FakeNode.table.values())))
    return types.SimpleNamespace(db=db, Node=FakeNode, Nodes=nodes, RPCError=RPCError)


class RecordingCli(CliSlurm):
    """The wrapped CLI backend: records what was handed to it instead of running tools."""

    def __init__(self):
        super().__init__(slurm_bin="/nonexistent")
        self.calls: list = []

    def set_job_comment(self, job_id, field, text):
        self.calls.append(("set_job_comment", job_id, field, text))

    def sacct_job(self, job_id):
        self.calls.append(("sacct_job", job_id))
        return {"JobIDRaw": job_id, "State": "FAILED"}

    def show_node(self, node):
        self.calls.append(("show_node", node))
        return {"NodeName": node, "State": "IDLE"}

    def alloc_tres(self, raw_ids):
        self.calls.append(("alloc_tres", tuple(raw_ids)))
        return {j: "cpu=4,gres/gpu=2,node=1" for j in raw_ids}


def backend():
    cli = RecordingCli()
    b = pb.PyslurmSlurm(fake_pyslurm(), cli)
    b.isolate = False  # the stand-in records calls in this process
    return b, cli


def test_a_hung_accounting_call_is_given_up_after_the_timeout():
    """libslurm blocks in C while slurmdbd hangs: the call runs in a child that is killed."""
    b, _cli = backend()
    b.isolate, b.timeout = True, 0.5
    t0 = time.monotonic()
    with pytest.raises(SlurmUnavailable, match="no answer"):
        b._bounded("db.Jobs.load", lambda: time.sleep(30))
    assert time.monotonic() - t0 < 10
    # Near miss: an answer within the timeout comes back, errors typed as they were raised.
    assert b._bounded("db.Jobs.load", lambda: {"JobID": "7"}) == {"JobID": "7"}
    with pytest.raises(SlurmError, match="denied"):
        b._bounded("db.Jobs.modify", lambda: (_ for _ in ()).throw(SlurmError("denied")))


def finished_job(job_id=41, **kw):
    base = dict(state="FAILED", user_name="sattrtest", partition="debug", nodelist="n[1-2]", exit_code=1,
                exit_code_signal=0, derived_exit_code=0, derived_exit_code_signal=0, start_time=1764620000,
                end_time=1764620065, elapsed_time=65, time_limit=None, array_id=None, array_task_id=None,
                comment="Mixed Case; SATTR1: none - ok", admin_comment=None, cancelled_by=None)
    base.update(kw)
    return FakeDbJob(job_id, **base)


# -- versions ----------------------------------------------------------------------
def test_release_of_reads_both_numberings():
    assert pb.release_of("22.5.3") == (22, 5)
    assert pb.release_of("22.05.8") == (22, 5)
    assert pb.release_of("24.11.0") == (24, 11)
    # near misses: not a release at all
    assert pb.release_of("") is None
    assert pb.release_of("pyslurm") is None


def test_mismatched_release_is_not_used(monkeypatch):
    fake = fake_pyslurm()
    monkeypatch.setattr(pb, "_loaded", {})
    monkeypatch.setattr(pb, "_import", lambda conf, bin: (None, "pyslurm 24.11 does not match Slurm 22.5"))
    mod, why = pb.load("/etc/slurm/slurm.conf")
    assert mod is None and "does not match" in why
    # the same process with a matching one: used, and remembered with its slurm.conf
    monkeypatch.setattr(pb, "_loaded", {})
    monkeypatch.setattr(pb, "_import", lambda conf, bin: (fake, ""))
    assert pb.load("/a/slurm.conf") == (fake, "")
    mod, why = pb.load("/b/slurm.conf")
    assert mod is None and "/a/slurm.conf" in why


def installed_pyslurm(monkeypatch, version="22.5.3"):
    """find_spec/metadata say pyslurm is installed; importing it would fail the test."""
    import builtins
    import importlib.metadata
    import importlib.util
    real_import = builtins.__import__

    def guarded(name, *a, **k):
        assert not name.startswith("pyslurm"), "pyslurm imported although it must not be"
        return real_import(name, *a, **k)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object())
    monkeypatch.setattr(importlib.metadata, "version", lambda name: version)
    monkeypatch.setattr(builtins, "__import__", guarded)


def fake_sinfo(tmp_path, version):
    (tmp_path / "sinfo").write_text(f"#!/bin/sh\necho 'slurm-wlm {version}'\n")
    (tmp_path / "sinfo").chmod(0o755)
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=x\n")
    return str(conf)


def test_unreadable_slurm_conf_never_imports(monkeypatch, tmp_path):
    # libslurm's init exits the process on an unreadable config: pyslurm must not be imported.
    fake_sinfo(tmp_path, "22.05.8")
    installed_pyslurm(monkeypatch)
    mod, why = pb._import(str(tmp_path / "missing.conf"), str(tmp_path))
    assert mod is None and "not readable" in why


def test_other_slurm_release_never_imports(monkeypatch, tmp_path):
    conf = fake_sinfo(tmp_path, "24.11.5")
    installed_pyslurm(monkeypatch, "22.5.3")
    mod, why = pb._import(conf, str(tmp_path))
    assert mod is None and why == "pyslurm 22.5 does not match Slurm 24.11"
    assert pb.slurm_release(str(tmp_path), conf) == (24, 11)
    # near miss: no sinfo to ask is "unknown", never a match
    assert pb.slurm_release(str(tmp_path / "nowhere"), conf) is None


# -- job facts ----------------------------------------------------------------------
def test_sacct_row_has_the_cli_fields_and_formats():
    row = pb.sacct_row(finished_job())
    assert list(row) == list(SACCT_FIELDS)
    assert row["JobID"] == row["JobIDRaw"] == "41"
    assert row["State"] == "FAILED" and row["ExitCode"] == "1:0" and row["NodeList"] == "n[1-2]"
    assert row["Elapsed"] == "00:01:05" and row["Timelimit"] == "UNLIMITED"
    # no limit of its own (NO_VAL, the partition's applies): sacct -P prints nothing
    assert pb.sacct_row(finished_job(time_limit="PartitionLimit"))["Timelimit"] == ""
    # what the analysis takes from it is what it takes from `sacct -P`
    from_cli = dict(zip(SACCT_FIELDS, f"41|41|sattrtest|debug|n[1-2]|FAILED|1:0|0:0|{row['Start']}|{row['End']}|"
                                      "00:01:05|UNLIMITED".split("|")))
    a = jobstate.refresh_state({"job_id": "41"}, row)
    b = jobstate.refresh_state({"job_id": "41"}, from_cli)
    assert a == b and a["state"] == "FAILED" and a["nodes"] == ["n1", "n2"]


def test_sacct_row_cancelled_and_array_task(monkeypatch):
    import pwd
    root = pwd.getpwuid(0).pw_name
    row = pb.sacct_row(finished_job(57, state="CANCELLED", cancelled_by=root, array_id=55, array_task_id=2,
                                    nodelist=None, exit_code=0, exit_code_signal=15, time_limit=90))
    assert row["State"] == "CANCELLED by 0"
    assert row["JobID"] == "55_2" and row["JobIDRaw"] == "57"
    assert row["NodeList"] == "None assigned" and row["ExitCode"] == "0:15"
    assert row["Timelimit"] == "01:30:00"
    # near miss: a plain cancelled job with nobody recorded keeps the bare word
    assert pb.sacct_row(finished_job(58, state="CANCELLED"))["State"] == "CANCELLED"


def test_sacct_job_and_comments_through_db_jobs():
    b, cli = backend()
    FakeJobs.rows = [finished_job(41), finished_job(42, comment=None), finished_job(57, array_id=55, array_task_id=2)]
    assert b.sacct_job("41")["State"] == "FAILED"
    assert b.sacct_job("999") is None
    cli.calls.clear()
    got = b.job_comments(["41", "42", "999", "55_2"], "Comment")
    assert got == {"41": "Mixed Case; SATTR1: none - ok", "42": "", "999": None,
                   "55_2": "Mixed Case; SATTR1: none - ok"}
    assert cli.calls == []
    # a het-job component is not something pyslurm's filter takes: the CLI answers
    b.sacct_job("70+1")
    assert cli.calls == [("sacct_job", "70+1")]


# -- comment writes -------------------------------------------------------------------
def test_comment_write_keeps_case_and_field():
    b, cli = backend()
    b.set_job_comment("41", "Comment", "Mixed Case; SATTR1: gpu_hardware nodes=n2 - Xid 79")
    b.set_job_comment("41", "AdminComment", "SATTR1: none - ok")
    assert FakeJobs.modified == [([41], {"comment": "Mixed Case; SATTR1: gpu_hardware nodes=n2 - Xid 79"}),
                                 ([41], {"admin_comment": "SATTR1: none - ok"})]
    assert cli.calls == []


def test_comment_write_errors_are_typed(monkeypatch):
    b, _ = backend()
    FakeJobs.modify_error = RPCError("Nothing was modified")
    with pytest.raises(SlurmUnavailable, match="no record of job 41 yet"):
        b.set_job_comment("41", "Comment", "x")
    FakeJobs.modify_error = RPCError("Unable to contact slurm controller (connect failure)")
    with pytest.raises(SlurmUnavailable):
        b.set_job_comment("41", "Comment", "x")
    FakeJobs.modify_error = None
    def away(flt):
        raise RPCError("Failed to get Jobs from slurmdbd")
    monkeypatch.setattr(FakeJobs, "load", away)
    with pytest.raises(SlurmUnavailable):
        b.sacct_job("41")
    # near miss: a refusal is an error, not "try later"
    FakeJobs.modify_error = RPCError("Access/permission denied")
    with pytest.raises(SlurmError) as err:
        b.set_job_comment("41", "Comment", "x")
    assert not isinstance(err.value, SlurmUnavailable)


def test_binding_surprise_falls_back_to_cli_but_slurm_errors_do_not():
    b, cli = backend()
    FakeJobs.modify_error = TypeError("expected pyslurm.db.Job")
    b.set_job_comment("41", "Comment", "Mixed Case")
    assert cli.calls == [("set_job_comment", "41", "Comment", "Mixed Case")]
    # an array task's comment goes the CLI way from the start (pyslurm selects whole arrays)
    FakeJobs.modify_error = None
    b.set_job_comment("55_2", "Comment", "t")
    assert cli.calls[-1] == ("set_job_comment", "55_2", "Comment", "t") and FakeJobs.modified == []


# -- nodes -------------------------------------------------------------------------
def node(name, state, reason=None, user=None, when=None, parts=("debug",)):
    return types.SimpleNamespace(name=name, state=state, reason=reason, reason_user=user, reason_time=when,
                                 partitions=list(parts))


def test_node_record_reads_back_as_scontrol_would():
    when = 1764620000
    rec = pb.node_record(node("n2", "IDLE+DRAIN", "SATTR: gpu_hardware job 41", "root", when))
    st = NodeState.from_record(rec)
    assert st.name == "n2" and st.drained and st.ours and st.partitions == ("debug",)
    assert st.reason == "SATTR: gpu_hardware job 41" and st.reason_time == when
    # near miss: an idle node with no reason has no stamp and is in service
    st = NodeState.from_record(pb.node_record(node("n3", "IDLE")))
    assert not st.out_of_service and st.reason == "" and st.reason_time is None


def test_nodes_drain_resume_through_node_modify():
    b, cli = backend()
    FakeNode.table = {"n1": node("n1", "IDLE"), "n2": node("n2", "MIXED+DRAIN", "maintenance", "admin", 1)}
    assert [r["NodeName"] for r in b.nodes()] == ["n1", "n2"]
    # sinfo -R's rows: only nodes with a reason, with when it was set
    assert [(r.node, r.at, r.reason, r.ours) for r in b.reasons()] == [("n2", 1.0, "maintenance", False)]
    assert b.show_node("n2")["State"] == "MIXED+DRAIN"
    assert b.show_node("n9") is None
    b.drain("n1", "SATTR: gpu_hardware job 41")
    b.resume("n1")
    assert FakeNode.changes == [("n1", {"state": "DRAIN", "reason": "SATTR: gpu_hardware job 41"}),
                                ("n1", {"state": "RESUME"})]
    assert cli.calls == []


# -- selection ---------------------------------------------------------------------
def test_choose_cli_pyslurm_auto(monkeypatch):
    monkeypatch.setattr(pb, "load", lambda conf, bin: (None, "pyslurm is not installed"))
    got, why = select.choose("auto", "/usr/bin", "/etc/slurm/slurm.conf")
    assert isinstance(got, CliSlurm) and why == "pyslurm is not installed"
    with pytest.raises(SlurmError, match="pyslurm is not installed"):
        select.choose("pyslurm", "/usr/bin", "/etc/slurm/slurm.conf")
    fake = fake_pyslurm()
    monkeypatch.setattr(pb, "load", lambda conf, bin: (fake, ""))
    got, _ = select.choose("auto", "/usr/bin", "/etc/slurm/slurm.conf", comment_tool="/x/sattr-comment")
    assert isinstance(got, pb.PyslurmSlurm) and got.cli.comment_tool == "/x/sattr-comment"
    # near miss: "cli" never touches pyslurm, even where it would match
    got, why = select.choose("cli", "/usr/bin", "/etc/slurm/slurm.conf")
    assert isinstance(got, CliSlurm) and why == "configured"


def test_from_config_honours_slurm_backend(monkeypatch):
    fake = fake_pyslurm()
    monkeypatch.setattr(pb, "load", lambda conf, bin: (fake, ""))
    from slurm_attr.slurm import from_config
    assert isinstance(from_config(config.from_dict({"slurm": {"backend": "cli"}})), CliSlurm)
    assert isinstance(from_config(config.from_dict({})), pb.PyslurmSlurm)


def test_config_key_is_validated():
    assert config.from_dict({}).slurm.backend == "auto"
    with pytest.raises(ConfigError, match=r"\[slurm\] backend"):
        config.from_dict({"slurm": {"backend": "pyslurm25"}})


def test_pyslurm_extra_is_honest():
    # pyslurm>=25.11 would also take 26.x lines that cannot match the Slurm they run with:
    # the extra names one release line, as PySlurm versions them.
    import re
    from slurm_attr.config import tomllib
    with open(os.path.join(os.path.dirname(__file__), "..", "..", "pyproject.toml"), "rb") as f:
        extra = tomllib.load(f)["project"]["optional-dependencies"]["pyslurm"]
    assert len(extra) == 1 and re.fullmatch(r"pyslurm==\d+\.\d+\.\*", extra[0]), extra


def test_finished_jobs_rows_get_alloc_tres_from_the_cli_once_per_batch():
    """pyslurm's db.Job holds the TRES as ids only: the GPUs (fleet's GPU-hours) come from one
    `sacct -o JobIDRaw,AllocTRES` for the batch's finished jobs, none for a running one."""
    b, cli = backend()
    FakeJobs.rows = [finished_job(41), finished_job(42), finished_job(43, state="RUNNING")]
    rows = b.sacct_jobs(["41", "42", "43"])
    assert rows["41"]["AllocTRES"] == rows["42"]["AllocTRES"] == "cpu=4,gres/gpu=2,node=1"
    assert rows["43"]["AllocTRES"] == ""
    assert cli.calls == [("alloc_tres", ("41", "42"))]
