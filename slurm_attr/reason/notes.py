"""What a verdict's summary says beside its cause: untrusted claims the kernel log contradicted,
and the nodes' own health when it is not the job's cause (issue 12 item 7: a fatal fault on a node
is still reported, and drained by the policy, even when the job ended for another reason)."""
from __future__ import annotations

from typing import Callable, Optional, Sequence

from ..model import Symptom
from . import policy
from .contradiction import is_contradicted

_DRAINING = ("drain", "reset", "reboot")


def beside_cause(cause: str, primary: Sequence[Symptom], syms: Sequence[Symptom],
                 node_of: Callable[[Symptom], Optional[str]]) -> str:
    """``"; ..."`` clauses to append to the summary (at most three), or ""."""
    out: list[str] = []
    claimed: dict[tuple[str, Optional[str]], None] = {}
    for s in syms:
        if is_contradicted(s):
            claimed.setdefault((s.cause, node_of(s)))
    for c, where in list(claimed)[:2]:
        out.append(f"the job's output claimed {c.replace('_', ' ')}{' on ' + where if where else ''}, "
                   "not confirmed by the kernel log")
    if cause in ("comm_hang", "unknown"):
        # the hang is not localised by a cause, but the failing connections may all share one node
        for s in syms:
            if s.id == "net.peer_vote" and s.node:
                out.append(f"the failing connections all involve {s.node}")
                break
    hardware = policy.load().group("hardware")
    if cause not in hardware:
        chosen = {id(p) for p in primary}
        seen: set[str] = set()
        for s in syms:
            if (s.trusted and s.cause in hardware and s.action in _DRAINING and s.node and id(s) not in chosen
                    and not s.status.earlier and s.node not in seen):
                seen.add(s.node)
                out.append(f"separately, {s.node}'s kernel log shows {s.summary or s.id}: the node needs attention")
    return "".join(f"; {n}" for n in out[:3])
