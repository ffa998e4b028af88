"""The figures as text (a terminal), Markdown (the README) and JSON (machines)."""
from __future__ import annotations

import json
from typing import Any

# Short column names for the confusion matrix (DESIGN §4 cause words).
ABBR = {"gpu_hardware": "gpu", "nvlink": "nvl", "host_hardware": "host", "network": "net", "comm_hang": "hang",
        "collective_mismatch": "mism", "rank_stuck": "stuck", "cuda_oom": "coom", "host_oom": "hoom", "user_error": "user",
        "time_limit": "time", "cancelled": "canc", "preempted": "pree", "node_failure": "node", "filesystem": "fs",
        "launch_failure": "lnch", "none": "none", "unknown": "unk", "error": "ERR"}
ORDER = list(ABBR)


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _cols(fig: dict[str, Any]) -> list[str]:
    seen = set(fig["matrix"]) | {g for row in fig["matrix"].values() for g in row}
    return [c for c in ORDER if c in seen] + sorted(seen - set(ORDER))


def headline(fig: dict[str, Any]) -> list[str]:
    c, d = fig["culprit"], fig["drains"]
    out = [f"cause accuracy {_pct(fig['accuracy'])} ({fig['correct']}/{fig['cases']}), macro accuracy {_pct(fig['macro_accuracy'])}",
            f"culprit node top-1 {_pct(c['top1_node']['accuracy'])} ({c['top1_node']['hits']}/{c['top1_node']['cases']}; "
            f"any {_pct(c['top1_node']['any'])}, exact set {_pct(c['top1_node']['exact'])}), "
            f"rank top-1 {_pct(c['top1_rank']['accuracy'])} ({c['top1_rank']['hits']}/{c['top1_rank']['cases']}; "
            f"any {_pct(c['top1_rank']['any'])}, exact set {_pct(c['top1_rank']['exact'])})",
            f"drains expected {d['expected']}: false {len(d['false'])}, missed {len(d['missed'])}"
            + (f"; analysis errors {len(fig['errors'])}" if fig["errors"] else "")]
    if fig["analyser_failures"]["cases"]:
        out.append(f"WARNING: an analyser crashed on {fig['analyser_failures']['cases']} cases (figures are not the engine's): "
                   f"{str(fig['analyser_failures']['first'])[:200]}")
    return out


def text(figs: list[dict[str, Any]], meta: dict[str, Any], show: int = 25) -> str:
    out = [f"slurm-attr accuracy benchmark: {meta['summary']}", ""]
    for fig in figs:
        out += [f"== {fig['section']} ==", *headline(fig), "", "confusion matrix (rows: expected, columns: got)"]
        cols = _cols(fig)
        out.append(f"{'':>20} " + " ".join(f"{ABBR.get(c, c)[:5]:>5}" for c in cols))
        for exp in [c for c in cols if c in fig["matrix"]]:
            row = fig["matrix"][exp]
            out.append(f"{exp:>20} " + " ".join(f"{row.get(c, 0) or '.':>5}" for c in cols))
        out += ["", "per cause (the verdict's cause word)", f"{'cause':>20} {'n':>5} {'prec':>7} {'recall':>7}"]
        out += [f"{c:>20} {v['n']:>5} {_pct(v['precision']):>7} {_pct(v['recall']):>7}" for c, v in fig["per_cause"].items()]
        out += ["", "per class (generator or group): cases, right cause, culprit node/rank top-1, drains missed/false",
                f"{'class':>32} {'n':>4} {'ok':>4} {'node':>7} {'rank':>7} {'drain-/+':>8}  wrong answers"]
        for k, v in fig["per_class"].items():
            wrong = ", ".join(f"{g} x{n}" for g, n in v["wrong"].items())
            node, rank = (f"{a}/{b}" if b else "-" for a, b in (v["node_top1"], v["rank_top1"]))
            drains = f"{v['missed_drains']}/{v['false_drains']}" if v["missed_drains"] or v["false_drains"] else ""
            out.append(f"{k:>32} {v['n']:>4} {v['correct']:>4} {node:>7} {rank:>7} {drains:>8}  {wrong}")
        if fig["failures"]:
            out += ["", f"wrong causes ({len(fig['failures'])}, first {min(show, len(fig['failures']))}):"]
            out += [f"  {f['case']}: expected {f['expected']}, got {f['got']}: {f['summary'][:150]}" for f in fig["failures"][:show]]
        for kind in ("false", "missed"):
            rows = fig["drains"][kind]
            if rows:
                out += ["", f"{kind} drains ({len(rows)}, first {min(show, len(rows))}):"]
                out += [f"  {r['case']}: {r['node']} (verdict {r['cause']})" for r in rows[:show]]
        out.append("")
    return "\n".join(out)


def markdown(figs: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    out = [f"Accuracy benchmark ({meta['summary']}; `python bench/accuracy/run.py --markdown`):", "",
           "| section | cases | cause accuracy | macro accuracy | culprit node top-1 | culprit rank top-1 | false drains | missed drains |",
           "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for fig in figs:
        c = fig["culprit"]
        out.append(f"| {fig['section']} | {fig['cases']} | {_pct(fig['accuracy'])} | {_pct(fig['macro_accuracy'])} | "
                   f"{_pct(c['top1_node']['accuracy'])} | {_pct(c['top1_rank']['accuracy'])} | "
                   f"{len(fig['drains']['false'])} | {len(fig['drains']['missed'])} |")
    for fig in figs:
        if fig["analyser_failures"]["cases"]:
            out += ["", f"**Warning**: an analyser crashed on {fig['analyser_failures']['cases']} cases of {fig['section']}: "
                        f"`{str(fig['analyser_failures']['first'])[:160]}`"]
    for fig in figs[:1]:  # the held-out matrix is the one that matters
        cols = _cols(fig)
        out += ["", f"Confusion matrix, {fig['section']} (rows: expected cause, columns: the verdict's; "
                "abbreviations: " + ", ".join(f"{ABBR.get(c, c)} = `{c}`" for c in cols) + "):", "",
                "| expected \\ got | " + " | ".join(ABBR.get(c, c) for c in cols) + " | recall | precision |",
                "|---|" + "---:|" * (len(cols) + 2)]
        for exp in [c for c in cols if c in fig["matrix"]]:
            row, per = fig["matrix"][exp], fig["per_cause"][exp]
            cells = [(f"**{row.get(c, 0)}**" if c == exp else str(row.get(c, 0) or "")) for c in cols]
            out.append(f"| `{exp}` | " + " | ".join(cells) + f" | {_pct(per['recall'])} | {_pct(per['precision'])} |")
        weak = {k: v for k, v in fig["per_class"].items() if v["correct"] < v["n"] or _short(v["node_top1"]) or _short(v["rank_top1"])}
        if weak:
            out += ["", f"Generated classes below 100%, {fig['section']} (right cause, culprit node and rank top-1; the verdicts given instead):", "",
                    "| class | expected | cause | node top-1 | rank top-1 | instead |", "|---|---|---:|---:|---:|---|"]
            for k, v in weak.items():
                node, rank = (f"{a}/{b}" if b else "-" for a, b in (v["node_top1"], v["rank_top1"]))
                instead = ", ".join(f"{g} {n}" for g, n in v["wrong"].items())
                out.append(f"| `{k}` | {v['expected']} | {v['correct']}/{v['n']} | {node} | {rank} | {instead} |")
    return "\n".join(out) + "\n"


def _short(hits: list[int]) -> bool:
    return bool(hits[1]) and hits[0] < hits[1]


def dump_json(figs: list[dict[str, Any]], meta: dict[str, Any], path: str) -> None:
    with open(path, "w") as f:
        json.dump({"meta": meta, "sections": figs}, f, indent=1, sort_keys=False)
