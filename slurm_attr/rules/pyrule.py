"""The Python rule API: for what a regex cannot do.

Rule modules live beside the TOML rules in ``rules/`` (importable as
``slurm_attr.rulebook.<name>``) and export any of:

``REFINERS: dict[str, Refiner]``
    Named hooks a TOML rule calls with ``refine = "<name>"``. A refiner gets the
    symptom the regex built and the regex's named groups, and returns the symptom
    (changed: id, cause, role, action, priority, summary, fields) or ``None`` to
    drop the match. Example: the Xid table lookup by number.
``RULES: list[JobRule]``
    Rules over the scheduler's facts about the job (``job.json``): state, exit
    code, signal. Each carries inline cases, checked like TOML cases by `sattr rules test` and CI.
``HISTORY_RULES: list[HistoryRule]``
    Rules over this job's symptoms plus other jobs' verdicts (the store), run before the
    verdict (``jobwide.before_verdict``). Example: the same Xid 13 on one GPU across jobs.
    A symptom they add may name, in ``fields["escalates"]``, the rule ids on its node and
    GPU whose evidence it rests on: those become its confirmation.
``JOB_REFINERS: list[JobRefiner]``
    Relations between this job's symptoms that no single line shows, run before the verdict
    and by the node's fast path: they change roles and statuses, add nothing. Example: an
    Xid 109 seconds after an Xid 13 on the same GPU is that program fault, not a second one.
``DOC_TABLES: list[DocTable]``
    Data tables rendered into the generated catalog (docs/rules.md).

Python rules never read files the job wrote: they see parsed fields only.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Protocol, Sequence

from ..model import Evidence, Symptom

Refiner = Callable[[Symptom, Mapping[str, str]], Optional[Symptom]]


class HistoryLookup(Protocol):
    """What the verdict store answers about other jobs (the store implements it)."""

    def gpu_symptom_jobs(self, node: str, gpu: str, symptom_id: str, since_epoch: float, exclude_job: str) -> set[str]:
        """Ids of other jobs that had ``symptom_id`` on ``node``/``gpu`` since ``since_epoch``."""
        ...


@dataclass(frozen=True)
class JobCase:
    """An inline case of a job rule: the job facts and what must come out (None: nothing)."""

    job: Mapping[str, Any]
    expect: Optional[Mapping[str, Any]] = None


@dataclass(frozen=True)
class JobRule:
    """A rule over job.json facts. ``check`` returns overrides for the symptom, or None."""

    id: str
    cause: str
    role: str
    priority: int
    summary: str
    description: str
    check: Callable[[Mapping[str, Any]], Optional[Mapping[str, Any]]]
    cases: Sequence[JobCase] = ()
    status: str = "stable"

    def run(self, job: Mapping[str, Any]) -> Optional[Symptom]:
        """The symptom this rule finds in ``job``, or None. Never raises on odd input."""
        try:
            over = self.check(job)
        except (TypeError, ValueError, KeyError, AttributeError):
            # job.json is assembled from Slurm output; a malformed field means "no finding".
            return None
        if over is None:
            return None
        sym = Symptom(
            id=self.id,
            cause=self.cause,
            role=self.role,
            priority=self.priority,
            trusted=True,  # job.json holds the scheduler's facts, not the job's words
            summary=self.summary,
            evidence=[Evidence(source="slurm", path="job.json", text=job_facts_text(job))],
        )
        for key, value in over.items():
            if hasattr(sym, key) and key not in ("evidence", "fields"):
                setattr(sym, key, value)
            else:
                sym.fields[key] = value
        return sym


@dataclass(frozen=True)
class HistoryCase:
    """An inline case of a history rule: symptoms, a fake store, the expected new ids."""

    symptoms: Sequence[Symptom]
    history: Mapping[tuple[str, str, str], Sequence[str]]
    expect_ids: Sequence[str]
    job: Mapping[str, Any] = field(default_factory=lambda: {"job_id": "100", "end_time": "2024-05-02T10:00:00"})


@dataclass(frozen=True)
class HistoryRule:
    """A rule over this job's symptoms and other jobs' (the store)."""

    id: str
    cause: str
    priority: int
    summary: str
    description: str
    run: Callable[[Sequence[Symptom], Mapping[str, Any], "HistoryLookup"], list[Symptom]]
    cases: Sequence[HistoryCase] = ()
    status: str = "stable"
    role: str = "root"
    action: str = "none"  # what its findings ask of the node (documentation; each finding carries its own)


@dataclass(frozen=True)
class RefinerCase:
    """An inline case of a job refiner: symptoms (made fresh per run), the job, the roles after,
    and, for refiners that place a symptom, where each is after ("node/rank", "" for nowhere)."""

    symptoms: Callable[[], list[Symptom]]
    expect_roles: Sequence[str]
    job: Mapping[str, Any] = field(default_factory=lambda: {"job_id": "100"})
    expect_places: Sequence[str] = ()


@dataclass(frozen=True)
class JobRefiner:
    """A relation between one job's symptoms; ``run`` changes them in place."""

    id: str
    description: str
    run: Callable[[list[Symptom], Mapping[str, Any]], None]
    cases: Sequence[RefinerCase] = ()
    status: str = "stable"


@dataclass(frozen=True)
class DocTable:
    """A data table shown in the generated catalog."""

    title: str
    intro: str
    header: Sequence[str]
    rows: Sequence[Sequence[str]]


class DictHistory:
    """A HistoryLookup over a dict ``(node, gpu, symptom_id) -> job ids``; for cases and tests."""

    def __init__(self, data: Mapping[tuple[str, str, str], Sequence[str]]):
        self.data = {k: list(v) for k, v in data.items()}

    def gpu_symptom_jobs(self, node: str, gpu: str, symptom_id: str, since_epoch: float, exclude_job: str) -> set[str]:
        return {j for j in self.data.get((node, gpu, symptom_id), []) if j != exclude_job}


def job_facts_text(job: Mapping[str, Any]) -> str:
    """The job.json facts a job rule looks at, as one evidence line."""
    parts = []
    for key in ("state", "exit_code", "signal", "restart_count"):
        if key in job and job[key] is not None:
            parts.append(f"{key}={job[key]}")
    return " ".join(parts) or "no scheduler facts"


def job_state(job: Mapping[str, Any]) -> str:
    """The Slurm state word, upper case, without decorations like ``CANCELLED by 0``."""
    raw = job.get("state")
    if not isinstance(raw, str):
        return ""
    return raw.strip().split(" ")[0].upper().rstrip("+")


def job_int(job: Mapping[str, Any], key: str) -> Optional[int]:
    """An integer fact of the job, or None when absent or malformed."""
    value = job.get(key)
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    return None
