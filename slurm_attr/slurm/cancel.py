"""Which id to hand scancel for a hung job, checked against slurmctld's fresh record.

Pure: no Slurm here (the backends read the record and run scancel), so the checks are
unit-tested on records alone.
"""
from __future__ import annotations

import re
from datetime import datetime

from ..errors import SlurmError

# slurmctld stamps StartTime on its clock, the watcher its start on the node's: NTP keeps them
# within this. A requeued run of the same id starts far later (its old run ended first).
START_SKEW_S = 2.0
_UID = re.compile(r"^[^()]*\((\d+)\)$")


class CancelRefused(SlurmError):
    """cancel_job sent nothing: the id no longer names the running job it was asked for."""


def _slurm_epoch(value: str | None) -> float | None:
    """scontrol's local ``YYYY-MM-DDTHH:MM:SS`` as epoch seconds; None for Unknown/None."""
    try:
        return datetime.strptime(value or "", "%Y-%m-%dT%H:%M:%S").timestamp()
    except ValueError:
        return None


def cancel_target(rec: dict[str, str] | None, job_id: str, uid: int | None, started: float) -> str:
    """What to hand scancel for raw job ``job_id``, from slurmctld's record of it read just now.

    A raw id is not a safe scancel argument: the array task that carries its ArrayJobId as its
    own id (task 465_6 with JobId 465) takes every task of the array with it. So the record
    must be that id's own (``show_job`` picks it out of an array's listing), RUNNING, the
    user's the watcher was started for, and not started after the watcher was (a later run of
    the id: a requeue); then an array task is named ``ARRAYJOBID_TASKID``, anything else by
    its id. Raises CancelRefused saying which check failed."""
    if not job_id.isdigit():
        raise CancelRefused(f"{job_id!r} is not a raw job id")
    if not rec:
        raise CancelRefused(f"slurmctld no longer knows job {job_id}")
    if rec.get("JobId") != job_id:
        raise CancelRefused(f"slurmctld answered for job {job_id} with job {rec.get('JobId')!r}")
    state = rec.get("JobState", "")
    if state != "RUNNING":
        raise CancelRefused(f"job {job_id} is {state or 'in no state'}, not RUNNING")
    m = _UID.match(rec.get("UserId", ""))
    if uid is None or m is None or int(m.group(1)) != uid:
        raise CancelRefused(f"job {job_id} runs as {rec.get('UserId') or 'nobody'}, not uid {uid}")
    start = _slurm_epoch(rec.get("StartTime"))
    if start is None or start > started + START_SKEW_S:
        when = datetime.fromtimestamp(started).isoformat(timespec="seconds")
        raise CancelRefused(f"job {job_id} started at {rec.get('StartTime')}, not before the watcher ({when})")
    task, array = rec.get("ArrayTaskId", ""), rec.get("ArrayJobId", "")
    if not task or task == "N/A":
        return job_id
    if not (task.isdigit() and array.isdigit()):
        raise CancelRefused(f"job {job_id} is array record {array}_{task}, not one task")
    return f"{array}_{task}"
