"""The drain policy: which nodes a verdict takes out of service, within safety limits.

Only hardware evidence that the job could not have written drains (DESIGN.md §5, §6):
a symptom from a trusted source (kernel log, Slurm) whose catalog action is drain,
reset or reboot. Reasons start with ``SATTR:`` and name cause, symptom and job.

Every candidate node gets exactly one decision (an ``Action``), in this order:

1. offline (no Slurm)                      -> blocked "offline analysis"
2. ``[drain] enabled = false``              -> blocked "drain disabled"
3. no verdict database to count in          -> blocked "no verdict database"
4. node state, re-read now:
   drained/down/reserved/maintenance by someone else -> blocked "not our drain: <reason>"
   drained by us (any job), or drained by us for this job before -> blocked "already drained"
5. breaker tripped earlier                  -> blocked "circuit breaker"
6. ``[drain] dry_run = true``               -> blocked "dry-run"
7. breaker limits (count per window, share of a partition) -> trips it, blocked "circuit breaker"
8. ``scontrol update State=DRAIN`` (or ``scontrol reboot ASAP nextstate=DOWN`` for the
   catalog's reset/reboot when ``[drain] reboot = true``), then the state is re-read.

Nothing here raises for a Slurm problem: a node whose state cannot be read is not
drained, and the decision says why.
"""
from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from .breaker import Breaker
from .config import Config
from .errors import SlurmError, StoreError
from .model import Action, Symptom, Verdict, domain_of, is_trusted
from .reason import policy
# Node state and its vocabulary live with Slurm's view (slurmstate.py); re-exported here
# for the CLI and tests. Dependencies run one way: drain -> breaker -> slurmstate.
from .slurmstate import (BLOCK_ALREADY, BLOCK_BREAKER, NOT_OURS, PREFIX, NodeState,  # noqa: F401
                         is_ours, reason_job)
from .waiting import wait_until

log = logging.getLogger("slurm_attr")

DRAIN_ACTIONS = ("drain", "reset", "reboot")
# Slurm shows at most this much of a reason comfortably (sinfo -R); ours stay well under it.
REASON_MAX = 80
_SAFE = re.compile(r"[^A-Za-z0-9:._-]")

BLOCK_OFFLINE = "offline analysis"
BLOCK_DISABLED = "drain disabled"
BLOCK_NO_STORE = "no verdict database"
BLOCK_DRY_RUN = "dry-run"


def may_drain(s: Symptom, hardware_verdict: bool) -> bool:
    """Whether this symptom alone may take its node out (trusted evidence with a drain action)."""
    if not s.trusted or s.action not in DRAIN_ACTIONS or not s.node:
        return False
    # Defence in depth: a symptom claiming trust must rest on a trusted source.
    if s.evidence and not any(is_trusted(e.source) for e in s.evidence):
        return False
    if hardware_verdict or domain_of(s.cause) == "hardware" or s.id in policy.load().special.drain_beyond_hardware:
        return True
    # The XID catalog's reset/reboot actions drain whatever the verdict (DESIGN.md §6).
    return s.action in ("reset", "reboot")


def _short_symptom(s: Symptom) -> str:
    xid = s.fields.get("xid") if isinstance(s.fields, dict) else None
    if isinstance(xid, (int, str)) and str(xid).isdigit():
        return f"xid{xid}"
    last = s.id.rsplit(".", 1)[-1]
    return _SAFE.sub("", last)[:32] or "hw"


def _short_gpu(gpu: Any) -> str:
    if gpu in (None, ""):
        return ""
    g = _SAFE.sub("", str(gpu))
    if g.startswith("0000:"):  # PCI domain 0: the bus id is enough to find the GPU
        g = g[5:]
    return f"gpu{g[:16]}"


def reason_for(cause: str, s: Symptom, job_id: str) -> str:
    """``SATTR: gpu_hardware xid79 gpu3 job 1234`` — short: sinfo -R shows it."""
    parts = [PREFIX, _SAFE.sub("", cause) or "hardware", _short_symptom(s)]
    gpu = _short_gpu(s.gpu)
    if gpu:
        parts.append(gpu)
    parts += ["job", _SAFE.sub("", job_id)[:24]]
    return " ".join(parts)[:REASON_MAX]


def severity(s: Symptom) -> tuple[int, int]:
    # reboot > reset > drain, then the rule's priority: the reason names the worst symptom.
    return ({"reboot": 2, "reset": 1}.get(s.action, 0), s.priority)


def worst_symptoms(verdict: Verdict) -> dict[str, Symptom]:
    """Per node, the worst symptom that may drain it (its action and GPU decide the recovery)."""
    hardware = verdict.domain == "hardware"
    best: dict[str, Symptom] = {}
    for s in verdict.symptoms:
        if not may_drain(s, hardware):
            continue
        cur = best.get(s.node or "")
        if cur is None or severity(s) > severity(cur):
            best[s.node or ""] = s
    return best


def candidates(verdict: Verdict) -> list[tuple[str, str, str]]:
    """(node, catalog action, reason) for every node this verdict would take out.

    A hardware verdict reached by correlation (an FR or probe culprit rank) drains a
    culprit node only when that node's own trusted evidence asks for it: untrusted
    evidence points at nodes, it never drains them.
    """
    best = worst_symptoms(verdict)
    out = []
    for node in sorted(best, key=lambda n: (n not in verdict.culprit_nodes, n)):
        s = best[node]
        cause = s.cause if domain_of(s.cause) == "hardware" else verdict.cause
        out.append((node, s.action, reason_for(cause, s, verdict.job_id)))
    return out


def job_ids(verdict: Verdict, job: dict[str, Any]) -> list[str]:
    """The ids this job goes by: the verdict's (A_T for array tasks) and Slurm's numeric one."""
    ids = [str(verdict.job_id)]
    raw = job.get("slurm_job_id") if isinstance(job, dict) else None
    if raw and str(raw) not in ids:
        ids.append(str(raw))
    return ids


def apply_policy(cfg: Config, verdict: Verdict, job: dict[str, Any], slurm: Any = None, store: Any = None,
                 path: str = "central") -> list[Action]:
    """Decide (and, with slurm, carry out) the drains for this verdict; one Action per node.

    ``path`` is "central" (the analysis), "fast" (the node epilog) or "offline". The
    caller records the returned actions with the verdict (``Store.record_actions``).
    """
    cands = candidates(verdict)
    if not cands:
        return []
    ids = job_ids(verdict, job or {})
    acts: list[Action] = []
    for node, action, reason in cands:
        kind = "reboot" if action in ("reboot", "reset") and cfg.drain.reboot else "drain"
        act = Action(kind=kind, node=node, reason=reason, applied=False)
        if slurm is None:
            act.blocked_by = BLOCK_OFFLINE
        elif not cfg.drain.enabled:
            act.blocked_by = BLOCK_DISABLED
        elif store is None:
            act.blocked_by = BLOCK_NO_STORE
        else:
            try:
                _decide(cfg, act, ids, slurm, store, path)
            except StoreError as err:
                act.applied, act.blocked_by = False, f"store error: {err}"[:200]
            except Exception as err:  # noqa: BLE001 - one node's surprise must not cost the others' decisions
                log.exception("drain decision for %s failed", node)
                act.applied, act.blocked_by = False, f"error: {type(err).__name__}: {err}"[:200]
        log.info("job %s: %s %s -> %s", verdict.job_id, act.kind, node,
                 "applied" if act.applied else f"blocked ({act.blocked_by})")
        acts.append(act)
    if slurm is not None and store is not None and cfg.drain.enabled:
        acts += _recover(cfg, verdict, acts, ids, slurm, store)
    return acts


def _recover(cfg: Config, verdict: Verdict, acts: list[Action], ids: list[str], slurm: Any,
             store: Any) -> list[Action]:
    """The recovery action (recovery.py) for each node this job's drain took out: drained now,
    or already drained by us for this job (the node epilog's fast path got there first)."""
    from . import recovery

    best = worst_symptoms(verdict)
    out = []
    for act in acts:
        sym = best.get(act.node or "")
        kind = recovery.wanted(cfg, sym.action) if sym is not None and act.kind == "drain" else ""
        if not kind or not (act.applied or (act.blocked_by == BLOCK_ALREADY and _drained_for(slurm, act.node, ids))):
            continue
        row = recovery.carry_out(cfg, slurm, store, ids[-1], act.node or "", str(sym.gpu or ""), kind, act.reason)
        try:
            store.record_recovery(row)
        except StoreError as err:
            log.warning("recovery of %s not recorded: %s", act.node, err)
        out.append(Action(kind=kind, node=act.node, reason=act.reason, applied=bool(row["ok"]),
                          blocked_by=None if row["ok"] else row["detail"][:200]))
    return out


def _drained_for(slurm: Any, node: str | None, ids: list[str]) -> bool:
    st, _err = _read_node(slurm, node or "")
    return st is not None and st.ours and reason_job(st.reason) in ids


def _read_node(slurm: Any, node: str) -> tuple[NodeState | None, str | None]:
    try:
        rec = slurm.show_node(node)
    except SlurmError as err:
        return None, f"slurm error: {err}"[:200]
    if not rec:
        return None, "node unknown to Slurm"
    return NodeState.from_record(rec), None


def _decide(cfg: Config, act: Action, ids: list[str], slurm: Any, store: Any, path: str) -> None:
    node = act.node or ""
    st, err = _read_node(slurm, node)
    if st is None:
        act.blocked_by = err
        return
    if st.out_of_service:
        if st.ours:
            act.blocked_by = BLOCK_ALREADY
        else:
            act.blocked_by = f"{NOT_OURS}: {st.describe()}"[:200]
        return
    if store.ledger_has(node, ids):
        # We drained it for this job before and someone (a person) resumed it since: respect that.
        act.blocked_by = BLOCK_ALREADY
        return
    brk = Breaker(store, cfg.drain)
    if brk.tripped():
        act.blocked_by = BLOCK_BREAKER
        return
    if cfg.drain.dry_run:
        act.blocked_by = BLOCK_DRY_RUN
        return
    claim, why = brk.claim(node, ids[-1], act.kind, path, act.reason, slurm, st.partitions, ids)
    if claim is None:
        act.blocked_by = why
        return
    used, err = _carry_out(slurm, node, act.kind, act.reason)
    if err is not None:
        store.ledger_settle(claim, "released")
        act.blocked_by = err
        return
    act.kind = used
    act.applied = True
    store.ledger_settle(claim, "applied", kind=used)


def _carry_out(slurm: Any, node: str, kind: str, reason: str) -> tuple[str, str | None]:
    """Drain (or reboot) and judge by re-reading the state, not by the exit code."""
    used = kind
    try:
        if kind == "reboot":
            try:
                slurm.reboot(node, reason, nextstate="DOWN")
            except SlurmError as err:
                # No RebootProgram, or a Slurm that refuses: a drain still keeps jobs off the node.
                log.warning("reboot of %s refused (%s); draining instead", node, err)
                used = "drain"
                slurm.drain(node, reason)
        else:
            slurm.drain(node, reason)
    except SlurmError as err:
        return used, f"slurm error: {err}"[:200]
    st, err = _read_node(slurm, node)
    if st is None:
        return used, err
    if not st.drained or not st.ours:
        return used, f"slurm did not drain it (state {'+'.join(sorted(st.words)) or '?'}, reason {st.reason!r})"[:200]
    return used, None


# -- operators: undrain ------------------------------------------------------------------


@dataclass
class UndrainResult:
    node: str
    ok: bool
    message: str
    skipped: bool = False  # nothing to do (not drained)


def undrain(slurm: Any, store: Any, nodes: Iterable[str], why: str, actor: str,
            settle_s: float = 5.0, poll_s: float = 0.2,
            check: Callable[[str, NodeState], tuple[bool, str]] | None = None) -> list[UndrainResult]:
    """Resume nodes that we drained, one at a time, judging each by re-reading its state.

    A node drained or down for a reason that does not start with ``SATTR:`` is refused;
    every attempt is recorded with who asked and why. ``check`` (the site's diagnostic,
    diag.py) runs first for each node we drained and says (passed, what happened): a node
    that does not pass stays drained.
    """
    return [_undrain_one(slurm, store, node, why, actor, settle_s, poll_s, check) for node in nodes]


def _undrain_one(slurm: Any, store: Any, node: str, why: str, actor: str, settle_s: float, poll_s: float,
                 check: Callable[[str, NodeState], tuple[bool, str]] | None) -> UndrainResult:
    st, err = _read_node(slurm, node)
    if st is None:
        return UndrainResult(node, False, err or "unknown node")
    if not st.out_of_service:
        return UndrainResult(node, True, f"{node} is not drained ({'+'.join(sorted(st.words)).lower()}): nothing to do",
                             skipped=True)
    if not st.ours:
        msg = (f"{node} refused: drained by someone else ({st.describe()}); sattr resumes only nodes whose "
               f"reason starts with {PREFIX}. Use scontrol if you mean it.")
        store.record_undrain(node, "", st.reason, why, actor, ok=False, detail="not our drain")
        return UndrainResult(node, False, msg)
    job, note = reason_job(st.reason) or "", ""
    if check is not None:
        passed, note = check(node, st)
        if passed:
            # A diagnostic can take an hour: a drain someone set meanwhile is theirs, left as it is.
            now, err = _read_node(slurm, node)
            if now is None or not now.out_of_service or now.reason != st.reason:
                passed = False
                note += f"; not resumed: its state changed meanwhile ({err or (now and now.describe())})"
        if not passed:
            store.record_undrain(node, job, st.reason, why, actor, ok=False, detail=note)
            return UndrainResult(node, False, f"{node} stays drained: {note}")
    ok, detail = _resume(slurm, node, settle_s, poll_s)
    detail = f"{note}; {detail}" if note else detail
    store.record_undrain(node, job, st.reason, why, actor, ok=ok, detail=detail)
    if not ok:
        return UndrainResult(node, False, f"{node}: resume did not take: {detail}")
    return UndrainResult(node, True, f"{node} resumed (was: {st.reason})" + (f"; {note}" if note else ""))


def _resume(slurm: Any, node: str, settle_s: float, poll_s: float) -> tuple[bool, str]:
    try:
        slurm.resume(node)
    except SlurmError as err:
        # rc is not trusted (a list resume fails while resuming some): the re-read decides.
        log.info("resume %s: %s", node, err)
    got = wait_until(lambda: _read_node(slurm, node), settle_s, poll_s, f"{node} to leave its drain",
                     done=lambda read: read[0] is not None and not read[0].drained)
    after, err = got.value
    ok = got.ok
    return ok, "resumed" if ok else (err or f"still {'+'.join(sorted(after.words)).lower() if after else '?'}")
