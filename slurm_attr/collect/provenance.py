"""Who wrote each piece of evidence, and so whether it may be trusted.

Provenance, not file names, decides trust (issue 10, item 2). Trusted means
written by the kernel, or by a root daemon in a field the job cannot fill:

- the kernel ring buffer: ``journalctl -k`` (journald's ``_TRANSPORT=kernel``
  only; a user's ``logger`` line has another transport) or ``dmesg``, or the
  admin's file standing in for it (``kernel_source = "file"``);
- Slurm's own state and reason fields (job.json from scontrol/sacct);
- daemon log lines, only when the whole message is one of the structural forms
  below, whose variable parts are typed (numbers, node names, state words).

slurmd and slurmstepd also log job-chosen text under the job's ``[job.step]``
prefix: the output path (``Could not open stdout file <path>``), argv[0]
(``execve(): <argv0>: No such file or directory``), and slurmctld logs updated
job names and comments. A path may even hold a newline and start a whole fake
line. Such lines are kept apart as untrusted (``scheduler/untrusted.txt``, not
read as the trusted ``scheduler`` source), so ``-o '/x/nv-fabricmanager[2201]:
detected NVSwitch fatal error 20034 .../x.out'`` never yields a trusted symptom.
"""
from __future__ import annotations

import re
from typing import Any

# What each bundle source is and whether the job could have written it. Written into
# every node's collect.json and job.json, so a bundle read anywhere says it itself.
SOURCES: dict[str, dict[str, Any]] = {
    "kernel": {"trusted": True, "origin": "kernel ring buffer (journalctl -k: _TRANSPORT=kernel, or dmesg)"},
    "kernel_attributed": {"trusted": True, "origin": "kernel lines already attributed to an earlier job "
                                                     "(node ledger): context only, never a root or a drain"},
    "scheduler": {"trusted": True, "origin": "Slurm daemon log lines whose whole message is a structural "
                                             "form with typed fields"},
    "scheduler_untrusted": {"trusted": False, "origin": "Slurm daemon log lines that embed job-chosen text "
                                                        "(paths, argv, names, comments) or match no known form"},
    "journal": {"trusted": True, "origin": "journald records of the site's root system units "
                                           "([collect] journal_units), checked by _UID=0, _SYSTEMD_UNIT, _TRANSPORT"},
    "slurm": {"trusted": True, "origin": "Slurm state/reason fields (scontrol, sacct)"},
    "window": {"trusted": True, "origin": "the job's time window from Slurm or the plugin's root-owned rank map"},
    "stdout": {"trusted": False, "origin": "the job's stdout file (written by the job)"},
    "stderr": {"trusted": False, "origin": "the job's stderr file (written by the job)"},
    "fr": {"trusted": False, "origin": "Flight Recorder dumps in the job's evidence dir (written by the job)"},
    "probe": {"trusted": False, "origin": "native probe files in the job's evidence dir (written by the job)"},
    "nccl": {"trusted": False, "origin": "NCCL debug files in the job's evidence dir (written by the job)"},
}


def describe(source: str, **extra: Any) -> dict[str, Any]:
    """The provenance record of one source (unknown sources are untrusted)."""
    d = dict(SOURCES.get(source, {"trusted": False, "origin": "unknown"}))
    d.update(extra)
    return d


# -- Slurm daemon log lines -------------------------------------------------------------------

# The daemon's own prefix: "[2026-12-01T20:16:38.123] " (LogTimeFormat iso8601[_ms]) or syslog
# "Dec  1 20:16:38 host slurmd[123]: ", then slurmstepd's "[job.step] " and a level word.
_PREFIX = re.compile(
    r"^(?:\[\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d{3})?(?:[+-]\d\d:?\d\d)?\]"
    r"|\w{3} [ \d]\d \d\d:\d\d:\d\d [\w.-]+ (?:slurmctld|slurmd|slurmstepd|slurmdbd)(?:-[\w.-]+)?(?:\[\d+\])?:)"
    r" (?:\[\d+(?:_\d+)?\.(?:\d+|batch|extern|interactive)\] )?(?:(?:error|debug\d?|verbose|info|fatal|sched): )?")

_JOB = r"JobId=\d+(?:_\d+)?(?:\(\d+\))?"
_STEP = r"\d+(?:_\d+)?\.(?:\d+|batch|extern|interactive)"
_NODE = r"[A-Za-z0-9][\w.-]{0,63}"
_HOSTLIST = r"[\w.\[\],-]{1,512}"
_TS = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d"

# The whole message must be one of these (re.fullmatch). No free text anywhere.
STRUCTURAL: dict[str, re.Pattern[str]] = {name: re.compile(rx) for name, rx in {
    "job_complete_status": rf"_job_complete: {_JOB} (?:WEXITSTATUS|WTERMSIG) \d+",
    "job_complete": rf"_job_complete: {_JOB} (?:done|OOM failure|requeue)",
    "time_limit": rf"Time limit exhausted for {_JOB}",
    "kill_job": rf"_slurm_rpc_kill_job\d?: REQUEST_(?:KILL|CANCEL)_JOB {_JOB} uid \d+",
    "failed_node": rf"Killing {_JOB} on failed node {_NODE}",
    "not_responding": rf"Nodes? {_HOSTLIST} not responding(?:, setting DOWN)?",
    "epilog_drain": rf"job_epilog_complete: {_JOB} epilog error on {_NODE}, draining the node",
    "allocate": rf"(?:sched: )?Allocate {_JOB} NodeList={_HOSTLIST} #CPUs=\d+ Partition=[\w.-]+",
    "allocate_rpc": rf"(?:sched: )?_slurm_rpc_allocate_resources {_JOB} NodeList={_HOSTLIST} usec=\d+",
    "submit": rf"_slurm_rpc_submit_batch_job: {_JOB} InitPrio=\d+ usec=\d+",
    "signal": rf"job_signal: \d+ of running {_JOB} successful 0x[0-9a-fA-F]+",
    "requeue": rf"[Rr]equeu(?:e|ing) {_JOB} due to failure of node {_NODE}",
    "cancelled": rf"\*\*\* (?:JOB \d+|STEP {_STEP}) ON {_NODE} CANCELLED AT {_TS}"
                 rf"(?: DUE TO (?:TIME LIMIT|PREEMPTION|NODE FAILURE|TASK FAILURE|JOB REQUEUE))? \*\*\*",
    "stepd_terminated": rf"\*\*\* (?:JOB \d+|STEP {_STEP}) STEPD TERMINATED ON {_NODE} AT {_TS} "
                        r"DUE TO JOB NOT ENDING WITH SIGNALS \*\*\*",
    "oom_event": rf"Detected \d+ oom[-_]kill event(?:s|\(s\)) in (?:StepId={_STEP}|step {_STEP})"
                 r"(?: cgroup\.|\. Some of your processes may have been killed by the cgroup out-of-memory handler\."
                 r"|\. Some of the step tasks have been OOM Killed\.)?",
    "oom_exceeded": r"(?:Job|Step|StepId=) ?\d+(?:\.\w+)? exceeded (?:virtual )?memory limit \(\d+ > \d+\), being killed",
    "memory_limit": r"Exceeded (?:job|step) memory limit(?: at some point\.)?",
    "launch_batch": r"Launching batch job \d+ for UID \d+",
    "done": r"done with job",
    "task_exit": r"get_exit_code task \d+ died by signal: \d+",
    "io_setup": r"_fork_all_tasks: IO setup failed: Slurmd could not connect IO",
    "complete_batch": r"sending REQUEST_COMPLETE_BATCH_SCRIPT, error:\d+ status:-?\d+",
    "launch_task": rf"launch task StepId={_STEP} request from UID:\d+ GID:\d+ HOST:[\w.:]+ PORT:\d+",
    "prolog_epilog_rc": r"(?:prolog|epilog) failed: rc:-?\d+",
    "prolog_epilog_status": r"\[job \d+\] (?:prolog|epilog) failed status=-?\d+:-?\d+",
    "run_prolog": r"_run_prolog: (?:run job script took usec=\d+|prolog with lock for job \d+ ran for \d+ seconds)",
    # Plugin names come from plugstack.conf (the admin's file), the operation from Slurm.
    "spank_failed": r"(?:spank-epilog: )?spank: required plugin [\w./-]+: \w+\(\) failed with rc=-?\d+",
    "spank_stack": r"Failed to invoke spank plugin stack",
}.items()}


def classify_daemon_line(line: str) -> tuple[bool, str]:
    """(trusted, form name or why not) for one raw Slurm daemon log line."""
    if any(ord(c) < 32 or ord(c) == 127 for c in line):
        return False, "control characters"
    m = _PREFIX.match(line)
    if not m:
        # A continuation or a line started by a newline inside job-chosen text.
        return False, "no daemon prefix"
    msg = line[m.end():].rstrip()
    for name, rx in STRUCTURAL.items():
        if rx.fullmatch(msg):
            return True, name
    return False, "free-form message (may embed job-chosen text)"


# -- scontrol records ---------------------------------------------------------------------------

# Fields of `scontrol -o show job` that the verdict and the collectors trust. The generic parser
# keeps the last "Key=" of a record, and JobName (before them) or Comment, StdOut, WorkDir,
# Command (after them) are the user's text: `--comment ' UserId=root(0) Reason=NodeDown'`
# would otherwise pass for Slurm's own fields.
SCONTROL_TRUSTED_KEYS = ("UserId", "JobState", "Reason", "ExitCode", "RunTime", "StartTime", "EndTime",
                         "NodeList", "Restarts", "BatchFlag", "NumTasks")
_SCTL_KEY = re.compile(r"(?:^|\s)(" + "|".join(SCONTROL_TRUSTED_KEYS) + r")=")


def imitated_keys(record_line: str) -> set[str]:
    """Trusted scontrol keys that occur more than once in one record: job text imitates them."""
    seen: dict[str, int] = {}
    for m in _SCTL_KEY.finditer(record_line):
        seen[m.group(1)] = seen.get(m.group(1), 0) + 1
    return {k for k, n in seen.items() if n > 1}
