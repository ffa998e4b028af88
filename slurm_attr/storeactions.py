"""What slurm-attr asked of Slurm, as the store keeps it (schemas 2 and 3): the drain circuit
breaker and its ledger, undrains, requeues, recovery actions and node diagnostics. A mixin of
store.Store: the same connection, the same transactions (``Store.transaction``)."""
from __future__ import annotations

import json
import time
from contextlib import contextmanager
from typing import Any, Iterable, Iterator

import sqlite_utils


def _now() -> float:
    return time.time()


class ActionLog:
    db: sqlite_utils.Database

    # -- transactions ------------------------------------------------------------------
    @contextmanager
    def transaction(self) -> Iterator[None]:
        """An IMMEDIATE transaction: the write lock is taken at once, so a read-then-write
        decision (the breaker's count, then its claim) is atomic across processes."""
        conn = self.db.conn
        if conn.in_transaction:
            conn.commit()
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            conn.rollback()
            raise
        conn.commit()

    # -- drain circuit breaker (schema 2) -------------------------------------------------
    def breaker(self, name: str = "drain") -> dict[str, Any]:
        rows = list(self.db.query("select * from breaker where name = ?", [name]))
        if rows:
            return dict(rows[0])
        return {"name": name, "tripped": 0, "tripped_at": None, "why": "", "reset_at": None, "reset_by": "",
                "reset_why": ""}

    def trip_breaker(self, why: str, name: str = "drain") -> None:
        """Trip the breaker (no-op when already tripped: the first reason is kept). Call inside
        ``transaction()``."""
        cur = self.breaker(name)
        if cur["tripped"]:
            return
        cur.update({"tripped": 1, "tripped_at": _now(), "why": why[:500]})
        self._put_breaker(cur)

    def _put_breaker(self, row: dict[str, Any]) -> None:
        # Plain SQL: sqlite-utils' writes commit on their own, which would end a caller's transaction early.
        cols = ("name", "tripped", "tripped_at", "why", "reset_at", "reset_by", "reset_why")
        self.db.conn.execute(f"insert or replace into breaker ({', '.join(cols)}) values ({', '.join('?' for _ in cols)})",
                             [row.get(c) for c in cols])

    def reset_breaker(self, actor: str, why: str = "", name: str = "drain") -> dict[str, Any]:
        """Close the breaker; drains before now no longer count towards its window."""
        with self.transaction():
            cur = self.breaker(name)
            cur.update({"tripped": 0, "reset_at": _now(), "reset_by": actor, "reset_why": why[:500]})
            self._put_breaker(cur)
        return cur

    def ledger_count(self, since: float) -> int:
        rows = list(self.db.query(
            "select count(*) as n from drain_ledger where at >= ? and status in ('claimed', 'applied')", [since]))
        return int(rows[0]["n"])

    def ledger_inflight(self, since: float) -> list[dict[str, Any]]:
        """Claims not settled yet (scontrol running in another process), newer than since."""
        return [dict(r) for r in self.db.query(
            "select * from drain_ledger where at >= ? and status = 'claimed' order by at", [since])]

    def ledger_has(self, node: str, job_ids: Iterable[str]) -> bool:
        """Whether we already drained (or are draining) node for one of these job ids."""
        ids = [j for j in job_ids if j]
        if not ids:
            return False
        marks = ",".join("?" for _ in ids)
        rows = list(self.db.query(
            f"select 1 from drain_ledger where node = ? and job_id in ({marks}) and status in ('claimed', 'applied') "
            "limit 1", [node, *ids]))
        return bool(rows)

    def ledger_claim(self, node: str, job_id: str, kind: str, path: str, partitions: list[str], reason: str) -> int:
        """Write a claim; call inside ``transaction()`` after checking the count."""
        cur = self.db.conn.execute(
            "insert into drain_ledger (node, job_id, kind, path, partitions, reason, at, status) "
            "values (?, ?, ?, ?, ?, ?, ?, 'claimed')", [node, job_id, kind, path, json.dumps(partitions), reason, _now()])
        return int(cur.lastrowid)

    def ledger_record(self, node: str, job_id: str, kind: str, path: str, reason: str, at: float | None = None,
                      partitions: list[str] | None = None) -> None:
        """A drain carried out elsewhere (the fast path, found in Slurm's reason): applied at ``at``."""
        with self.db.conn:
            self.db.conn.execute(
                "insert into drain_ledger (node, job_id, kind, path, partitions, reason, at, status) "
                "values (?, ?, ?, ?, ?, ?, ?, 'applied')",
                [node, job_id, kind, path, json.dumps(partitions or []), reason, at if at is not None else _now()])

    def ledger_settle(self, claim_id: int, status: str, kind: str | None = None) -> None:
        """claimed -> applied (with the kind actually used) or released (Slurm refused)."""
        upd: dict[str, Any] = {"status": status}
        if kind:
            upd["kind"] = kind
        with self.db.conn:
            self.db["drain_ledger"].update(claim_id, upd)

    def record_undrain(self, node: str, job_id: str, drain_reason: str, why: str, actor: str, ok: bool,
                       detail: str = "") -> None:
        with self.db.conn:
            self.db["undrains"].insert({"node": node, "job_id": job_id, "drain_reason": drain_reason, "why": why,
                                        "actor": actor, "at": _now(), "ok": int(ok), "detail": detail[:500]})

    def undrains(self, since: float | None = None, limit: int = 500) -> list[dict[str, Any]]:
        sql, args = "select * from undrains", []
        if since is not None:
            sql += " where at >= ?"; args.append(since)
        sql += " order by at desc, id desc limit ?"; args.append(limit)
        return [dict(r) for r in self.db.query(sql, args)]

    # -- closing the loop: requeues, recovery actions, diagnostics (actions.py) --------------
    def record_requeue(self, row: dict[str, Any]) -> None:
        with self.db.conn:
            self.db["requeues"].insert({**row, "at": row.get("at") or _now()})

    def requeues(self, slurm_job_id: str | None = None, since: float | None = None) -> list[dict[str, Any]]:
        sql, args = "select * from requeues where 1", []
        if slurm_job_id is not None:
            sql += " and slurm_job_id = ?"; args.append(slurm_job_id)
        if since is not None:
            sql += " and at >= ?"; args.append(since)
        return [dict(r) for r in self.db.query(sql + " order by at, id", args)]

    def record_recovery(self, row: dict[str, Any]) -> None:
        with self.db.conn:
            self.db["recoveries"].insert({**row, "at": row.get("at") or _now()})

    def recoveries(self, job_id: str | None = None, since: float | None = None) -> list[dict[str, Any]]:
        sql, args = "select * from recoveries where 1", []
        if job_id is not None:
            sql += " and job_id = ?"; args.append(job_id)
        if since is not None:
            sql += " and at >= ?"; args.append(since)
        return [dict(r) for r in self.db.query(sql + " order by at, id", args)]

    def record_diag(self, row: dict[str, Any]) -> None:
        with self.db.conn:
            self.db["diags"].insert({**row, "at": row.get("at") or _now()})

    def diags(self, node: str | None = None, since: float | None = None) -> list[dict[str, Any]]:
        sql, args = "select * from diags where 1", []
        if node is not None:
            sql += " and node = ?"; args.append(node)
        if since is not None:
            sql += " and at >= ?"; args.append(since)
        return [dict(r) for r in self.db.query(sql + " order by at, id", args)]
