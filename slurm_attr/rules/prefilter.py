"""Choosing the literal triggers that decide which lines the rules look at.

Every rule lists keywords; every line a rule can match contains one. A trigger is
a fragment searched in the lower-cased buffer with ``bytes.find`` (C speed); each
costs one pass over the buffer, and every line it hits costs a keyword check. A
few broad triggers ("error", "nccl") mean few passes but many hits; exact keywords
mean many passes and few hits. Which is cheaper depends on the log, so each
source keeps three plans and a buffer gets the one a small sample says is cheapest.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Sequence

PASS_NS_PER_BYTE = 0.4  # one bytes.find pass (measured 0.3-0.6)
HIT_NS = 3000.0  # looking at one line a trigger hit ...
KEYWORD_NS = 200.0  # ... plus one `in` check per keyword behind that trigger
SAMPLE_SLICES = 8
SAMPLE_SLICE = 8 << 10
SMALL = 256 << 10  # below this, sampling costs more than a wrong choice

# Never a trigger: English glue, and words that hit a large share of lines of most logs.
_STOP = {"with", "task", "node", "file", "from", "this", "that", "have", "been", "detected", "operation", "socket",
         "dump", "remote", "unable", "unable to", "due to", "call to", "handle", "illegal", "alloc", "the", "for"}
_GENERIC = ("error", "errors", "failed", "failure", "timeout", "timed", "device", "memory", "system", "interface",
            "internal", "event", "signal", "version", "connect", "connection", "invalid", "core", "exception",
            "terminated", "aborted", "exited", "process", "watchdog", "link", "work", "kernel", "driver", "limit")
_WORD = re.compile(r"[a-z0-9_]+|[^a-z0-9_\s]")


def _generic(frag: str) -> bool:
    core = "".join(c for c in frag if c.isalnum())
    return len(core) < 3 or any(core in g for g in _GENERIC)


def _fragments(kw: str) -> set[str]:
    """Runs of whole words of a keyword, and prefixes inside long identifiers (cudaErrorX)."""
    spans = [m.span() for m in _WORD.finditer(kw)]
    frags = {kw[a:b] for i, (a, _) in enumerate(spans) for _, b in spans[i:]}
    frags |= {kw[a:a + n] for a, b in spans if b - a > 8 for n in range(6, b - a)}
    return {f for f in frags if len(f) >= 4 and f.strip() not in _STOP}


def cover(keywords: Sequence[str], broad: bool) -> list[str]:
    """Fragments such that every keyword contains one, fewest first (greedy set cover).

    ``broad`` allows generic words ("error", "failed") as triggers; otherwise they are
    only used inside longer fragments.
    """
    pool: dict[str, set[str]] = {}
    for kw in keywords:
        for frag in _fragments(kw):
            if broad or not _generic(frag):
                pool.setdefault(frag, set()).add(kw)
        pool.setdefault(kw, set()).add(kw)
    left = set(keywords)
    chosen: list[str] = []
    while left:
        frag = max(pool, key=lambda f: (len(pool[f] & left), len(f), f))
        chosen.append(frag)
        left -= pool[frag]
    return sorted(chosen)


def exact(keywords: Sequence[str]) -> list[str]:
    """The keywords themselves, less those that contain a shorter one."""
    out: list[str] = []
    for kw in sorted(keywords, key=len):
        if not any(t in kw for t in out):
            out.append(kw)
    return sorted(out)


@dataclass
class Plan:
    """Triggers, and for each the keywords (lower-case bytes) it stands for with their rule positions."""

    name: str
    triggers: list[bytes]
    by_trigger: list[list[tuple[bytes, list[int]]]]


class Prefilter:
    """The plans of one source and the choice between them."""

    def __init__(self, by_kw: dict[str, list[int]]):
        kws = sorted(by_kw)
        self.plans: list[Plan] = []
        seen: set[tuple[str, ...]] = set()
        for name, triggers in (("narrow", cover(kws, broad=False)), ("broad", cover(kws, broad=True)),
                               ("exact", exact(kws))):
            if tuple(triggers) in seen:
                continue
            seen.add(tuple(triggers))
            by_trigger = [[(kw.encode("ascii"), by_kw[kw]) for kw in kws if t in kw] for t in triggers]
            self.plans.append(Plan(name, [t.encode("ascii") for t in triggers], by_trigger))

    def plan_for(self, lower: bytes) -> Plan:
        """The plan a sample of the buffer says is cheapest (the first one for small buffers)."""
        if len(lower) < SMALL or len(self.plans) == 1:
            return self.plans[0]
        step = len(lower) // SAMPLE_SLICES
        sample = b"".join(lower[i * step:i * step + SAMPLE_SLICE] for i in range(SAMPLE_SLICES))
        scale = len(lower) / max(len(sample), 1)

        def cost(plan: Plan) -> float:
            hits = sum(sample.count(t) * (HIT_NS + KEYWORD_NS * len(kws)) for t, kws in zip(plan.triggers, plan.by_trigger))
            return len(plan.triggers) * len(lower) * PASS_NS_PER_BYTE + hits * scale

        return min(self.plans, key=cost)
