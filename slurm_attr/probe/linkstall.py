"""probe.link_stall: a network send toward one peer that never completed.

NCCL's proxy posts a send to the network (state SendWait) only once the receiver has
posted its buffer, so a send that stays there is waiting on the local NIC, the link or
the remote NIC, not on the peer's software (research/nccl-probe.md 3). A few such sends
in a communicator, each toward one peer, that have been there for a while (the job's end
time tells) name the links; the receiver waiting for data from that sender confirms it.
Many at once is no single link (or a snapshot of a busy job) and is left alone.
"""
from __future__ import annotations

from ..bundle import Bundle
from ..model import Symptom
from . import layout as L
from .comms import MIN_STALL_S, Comm, grank, make_symptom, node_of, stalled_s, who
from .record import Peer

ID = "probe.link_stall"
CAUSE = "network"
PRIORITY = 60


def _net_sends(comm: Comm) -> list[tuple[int, Peer]]:
    out = []
    for cr, m in comm.members.items():
        if m.pop_started == 0:
            continue  # no network traffic at all: skip decoding its peer table
        out.extend((cr, p) for p in m.peers if p.kind & L.PK_NET_SEND)
    return out


def find(bundle: Bundle, comm: Comm, end_ns: int | None) -> list[Symptom]:
    if not any(m.in_state[L.W_SEND_NET] for m in comm.members.values()):
        return []
    pairs = _net_sends(comm)
    stuck = [(cr, p) for cr, p in pairs if p.wait[L.W_SEND_NET] > 0]
    if not stuck or len(stuck) > max(2, len(pairs) // 4):
        return []
    out: list[Symptom] = []
    for cr, p in stuck:
        src = comm.members[cr]
        frozen = src.rec.rt_ms(p.last_send_ms) or src.rec.rt_ns(src.init_ns)
        age = stalled_s(end_ns, frozen)
        if age is not None and age < MIN_STALL_S:
            continue
        dst = comm.members.get(p.peer)
        back = [q for q in dst.peers if q.peer == cr] if dst is not None else []
        receiver_waiting = bool(back) and back[0].wait[L.W_RECV_NET] > 0
        later = sum(1 for c2, p2 in pairs
                    if (c2, p2.peer) != (cr, p.peer) and frozen is not None
                    and (comm.members[c2].rec.rt_ms(p2.last_send_ms) or 0) > frozen)
        src_g, dst_g = grank(src), grank(dst) if dst is not None else None
        src_node, dst_node = node_of(bundle, src, src_g), node_of(bundle, dst, dst_g)
        dst_name = who(dst, p.peer) + (f" ({dst_node})" if dst_node else "")
        summary = (f"{who(src, cr)} ({src_node}) -> {dst_name}: {p.wait[L.W_SEND_NET]} network send(s) "
                   f"on channel {p.last_ch} of communicator {comm.label} never completed"
                   + (f"; {dst_name.split(' (')[0]} is still waiting for that data" if receiver_waiting else "")
                   + (f"; {later} other link(s) kept moving after it froze" if later else ""))
        fields = {
            "src_rank": src_g, "dst_rank": dst_g, "src_node": src_node, "dst_node": dst_node,
            "comm_hash": f"{comm.hash:016x}", "src_comm_rank": cr, "dst_comm_rank": p.peer,
            "channel": p.last_ch, "steps_stuck": p.wait[L.W_SEND_NET],
            "sends_completed": p.send_done, "receiver_waiting": receiver_waiting,
            "links_progressed_after": later, "stalled_s": age,
        }
        evidence = [src] + ([dst] if dst is not None else [])
        out.append(make_symptom(bundle, ID, CAUSE, PRIORITY, src, cr, summary, fields, evidence, frozen))
    return out
