"""Slow findings (anomalies.py: S1-S3) as post-mortem evidence, symptom ``live.slow``.

Untrusted *context* only: cause "none", so a slow finding is never a verdict's root, never an
alternative cause and never carries an action; it says what slowed the job, beside whatever
ended it. Two sources: the live watcher's findings (findings.py), and, for a job that
COMPLETED and has none, S1/S3 worked out once from the bundle's final probe records (the
header rings' last collectives); S2 needs a cycle-by-cycle series and is live only.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Any

from ...bundle import Bundle
from ...config import Config
from ...model import Evidence, Symptom
from ...probe.reader import READ_BUDGET_S, read_node
from .. import findings, livespool
from ..nodeview import current
from .anomalies import KIND, MAX_SLOW, SlowTracker, is_int, node_part

SYMPTOM_ID = "live.slow"
PM_MIN_SAMPLES = 20  # the final records' rings hold 60 operations (all communicators) per rank
PM_MAX_RANKS = 1024  # past this the rings' entries are thinned below PM_MIN_SAMPLES per communicator


def symptom(f: dict[str, Any], path: str, source: str = "live") -> Symptom:
    """One slow finding as an untrusted context symptom."""
    ranks = [r for r in f.get("ranks") or () if is_int(r)][:64]
    nodes = [n for n in f.get("nodes") or () if isinstance(n, str) and livespool.valid_node(n)][:64]
    line = findings.headline(f)
    return Symptom(id=SYMPTOM_ID, cause="none", role="context", priority=10, trusted=False,
                   node=nodes[0] if nodes else None, rank=ranks[0] if ranks else None,
                   time=f.get("detected") if isinstance(f.get("detected"), str) else None, action="none",
                   summary=line, fields={"class": f.get("class"), "ranks": ranks, "nodes": nodes,
                                         "comm": f.get("comm"), "stats": f.get("stats") if isinstance(f.get("stats"), dict) else {}},
                   evidence=[Evidence(source=source, path=path, text=line)])


def postmortem(bundle: Bundle, cfg: Config, live_doc: dict[str, Any] | None) -> list[Symptom]:
    """S1/S3 from the bundle's final records, for a job that COMPLETED and whose watcher left
    no slow finding (no watcher, or the job was too short for it): the header rings' last
    collectives, joined across ranks once. S2 needs cycles of samples: live only."""
    if str(bundle.job.get("state") or "").upper() != "COMPLETED":
        return []
    if live_doc and any(isinstance(f, dict) and f.get("kind") == KIND for f in live_doc.get("findings") or ()):
        return []
    deadline = time.monotonic() + READ_BUDGET_S
    by_node = [(node, current(read_node(bundle, node, deadline)[0])) for node in bundle.nodes()[:8192]]
    if sum(len(r) for _n, r in by_node) > PM_MAX_RANKS:
        return []  # thinned for scale, one snapshot cannot join PM_MIN_SAMPLES collectives: live only
    sums = []
    for node, recs in by_node:
        if not recs:
            continue
        # what the leader reads of a summary: communicators and their members (no peers: S2 is live only)
        comms: dict[int, dict[str, Any]] = {}
        for rec in recs:
            g = rec.global_rank if rec.global_rank >= 0 else None
            for sl in rec.slots:
                if sl.comm_hash and sl.rank >= 0:
                    c = comms.setdefault(sl.comm_hash, {"hash": f"{sl.comm_hash:016x}", "label": f"{sl.name} {sl.comm_hash:016x}".strip(),
                                                        "nranks": sl.nranks, "members": []})
                    c["members"].append({"cr": sl.rank, "g": g})
        sums.append({"node": node, "comms": list(comms.values()),
                     "slow": node_part(bundle.root, recs, f"nodes/{node}/probe")})  # thinned past 256 ranks only
    if not sums:
        return []
    live = dataclasses.replace(cfg.live, slow_min_samples=min(cfg.live.slow_min_samples, PM_MIN_SAMPLES),
                               phase_window=min(cfg.live.phase_window, PM_MIN_SAMPLES // 2))
    tr = SlowTracker(live, str(bundle.job_id))
    end = bundle.job.get("end_time")
    found = tr.detect(tr.feed(sums), time.time_ns())
    out = []
    for f in found[:MAX_SLOW]:
        f["source"] = "records"
        f["what"] += " (from the final probe records)"
        if isinstance(end, str):
            f["detected"] = end
        out.append(symptom(f, "nodes/*/probe", source="probe"))
    return out
