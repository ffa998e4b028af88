"""The catch-up from accounting (pipeline/catchup.py): one sacct for the jobs that ended in a bounded
window; those with no stored verdict, no pending record and none in flight are recorded as pending
with accounting's facts. Each positive case has its near miss beside it."""
import json
import os
import time

import pytest

from slurm_attr.config import load
from slurm_attr.errors import SlurmUnavailable
from slurm_attr.model import Verdict
from slurm_attr.pipeline import catchup, intake
from slurm_attr.slurm.cli import ENDED_FIELDS, CliSlurm, slurm_time
from slurm_attr.store import Store

NOW = time.time()


class Acct:
    """Accounting: the rows a window asks for (the real filter is sacct's; the catch-up checks
    again); counts its calls."""

    def __init__(self, rows=(), down=False):
        self.rows, self.down, self.asked = list(rows), down, []

    def ended_jobs(self, start, end):
        self.asked.append((start, end))
        if self.down:
            raise SlurmUnavailable("sacct: error: Problem talking to the database: Connection refused")
        return list(self.rows)


def row(raw, state="FAILED", ended=NOW - 300, started=None, job_id=None, nodes="n[1-2]", user="alice"):
    r = {k: "" for k in ENDED_FIELDS}
    r.update(JobID=job_id or raw, JobIDRaw=raw, User=user, Partition="gpu", NodeList=nodes, State=state,
             ExitCode="1:0" if state == "FAILED" else "0:0", Start=slurm_time(ended - 60 if started is None else started),
             End=slurm_time(ended) if ended else "Unknown", Elapsed="00:01:00", Timelimit="01:00:00",
             AllocTRES="cpu=2,gres/gpu=2,node=2", UID="1001", Account="proj")
    return r


@pytest.fixture
def cfg(tmp_path):
    c = load(None)
    c.intake.queue_dir = str(tmp_path / "q")
    c.paths.spool = str(tmp_path / "spool")
    c.paths.database = str(tmp_path / "db" / "sattr.db")
    return c


def stored(cfg, *job_ids, bundle=""):
    st = Store(cfg.paths.database)
    for j in job_ids:
        st.save({"job_id": j, "slurm_job_id": j, "state": "FAILED"}, Verdict(job_id=j, cause="user_error"),
                bundle_path=bundle)
    return st


def test_an_ended_job_nobody_recorded_is_recorded_with_accountings_facts(cfg):
    acct = Acct([row("101"), row("102", job_id="100_2", state="COMPLETED")])
    res = catchup.run(cfg, acct, now=NOW)
    assert sorted(res.recorded) == ["101", "102"] and res.ended == 2 and not res.error
    assert len(acct.asked) == 1  # one sacct for the run
    doc = intake.load(cfg, "101")
    job = doc["job"]
    assert job["job_id"] == "101" and job["state"] == "FAILED" and job["state_source"] == "sacct"
    assert job["exit_code"] == 1 and job["nodes"] == ["n1", "n2"] and job["uid"] == 1001 and job["gpus"] == 2
    assert job["user"] == "alice" and job["partition"] == "gpu" and job["account"] == "proj"
    assert job["facts_source"] == "sacct" and "stdout_path" not in job
    assert doc["since"] == pytest.approx(NOW - 300, abs=1) and doc["next_try"] <= time.time()
    assert "accounting" in doc["note"]
    # an array task: its own raw id is the key (as the hook keys it), A_T its job id
    assert intake.load(cfg, "102")["job"]["job_id"] == "100_2"
    assert sorted(d["key"] for d in intake.due(cfg)) == ["101", "102"]  # due now: `sattr retry` takes them


def test_a_job_with_a_stored_verdict_is_skipped(cfg):
    stored(cfg, "201")
    res = catchup.run(cfg, Acct([row("201"), row("202")]), now=NOW)
    assert res.recorded == ["202"] and res.skipped["stored"] == 1  # near miss: 202 has none
    assert intake.load(cfg, "201") is None


def test_a_requeued_jobs_later_attempt_is_recorded_when_only_an_earlier_one_is_stored(cfg):
    stored(cfg, "211", bundle=os.path.join(cfg.paths.spool, "bundles", "211"))
    os.makedirs(os.path.join(cfg.paths.spool, "bundles", "211.r1", "nodes"))
    os.makedirs(os.path.join(cfg.paths.spool, "bundles", "212.r1", "nodes"))
    stored(cfg, "212").save({"job_id": "212", "slurm_job_id": "212"}, Verdict(job_id="212"),
                            bundle_path=os.path.join(cfg.paths.spool, "bundles", "212.r1"))
    res = catchup.run(cfg, Acct([row("211"), row("212")]), now=NOW)
    assert res.recorded == ["211.r1"] and intake.load(cfg, "211.r1")["job"]["restart_count"] == 1
    assert res.skipped["stored"] == 1  # near miss: 212's stored verdict is of its attempt r1


def test_a_pending_or_in_flight_job_is_skipped(cfg):
    intake.record(cfg, "301", {"job_id": "301", "slurm_job_id": "301", "facts_source": "env"})
    os.makedirs(cfg.intake.queue_dir, exist_ok=True)
    open(os.path.join(cfg.intake.queue_dir, "302.env"), "wb").close()  # the front's record, not read yet
    intake.record(cfg, "304.r2", {"job_id": "304"})  # a requeue attempt of 304 in a worker's batch
    before = intake.load(cfg, "301")
    res = catchup.run(cfg, Acct([row("301"), row("302"), row("303"), row("304")]), now=NOW)
    assert res.recorded == ["303"] and res.skipped["pending"] == 3  # near miss: 303
    assert intake.load(cfg, "301") == before  # the hook's facts are left alone
    assert intake.load(cfg, "302") is None


def test_running_jobs_steps_parents_and_never_started_jobs_are_skipped(cfg):
    rows = [row("401", state="RUNNING", ended=0), row("402", job_id="402.batch"),
            row("403", job_id="400_[4-9]", state="CANCELLED by 0"),
            row("404", state="CANCELLED by 1001", started=0), row("405", state="TIMEOUT")]
    rows[3]["Start"] = "None"
    res = catchup.run(cfg, Acct(rows), now=NOW)
    assert res.recorded == ["405"]  # near miss: an ended job that ran
    assert res.skipped == {"running": 1, "not_a_job": 2, "never_started": 1}
    assert intake.load(cfg, "405")["job"]["state"] == "TIMEOUT"


def test_the_window_is_bounded_and_follows_the_mark(cfg):
    acct = Acct([row("501", ended=NOW - 7200), row("502", ended=NOW - 1800), row("503", ended=NOW - 5)])
    res = catchup.run(cfg, acct, now=NOW)
    start, end = acct.asked[0]
    assert start == pytest.approx(NOW - catchup.FIRST_S) and end == pytest.approx(NOW - cfg.intake.catchup_min_age_s)
    # 501 ended before the first window, 503 too recently (the hook's own): only 502
    assert res.recorded == ["502"] and res.skipped["outside_window"] == 2
    assert catchup.read_mark(cfg) == pytest.approx(end)
    # the next run starts at the mark minus the margin ...
    acct2 = Acct()
    catchup.run(cfg, acct2, now=NOW + 60)
    assert acct2.asked[0][0] == pytest.approx(end - catchup.MARGIN_S)
    # ... but never further back than catchup_window_s, however old the mark
    cfg.intake.catchup_window_s = 3600.0
    acct3 = Acct()
    catchup.run(cfg, acct3, now=NOW + 86400)
    assert acct3.asked[0][0] == pytest.approx(NOW + 86400 - 3600)


def test_the_hooks_grace_is_the_sites(cfg):
    rows = [row("601", ended=NOW - 30), row("602", ended=NOW - 3)]
    assert catchup.run(cfg, Acct(rows), now=NOW).recorded == []  # the default 60 s: both the hooks'
    cfg.intake.catchup_min_age_s = 10.0
    assert catchup.run(cfg, Acct(rows), now=NOW + 1).recorded == ["601"]  # near miss: 602 still its hook's


def test_the_cap_records_the_oldest_and_leaves_the_rest_to_the_next_run(cfg):
    cfg.intake.catchup_max_jobs = 2
    rows = [row(str(600 + i), ended=NOW - 1000 + i * 10) for i in range(5)]
    res = catchup.run(cfg, Acct(rows), now=NOW)
    assert res.recorded == ["600", "601"] and res.skipped["over_cap"] == 3
    assert catchup.read_mark(cfg) == pytest.approx(NOW - 1000 + 10, abs=1)  # the last recorded one's end
    res2 = catchup.run(cfg, Acct(rows), now=NOW + 60)
    assert res2.recorded == ["602", "603"] and res2.skipped["pending"] == 2
    # near miss: under the cap, everything at once
    cfg.intake.catchup_max_jobs = 10
    assert catchup.run(cfg, Acct(rows), now=NOW + 120).recorded == ["604"]


def test_accounting_down_records_nothing_and_keeps_the_mark(cfg):
    catchup.run(cfg, Acct(), now=NOW)
    mark = catchup.read_mark(cfg)
    res = catchup.run(cfg, Acct([row("701")], down=True), now=NOW + 60)
    assert res.recorded == [] and "accounting did not answer" in res.error and "Connection refused" in res.error
    assert catchup.read_mark(cfg) == mark and intake.keys(cfg) == set()
    # near miss: accounting back, the next run finds the job
    assert catchup.run(cfg, Acct([row("701")]), now=NOW + 120).recorded == ["701"]


def test_an_unreadable_store_records_nothing(cfg):
    def broken(_cfg):
        raise OSError("database is locked")
    res = catchup.run(cfg, Acct([row("801")]), now=NOW, open_store=broken)
    assert res.recorded == [] and "store unreadable" in res.error and catchup.read_mark(cfg) is None
    # near miss: a store that answers
    assert catchup.run(cfg, Acct([row("801")]), now=NOW, open_store=lambda c: stored(c)).recorded == ["801"]


def test_off_and_one_at_a_time(cfg):
    cfg.intake.catchup_window_s = 0
    acct = Acct([row("901")])
    assert catchup.run(cfg, acct, now=NOW).recorded == [] and acct.asked == []
    assert catchup.maybe_run(cfg, acct, now=NOW) == 0 and acct.asked == []
    cfg.intake.catchup_window_s = 21600.0
    import fcntl
    os.makedirs(cfg.intake.queue_dir, exist_ok=True)
    fd = os.open(os.path.join(cfg.intake.queue_dir, catchup.LOCK), os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        assert catchup.run(cfg, acct, now=NOW).error == "another catch-up is running" and acct.asked == []
    finally:
        os.close(fd)
    # near miss: the lock free; a worker's turn then waits EVERY_S
    assert catchup.maybe_run(cfg, acct, now=NOW) == 1 and len(acct.asked) == 1
    assert catchup.maybe_run(cfg, acct, now=NOW + 1) == 0 and len(acct.asked) == 1


def test_the_cli_backend_asks_one_sacct_for_the_window_and_reads_its_rows():
    calls = []

    class Rec(CliSlurm):
        def run(self, tool, *args):
            calls.append((tool, args))
            return "\n".join(["|".join(row("11").values()), "|".join(row("12", job_id="10_2").values()),
                              "12.batch|12|too|few"]) + "\n"
    got = Rec().ended_jobs(NOW - 3600, NOW)
    assert [r["JobIDRaw"] for r in got] == ["11", "12"] and got[1]["JobID"] == "10_2" and got[0]["UID"] == "1001"
    (tool, args), = calls
    assert tool == "sacct" and {"-a", "-X", "-P", "-n"} <= set(args)
    assert args[args.index("-S") + 1] == slurm_time(NOW - 3600) and args[args.index("-E") + 1] == slurm_time(NOW)
    assert args[args.index("-s") + 1] == "BF,CA,CD,DL,F,NF,OOM,PR,TO"  # final states only: never a running job
    assert args[args.index("-o") + 1] == ",".join(ENDED_FIELDS)
    assert json.dumps(got)  # plain rows


def test_jobs_that_ended_while_the_controller_side_was_off_are_left_alone(cfg):
    from slurm_attr.pipeline import ctldrecord

    acct = Acct([row("951", ended=NOW - 1200)])
    cfg.analysis.enabled = False
    res = catchup.run(cfg, acct, now=NOW - 1500)  # the timer while off: no question to accounting
    assert acct.asked == [] and "off" in res.error
    assert intake.off_until(cfg) == pytest.approx(time.time(), abs=5)
    os.utime(os.path.join(cfg.intake.queue_dir, intake.OFF_STAMP), (NOW - 1000, NOW - 1000))
    # a hook that finds the side off stamps the time (here: later than the job's end)
    ctldrecord.record_facts(cfg, {"SLURM_JOB_ID": "951"})
    assert intake.off_until(cfg) > NOW - 1000
    cfg.analysis.enabled = True
    res = catchup.run(cfg, Acct([row("951", ended=NOW - 1200), row("952", ended=NOW + 100)]), now=NOW + 400)
    assert res.recorded == ["952"] and res.skipped["outside_window"] == 1  # near miss: 952 ended after


def test_a_hook_stamps_only_the_file_the_catch_up_made(cfg):
    from slurm_attr.pipeline import ctldrecord

    cfg.analysis.enabled = False
    os.makedirs(cfg.intake.queue_dir)
    ctldrecord.record_facts(cfg, {"SLURM_JOB_ID": "961"})
    assert intake.off_until(cfg) is None and os.listdir(cfg.intake.queue_dir) == []
    cfg.analysis.enabled = True
    catchup.run(cfg, Acct(), now=NOW)  # near miss: a catch-up ran, the file is there (time 0: never off)
    assert intake.off_until(cfg) == 0.0


def test_a_row_it_cannot_read_fails_the_run_not_its_caller(cfg, monkeypatch):
    from slurm_attr.pipeline import settle

    def broken(row):
        raise ValueError("odd node list")
    monkeypatch.setattr(settle, "facts_from_row", broken)
    res = catchup.run(cfg, Acct([row("971")]), now=NOW)
    assert res.recorded == [] and res.error == "failed: ValueError: odd node list" and catchup.read_mark(cfg) is None
    monkeypatch.undo()  # near miss: the same row read
    assert catchup.run(cfg, Acct([row("971")]), now=NOW).recorded == ["971"]
