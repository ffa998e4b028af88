"""A preview of a Grafana dashboard without Grafana: each panel of the dashboard JSON (its title and
its targets' PromQL, Grafana's variables substituted) queried from a real Prometheus and drawn as
inline SVG (lines or bars for timeseries, bars for barcharts, rows for tables, a number for stats)
in a grid that follows the panels' gridPos. One self-contained HTML file: no script, no network.

Grafana is not packaged in Debian; this is what the integration suite screenshots with headless
Chromium (test_fleet_prometheus.py). It is no Grafana: no field overrides beyond the unit, no
thresholds beyond the stat's colour, no transformations beyond hiding labels.

    python tests/integration/dashboard_preview.py --prometheus http://127.0.0.1:19090 \\
        --dashboard contrib/grafana/sattr.json --minutes 30 --out /tmp/dashboard.html
"""
from __future__ import annotations

import argparse
import html
import json
import math
import re
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HEADER = "panels of contrib/grafana/sattr.json rendered from Prometheus by the test suite (not Grafana)"
PALETTE = ["#7eb26d", "#eab839", "#6ed0e0", "#ef843c", "#e24d42", "#1f78c1", "#ba43a9", "#705da0",
           "#508642", "#cca300", "#447ebc", "#c15c17"]
HIDDEN_LABELS = {"__name__", "instance", "job"}
ROW_PX, WIDTH_PX, GAP_PX = 26, 1380, 6


def substitute(expr: str, variables: dict[str, str]) -> str:
    """Grafana's variables in a PromQL expression: $name, ${name} and ${name:fmt} (longest names first)."""
    out = re.sub(r"\$\{(\w+)(?::\w+)?\}", lambda m: variables.get(m.group(1), m.group(0)), expr)
    for name in sorted(variables, key=len, reverse=True):
        out = out.replace("$" + name, variables[name])
    return out


def grafana_variables(range_s: float, step_s: float, rate_interval: str = "1m", cluster: str = ".*") -> dict[str, str]:
    return {"cluster": cluster, "__rate_interval": rate_interval, "__range": f"{int(max(range_s, 1))}s",
            "__range_s": str(int(range_s)), "__interval": f"{int(max(step_s, 1))}s", "datasource": "",
            "__interval_ms": str(int(step_s * 1000))}


class Prometheus:
    def __init__(self, url: str, timeout: float = 30):
        self.url, self.timeout = url.rstrip("/"), timeout

    def _get(self, path: str, params: dict[str, Any]) -> Any:
        q = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"{self.url}{path}?{q}", timeout=self.timeout) as r:
            doc = json.load(r)
        if doc.get("status") != "success":
            raise RuntimeError(f"{path} {params}: {doc}")
        return doc["data"]

    def query(self, expr: str, at: float | None = None) -> list[dict]:
        params: dict[str, Any] = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        data = self._get("/api/v1/query", params)
        if data["resultType"] == "scalar":
            return [{"metric": {}, "value": data["result"]}]
        return data["result"]

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict]:
        return self._get("/api/v1/query_range", {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}",
                                                 "step": f"{step:g}"})["result"]


# -- formatting -------------------------------------------------------------------------------------


def fmt_value(v: float, unit: str = "short", decimals: int | None = None) -> str:
    if v is None or math.isnan(v):
        return "–"
    if math.isinf(v):
        return "∞" if v > 0 else "-∞"
    if unit == "s":
        a = abs(v)
        if a < 60:
            return f"{v:.{1 if decimals is None else decimals}f} s"
        if a < 3600:
            return f"{v / 60:.1f} min"
        if a < 86400:
            return f"{v / 3600:.1f} h"
        return f"{v / 86400:.1f} d"
    if decimals is not None and (v == 0 or abs(v) >= 10 ** -decimals):
        return f"{v:,.{decimals}f}"
    if 0 < abs(v) < 0.01:  # a few GPU-seconds in GPU-hours: not "0.00"
        return f"{v:.2g}"
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    return f"{v:.2f}".rstrip("0").rstrip(".") if v != int(v) else str(int(v))


def legend(fmt: str | None, labels: dict[str, str]) -> str:
    shown = {k: v for k, v in labels.items() if k not in HIDDEN_LABELS}
    if not fmt or fmt == "__auto":
        return ", ".join(f"{k}={v}" for k, v in sorted(shown.items())) or "value"
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), fmt)


def esc(s: Any) -> str:
    return html.escape(str(s), quote=True)


# -- panels -----------------------------------------------------------------------------------------


@dataclass
class Drawn:
    title: str
    kind: str
    series: int = 0  # series (or rows) drawn with data
    errors: list[str] = field(default_factory=list)


def _floats(values: list) -> list[tuple[float, float]]:
    out = []
    for t, v in values:
        try:
            f = float(v)
        except (TypeError, ValueError):
            continue
        if not math.isnan(f) and not math.isinf(f):
            out.append((float(t), f))
    return out


def nice_axis(lo: float, hi: float, n: int = 4) -> tuple[float, float, list[float]]:
    """An axis from lo to hi widened to round ticks (1, 2, 2.5, 5 × 10^k), about n intervals."""
    if hi <= lo:
        hi = lo + 1.0
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    lo2, hi2 = math.floor(lo / step) * step, math.ceil(hi / step) * step
    ticks = [lo2 + i * step for i in range(int(round((hi2 - lo2) / step)) + 1)]
    return lo2, hi2, ticks


def _legend_html(names: list[str]) -> str:
    return "<div class='legend'>" + "".join(
        f"<span><i style='background:{PALETTE[i % len(PALETTE)]}'></i>{esc(n)}</span>" for i, n in enumerate(names)) + "</div>"


def draw_timeseries(series: list[tuple[str, list[tuple[float, float]]]], start: float, end: float, step: float,
                    w: int, h: int, unit: str, bars: bool, stacked: bool, decimals: int | None) -> str:
    pad_l, pad_r, pad_t, pad_b = 56, 8, 6, 18
    cw, ch = max(w - pad_l - pad_r, 10), max(h - pad_t - pad_b, 10)
    pts = [v for _, s in series for _, v in s]
    if stacked and bars:
        sums: dict[float, float] = {}
        for _, s in series:
            for t, v in s:
                sums[t] = sums.get(t, 0.0) + max(v, 0.0)
        pts += list(sums.values())
    lo, hi, ticks = nice_axis(min(pts + [0.0]), max(pts + [0.0]))
    X = lambda t: pad_l + (t - start) / max(end - start, 1e-9) * cw  # noqa: E731
    Y = lambda v: pad_t + ch - (v - lo) / (hi - lo) * ch  # noqa: E731
    parts = [f"<svg width='{w}' height='{h}' xmlns='http://www.w3.org/2000/svg'>"]
    tick_dec = decimals if len(ticks) < 2 or ticks[1] - ticks[0] >= 1 else None
    for v in ticks:  # horizontal grid and y labels
        y = Y(v)
        parts.append(f"<line x1='{pad_l}' x2='{pad_l + cw}' y1='{y:.1f}' y2='{y:.1f}' stroke='#2c3235'/>"
                     f"<text x='{pad_l - 4}' y='{y + 3:.1f}' text-anchor='end'>{esc(fmt_value(v, unit, tick_dec))}</text>")
    for i in range(5):  # time labels
        t = start + (end - start) * i / 4
        anchor = "start" if i == 0 else "end" if i == 4 else "middle"
        parts.append(f"<text x='{X(t):.1f}' y='{h - 4}' text-anchor='{anchor}'>{time.strftime('%H:%M:%S' if end - start < 1200 else '%H:%M', time.gmtime(t))}</text>")
    bw = max(cw / max((end - start) / step, 1) * 0.8, 1.0)
    base: dict[float, float] = {}
    for i, (_, s) in enumerate(series):
        color = PALETTE[i % len(PALETTE)]
        if bars:
            per = 1 if stacked else max(len(series), 1)
            for t, v in s:
                b = base.get(t, 0.0) if stacked else 0.0
                top = b + v
                x = X(t) - bw / 2 + (0 if stacked else i * bw / per)
                y0, y1 = sorted((Y(b), Y(top)))
                parts.append(f"<rect x='{x:.1f}' y='{y0:.1f}' width='{bw / per:.1f}' height='{max(y1 - y0, 0.5):.1f}' "
                             f"fill='{color}' fill-opacity='0.8'/>")
                if stacked:
                    base[t] = top
        else:
            # a gap where a sample is missing (more than 1.5 steps apart)
            runs: list[list[tuple[float, float]]] = []
            for t, v in s:
                if runs and t - runs[-1][-1][0] <= step * 1.5:
                    runs[-1].append((t, v))
                else:
                    runs.append([(t, v)])
            for run in runs:
                if len(run) == 1:
                    t, v = run[0]
                    parts.append(f"<circle cx='{X(t):.1f}' cy='{Y(v):.1f}' r='2' fill='{color}'/>")
                else:
                    d = " ".join(f"{X(t):.1f},{Y(v):.1f}" for t, v in run)
                    parts.append(f"<polyline points='{d}' fill='none' stroke='{color}' stroke-width='1.5'/>")
    parts.append(f"<rect x='{pad_l}' y='{pad_t}' width='{cw}' height='{ch}' fill='none' stroke='#464c54'/></svg>")
    return "".join(parts)


def draw_bars(rows: list[tuple[str, float]], w: int, h: int, unit: str, decimals: int | None) -> str:
    if not rows:
        return ""
    label_w = min(160, max(40, 7 * max(len(r[0]) for r in rows)))
    bar_h = min(26, max((h - 4) / len(rows) - 4, 4))
    hi = max([v for _, v in rows] + [0.0]) or 1.0
    cw = max(w - label_w - 70, 10)
    parts = [f"<svg width='{w}' height='{h}' xmlns='http://www.w3.org/2000/svg'>"]
    for i, (name, v) in enumerate(rows):
        y = 2 + i * (bar_h + 4)
        if y + bar_h > h:
            break
        bw = max(v, 0) / hi * cw
        parts.append(f"<text x='{label_w - 4}' y='{y + bar_h / 2 + 4:.1f}' text-anchor='end'>{esc(name[:28])}</text>"
                     f"<rect x='{label_w}' y='{y:.1f}' width='{max(bw, 1):.1f}' height='{bar_h:.1f}' "
                     f"fill='{PALETTE[i % len(PALETTE)]}'/>"
                     f"<text x='{label_w + bw + 4:.1f}' y='{y + bar_h / 2 + 4:.1f}'>{esc(fmt_value(v, unit, decimals))}</text>")
    parts.append("</svg>")
    return "".join(parts)


def draw_table(results: list[dict], value_name: str, unit: str, limit: int = 12) -> str:
    first = ["cluster", "node", "gpu"]
    cols = sorted({k for r in results for k in r["metric"] if k not in HIDDEN_LABELS},
                  key=lambda c: (first.index(c) if c in first else len(first), c))
    head = "".join(f"<th>{esc(c)}</th>" for c in cols) + f"<th>{esc(value_name)}</th>"
    body = []
    for r in results[:limit]:
        v = float(r["value"][1])
        body.append("<tr>" + "".join(f"<td>{esc(r['metric'].get(c, ''))}</td>" for c in cols)
                    + f"<td class='num'>{esc(fmt_value(v, unit))}</td></tr>")
    more = f"<tr><td colspan='{len(cols) + 1}'>… {len(results) - limit} more</td></tr>" if len(results) > limit else ""
    return f"<table><tr>{head}</tr>{''.join(body)}{more}</table>"


def _stat_text(v: float, defaults: dict) -> tuple[str, str]:
    """(text, background colour) of a stat's value: its value mapping, else thresholds' colour."""
    for m in defaults.get("mappings") or []:
        if m.get("type") == "value":
            hit = m.get("options", {}).get(fmt_value(v, "short", 0) if v == int(v) else str(v))
            if hit:
                return hit.get("text", fmt_value(v)), _colour(hit.get("color", "green"))
    colour = "green"
    for s in (defaults.get("thresholds") or {}).get("steps", []):
        if s.get("value") is None or v >= s["value"]:
            colour = s.get("color", colour)
    return fmt_value(v, defaults.get("unit", "short"), defaults.get("decimals")), _colour(colour)


def _colour(name: str) -> str:
    return {"green": "#37872d", "red": "#c4162a", "orange": "#fa6400", "blue": "#1f60c4",
            "yellow": "#e0b400"}.get(name, name)


def render(dashboard: dict, prom: Prometheus, start: float, end: float, step: float,
           rate_interval: str = "1m", source: str = "contrib/grafana/sattr.json") -> tuple[str, list[Drawn]]:
    """The preview page and, per panel, what was drawn (series with data, errors)."""
    variables = grafana_variables(end - start, step, rate_interval)
    col_px = (WIDTH_PX - 23 * GAP_PX) / 24
    cells, drawn = [], []
    for p in dashboard.get("panels", []):
        kind, title, pos = p.get("type", "?"), p.get("title", ""), p.get("gridPos", {})
        if kind == "row":
            continue
        x, y, w, h = (int(pos.get(k, d)) for k, d in (("x", 0), ("y", 0), ("w", 12), ("h", 8)))
        pw, ph = int(col_px * w + GAP_PX * (w - 1)) - 16, int(ROW_PX * h + GAP_PX * (h - 1)) - 40
        defaults = (p.get("fieldConfig") or {}).get("defaults") or {}
        unit, decimals = defaults.get("unit", "short"), defaults.get("decimals")
        custom = defaults.get("custom") or {}
        d = Drawn(title, kind)
        body = ""
        try:
            if kind == "timeseries":
                series = []
                for t in p.get("targets", []):
                    for r in prom.query_range(substitute(t["expr"], variables), start, end, step):
                        vals = _floats(r["values"])
                        if vals:
                            series.append((legend(t.get("legendFormat"), r["metric"]), vals))
                d.series = len(series)
                if series:
                    body = draw_timeseries(series, start, end, step, pw, ph - 22, unit,
                                           custom.get("drawStyle") == "bars",
                                           (custom.get("stacking") or {}).get("mode") == "normal", decimals)
                    body += _legend_html([n for n, _ in series])
            else:
                results: list[dict] = []
                legends: list[str] = []
                for t in p.get("targets", []):
                    got = prom.query(substitute(t["expr"], variables), at=end)
                    results += got
                    legends += [legend(t.get("legendFormat"), r["metric"]) for r in got]
                d.series = len(results)
                if kind == "stat" and results:
                    items = []
                    for name, r in zip(legends, results):
                        text, bg = _stat_text(float(r["value"][1]), defaults)
                        sub = f"<small>{esc(name)}</small>" if len(results) > 1 or name != "value" else ""
                        items.append(f"<div class='stat' style='background:{bg}'>{sub}{esc(text)}</div>")
                    body = "<div class='stats'>" + "".join(items) + "</div>"
                elif kind == "barchart" and results:
                    xf = (p.get("options") or {}).get("xField", "")
                    rows = [(r["metric"].get(xf) or legend(None, r["metric"]), float(r["value"][1])) for r in results]
                    body = draw_bars(rows, pw, ph, unit, decimals)
                elif kind == "table" and results:
                    value_name = "Value"
                    for tr in p.get("transformations") or []:
                        value_name = ((tr.get("options") or {}).get("renameByName") or {}).get("Value", value_name)
                    body = draw_table(results, value_name, unit)
                elif results:
                    body = f"<div class='err'>panel type {esc(kind)} not drawn by the preview</div>"
        except Exception as e:  # noqa: BLE001 - one panel's failure is shown in its cell
            d.errors.append(f"{type(e).__name__}: {e}")
            body = f"<div class='err'>{esc(d.errors[-1])}</div>"
        if not body:
            body = "<div class='nodata'>No data</div>"
        drawn.append(d)
        cells.append(f"<section style='grid-column:{x + 1} / span {w};grid-row:{y + 1} / span {h}'>"
                     f"<h2 title='{esc(p.get('description', ''))}'>{esc(title)}</h2>{body}</section>")
    window = (f"{time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(start))} – "
              f"{time.strftime('%H:%M:%S', time.gmtime(end))} UTC, step {step:g} s")
    page = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>{esc(dashboard.get('title', 'dashboard'))} (preview)</title>
<style>
body {{ background:#111217; color:#ccccdc; font:12px/1.3 Inter, 'DejaVu Sans', Arial, sans-serif; margin:10px; width:{WIDTH_PX}px }}
header {{ margin-bottom:8px }} header h1 {{ font-size:17px; margin:0 0 2px 0; color:#fff }}
header p {{ margin:0; color:#9fa7b3 }}
main {{ display:grid; grid-template-columns:repeat(24, 1fr); grid-auto-rows:{ROW_PX}px; gap:{GAP_PX}px }}
section {{ background:#181b1f; border:1px solid #2c3235; border-radius:3px; padding:4px 8px; overflow:hidden }}
h2 {{ font-size:13px; margin:2px 0 6px 0; color:#fff; white-space:nowrap; overflow:hidden; text-overflow:ellipsis }}
svg text {{ fill:#9fa7b3; font-size:10px }}
.legend span {{ margin-right:10px; white-space:nowrap }} .legend i {{ display:inline-block; width:12px; height:3px; margin-right:4px; vertical-align:middle }}
.stats {{ display:flex; gap:4px; height:calc(100% - 26px) }}
.stat {{ flex:1; display:flex; flex-direction:column; align-items:center; justify-content:center; font-size:26px; color:#fff; border-radius:2px }}
.stat small {{ font-size:11px }}
table {{ border-collapse:collapse; width:100% }} th, td {{ text-align:left; padding:2px 6px; border-bottom:1px solid #2c3235 }}
td.num {{ text-align:right }} th {{ color:#6e9fff }}
.nodata {{ color:#6c737a; text-align:center; padding-top:30px }} .err {{ color:#ff7383 }}
</style></head><body>
<header><h1>{esc(dashboard.get('title', ''))}: preview</h1>
<p>{esc(HEADER.replace('contrib/grafana/sattr.json', source))}. Prometheus {esc(prom.url)}; {esc(window)};
$cluster = All, $__rate_interval = {esc(rate_interval)}, $__range = the window.</p></header>
<main>{''.join(cells)}</main></body></html>
"""
    return page, drawn


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prometheus", required=True, help="base URL, e.g. http://127.0.0.1:19090")
    ap.add_argument("--dashboard", default=str(Path(__file__).resolve().parents[2] / "contrib" / "grafana" / "sattr.json"))
    ap.add_argument("--minutes", type=float, default=30, help="the window: the last N minutes")
    ap.add_argument("--step", type=float, default=0, help="seconds between points (default: window / 240)")
    ap.add_argument("--rate-interval", default="1m")
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    end = time.time()
    start = end - a.minutes * 60
    step = a.step or max((end - start) / 240, 1)
    page, drawn = render(json.loads(Path(a.dashboard).read_text()), Prometheus(a.prometheus), start, end, step,
                         a.rate_interval)
    Path(a.out).write_text(page)
    for d in drawn:
        print(f"{d.kind:10} {d.series:3} series  {d.title}" + (f"  ERROR {d.errors}" if d.errors else ""))
    return 1 if any(d.errors for d in drawn) else 0


if __name__ == "__main__":
    raise SystemExit(main())
