"""A detected hang, classified with the post-mortem probe rules (probe/nonentry.py H1,
mismatch.py H2, linkstall.py H3) run on the nodes' snapshots, and turned into a finding.

The snapshots are a bundle-shaped tree (``nodes/<node>/probe``), so the rules read them
exactly as after the job: same reader, same bounds, same wording. The "job end" the rules
measure stall age against is now. When no snapshot explains the communicator (a node
whose ranks were not waiting does not snapshot), the summaries still say who launched
fewer collectives than the others (H1, from counts only) or that every rank entered and
none completes (H0: unlocalised).

One stuck rank stalls every communicator it belongs to: the one where it misbehaved is
localised (H1-H3), the others only show everyone waiting (H0). ``link_cascades`` marks such
an H0 as waiting behind the localised finding (``behind``), in whichever order the two were
detected, so that users, the pre-kill dumps and the post-mortem lead with the cause.
"""
from __future__ import annotations

import time
from typing import Any

from ...bundle import Bundle
from ...config import Config
from ...errors import BundleError
from ...probe import analyze as probe_analyze
from ...probe import layout as L
from ...probe.comms import iso
from .detect import Hang

CLASSES = {"probe.non_entry": ("H1", "rank_stuck"), "probe.inconsistent": ("H2", "collective_mismatch"),
           "probe.link_stall": ("H3", "network")}
MAX_SYMPTOMS = 16
_P2P = (L.F_SEND, L.F_RECV, L.F_SENDRECV)


def _op(func: int, seq: int) -> str:
    return f"{L.func_name(func)} #{seq}"


def _rank(m: dict[str, Any], cr: int) -> int:
    g = m.get("g")
    return g if isinstance(g, int) else cr


def from_snapshots(live_dir: str, hang: Hang, cfg: Config, now_ns: int) -> list[dict[str, Any]]:
    """The probe rules' symptoms about this communicator, as dicts (may be empty)."""
    try:
        bundle = Bundle(live_dir)
    except BundleError:
        return []
    bundle.job["end_time"] = iso(now_ns)
    symptoms, _cov = probe_analyze(bundle, cfg)
    return [s.to_dict() for s in symptoms if s.fields.get("comm_hash") == hang.comm][:MAX_SYMPTOMS]


def from_summaries(hang: Hang) -> tuple[str, str, list[int], str, list[int]]:
    """(class, cause, culprit ranks, what, waiting ranks) from the summaries alone."""
    ms = hang.members
    waiting = sorted(_rank(m, cr) for cr, m in ms.items() if m.get("kern") or any(m.get("wait") or ()))
    for func in range(L.NFUNC):
        if func in _P2P:
            continue
        counts = {cr: (m.get("fs") or [0] * L.NFUNC)[func] for cr, m in ms.items()}
        if len(set(counts.values())) < 2:
            continue
        lo = min(counts.values())
        behind = sorted(cr for cr, n in counts.items() if n == lo)
        if 2 * len(behind) < len(ms):
            ranks = [_rank(ms[cr], cr) for cr in behind]
            return "H1", "rank_stuck", ranks, f"never entered {_op(func, lo)}", waiting
    return "H0", "comm_hang", [], "every rank entered and none completes", waiting


def finding(hang: Hang, cfg: Config, live_dir: str, job: str, now_ns: int | None = None) -> dict[str, Any]:
    now_ns = now_ns or time.time_ns()
    symptoms = from_snapshots(live_dir, hang, cfg, now_ns)
    ranks: list[int] = []
    nodes: list[str] = []
    if symptoms:
        best = max(symptoms, key=lambda s: s.get("priority", 0))
        cls, cause = CLASSES.get(best["id"], ("H0", best.get("cause", "comm_hang")))
        root = [s for s in symptoms if s["id"] == best["id"]]
        for s in root:
            f = s.get("fields") or {}
            for r in (s.get("rank"), f.get("dst_rank")):
                if isinstance(r, int) and r not in ranks:
                    ranks.append(r)
            for n in (s.get("node"), f.get("dst_node")):
                if isinstance(n, str) and n not in nodes:
                    nodes.append(n)
        what = "; ".join(s["summary"] for s in root[:3])
        waiting = (root[0].get("fields") or {}).get("waiting_ranks") or []
        source = "snapshot"
    else:
        cls, cause, ranks, what, waiting = from_summaries(hang)
        by_rank = {_rank(m, cr): m.get("node") for cr, m in hang.members.items()}
        nodes = sorted({by_rank[r] for r in ranks if by_rank.get(r)}) if ranks else \
            sorted({m.get("node") for m in hang.members.values() if m.get("node")})
        source = "summary"
    return {
        "job": job, "detected": iso(now_ns), "detected_ns": now_ns, "class": cls, "cause": cause,
        "comm": hang.comm, "label": hang.label, "nranks": hang.nranks, "ranks": ranks, "nodes": nodes,
        "waiting_ranks": list(waiting)[:64], "waiting_since": iso(hang.since_wall_ns),
        "quiet_s": hang.quiet_s, "threshold_s": hang.threshold_s, "what": what, "source": source,
        "missing_ranks": hang.missing, "symptoms": symptoms,
    }


LOCALISED = ("H1", "H2", "H3")


def link_cascades(new: list[dict[str, Any]], standing: list[dict[str, Any]]) -> bool:
    """Order this cycle's hang findings localised first (then the larger communicator), and
    mark every unlocalised one (H0, this cycle's or standing) whose waiting ranks include a
    localised finding's culprit on another communicator as ``behind`` it. True when a
    standing finding changed (the caller saves)."""
    new.sort(key=lambda f: (f.get("class") not in LOCALISED, -(f.get("nranks") or 0)))
    hangs = [f for f in standing + new if isinstance(f, dict) and f.get("kind") != "slow"]
    roots = [f for f in hangs if f.get("class") in LOCALISED and f.get("ranks")]
    changed = False
    ids = {id(f) for f in new}
    for f in hangs:
        if f.get("class") != "H0" or f.get("behind"):
            continue
        waiting = set(f.get("waiting_ranks") or ())
        for r in roots:
            culprits = [x for x in r["ranks"] if x in waiting]
            if r.get("comm") != f.get("comm") and r.get("step") == f.get("step") and culprits:
                f["behind"] = {"comm": r.get("comm"), "label": r.get("label"), "class": r.get("class"),
                               "ranks": culprits[:8]}
                changed |= id(f) not in ids
                break
    return changed
