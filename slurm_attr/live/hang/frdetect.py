"""Hang detection from the ranks' own Flight Recorder, for jobs the probe cannot see.

The native probe lives in NCCL; a Gloo (CPU) job, or one whose user set their own NCCL
profiler, has no probe records. Where the ranks serve torch's worker server (the site's
opt-in start-up hook), each node's watcher polls ``fr_trace_json`` every few seconds and
puts every local rank's ``pg_status`` (last enqueued / completed collective per process
group) in its summary; the leader combines them here.

A process group *hangs* when some rank has a collective enqueued and not completed and no
rank's numbers changed for ``[live] hang_after_s`` (this watcher's monotonic clock; raised,
as for the probe, to ADAPT x the longest such span that ended in progress). The
ranks that enqueued fewer collectives than the waiting ones and have nothing under way
never entered the collective the others wait in (H1, ``rank_stuck``); when every rank
waits at the same collective, it is unlocalised (H0, ``comm_hang``). One source only: a
finding from here never justifies ``on_hang = cancel`` by itself (prekill/exchange.py).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from ... import jobtext
from ...probe.comms import iso
from .detect import ADAPT

MAX_PGS = 256


def poll_period(interval_s: float, hang_after_s: float) -> float:
    """How often a node polls its ranks' FR: a third of the threshold, 1..20 s, never below
    the watcher's own cycle. fr_trace_json is the whole ring (~0.9 MiB at 2000 entries) and
    parsing it is the cost (bench/bench_live_dumps.py: ~0.2 s CPU per poll of 8 full rings
    here, so ~1 % of one core at the default hang_after_s = 60, one poll per 20 s)."""
    return max(interval_s, min(20.0, max(1.0, hang_after_s / 3)))


@dataclass
class _PgState:
    sig: tuple[Any, ...] = ()
    since: float = 0.0
    busy: bool = False
    longest_s: float = 0.0  # the longest busy-and-quiet span that ended in progress
    reported: tuple[Any, ...] | None = None


@dataclass
class FrTracker:
    hang_after_s: float
    state: dict[str, _PgState] = field(default_factory=dict)

    @staticmethod
    def combine(summaries: list[dict[str, Any]]) -> dict[str, dict[int, dict[str, Any]]]:
        """pg id -> rank -> {enq, comp, pend, node} across the nodes' summaries."""
        pgs: dict[str, dict[int, dict[str, Any]]] = {}
        for s in summaries:
            fr = s.get("fr")
            if not isinstance(fr, dict):
                continue
            for rank, r in fr.items():
                if not (isinstance(rank, str) and rank.isdigit() and isinstance(r, dict)):
                    continue
                for pg, v in (r.get("pg") or {}).items() if isinstance(r.get("pg"), dict) else ():
                    if (not isinstance(v, list) or len(v) != 2 or not all(isinstance(x, int) for x in v)
                            or (pg not in pgs and len(pgs) >= MAX_PGS)):
                        continue
                    pend = r.get("pend") if isinstance(r.get("pend"), str) else None
                    pgs.setdefault(str(pg)[:64], {})[int(rank)] = {
                        "enq": v[0], "comp": v[1], "pend": pend, "node": s.get("node")}
        return pgs

    def update(self, summaries: list[dict[str, Any]], now: float, job: str,
               now_ns: int | None = None) -> list[dict[str, Any]]:
        """New hang findings at monotonic ``now`` (each stall reported once)."""
        out = []
        for pg, ranks in self.combine(summaries).items():
            st = self.state.setdefault(pg, _PgState(since=now))
            sig = tuple(sorted((r, m["enq"], m["comp"]) for r, m in ranks.items()))
            if sig != st.sig:
                if st.busy:  # a slow collective that ended: the threshold adapts, as detect.py's
                    st.longest_s = max(st.longest_s, now - st.since)
                st.sig, st.since = sig, now
            st.busy = busy = any(m["enq"] > m["comp"] for m in ranks.values())
            quiet = now - st.since
            threshold = max(self.hang_after_s, ADAPT * st.longest_s)
            if not busy or quiet < threshold or st.reported == sig:
                continue
            st.reported = sig
            out.append(finding(job, pg, ranks, quiet, threshold, now_ns or time.time_ns()))
        return out


def finding(job: str, pg: str, ranks: dict[int, dict[str, Any]], quiet: float, threshold: float,
            now_ns: int) -> dict[str, Any]:
    top = max(m["enq"] for m in ranks.values())
    waiting = sorted(r for r, m in ranks.items() if m["enq"] > m["comp"])
    behind = sorted(r for r, m in ranks.items() if m["enq"] < top and m["enq"] == m["comp"])
    pend = next((ranks[r]["pend"] for r in waiting if ranks[r]["pend"]), None)
    pend = _job_op(pend) if pend else f"collective #{top}"
    if behind:
        cls, cause, culprits, what = "H1", "rank_stuck", behind, f"never entered {pend}"
    else:
        cls, cause, culprits, what = "H0", "comm_hang", [], f"every rank entered {pend} and none completes"
    nodes = sorted({ranks[r]["node"] for r in (culprits or waiting) if isinstance(ranks[r]["node"], str)})
    return {
        "job": job, "detected": iso(now_ns), "detected_ns": now_ns, "class": cls, "cause": cause,
        "comm": f"pg{pg}", "label": f"pg {jobtext.quote(pg, 64)} (Flight Recorder)", "nranks": len(ranks),
        "ranks": culprits,
        "nodes": nodes, "waiting_ranks": waiting[:64], "waiting_since": iso(now_ns - int(quiet * 1e9)),
        "quiet_s": round(quiet, 3), "threshold_s": threshold, "what": what, "source": "fr",
        "missing_ranks": [], "symptoms": [],
    }


def _job_op(pend: str) -> str:
    """The collective under way, "gloo:all_reduce #4" (dumps.fr_pending): its name is the
    job's (the FR entry's profiling_name), so anything but a plain token is quoted as the
    job's words; a copied kernel line never reads as part of the finding's headline."""
    name, sep, seq = pend.rpartition(" #")
    if sep and seq.isdigit():
        return f"{jobtext.quote(name, 64)} #{seq}"
    return jobtext.quote(pend, 80)
