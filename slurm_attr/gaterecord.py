"""The Prolog gate's decisions, carried from the node to the central store.

The gate (gate.py) decides on the node with Slurm alone; the store is on the controller and the
nodes never open it. Slurm's drain reason brings an applied drain back (pipeline/reconcile.py),
but a decision held back (dry-run, the breaker, a drain by someone else) leaves nothing in Slurm:
without this record an admin would see it only in that node's syslog. So each decision the gate
reached on a fatal line is written as one small file in the spool the nodes share with the
controller, ``<spool>/gate/<job>-<node>.json``, and `sattr retry` takes them into the store's
actions (path "gate", actor "prolog@<node>"; `sattr drains`, the fleet report's held-back counts)
and removes them. An applied drain is counted in the breaker's ledger there too, as the fast
path's are, so the sweep of Slurm's reasons does not count it twice.

Bounds: the spool is root's (a job cannot write there), but a node can still be wrong or broken:
names are checked against the record inside, files are read through safefs (never a link), each
at most CAP bytes with at most MAX_ACTIONS decisions, at most MAX_TAKE taken per run, and a node
with MAX_PER_NODE records waiting writes no more until they are taken.
"""
from __future__ import annotations

import logging
import os
import re
import time
from typing import Annotated, Any, Optional

import msgspec

from . import atomicfile, safefs
from .collect.ledger import node_name_ok
from .errors import UnsafePath
from .model import Action

log = logging.getLogger("slurm_attr")

DIR = "gate"
CAP = 16 << 10
MAX_ACTIONS = 16
MAX_TAKE = 500
MAX_PER_NODE = 50
_JOB = re.compile(r"\d{1,12}(?:_\d{1,9})?|idle")


class GateAction(msgspec.Struct, forbid_unknown_fields=False):
    # Written by this module only; unknown fields are let through so that a newer node's record
    # (a field added) is still taken by an older controller during a rolling upgrade.
    kind: Annotated[str, msgspec.Meta(max_length=16)]
    reason: Annotated[str, msgspec.Meta(max_length=200)]
    applied: bool
    blocked_by: Optional[Annotated[str, msgspec.Meta(max_length=200)]] = None


class GateRecord(msgspec.Struct):
    node: Annotated[str, msgspec.Meta(max_length=128)]
    job: Annotated[str, msgspec.Meta(max_length=24)]
    at: Annotated[float, msgspec.Meta(ge=0)]
    actions: Annotated[list[GateAction], msgspec.Meta(max_length=MAX_ACTIONS)]


def file_name(job: str, node: str) -> str:
    return f"{job}-{node}.json"


def write(spool: str, node: str, job: str, acts: list[Action], now: Optional[float] = None) -> bool:
    """Leave this gate's decisions for the store (False when it could not: logged, never raised;
    the Prolog's outcome does not depend on it)."""
    job = job or "idle"
    if not (node_name_ok(node) and _JOB.fullmatch(job)) or not acts:
        return False
    rec = GateRecord(node=node, job=job, at=time.time() if now is None else now,
                     actions=[GateAction(kind=a.kind[:16], reason=a.reason[:200], applied=bool(a.applied),
                                         blocked_by=(a.blocked_by or None) and a.blocked_by[:200])
                              for a in acts[:MAX_ACTIONS]])
    try:
        path = os.path.join(spool, DIR)
        os.makedirs(path, mode=0o700, exist_ok=True)
        waiting = sum(1 for n, _ in safefs.list_dir(spool, DIR) if n.endswith(f"-{node}.json"))
        if waiting >= MAX_PER_NODE:
            log.warning("prolog gate on %s: %d records not yet taken by the store; this one is only logged",
                        node, waiting)
            return False
        atomicfile.write_atomic(os.path.join(path, file_name(job, node)), msgspec.json.encode(rec),
                                mode=0o600, durable=False)
        return True
    except (OSError, UnsafePath) as err:
        log.warning("prolog gate on %s: decision not left for the store (%s)", node, err)
        return False


def take(spool: str, limit: int = MAX_TAKE) -> list[GateRecord]:
    """The records waiting in the spool, oldest name first, each removed once read (a bad one
    too: logged, so a broken node cannot fill the directory)."""
    try:
        names = [n for n, kind in safefs.list_dir(spool, DIR) if n.endswith(".json")]
    except (OSError, UnsafePath):
        return []  # no gate dir yet (no gate decided anything), or not ours to read
    out: list[GateRecord] = []
    for name in names[:limit]:
        rec = _read(spool, name)
        if rec is not None:
            out.append(rec)
        try:
            os.unlink(os.path.join(spool, DIR, name))  # unlink never follows a link
        except OSError as err:
            log.info("gate record %s not removed: %s", name, err)
    return out


def _read(spool: str, name: str) -> Optional[GateRecord]:
    try:
        data = safefs.read_file(spool, f"{DIR}/{name}", CAP)
        if data.truncated:
            raise ValueError(f"over {CAP} bytes")
        rec = msgspec.json.decode(data.data, type=GateRecord)
    except (OSError, UnsafePath, ValueError, msgspec.DecodeError) as err:  # ValidationError is a DecodeError
        log.warning("gate record %s dropped: %s", name, err)
        return None
    if not (node_name_ok(rec.node) and _JOB.fullmatch(rec.job)) or name != file_name(rec.job, rec.node):
        log.warning("gate record %s dropped: its name does not match the node and job inside", name)
        return None
    return rec


def record_all(store: Any, spool: str) -> int:
    """Take the waiting records into the store; how many decisions were added."""
    added = 0
    for rec in take(spool):
        job = rec.job
        have = {(a["node"], a["reason"], bool(a["applied"])) for a in store.actions(job) if a["path"] == "gate"}
        for g in rec.actions:
            act = Action(kind=g.kind, node=rec.node, reason=g.reason, applied=g.applied, blocked_by=g.blocked_by)
            if (rec.node, act.reason, act.applied) in have:
                continue
            store.record_actions(job, [act], path="gate", actor=f"prolog@{rec.node}")
            added += 1
            if act.applied and act.kind == "drain" and job != "idle" and not store.ledger_has(rec.node, [job]):
                store.ledger_record(rec.node, job, act.kind, "gate", act.reason, at=rec.at)
    return added
