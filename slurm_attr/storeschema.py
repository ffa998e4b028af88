"""The verdict store's schema: one migration per version, applied in order by Store.

Version 1: jobs, verdicts, symptoms, evidence, coverage, actions, comments (the accounting-comment
queue). 2: the drain circuit breaker (breaker, drain_ledger, undrains). 3: closing the loop through
Slurm (requeues, recoveries, diags) and one comment queue entry per job and field.
"""
from __future__ import annotations

import sqlite_utils

SCHEMA_VERSION = 3


# Each migration takes the schema from version i to i+1; index 0 creates version 1.
def _m1(db: sqlite_utils.Database) -> None:
    db["jobs"].create({
        "job_id": str, "slurm_job_id": str, "bundle_key": str, "user": str, "uid": int, "partition": str,
        "nodes": str, "state": str, "exit_code": int, "signal": int, "start_time": str, "end_time": str,
        "bundle_path": str, "updated_at": float,
    }, pk="job_id", if_not_exists=True)
    db["verdicts"].create({
        "job_id": str, "cause": str, "domain": str, "summary": str, "ambiguous": int,
        "culprit_nodes": str, "culprit_ranks": str, "culprit_gpus": str, "verdict_json": str,
        "analyzed_at": float, "analysis_ms": float,
    }, pk="job_id", if_not_exists=True)
    db["symptoms"].create({
        "id": int, "job_id": str, "rule_id": str, "cause": str, "role": str, "priority": int,
        "trusted": int, "node": str, "rank": int, "gpu": str, "time": str, "action": str,
        "summary": str, "fields_json": str, "seen_at": float,
    }, pk="id", if_not_exists=True)
    db["evidence"].create({
        "id": int, "symptom_id": int, "job_id": str, "source": str, "path": str, "line": int, "text": str,
    }, pk="id", if_not_exists=True)
    db["coverage"].create({
        "id": int, "job_id": str, "source": str, "node": str, "status": str, "detail": str,
    }, pk="id", if_not_exists=True)
    db["actions"].create({
        "id": int, "job_id": str, "kind": str, "node": str, "reason": str, "applied": int,
        "blocked_by": str, "decided_at": float, "path": str, "actor": str,
    }, pk="id", if_not_exists=True)
    db["comments"].create({
        "job_id": str, "slurm_job_id": str, "field": str, "text": str, "status": str, "attempts": int,
        "last_error": str, "updated_at": float,
    }, pk="job_id", if_not_exists=True)
    db["symptoms"].create_index(["node", "gpu", "rule_id"], if_not_exists=True)
    db["symptoms"].create_index(["job_id"], if_not_exists=True)
    db["evidence"].create_index(["job_id"], if_not_exists=True)
    db["coverage"].create_index(["job_id"], if_not_exists=True)
    db["actions"].create_index(["job_id"], if_not_exists=True)
    db["actions"].create_index(["decided_at"], if_not_exists=True)


def _m2(db: sqlite_utils.Database) -> None:
    # The circuit breaker (drain.py, breaker.py): one row per breaker name.
    db["breaker"].create({
        "name": str, "tripped": int, "tripped_at": float, "why": str, "reset_at": float, "reset_by": str,
        "reset_why": str,
    }, pk="name", if_not_exists=True)
    # Every automatic drain or reboot claimed or carried out: what the breaker counts. A claim is
    # written before scontrol runs, in one transaction with the count, so concurrent analysers
    # cannot both take the last slot; status claimed -> applied, or released when Slurm refused.
    db["drain_ledger"].create({
        "id": int, "node": str, "job_id": str, "kind": str, "path": str, "partitions": str, "reason": str,
        "at": float, "status": str,
    }, pk="id", if_not_exists=True)
    db["undrains"].create({
        "id": int, "node": str, "job_id": str, "drain_reason": str, "why": str, "actor": str, "at": float,
        "ok": int, "detail": str,
    }, pk="id", if_not_exists=True)
    db["drain_ledger"].create_index(["at"], if_not_exists=True)
    db["drain_ledger"].create_index(["node", "job_id"], if_not_exists=True)
    db["undrains"].create_index(["at"], if_not_exists=True)


def _m3(db: sqlite_utils.Database) -> None:
    # Closing the loop (actions.py): each requeue slurm-attr asked of Slurm, each recovery action
    # (GPU reset command, reboot) beyond the drain, and each node diagnostic run before a resume.
    db["requeues"].create({
        "id": int, "job_id": str, "slurm_job_id": str, "attempt": int, "cause": str, "excluded": str,
        "expedite": int, "at": float, "ok": int, "detail": str,
    }, pk="id", if_not_exists=True)
    db["recoveries"].create({
        "id": int, "job_id": str, "node": str, "gpu": str, "kind": str, "command": str, "rc": int,
        "at": float, "ok": int, "detail": str,
    }, pk="id", if_not_exists=True)
    db["diags"].create({
        "id": int, "node": str, "command": str, "rc": int, "ok": int, "at": float, "took_s": float,
        "output": str, "actor": str, "trigger": str,
    }, pk="id", if_not_exists=True)
    # A job's verdict may go into Comment and AdminComment both ([actions] admin_comment): one
    # queue entry per job and field.
    db["comments"].transform(pk=("job_id", "field"))
    db["requeues"].create_index(["slurm_job_id"], if_not_exists=True)
    db["recoveries"].create_index(["at"], if_not_exists=True)
    db["diags"].create_index(["node", "at"], if_not_exists=True)


MIGRATIONS = [_m1, _m2, _m3]
