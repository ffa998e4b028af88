"""A verdict for a person: header, verdict line, culprit, evidence chain, gaps, notes.

In the manner of seff/jobstats. Colour only when asked (the CLI asks on a tty).
"""
from __future__ import annotations

from datetime import datetime
from typing import Any

from .model import Symptom, Verdict

_COLORS = {"hardware": "31", "network": "35", "user": "33", "scheduler": "36", "infrastructure": "34",
           "none": "32", "unknown": "37"}


def _c(text: str, code: str, color: bool) -> str:
    return f"\x1b[{code}m{text}\x1b[0m" if color else text


def _runtime(job: dict[str, Any]) -> str:
    try:
        a = datetime.fromisoformat(job["start_time"])
        b = datetime.fromisoformat(job["end_time"])
    except (KeyError, TypeError, ValueError):
        return "-"
    secs = int((b - a).total_seconds())
    return f"{secs // 3600:02d}:{secs % 3600 // 60:02d}:{secs % 60:02d}"


def _where(s: Symptom) -> str:
    parts = []
    if s.node:
        parts.append(s.node)
    if s.gpu not in (None, ""):
        parts.append(f"gpu {s.gpu}")
    if s.rank is not None:
        parts.append(f"rank {s.rank}")
    return ", ".join(parts) or "job"


def _evidence_lines(s: Symptom, limit: int = 3) -> list[str]:
    out = []
    for e in s.evidence[:limit]:
        loc = e.path or e.source
        if e.line:
            loc += f":{e.line}"
        text = (e.text or "").strip()
        if len(text) > 160:
            text = text[:157] + "..."
        out.append(f"        [{e.source}] {loc}: {text}")
    if len(s.evidence) > limit:
        out.append(f"        ... {len(s.evidence) - limit} more lines")
    return out


def notes(v: Verdict, job: dict[str, Any]) -> list[str]:
    """Plain-language next steps."""
    out: list[str] = []
    drained = [a.node for a in v.actions if a.applied and a.kind in ("drain", "reboot")]
    would = [a.node for a in v.actions if not a.applied and a.kind in ("drain", "reboot")]
    if v.domain == "hardware":
        if drained:
            out.append(f"{', '.join(n for n in drained if n)} drained; run the GPU/host diagnostic (e.g. dcgmi diag -r 3) "
                       "before `sattr undrain`.")
        elif would:
            out.append(f"The drain policy would take out {', '.join(n for n in would if n)} "
                       f"({'; '.join(sorted({a.blocked_by or '' for a in v.actions if not a.applied}))}).")
        out.append("Resubmit: the failure is not in the program.")
    elif v.cause == "collective_mismatch":
        root = v.root()
        where = (root.fields.get("first_divergent_frame") if root else None) or ""
        ranks = ", ".join(str(r) for r in v.culprit_ranks)
        out.append(f"Ranks {ranks} issued a different collective than the others"
                   + (f" at {where}" if where else "") + ": look for a data-dependent branch or an uneven loop.")
    elif v.cause == "rank_stuck":
        out.append("The named ranks never reached the collective the others waited in: check data loading, "
                   "checkpointing or a hung kernel on those ranks (py-spy dump on a rerun).")
    elif v.cause == "comm_hang":
        out.append("Every rank entered the collective and none finished: suspect the network or a GPU; "
                   "check the nodes' IB/NVLink counters.")
    elif v.cause == "time_limit":
        out.append("Raise --time or checkpoint more often.")
    elif v.cause in ("cuda_oom", "host_oom"):
        out.append("Reduce the batch size or ask for more memory (--mem / --mem-per-gpu).")
    elif v.cause == "unknown":
        gaps = [c for c in v.coverage if c.status != "ok"]
        if gaps:
            out.append("Not enough evidence; missing sources are listed above.")
    return out


def verdict_text(v: Verdict, job: dict[str, Any] | None = None, color: bool = False,
                 comment_status: str | None = None) -> str:
    job = job or {}
    lines: list[str] = []
    nodes = job.get("nodes") or []
    lines.append(f"Job {v.job_id}" + (f"  user {job['user']}" if job.get("user") else "")
                 + (f"  partition {job['partition']}" if job.get("partition") else ""))
    if nodes or job.get("state"):
        lines.append(f"  nodes {','.join(nodes) if isinstance(nodes, list) else nodes}  state {job.get('state') or '-'}"
                     f"  exit {job.get('exit_code', '-')}:{job.get('signal', 0) or 0}")
    if job.get("start_time"):
        lines.append(f"  start {job['start_time']}  run time {_runtime(job)}")
    lines.append("")
    head = f"{v.cause} ({v.domain})" + ("  [ambiguous]" if v.ambiguous else "")
    lines.append(f"Verdict: {_c(head, _COLORS.get(v.domain, '0'), color)}")
    if v.summary:
        lines.append(f"  {v.summary}")
    culprit = []
    if v.culprit_nodes:
        culprit.append("nodes " + ", ".join(v.culprit_nodes))
    if v.culprit_gpus:
        culprit.append("GPUs " + ", ".join(v.culprit_gpus))
    if v.culprit_ranks:
        culprit.append("ranks " + ", ".join(str(r) for r in v.culprit_ranks))
    if culprit:
        lines.append("Culprit: " + "; ".join(culprit))
    for alt in v.alternatives:
        lines.append(f"  or {alt.get('cause')}: {alt.get('why', '')}")

    roots = [s for s in v.symptoms if s.role == "root"]
    others = [s for s in v.symptoms if s.role != "root"]
    if roots or others:
        lines.append("")
        lines.append("Evidence:")
        for s in roots:
            tag = "trusted" if s.trusted else "untrusted"
            lines.append(f"  * {s.id} on {_where(s)} [root, {tag}]: {s.summary}")
            lines.extend(_evidence_lines(s))
        by_role: dict[str, list[Symptom]] = {}
        for s in others:
            by_role.setdefault(s.role, []).append(s)
        for role in ("confirmation", "cascade", "context"):
            group = by_role.get(role) or []
            if not group:
                continue
            # Cascades fold: one line per rule with where it appeared.
            per_rule: dict[str, list[Symptom]] = {}
            for s in group:
                per_rule.setdefault(s.id, []).append(s)
            for rid, ss in per_rule.items():
                wheres = sorted({_where(s) for s in ss})
                shown = ", ".join(wheres[:6]) + (f" (+{len(wheres) - 6})" if len(wheres) > 6 else "")
                lines.append(f"    - {role}: {rid} on {shown}")
                if role == "confirmation":
                    lines.extend(_evidence_lines(ss[0], limit=1))
    gaps = [c for c in v.coverage if c.status != "ok"]
    if gaps:
        lines.append("")
        lines.append("Coverage gaps:")
        for c in gaps[:20]:
            lines.append(f"  - {c.source}{' on ' + c.node if c.node else ''}: {c.status}"
                         + (f" ({c.detail})" if c.detail else ""))
        if len(gaps) > 20:
            lines.append(f"  ... {len(gaps) - 20} more")
    if v.actions:
        lines.append("")
        lines.append("Actions:")
        for a in v.actions:
            state = "applied" if a.applied else f"not applied: {a.blocked_by}"
            lines.append(f"  - {a.kind} {a.node}: {a.reason} ({state})")
    if comment_status and comment_status != "written":
        lines.append("")
        lines.append(f"Job comment: {comment_status} (retried on the next analysis, or `sattr comments --retry`)")
    n = notes(v, job)
    if n:
        lines.append("")
        lines.append("Notes:")
        lines.extend(f"  - {x}" for x in n)
    return "\n".join(lines)
