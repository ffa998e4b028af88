"""Rules over the scheduler's facts about the job (job.json): state, exit code, signal.

These are trusted (Slurm wrote them) but coarse: they say how the job ended, rarely why. Other
evidence refines them; on their own they still give time_limit, cancelled, preempted, node_failure,
host_oom, a weak user_error for a plain non-zero exit, and none for a clean exit.
"""
from __future__ import annotations

from typing import Any, Mapping, Optional

from slurm_attr.rules.pyrule import JobCase, JobRule, job_int, job_state

_CRASH_SIGNALS = {4: "illegal instruction", 7: "bus error", 8: "floating point exception", 11: "segmentation fault"}


def _state_is(*states: str):
    def check(job: Mapping[str, Any]) -> Optional[dict[str, Any]]:
        return {} if job_state(job) in states else None

    return check


def _failed_exit(job: Mapping[str, Any]) -> Optional[dict[str, Any]]:
    code, sig = job_int(job, "exit_code"), job_int(job, "signal")
    if job_state(job) == "FAILED" and code and code > 0 and not sig:
        return {"exitcode": code}
    return None


def _signaled(job: Mapping[str, Any]) -> Optional[dict[str, Any]]:
    sig = job_int(job, "signal")
    if not sig or job_state(job) not in ("FAILED", ""):
        return None
    if sig in _CRASH_SIGNALS:
        return {"signal": sig, "summary": f"a task died of signal {sig} ({_CRASH_SIGNALS[sig]})"}
    # SIGKILL/SIGABRT/SIGTERM come from outside (OOM killer, Slurm, the NCCL watchdog): not a cause alone.
    return {"signal": sig, "cause": "unknown", "role": "context", "priority": 5,
            "summary": f"the job was killed by signal {sig}"}


def _completed(job: Mapping[str, Any]) -> Optional[dict[str, Any]]:
    if job_state(job) == "COMPLETED" and not job_int(job, "exit_code") and not job_int(job, "signal"):
        return {}
    return None


RULES = [
    JobRule(
        id="job.timeout", cause="time_limit", role="root", priority=60,
        summary="the job hit its time limit", check=_state_is("TIMEOUT", "DEADLINE"),
        description="Slurm state TIMEOUT (or DEADLINE): the job ran out of time.",
        cases=[JobCase({"state": "TIMEOUT", "exit_code": 0, "signal": 15}, {"cause": "time_limit", "trusted": True}),
               JobCase({"state": "COMPLETED", "exit_code": 0})],
    ),
    JobRule(
        id="job.cancelled", cause="cancelled", role="root", priority=44,
        summary="the job was cancelled", check=_state_is("CANCELLED"),
        description="Slurm state CANCELLED (scancel by a user or admin; `CANCELLED by <uid>` accepted).",
        cases=[JobCase({"state": "CANCELLED by 1000"}, {"cause": "cancelled"}), JobCase({"state": "FAILED", "exit_code": 1})],
    ),
    JobRule(
        id="job.node_fail", cause="node_failure", role="root", priority=80,
        summary="Slurm lost a node of the job", check=_state_is("NODE_FAIL", "BOOT_FAIL"),
        description="Slurm state NODE_FAIL or BOOT_FAIL; a finer hardware cause on a node outranks it.",
        cases=[JobCase({"state": "NODE_FAIL"}, {"cause": "node_failure"}), JobCase({"state": "TIMEOUT"})],
    ),
    JobRule(
        id="job.preempted", cause="preempted", role="root", priority=62,
        summary="the job was preempted", check=_state_is("PREEMPTED"),
        description="Slurm state PREEMPTED.",
        cases=[JobCase({"state": "PREEMPTED"}, {"cause": "preempted"}), JobCase({"state": "CANCELLED"})],
    ),
    JobRule(
        id="job.out_of_memory", cause="host_oom", role="root", priority=75,
        summary="Slurm recorded the job as OUT_OF_MEMORY", check=_state_is("OUT_OF_MEMORY"),
        description="Slurm state OUT_OF_MEMORY (the cgroup OOM handler killed a task).",
        cases=[JobCase({"state": "OUT_OF_MEMORY", "exit_code": 0, "signal": 125}, {"cause": "host_oom"}),
               JobCase({"state": "FAILED", "exit_code": 137})],
    ),
    JobRule(
        id="job.failed_exit", cause="user_error", role="root", priority=10,
        summary="the job exited with a non-zero code", check=_failed_exit,
        description="State FAILED with a non-zero exit code and no signal: with nothing else, the program failed on its own.",
        cases=[JobCase({"state": "FAILED", "exit_code": 1, "signal": 0}, {"cause": "user_error", "exitcode": 1}),
               JobCase({"state": "FAILED", "exit_code": 0, "signal": 9}), JobCase({"state": "COMPLETED", "exit_code": 0})],
    ),
    JobRule(
        id="job.signaled", cause="user_error", role="root", priority=12,
        summary="a task died of a signal", check=_signaled,
        description="A job ended by a signal: a crash signal (SEGV, BUS, ILL, FPE) is the program's; SIGKILL, SIGABRT "
                    "and SIGTERM come from outside and are context only (a kill is not an OOM by itself).",
        cases=[JobCase({"state": "FAILED", "exit_code": 0, "signal": 11}, {"cause": "user_error", "signal": 11}),
               JobCase({"state": "FAILED", "exit_code": 0, "signal": 9}, {"cause": "unknown", "role": "context"}),
               JobCase({"state": "FAILED", "exit_code": 1, "signal": 0})],
    ),
    JobRule(
        id="job.completed", cause="none", role="root", priority=1,
        summary="the job completed successfully", check=_completed,
        description="State COMPLETED with exit code 0: the job succeeded (unless other evidence says a step failed).",
        cases=[JobCase({"state": "COMPLETED", "exit_code": 0, "signal": 0}, {"cause": "none"}),
               JobCase({"state": "COMPLETED", "exit_code": 2})],
    ),
]
