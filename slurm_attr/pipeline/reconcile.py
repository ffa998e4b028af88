"""The central store catches up with drains the node epilogs made without it.

The fast path (fastpath.py) drains from the node with Slurm alone. Its decisions reach
the store here: from ``nodes/<node>/fastpath.json`` in the bundle when the spool took it,
and in any case from Slurm's reasons (``SATTR: ... job N`` with the reason's time),
which also feed the breaker's ledger so its count matches what Slurm shows.
"""
from __future__ import annotations

import json
import logging
import os
import re
from typing import Any

from .. import safefs
from ..errors import SlurmError, UnsafePath
from ..model import Action, Evidence, Symptom, domain_of
from ..slurmstate import NodeState, reason_job

log = logging.getLogger("slurm_attr")

FAST_JSON_CAP = 64 << 10


def _from_bundle(bundle_dir: str, nodes: list[str]) -> list[tuple[Action, str]]:
    out: list[tuple[Action, str]] = []
    for node in nodes:
        try:
            data = safefs.read_file(bundle_dir, f"nodes/{node}/fastpath.json", FAST_JSON_CAP).data
            rows = json.loads(data)
        except (UnsafePath, ValueError):
            continue
        for r in rows if isinstance(rows, list) else []:
            if not isinstance(r, dict) or r.get("node") != node:
                continue  # a node part speaks for its own node only
            out.append((Action(kind=str(r.get("kind") or "drain"), node=node, reason=str(r.get("reason") or "")[:200],
                               applied=bool(r.get("applied")), blocked_by=r.get("blocked_by")), f"epilog@{node}"))
    return out


def fast_decisions(bundle_dir: str, job: dict[str, Any], slurm: Any, store: Any) -> list[tuple[Action, str]]:
    """The fast path's decisions for this job's nodes: (action, actor)."""
    ids = {str(job.get("job_id") or ""), str(job.get("slurm_job_id") or "")} - {""}
    nodes = [n for n in job.get("nodes") or [] if isinstance(n, str)]
    found = _from_bundle(bundle_dir, nodes) if bundle_dir else []
    seen = {a.node for a, _ in found if a.applied}
    for node in nodes:
        if node in seen:
            continue
        try:
            # A worker's batch answers from one node listing (slurm/batched.py), not one RPC per node.
            listed = getattr(slurm, "node_record", None)
            rec = listed(node) if listed else slurm.show_node(node)
        except SlurmError:
            continue
        st = NodeState.from_record(rec or {})
        if st.out_of_service and st.ours and reason_job(st.reason) in ids:
            found.append((Action(kind="drain", node=node, reason=st.reason, applied=True), "slurm reason"))
    return found


def record_fast(store: Any, job_id: str, fast: list[tuple[Action, str]]) -> None:
    """Store fast-path decisions once each, and count applied drains in the breaker's ledger."""
    done = {(a["node"], a["reason"], bool(a["applied"])) for a in store.actions(job_id) if a["path"] == "fast"}
    for act, actor in fast:
        if (act.node, act.reason, act.applied) in done:
            continue
        store.record_actions(job_id, [act], path="fast", actor=actor)
        done.add((act.node, act.reason, act.applied))
        if act.applied and not store.ledger_has(act.node or "", [job_id]):
            store.ledger_record(act.node or "", job_id, act.kind, "fast", act.reason)


def reconcile_all(store: Any, slurm: Any) -> int:
    """Every SATTR: drain Slurm shows that the store does not know of: recorded (path fast).
    Returns how many were added."""
    try:
        records = slurm.nodes()
    except SlurmError as err:
        log.info("reconcile: slurm not answering (%s)", err)
        return 0
    added = 0
    for rec in records:
        st = NodeState.from_record(rec)
        job = reason_job(st.reason)
        if not (st.out_of_service and st.ours and job):
            continue
        if store.ledger_has(st.name, [job]):
            continue
        store.record_actions(job, [Action(kind="drain", node=st.name, reason=st.reason, applied=True)], path="fast",
                             actor="slurm reason")
        store.ledger_record(st.name, job, "drain", "fast", st.reason, at=st.reason_time)
        added += 1
    return added


_XID = re.compile(r"\bxid(\d+)\b")
# drain.reason_for's GPU word: "gpu" + the PCI address without domain 0 ("gpu3b:00"). It starts with
# a hex digit, so the cause word before it ("gpu_hardware") is never read as a GPU named "_hardware".
_GPU = re.compile(r"\bgpu([0-9A-Fa-f][0-9A-Fa-f:.]*)(?=\s|$)")


def reason_symptoms(bundle_dir: str, fast: list[tuple[Action, str]]) -> list[Symptom]:
    """The fast path's finding, for a node whose kernel window never reached the spool (full,
    read-only): its drain reason in Slurm (trusted: only root sets it) stands in for the lines."""
    out = []
    for act, actor in fast:
        node = act.node or ""
        if not act.applied or not node:
            continue
        if bundle_dir and os.path.isfile(os.path.join(bundle_dir, "nodes", node, "kernel.log")):
            continue  # the analysis has the lines themselves
        words = act.reason.split()
        cause = words[1] if len(words) > 1 and domain_of(words[1]) == "hardware" else "gpu_hardware"
        xid = _XID.search(act.reason)
        gpu = _GPU.search(act.reason)
        out.append(Symptom(
            id="sattr.fast_path_drain", cause=cause, role="root", priority=90, trusted=True, node=node,
            gpu=gpu.group(1) if gpu else None, action="drain",
            summary=f"{node} drained by its node epilog on fatal kernel evidence ({act.reason})",
            fields={"xid": int(xid.group(1))} if xid else {},
            evidence=[Evidence(source="slurm", path="sinfo -R", line=None, text=act.reason)]))
    return out
