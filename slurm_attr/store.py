"""The verdict store: SQLite through sqlite-utils.

Tables (storeschema.py): jobs, verdicts, symptoms, evidence, coverage, actions, comments (the
accounting-comment queue), meta (schema version); the drain circuit breaker: breaker (tripped
state), drain_ledger (automatic drains, the breaker's count) and undrains (who resumed which node,
and why); closing the loop: requeues, recoveries, diags. WAL and a busy timeout: the
detached analysers of jobs ending together write at once. The file lives on the controller's
local disk only (never on a filesystem several hosts write); a writer holding it longer than
the busy timeout makes calls fail with "database is locked", which callers retry (intake). Re-analysis of a job
replaces its rows. Per-node/GPU symptom history serves recurrence rules.
"""
from __future__ import annotations

import json
import os
import sqlite3
import time
from datetime import datetime, timezone
from typing import Any, Iterable, Iterator

import sqlite_utils

from .errors import NotFound, StoreError
from .model import Action, Verdict
from .storeactions import ActionLog
from .storeschema import FLEET_COLUMNS, MIGRATIONS, SCHEMA_VERSION, job_cost

BUSY_TIMEOUT_MS = 10_000


def _now() -> float:
    return time.time()


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, timezone.utc).isoformat(timespec="seconds")


def _epoch(iso: Any) -> float | None:
    """job.json's ISO 8601 time (with its offset) as epoch seconds; None when absent or bad."""
    try:
        return datetime.fromisoformat(str(iso)).timestamp() if iso else None
    except ValueError:
        return None


def is_locked(err: BaseException) -> bool:
    """SQLite's 'database is locked' / 'database is busy': another writer, retry later."""
    text = str(err).lower()
    return "database is locked" in text or "database is busy" in text or "database table is locked" in text


class Store(ActionLog):
    """The verdict store: jobs, verdicts and their parts, the comment queue; what was asked of
    Slurm (breaker, drains, undrains, requeues, recoveries, diagnostics) is storeactions.ActionLog."""

    def __init__(self, path: str | None = None, memory: bool = False):
        try:
            if memory or path is None:
                conn = sqlite3.connect(":memory:")
            else:
                # Root-only: users read their own verdicts from root-written copies (usercopy.py).
                os.makedirs(os.path.dirname(os.path.abspath(path)), mode=0o700, exist_ok=True)
                if not os.path.exists(path):
                    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o600))
                conn = sqlite3.connect(path, timeout=BUSY_TIMEOUT_MS / 1000)
                conn.execute("PRAGMA journal_mode=WAL")
            conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
            self.db = sqlite_utils.Database(conn)
            self._migrate()
        except sqlite3.Error as err:
            raise StoreError(f"cannot open verdict database {path}: {err}") from err
        self.path = path

    # -- schema ------------------------------------------------------------------
    def _migrate(self) -> None:
        self.db["meta"].create({"key": str, "value": str}, pk="key", if_not_exists=True)
        row = list(self.db.query("select value from meta where key = 'schema_version'"))
        version = int(row[0]["value"]) if row else 0
        if version > SCHEMA_VERSION:
            raise StoreError(f"database schema {version} is newer than this sattr ({SCHEMA_VERSION}): upgrade slurm-attr")
        for i in range(version, SCHEMA_VERSION):
            with self.db.conn:
                MIGRATIONS[i](self.db)
                self.db["meta"].upsert({"key": "schema_version", "value": str(i + 1)}, pk="key")

    @property
    def schema_version(self) -> int:
        return int(self.db["meta"].get("schema_version")["value"])

    # -- writing ---------------------------------------------------------------------
    def save(self, job: dict[str, Any], verdict: Verdict, bundle_path: str = "", analysis_ms: float = 0.0) -> None:
        """Store one job's verdict and its parts, replacing an earlier analysis of the job."""
        jid = verdict.job_id
        now = _now()
        key = os.path.basename(bundle_path.rstrip("/")) if bundle_path else jid
        with self.db.conn:
            self._keep_earlier_attempt(jid, key)
            for table in ("symptoms", "evidence", "coverage"):
                self.db.execute(f"delete from {table} where job_id = ?", [jid])
            self.db["jobs"].upsert({
                "job_id": jid, "slurm_job_id": str(job.get("slurm_job_id") or jid.split("_")[0]),
                "bundle_key": key,
                "user": job.get("user"), "uid": job.get("uid"), "partition": job.get("partition"),
                "nodes": json.dumps(job.get("nodes") or []), "state": job.get("state"),
                "exit_code": job.get("exit_code"), "signal": job.get("signal"),
                "start_time": job.get("start_time"), "end_time": job.get("end_time"),
                "gpus": job.get("gpus"), "elapsed_s": job.get("elapsed_s"),
                "bundle_path": bundle_path, "updated_at": now,
            }, pk="job_id", alter=True)
            d = verdict.to_dict()
            self.db["verdicts"].upsert({
                "job_id": jid, "cause": verdict.cause, "domain": verdict.domain, "summary": verdict.summary,
                "ambiguous": int(verdict.ambiguous), "culprit_nodes": json.dumps(verdict.culprit_nodes),
                "culprit_ranks": json.dumps(verdict.culprit_ranks), "culprit_gpus": json.dumps(verdict.culprit_gpus),
                "verdict_json": json.dumps(d), "analyzed_at": now, "analysis_ms": analysis_ms,
            }, pk="job_id", alter=True)
            end = _epoch(job.get("end_time"))
            failed, lost = job_cost(job.get("state"), job.get("gpus"), job.get("elapsed_s"))
            # latency: the first analysis only, a re-analysis keeps it
            self.db.execute(
                f"insert into fleet ({', '.join(FLEET_COLUMNS)}) values ({', '.join('?' * len(FLEET_COLUMNS))}) "
                "on conflict(job_id) do update set analyzed_at = excluded.analyzed_at, partition = excluded.partition, "
                "user = excluded.user, cause = excluded.cause, domain = excluded.domain, failed = excluded.failed, "
                "lost_gpu_h = excluded.lost_gpu_h, latency_s = coalesce(fleet.latency_s, excluded.latency_s), "
                "culprit_nodes = excluded.culprit_nodes",
                [jid, now, job.get("partition") or "", job.get("user"), verdict.cause, verdict.domain, failed, lost,
                 max(0.0, now - end) if end is not None else None, json.dumps(verdict.culprit_nodes)])
            for s in verdict.symptoms:
                sid = self.db["symptoms"].insert({
                    "job_id": jid, "rule_id": s.id, "cause": s.cause, "role": s.role, "priority": s.priority,
                    "trusted": int(s.trusted), "node": s.node, "rank": s.rank, "gpu": s.gpu, "time": s.time,
                    "action": s.action, "summary": s.summary, "fields_json": json.dumps(s.fields, default=str),
                    "seen_at": now,
                }).last_pk
                self.db["evidence"].insert_all(
                    ({"symptom_id": sid, "job_id": jid, "source": e.source, "path": e.path, "line": e.line,
                      "text": (e.text or "")[:2000]} for e in s.evidence))
            self.db["coverage"].insert_all(
                ({"job_id": jid, **c.to_dict()} for c in verdict.coverage))

    def _keep_earlier_attempt(self, job_id: str, bundle_key: str) -> None:
        """The job's stored verdict, when it is another attempt's (bundle ``<id>`` before
        ``<id>.r1``), into ``attempts`` before this one replaces it."""
        row = self.db.execute(
            "select j.bundle_key, v.cause, v.domain, v.summary, v.culprit_nodes, v.verdict_json, v.analyzed_at "
            "from jobs j join verdicts v on v.job_id = j.job_id where j.job_id = ?", [job_id]).fetchone()
        if row is None or not row[0] or row[0] == bundle_key:
            return
        self.db["attempts"].upsert(dict(zip(
            ("bundle_key", "cause", "domain", "summary", "culprit_nodes", "verdict_json", "analyzed_at"), row),
            job_id=job_id), pk=("job_id", "bundle_key"))

    def earlier_attempts(self, job_id: str) -> list[dict[str, Any]]:
        """A requeued job's earlier attempts' verdicts (not the stored one), oldest first."""
        return [{"bundle_key": r["bundle_key"], "cause": r["cause"], "domain": r["domain"], "summary": r["summary"],
                 "culprit_nodes": json.loads(r["culprit_nodes"] or "[]"), "analyzed_at": r["analyzed_at"]}
                for r in self.db.query("select * from attempts where job_id = ? and bundle_key != "
                                       "(select coalesce(bundle_key, '') from jobs where job_id = ?) order by analyzed_at",
                                       [job_id, job_id])]

    def record_actions(self, job_id: str, actions: Iterable[Action], path: str, actor: str = "sattr") -> None:
        with self.db.conn:
            self.db["actions"].insert_all(
                ({"job_id": job_id, "kind": a.kind, "node": a.node, "reason": a.reason, "applied": int(a.applied),
                  "blocked_by": a.blocked_by, "decided_at": _now(), "path": path, "actor": actor} for a in actions))

    # -- reading ----------------------------------------------------------------------
    def verdict(self, job_id: str) -> Verdict:
        rows = list(self.db.query("select verdict_json from verdicts where job_id = ?", [job_id]))
        if not rows:
            raise NotFound(f"no verdict for job {job_id}: not analysed yet, or not run under slurm-attr")
        return Verdict.from_dict(json.loads(rows[0]["verdict_json"]))

    def job(self, job_id: str) -> dict[str, Any]:
        try:
            row = dict(self.db["jobs"].get(job_id))
        except sqlite_utils.db.NotFoundError as err:
            raise NotFound(f"job {job_id} is not in the verdict database") from err
        row["nodes"] = json.loads(row.get("nodes") or "[]")
        return row

    def verdict_attempts(self, slurm_job_ids: Iterable[str]) -> dict[str, int]:
        """For each raw Slurm job id (the spool's key, an array task's own id) with a stored
        verdict, the requeue attempt that verdict is of: 0 for bundle ``<id>``, N for
        ``<id>.rN``. Retention (gc.py) asks this for every bundle on the spool at once, in
        one query: a bundle whose attempt has no verdict yet is not removed to save space."""
        ids = sorted({str(j) for j in slurm_job_ids})
        if not ids:
            return {}
        rows = self.db.query(
            "select j.slurm_job_id as sid, j.bundle_key as bkey from jobs j join verdicts v on v.job_id = j.job_id "
            "where j.slurm_job_id in (select value from json_each(?))", [json.dumps(ids)])
        out: dict[str, int] = {}
        for r in rows:
            sid, bkey = str(r["sid"]), str(r["bkey"] or "")
            rest = bkey[len(sid) + 2:] if bkey.startswith(sid + ".r") else ""
            out[sid] = max(out.get(sid, 0), int(rest) if rest.isdigit() else 0)
        return out

    def jobs(self, since: float | None = None, user: str | None = None, cause: str | None = None,
             node: str | None = None, limit: int = 200) -> list[dict[str, Any]]:
        sql = ["select j.*, v.cause, v.domain, v.summary, v.culprit_nodes, v.analyzed_at from jobs j",
               "join verdicts v on v.job_id = j.job_id where 1=1"]
        args: list[Any] = []
        if since is not None:
            sql.append("and v.analyzed_at >= ?"); args.append(since)
        if user:
            sql.append("and j.user = ?"); args.append(user)
        if cause:
            sql.append("and v.cause = ?"); args.append(cause)
        if node:
            sql.append("and exists (select 1 from json_each(j.nodes) where value = ?)"); args.append(node)
        sql.append("order by v.analyzed_at desc limit ?"); args.append(limit)
        return [dict(r) for r in self.db.query(" ".join(sql), args)]

    def gpu_symptom_jobs(self, node: str, gpu: str, symptom_id: str, since_epoch: float,
                         exclude_job: str) -> set[str]:
        """Other jobs that showed symptom_id on node+gpu since the given time (recurrence)."""
        rows = self.db.query(
            "select distinct job_id from symptoms where node = ? and gpu = ? and rule_id = ? "
            "and seen_at >= ? and job_id != ?", [node, gpu, symptom_id, since_epoch, exclude_job])
        return {r["job_id"] for r in rows}

    def actions(self, job_id: str | None = None, since: float | None = None, limit: int = 500) -> list[dict[str, Any]]:
        sql = "select * from actions where 1=1"
        args: list[Any] = []
        if job_id:
            sql += " and job_id = ?"; args.append(job_id)
        if since is not None:
            sql += " and decided_at >= ?"; args.append(since)
        sql += " order by decided_at desc, id desc limit ?"; args.append(limit)
        return [dict(r) for r in self.db.query(sql, args)]

    # -- the accounting-comment queue ----------------------------------------------------
    def queue_comment(self, job_id: str, slurm_job_id: str, field: str, text: str) -> None:
        self.db["comments"].upsert({"job_id": job_id, "slurm_job_id": slurm_job_id, "field": field, "text": text,
                                    "status": "pending", "attempts": 0, "last_error": "", "updated_at": _now()},
                                   pk=("job_id", "field"))

    def comment_result(self, job_id: str, field: str, ok: bool, error: str = "", give_up_after: int = 50,
                       final: str = "written") -> None:
        """ok: the entry ends ``final`` (written, or skipped: comment.FOREIGN); not ok: pending
        again, or failed after give_up_after attempts."""
        row = self.comment(job_id, field)
        if row is None:
            return  # dequeued meanwhile (a re-analysis replaced it)
        attempts = int(row.get("attempts") or 0) + 1
        status = final if ok else ("failed" if attempts >= give_up_after else "pending")
        self.db["comments"].update((job_id, field), {"status": status, "attempts": attempts,
                                                     "last_error": error[:500], "updated_at": _now()})

    def comment(self, job_id: str, field: str = "Comment") -> dict[str, Any] | None:
        rows = list(self.db.query("select * from comments where job_id = ? and field = ?", [job_id, field]))
        return dict(rows[0]) if rows else None

    def job_comments(self, job_id: str) -> list[dict[str, Any]]:
        """Every queued or written field of one job (Comment first)."""
        return [dict(r) for r in self.db.query(
            "select * from comments where job_id = ? order by field = 'AdminComment', field", [job_id])]

    def comment_status(self, job_id: str) -> str | None:
        """written when every field of the job is done (written, or skipped where another tool
        holds the AdminComment); else the first field's status that is not."""
        rows = self.job_comments(job_id)
        if not rows:
            return None
        return next((r["status"] for r in rows if r["status"] not in ("written", "skipped")), "written")

    def pending_comments(self) -> Iterator[dict[str, Any]]:
        yield from (dict(r) for r in self.db.query("select * from comments where status = 'pending' order by updated_at"))


def open_store(path: str) -> Store:
    return Store(path)
