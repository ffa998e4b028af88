"""The one interface slurm-attr uses to talk to Slurm.

Backends: the Slurm CLI (``cli.CliSlurm``, the tested path) and, where pyslurm
matches the running Slurm, a pyslurm backend behind the same methods.
"""
from __future__ import annotations

from typing import Any, Protocol

# Slurm's final job state words: a job in one of these will not change state again.
FINAL_STATES = {"BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL",
                "OUT_OF_MEMORY", "PREEMPTED", "TIMEOUT"}


class SlurmAccess(Protocol):
    def show_job(self, job_id: str) -> dict[str, str] | None:
        """`scontrol show job` fields while slurmctld still knows the job, else None."""

    def sacct_job(self, job_id: str) -> dict[str, str] | None:
        """The allocation's accounting row (State, ExitCode, Comment, ...), or None."""

    def sacct_jobs(self, job_ids: list[str]) -> dict[str, dict[str, str]]:
        """sacct_job for many jobs in few calls: {asked id: row}, ids accounting lacks left out
        (optional: callers fall back to sacct_job)."""

    def ended_jobs(self, start: float, end: float) -> list[dict[str, str]]:
        """Jobs that ended between two epoch times, in one call: sacct rows (cli.ENDED_FIELDS),
        steps left out (optional: without it there is no catch-up from accounting)."""

    def job_comment(self, job_id: str, field: str) -> str | None:
        """Current Comment/AdminComment in accounting; None when the job is not there yet."""

    def job_comments(self, job_ids: list[str], field: str) -> dict[str, str | None]:
        """job_comment for several jobs in one call (optional: callers fall back to job_comment)."""

    def set_job_comment(self, job_id: str, field: str, text: str) -> None:
        """Write Comment/AdminComment of a finished job into accounting."""

    def show_node(self, node: str) -> dict[str, str] | None: ...

    def nodes(self) -> list[dict[str, Any]]:
        """Every node: name, state words, reason, partitions."""

    def drain(self, node: str, reason: str) -> None: ...

    def resume(self, node: str) -> None: ...

    def reboot(self, node: str, reason: str, nextstate: str = "DOWN") -> None: ...

    def requeue(self, job_id: str, expedite: bool = False) -> None:
        """Requeue a finished batch job (``scontrol requeue JOBID``; same id, Restarts+1).
        ``expedite``: the job is one Slurm's own expedited requeue (25.11+, submitted with
        ``--requeue=expedite``) requeued and held in REQUEUE_HOLD: release it instead."""

    def exclude_nodes(self, job_id: str, nodes: str) -> None:
        """Set a pending job's ExcNodeList (a comma list; the caller merges any earlier one)."""

    def submit_batch(self, command: str, opts: list[str]) -> str:
        """sbatch a one-line command with these options (an offloaded analysis); the job id."""

    def cancel_job(self, job_id: str, uid: int | None, started: float) -> str:
        """scancel the running job a watcher was started for, exactly: its raw id re-read from
        slurmctld first (cancel.cancel_target); returns what was cancelled (an array task as
        ``ARRAYJOBID_TASKID``). CancelRefused when a check fails, SlurmError when Slurm did."""


def set_comments_each(backend: Any, items: list[tuple[str, str, str]]) -> dict[str, Any]:
    """set_job_comment for each (job id, field, text), for backends that write one at a time:
    {job id: None when written, else the SlurmError}. Accounting down (not merely lacking a job's
    record yet) fails the rest at once: every other write would wait out its timeout too."""
    from ..errors import SlurmError, SlurmUnavailable

    out: dict[str, Any] = {}
    for job_id, field, text in items:
        try:
            backend.set_job_comment(job_id, field, text)
            out[job_id] = None
        except SlurmUnavailable as err:
            if "no record" not in str(err):
                return {**out, **{j: err for j, _f, _t in items if j not in out}}
            out[job_id] = err
        except SlurmError as err:
            out[job_id] = err
    return out
