"""Expand Slurm hostlist expressions (``n[1-3,7],gpu-a[01-02]``) without calling scontrol."""
from __future__ import annotations

import re

_MAX_HOSTS = 100_000  # a hostile or mistaken expression must not allocate forever


def _split_top(expr: str) -> list[str]:
    parts, depth, cur = [], 0, []
    for ch in expr:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if cur:
        parts.append("".join(cur))
    return [p.strip() for p in parts if p.strip()]


def _expand_one(item: str) -> list[str]:
    m = re.match(r"^([^\[]*)\[([^\]]+)\](.*)$", item)
    if not m:
        return [item]
    prefix, ranges, rest = m.groups()
    out: list[str] = []
    for r in ranges.split(","):
        if "-" in r:
            lo, hi = r.split("-", 1)
            width = len(lo)
            a, b = int(lo), int(hi)
            if b - a > _MAX_HOSTS:
                raise ValueError(f"hostlist range too large: {r}")
            nums = [str(i).zfill(width) for i in range(a, b + 1)]
        else:
            nums = [r]
        for n in nums:
            for tail in _expand_one(rest):
                out.append(f"{prefix}{n}{tail}")
                if len(out) > _MAX_HOSTS:
                    raise ValueError("hostlist too large")
    return out


def expand(expr: str) -> list[str]:
    """``n[1-2],m3`` -> ``['n1', 'n2', 'm3']``; '' or '(null)' -> []."""
    if not expr or expr in ("(null)", "None assigned"):
        return []
    out: list[str] = []
    for item in _split_top(expr):
        out.extend(_expand_one(item))
    return out
