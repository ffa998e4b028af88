"""The verdict store's retention: jobs analysed longer ago than ``[store] keep_days`` go.

Without it the store grows by a few KB per job forever (its verdict JSON, symptoms, evidence
lines, the fleet row). What goes, per job: its job row, verdict, symptoms, evidence, coverage,
actions, comment queue entries, earlier attempts and fleet row; and the requeues, recoveries,
diagnostics and undrains older than the cut. What stays: the breaker, and each node's newest
drain ledger row (whether a node's drain is ours is read from it), whatever its age.

Deleted in batches of jobs, one short transaction each, so that analysis workers writing
verdicts meanwhile wait for a batch, not for the whole prune. The cut can never fall inside
the windows the reasoning reads back (30 days of a GPU's history, the auto-undrain's 30 days):
configcheck refuses ``keep_days`` under MIN_KEEP_DAYS.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterator

from . import turns
from .store import Store

if TYPE_CHECKING:
    from .config import Config

log = logging.getLogger("slurm_attr")

# the longest look-back of anything that reads the store: recurrence rules and auto_undrain (30 days)
MIN_KEEP_DAYS = 31.0
BATCH = 2000
# tables keyed by the job's store id; each delete is by job_id
JOB_TABLES = ("evidence", "symptoms", "coverage", "actions", "comments", "attempts", "fleet", "verdicts", "jobs")
# tables of dated rows: (table, time column)
DATED_TABLES = (("requeues", "at"), ("recoveries", "at"), ("diags", "at"), ("undrains", "at"))


@dataclass
class PruneResult:
    cutoff: float
    jobs: int = 0
    rows: dict[str, int] = field(default_factory=dict)
    dry_run: bool = False

    def as_dict(self) -> dict[str, object]:
        return {"cutoff": self.cutoff, "jobs": self.jobs, "rows": dict(sorted(self.rows.items())),
                "dry_run": self.dry_run}


def _old_jobs(store: Store, cutoff: float) -> Iterator[list[str]]:
    """Batches of the store ids of jobs last analysed (or, with no verdict, last updated) before
    the cut; never one with a verdict newer than the cut."""
    db = store.db
    while True:
        rows = db.execute(
            "select j.job_id from jobs j left join verdicts v on v.job_id = j.job_id "
            "where coalesce(v.analyzed_at, j.updated_at, 0) < ? limit ?", [cutoff, BATCH]).fetchall()
        if not rows:
            return
        yield [r[0] for r in rows]


def _count_old(store: Store, cutoff: float) -> int:
    return int(store.db.execute(
        "select count(*) from jobs j left join verdicts v on v.job_id = j.job_id "
        "where coalesce(v.analyzed_at, j.updated_at, 0) < ?", [cutoff]).fetchone()[0])


def _tables(store: Store) -> set[str]:
    return set(store.db.table_names())


def prune(store: Store, keep_days: float, now: float | None = None, dry_run: bool = False) -> PruneResult:
    """Delete what is older than ``keep_days`` (0 keeps everything); a dry run only counts."""
    now = time.time() if now is None else now
    res = PruneResult(cutoff=now - keep_days * 86400.0 if keep_days > 0 else 0.0, dry_run=dry_run)
    if keep_days <= 0:
        return res
    if keep_days < MIN_KEEP_DAYS:
        raise ValueError(f"keep_days {keep_days} is under {MIN_KEEP_DAYS}: the reasoning reads 30 days back")
    tables = _tables(store)
    db = store.db
    if dry_run:
        res.jobs = _count_old(store, res.cutoff)
    else:
        for ids in _old_jobs(store, res.cutoff):
            marks = ",".join("?" * len(ids))
            with store.transaction():
                for t in JOB_TABLES:
                    if t in tables:
                        n = db.execute(f"delete from [{t}] where job_id in ({marks})", ids).rowcount
                        res.rows[t] = res.rows.get(t, 0) + max(n, 0)
            res.jobs += len(ids)
    with store.transaction():
        for t, col in DATED_TABLES:
            if t in tables:
                res.rows[t] = _delete_or_count(store, f"from [{t}] where [{col}] < ?", [res.cutoff], dry_run)
        if "drain_ledger" in tables:
            # each node's newest row stays: whether its drain is ours is read from it
            res.rows["drain_ledger"] = _delete_or_count(
                store, "from drain_ledger where at < ? and id not in (select max(id) from drain_ledger group by node)",
                [res.cutoff], dry_run)
    return res


def _delete_or_count(store: Store, where: str, args: list[object], dry_run: bool) -> int:
    if dry_run:
        return int(store.db.execute(f"select count(*) {where}", args).fetchone()[0])
    return max(store.db.execute(f"delete {where}", args).rowcount, 0)


STAMP = ".store-prune-turn"
EVERY_S = 86400.0


def maybe_prune(cfg: "Config", now: float | None = None) -> PruneResult | None:
    """``prune`` at most once a day (a turn stamp in the intake dir), for the workers' and
    `sattr retry`'s housekeeping; never raises (retention must not cost a verdict)."""
    now = time.time() if now is None else now
    if cfg.store.keep_days <= 0:
        return None
    try:
        if not turns.take(cfg.intake.queue_dir, STAMP, EVERY_S, now):
            return None
        res = prune(Store(cfg.paths.database), cfg.store.keep_days, now)
    except Exception as err:  # noqa: BLE001 - a locked or broken store: the next turn tries again
        log.error("store prune failed: %s", err)
        return None
    if res.jobs:
        log.info("store prune: %d jobs analysed before %s removed", res.jobs, time.strftime("%F", time.gmtime(res.cutoff)))
    return res
