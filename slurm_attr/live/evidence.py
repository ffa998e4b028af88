"""The live findings as post-mortem evidence: symptom ``live.hang`` (untrusted).

The finding file is root's, but what it says comes from the job's probe records, so it
is as untrusted as they are: it points at ranks and nodes, never justifies a drain, and
sits below the probe's own symptoms (which the epilog's full records produce again).
Its value is time: it says when the hang began while the job still ran, which a job
killed at its time limit otherwise cannot tell.
"""
from __future__ import annotations

from typing import Any

from ..bundle import Bundle
from ..config import Config
from ..model import Coverage, Evidence, Symptom
from . import findings, spool_job, livespool
from .prekill import prekillevidence
from .slow import slowevidence

ID = "live.hang"
PRIORITY = 40  # under probe.* (55-60): the full records are the finer evidence
SOURCE = "live"


def analyze(bundle: Bundle, cfg: Config) -> tuple[list[Symptom], list[Coverage]]:
    if not cfg.live.enabled:
        return [], []
    job = spool_job(bundle)
    if not livespool.valid_job(job):
        return [], []
    doc = findings.load(cfg.paths.spool, job)
    slow = slowevidence.postmortem(bundle, cfg, doc)  # S1/S3 of a COMPLETED job without live ones
    # the Flight Recorder the watcher pulled from the live ranks, when the bundle has none
    prekill, prekill_cov = prekillevidence.fr_symptoms(bundle, cfg, job)
    if doc is None:
        # No leader ever wrote (live_watcher= unset, probe off, or no watcher started): said
        # nowhere rather than as a "missing" line on every verdict of a site without it. A
        # node whose watcher did not start shows in the leader's "N of M node(s) reporting".
        return slow + prekill, prekill_cov
    out = slow + prekill + prekillevidence.stacks_symptom(doc, job)
    for f in doc["findings"][-findings.MAX_FINDINGS:]:
        if not isinstance(f, dict):
            continue
        if f.get("kind") == "slow":  # S1-S3: context, never a cause (slow/slowevidence.py)
            out.append(slowevidence.symptom(f, f"{livespool.LIVE}/{job}/{findings.name(str(f.get('step', '?')))}"))
            continue
        ranks = [r for r in f.get("ranks") or () if isinstance(r, int)]
        nodes = [n for n in f.get("nodes") or () if isinstance(n, str) and livespool.valid_node(n)]
        cause = f.get("cause") if f.get("cause") in ("rank_stuck", "collective_mismatch", "network", "comm_hang") \
            else "comm_hang"
        line = findings.headline(f)
        at = findings.stack_lines(f.get("stacks"), ranks)
        if at:  # where the culprit (or first) rank stood when the dumps were taken
            line = f"{line}; {at[0]}"
        out.append(Symptom(
            id=ID, cause=cause, role="cascade" if isinstance(f.get("behind"), dict) else "root",
            priority=PRIORITY, trusted=False,
            node=nodes[0] if nodes else None, rank=ranks[0] if ranks else None,
            time=f.get("detected") if isinstance(f.get("detected"), str) else None, action="none",
            summary=line, fields={"class": f.get("class"), "ranks": ranks[:64], "nodes": nodes[:64],
                                  "comm": f.get("comm"), "waiting_since": f.get("waiting_since"),
                                  "quiet_s": f.get("quiet_s"), "stacks": at[:16],
                                  "gpu_minutes_saved": saved_gpu_minutes(f)},
            evidence=[Evidence(source=SOURCE, path=f"{livespool.LIVE}/{job}/{findings.name(str(f.get('step', '?')))}", text=line)]))
    cov = doc.get("coverage") if isinstance(doc.get("coverage"), str) else ""
    return out, [Coverage(source=SOURCE, status="ok", detail=f"live watch: {cov[:300]}")] + prekill_cov


def saved_gpu_minutes(f: dict[str, Any]) -> float | None:
    """GPU-minutes the watcher's cancel spared (the job's GPUs x its time left), when it
    cancelled; the fleet view sums them (fleet/queries.py)."""
    c = f.get("cancel")
    if not isinstance(c, dict) or c.get("done") is not True:
        return None
    v = c.get("gpu_minutes_saved")
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v < 1e9 else None
