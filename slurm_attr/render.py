"""A verdict for a person, in the manner of seff/jobstats.

Header (job, user, partition, nodes, state, start, run time), the verdict line,
the culprit (nodes, GPUs, ranks), the evidence chain (source, node, file:line,
text) with cascade symptoms folded under their root, coverage gaps, the drain
decisions, and Notes: the next step in plain words. Colour only when asked (the
CLI asks on a tty); ``--json`` is the contract, this is not.

Most of a verdict is the job's words (its lines, paths, messages, FR names): every string
of it is made printable (jobtext.line) before a line is built, and our colours go on after.
"""
from __future__ import annotations

from datetime import datetime
from typing import Any

import click

from . import jobtext
from .model import Action, Symptom, Verdict

# A verdict's domain in a terminal: its cause in this colour, here and in `sattr list`.
DOMAIN_COLORS = {"hardware": "red", "network": "magenta", "user": "yellow", "scheduler": "cyan",
                 "infrastructure": "blue", "none": "green", "unknown": "white"}
_WIDTH = 72
_SHOWN_EVIDENCE = 3
_SHOWN_WHERE = 6


def in_domain_color(text: str, domain: str, color: bool = True) -> str:
    """``text`` (already printable) in the colour of ``domain`` when ``color``; as it is otherwise."""
    return click.style(text, fg=DOMAIN_COLORS.get(domain)) if color else text


def _bold(text: str, color: bool) -> str:
    return click.style(text, bold=True) if color else text


def _runtime(job: dict[str, Any]) -> str:
    try:
        a = datetime.fromisoformat(job["start_time"])
        b = datetime.fromisoformat(job["end_time"])
    except (KeyError, TypeError, ValueError):
        return "-"
    secs = max(0, int((b - a).total_seconds()))
    days, rest = divmod(secs, 86400)
    hms = f"{rest // 3600:02d}:{rest % 3600 // 60:02d}:{rest % 60:02d}"
    return f"{days}-{hms}" if days else hms


def _when(value: Any) -> str:
    try:
        return datetime.fromisoformat(str(value)).strftime("%a %b %d, %Y at %H:%M:%S")
    except (TypeError, ValueError):
        return str(value)


def _where(s: Symptom) -> str:
    parts = []
    if s.node:
        parts.append(s.node)
    if s.gpu not in (None, ""):
        parts.append(f"gpu {s.gpu}")
    if s.rank is not None:
        parts.append(f"rank {s.rank}")
    return ", ".join(parts) or "job"


def _and(items: list[str]) -> str:
    items = [i for i in items if i]
    if len(items) <= 1:
        return "".join(items)
    return ", ".join(items[:-1]) + " and " + items[-1]


def _evidence_lines(s: Symptom, indent: str, limit: int = _SHOWN_EVIDENCE) -> list[str]:
    out = []
    for e in s.evidence[:limit]:
        loc = e.path or e.source
        if e.line:
            loc += f":{e.line}"
        text = " ".join((e.text or "").split())
        if len(text) > 150:
            text = text[:147] + "..."
        node = f" {s.node}" if s.node else ""
        out.append(f"{indent}[{e.source}{node}] {loc}: {text}")
    if len(s.evidence) > limit:
        out.append(f"{indent}... {len(s.evidence) - limit} more lines")
    more = s.fields.get("occurrences") if isinstance(s.fields, dict) else None
    if isinstance(more, int) and more > len(s.evidence):
        out.append(f"{indent}({more} occurrences in all)")
    return out


def _header(v: Verdict, job: dict[str, Any], color: bool) -> list[str]:
    title = f"Job {v.job_id}: why it ended (slurm-attr)"
    lines = ["=" * _WIDTH, _bold(title.center(_WIDTH).rstrip(), color), "=" * _WIDTH]
    nodes = job.get("nodes") or []
    node_text = ",".join(nodes) if isinstance(nodes, list) else str(nodes)
    if isinstance(nodes, list) and len(nodes) > 1:
        node_text = f"{len(nodes)} ({node_text})" if len(node_text) < 48 else f"{len(nodes)} ({node_text[:44]}...)"
    state = job.get("state") or "-"
    if job.get("exit_code") is not None:
        state += f" (exit {job.get('exit_code')}:{job.get('signal') or 0})"
    rows = [("Job ID", v.job_id), ("User", job.get("user")), ("Partition", job.get("partition")),
            ("Nodes", node_text or None), ("State", state if state != "-" or job else None),
            ("Start Time", _when(job["start_time"]) if job.get("start_time") else None),
            ("Run Time", _runtime(job) if job.get("start_time") else None)]
    for key, val in rows:
        if val not in (None, ""):
            lines.append(f"{key:>12}: {val}")
    return lines


def _verdict_block(v: Verdict, color: bool) -> list[str]:
    head = f"{v.cause} ({v.domain})" + ("  [ambiguous]" if v.ambiguous else "")
    lines = ["", f"Verdict: {in_domain_color(head, v.domain, color)}"]
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
    return lines


def _folded(group: list[Symptom]) -> list[tuple[str, list[Symptom]]]:
    per_rule: dict[str, list[Symptom]] = {}
    for s in group:
        per_rule.setdefault(s.id, []).append(s)
    return list(per_rule.items())


def _evidence_block(v: Verdict) -> list[str]:
    roots = [s for s in v.symptoms if s.role == "root"]
    others = [s for s in v.symptoms if s.role != "root"]
    if not roots and not others:
        return []
    lines = ["", "Evidence:"]
    for i, s in enumerate(roots):
        tag = "trusted" if s.trusted else "untrusted"
        lines.append(f"  * {s.id} on {_where(s)} [root, {tag}]: {s.summary}")
        lines.extend(_evidence_lines(s, "      "))
        if i == 0 and others:
            # What followed from the first (deciding) root: confirmations with one line of
            # evidence each, cascades and context folded to one line per rule.
            for role in ("confirmation", "cascade", "context"):
                for rid, ss in _folded([o for o in others if o.role == role]):
                    wheres = sorted({_where(o) for o in ss})
                    shown = ", ".join(wheres[:_SHOWN_WHERE]) + (f" (+{len(wheres) - _SHOWN_WHERE})"
                                                                if len(wheres) > _SHOWN_WHERE else "")
                    lines.append(f"    - {role}: {rid} on {shown}")
                    if role == "confirmation":
                        lines.extend(_evidence_lines(ss[0], "        ", limit=1))
    if not roots:
        for role in ("confirmation", "cascade", "context"):
            for rid, ss in _folded([o for o in others if o.role == role]):
                wheres = sorted({_where(o) for o in ss})
                lines.append(f"  - {role}: {rid} on {', '.join(wheres[:_SHOWN_WHERE])}")
                lines.extend(_evidence_lines(ss[0], "      ", limit=1))
    return lines


def _claims_block(v: Verdict) -> list[str]:
    """Untrusted claims the verdict did not take at their word, and why (issue 10)."""
    shown = [s for s in v.symptoms if s.status.unconfirmed]
    shown += [s for s in v.symptoms if s.status.earlier and s not in shown]
    if not shown:
        return []
    lines = ["", "Not taken at their word:"]
    # one line per rule and reason: five ranks repeating one unconfirmed claim are one finding
    groups: dict[tuple[str, str, str], list[Symptom]] = {}
    for s in shown:
        if s.status.claim_note:
            note = str(s.status.claim_note)
            why = note if s.status.claim == "contradicted" or "no complete kernel log" in note else \
                "claimed by the job's output; the kernel logs of both ends are clean, as a fabric fault can leave them"
        else:
            why = f"from {s.status.earlier}"
        copy = " (a copy of a kernel log line in the job's output)" if s.status.kernel_format_copy else ""
        groups.setdefault((s.id, why, copy), []).append(s)
    for (sid, why, copy), ss in list(groups.items())[:10]:
        wheres = sorted({_where(s) for s in ss})
        shown_where = ", ".join(wheres[:_SHOWN_WHERE]) + (f" (+{len(wheres) - _SHOWN_WHERE})" if len(wheres) > _SHOWN_WHERE else "")
        lines.append(f"  - {sid} on {shown_where}: {why}{copy}")
    return lines


def _coverage_block(v: Verdict) -> list[str]:
    gaps = [c for c in v.coverage if c.status != "ok"]
    if not gaps:
        return []
    lines = ["", "Coverage gaps:"]
    for c in gaps[:20]:
        lines.append(f"  - {c.source}{' on ' + c.node if c.node else ''}: {c.status}"
                     + (f" ({c.detail})" if c.detail else ""))
    if len(gaps) > 20:
        lines.append(f"  ... {len(gaps) - 20} more")
    return lines


def _action_state(a: Action) -> str:
    if a.applied:
        return "applied"
    return f"not applied: {a.blocked_by}"


def _actions_block(v: Verdict) -> list[str]:
    if not v.actions:
        return []
    lines = ["", "Drain decisions:"]
    for a in v.actions:
        lines.append(f"  - {a.kind} {a.node}: {a.reason} ({_action_state(a)})")
    return lines


def _requeue_lines(v: Verdict) -> list[str]:
    """The requeue decision (requeue.py), one line: "requeued as attempt 2; n7 excluded", why not,
    or which earlier attempt slurm-attr requeued this job after."""
    from .requeue import Decision

    r = v.requeue
    if not r:
        return []
    parts = []
    for e in r.get("after") or []:
        gone = ", ".join(e.get("excluded") or [])
        parts.append(f"attempt {r.get('attempt')}: slurm-attr requeued the job after attempt {e.get('attempt')} "
                     f"({e.get('cause')}{'; ' + gone + ' excluded' if gone else ''})")
    if "requeued" in r:
        parts.append(Decision.from_dict(r).line())
    return ["", "Requeue: " + "; ".join(parts)] if parts else []


def _drain_notes(v: Verdict) -> list[str]:
    out: list[str] = []
    # A drain decision of kind reboot is [drain] reboot's (nextstate DOWN); a reboot or reset
    # after a drain of the same node is the recovery action (recovery.py).
    drained_first = {a.node for a in v.actions if a.kind == "drain"}
    recovered = {a.node: a for a in v.actions if a.kind in ("reboot", "reset") and a.node in drained_first}
    taken = [a for a in v.actions if a.kind in ("drain", "reboot") and a.node and recovered.get(a.node) is not a]
    drained = [a.node for a in taken if a.applied or a.blocked_by == "already drained"]
    rebooting = [a.node for a in taken if a.applied and a.kind == "reboot"]
    if drained:
        nodes = _and(drained)  # type: ignore[arg-type]
        what = "rebooting, then left DOWN" if rebooting else "drained"
        first = drained[0]
        out.append(f"{nodes} {what}; run the GPU/host diagnostic (e.g. dcgmi diag -r 3) before resuming it: "
                   f"`sattr undrain {first} --reason \"...\"`.")
    for node, a in recovered.items():
        if a.kind == "reboot":
            out.append(f"{node}: reboot requested (the driver asks for it); Slurm resumes the node when it is back"
                       if a.applied else f"{node}: reboot not requested ({a.blocked_by}).")
        else:
            out.append(f"{node}: the site's GPU reset ran" if a.applied else f"{node}: GPU reset failed or not run "
                       f"({jobtext.line(a.blocked_by or '')[:120]}); the node stays drained.")
    for a in taken:
        if a.applied or a.blocked_by == "already drained":
            continue
        why = a.blocked_by or ""
        if why.startswith("not our drain"):
            out.append(f"{a.node} is already out of service ({why.partition(': ')[2] or why}); left exactly as it is.")
        elif why == "circuit breaker":
            out.append(f"{a.node} was NOT drained: the circuit breaker has paused automatic drains "
                       "(`sattr breaker status`). Drain it by hand if the diagnostic agrees.")
        elif why == "dry-run":
            out.append(f"Dry-run: {a.node} would have been drained ({a.reason}).")
        elif why == "offline analysis":
            out.append(f"The drain policy would take out {a.node} ({a.reason}).")
        elif why:
            out.append(f"{a.node} was not drained ({why}).")
    return out


def notes(v: Verdict, job: dict[str, Any]) -> list[str]:
    """Plain-language next steps."""
    out: list[str] = _drain_notes(v)
    root = v.root()
    fields = root.fields if root is not None and isinstance(root.fields, dict) else {}
    ranks = _and([str(r) for r in v.culprit_ranks])
    rank_word = "Rank" if len(v.culprit_ranks) == 1 else "Ranks"
    if v.domain == "hardware" and (v.requeue or {}).get("requeued"):
        out.append("No need to resubmit: slurm-attr requeued the job; it runs again without the broken node.")
    elif v.domain == "hardware":
        out.append("Resubmit: the failure is not in the program" + (", and the broken node is out of service."
                                                                      if any(a.applied for a in v.actions) else "."))
    elif v.cause == "collective_mismatch":
        where = fields.get("first_divergent_frame") or fields.get("frame") or fields.get("where") or ""
        lead = f"{rank_word} {ranks} diverged" if ranks else "The ranks diverged"
        out.append(f"{lead}" + (f" at {jobtext.quote(where, 160)}" if where else "")
                   + " — a data-dependent branch or an uneven loop: every rank must issue the same collectives "
                     "in the same order with the same sizes.")
    elif v.cause == "rank_stuck":
        lead = f"{rank_word} {ranks}" if ranks else "Some ranks"
        out.append(f"{lead} never reached the collective the others waited in: check data loading, "
                   "checkpointing or a hung kernel there (py-spy dump on a rerun).")
    elif v.cause == "comm_hang":
        out.append("Every rank entered the collective and none finished: suspect the network or a GPU; "
                   "check the nodes' IB/NVLink counters.")
    elif v.cause == "network":
        where = _and(v.culprit_nodes)
        out.append("A network link or transport failed" + (f" near {where}" if where else "")
                   + ": resubmit; if it repeats on the same node, ask the admins to check its IB port.")
    elif v.cause == "time_limit":
        out.append("Raise --time or checkpoint more often.")
    elif v.cause in ("cuda_oom", "host_oom"):
        out.append("Reduce the batch size or ask for more memory (--mem / --mem-per-gpu).")
    elif v.cause == "user_error":
        first_known = root is not None and bool(root.status.first_failure)
        first = f"{rank_word} {ranks} failed first; the other ranks' errors followed it. " if first_known and ranks else ""
        out.append(first + "The program failed on its own: the evidence above points at the line to look at.")
    elif v.cause == "node_failure":
        out.append("Slurm lost a node during the job: resubmit; the admins see it in `sattr nodes`.")
    elif v.cause == "filesystem":
        out.append("The shared filesystem failed or hung: resubmit later; report it if it persists.")
    elif v.cause == "launch_failure":
        out.append("The job could not start (prolog, container or srun): check the options, then tell the admins.")
    elif v.cause in ("cancelled", "preempted"):
        out.append(f"The job was {v.cause}: nothing failed in it.")
    elif v.cause == "unknown":
        if any(c.status != "ok" for c in v.coverage):
            out.append("Not enough evidence; the coverage gaps above say what was missing.")
        else:
            out.append("No rule recognised this failure: `sattr analyze` on the bundle shows what was read.")
    return out


def verdict_text(v: Verdict, job: dict[str, Any] | None = None, color: bool = False,
                 comment_status: str | None = None) -> str:
    raw, raw_job = v, job or {}
    # A printable copy of everything the verdict and the job record hold: the blocks below
    # interpolate dozens of fields, and one missed would be one escape sequence let through.
    v = Verdict.from_dict(jobtext.deep(raw.to_dict()))
    job = jobtext.deep(raw_job)
    lines = _header(v, job, color)
    lines += _verdict_block(v, color)
    lines += _evidence_block(v)
    lines += _claims_block(v)
    lines += _coverage_block(v)
    lines += _actions_block(v)
    lines += _requeue_lines(v)
    if comment_status and comment_status != "written":
        lines += ["", f"Job comment: {jobtext.line(comment_status)} "
                      "(retried on the next analysis, or `sattr comments --retry`)"]
    n = [jobtext.line(x) for x in notes(raw, raw_job)]  # notes quote job text themselves
    if n:
        lines += ["", _bold("Notes:", color)]
        lines.extend(f"  * {x}" for x in n)
    return "\n".join(lines)
