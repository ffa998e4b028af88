"""One worker pass over many ended jobs asks Slurm once per kind of fact, not once per job.

``Batched`` wraps a backend for the duration of one batch: ``prefetch`` takes accounting's
rows for all the batch's jobs in one sacct (per 200 ids), and the first ``node_record`` takes
one node listing for the whole batch. Everything else (drains, comments, slurmctld's view of a
job during an accounting outage) goes to the backend live: a drain decision never rests on a
snapshot.
"""
from __future__ import annotations

from typing import Any

from ..errors import SlurmError, SlurmUnavailable
from .base import FINAL_STATES



def final_row(row: dict[str, str] | None) -> bool:
    return bool(row) and (row.get("State") or "").split(" ")[0] in FINAL_STATES  # type: ignore[union-attr]


class Batched:
    def __init__(self, slurm: Any):
        self.backend = slurm
        self._rows: dict[str, dict[str, str]] = {}
        self._down = ""  # accounting's error for this batch: no second timeout per job
        self._nodes: dict[str, dict[str, Any]] | None = None
        self.calls = 0  # Slurm calls this wrapper made for its batches (the worker logs it)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.backend, name)

    def prefetch(self, job_ids: list[str]) -> None:
        """A new batch: accounting's rows for these jobs in one call; the node listing dropped."""
        self._rows, self._down, self._nodes = {}, "", None
        if not job_ids:
            return
        self.calls += 1
        try:
            many = getattr(self.backend, "sacct_jobs", None)
            self._rows = many(job_ids) if many else {}
        except SlurmUnavailable as err:
            self._down = str(err)[:300]
        except SlurmError:
            self._rows = {}  # a bad id among many: each job then asks on its own

    def settled(self, job_id: str) -> bool:
        """Accounting already has this job's final state (or is down: waiting would not help)."""
        return bool(self._down) or final_row(self._rows.get(job_id))

    def sacct_job(self, job_id: str) -> dict[str, str] | None:
        if self._down:
            raise SlurmUnavailable(self._down)
        row = self._rows.pop(job_id, None)  # once: a second ask (still settling) goes live
        if final_row(row):
            return row
        self.calls += 1
        return self.backend.sacct_job(job_id)

    def node_record(self, node: str) -> dict[str, Any] | None:
        """The node's record from one listing per batch (for reading our own past drains back)."""
        if self._nodes is None:
            self.calls += 1
            try:
                self._nodes = {str(r.get("NodeName") or r.get("name") or ""): r for r in self.backend.nodes()}
            except SlurmError:
                self._nodes = {}
        return self._nodes.get(node)
