"""A SIGKILLed command plus the job's exit code 137: the memory killer, seen from the job's side.

Neither half is an OOM alone: Slurm SIGKILLs at a time limit or a cancel, and 137 only says
"killed by signal 9". The shell's `Killed` line (host.shell_killed, context) together with the
scheduler's record of a FAILED job with exit code 137 is the pattern the kernel's OOM killer leaves
when its own lines were not collected. This rule joins the two; it needs no other job's history,
it is a history rule only because those rules are the ones that see symptoms and job.json together.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

from slurm_attr.model import Evidence, Symptom
from slurm_attr.rules.pyrule import (HistoryCase, HistoryRule, JobRefiner, RefinerCase, job_facts_text, job_int,
                                     job_state)

# States in which a SIGKILL comes from the scheduler itself, not from a memory killer.
_SCHEDULER_KILLS = {"TIMEOUT", "CANCELLED", "PREEMPTED", "DEADLINE", "NODE_FAIL"}


def killed_with_137(symptoms: Sequence[Symptom], job: Mapping[str, Any], history: Any) -> list[Symptom]:
    """One host_oom root when the shell saw a Killed command and Slurm recorded exit code 137."""
    if job_int(job, "exit_code") != 137 or job_state(job) in _SCHEDULER_KILLS:
        return []
    if any(s.cause == "host_oom" and s.role == "root" for s in symptoms):
        return []  # a direct OOM line already says it
    killed = [s for s in symptoms if s.id == "host.shell_killed"]
    if not killed:
        return []
    first = killed[0]
    return [Symptom(
        id="host.killed_exit_137_job", cause="host_oom", role="root", priority=52, trusted=False,
        node=first.node, rank=first.rank,
        summary=f"{first.fields.get('comm', 'a command')} was SIGKILLed and the job exited with 137: most likely the OOM killer",
        fields={"exitcode": 137, "comm": first.fields.get("comm", "")},
        evidence=list(first.evidence[:2]) + [Evidence(source="slurm", path="job.json", text=job_facts_text(job))],
    )]


def _killed() -> Symptom:
    return Symptom(id="host.shell_killed", cause="host_oom", role="context", fields={"comm": "python main.py", "pid": 443552})


HISTORY_RULES = [
    HistoryRule(
        id="host.killed_exit_137_job", cause="host_oom", priority=52,
        summary="a SIGKILLed command in a job Slurm recorded as FAILED with exit code 137",
        description="host.shell_killed (bash's `<pid> Killed <command>`) in a job whose job.json says FAILED with "
                    "exit code 137 and no direct OOM line: host_oom, untrusted (never drains). Not at a time limit, "
                    "cancel or preemption, where the scheduler sends the SIGKILL.",
        run=killed_with_137,
        cases=[
            HistoryCase([_killed()], {}, ["host.killed_exit_137_job"],
                        job={"job_id": "4242", "state": "FAILED", "exit_code": 137}),
            HistoryCase([_killed()], {}, [], job={"job_id": "4242", "state": "TIMEOUT", "exit_code": 137}),
            HistoryCase([_killed()], {}, [], job={"job_id": "4242", "state": "FAILED", "exit_code": 1}),
            HistoryCase([], {}, [], job={"job_id": "4242", "state": "FAILED", "exit_code": 137}),
        ],
    )
]


def oom_of_another_job(syms: list[Symptom], job: Mapping[str, Any]) -> None:
    """An OOM kill in another job's cgroup on a shared node is that job's, not ours: context.
    The kernel names the cgroup on one line of the kill (``oom-kill:...task_memcg=.../job_N``);
    the kill's other lines (``Killed process PID``, the reaper) carry only the pid, so every
    line of that pid on that node goes with it."""
    ours = {str(job.get("job_id", "")).split("_")[0], str(job.get("slurm_job_id", "")).split("_")[0]} - {""}
    theirs = {(s.node, str(s.fields.get("pid"))) for s in syms
              if s.cause == "host_oom" and s.fields.get("job") and str(s.fields["job"]) not in ours}
    for s in syms:
        named_other = s.fields.get("job") and str(s.fields["job"]) not in ours
        same_kill = s.fields.get("pid") is not None and (s.node, str(s.fields["pid"])) in theirs
        if s.cause == "host_oom" and (named_other or same_kill):
            s.role, s.status.other_job = "context", True


def _oom(job_in_cgroup: str, pid: int = 23761) -> list[Symptom]:
    """The constraint line naming the cgroup, and the kill line of a pid, as the kernel logs them."""
    return [Symptom(id="host.oom_constraint", cause="host_oom", role="confirmation", trusted=True, node="n1",
                    fields={"job": job_in_cgroup, "comm": "python", "pid": 23761}),
            Symptom(id="host.oom_kill", cause="host_oom", role="root", trusted=True, node="n1",
                    fields={"comm": "python", "pid": pid})]


JOB_REFINERS = [
    JobRefiner(
        id="host.oom_of_another_job",
        description="A kernel OOM kill whose cgroup names another job (a shared node) is that job's: context here.",
        run=oom_of_another_job,
        cases=[
            RefinerCase(lambda: _oom("5151"), ["context", "context"], job={"job_id": "100"}),
            # near misses: our own cgroup (an array task); another pid's kill beside another job's
            RefinerCase(lambda: _oom("100"), ["confirmation", "root"], job={"job_id": "100_7"}),
            RefinerCase(lambda: _oom("5151", pid=999), ["context", "root"], job={"job_id": "100"}),
        ],
    ),
]
