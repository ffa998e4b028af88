"""The drain circuit breaker: caps automatic drains, then switches to alert-only.

Two limits, both from ``[drain]``:

- at most ``max_drains`` automatic drains (and reboots) in a sliding ``window_s``;
  drains before the last ``sattr breaker reset`` do not count;
- at most ``max_partition_percent`` of any partition's nodes drained by us at once
  (nodes Slurm currently shows drained/down with a ``SATTR:`` reason, plus drains
  other analysers are carrying out right now). At least one node per partition is
  always allowed: with 4 nodes and 10 %, one; with 40 nodes and 10 %, four. Without
  that floor a small partition could never lose a broken node. ``max_drains = 0``
  (or ``enabled = false``) stops automatic drains altogether.

A drain that would exceed either limit trips the breaker. Tripped, every later
decision is recorded as blocked ("circuit breaker") until a person runs
``sattr breaker reset``. The tripped state and the ledger live in the verdict database
on the controller; the count and the partition shares also come from Slurm's own
reasons (slurmstate.py), which is all the node epilogs' fast path uses: it never
opens the database (a SQLite file written from many hosts over a network
filesystem is a known way to corrupt it).
"""
from __future__ import annotations

import json
import time
from typing import Any, Iterable

from .config import Drain
from .errors import SlurmError
from .slurmstate import BLOCK_ALREADY, BLOCK_BREAKER, SlurmView, partition_allowance  # noqa: F401

# A claim not settled yet (another process is between its claim and scontrol) counts towards
# its partitions, so concurrent analysers cannot each see the last free slot; one older than
# this is a process that died mid-way and no longer counts. Settled drains count through
# Slurm's state only, so a node resumed since frees its slot at once.
INFLIGHT_S = 120.0


class Breaker:
    def __init__(self, store: Any, cfg: Drain):
        self.store = store
        self.cfg = cfg

    def tripped(self) -> bool:
        return bool(self.store.breaker()["tripped"])

    def window_start(self, now: float | None = None) -> float:
        now = time.time() if now is None else now
        reset_at = self.store.breaker().get("reset_at") or 0.0
        return max(now - self.cfg.window_s, float(reset_at))

    def partition_usage(self, nodes: list[dict[str, Any]], inflight: Iterable[dict[str, Any]] = ()) -> dict[str, dict[str, Any]]:
        """Per partition: its nodes, and which of them are drained by us (or being drained)."""
        extra = []
        for row in inflight:
            try:
                parts = json.loads(row.get("partitions") or "[]")
            except ValueError:
                parts = []
            extra.append((row["node"], parts))
        usage = SlurmView.build(nodes).partition_usage(extra)
        for u in usage.values():
            u["allowed"] = partition_allowance(u["total"], self.cfg.max_partition_percent)
        return usage

    def claim(self, node: str, job_id: str, kind: str, path: str, reason: str, slurm: Any,
              partitions: Iterable[str], job_ids: Iterable[str]) -> tuple[int | None, str]:
        """Reserve one automatic drain, or trip. (claim id, "") or (None, blocked_by)."""
        parts = list(partitions)
        try:
            all_nodes = slurm.nodes() if parts else []
        except SlurmError as err:
            return None, f"slurm error: {err}"[:200]
        with self.store.transaction():
            if self.tripped():
                return None, BLOCK_BREAKER
            if self.store.ledger_has(node, list(job_ids)):
                return None, BLOCK_ALREADY
            now = time.time()
            since = self.window_start(now)
            # Drains the fast path made are in Slurm's reasons before the store has caught up.
            count = max(self.store.ledger_count(since),
                        len([n for n in SlurmView.build(all_nodes).drains_since(since) if n != node]))
            if count >= self.cfg.max_drains:
                self.store.trip_breaker(
                    f"{count} automatic drains in the last {self.cfg.window_s}s (max {self.cfg.max_drains}); "
                    f"{node} job {job_id} was next")
                return None, BLOCK_BREAKER
            if parts:
                usage = self.partition_usage(all_nodes, self.store.ledger_inflight(now - INFLIGHT_S))
                for p in parts:
                    u = usage.get(p)
                    if u is None:
                        continue
                    after = u["ours"] | {node}
                    if len(after) > u["allowed"]:
                        self.store.trip_breaker(
                            f"draining {node} would hold {len(after)} of {u['total']} nodes of partition {p} "
                            f"(max {self.cfg.max_partition_percent:g}% = {u['allowed']}); job {job_id}")
                        return None, BLOCK_BREAKER
            return self.store.ledger_claim(node, job_id, kind, path, parts, reason), ""

    def status(self, slurm: Any = None) -> dict[str, Any]:
        """What `sattr breaker status` shows."""
        row = self.store.breaker()
        now = time.time()
        since = self.window_start(now)
        out: dict[str, Any] = {
            "tripped": bool(row["tripped"]),
            "why": row.get("why") or "",
            "tripped_at": row.get("tripped_at"),
            "reset_at": row.get("reset_at"),
            "reset_by": row.get("reset_by") or "",
            "reset_why": row.get("reset_why") or "",
            "drains_in_window": self.store.ledger_count(since),
            "max_drains": self.cfg.max_drains,
            "window_s": self.cfg.window_s,
            "window_since": since,
            "max_partition_percent": self.cfg.max_partition_percent,
            "dry_run": self.cfg.dry_run,
            "enabled": self.cfg.enabled,
            "partitions": [],
        }
        if slurm is not None:
            try:
                usage = self.partition_usage(slurm.nodes())
            except SlurmError as err:
                out["partitions_error"] = str(err)
            else:
                out["partitions"] = [{"partition": u["partition"], "total": u["total"], "drained_by_us": sorted(u["ours"]),
                                      "allowed": u["allowed"]} for u in sorted(usage.values(), key=lambda u: u["partition"])]
        return out
