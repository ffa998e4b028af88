"""The data that flows through slurm-attr: symptoms in, one verdict out.

Collectors produce bundle files; analysers (rules, flightrec, probe) turn bundle
files into ``Symptom`` and ``Coverage`` records; ``verdict.decide`` turns those
into one ``Verdict``. The verdict's dict form is the contract of DESIGN.md §4.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

# The cause words and their domains (DESIGN.md §4) are the policy table's (rules/policy.toml,
# reason/policy.py): ``CAUSES`` (cause -> domain) is read from it on first use.
UNKNOWN_JOB = "unknown"  # the job id of facts that name none
ROLES = ("root", "cascade", "confirmation", "context")
COVERAGE_STATUSES = ("ok", "missing", "error", "truncated")
ACTION_KINDS = ("drain", "reboot", "reset", "none")
NO_ACTION = "none"

# Evidence sources and whether the job could have written them (DESIGN.md §5).
# Only trusted evidence may lead to a drain or reboot.
# "scheduler" is only the daemon lines the controller collector found structural
# (collect/provenance.py); daemon lines embedding job-chosen text are "scheduler_untrusted".
# Kernel lines an earlier job already owns ("kernel_attributed", node ledger) are in neither
# set on purpose: written by the kernel, but context only, so they never carry an action.
# "journal" is nodes/<node>/journal.log: records of root system units (collect/journal.py).
TRUSTED_SOURCES = frozenset({"kernel", "scheduler", "slurm", "journal"})
UNTRUSTED_SOURCES = frozenset({"stdout", "stderr", "fr", "probe", "nccl", "scheduler_untrusted"})


def domain_of(cause: str) -> str:
    from .reason.policy import load

    return load().domain(cause)


def __getattr__(name: str) -> Any:
    if name == "CAUSES":
        from .reason.policy import load

        return {c.name: c.domain for c in load().causes.values()}
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def is_trusted(source: str) -> bool:
    return source in TRUSTED_SOURCES


@dataclass(frozen=True)
class Evidence:
    """One piece of evidence: a line of a file in the bundle, or a derived fact."""

    source: str  # kernel | scheduler | slurm | stdout | stderr | fr | probe | nccl
    path: str | None = None  # relative to the bundle root
    line: int | None = None  # 1-based line number in path, when it is a line
    text: str = ""
    # Provenance (issue 10), additive in the contract: None = decided by the source alone.
    trusted: bool | None = None
    # The earlier job a trusted kernel line was already attributed to (node ledger), if any.
    attributed_to: str | None = None

    @property
    def is_trusted(self) -> bool:
        """Whether the job could not have written this line: the source decides, and a
        caller may only ever lower it (an untrusted source is never made trusted)."""
        return is_trusted(self.source) and self.trusted is not False

    def label(self) -> str:
        """What `sattr <job>` prints beside the line: "kernel, trusted", "stdout, untrusted",
        "kernel, trusted, already attributed to job 123"."""
        out = f"{self.source}, {'trusted' if self.is_trusted else 'untrusted'}"
        if self.attributed_to:
            out += f", already attributed to job {self.attributed_to}"
        return out

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"source": self.source, "path": self.path, "line": self.line, "text": self.text,
                             "trusted": self.is_trusted}
        if self.attributed_to:
            d["attributed_to"] = self.attributed_to
        return d


# Reasoning decisions that older stored verdicts kept among a symptom's rule fields.
_STATUS_KEYS = ("claim", "claim_note", "confirmed_by", "kernel_clean", "kernel_format_copy", "earlier",
                "after_end", "after_first_failure", "first_failure", "supports", "other_job", "caused_by")


@dataclass
class Status:
    """What the reasoning steps (reason/, verdict.py) decided about one symptom, kept apart from
    what its rule captured (``Symptom.fields``): a rule's capture group can never set these.

    A claim is untrusted evidence of hardware or a network fault, checked against the named
    node's kernel log: ``confirmed`` (by ``confirmed_by``, whose node it then takes),
    ``contradicted`` (the log covers the time and is clean), ``unconfirmed`` (nothing to check
    it against, or a path fault that may leave both ends clean: ``kernel_clean``)."""

    claim: str | None = None  # confirmed | contradicted | unconfirmed
    claim_note: str = ""
    confirmed_by: list[str] = field(default_factory=list)  # "gpu.xid_74 on n7"
    kernel_clean: bool = False
    kernel_format_copy: bool = False  # job output imitating a kernel log line
    earlier: str = ""  # why it belongs to an earlier attempt or job
    after_end: bool = False
    after_first_failure: str = ""  # the failure it came after ("cuda.oom on rank 3")
    first_failure: str = ""  # how that failure was found first: "time" | "srun exit order"
    supports: str = ""  # the history symptom this one is what the escalation rests on
    other_job: bool = False  # an OOM kill in another job's cgroup on a shared node
    caused_by: str = ""  # the symptom whose consequence this is (Xid 109 after Xid 13)

    @property
    def unconfirmed(self) -> bool:
        """Contradicted or merely unchecked: either way not confirmed."""
        return self.claim in ("contradicted", "unconfirmed")

    def confirm(self, by: list[str], note: str) -> None:
        self.claim, self.confirmed_by, self.claim_note = "confirmed", list(by), note

    def doubt(self, state: str, note: str, kernel_clean: bool = False) -> None:
        """``contradicted`` or ``unconfirmed``, with why."""
        self.claim, self.claim_note, self.kernel_clean = state, note, kernel_clean

    def to_dict(self) -> dict[str, Any]:
        """Only what was decided (the defaults say nothing)."""
        return {k: v for k, v in ((k, getattr(self, k)) for k in _STATUS_KEYS) if v not in (None, "", False, [])}

    @classmethod
    def from_dict(cls, d: Any) -> "Status":
        if not isinstance(d, dict):
            return cls()
        return cls(**{k: d[k] for k in _STATUS_KEYS if k in d})


@dataclass
class Symptom:
    """A recognised signal. ``id`` is the rule id (``domain.snake_case``)."""

    id: str
    cause: str
    role: str = "root"  # root | cascade | confirmation | context
    priority: int = 50  # higher wins among roots
    trusted: bool = False
    node: str | None = None
    rank: int | None = None
    gpu: str | None = None  # GPU index or PCI address as the log names it
    time: str | None = None  # ISO 8601 when the line carried a usable time
    action: str = "none"  # what the catalog asks for this symptom: drain | reboot | reset | none
    summary: str = ""
    fields: dict[str, Any] = field(default_factory=dict)
    evidence: list[Evidence] = field(default_factory=list)
    status: Status = field(default_factory=Status)

    def to_dict(self) -> dict[str, Any]:
        d = {
            "id": self.id,
            "cause": self.cause,
            "role": self.role,
            "priority": self.priority,
            "trusted": self.trusted,
            "node": self.node,
            "rank": self.rank,
            "gpu": self.gpu,
            "time": self.time,
            "action": self.action,
            "summary": self.summary,
            "fields": self.fields,
            "evidence": [e.to_dict() for e in self.evidence],
            "provenance": self.provenance(),
        }
        status = self.status.to_dict()
        if status:
            d["status"] = status  # additive (contract): the reasoning's decisions about it
        return d

    def provenance(self) -> str:
        """ "kernel, trusted" / "stdout, untrusted" for rendering: the first evidence line's
        label, or the symptom's own trust when it has no evidence (a derived fact)."""
        if self.evidence:
            return self.evidence[0].label()
        return "derived, trusted" if self.trusted else "derived, untrusted"

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Symptom":
        fields = dict(d.get("fields") or {})
        # a verdict stored before the reasoning had its own namespace kept it among the fields
        old = {k: fields.pop(k) for k in _STATUS_KEYS if k in fields and "status" not in d}
        fields.pop("unconfirmed", None) if old else None
        return cls(
            id=d["id"],
            cause=d.get("cause", "unknown"),
            role=d.get("role", "root"),
            priority=int(d.get("priority", 50)),
            trusted=bool(d.get("trusted", False)),
            node=d.get("node"),
            rank=d.get("rank"),
            gpu=d.get("gpu"),
            time=d.get("time"),
            action=d.get("action", "none"),
            summary=d.get("summary", ""),
            fields=fields,
            evidence=[_evidence(e) for e in d.get("evidence") or []],
            status=Status.from_dict(d.get("status") or old),
        )


def _evidence(e: dict[str, Any]) -> Evidence:
    """An Evidence from its dict, ignoring keys this version does not know (stored verdicts)."""
    known = {"source", "path", "line", "text", "trusted", "attributed_to"}
    kw = {k: v for k, v in e.items() if k in known}
    if kw.get("trusted") is not False:
        kw["trusted"] = None  # a stored "trusted": true is the source's own verdict: re-derive it
    return Evidence(**kw)


@dataclass
class Coverage:
    """What one evidence source delivered: ok | missing | error | truncated."""

    source: str
    node: str | None = None
    status: str = "ok"
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Action:
    """One drain-policy decision; ``applied`` false with ``blocked_by`` when not carried out."""

    kind: str
    node: str | None = None
    reason: str = ""
    applied: bool = False
    blocked_by: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Verdict:
    job_id: str
    cause: str = "unknown"
    summary: str = ""
    culprit_nodes: list[str] = field(default_factory=list)
    culprit_ranks: list[int] = field(default_factory=list)
    culprit_gpus: list[str] = field(default_factory=list)
    ambiguous: bool = False
    alternatives: list[dict[str, str]] = field(default_factory=list)
    symptoms: list[Symptom] = field(default_factory=list)
    coverage: list[Coverage] = field(default_factory=list)
    actions: list[Action] = field(default_factory=list)
    # Why the cause won, as the reasoning decided it: "gpu.xid_74 on n7 over user_error: ..."
    reasoning: list[str] = field(default_factory=list)
    # The requeue decision for this attempt (requeue.Decision as a dict), when the site has
    # requeue on and the job did not succeed; None otherwise (and the key is left out).
    requeue: dict[str, Any] | None = None

    @property
    def domain(self) -> str:
        return domain_of(self.cause)

    def root(self) -> Symptom | None:
        for s in self.symptoms:
            if s.role == "root":
                return s
        return None

    def to_dict(self) -> dict[str, Any]:
        """The verdict contract (DESIGN.md §4). Extra keys may only be added."""
        out = {
            "job_id": self.job_id,
            "cause": self.cause,
            "domain": self.domain,
            "summary": self.summary,
            "culprit": {
                "nodes": list(self.culprit_nodes),
                "ranks": list(self.culprit_ranks),
                "gpus": list(self.culprit_gpus),
            },
            "ambiguous": self.ambiguous,
            "alternatives": list(self.alternatives),
            "symptoms": [s.to_dict() for s in self.symptoms],
            "coverage": [c.to_dict() for c in self.coverage],
            "actions": [a.to_dict() for a in self.actions],
            "reasoning": list(self.reasoning),
        }
        if self.requeue is not None:
            out["requeue"] = dict(self.requeue)
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Verdict":
        culprit = d.get("culprit") or {}
        return cls(
            job_id=str(d["job_id"]),
            cause=d.get("cause", "unknown"),
            summary=d.get("summary", ""),
            culprit_nodes=list(culprit.get("nodes") or []),
            culprit_ranks=list(culprit.get("ranks") or []),
            culprit_gpus=list(culprit.get("gpus") or []),
            ambiguous=bool(d.get("ambiguous", False)),
            alternatives=list(d.get("alternatives") or []),
            symptoms=[Symptom.from_dict(s) for s in d.get("symptoms") or []],
            coverage=[Coverage(**c) for c in d.get("coverage") or []],
            actions=[Action(**a) for a in d.get("actions") or []],
            reasoning=[str(r) for r in d.get("reasoning") or []],
            requeue=dict(d["requeue"]) if isinstance(d.get("requeue"), dict) else None,
        )
