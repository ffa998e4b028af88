"""``sattr report --fleet``'s data (docs/fleet.md): the fleet over a window, built from the
store's aggregates (queries.py) and, for what only Slurm knows now, the nodes' current state.

Everything here is bounded whatever the store holds: examples per cause, timeline entries per
node, events per GPU, nodes with a timeline. Strings are the store's as written (summaries and
reasons quote jobs): the renderers escape them.
"""
from __future__ import annotations

import json
import time
from datetime import datetime, timezone
from typing import Any

from ..store import Store
from . import queries

EXAMPLES = 5
TIMELINE = 100
TIMELINE_NODES = 200
EVENTS_PER_GPU = 50
JOBS_PER_EVENT = 20
LEMON_WINDOW_S = 7 * 86400


def _iso(ts: Any) -> str | None:
    if ts in (None, ""):
        return None
    return datetime.fromtimestamp(float(ts), timezone.utc).astimezone().isoformat(timespec="seconds")


def _round(x: Any) -> float:
    return round(float(x or 0.0), 3)


def fleet_report(store: Store, since: float | None, until: float | None = None, *, cluster: str,
                 pending: tuple[int, float | None] | None = None, slurm_nodes: list[dict[str, Any]] | None = None,
                 admin: bool = True, now: float | None = None, lemon_verdicts: int = 3) -> dict[str, Any]:
    """The report's data. ``admin`` False: no per-user section and no user names (a report an
    admin shares beyond the admins)."""
    now = time.time() if now is None else now
    groups = queries.verdict_groups(store, since)
    causes = _causes(store, groups, since, admin)
    nodes = _nodes(store, since, now, slurm_nodes, lemon_verdicts)
    drains = queries.drain_outcomes(store, since)
    undrains = queries.undrain_outcomes(store, since)
    events = queries.hardware_events(store, since)
    p50, p95 = queries.latency_quantiles(store, (0.5, 0.95), since)
    _cum, lat_n, _sum = queries.latency_histogram(store, (), since)
    breaker = queries.breakers(store)["drain"]
    count, oldest = pending if pending is not None else (0, None)
    out: dict[str, Any] = {
        "cluster": cluster, "generated_at": _iso(now), "since": _iso(since), "until": _iso(until or now),
        "admin": admin,
        "totals": {
            "jobs": sum(g["jobs"] for g in groups), "failed_jobs": sum(int(g["failed"] or 0) for g in groups),
            "gpu_hours_lost": _round(sum(float(g["gpu_hours"] or 0.0) for g in groups)),
            "hardware_events": sum(int(e["events"]) for e in events),
            "drains_applied": drains["applied"],
            "drains_blocked": sum(v for k, v in drains.items() if k != "applied"),
            "undrains": undrains["ok"],
            "gpu_hours_saved": _round(sum(queries.live_saved_by_node(store, since).values())),
        },
        "causes": causes,
        "daily": _daily(store, since),
        "nodes": nodes,
        "drains": {"applied": drains["applied"], "blocked": queries.blocked_reasons(store, since),
                   "undrains": undrains["ok"],
                   "breaker": {"tripped": breaker["tripped"], "why": breaker["why"], "tripped_at": _iso(breaker["tripped_at"])}},
        "pending": {"jobs": count, "oldest_age_s": _round(max(0.0, now - oldest)) if count and oldest else 0.0},
        "latency": {"count": lat_n, "p50_s": p50, "p95_s": p95},
    }
    if admin:
        out["users"] = _users(store, since)
    return out


def _causes(store: Store, groups: list[dict[str, Any]], since: float | None, admin: bool) -> list[dict[str, Any]]:
    by: dict[str, dict[str, Any]] = {}
    for g in groups:
        c = by.setdefault(g["cause"], {"cause": g["cause"], "domain": g["domain"], "jobs": 0, "gpu_hours_lost": 0.0,
                                       "examples": []})
        c["jobs"] += g["jobs"]
        c["gpu_hours_lost"] += float(g["gpu_hours"] or 0.0)
    for c in by.values():
        c["gpu_hours_lost"] = _round(c["gpu_hours_lost"])
        # The costliest jobs of the cause, then the newest: what an admin opens first.
        rows = store.db.query(
            "select f.job_id, f.user, v.summary, j.nodes, j.gpus, j.end_time, f.lost_gpu_h as lost from fleet f "
            "join verdicts v on v.job_id = f.job_id join jobs j on j.job_id = f.job_id where f.cause = ? "
            "and f.analyzed_at >= ? order by f.lost_gpu_h desc, f.analyzed_at desc limit ?",
            [c["cause"], queries.since_bound(since), EXAMPLES])
        c["examples"] = [{"job_id": r["job_id"], "user": r["user"] if admin else None, "summary": r["summary"] or "",
                          "nodes": _names(r["nodes"]), "gpus": int(r["gpus"] or 0),
                          "gpu_hours_lost": _round(r["lost"]), "end_time": r["end_time"]} for r in rows]
    return sorted(by.values(), key=lambda c: (-c["gpu_hours_lost"], -c["jobs"], c["cause"]))


def _daily(store: Store, since: float | None) -> list[dict[str, Any]]:
    return [{"day": r["day"], "cause": r["cause"], "jobs": r["jobs"], "gpu_hours_lost": _round(r["lost"])}
            for r in store.db.query(
                "select date(analyzed_at, 'unixepoch', 'localtime') as day, cause, count(*) as jobs, "
                "sum(lost_gpu_h) as lost from fleet where analyzed_at >= ? group by 1, 2 order by 1, 2",
                [queries.since_bound(since)])]


def _users(store: Store, since: float | None) -> list[dict[str, Any]]:
    users: dict[str, dict[str, Any]] = {}
    for r in store.db.query(
            "select coalesce(user, '?') as user, cause, count(*) as jobs, sum(failed) as failed, "
            "sum(lost_gpu_h) as lost from fleet where analyzed_at >= ? group by 1, 2", [queries.since_bound(since)]):
        u = users.setdefault(r["user"], {"user": r["user"], "jobs": 0, "failed": 0, "gpu_hours_lost": 0.0, "classes": {}})
        u["jobs"] += r["jobs"]
        u["failed"] += int(r["failed"] or 0)
        u["gpu_hours_lost"] += float(r["lost"] or 0.0)
        u["classes"][r["cause"]] = r["jobs"]
    for u in users.values():
        u["gpu_hours_lost"] = _round(u["gpu_hours_lost"])
    return sorted(users.values(), key=lambda u: (-u["gpu_hours_lost"], -u["failed"], u["user"]))


def _names(raw: Any) -> list[str]:
    try:
        got = json.loads(raw or "[]")
    except ValueError:
        return []
    return [n for n in got if isinstance(n, str)] if isinstance(got, list) else []


def _nodes(store: Store, since: float | None, now: float, slurm_nodes: list[dict[str, Any]] | None,
           lemon_verdicts: int) -> list[dict[str, Any]]:
    from ..slurmstate import NodeState

    nodes: dict[str, dict[str, Any]] = {}

    def entry(n: str) -> dict[str, Any]:
        return nodes.setdefault(n, {"node": n, "jobs": 0, "culprit_of": {}, "hardware_verdicts_7d": 0,
                                    "hardware_events": 0, "gpu_hours_lost": 0.0, "lemon": False, "state": None,
                                    "reason": None, "drained_by_us": False, "timeline": [], "gpus": []})

    for node, c in queries.node_culprits(store, since).items():
        entry(node).update(c)
    for node, n in queries.node_hardware_recent(store, now, LEMON_WINDOW_S).items():
        e = entry(node)
        e["hardware_verdicts_7d"], e["lemon"] = n, n >= lemon_verdicts
    gpus: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in queries.hardware_event_rows(store, since):
        entry(r["node"])["hardware_events"] += 1
        evs = gpus.setdefault((r["node"], r["gpu"]), [])
        if len(evs) < EVENTS_PER_GPU:
            evs.append({"event": r["event"], "time": r["time"], "summary": r["summary"] or "",
                        "jobs": sorted(_names(r["jobs"]))[:JOBS_PER_EVENT]})
    for (node, gpu), evs in sorted(gpus.items()):
        entry(node)["gpus"].append({"gpu": gpu, "events": evs})
    for rec in slurm_nodes or []:
        st = NodeState.from_record(rec)
        if st.name:
            e = entry(st.name)
            e["state"] = "+".join(sorted(w.lower() for w in st.words)) or None
            e["reason"] = st.reason or None
            e["drained_by_us"] = bool(st.out_of_service and st.ours)
    out = sorted(nodes.values(), key=lambda e: (not e["lemon"], -e["hardware_verdicts_7d"], -sum(e["culprit_of"].values()),
                                                -e["gpu_hours_lost"], -e["hardware_events"], e["node"]))
    for e in out:
        e["gpu_hours_lost"] = _round(e["gpu_hours_lost"])
    worst = [e["node"] for e in out[:TIMELINE_NODES] if e["culprit_of"] or e["hardware_events"] or e["drained_by_us"]]
    for node, items in _timelines(store, since, worst).items():
        nodes[node]["timeline"] = items
    return out


def _timelines(store: Store, since: float | None, names: list[str]) -> dict[str, list[dict[str, Any]]]:
    """Per node, newest first: the verdicts naming it, drains carried out or held back, undrains,
    recovery actions and diagnostics, each with its reason."""
    if not names:
        return {}
    s, want = queries.since_bound(since), json.dumps(names)
    out: dict[str, list[dict[str, Any]]] = {n: [] for n in names}

    def add(node: str, at: Any, kind: str, job: Any, cause: Any, detail: Any) -> None:
        out[node].append({"at": _iso(at), "kind": kind, "job_id": str(job) if job else None, "cause": cause,
                          "detail": str(detail or "")[:300], "_t": float(at or 0)})

    for r in store.db.query("select c.node, c.analyzed_at, c.job_id, c.cause, v.summary from (select n.value as node, "
                            "f.analyzed_at, f.job_id, f.cause from fleet f, json_each(f.culprit_nodes) n where "
                            "f.analyzed_at >= ? and f.culprit_nodes != '[]' and n.value in (select value from json_each(?))) c "
                            "join verdicts v on v.job_id = c.job_id", [s, want]):
        add(r["node"], r["analyzed_at"], "verdict", r["job_id"], r["cause"], r["summary"])
    for r in store.db.query("select node, at, job_id, kind, reason, status from drain_ledger where status = 'applied' "
                            "and at >= ? and node in (select value from json_each(?))", [s, want]):
        add(r["node"], r["at"], "drain", r["job_id"], None, f"{r['kind']}: {r['reason']}")
    for r in store.db.query("select node, min(decided_at) as at, job_id, blocked_by from actions where applied = 0 "
                            "and kind in ('drain', 'reboot') and decided_at >= ? and node in (select value from json_each(?)) "
                            "group by node, job_id, blocked_by", [s, want]):
        if str(r["blocked_by"] or "") not in queries.NOT_BLOCKED:
            add(r["node"], r["at"], "drain_blocked", r["job_id"], None, r["blocked_by"])
    for r in store.db.query("select node, at, job_id, why, actor, ok, detail from undrains where at >= ? "
                            "and node in (select value from json_each(?))", [s, want]):
        add(r["node"], r["at"], "undrain", r["job_id"], None,
            f"{'resumed' if r['ok'] else 'failed'} by {r['actor']}: {r['why'] or r['detail'] or ''}")
    for r in store.db.query("select node, at, job_id, kind, ok, detail from recoveries where at >= ? "
                            "and node in (select value from json_each(?))", [s, want]):
        add(r["node"], r["at"], "recovery", r["job_id"], None, f"{r['kind']} {'done' if r['ok'] else 'failed'}: {r['detail'] or ''}")
    for r in store.db.query("select node, at, ok, rc, trigger, actor from diags where at >= ? "
                            "and node in (select value from json_each(?))", [s, want]):
        add(r["node"], r["at"], "diag", None, None,
            f"{'passed' if r['ok'] else 'failed'} (rc {r['rc']}), {r['trigger'] or 'manual'} by {r['actor'] or '-'}")
    for node, items in out.items():
        items.sort(key=lambda x: -x["_t"])
        del items[TIMELINE:]
        for x in items:
            del x["_t"]
    return out
