"""The drain policy: which nodes a verdict takes out of service, within safety limits.

Only hardware verdicts resting on trusted evidence drain (DESIGN.md §6). Reasons
start with ``SATTR:``; a node drained, down or reserved for any other reason is
never touched. Offline (no Slurm), the decisions are listed with applied=false.
"""
from __future__ import annotations

import logging
from typing import Any

from .config import Config
from .model import Action, Verdict

log = logging.getLogger("slurm_attr")

PREFIX = "SATTR:"
DRAIN_ACTIONS = ("drain", "reset", "reboot")


def candidates(verdict: Verdict) -> list[tuple[str, str, str]]:
    """(node, catalog action, reason) for every node this verdict would take out."""
    if verdict.domain != "hardware":
        return []
    out: dict[str, tuple[str, str, str]] = {}
    for s in verdict.symptoms:
        if s.role != "root" or not s.trusted or s.action not in DRAIN_ACTIONS or not s.node:
            continue
        if verdict.culprit_nodes and s.node not in verdict.culprit_nodes:
            continue
        gpu = f" gpu{s.gpu}" if s.gpu not in (None, "") else ""
        reason = f"{PREFIX} {verdict.cause} {s.id.split('.')[-1]}{gpu} job {verdict.job_id}"
        out.setdefault(s.node, (s.node, s.action, reason[:120]))
    return list(out.values())


def apply_policy(cfg: Config, verdict: Verdict, job: dict[str, Any], slurm: Any = None, store: Any = None,
                 path: str = "central") -> list[Action]:
    """Decide (and, with slurm, carry out) the drains for this verdict."""
    acts: list[Action] = []
    for node, action, reason in candidates(verdict):
        kind = "reboot" if action in ("reboot", "reset") and cfg.drain.reboot else "drain"
        if slurm is None:
            acts.append(Action(kind=kind, node=node, reason=reason, applied=False, blocked_by="offline analysis"))
        elif not cfg.drain.enabled:
            acts.append(Action(kind=kind, node=node, reason=reason, applied=False, blocked_by="drain disabled"))
        else:
            acts.append(Action(kind=kind, node=node, reason=reason, applied=False, blocked_by="not implemented"))
    return acts
