"""pyslurm's objects as the CLI backend's records (``sacct -P`` fields, ``scontrol -o`` keys), so
every caller and parser reads one shape whichever backend answered (pyslurm_backend.py)."""
from __future__ import annotations

import pwd
import time
from typing import Any

from .cli import SACCT_FIELDS


def _slurm_time(epoch: Any) -> str:
    """sacct's/scontrol's local ``YYYY-MM-DDTHH:MM:SS``; "Unknown" for no time."""
    if not epoch:
        return "Unknown"
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(int(epoch)))


def _duration(seconds: Any) -> str:
    """sacct's ``[D-]HH:MM:SS``."""
    s = int(seconds or 0)
    d, s = divmod(s, 86400)
    h, s = divmod(s, 3600)
    m, s = divmod(s, 60)
    return (f"{d}-" if d else "") + f"{h:02d}:{m:02d}:{s:02d}"


def _uid_of(name: Any) -> str:
    try:
        return str(pwd.getpwnam(str(name)).pw_uid)
    except (KeyError, TypeError):
        return str(name)


def attr(obj: Any, name: str) -> Any:
    """A pyslurm property; None where reading it raises (an unknown uid, an unset value)."""
    try:
        return getattr(obj, name)
    except (KeyError, ValueError, OverflowError):
        return None


def sacct_row(job: Any) -> dict[str, str]:
    """A pyslurm.db.Job as the CLI backend's ``sacct -P -X`` row (SACCT_FIELDS)."""
    jid = str(job.id)
    arr, task = attr(job, "array_id"), attr(job, "array_task_id")
    shown = f"{arr}_{task}" if arr and task is not None else jid
    state = str(attr(job, "state") or "")
    if state == "CANCELLED":
        by = attr(job, "cancelled_by")
        if by:
            state = f"CANCELLED by {_uid_of(by)}"
    limit = attr(job, "time_limit")
    row = {
        "JobID": shown, "JobIDRaw": jid,
        "User": str(attr(job, "user_name") or ""), "Partition": str(attr(job, "partition") or ""),
        "NodeList": str(attr(job, "nodelist") or "None assigned"), "State": state,
        "ExitCode": f"{attr(job, 'exit_code') or 0}:{attr(job, 'exit_code_signal') or 0}",
        "DerivedExitCode": f"{attr(job, 'derived_exit_code') or 0}:{attr(job, 'derived_exit_code_signal') or 0}",
        "Start": _slurm_time(attr(job, "start_time")), "End": _slurm_time(attr(job, "end_time")),
        "Elapsed": _duration(attr(job, "elapsed_time")),
        # No limit of its own (NO_VAL): sacct -P prints nothing; INFINITE: UNLIMITED.
        "Timelimit": ("" if limit == "PartitionLimit" else
                      "UNLIMITED" if limit is None else _duration(int(limit) * 60)),
        "AllocTRES": "",  # filled by PyslurmSlurm._with_tres
    }
    return {k: row[k] for k in SACCT_FIELDS}


def node_record(node: Any) -> dict[str, str]:
    """A pyslurm.Node as the ``scontrol -o show node`` keys the callers read."""
    reason = str(attr(node, "reason") or "")
    if reason:
        # scontrol's "Reason=text [user@time]": slurmstate.NodeState reads the stamp back.
        who, when = attr(node, "reason_user"), attr(node, "reason_time")
        if who or when:
            reason = f"{reason} [{who or 'unknown'}@{_slurm_time(when)}]"
    return {"NodeName": str(node.name), "State": str(attr(node, "state") or ""),
            "Reason": reason, "Partitions": ",".join(attr(node, "partitions") or [])}
