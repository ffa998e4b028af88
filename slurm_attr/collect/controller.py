"""The controller side of a job's bundle: job.json, output tails, scheduler lines.

Run from EpilogSlurmctld (while slurmctld still knows the job) and again by the
analysis once accounting has the final state: on 22.05 the job is COMPLETING
inside the hook and its final state word is not visible there yet.
"""
from __future__ import annotations

import json
import os
import pwd
import re
import stat
import time
from datetime import datetime
from typing import Any

from .. import safefs, spool
from ..errors import SlurmError, UnsafePath
from ..slurm.base import SlurmAccess
from ..slurm.hostlist import expand

FINAL_STATES = {"BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL",
                "OUT_OF_MEMORY", "PREEMPTED", "TIMEOUT"}
# Slurm's Reason words that give the state away while the job is still COMPLETING.
_REASON_STATE = {"TimeLimit": "TIMEOUT", "NodeDown": "NODE_FAIL", "OutOfMemory": "OUT_OF_MEMORY",
                 "Prolog": "FAILED", "JobLaunchFailure": "FAILED", "launch_failed_requeued_held": "FAILED",
                 "BadConstraints": "FAILED"}


def _epoch_iso(value: str | None) -> str | None:
    """Slurm's local 'YYYY-MM-DDTHH:MM:SS' as ISO 8601 with the local offset."""
    if not value or value in ("Unknown", "None", "N/A"):
        return None
    try:
        dt = datetime.strptime(value, "%Y-%m-%dT%H:%M:%S")
    except ValueError:
        return None
    return dt.astimezone().isoformat(timespec="seconds")


def _exit_pair(value: str | None) -> tuple[int | None, int | None]:
    m = re.match(r"^(\d+):(\d+)$", value or "")
    return (int(m.group(1)), int(m.group(2))) if m else (None, None)


def _user(value: str | None) -> tuple[str | None, int | None]:
    m = re.match(r"^([^()]*)\((\d+)\)$", value or "")
    if m:
        return m.group(1) or None, int(m.group(2))
    return (value or None), None


def derive_state(job_state: str | None, reason: str | None, exit_code: int | None,
                 signal: int | None, sacct_state: str | None) -> tuple[str | None, str]:
    """(state word, where it came from). Accounting's final word wins; then scontrol's;
    then what the exit status and Reason give away; None when nothing tells."""
    word = (sacct_state or "").split(" ")[0]
    if word in FINAL_STATES:
        return word, "sacct"
    if job_state in FINAL_STATES:
        return job_state, "scontrol"
    if reason in _REASON_STATE:
        return _REASON_STATE[reason], "reason"
    if signal == 9 and reason != "NonZeroExitCode":
        return "CANCELLED", "derived"
    if (exit_code or 0) != 0 or (signal or 0) != 0 or reason == "NonZeroExitCode":
        return "FAILED", "derived"
    # 0:0 with no Reason is either success or an scancel (22.05 shows both alike): undecided.
    return None, "unknown"


def job_facts(rec: dict[str, str], sacct: dict[str, str] | None = None) -> dict[str, Any]:
    """job.json from an `scontrol -o show job` record and, when present, the sacct row."""
    exit_code, sig = _exit_pair(rec.get("ExitCode"))
    user, uid = _user(rec.get("UserId"))
    job_id = rec.get("JobId", "")
    if rec.get("ArrayJobId") and rec.get("ArrayTaskId") and rec.get("ArrayTaskId") != "N/A":
        job_id = f"{rec['ArrayJobId']}_{rec['ArrayTaskId']}"
    state, state_source = derive_state(rec.get("JobState"), rec.get("Reason"), exit_code, sig,
                                       (sacct or {}).get("State"))
    facts: dict[str, Any] = {
        "job_id": job_id,
        "slurm_job_id": rec.get("JobId"),
        "name": rec.get("JobName"),
        "user": user,
        "uid": uid,
        "account": rec.get("Account"),
        "partition": rec.get("Partition"),
        "nodes": expand(rec.get("NodeList", "")),
        "start_time": _epoch_iso(rec.get("StartTime")),
        "end_time": _epoch_iso(rec.get("EndTime")),
        "exit_code": exit_code,
        "signal": sig,
        "state": state,
        "state_source": state_source,
        "reason": rec.get("Reason"),
        "time_limit": rec.get("TimeLimit"),
        "restart_count": int(rec.get("Restarts", "0") or 0),
        "num_tasks": int(rec["NumTasks"]) if rec.get("NumTasks", "").isdigit() else None,
        "batch": rec.get("BatchFlag") == "1",
        "stdout_path": rec.get("StdOut") or None,
        "stderr_path": rec.get("StdErr") or None,
    }
    return {k: v for k, v in facts.items() if v is not None}


def refresh_state(job: dict[str, Any], sacct: dict[str, str] | None) -> dict[str, Any]:
    """Take accounting's final state word and exit code once it has them."""
    if not sacct:
        return job
    word = (sacct.get("State") or "").split(" ")[0]
    if word in FINAL_STATES:
        job["state"] = word
        job["state_source"] = "sacct"
        ec, sig = _exit_pair(sacct.get("ExitCode"))
        if ec is not None:
            job["exit_code"], job["signal"] = ec, sig
        if sacct.get("State", "").startswith("CANCELLED by "):
            job["cancelled_by_uid"] = sacct["State"].split("by ", 1)[1]
        if not job.get("nodes") and sacct.get("NodeList"):
            job["nodes"] = expand(sacct["NodeList"])
    return job


def tail_output(path: str, uid: int | None, cap: int) -> tuple[bytes, str, str]:
    """Tail of a job's stdout/stderr file: (data, status, detail).

    The path is the user's choice and the file the user's: open it without
    following links and only if the job's user owns it, so a job cannot make
    root copy someone else's file into a bundle it can read.
    """
    if not path or not os.path.isabs(path):
        return b"", "missing", "no path"
    try:
        fd = safefs.open_file(os.path.dirname(path), os.path.basename(path))
    except UnsafePath as err:
        return b"", "missing", str(err)
    try:
        # The owner of the very file we read (fstat, not a second lookup by name).
        if uid is not None and os.fstat(fd).st_uid != uid:
            return b"", "error", f"{path} is not owned by the job's user"
        res = safefs.read_fd(fd, cap, tail=True)
    except OSError as err:
        return b"", "error", str(err)
    finally:
        os.close(fd)
    status = "truncated" if res.truncated else "ok"
    return res.data, status, f"kept last {len(res.data)} of {res.size} bytes" if res.truncated else ""


def _write(path: str, data: bytes) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def scheduler_lines(log_paths: list[str], slurm_job_id: str, cap: int) -> list[str]:
    """Lines of daemon logs about this job (JobId=N, StepId=N.x, job N), bounded per file."""
    pat = re.compile(rf"(?:JobId={slurm_job_id}\b|StepId={slurm_job_id}\.|\bjob[ _]?{slurm_job_id}\b|"
                     rf"\[{slurm_job_id}\.\w+\])", re.IGNORECASE)
    out: list[str] = []
    for path in log_paths:
        try:
            res = safefs.read_file(os.path.dirname(path) or "/", os.path.basename(path), cap, tail=True)
        except UnsafePath:
            continue
        name = os.path.basename(path)
        for raw in res.data.split(b"\n"):
            if slurm_job_id.encode() in raw:
                line = safefs.decode(raw[:4096])
                if pat.search(line):
                    out.append(f"{name}: {line}")
    return out


def write_controller_part(bundle_dir: str, job: dict[str, Any], output_cap: int,
                          log_paths: list[str] | None = None, log_cap: int = 16 << 20) -> dict[str, Any]:
    """job.json, output/stdout|stderr tails and scheduler/slurm.log in bundle_dir."""
    spool.ensure_dir(bundle_dir)
    coverage: dict[str, Any] = {}
    outdir = os.path.join(bundle_dir, "output")
    paths = {"stdout": job.get("stdout_path"), "stderr": job.get("stderr_path")}
    if paths["stderr"] == paths["stdout"]:
        paths["stderr"] = None  # one file for both: keep it once
    for name, path in paths.items():
        if not path:
            continue
        data, status, detail = tail_output(path, job.get("uid"), output_cap)
        coverage[name] = {"status": status, "bytes": len(data), "detail": detail}
        if data:
            spool.ensure_dir(outdir)
            _write(os.path.join(outdir, name), data)
    if log_paths and job.get("slurm_job_id"):
        lines = scheduler_lines(log_paths, str(job["slurm_job_id"]), log_cap)
        spool.ensure_dir(os.path.join(bundle_dir, "scheduler"))
        _write(os.path.join(bundle_dir, "scheduler", "slurm.log"), ("\n".join(lines) + "\n").encode())
        coverage["scheduler"] = {"status": "ok", "lines": len(lines)}
    job = dict(job)
    job["controller_collect"] = coverage
    _write(os.path.join(bundle_dir, "job.json"), json.dumps(job, indent=1).encode())
    return job


def user_name(uid: int | None) -> str | None:
    if uid is None:
        return None
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return None


def fetch_job(slurm: SlurmAccess, job_id: str) -> dict[str, Any] | None:
    """job.json facts from slurmctld (+ accounting when it answers); None if unknown."""
    rec = slurm.show_job(job_id)
    if rec is None:
        return None
    try:
        sacct = slurm.sacct_job(job_id)
    except SlurmError:
        sacct = None
    return job_facts(rec, sacct)


def wait_for_nodes(bundle_dir: str, nodes: list[str], deadline: float, poll: float = 0.2) -> list[str]:
    """Wait until every node's collect.json exists or the deadline passes; return the missing."""
    while True:
        missing = [n for n in nodes if not _is_file(os.path.join(bundle_dir, "nodes", n, "collect.json"))]
        if not missing or time.monotonic() >= deadline:
            return missing
        time.sleep(poll)


def _is_file(path: str) -> bool:
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False
