"""The catalog's job-wide rules, run before the verdict: relations no single line shows.

Line rules see one line; the verdict sees the policy. In between, the catalog's Python rules
that look at the whole job: its job refiners (an Xid 109 that is an Xid 13's consequence, an
OOM kill in another job's cgroup) and its history rules (the same program Xid on one GPU
across jobs). The node's fast path runs the refiners on its own lines before it drains; the
central analysis runs both before ``verdict.decide``.
"""
from __future__ import annotations

import logging
from typing import Any, Mapping, Optional, Sequence

from ..model import Symptom
from .catalog import Catalog, load_catalog
from .pyrule import HistoryLookup

log = logging.getLogger("slurm_attr")


def refine(syms: list[Symptom], job: Mapping[str, Any], catalog: Optional[Catalog] = None) -> None:
    """Every job refiner of the catalog, in place."""
    for ref in (catalog or load_catalog()).job_refiners:
        if ref.status == "deprecated":
            continue
        try:
            ref.run(syms, job)
        except Exception as err:  # noqa: BLE001 - one refiner's bug costs its relation, not the verdict
            log.warning("job refiner %s failed for job %s: %s", ref.id, job.get("job_id"), err)


def history(syms: list[Symptom], job: Mapping[str, Any], lookup: HistoryLookup,
            catalog: Optional[Catalog] = None) -> list[Symptom]:
    """What the history rules add; the symptoms each new one escalates become its confirmation."""
    new: list[Symptom] = []
    for rule in (catalog or load_catalog()).history_rules:
        if rule.status == "deprecated":
            continue
        try:
            found = rule.run(syms, job, lookup)
        except Exception as err:  # noqa: BLE001 - a store problem costs the recurrence check, not the verdict
            log.warning("history rule %s failed for job %s: %s", rule.id, job.get("job_id"), err)
            continue
        for s in found:
            rests_on = s.fields.get("escalates") or []
            for old in syms:
                if old.id in rests_on and old.node == s.node and old.gpu == s.gpu and old.cause != s.cause:
                    old.role, old.status.supports = "confirmation", s.id  # the escalation rests on it
        new.extend(found)
    return new


def before_verdict(syms: Sequence[Symptom], job: Mapping[str, Any], lookup: Optional[HistoryLookup] = None,
                   catalog: Optional[Catalog] = None) -> list[Symptom]:
    """The symptoms as the verdict should see them: history rules' findings added (with a
    store), then every job refiner applied."""
    out = list(syms)
    cat = catalog or load_catalog()
    if lookup is not None:
        out.extend(history(out, job, lookup, cat))
    refine(out, job, cat)
    return out
