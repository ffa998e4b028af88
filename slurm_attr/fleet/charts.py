"""The fleet page's two pictures as inline SVG (no script, no network): bars of a value per
cause, and a stacked bar per day; the colours keep a cause's domain recognisable."""
from __future__ import annotations

from typing import Any

from .htmltext import MAX_DAYS, count, esc, hours

DOMAIN_SHADES = {
    "hardware": ["#b2182b", "#d6604d", "#f4a582"],
    "network": ["#e08214", "#fdb863", "#b35806"],
    "infrastructure": ["#8c510a", "#bf812d", "#dfc27d"],
    "scheduler": ["#762a83", "#9970ab", "#c2a5cf"],
    "user": ["#2166ac", "#4393c3", "#92c5de", "#053061", "#6baed6", "#c6dbef"],
    "none": ["#bdbdbd"],
    "unknown": ["#737373"],
}
OTHER = ["#1b7837", "#5aae61", "#a6dba0", "#35978f", "#80cdc1"]

def colours(report: dict[str, Any]) -> dict[str, str]:
    """cause -> fill, in the causes' order (costliest first), then causes only in daily."""
    seen: dict[str, str] = {}
    used: dict[str, int] = {}
    doms = {c.get("cause"): c.get("domain") for c in report.get("causes") or []}
    order = [c.get("cause") for c in report.get("causes") or []] + [d.get("cause") for d in report.get("daily") or []]
    for cause in order:
        if cause in seen:
            continue
        shades = DOMAIN_SHADES.get(str(doms.get(cause)), OTHER)
        i = used.get(str(doms.get(cause)), 0)
        used[str(doms.get(cause))] = i + 1
        seen[cause] = shades[i % len(shades)]
    return seen


def bars(rows: list[tuple[str, float, str]], unit: str) -> str:
    """A horizontal bar chart: (label, value, fill) per row, the longest bar the largest value."""
    if not rows:
        return ""
    top = max(v for _l, v, _fill in rows) or 1.0
    fmt = hours if unit != "jobs" else count
    label_w, bar_w, h = 170, 560, 22
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" role="img" width="{label_w + bar_w + 110}" '
             f'height="{h * len(rows) + 6}" aria-label="{esc(unit)} by cause">']
    for i, (label, v, fill) in enumerate(rows):
        y = i * h + 3
        w = max(1.0, bar_w * v / top) if v > 0 else 0.0
        parts.append(f'<text x="{label_w - 6}" y="{y + 15}" text-anchor="end">{esc(label, 40)}</text>'
                     f'<rect x="{label_w}" y="{y + 2}" width="{w:.1f}" height="{h - 6}" fill="{fill}"><title>{esc(label, 40)}: '
                     f'{fmt(v)} {esc(unit)}</title></rect><text x="{label_w + w + 6:.1f}" y="{y + 15}">{fmt(v)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def daily(report: dict[str, Any], colours: dict[str, str]) -> list[str]:
    daily = report.get("daily") or []
    out = ["<h2>Causes over time</h2>"]
    if not daily:
        return out + ['<p class="muted">No verdicts in this period.</p>']
    by_hours = any(float(d.get("gpu_hours_lost") or 0) > 0 for d in daily)
    key = "gpu_hours_lost" if by_hours else "jobs"
    days: dict[str, dict[str, float]] = {}
    for d in daily:
        days.setdefault(str(d.get("day")), {})[str(d.get("cause"))] = float(d.get(key) or 0)
    names = sorted(days)[-MAX_DAYS:]
    cut = len(days) - len(names)
    top = max((sum(days[n].values()) for n in names), default=0.0) or 1.0
    order = [c for c in colours if any(c in days[n] for n in names)]
    step = max(3, min(28, 980 // max(1, len(names))))
    chart_h, left = 220, 60
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" role="img" width="{left + step * len(names) + 10}" height="{chart_h + 50}" '
             f'aria-label="{"GPU-hours lost" if by_hours else "jobs"} per day by cause">',
             f'<text x="{left - 6}" y="12" text-anchor="end">{hours(top) if by_hours else count(top)}</text>'
             f'<text x="{left - 6}" y="{chart_h}" text-anchor="end">0</text>'
             f'<line x1="{left}" y1="{chart_h}" x2="{left + step * len(names)}" y2="{chart_h}" stroke="#999"/>']
    for i, day in enumerate(names):
        x, y = left + i * step, float(chart_h)
        for cause in order:
            v = days[day].get(cause, 0.0)
            if v <= 0:
                continue
            hgt = (chart_h - 8) * v / top
            y -= hgt
            parts.append(f'<rect x="{x}" y="{y:.1f}" width="{max(1, step - 2)}" height="{hgt:.1f}" fill="{colours.get(cause, "#999")}">'
                         f'<title>{esc(day)} {esc(cause, 40)}: {hours(v) if by_hours else count(v)}</title></rect>')
        if i % max(1, (len(names) + 9) // 10) == 0:  # about ten date labels
            parts.append(f'<text x="{x}" y="{chart_h + 16}">{esc(day[5:])}</text>')
    parts.append("</svg>")
    out.append(f'<p class="muted">{"GPU-hours lost" if by_hours else "Jobs"} per day, stacked by cause'
               + (f"; the {cut} oldest days are left out" if cut else "") + ".</p>")
    out.append("".join(parts))
    out.append('<p class="legend">' + "".join(f'<span><i style="background:{colours[c]}"></i>{esc(c, 40)}</span>' for c in order) + "</p>")
    return out
