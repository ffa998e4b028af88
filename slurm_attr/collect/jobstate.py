"""The job's facts from Slurm's own words: EpilogSlurmctld's environment, `scontrol show job`
records and sacct rows, exit pairs, state words.

Kept apart from controller.py (the bundle's controller part) so that the hook, which records a
job from its environment thousands of times a minute in a burst, imports only this.
"""
from __future__ import annotations

import os
import re
from datetime import datetime
from typing import Any

from ..slurm.base import FINAL_STATES
from ..slurm.hostlist import expand

# Slurm's Reason words that give the state away while the job is still COMPLETING.
_REASON_STATE = {"TimeLimit": "TIMEOUT", "NodeDown": "NODE_FAIL", "OutOfMemory": "OUT_OF_MEMORY",
                 "Prolog": "FAILED", "JobLaunchFailure": "FAILED", "launch_failed_requeued_held": "FAILED",
                 "BadConstraints": "FAILED"}


def exit_pair(value: str | None) -> tuple[int | None, int | None]:
    m = re.match(r"^(\d+):(\d+)$", value or "")
    return (int(m.group(1)), int(m.group(2))) if m else (None, None)


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


def facts_from_env(env: dict[str, str]) -> dict[str, Any]:
    """job.json facts from EpilogSlurmctld's own environment: no RPC to slurmctld.

    slurmctld hands the hook the job id (array task too), user, uid, partition, account, name,
    allocation, exit status, work dir and output patterns (22.05 onwards; checked on the test
    cluster). The final state word is not there: the analysis settles it from accounting.
    Every value is trusted (slurmctld's), except that name and paths are the user's words."""
    raw = env.get("SLURM_JOB_ID", "")
    arr, task = env.get("SLURM_ARRAY_JOB_ID", ""), env.get("SLURM_ARRAY_TASK_ID", "")
    exit_code, sig = exit_pair(env.get("SLURM_JOB_EXIT_CODE2"))
    state, state_source = derive_state(None, None, exit_code, sig, None)
    uid = env.get("SLURM_JOB_UID", "")
    facts: dict[str, Any] = {
        "job_id": f"{arr}_{task}" if arr.isdigit() and task.isdigit() else raw,
        "slurm_job_id": raw,
        "name": env.get("SLURM_JOB_NAME"),
        "user": env.get("SLURM_JOB_USER"),
        "uid": int(uid) if uid.isdigit() else None,
        "account": None if env.get("SLURM_JOB_ACCOUNT") in (None, "", "(null)") else env["SLURM_JOB_ACCOUNT"],
        "partition": env.get("SLURM_JOB_PARTITION"),
        "nodes": expand(env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or ""),
        "start_time": _env_time(env.get("SLURM_JOB_START_TIME")),
        "end_time": _env_time(env.get("SLURM_JOB_END_TIME")),
        "exit_code": exit_code,
        "signal": sig,
        "state": state,
        "state_source": state_source,
        "restart_count": int(env["SLURM_JOB_RESTART_COUNT"]) if env.get("SLURM_JOB_RESTART_COUNT", "").isdigit() else None,
        # Only batch jobs have an stdin/stdout of slurmctld's choosing (interactive output is srun's).
        "batch": "SLURM_JOB_STDIN" in env,
        "facts_source": "env",
    }
    if facts["batch"]:
        out = env.get("SLURM_JOB_STDOUT") or _default_output(env, arr, task)
        err = env.get("SLURM_JOB_STDERR") or out
        # 22.05 hands the hook absolute paths; 26.05 the pattern as given (slurm-%j.out): relative
        # to the job's work dir, as sbatch opens it.
        work = env.get("SLURM_JOB_WORK_DIR") or "/"
        facts["stdout_path"] = os.path.join(work, expand_output_path(out, facts, arr, task))
        facts["stderr_path"] = os.path.join(work, expand_output_path(err, facts, arr, task))
    return {k: v for k, v in facts.items() if v is not None}


def _env_time(value: str | None) -> str | None:
    if not value or not value.isdigit():
        return None
    return datetime.fromtimestamp(int(value)).astimezone().isoformat(timespec="seconds")


def _default_output(env: dict[str, str], arr: str, task: str) -> str:
    # sbatch without -o: slurm-%j.out (slurm-%A_%a.out for an array task) in the work dir.
    name = "slurm-%A_%a.out" if arr and task else "slurm-%j.out"
    return os.path.join(env.get("SLURM_JOB_WORK_DIR") or "/", name)


_PATTERN = re.compile(r"%(\d{0,2})([%AaJjNnstux])")


def expand_output_path(pattern: str, facts: dict[str, Any], arr: str = "", task: str = "") -> str:
    """sbatch's filename pattern for the batch step (%j %A %a %x %u %N %n %t %s %J %%, with an
    optional zero-pad width such as %3a); a backslash anywhere turns replacement off."""
    if "\\" in pattern:
        return pattern.replace("\\", "")
    raw = str(facts.get("slurm_job_id") or "")
    nodes = facts.get("nodes") or [""]
    values = {"%": "%", "A": arr or raw, "a": task or "4294967294", "j": raw, "J": f"{raw}.batch",
              "N": nodes[0], "n": "0", "t": "0", "s": "batch", "u": str(facts.get("user") or ""),
              "x": str(facts.get("name") or "")}

    def one(m: re.Match[str]) -> str:
        value = values[m.group(2)]
        return value.zfill(int(m.group(1))) if m.group(1) and value.isdigit() else value
    return _PATTERN.sub(one, pattern)


def epoch_iso(value: str | None) -> str | None:
    """Slurm's local 'YYYY-MM-DDTHH:MM:SS' as ISO 8601 with the local offset."""
    if not value or value in ("Unknown", "None", "N/A"):
        return None
    try:
        dt = datetime.strptime(value, "%Y-%m-%dT%H:%M:%S")
    except ValueError:
        return None
    return dt.astimezone().isoformat(timespec="seconds")


def _user(value: str | None) -> tuple[str | None, int | None]:
    m = re.match(r"^([^()]*)\((\d+)\)$", value or "")
    if m:
        return m.group(1) or None, int(m.group(2))
    return (value or None), None


def job_facts(rec: dict[str, str], sacct: dict[str, str] | None = None) -> dict[str, Any]:
    """job.json from an `scontrol -o show job` record and, when present, the sacct row."""
    exit_code, sig = exit_pair(rec.get("ExitCode"))
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
        "start_time": epoch_iso(rec.get("StartTime")),
        "end_time": epoch_iso(rec.get("EndTime")),
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


_TRES_GPU = re.compile(r"(?:^|,)gres/gpu=(\d+)(?:,|$)")
_ELAPSED = re.compile(r"(?:(\d+)-)?(\d+):(\d\d):(\d\d)")


def tres_gpus(tres: str | None) -> int | None:
    """The GPU count in a TRES string (``cpu=4,gres/gpu=8,node=1``); typed GPUs
    (``gres/gpu:a100=8``) are counted in the untyped total Slurm also prints. None when
    the string is empty or unknown; 0 when it lists TRES but no GPUs."""
    if not tres or tres in ("Unknown", "N/A", "None"):
        return None
    m = _TRES_GPU.search(tres)
    return int(m.group(1)) if m else 0


def elapsed_seconds(value: str | None) -> float | None:
    """sacct's Elapsed (``[D-]HH:MM:SS``) in seconds."""
    m = _ELAPSED.fullmatch(value or "")
    if not m:
        return None
    d, h, mi, s = (int(x) if x else 0 for x in m.groups())
    return float(((d * 24 + h) * 60 + mi) * 60 + s)


def refresh_state(job: dict[str, Any], sacct: dict[str, str] | None) -> dict[str, Any]:
    """Take accounting's final state word and exit code once it has them."""
    if not sacct:
        return job
    word = (sacct.get("State") or "").split(" ")[0]
    if word in FINAL_STATES:
        job["state"] = word
        job["state_source"] = "sacct"
        ec, sig = exit_pair(sacct.get("ExitCode"))
        if ec is not None:
            job["exit_code"], job["signal"] = ec, sig
        if sacct.get("State", "").startswith("CANCELLED by "):
            job["cancelled_by_uid"] = sacct["State"].split("by ", 1)[1]
        if not job.get("nodes") and sacct.get("NodeList"):
            job["nodes"] = expand(sacct["NodeList"])
        for key, col in (("start_time", "Start"), ("end_time", "End")):
            if not job.get(key) and epoch_iso(sacct.get(col)):
                job[key] = epoch_iso(sacct.get(col))
        # What the job's failure cost (fleet/): accounting's allocation and run time.
        gpus, elapsed = tres_gpus(sacct.get("AllocTRES")), elapsed_seconds(sacct.get("Elapsed"))
        if gpus is not None:
            job["gpus"] = gpus
        if elapsed is not None:
            job["elapsed_s"] = elapsed
    return job
