"""``on_hang = cancel`` cancels the job that hung, exactly (issue 21 item 4): the raw id is re-read
from slurmctld and checked, and an array task is scancelled as ARRAYJOBID_TASKID, never the array.

scontrol and scancel are faked at CliSlurm.run (the real show_job picks the record out of an
array's listing, as it does on the cluster); the lines are 22.05's ``scontrol -o show job``."""
from __future__ import annotations

import time
from datetime import datetime

import pytest

from slurm_attr.config import Config
from slurm_attr.errors import SlurmUnavailable
from slurm_attr.live.prekill import exchange as prekill
from slurm_attr.slurm import pyslurm_backend as pb
from slurm_attr.slurm.cancel import CancelRefused, cancel_target
from slurm_attr.slurm.cli import CliSlurm

STARTED = time.time()  # when the watcher started
BEFORE = datetime.fromtimestamp(STARTED - 30).strftime("%Y-%m-%dT%H:%M:%S")  # the job's StartTime


def _line(job_id, state="RUNNING", user="alice(1001)", start=BEFORE, array=None, task=None):
    arr = f"ArrayJobId={array} ArrayTaskId={task} " if array else ""
    return (f"JobId={job_id} {arr}JobName=arr UserId={user} GroupId=alice(1001) MCS_label=N/A Priority=1 "
            f"Nice=0 Account=(null) QOS=normal JobState={state} Reason=None Dependency=(null) Requeue=1 "
            f"Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0 RunTime=00:00:30 TimeLimit=00:05:00 TimeMin=N/A "
            f"SubmitTime={BEFORE} EligibleTime={BEFORE} StartTime={start} EndTime=Unknown "
            f"Partition=live NodeList=n1 BatchHost=n1 NumNodes=1 NumCPUs=1 NumTasks=1 WorkDir=/tmp")


# `scontrol -o show job 465` of array 465 (tasks 1-6): task 6 ran last from the meta record and
# carries its id; tasks 1-5 got ids 466-470. Every task is listed for the array's id.
ARRAY = [_line(465 + t, array=465, task=t) for t in range(1, 6)] + [_line(465, array=465, task=6)]


class Scontrol(CliSlurm):
    """CliSlurm with scontrol answered from ``listing`` and every scancel recorded, not run."""

    def __init__(self, listing):
        super().__init__(slurm_bin="/opt/slurm/bin")
        self.listing = listing
        self.ran: list[list[str]] = []

    def run(self, tool, *args):
        self.ran.append([tool, *args])
        if tool == "scontrol":
            return "\n".join(self.listing) + "\n"
        return ""

    def scancels(self):
        return [r[1:] for r in self.ran if r[0] == "scancel"]


def test_the_array_task_carrying_the_array_id_is_cancelled_as_that_task():
    s = Scontrol(ARRAY)
    assert s.cancel_job("465", 1001, STARTED) == "465_6"
    assert s.ran == [["scontrol", "-o", "show", "job", "465"], ["scancel", "465_6"]]


def test_another_array_task_by_its_own_id_is_named_as_its_task():
    s = Scontrol([_line(468, array=465, task=3)])
    assert s.cancel_job("468", 1001, STARTED) == "465_3" and s.scancels() == [["465_3"]]


def test_a_plain_job_is_cancelled_by_its_id():
    s = Scontrol([_line(81)])
    assert s.cancel_job("81", 1001, STARTED) == "81" and s.scancels() == [["81"]]
    na = Scontrol([_line(82).replace("JobName=", "ArrayTaskId=N/A JobName=")])
    assert na.cancel_job("82", 1001, STARTED) == "82"


@pytest.mark.parametrize("job, listing, why", [
    ("465", [_line(465, state="COMPLETING", array=465, task=6)], "is COMPLETING, not RUNNING"),
    ("465", [_line(465, state="PENDING", array=465, task="6-9")], "is PENDING, not RUNNING"),
    ("81", [_line(81, user="bob(1002)")], "runs as bob\\(1002\\), not uid 1001"),
    ("81", [_line(81, start=datetime.fromtimestamp(STARTED + 60).strftime("%Y-%m-%dT%H:%M:%S"))],
     "not before the watcher"),
    ("81", [_line(81, start="Unknown")], "started at Unknown"),
    ("81", [_line(466, array=465, task=1)], "answered for job 81 with job '466'"),  # show_job's fallback
    ("81", [], "no longer knows job 81"),
])
def test_near_misses_send_no_scancel(job, listing, why):
    s = Scontrol(listing)
    with pytest.raises(CancelRefused, match=why):
        s.cancel_job(job, 1001, STARTED)
    assert s.scancels() == []


def test_an_array_meta_record_or_an_unknown_user_is_refused():
    with pytest.raises(CancelRefused, match="not one task"):  # a range is the array, never a task
        cancel_target({"JobId": "465", "JobState": "RUNNING", "UserId": "alice(1001)", "StartTime": BEFORE,
                       "ArrayJobId": "465", "ArrayTaskId": "5-6"}, "465", 1001, STARTED)
    with pytest.raises(CancelRefused, match="not uid None"):
        cancel_target({"JobId": "81", "JobState": "RUNNING", "UserId": "alice(1001)", "StartTime": BEFORE},
                      "81", None, STARTED)
    with pytest.raises(CancelRefused, match="not a raw job id"):
        cancel_target({"JobId": "465_6"}, "465_6", 1001, STARTED)


def test_the_pyslurm_backend_cancels_through_the_same_checks():
    cli = Scontrol(ARRAY)
    b = pb.PyslurmSlurm(object(), cli)
    assert b.cancel_job("465", 1001, STARTED) == "465_6" and cli.scancels() == [["465_6"]]


# ---- the leader's cancel ------------------------------------------------------------------
def _res():
    """The dumps agree: a collective enqueued and not completed."""
    return [{"node": "n1", "ranks": {"0": {"fr": {"pg": {"0": [4, 3]}}, "stack": {"at": "x", "inner": "y"}}}}]


def _leader(tmp_path, listing, **kw):
    cfg = Config()
    cfg.live.on_hang, cfg.live.ras = "cancel", "off"
    s = Scontrol(listing)
    return prekill.LeaderDumps(cfg, "465", "0", str(tmp_path), 1, gpus=1, slurm=s, **kw), s


def test_leader_cancels_the_hung_task_and_names_it(tmp_path):
    ld, s = _leader(tmp_path, ARRAY, uid=1001, started=STARTED)
    c = ld.cancel({"source": "summary", "class": "H1", "what": "never entered AllReduce #9"}, _res())
    assert c["done"] is True and c["target"] == "465_6" and s.scancels() == [["465_6"]]


def test_leader_learns_the_users_uid_from_slurm_at_its_start(tmp_path):
    ld, s = _leader(tmp_path, ARRAY)
    ld._show = lambda j: s.show_job(j)
    ld.facts()
    for _ in range(200):  # the lookup runs in its own thread
        if ld.uid is not None:
            break
        time.sleep(0.01)
    assert ld.uid == 1001
    c = ld.cancel({"source": "summary"}, _res())
    assert c["done"] is True and c["target"] == "465_6"


def test_leader_refuses_and_says_why_when_the_job_is_not_the_one_it_watched(tmp_path):
    ld, s = _leader(tmp_path, [_line(465, user="bob(1002)", array=465, task=6)], uid=1001, started=STARTED)
    c = ld.cancel({"source": "summary"}, _res())
    assert c["done"] is False and "target" not in c and s.scancels() == []
    assert c["refused"] == "job 465 runs as bob(1002), not uid 1001"
    # and a Slurm that does not answer is an error, not a cancel
    ld2, s2 = _leader(tmp_path, ARRAY, uid=1001, started=STARTED)

    def timeout(tool, *args):
        raise SlurmUnavailable("scontrol timed out after 15s")

    s2.run = timeout
    c2 = ld2.cancel({"source": "summary"}, _res())
    assert c2["done"] is False and c2["error"] == "scontrol timed out after 15s"


def test_leader_withholds_the_cancel_while_the_named_rank_is_busy(tmp_path):
    busy = {"why": "rank 0: checkpoint at train.py:90 in save_checkpoint, counters moving"}
    ld, s = _leader(tmp_path, ARRAY, uid=1001, started=STARTED, busy=lambda f: busy["why"])
    c = ld.cancel({"source": "summary", "class": "H1", "what": "never entered AllReduce #9"}, _res())
    assert c == {"done": False, "why": "withheld: busy, not stuck (rank 0: checkpoint at train.py:90 in "
                                       "save_checkpoint, counters moving)"}
    assert s.scancels() == []
    busy["why"] = None  # its counters stopped: the same finding is cancelled
    c = ld.cancel({"source": "summary", "class": "H1", "what": "never entered AllReduce #9"}, _res())
    assert c["done"] is True and s.scancels() == [["465_6"]]
