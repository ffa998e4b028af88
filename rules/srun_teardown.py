"""A step srun tore down itself after one of its tasks failed is no cancellation.

With `srun --kill-on-bad-exit` (the default of many launch wrappers), when a task exits non-zero
srun reports it (`srun: error: n2: task 1: Exited with exit code 1`), then terminates the step
itself (`srun: launch/slurm: _step_signal: Terminating StepId=8091.0`), and slurmstepd on every
other node prints the plain banner `*** STEP 8091.0 ON n1 CANCELLED AT ... ***`: Slurm 22.05 adds
no "DUE TO TASK FAILURE" to it. Read alone, that banner is a user's scancel. A step banner of the
step srun itself terminated, after a task of the job exited non-zero earlier in the same output,
is that failure's teardown: a cascade of the task's own error, not a cancel.

A job banner (`*** JOB ...`), a step banner without srun's own termination of that step (an
scancel), or srun's termination with no failed task before it (Ctrl-C) stays a cancel.
"""
from __future__ import annotations

from typing import Any, Mapping

from slurm_attr.model import Evidence, Symptom
from slurm_attr.rules.pyrule import JobRefiner, RefinerCase

BANNER = "slurm.cancelled"
TEARDOWN = "slurm.step_teardown"
EXIT = "slurm.task_exit"


def _self_terminated_steps(syms: list[Symptom]) -> set[str]:
    """Steps srun terminated itself after a task's non-zero exit above it in the same file."""
    failed = [(s.evidence[0].path, s.evidence[0].line or 0) for s in syms if s.id == EXIT and s.evidence
              and isinstance(s.fields.get("exitcode"), int) and s.fields["exitcode"] != 0]
    steps = set()
    for s in syms:
        step = s.fields.get("job")
        if s.id != TEARDOWN or not isinstance(step, str) or "." not in step or not s.evidence:
            continue
        ev = s.evidence[0]
        if any(path == ev.path and line < (ev.line or 0) for path, line in failed):
            steps.add(step)
    return steps


def srun_teardown(syms: list[Symptom], job: Mapping[str, Any]) -> None:
    steps = _self_terminated_steps(syms)
    if not steps:
        return
    for s in syms:
        if s.id == BANNER and s.fields.get("job") in steps and s.role == "root":
            s.role, s.cause = "cascade", "user_error"
            s.summary = f"srun tore step {s.fields['job']} down after one of its tasks failed (--kill-on-bad-exit)"


def _case(exit_code: int = 1, signal_step: str = "8091.0", banner: str = "8091.0", exit_first: bool = True) -> list[Symptom]:
    out = "output/stdout"
    ex = Symptom(id=EXIT, cause="user_error", role="root", node="n2", rank=1, fields={"exitcode": exit_code},
                 evidence=[Evidence("stdout", out, 4 if exit_first else 9,
                                    f"srun: error: n2: task 1: Exited with exit code {exit_code}")])
    sig = Symptom(id=TEARDOWN, cause="unknown", role="cascade", fields={"job": signal_step},
                  evidence=[Evidence("stdout", out, 5, f"srun: launch/slurm: _step_signal: Terminating StepId={signal_step}")])
    ban = Symptom(id=BANNER, cause="cancelled", role="root", node="n1", fields={"job": banner},
                  evidence=[Evidence("scheduler", "scheduler/slurm.log", 7,
                                     f"slurmd-n1.log: [{banner}] error: *** STEP {banner} ON n1 CANCELLED AT 2026-12-06T22:34:23 ***")])
    return [ex, sig, ban]


JOB_REFINERS = [
    JobRefiner(
        id="slurm.srun_teardown",
        description="A step's cancellation banner for the step srun terminated itself after one of its tasks "
                    "exited non-zero (--kill-on-bad-exit) is that failure's cascade, not a cancel.",
        run=srun_teardown,
        cases=[
            RefinerCase(lambda: _case(), ["root", "cascade", "cascade"]),
            # near misses: no failed task before srun's termination (Ctrl-C); another step's
            # banner; the failure reported after the termination; the job's own banner
            RefinerCase(lambda: _case(exit_code=0), ["root", "cascade", "root"]),
            RefinerCase(lambda: _case(banner="8091.1"), ["root", "cascade", "root"]),
            RefinerCase(lambda: _case(exit_first=False), ["root", "cascade", "root"]),
            RefinerCase(lambda: _case(banner="8091"), ["root", "cascade", "root"]),
        ],
    ),
]
