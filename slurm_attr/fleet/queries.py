"""The fleet's aggregates, read from the verdict store in SQL (one pass each, grouped in
SQLite): the fleet report (facts.py) and the metrics (metrics.py) read the same numbers
from here, so a scrape and `sattr report --fleet` cannot disagree.

Verdict aggregates read the store's ``fleet`` table (storeschema.py: one narrow row per
verdict with its GPU-hours lost and latency, each query family behind a covering index), not
the verdicts themselves. ``since`` bounds each query by the time of its own rows (a verdict's
analysis, a drain's decision); None is the whole store.
"""
from __future__ import annotations

import bisect
import json
import math
from datetime import datetime
from functools import lru_cache
from typing import Any

from ..diag import RECURRENCE_SYMPTOMS
from ..slurmstate import BLOCK_BREAKER
from ..store import Store

# An automatic drain the policy wanted and did not carry out, by why. The others in
# actions.blocked_by are not a drain that was held back (already drained by us, drain off at
# the site, an offline `sattr analyze`): they are not counted.
OUTCOMES = ("applied", "blocked_breaker", "blocked_dry_run", "blocked_other")
NOT_BLOCKED = ("already drained", "offline analysis", "drain disabled", "no verdict database")
_DRY_RUN = "dry-run"

LIVE_IDS = ("live.hang", "live.slow", "live.stacks")
_LIVE_CLASSES = frozenset({"H0", "H1", "H2", "H3", "S1", "S2", "S3"})


def since_bound(since: float | None) -> float:
    return since if since is not None else float("-inf")


@lru_cache(maxsize=1)
def hardware_causes() -> tuple[str, ...]:
    """The causes of domain hardware, from the policy (rules/policy.toml), as data."""
    from ..reason.policy import load

    return tuple(sorted(c.name for c in load().causes.values() if c.domain == "hardware"))


def verdict_groups(store: Store, since: float | None = None) -> list[dict[str, Any]]:
    """Per partition, cause and domain: verdicts, jobs that did not complete, GPU-hours lost."""
    return [dict(r) for r in store.db.query(
        "select partition, cause, domain, count(*) as jobs, sum(failed) as failed, sum(lost_gpu_h) as gpu_hours "
        "from fleet where analyzed_at >= ? group by 1, 2, 3 order by 1, 2, 3", [since_bound(since)])]


def node_verdicts(store: Store, since: float | None = None) -> list[dict[str, Any]]:
    """Per culprit node, domain and cause: verdicts naming it, and the GPU-hours those jobs
    lost, shared evenly among a verdict's culprit nodes (what this node cost the fleet)."""
    return [dict(r) for r in store.db.query(
        "select n.value as node, f.domain, f.cause, count(*) as verdicts, "
        "sum(f.lost_gpu_h / json_array_length(f.culprit_nodes)) as gpu_hours from fleet f, json_each(f.culprit_nodes) n "
        "where f.analyzed_at >= ? and f.culprit_nodes != '[]' group by 1, 2, 3", [since_bound(since)])]


def node_jobs(store: Store, since: float | None = None) -> dict[str, int]:
    """{node: analysed jobs that ran on it}."""
    return {r["node"]: int(r["jobs"]) for r in store.db.query(
        "select n.value as node, count(*) as jobs from fleet f join jobs j on j.job_id = f.job_id, json_each(j.nodes) n "
        "where f.analyzed_at >= ? and json_valid(j.nodes) group by 1", [since_bound(since)])}


# Trusted hardware symptoms that are not a kernel event of their own: a drain reason read back
# from Slurm (the fast path's, standing in for the event it drained on) and a recurrence found in
# the store's history. Counting them would count one Xid two or three times.
_DERIVED = ("rule_id not like 'sattr.%' and rule_id not in ("
            + ", ".join(f"'{r}'" for r in sorted(RECURRENCE_SYMPTOMS)) + ")")


def hardware_events(store: Store, since: float | None = None) -> list[dict[str, Any]]:
    """Distinct trusted hardware events per node, GPU and rule: one per event time, however
    many jobs (or re-analyses) read the same kernel line; an event without a time counts once
    per job."""
    causes = hardware_causes()
    marks = ",".join("?" * len(causes)) or "''"
    return [dict(r) for r in store.db.query(
        "select node, coalesce(gpu, '-') as gpu, rule_id as event, count(distinct coalesce(time, job_id)) as events, "
        "count(distinct job_id) as jobs from symptoms "
        f"where trusted = 1 and node is not null and cause in ({marks}) and {_DERIVED} and seen_at >= ? group by 1, 2, 3",
        [*causes, since_bound(since)])]


def hardware_event_rows(store: Store, since: float | None = None, limit: int = 20000) -> list[dict[str, Any]]:
    """The distinct events themselves with the jobs that read them (the report's per-GPU view)."""
    causes = hardware_causes()
    marks = ",".join("?" * len(causes)) or "''"
    return [dict(r) for r in store.db.query(
        "select node, coalesce(gpu, '-') as gpu, rule_id as event, time, min(summary) as summary, "
        "json_group_array(distinct job_id) as jobs from symptoms "
        f"where trusted = 1 and node is not null and cause in ({marks}) and {_DERIVED} and seen_at >= ? "
        "group by 1, 2, 3, coalesce(time, job_id) order by max(seen_at) desc limit ?",
        [*causes, since_bound(since), limit])]


def node_culprits(store: Store, since: float | None = None) -> dict[str, dict[str, Any]]:
    """{node: {"jobs": analysed jobs on it, "culprit_of": {cause: verdicts naming it},
    "gpu_hours_lost": what those failed jobs cost, shared among their culprits}}."""
    out: dict[str, dict[str, Any]] = {}

    def entry(n: str) -> dict[str, Any]:
        return out.setdefault(n, {"jobs": 0, "culprit_of": {}, "gpu_hours_lost": 0.0})

    for node, n in node_jobs(store, since).items():
        entry(node)["jobs"] = n
    for r in node_verdicts(store, since):
        e = entry(r["node"])
        e["culprit_of"][r["cause"]] = e["culprit_of"].get(r["cause"], 0) + int(r["verdicts"])
        e["gpu_hours_lost"] += float(r["gpu_hours"] or 0.0)
    return out


def node_hardware_recent(store: Store, now: float, window_s: float = 7 * 86400) -> dict[str, int]:
    """{node: hardware verdicts naming it analysed in the window} for every node that was
    ever a hardware culprit (0 outside the window: the series stays, at zero)."""
    return {r["node"]: int(r["n"]) for r in store.db.query(
        "select n.value as node, sum(f.analyzed_at >= ?) as n from fleet f, json_each(f.culprit_nodes) n "
        "where f.domain = 'hardware' and f.culprit_nodes != '[]' group by 1", [now - window_s])}


def _held_back(store: Store, since: float | None) -> list[tuple[str, int]]:
    """(why, distinct job and node) of the drains the policy wanted and did not carry out."""
    rows = store.db.query(
        "select blocked_by, count(*) as n from (select distinct job_id, node, blocked_by from actions "
        "where applied = 0 and kind in ('drain', 'reboot') and decided_at >= ?) group by 1", [since_bound(since)])
    return [(why, int(r["n"])) for r in rows if (why := str(r["blocked_by"] or "")) not in NOT_BLOCKED]


def drain_outcomes(store: Store, since: float | None = None) -> dict[str, int]:
    """Automatic drains carried out (the ledger) and held back (distinct job and node)."""
    out = dict.fromkeys(OUTCOMES, 0)
    out["applied"] = int(next(store.db.query(
        "select count(*) as n from drain_ledger where status = 'applied' and at >= ?", [since_bound(since)]))["n"])
    for why, n in _held_back(store, since):
        out["blocked_breaker" if why == BLOCK_BREAKER else "blocked_dry_run" if why == _DRY_RUN else "blocked_other"] += n
    return out


def blocked_reasons(store: Store, since: float | None = None) -> dict[str, int]:
    """Held-back drains by their reason's first words (bounded: a Slurm error's text varies)."""
    out: dict[str, int] = {}
    for why, n in _held_back(store, since):
        word = why.split(":")[0][:40] or "unknown"
        out[word] = out.get(word, 0) + n
    return out


def undrain_outcomes(store: Store, since: float | None = None) -> dict[str, int]:
    out = {"ok": 0, "failed": 0}
    for r in store.db.query("select ok, count(*) as n from undrains where at >= ? group by 1", [since_bound(since)]):
        out["ok" if r["ok"] else "failed"] += int(r["n"])
    return out


def breakers(store: Store) -> dict[str, dict[str, Any]]:
    """Every breaker the store knows, and the drain breaker always (untripped when never used)."""
    out = {"drain": {"tripped": False, "why": "", "tripped_at": None}}
    for r in store.db.query("select name, tripped, why, tripped_at from breaker"):
        out[str(r["name"])] = {"tripped": bool(r["tripped"]), "why": r["why"] or "", "tripped_at": r["tripped_at"]}
    return out


def latency_histogram(store: Store, buckets: tuple[float, ...], since: float | None = None
                      ) -> tuple[list[int], int, float]:
    """(cumulative count per bucket bound, count, sum) of job end -> first verdict. The values
    come sorted off their index and are bisected here: half the time of SQLite evaluating
    one comparison per bucket on every row."""
    xs = [r[0] for r in store.db.execute("select latency_s from fleet where latency_s is not null and analyzed_at >= ? "
                                         "order by latency_s", [since_bound(since)])]
    return [bisect.bisect_right(xs, b) for b in buckets], len(xs), math.fsum(xs)


def latency_quantiles(store: Store, qs: tuple[float, ...], since: float | None = None) -> list[float | None]:
    """Nearest-rank quantiles of job end -> first verdict: one indexed row each."""
    args = [since_bound(since)]
    n = int(next(store.db.query("select count(*) as n from fleet where latency_s is not null and analyzed_at >= ?",
                                args))["n"])
    out: list[float | None] = []
    for q in qs:
        if not n:
            out.append(None)
            continue
        at = min(n - 1, max(0, int(q * n + 0.999999) - 1))
        out.append(float(next(store.db.query(
            "select latency_s from fleet where latency_s is not null and analyzed_at >= ? "
            "order by latency_s limit 1 offset ?", [*args, at]))["latency_s"]))
    return out


def live_findings(store: Store) -> tuple[dict[str, int], list[float], float]:
    """({class: findings in stored verdicts}, [detection latencies in s], GPU-minutes the
    watcher's cancels spared): a hang's latency runs from when its ranks began waiting to when
    the watcher recorded it."""
    classes: dict[str, int] = {}
    lat: list[float] = []
    saved = 0.0
    marks = ",".join("?" * len(LIVE_IDS))
    for r in store.db.query(f"select rule_id, time, fields_json from symptoms where rule_id in ({marks})", list(LIVE_IDS)):
        try:
            fields = json.loads(r["fields_json"] or "{}")
        except ValueError:
            fields = {}
        fields = fields if isinstance(fields, dict) else {}
        cls = "prekill" if r["rule_id"] == "live.stacks" else str(fields.get("class") or "")
        cls = cls if cls in _LIVE_CLASSES or cls == "prekill" else "other"  # bounded label values
        classes[cls] = classes.get(cls, 0) + 1
        began, seen = _epoch(fields.get("waiting_since")), _epoch(r["time"])
        if began is not None and seen is not None and seen >= began:
            lat.append(seen - began)
        spared = fields.get("gpu_minutes_saved")
        if isinstance(spared, (int, float)) and not isinstance(spared, bool) and 0 <= spared < 1e9:
            saved += float(spared)
    return classes, lat, saved


def live_saved_by_node(store: Store, since: float | None = None) -> dict[str, float]:
    """{node named by the finding: GPU-hours its live cancels spared} (a finding without a node: '-')."""
    return {r["node"]: float(r["h"]) for r in store.db.query(
        "select coalesce(node, '-') as node, sum(json_extract(fields_json, '$.gpu_minutes_saved')) / 60.0 as h "
        "from symptoms where rule_id = 'live.hang' and seen_at >= ? and json_valid(fields_json) "
        "and json_extract(fields_json, '$.gpu_minutes_saved') is not null group by 1", [since_bound(since)])}


def comment_counts(store: Store) -> list[dict[str, Any]]:
    return [dict(r) for r in store.db.query(
        "select field, status, count(*) as n from comments group by 1, 2 order by 1, 2")]


def last_verdict_at(store: Store) -> float:
    return float(next(store.db.query("select coalesce(max(analyzed_at), 0) as t from fleet"))["t"])


def _epoch(value: Any) -> float | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value).timestamp()
    except ValueError:
        return None
