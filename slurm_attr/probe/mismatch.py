"""probe.inconsistent: ranks that disagree on the collective at the same position.

Every rank numbers the collectives of a communicator in launch order (opi); NCCL needs
every rank to issue the same function, count, datatype and root at each position. The
per-communicator ring keeps the last 16 of them, so positions present on several ranks
are compared directly; the running digest over all of them catches a divergence older
than the ring among ranks that launched equally many. The majority is the reference;
on a tie the side holding the lowest comm rank is, and the finding says so.
"""
from __future__ import annotations

from collections import Counter, defaultdict

from ..bundle import Bundle
from ..model import Symptom
from . import layout as L
from .comms import Comm, make_symptom, who

ID = "probe.inconsistent"
CAUSE = "collective_mismatch"
PRIORITY = 60

Key = tuple  # (func, count, dtype, root)


def _describe(key: Key) -> str:
    func, count, dtype, root = key
    r = f", root {root}" if root >= 0 else ""
    return f"{L.func_name(func)}(count {count}, {L.dtype_name(dtype)}{r})"


def _histories(comm: Comm) -> dict[tuple[int, int], list[int]]:
    """Comm ranks grouped by (collectives launched, history digest)."""
    groups: dict[tuple[int, int], list[int]] = defaultdict(list)
    for cr, m in comm.members.items():
        groups[(m.op_count, m.op_digest)].append(cr)
    return groups


def _by_position(comm: Comm, groups: dict[tuple[int, int], list[int]]) -> tuple[int, dict[int, Key], Key, bool] | None:
    """The first position where ranks disagree: (opi, comm rank -> key, reference, tie).

    Ranks with the same collective count and history digest hold the same keys at every
    position, so each such group's ring is decoded once and counted by its size: the
    world communicator of a 4096-rank job is a handful of groups, not 65,536 entries.
    """
    table: dict[int, dict[Key, list[list[int]]]] = defaultdict(lambda: defaultdict(list))
    for crs in groups.values():
        for e in comm.members[crs[0]].ops:
            table[e.opi][(e.func, e.count, e.dtype, e.root)].append(crs)
    for opi in sorted(table):
        by_key = table[opi]
        if len(by_key) < 2:
            continue
        weight = Counter({k: sum(len(crs) for crs in g) for k, g in by_key.items()}).most_common()
        tie = weight[0][1] == weight[1][1]
        keys = {cr: k for k, g in by_key.items() for crs in g for cr in crs}
        ref = keys[min(keys)] if tie else weight[0][0]
        return opi, keys, ref, tie
    return None


def _by_digest(comm: Comm) -> tuple[int, list[int], int, bool] | None:
    """Ranks with as many collectives as most others but another history digest."""
    by_count: dict[int, list[int]] = defaultdict(list)
    for cr, m in comm.members.items():
        by_count[m.op_count].append(cr)
    n, crs = max(by_count.items(), key=lambda kv: (len(kv[1]), kv[0]))
    if len(crs) < 2 or n == 0:
        return None
    digests = Counter(comm.members[cr].op_digest for cr in crs).most_common()
    if len(digests) == 1:
        return None
    tie = digests[0][1] == digests[1][1]
    ref = comm.members[min(crs)].op_digest if tie else digests[0][0]
    return n, [cr for cr in crs if comm.members[cr].op_digest != ref], len(crs), tie


def find(bundle: Bundle, comm: Comm) -> list[Symptom]:
    if len(comm.members) < 2:
        return []
    groups = _histories(comm)
    if len(groups) < 2:
        return []  # everyone launched the same collectives (the common case: one dict pass)
    out: list[Symptom] = []
    hit = _by_position(comm, groups)
    if hit is not None:
        opi, keys, ref, tie = hit
        agree = sorted(cr for cr, k in keys.items() if k == ref)
        for cr in sorted(cr for cr, k in keys.items() if k != ref):
            m = comm.members[cr]
            summary = (f"{who(m, cr)} issued {_describe(keys[cr])} as collective #{opi} of communicator "
                       f"{comm.label}, where {len(agree)} rank(s) issued {_describe(ref)}")
            fields = {
                "comm_hash": f"{comm.hash:016x}", "comm_rank": cr, "position": opi,
                "issued": _describe(keys[cr]), "expected": _describe(ref),
                "agreeing_ranks": [comm.global_of(a) if comm.global_of(a) is not None else a for a in agree][:32],
                "ambiguous": tie,
            }
            witness = comm.members[agree[0]]
            out.append(make_symptom(bundle, ID, CAUSE, PRIORITY, m, cr, summary, fields, [m, witness]))
        return out
    dig = _by_digest(comm)
    if dig is not None:
        n, odd, size, tie = dig
        for cr in odd:
            m = comm.members[cr]
            summary = (f"{who(m, cr)} launched the same number of collectives ({n}) on communicator "
                       f"{comm.label} as {size - len(odd)} other rank(s), but a different sequence of "
                       f"functions/counts: it diverged before the last {L.OPRING}")
            fields = {"comm_hash": f"{comm.hash:016x}", "comm_rank": cr, "position": None,
                      "collectives": n, "ambiguous": tie}
            out.append(make_symptom(bundle, ID, CAUSE, PRIORITY - 5, m, cr, summary, fields, [m]))
    return out
