"""Requeue around the broken node (issue 24 item 1): a job that ended on a trusted hardware (or
node-loss) verdict runs again, on healthy nodes, when the site asks for it.

Called by the analysis (pipeline/finish.py) right after the drain decisions, so the broken node is
out of service before the job can start again. Every check is a reason not to requeue, in order:

1. ``[actions] requeue_on`` empty                         -> nothing decided, nothing recorded
2. the job succeeded (the policy's clean-end cause)       -> nothing decided, nothing recorded
3. ``requeue_on`` names neither the cause nor its domain  -> "not in [actions] requeue_on"
4. the policy's [requeue] table (rules/policy.toml): never for a user, scheduler, success or
   unknown cause; trusted evidence only; every culprit node out of service (our drain applied or
   already ours; for a lost node, Slurm's DOWN re-read) — a drain blocked by the breaker or
   dry-run leaves the node in service, so no requeue
5. offline / no verdict database                          -> blocked
6. slurmctld's record, re-read: gone (MinJobAge), not a batch job, Requeue=0, already requeued
   by someone (Restarts moved on), still COMPLETING after a short wait
7. ``[actions] max_requeues`` of ours for this job reached
8. ``scontrol requeue`` (or, for 25.11's expedited-requeue job Slurm holds in REQUEUE_HOLD,
   ``scontrol release``), judged by re-reading the job; then the drained nodes are added to the
   job's ExcNodeList while it is pending (kept out even if someone resumes them meanwhile).

Each decision from 3 on is recorded in the store (``requeues``) and carried in the verdict
(``Verdict.requeue``) for ``sattr JOB``. Nothing here raises for a Slurm problem.
"""
from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from .config import Config
from .errors import SlurmError, StoreError
from .model import Verdict
from .reason import policy
from .slurm.base import FINAL_STATES
from .slurm.hostlist import expand
from .slurmstate import NodeState
from .waiting import wait_until

log = logging.getLogger("slurm_attr")

# The job leaves COMPLETING when its last node epilog ends; the analysis started after the node
# parts arrived, so this is a few seconds at most. Slurm refuses a requeue while it lasts.
COMPLETING_WAIT_S = 30.0
# After `scontrol requeue` the record shows the new attempt within a moment.
SETTLE_S = 5.0


@dataclass
class Decision:
    """One requeue decision for one attempt of a job (the store's row, the verdict's ``requeue``)."""

    requeued: bool
    why: str = ""  # why not ("" when requeued)
    attempt: int = 1  # the attempt this verdict is of, counted from 1
    next_attempt: int | None = None
    excluded: list[str] = field(default_factory=list)
    expedite: bool = False
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Decision":
        known = {k: d[k] for k in cls.__dataclass_fields__ if k in d}
        return cls(**known)

    def line(self) -> str:
        """``requeued as attempt 2; n7 excluded`` / ``not requeued: <why>``."""
        if not self.requeued:
            return f"not requeued: {self.why}"
        out = f"requeued as attempt {self.next_attempt}"
        if self.excluded:
            out += f"; {','.join(self.excluded)} excluded"
        if self.expedite:
            out += " (expedited)"
        return out


def attempt_of(job: dict[str, Any]) -> int:
    """The attempt a job record is of, from 1 (Slurm's Restarts count + 1)."""
    try:
        return max(0, int(job.get("restart_count") or 0)) + 1
    except (TypeError, ValueError):
        return 1


def opted_in(cfg: Config, verdict: Verdict) -> bool:
    names = {str(x) for x in cfg.actions.requeue_on}
    return verdict.cause in names or verdict.domain in names


def culprit_drains(verdict: Verdict) -> tuple[list[str], list[str]]:
    """(culprit nodes, each one's drain outcome: "applied" or why it was not) from the verdict's
    drain decisions. Without named culprits, every node a decision was taken for."""
    first: dict[str, Any] = {}
    for a in verdict.actions:
        # The drain policy's decision comes first; a reboot or reset after it is a recovery action.
        if a.kind in ("drain", "reboot") and a.node and a.node not in first:
            first[a.node] = a
    named = set(verdict.culprit_nodes)
    mine = [a for n, a in first.items() if n in named] or list(first.values())
    return [a.node for a in mine], ["applied" if a.applied else str(a.blocked_by or "not applied") for a in mine]


def policy_why_not(verdict: Verdict, slurm: Any) -> tuple[str, list[str]]:
    """The [requeue] table's answer for this verdict: (why not or "", the nodes to exclude)."""
    rules = policy.load().requeue
    root = verdict.root()
    trusted = root is not None and root.trusted
    nodes, drains = culprit_drains(verdict)
    down = False
    if verdict.cause in rules.slurm_removes_node:
        nodes = list(verdict.culprit_nodes)
        down = bool(nodes) and slurm is not None and all(_node_out(slurm, n) for n in nodes)
    return rules.why_not(verdict.cause, verdict.domain, trusted, drains, down), nodes


def _node_out(slurm: Any, node: str) -> bool:
    try:
        rec = slurm.show_node(node)
    except SlurmError:
        return False
    return bool(rec) and NodeState.from_record(rec).out_of_service


def for_verdict(cfg: Config, verdict: Verdict, job: dict[str, Any], slurm: Any = None,
                store: Any = None) -> dict[str, Any] | None:
    """What the verdict carries (``Verdict.requeue``): this attempt's decision (``apply``) and, for a
    job we requeued before, which earlier attempts we requeued (``after``). None when neither."""
    d = apply(cfg, verdict, job, slurm=slurm, store=store)
    out = d.to_dict() if d is not None else {"attempt": attempt_of(job)}
    try:
        earlier = [r for r in (store.requeues(raw_id(verdict, job)) if store is not None else [])
                   if r.get("ok") and int(r.get("attempt") or 0) < out["attempt"]]
    except Exception as err:  # noqa: BLE001 - the history is for display only
        log.warning("job %s: earlier requeues not read: %s", verdict.job_id, err)
        earlier = []
    if earlier:
        out["after"] = [{"attempt": int(r["attempt"]), "cause": r.get("cause") or "",
                         "excluded": [n for n in str(r.get("excluded") or "").split(",") if n]} for r in earlier]
    return out if d is not None or earlier else None


def _done_before(store: Any, verdict: Verdict, job: dict[str, Any], attempt: int) -> Decision | None:
    """Our own requeue of this very attempt, from an earlier analysis of it (a retry re-analyses)."""
    try:
        rows = store.requeues(raw_id(verdict, job))
    except Exception:  # noqa: BLE001 - then the checks below decide, as they would anyway
        return None
    for r in rows:
        if r.get("ok") and int(r.get("attempt") or 0) == attempt:
            return Decision(requeued=True, attempt=attempt, next_attempt=attempt + 1,
                            excluded=[n for n in str(r.get("excluded") or "").split(",") if n],
                            expedite=bool(r.get("expedite")), detail=str(r.get("detail") or ""))
    return None


def apply(cfg: Config, verdict: Verdict, job: dict[str, Any], slurm: Any = None, store: Any = None,
          sleep: Callable[[float], None] = time.sleep) -> Decision | None:
    """Decide and (with slurm and store) carry out the requeue of this verdict's job; the
    decision is recorded in the store. None when nothing was decided (off, or a clean end)."""
    if not cfg.actions.requeue_on or verdict.cause == policy.load().special.completed:
        return None
    d = Decision(requeued=False, attempt=attempt_of(job))
    if store is not None and slurm is not None:
        again = _done_before(store, verdict, job, d.attempt)
        if again is not None:
            return again  # decided and recorded when it happened
    if not opted_in(cfg, verdict):
        d.why = f"{verdict.cause} ({verdict.domain}) is not in [actions] requeue_on"
    else:
        d.why, nodes = policy_why_not(verdict, slurm)
        if not d.why and (slurm is None or store is None):
            d.why = "offline analysis" if slurm is None else "no verdict database"
        if not d.why:
            try:
                _carry_out(cfg, d, verdict, job, nodes, slurm, store, sleep)
            except StoreError as err:
                d.requeued, d.why = False, f"store error: {err}"[:200]
            except Exception as err:  # noqa: BLE001 - a surprise costs this requeue, never the verdict
                log.exception("job %s: requeue decision failed", verdict.job_id)
                d.requeued, d.why = False, f"error: {type(err).__name__}: {err}"[:200]
    log.info("job %s: %s", verdict.job_id, d.line())
    if store is not None and slurm is not None:
        _record(store, verdict, job, d)
    return d


def _record(store: Any, verdict: Verdict, job: dict[str, Any], d: Decision) -> None:
    try:
        store.record_requeue({
            "job_id": verdict.job_id, "slurm_job_id": raw_id(verdict, job), "attempt": d.attempt,
            "cause": verdict.cause, "excluded": ",".join(d.excluded), "expedite": int(d.expedite),
            "ok": int(d.requeued), "detail": (d.detail or d.why)[:500]})
    except Exception as err:  # noqa: BLE001 - the requeue happened (or not) whatever the record
        log.warning("job %s: requeue decision not recorded: %s", verdict.job_id, err)


def raw_id(verdict: Verdict, job: dict[str, Any]) -> str:
    """Slurm's own id for the job (an array task's numeric id): what scontrol is asked about."""
    return str(job.get("slurm_job_id") or verdict.job_id)


def _read_job(slurm: Any, job_id: str) -> tuple[dict[str, str] | None, str]:
    try:
        rec = slurm.show_job(job_id)
    except SlurmError as err:
        return None, f"slurm error: {err}"[:200]
    if rec is None:
        return None, "slurmctld no longer knows the job (past MinJobAge)"
    return rec, ""


def _restarts(rec: dict[str, str]) -> int:
    value = str(rec.get("Restarts") or "0")
    return int(value) if value.isdigit() else 0


def _settled(slurm: Any, job_id: str, sleep: Callable[[float], None]) -> tuple[dict[str, str] | None, str]:
    """The job's record once it is no longer COMPLETING (bounded); (None, why) otherwise."""
    got = wait_until(lambda: _read_job(slurm, job_id), COMPLETING_WAIT_S, 0.5, f"job {job_id} to leave COMPLETING",
                     done=lambda r: r[0] is None or "COMPLETING" not in str(r[0].get("JobState", "")), sleep=sleep)
    return got.value


def _eligible_job(cfg: Config, d: Decision, rec: dict[str, str], ours: list[dict[str, Any]]) -> str:
    """Why slurmctld's record of the job, or our own count, rules the requeue out ("" if not)."""
    if rec.get("BatchFlag") != "1":
        return "not a batch job (only sbatch jobs can be requeued)"
    if rec.get("Requeue") != "1":
        return "the job does not allow requeue (--no-requeue, or JobRequeue=0 in slurm.conf)"
    if any(int(r.get("attempt") or 0) == d.attempt for r in ours):
        return f"attempt {d.attempt} was requeued already"
    if len(ours) >= max(0, cfg.actions.max_requeues):
        return f"[actions] max_requeues ({cfg.actions.max_requeues}) reached for this job"
    return ""


def _carry_out(cfg: Config, d: Decision, verdict: Verdict, job: dict[str, Any], nodes: list[str], slurm: Any,
               store: Any, sleep: Callable[[float], None]) -> None:
    job_id = raw_id(verdict, job)
    rec, err = _settled(slurm, job_id, sleep)
    if rec is None:
        d.why = err
        return
    ours = [r for r in store.requeues(job_id) if r.get("ok")]
    d.why = _eligible_job(cfg, d, rec, ours)
    if d.why:
        return
    before = _restarts(rec)
    state = str(rec.get("JobState", "")).split(" ")[0]
    # 25.11's expedited requeue: Slurm requeued the job itself and holds it (its epilogs all passed,
    # ours included): releasing it is the requeue.
    d.expedite = (cfg.actions.requeue_expedite and rec.get("ExpeditedRequeue") == "Yes"
                  and state == "REQUEUE_HOLD")
    if not d.expedite:
        if before != attempt_of(job) - 1:
            d.why = f"the job was requeued already (Restarts={before})"
            return
        if state not in FINAL_STATES:
            d.why = f"the job is {state or '?'}, not finished"
            return
    note = ""
    if d.expedite:
        # Released, an expedited job is the highest priority there is and starts within one
        # scheduling pass, after which slurmctld refuses an ExcNodeList change ("no longer
        # pending"; seen on 26.05): it is excluded while still held.
        d.excluded, note = _exclude(slurm, job_id, rec, nodes)
    try:
        slurm.requeue(job_id, expedite=d.expedite)
    except SlurmError as err:
        d.why = f"slurm refused: {err}"[:200]
        return
    after = _wait_requeued(slurm, job_id, before, d.expedite, sleep)
    if after is None:
        d.why = "slurm did not requeue it (the job's record did not change)"
        return
    d.requeued, d.why = True, ""
    d.next_attempt = (_restarts(after) or before) + 1
    if not d.expedite:
        d.excluded, note = _exclude(slurm, job_id, after, nodes)
    d.detail = "; ".join(x for x in (d.line(), note) if x)


def _wait_requeued(slurm: Any, job_id: str, before: int, expedite: bool,
                   sleep: Callable[[float], None]) -> dict[str, str] | None:
    """The job's record once it shows the new attempt (pending again, Restarts moved on)."""
    def requeued(rec: dict[str, str] | None) -> bool:
        state = str((rec or {}).get("JobState", "")).split(" ")[0]
        return (rec is not None and state not in FINAL_STATES and state != "REQUEUE_HOLD"
                and (expedite or _restarts(rec) > before))

    got = wait_until(lambda: _read_job(slurm, job_id)[0], SETTLE_S, 0.2, f"job {job_id}'s next attempt",
                     done=requeued, sleep=sleep)
    return got.value if got.ok else None


def _exclude(slurm: Any, job_id: str, rec: dict[str, str], nodes: list[str]) -> tuple[list[str], str]:
    """Add the drained nodes to the pending job's ExcNodeList (appended to the user's own), then
    re-read it: (the nodes now excluded, a note when it did not take). The drain already keeps the
    job off them; this keeps it off too when someone resumes a node before the job starts."""
    if not nodes:
        return [], ""
    have = [] if rec.get("ExcNodeList") in (None, "", "(null)") else expand(rec["ExcNodeList"])
    want = list(dict.fromkeys(have + nodes))
    try:
        slurm.exclude_nodes(job_id, ",".join(want))
    except SlurmError as err:
        return [], f"ExcNodeList not set: {err}"[:200]
    got, err = _read_job(slurm, job_id)
    now = set(expand(got.get("ExcNodeList") or "")) if got and got.get("ExcNodeList") != "(null)" else set()
    missing = [n for n in nodes if n not in now]
    if missing:
        return [n for n in nodes if n in now], f"ExcNodeList lacks {','.join(missing)}{': ' + err if err else ''}"
    return list(nodes), ""
