"""The fleet report as one self-contained HTML page (docs/fleet.md): no network, no script.

Input is the dict ``facts.fleet_report`` returns; nothing is read from the store here. Every
string in it may have come from a job (summaries, drain reasons, diag output), so each one is
escaped and its control characters made visible (jobtext.block), as in flightrec/matrixhtml.py.

The numbers a machine (or a test) wants to check sit in data attributes: each total in an
element with ``data-metric``, each cause row ``data-cause``/``data-jobs``/``data-gpu-hours``,
each node row ``data-node``. The page stays under 5 MB whatever the report holds (100,000
verdicts over 500 nodes: about 1.8 MB): every string is cut, examples, timelines and days are
counted, and each long section has a room in bytes (ROOM); a cut says what it left out.
"""
from __future__ import annotations

from typing import Any, Iterable

from .charts import bars, colours, daily
from .htmltext import MAX_CAUSES, MAX_EVENT_JOBS, MAX_EXAMPLES, MAX_LEMONS, MAX_NODE_NAMES, MAX_TIMELINE_NODES, \
    MAX_TIMELINE_ROWS, TEXT_CAP, Room, age, count, esc, hours

_CSS = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5em; color: #222; max-width: 1400px; }
h1 { font-size: 1.4em; margin-bottom: .2em; } h2 { font-size: 1.15em; margin-top: 1.8em; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; margin: .5em 0 1em; }
th, td { border: 1px solid #ccc; padding: 2px 6px; text-align: left; vertical-align: top; }
th { background: #f3f3f3; }
td.n, th.n { text-align: right; font-variant-numeric: tabular-nums; }
table.totals td { font-size: 1.2em; font-weight: bold; text-align: right; }
.txt { white-space: pre-wrap; word-break: break-word; max-width: 60em; }
.muted { color: #666; } .lemon { color: #b2182b; font-weight: bold; }
tr.lemon th { color: #b2182b; }
code, .mono { font-family: ui-monospace, monospace; font-size: .95em; }
details > summary { cursor: pointer; color: #2166ac; }
table.timeline { font-size: .9em; margin: .3em 0; }
svg text { font: 12px system-ui, sans-serif; fill: #222; }
.legend span { display: inline-block; margin-right: 1em; }
.legend i { display: inline-block; width: .9em; height: .9em; margin-right: .3em; vertical-align: -.1em; }
@media print { body { margin: 0; max-width: none; } details > summary { color: #222; } h2 { break-after: avoid; } tr { break-inside: avoid; } }
"""


def _header(report: dict[str, Any]) -> list[str]:
    cluster = report.get("cluster") or "?"
    since = report.get("since") or "the first stored verdict"
    out = [f"<h1>slurm-attr fleet report: <span data-field=\"cluster\">{esc(cluster)}</span></h1>",
           f'<p>Period: <span data-field="since">{esc(since)}</span> to <span data-field="until">{esc(report.get("until"))}</span>; '
           f'generated {esc(report.get("generated_at"))}'
           + ("" if report.get("admin") else "; <span class=\"muted\">a shared view: no user names, no per-user section</span>")
           + "</p>"]
    totals = report.get("totals") or {}
    names = [("jobs", "jobs analysed"), ("failed_jobs", "failed jobs"), ("gpu_hours_lost", "GPU-hours lost"),
             ("hardware_events", "hardware events"), ("drains_applied", "drains applied"),
             ("drains_blocked", "drains blocked"), ("undrains", "undrains"),
             ("gpu_hours_saved", "GPU-hours spared by live cancels")]
    out.append('<table class="totals"><thead><tr>' + "".join(f"<th>{label}</th>" for _k, label in names)
               + "</tr></thead><tbody><tr>"
               + "".join(f'<td data-metric="{k}">{(hours if k.startswith("gpu_hours") else count)(totals.get(k))}</td>' for k, _label in names) + "</tr></tbody></table>")
    return out


def _causes(report: dict[str, Any], fills: dict[str, str]) -> list[str]:
    causes = report.get("causes") or []
    out = ["<h2>GPU-hours lost by cause</h2>"]
    if not causes:
        return out + ['<p class="muted">No verdicts in this period.</p>']
    by_hours = any(float(c.get("gpu_hours_lost") or 0) > 0 for c in causes)
    unit = "GPU-hours lost" if by_hours else "jobs"
    if not by_hours:
        out.append('<p class="muted">No job in this period has GPU-hours recorded: bars count jobs.</p>')
    out.append(bars([(str(c.get("cause")), float((c.get("gpu_hours_lost") if by_hours else c.get("jobs")) or 0), fills.get(c.get("cause"), "#999"))
                      for c in causes[:MAX_CAUSES]], unit))
    out.append('<table class="causes"><thead><tr><th>cause</th><th>domain</th><th class="n">jobs</th>'
               '<th class="n">GPU-hours lost</th><th>costliest jobs</th></tr></thead><tbody>')
    room = Room("causes")
    for c in causes[:MAX_CAUSES]:
        if room.full():
            continue
        ex = list(c.get("examples") or [])[:MAX_EXAMPLES]
        row = (f'<tr data-cause="{esc(c.get("cause"))}" data-jobs="{count(c.get("jobs"))}" data-gpu-hours="{hours(c.get("gpu_hours_lost"))}">'
               f'<th>{esc(c.get("cause"))}</th><td>{esc(c.get("domain"))}</td><td class="n">{count(c.get("jobs"))}</td>'
               f'<td class="n">{hours(c.get("gpu_hours_lost"))}</td><td>{_examples(ex)}</td></tr>')
        if room.take(row):
            out.append(row)
    out.append("</tbody></table>")
    left = room.cut + max(0, len(causes) - MAX_CAUSES)
    if left:
        out.append(f'<p class="muted">{left} more causes not listed.</p>')
    return out


def _examples(ex: list[dict[str, Any]]) -> str:
    if not ex:
        return '<span class="muted">-</span>'
    rows = []
    for j in ex:
        nodes = [str(n) for n in j.get("nodes") or []]
        shown = ", ".join(nodes[:MAX_NODE_NAMES]) + (f" and {len(nodes) - MAX_NODE_NAMES} more" if len(nodes) > MAX_NODE_NAMES else "")
        user = f", user {esc(j.get('user'), 64)}" if j.get("user") else ""
        rows.append(f'<div data-example="{esc(j.get("job_id"), 64)}"><b class="mono">{esc(j.get("job_id"), 64)}</b>{user}, '
                    f'{count(j.get("gpus"))} GPUs, {hours(j.get("gpu_hours_lost"))} GPU-h, ended {esc(j.get("end_time") or "-")}, '
                    f'on {esc(shown, 200) or "-"}<br><span class="txt">{esc(j.get("summary"), TEXT_CAP)}</span></div>')
    return "".join(rows)


def _timeline(rows: Iterable[dict[str, Any]]) -> str:
    body = "".join(f'<tr data-kind="{esc(r.get("kind"))}"><td class="mono">{esc(r.get("at"))}</td><td>{esc(r.get("kind"))}</td>'
                   f'<td class="mono">{esc(r.get("job_id") or "", 64)}</td><td>{esc(r.get("cause") or "")}</td>'
                   f'<td class="txt">{esc(r.get("detail"), 200)}</td></tr>' for r in rows)
    return ('<table class="timeline"><thead><tr><th>at</th><th>what</th><th>job</th><th>cause</th><th>detail</th></tr></thead>'
            f"<tbody>{body}</tbody></table>")


def _node_row(n: dict[str, Any]) -> str:
    culprit = n.get("culprit_of") or {}
    culprit_txt = ", ".join(f"{esc(c, 40)} {count(k)}" for c, k in sorted(culprit.items(), key=lambda kv: (-int(kv[1] or 0), str(kv[0]))))
    state = esc(n.get("state") or "-") + (f': <span class="txt">{esc(n.get("reason"), 200)}</span>' if n.get("reason") else "")
    if n.get("drained_by_us"):
        state += ' <span class="muted">(drained by slurm-attr)</span>'
    cls = ' class="lemon"' if n.get("lemon") else ""
    return (f'<tr data-node="{esc(n.get("node"))}" data-jobs="{count(n.get("jobs"))}" data-hw7d="{count(n.get("hardware_verdicts_7d"))}" '
            f'data-gpu-hours="{hours(n.get("gpu_hours_lost"))}"{cls}><th>{esc(n.get("node"))}{" (lemon)" if n.get("lemon") else ""}</th>'
            f'<td class="n">{count(n.get("jobs"))}</td><td>{culprit_txt or "-"}</td><td class="n">{count(n.get("hardware_verdicts_7d"))}</td>'
            f'<td class="n">{count(n.get("hardware_events"))}</td><td class="n">{hours(n.get("gpu_hours_lost"))}</td><td>{state}</td></tr>')


def _nodes(report: dict[str, Any]) -> list[str]:
    nodes = list(report.get("nodes") or [])
    out = ["<h2>Nodes</h2>"]
    lemons = [n for n in nodes if n.get("lemon")]
    if lemons:
        out.append('<p>Lemon nodes (hardware culprit of repeated verdicts in the last 7 days): '
                   + ", ".join(f'<span class="lemon" data-lemon="{esc(n.get("node"))}">{esc(n.get("node"))}</span>'
                               for n in lemons[:MAX_LEMONS]) + (f" and {len(lemons) - MAX_LEMONS} more" if len(lemons) > MAX_LEMONS else "")
                   + "</p>")
    else:
        out.append("<p>No lemon node.</p>")
    if not nodes:
        return out + ['<p class="muted">No node named by a verdict in this period.</p>']
    out.append('<p class="muted">Worst first. Expand a node for its timeline: verdicts naming it, drains, undrains, '
               "recoveries and diagnostics, newest first.</p>")
    out.append('<table class="nodes"><thead><tr><th>node</th><th class="n">jobs</th><th>culprit of</th>'
               '<th class="n">hardware verdicts, 7 days</th><th class="n">hardware events</th><th class="n">GPU-hours lost</th>'
               "<th>state / reason</th></tr></thead><tbody>")
    rows, timelines = Room("nodes"), Room("timelines")
    with_timeline = have = 0
    for n in nodes:
        if rows.full() or not rows.take(row := _node_row(n)):
            continue
        out.append(row)
        items = list(n.get("timeline") or [])[:MAX_TIMELINE_ROWS]
        have += bool(items)
        if not items or with_timeline >= MAX_TIMELINE_NODES or timelines.cut:
            continue
        tl = (f'<tr class="tl"><td colspan="7"><details><summary>timeline of {esc(n.get("node"))} '
              f'({len(items)} entr{"y" if len(items) == 1 else "ies"})</summary>{_timeline(items)}</details></td></tr>')
        if timelines.take(tl):
            out.append(tl)
            with_timeline += 1
    out.append("</tbody></table>")
    if rows.cut:
        out.append(f'<p class="muted">{rows.cut} more nodes not listed.</p>')
    if have > with_timeline:
        out.append(f'<p class="muted">Timelines shown for the {with_timeline} worst nodes; {have - with_timeline} more listed '
                   "have one (sattr nodes NODE shows it).</p>")
    return out


def _gpu_rows(report: dict[str, Any], room: Room) -> Iterable[str]:
    for n in report.get("nodes") or []:
        for g in n.get("gpus") or []:
            for ev in g.get("events") or []:
                if room.full():
                    continue
                jobs = [str(j) for j in ev.get("jobs") or []]
                shown = ", ".join(jobs[:MAX_EVENT_JOBS]) + (f" and {len(jobs) - MAX_EVENT_JOBS} more" if len(jobs) > MAX_EVENT_JOBS else "")
                yield (f'<tr data-gpu-node="{esc(n.get("node"))}" data-gpu="{esc(g.get("gpu"))}" data-event="{esc(ev.get("event"))}" '
                       f'data-ended="{len(jobs)}"><th>{esc(n.get("node"))}</th><td class="mono">{esc(g.get("gpu"))}</td>'
                       f'<td class="mono">{esc(ev.get("event"))}</td><td class="mono">{esc(ev.get("time") or "-")}</td>'
                       f'<td class="txt">{esc(ev.get("summary"), 200)}</td><td class="mono">{esc(shown, 600) or "-"}</td></tr>')


def _gpus(report: dict[str, Any]) -> list[str]:
    out = ["<h2>GPUs with hardware events</h2>"]
    room = Room("gpus")
    rows = [r for r in _gpu_rows(report, room) if room.take(r)]
    if not rows:
        return out + ['<p class="muted">No trusted hardware event in this period.</p>']
    out.append('<p class="muted">Each distinct event once (node, GPU, rule, time), with the jobs it ended.</p>')
    out.append('<table class="gpus"><thead><tr><th>node</th><th>GPU</th><th>event</th><th>time</th><th>summary</th>'
               f'<th>jobs ended</th></tr></thead><tbody>{"".join(rows)}</tbody></table>')
    if room.cut:
        out.append(f'<p class="muted">{room.cut} more events not listed.</p>')
    return out


def _drains(report: dict[str, Any]) -> list[str]:
    d = report.get("drains") or {}
    br = d.get("breaker") or {}
    out = ["<h2>Drains</h2>",
           f'<p>Applied: <b data-drains="applied">{count(d.get("applied"))}</b>; undrains: <b data-drains="undrains">{count(d.get("undrains"))}</b>.</p>']
    blocked = d.get("blocked") or {}
    if blocked:
        out.append('<table class="blocked"><thead><tr><th>blocked by</th><th class="n">decisions</th></tr></thead><tbody>'
                   + "".join(f'<tr data-blocked="{esc(k, 80)}" data-count="{count(v)}"><td>{esc(k, 80)}</td><td class="n">{count(v)}</td></tr>'
                             for k, v in sorted(blocked.items(), key=lambda kv: (-int(kv[1] or 0), str(kv[0])))[:50])
                   + "</tbody></table>")
    else:
        out.append("<p>No drain was blocked.</p>")
    if br.get("tripped"):
        out.append(f'<p class="lemon" data-breaker="tripped">Circuit breaker TRIPPED at {esc(br.get("tripped_at") or "?")}: '
                   f'<span class="txt">{esc(br.get("why"), 300)}</span> (automatic drains are blocked until '
                   "<code>sattr drains reset</code>).</p>")
    else:
        out.append('<p data-breaker="closed">Circuit breaker closed: automatic drains go ahead.</p>')
    return out


def _queue(report: dict[str, Any]) -> list[str]:
    p = report.get("pending") or {}
    lat = report.get("latency") or {}
    return ["<h2>Pending queue and latency</h2>",
            f'<p>Jobs ended without a verdict yet: <b data-metric="pending_jobs">{count(p.get("jobs"))}</b>; the oldest waits '
            f'<span data-metric="pending_oldest_age_s" data-value="{hours(p.get("oldest_age_s"))}">{age(p.get("oldest_age_s"))}</span>.</p>',
            f'<p>Job end to verdict stored, over <b data-metric="latency_count">{count(lat.get("count"))}</b> verdicts: '
            f'median <b data-metric="latency_p50_s">{hours(lat.get("p50_s"))}</b> s, '
            f'95th percentile <b data-metric="latency_p95_s">{hours(lat.get("p95_s"))}</b> s.</p>']


def _users(report: dict[str, Any]) -> list[str]:
    users = list(report.get("users") or [])
    out = ["<h2>Users</h2>"]
    if not users:
        return out + ['<p class="muted">No jobs in this period.</p>']
    out.append('<table class="users"><thead><tr><th>user</th><th class="n">jobs</th><th class="n">failed</th>'
               '<th class="n">GPU-hours lost</th><th>causes</th></tr></thead><tbody>')
    room = Room("users")
    for u in users:
        if room.full():
            continue
        classes = ", ".join(f"{esc(c, 40)} {count(k)}" for c, k in sorted((u.get("classes") or {}).items(), key=lambda kv: (-int(kv[1] or 0), str(kv[0]))))
        row = (f'<tr data-user="{esc(u.get("user"), 64)}" data-jobs="{count(u.get("jobs"))}" data-failed="{count(u.get("failed"))}" '
               f'data-gpu-hours="{hours(u.get("gpu_hours_lost"))}"><th>{esc(u.get("user"), 64)}</th><td class="n">{count(u.get("jobs"))}</td>'
               f'<td class="n">{count(u.get("failed"))}</td><td class="n">{hours(u.get("gpu_hours_lost"))}</td><td>{classes or "-"}</td></tr>')
        if room.take(row):
            out.append(row)
    out.append("</tbody></table>")
    if room.cut:
        out.append(f'<p class="muted">{room.cut} more users not listed.</p>')
    return out


def render_fleet_html(report: dict[str, Any]) -> str:
    """The whole page as one string (UTF-8 safe: lone surrogates are made visible)."""
    fills = colours(report)
    out = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
           '<meta name="viewport" content="width=device-width, initial-scale=1">',
           f"<title>slurm-attr fleet report: {esc(report.get('cluster') or '?')}</title>", f"<style>{_CSS}</style></head><body>"]
    out += _header(report)
    out += _causes(report, fills)
    out += daily(report, fills)
    out += _nodes(report)
    out += _gpus(report)
    out += _drains(report)
    out += _queue(report)
    # Per-user figures are for admins only: facts leaves the key out for anyone else, and a
    # report that says it is not an admin's never shows one even if the key is there.
    if report.get("admin") and report.get("users") is not None:
        out += _users(report)
    out.append("</body></html>")
    return "\n".join(out) + "\n"
