"""One self-contained HTML file: the divergence matrix and the findings (no external assets).

Everything that came from a dump is escaped, and its control characters (ESC, which
html.escape keeps, bidi overrides) made visible (jobtext.block). The culprit cell carries the
class ``cell culprit``, the first divergent column's header ``divergent`` and
a ▼ marker, so the page reads without colour too.
"""
from __future__ import annotations

import html
import json
from typing import Any

from .. import jobtext
from ..model import Coverage, Symptom
from .matrix import NO_DATA, NO_DUMP, NOT_REACHED, Matrix
from .symptoms import ranges

# Colour-blind-safe-ish pastel fills for signatures; the culprit gets a red outline and fill.
_FILLS = ["#9ecae1", "#a1d99b", "#fdd0a2", "#dadaeb", "#c7e9c0", "#fde0ef", "#d9d9d9", "#c6dbef", "#fee6ce", "#e5f5e0", "#bcbddc", "#f2f0f7"]

_CSS = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5em; color: #222; }
h1 { font-size: 1.3em; } h2 { font-size: 1.1em; margin-top: 1.6em; }
table.matrix { border-collapse: collapse; margin: .5em 0 1em; font-family: ui-monospace, monospace; }
table.matrix th, table.matrix td { border: 1px solid #ccc; padding: 2px 6px; text-align: center; }
table.matrix th.ranks { text-align: left; }
table.matrix th.divergent { background: #fff3c4; color: #b00; }
td.cell.nr { color: #999; } td.cell.nd { background: #eee; color: #999; }
td.cell.culprit { background: #e34a33 !important; color: #fff; font-weight: bold; outline: 3px solid #b30000; }
tr.culprit th.ranks { color: #b00; }
.legend td { padding: 2px 8px; } .legend .swatch { font-family: ui-monospace, monospace; }
.finding { border-left: 4px solid #e34a33; padding: .3em .8em; margin: .8em 0; background: #fff7f5; }
.finding.cascade { border-color: #999; background: #f7f7f7; }
pre { background: #f6f6f6; padding: .5em; overflow-x: auto; }
.muted { color: #666; }
"""


def _e(x: Any) -> str:
    return html.escape(jobtext.block(x), quote=True)


def _matrix_html(m: Matrix) -> str:
    fills = {s: _FILLS[i % len(_FILLS)] for i, s in enumerate(m.legend)}
    css = "".join(f"td.cell.s{i} {{ background: {fills[s]}; }}\n" for i, s in enumerate(m.legend))
    index = {s: i for i, s in enumerate(m.legend)}
    out = [f"<style>{css}</style>"]
    if not m.panels:
        out.append("<p>No divergence: every process group agrees on every collective in the dumps.</p>")
    for p in m.panels:
        title = f"PG {p.label}: {p.members} rank{'s' if p.members != 1 else ''}" + (f", {p.title}" if p.title else "")
        out.append(f'<h3 class="panel {p.role}">{_e(title)}</h3>')
        if not p.seqs:
            out.append('<p class="muted">No collectives recorded.</p>')
            continue
        out.append(f'<table class="matrix" data-pg="{_e(p.pg)}"><thead><tr><th class="ranks">ranks \\ seq</th>')
        for i, s in enumerate(p.seqs):
            if i == p.divergent_col:
                out.append(f'<th class="divergent" title="first divergence">▼ {s}</th>')
            else:
                out.append(f"<th>{s}</th>")
        out.append("</tr></thead><tbody>")
        for row in p.rows:
            out.append(f'<tr class="{"culprit" if row.culprit else ""}"><th class="ranks">{_e(row.label)}{" <span class=muted>(" + _e(row.note) + ")</span>" if row.note else ""}</th>')
            for i, c in enumerate(row.cells):
                classes = ["cell"]
                if c.sym in index:
                    classes.append(f"s{index[c.sym]}")
                elif c.sym == NOT_REACHED:
                    classes.append("nr")
                elif c.sym == NO_DUMP:
                    classes.append("nd")
                if c.culprit:
                    classes.append("culprit")
                if i == p.divergent_col:
                    classes.append("divcol")
                label = m.legend.get(c.sym, {NOT_REACHED: "not reached", NO_DUMP: "no dump", NO_DATA: "not in window"}.get(c.sym, ""))
                out.append(f'<td class="{" ".join(classes)}" title="{_e(label)}">{_e(c.sym) if c.sym != NO_DATA else "&nbsp;"}</td>')
            out.append("</tr>")
        out.append("</tbody></table>")
    if m.legend:
        out.append('<table class="legend"><tbody>')
        for s, text in m.legend.items():
            out.append(f'<tr><td class="cell s{index[s]} swatch">{_e(s)}</td><td>{_e(text)}</td></tr>')
        out.append(f"<tr><td>{NOT_REACHED}</td><td>not reached</td></tr><tr><td>{NO_DUMP}</td><td>no dump</td></tr>"
                   '<tr><td class="cell culprit">X</td><td>culprit</td></tr><tr><td>▼</td><td>first divergence</td></tr></tbody></table>')
    if m.hidden_groups:
        out.append(f'<p class="muted">{m.hidden_groups} more group(s) without findings.</p>')
    return "\n".join(out)


def _symptom_html(s: Symptom) -> str:
    f = s.fields
    if s.rank is None and f.get("behind_ranks"):
        # a downstream hang: its victims, not one rank of its own
        who = f"ranks behind {ranges(f['behind_ranks'])}, nodes {', '.join(f.get('behind_nodes') or []) or '?'}"
    else:
        who = f"rank {s.rank}, node {s.node}"
    parts = [f'<div class="finding {s.role}" data-symptom="{_e(s.id)}"><b>{_e(s.id)}</b> <span class="muted">({_e(s.role)}, cause {_e(s.cause)}, {_e(who)})</span><br>{_e(s.summary)}']
    fd = f.get("first_differing_frame")
    if fd:
        parts.append(f"<br>First differing frame: culprit <code>{_e(fd.get('culprit'))}</code> vs majority <code>{_e(fd.get('majority'))}</code>")
    for key, title in (("culprit_stack", "Culprit stack"), ("majority_stack", "Majority stack")):
        if f.get(key):
            parts.append(f"<details><summary>{title}</summary><pre>{_e(chr(10).join(f[key]))}</pre></details>")
    if s.evidence:
        parts.append("<ul>" + "".join(f"<li>{_e(e.source)}: <code>{_e(e.path)}</code> {_e(e.text)}</li>" for e in s.evidence) + "</ul>")
    parts.append("</div>")
    return "".join(parts)


def render_html(m: Matrix, symptoms: list[Symptom], coverage: list[Coverage], title: str, verdict: dict[str, Any] | None = None,
                note: str = "") -> str:
    """The whole report page as one string; ``note`` says why there is no verdict section."""
    out = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">', f"<title>{_e(title)}</title>", f"<style>{_CSS}</style></head><body>"]
    out.append(f"<h1>{_e(title)}</h1>")
    if verdict is not None:
        out.append("<h2>Verdict</h2>")
        culprit = verdict.get("culprit") or {}
        out.append(f'<p class="verdict"><b>{_e(verdict.get("cause"))}</b> ({_e(verdict.get("domain"))}): {_e(verdict.get("summary"))}</p>')
        out.append(f"<p>Culprit nodes: {_e(', '.join(map(str, culprit.get('nodes') or [])) or '-')}; ranks: {_e(', '.join(map(str, culprit.get('ranks') or [])) or '-')}</p>")
        out.append(f"<details><summary>Full verdict (JSON)</summary><pre>{_e(json.dumps(verdict, indent=2, default=str))}</pre></details>")
    elif note:
        out.append(f'<p class="muted">No verdict: {_e(note)}.</p>')
    out.append("<h2>Flight Recorder findings</h2>")
    if symptoms:
        out.extend(_symptom_html(s) for s in symptoms)
    else:
        out.append("<p>No Flight Recorder finding.</p>")
    out.append("<h2>Divergence matrix</h2>")
    out.append('<p class="muted">Rows: ranks (identical rows folded); columns: collective sequence numbers per process group; '
               "one letter per signature (op, sizes, dtypes).</p>")
    out.append(_matrix_html(m))
    if coverage:
        out.append("<h2>Coverage</h2><table class=\"coverage\"><tbody>")
        for c in coverage:
            out.append(f"<tr><td>{_e(c.source)}</td><td>{_e(c.node or '-')}</td><td>{_e(c.status)}</td><td>{_e(c.detail)}</td></tr>")
        out.append("</tbody></table>")
    out.append("</body></html>")
    return "\n".join(out) + "\n"
