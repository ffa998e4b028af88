"""The verdict store's schema: one migration per version, applied in order by Store.

Version 1: jobs, verdicts, symptoms, evidence, coverage, actions, comments (the accounting-comment
queue). 2: the drain circuit breaker (breaker, drain_ledger, undrains). 3: closing the loop through
Slurm (requeues, recoveries, diags) and one comment queue entry per job and field. 4: the fleet
view (fleet/): a job's allocated GPUs and elapsed seconds, and the fleet table (one narrow row per
verdict: GPU-hours lost, latency of the first verdict); a requeued job's earlier attempts' verdicts.
"""
from __future__ import annotations

import sqlite_utils

SCHEMA_VERSION = 4


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


def job_cost(state: object, gpus: object, elapsed_s: object) -> tuple[int, float]:
    """(1 when the job did not complete, the GPU-hours its failure cost): allocated GPUs x
    elapsed hours for a job whose final state is not COMPLETED; 0 where either is unknown
    (a job stored before accounting gave them, a Slurm without AccountingStorageTRES=gres/gpu)."""
    failed = int(str(state or "") != "COMPLETED")
    try:
        g, e = float(gpus or 0), float(elapsed_s or 0)
    except (TypeError, ValueError):
        return failed, 0.0
    return failed, (g * e / 3600.0 if failed and g > 0 and e > 0 else 0.0)


FLEET_COLUMNS = ("job_id", "analyzed_at", "partition", "user", "cause", "domain", "failed", "lost_gpu_h",
                 "latency_s", "culprit_nodes")


def _m4(db: sqlite_utils.Database) -> None:
    # GPU-hours lost: accounting's AllocTRES gres/gpu and Elapsed, taken with the final state;
    # NULL for jobs stored before (unknown, not zero).
    for col, kind in (("gpus", int), ("elapsed_s", float)):
        if col not in db["jobs"].columns_dict:  # a store stamped older than its tables (downgraded, then upgraded)
            db["jobs"].add_column(col, kind)
    # A requeued job's earlier attempts: their verdicts, kept when the next attempt's verdict
    # replaces the job's row (issue 24: both attempts' verdicts stay readable).
    db["attempts"].create({
        "job_id": str, "bundle_key": str, "cause": str, "domain": str, "summary": str, "culprit_nodes": str,
        "verdict_json": str, "analyzed_at": float,
    }, pk=("job_id", "bundle_key"), if_not_exists=True)
    # The fleet view (fleet/queries.py) reads every verdict of a window: a narrow row per job
    # with what it aggregates, written with the verdict. The verdicts table's rows carry the
    # whole verdict JSON (SQLite walks its overflow pages to reach a later column): reading
    # 100,000 of them there costs several times this. latency_s: job end -> first verdict,
    # kept through re-analyses (a re-analysis a week later is not the analysis latency).
    db["fleet"].create({
        "job_id": str, "analyzed_at": float, "partition": str, "user": str, "cause": str, "domain": str,
        "failed": int, "lost_gpu_h": float, "latency_s": float, "culprit_nodes": str,
    }, pk="job_id", if_not_exists=True)
    rows = db.execute(
        "select v.job_id, v.analyzed_at, coalesce(j.partition, ''), j.user, v.cause, v.domain, j.state, j.gpus, "
        "j.elapsed_s, v.culprit_nodes from verdicts v join jobs j on j.job_id = v.job_id").fetchall()
    db["fleet"].insert_all(
        (dict(zip(FLEET_COLUMNS, (jid, at, part, user, cause, domain, *job_cost(state, gpus, el), None, nodes)))
         for jid, at, part, user, cause, domain, state, gpus, el, nodes in rows), replace=True)
    # Each index covers one family of the fleet's queries, so none reads the table's rows.
    db["fleet"].create_index(["partition", "cause", "domain", "failed", "lost_gpu_h", "analyzed_at"], if_not_exists=True)
    db["fleet"].create_index(["cause", "lost_gpu_h", "analyzed_at"], if_not_exists=True)
    db["fleet"].create_index(["latency_s", "analyzed_at"], if_not_exists=True)
    db["fleet"].create_index(["user", "cause", "failed", "lost_gpu_h", "analyzed_at"], if_not_exists=True)
    db["fleet"].create_index(["analyzed_at"], if_not_exists=True)
    db["symptoms"].create_index(["seen_at"], if_not_exists=True)


MIGRATIONS = [_m1, _m2, _m3, _m4]
