"""probe.non_entry: ranks that never launched the collective the others are stuck in.

Per communicator and collective function, func_seq is how many of them each rank launched
(NCCL's per-function seqNumber + 1). The lowest value m names the first one some ranks
never launched (seq m). It is only a hang when ranks that did launch it sit in it: their
kernel is still in flight on (func, m), or, for a collective the copy engines run (no
kernel, no completion event), it is the last thing they launched. Hosts run ahead of GPUs, so counts alone would
accuse whoever was slowest at the moment of the kill; the kernel evidence (and, when the
job's end time is known, a stall of at least MIN_STALL_S) is what makes it a finding.
"""
from __future__ import annotations

from ..bundle import Bundle
from ..model import Symptom
from . import layout as L
from .comms import MIN_STALL_S, Comm, Member, func_op, make_symptom, stalled_s, who

ID = "probe.non_entry"
CAUSE = "rank_stuck"
PRIORITY = 55
_SEQ_MASK = (1 << L.KCH_SEQ_BITS) - 1
_P2P_FUNCS = (L.F_SEND, L.F_RECV, L.F_SENDRECV)


def _in_api(s: Member) -> bool | None:
    """Inside an NCCL call (v5 API events), False when outside, None when unknown."""
    if s.group_api_enter == 0 and s.coll_api_enter == 0 and s.p2p_api_enter == 0:
        return None
    return (s.group_api_enter > s.group_api_exit or s.coll_api_enter > s.coll_api_exit
            or s.p2p_api_enter > s.p2p_api_exit)


def _waiting(comm: Comm, launched: dict[int, int], func: int, seq: int) -> list[int]:
    """Comm ranks that launched (func, seq) and still have it on the GPU."""
    want = (func << 56) | ((seq & _SEQ_MASK) + 1)
    out = [cr for cr, m in comm.members.items()
           if launched[cr] > seq and m.kch_inflight and m.kch_cur == want]
    if out:
        return out
    # A collective the copy engines run (NCCL 2.29+) has no kernel channels and NCCL reports
    # no completion for it: a rank whose newest launch is that very collective sits in it.
    out = [cr for cr, m in comm.members.items()
           if launched[cr] > seq and m.ce_tasks and _newest_is(m, func, seq, L.AL_CE)]
    if out:
        return out
    # Without kernel events (mask override, old NCCL) steps waiting on the network will do.
    return [cr for cr, m in comm.members.items()
            if launched[cr] > seq and m.kch_started == 0 and any(m.in_state)]


def _newest_is(m: Member, func: int, seq: int, algo: int) -> bool:
    ops = m.ops
    return bool(ops) and ops[-1].opi == m.op_count - 1 and (ops[-1].func, ops[-1].seq, ops[-1].algo) == (func, seq, algo)


def find(bundle: Bundle, comm: Comm, end_ns: int | None) -> list[Symptom]:
    members = comm.members
    if len(members) < 2:
        return []
    # Ranks that launched the same numbers of everything: one entry each, counted.
    shapes: dict[tuple[int, ...], list[int]] = {}
    for cr, m in members.items():
        shapes.setdefault(m.func_seq, []).append(cr)
    if len(shapes) < 2:
        return []
    out: list[Symptom] = []
    for func in range(L.NFUNC):
        if func in _P2P_FUNCS:
            continue
        counts = {shape[func] for shape in shapes}
        if len(counts) < 2:
            continue
        lo = min(counts)
        laggards = sorted(cr for shape, crs in shapes.items() if shape[func] == lo for cr in crs)
        if 2 * len(laggards) >= len(members):
            continue  # not a minority: no telling who is behind whom
        launched = {cr: shape[func] for shape, crs in shapes.items() for cr in crs}
        waiting = _waiting(comm, launched, func, lo)
        if not waiting:
            continue
        last = comm.last_activity_ns(waiting)
        age = stalled_s(end_ns, last)
        if age is not None and age < MIN_STALL_S:
            continue
        out.extend(_symptoms(bundle, comm, func, lo, laggards, waiting, age, last))
    return out


def _symptoms(bundle: Bundle, comm: Comm, func: int, lo: int, laggards: list[int], waiting: list[int],
              age: float | None, last: int | None) -> list[Symptom]:
    op = func_op(func, lo)
    wait_g = [comm.global_of(cr) if comm.global_of(cr) is not None else cr for cr in sorted(waiting)[:32]]
    witness = comm.members[sorted(waiting)[0]]
    out = []
    for cr in laggards:
        m = comm.members[cr]
        in_api = _in_api(m)
        where = {True: "; it is inside an NCCL call (e.g. connection setup)",
                 False: "; it is not inside NCCL: stuck on the CPU side",
                 None: ""}[in_api]
        prev = f" (its last was #{lo - 1})" if lo > 0 else " (it launched none)"
        summary = (f"{who(m, cr)} never launched {op}{prev} on communicator {comm.label}, "
                   f"where {len(waiting)} of {comm.nranks} ranks wait in it{where}")
        fields = {
            "comm_hash": f"{comm.hash:016x}", "comm_rank": cr, "nranks": comm.nranks,
            "func": L.func_name(func), "seq": lo, "waiting_ranks": wait_g,
            "in_api": in_api, "stalled_s": age,
        }
        out.append(make_symptom(bundle, ID, CAUSE, PRIORITY, m, cr, summary, fields, [m, witness], last))
    return out
