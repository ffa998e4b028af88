"""Stage: settle the ended job's facts before the analysis: its bundle's job.json, and its final
state from accounting (slurmctld's word while accounting is down).

On 22.05 EpilogSlurmctld cannot see the final state word (the job is COMPLETING there); accounting
writes it asynchronously, seconds after the end. A job nothing can tell the state of yet is not
stored as `unknown`: AccountingPending leaves it in the intake for a later attempt.
"""
from __future__ import annotations

import json
import logging
import os
import pwd
import re
import time
from typing import Any

from ..collect import jobstate
from ..errors import SattrError, SlurmError
from ..slurm.hostlist import expand
from ..slurm.base import SlurmAccess
from ..waiting import wait_until

log = logging.getLogger("slurm_attr")

# Accounting writes are asynchronous: the final state can lag the job's end by seconds.
SACCT_SETTLE_S = 10.0


def read_job_json(bundle_dir: str) -> dict[str, Any]:
    try:
        with open(os.path.join(bundle_dir, "job.json"), "rb") as f:
            data = json.loads(f.read(1 << 20))
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


class AccountingPending(SattrError):
    """Nothing tells the job's final state yet (accounting down, slurmctld undecided): not stored,
    the intake keeps the job and it is re-analysed once accounting answers."""


def _from_slurmctld(slurm: SlurmAccess, job: dict[str, Any], raw: str) -> dict[str, Any]:
    """slurmctld's final state word (it keeps a finished job for MinJobAge) when accounting is down."""
    if job.get("state_source") in ("sacct", "scontrol"):
        return job
    try:
        rec = slurm.show_job(raw)
    except SlurmError:
        return job
    if not rec:
        return job
    facts = jobstate.job_facts(rec)
    if facts.get("state_source") == "scontrol" and facts.get("state"):
        job = dict(job)
        for k in ("state", "state_source", "exit_code", "signal", "end_time"):
            if facts.get(k) is not None:
                job[k] = facts[k]
    return job


def settle_state(slurm: SlurmAccess, job: dict[str, Any], deadline: float) -> tuple[dict[str, Any], str]:
    """(job with the best final state there is, accounting's error or '').

    Accounting's final word wins; while it is down, or still without a final state at the
    deadline (slurmdbd catching up after an outage), slurmctld's final word is taken."""
    raw = str(job.get("slurm_job_id") or job.get("job_id", ""))

    def ask() -> tuple[dict[str, Any], SlurmError | None]:
        nonlocal job
        try:
            row = slurm.sacct_job(raw)
        except SlurmError as err:
            log.info("job %s: accounting not answering (%s); asking slurmctld", raw, err)
            job = _from_slurmctld(slurm, job, raw)
            return job, err
        job = jobstate.refresh_state(job, row)
        return job, None

    def settled(got: tuple[dict[str, Any], SlurmError | None]) -> bool:
        # Down: slurmctld's final word will do. Up: only accounting's own.
        return got[0].get("state_source") == ("scontrol" if got[1] is not None else "sacct")

    # A controller that does not answer is asked again less often than one that is catching up.
    got = wait_until(ask, deadline - time.monotonic(), lambda got: 1.0 if got[1] is not None else 0.5,
                     f"accounting's final state of job {raw}", done=settled)
    job, err = got.value
    if err is not None:
        return job, str(err)[:300]
    return (job, "") if got.ok else (_from_slurmctld(slurm, job, raw), "")


_TASK_ID = re.compile(r"\d{1,12}_\d{1,9}")


def _uid(row: dict[str, str]) -> int | None:
    uid = row.get("UID") or ""
    if uid.isdigit():
        return int(uid)
    try:  # the batch rows (SACCT_FIELDS) name the user only
        return pwd.getpwnam(row.get("User") or "").pw_uid
    except (KeyError, ValueError):
        return None


def facts_from_row(row: dict[str, str]) -> dict[str, Any]:
    """A job's facts from its accounting row alone, in the shape the hook records them
    (collect.jobstate.facts_from_env): for a job the hook never recorded (catchup.py) or whose
    record was torn. No output paths: sacct (22.05) has none, and a guessed one could name
    another file; ``facts_source`` is "sacct"."""
    raw, shown = row.get("JobIDRaw") or "", row.get("JobID") or ""
    nodes = row.get("NodeList") or ""
    facts: dict[str, Any] = {
        "job_id": shown if _TASK_ID.fullmatch(shown) else raw,
        "slurm_job_id": raw,
        "user": row.get("User") or None,
        "uid": _uid(row),
        "account": row.get("Account") or None,
        "partition": row.get("Partition") or None,
        "nodes": [] if nodes in ("", "None assigned") else expand(nodes),
        "start_time": jobstate.epoch_iso(row.get("Start")),
        "end_time": jobstate.epoch_iso(row.get("End")),
        "time_limit": row.get("Timelimit") or None,
        "facts_source": "sacct",
    }
    return jobstate.refresh_state({k: v for k, v in facts.items() if v is not None}, row)


def facts_from_accounting(slurm: SlurmAccess, facts: dict[str, Any]) -> dict[str, Any]:
    """A torn record's facts (its key only) completed from accounting's row: the batch's
    (one sacct per batch, slurm.batched) or a call of its own. Accounting without the job keeps
    the key's facts (the analysis says what is missing); SlurmError when accounting is down."""
    raw = str(facts.get("slurm_job_id") or facts.get("job_id") or "")
    row = slurm.sacct_job(raw)
    if not row:
        return facts
    got = facts_from_row(row)
    if facts.get("restart_count") is not None:
        got["restart_count"] = facts["restart_count"]
    return got
