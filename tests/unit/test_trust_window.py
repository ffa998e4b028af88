"""Issue 10 item 1: the job's kernel window comes from a source the job cannot change."""
import os
import time
from datetime import datetime

import pytest

from slurm_attr.collect import window
from slurm_attr.collect.node import NodeJob, collect_node, read_kernel

# A real 22.05.8 `scontrol -o show job` record (test cluster), times filled in per test.
RECORD = ("JobId={id} JobName={name} UserId=alice(1001) GroupId=alice(1001) MCS_label=N/A Priority=4294901759 "
          "Nice=0 Account=root QOS=normal JobState=COMPLETING Reason=None Dependency=(null) Requeue=1 Restarts=0 "
          "BatchFlag=1 Reboot=0 ExitCode=0:0 RunTime={run} TimeLimit=UNLIMITED TimeMin=N/A "
          "SubmitTime={start} EligibleTime={start} AccrueTime=Unknown StartTime={start} EndTime={end} "
          "Deadline=N/A SuspendTime=None SecsPreSuspend=0 LastSchedEval={start} Scheduler=Main Partition=debug "
          "NodeList=n2 BatchHost=n2 NumNodes=1 NumCPUs=1 NumTasks=1 Comment={comment} "
          "StdErr=/work/x.out StdIn=/dev/null StdOut=/work/x.out Power=")


def _slurm(t: float) -> str:
    return datetime.fromtimestamp(t).strftime("%Y-%m-%dT%H:%M:%S")


def _record(job_id="77", start=None, end=None, name="train", comment="(null)", run="00:01:40"):
    now = time.time()
    start = now - 100 if start is None else start
    end = now if end is None else end
    return RECORD.format(id=job_id, name=name, run=run, start=_slurm(start), end=_slurm(end), comment=comment)


def test_scontrol_start_is_read_from_the_daemon_fields():
    start = time.time() - 100
    got, elapsed, why = window.scontrol_start(_record(start=start), "77")
    assert got == pytest.approx(int(start), abs=1) and elapsed == 100 and why == "scontrol StartTime"


def test_scontrol_start_imitated_in_the_comment_is_refused():
    # Near miss of the above: the comment repeats the time fields with a start an hour earlier.
    fake = "x SubmitTime={0} EligibleTime={0} AccrueTime=Unknown StartTime={0} EndTime={0} Deadline=N/A".format(
        _slurm(time.time() - 3600))
    got, _elapsed, why = window.scontrol_start(_record(comment=fake), "77")
    assert got is None and "imitates" in why


def test_scontrol_record_of_another_job_is_not_used():
    got, _, why = window.scontrol_start(_record(job_id="770"), "77")
    assert got is None and "0 records" in why


def test_resolve_prefers_a_trusted_start_and_never_looks_back_a_day():
    end = time.time()
    w = window.resolve("77", end, 120, show_job=lambda j: _record(start=end - 100, end=end))
    assert w.trusted_start and w.start_source == "scontrol" and end - w.start == pytest.approx(100, abs=1.5)
    env = window.resolve("77", end, 120, env_start=end - 50, show_job=lambda j: 1 / 0)
    assert env.start_source == "env" and env.start == end - 50  # slurmctld not asked at all


def test_resolve_without_a_trusted_start_reads_only_the_slack_and_says_so():
    end = time.time()
    w = window.resolve("77", end, 120, show_job=lambda j: None)
    assert not w.trusted_start and w.start == end and "only the 120s" in w.detail
    # Elapsed time known but the start field unusable: the elapsed time, still flagged.
    bad = _record(start=end - 30).replace("StartTime=", "StartTime=Unknown X=")
    w2 = window.resolve("77", end, 120, show_job=lambda j: bad)
    assert w2.start_source == "elapsed" and w2.start == end - 100 and not w2.trusted_start


def test_rank_map_ctime_counts_only_when_root_owned(tmp_path):
    root = tmp_path / "ev"
    root.mkdir(mode=0o755)
    os.chmod(root, 0o755)
    (root / "77.ranks.0.0").write_text("0 0 0 n1\n")
    if os.geteuid() != 0:
        pytest.skip("needs root to own the rank map")
    assert window.rankmap_start(str(root), "77") is not None
    os.chown(root / "77.ranks.0.0", 1234, 1234)  # near miss: same name, not written by root
    assert window.rankmap_start(str(root), "77") is None


@pytest.fixture
def cfg(cfg):  # tests/conftest.py's, with two minutes of slack around the job's window
    cfg.collect.window_slack_s = 120
    return cfg


def _kline(t: float, msg: str) -> str:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(t))
    return f"{stamp[:-2]}:{stamp[-2:]} h kernel: {msg}\n"


XID79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid=2331, GPU has fallen off the bus."


def test_opted_out_job_reads_its_own_window_not_an_hour_old_xid(cfg, tmp_path):
    now = time.time()
    (tmp_path / "kern-n2.log").write_text(_kline(now - 3600, XID79))
    job = NodeJob(job_id="77", node="n2", bundle_key="77", opted_out=True, end=now,
                  show_job=lambda j: _record(start=now - 5, end=now))
    win, _ = read_kernel(cfg, job, time.monotonic() + 10)
    assert win.text == b"" and win.span["start_source"] == "scontrol"
    # Near miss: the same Xid written during the job is in the window, opted out or not.
    with open(tmp_path / "kern-n2.log", "a") as f:
        f.write(_kline(now - 2, XID79))
    win, _ = read_kernel(cfg, job, time.monotonic() + 10)
    assert win.text.count(b"Xid") == 1


def test_collect_json_records_the_window_and_a_fallback_as_coverage(cfg, tmp_path):
    (tmp_path / "kern-n2.log").write_text("")
    doc = collect_node(cfg, NodeJob(job_id="78", node="n2", bundle_key="78", show_job=lambda j: None))
    assert doc["window"]["trusted_start"] is False
    assert doc["sources"]["window"]["status"] == "truncated"
    assert doc["provenance"]["kernel"]["trusted"] is True and doc["provenance"]["fr"]["trusted"] is False
