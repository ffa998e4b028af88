"""Synthetic probe records, byte-compatible with the plugin's: for tests of the reader's
defences (files no plugin would write) and for the 4096-rank benchmark, where running
4096 processes is not practical. Real records come from spank/tests/probe_harness.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

from . import layout as L


@dataclass
class SlotSpec:
    comm_hash: int
    rank: int
    nranks: int
    name: str = ""
    state: int = L.SLOT_ACTIVE
    launched: dict[int, int] = field(default_factory=dict)  # func -> count (func_seq)
    ops: list[tuple[int, ...]] = field(default_factory=list)  # opi, func, count, dtype, root, seq[, algo]
    op_count: int = 0
    digest: int = 0
    kernel: tuple[int, int] | None = None  # (func, seq) in flight
    kernel_done: tuple[int, int] | None = None
    inflight: int = 0
    in_state: tuple[int, ...] = (0,) * L.NWAIT
    peers: list[dict] = field(default_factory=list)  # Peer field names, wait as a tuple
    api: tuple[int, int, int, int] = (0, 0, 0, 0)  # group enter/exit, coll enter/exit
    last_ns: int = 0  # monotonic stamp of the last task / step / kernel event
    pop_started: int = 0
    ce_tasks: int = 0  # of op_count, run by the copy engines (v6)
    algo: int = 2  # of the ring's ops that name none: RING (L.AL_CE: the copy engines ran it)


def _kch(op: tuple[int, int] | None) -> int:
    return 0 if op is None else (op[0] << 56) | ((op[1] & ((1 << L.KCH_SEQ_BITS) - 1)) + 1)


def slot_bytes(sp: SlotSpec) -> bytes:
    buf = bytearray(L.SLOT_SIZE)
    v = dict.fromkeys(L.SLOT_NAMES, 0)
    v.update(comm_hash=sp.comm_hash, state=sp.state, api_ver=5, rank=sp.rank, nranks=sp.nranks,
             nnodes=1, comm_name=sp.name.encode()[:15], op_count=sp.op_count, op_digest=sp.digest,
             kch_inflight=sp.inflight, kch_cur=_kch(sp.kernel), kch_done=_kch(sp.kernel_done),
             kch_started=1 if sp.kernel else 0, last_task_ns=sp.last_ns, kch_last_ns=sp.last_ns,
             last_progress_ns=sp.last_ns, pop_started=sp.pop_started,
             group_api_enter=sp.api[0], group_api_exit=sp.api[1], coll_api_enter=sp.api[2],
             coll_api_exit=sp.api[3], init_ns=1, win_ms=1000, ce_tasks=sp.ce_tasks)
    for f, n in sp.launched.items():
        v[f"func_seq{f}"] = n
    for i, n in enumerate(sp.in_state):
        v[f"in_state{i}"] = n
    L.SLOT_FIXED.pack_into(buf, 0, *(v[n] for n in L.SLOT_NAMES))
    for opi, func, count, dtype, root, seq, *algo in sp.ops:
        L.OP_ENT.pack_into(buf, L.OPS_OFF + (opi % L.OPRING) * 32, (opi + 1) & 0xFFFFFFFF, func, dtype,
                           algo[0] if algo else sp.algo, 3, root, 2, 16, 0, count, seq)
    _peer_pack(buf, L.PEERS_OFF, sp.peers)
    return bytes(buf)


@dataclass
class LaneSpec:
    """A pool lane (layout version 2): another writer thread's share of slot ``slot``."""
    slot: int  # slot index (bind's low word is slot + 1; 0 writes an unbound lane)
    values: dict[str, int] = field(default_factory=dict)  # lane core fields by name (in_state0..5)
    peers: list[dict] = field(default_factory=list)
    token: int = 7


def _peer_pack(buf: bytearray, off: int, peers: list[dict]) -> None:
    for i, p in enumerate(peers[: L.NPEERS]):
        wait = tuple(p.get("wait", (0,) * L.NWAIT))
        L.PEER_ENT.pack_into(buf, off + i * 48, p["peer"] + 1, p.get("last_ch", 0), p.get("kind", 0),
                             p.get("send_posted", 0), p.get("send_done", 0), p.get("recv_posted", 0),
                             p.get("recv_done", 0), *wait, p.get("last_send_ms", 0),
                             p.get("last_recv_ms", 0), p.get("p2p_ops", 0))


def lane_bytes(ln: LaneSpec) -> bytes:
    buf = bytearray(L.LANE_SIZE)
    v = dict.fromkeys(L.LANE_NAMES, 0)
    v.update(ln.values)
    v["bind"] = (ln.token << 32 | (ln.slot + 1)) if ln.slot >= 0 else 0
    v["claims"] = 1
    L.LANE.pack_into(buf, 0, *(v[n] for n in L.LANE_NAMES))
    _peer_pack(buf, L.LANE_PEERS_OFF, ln.peers)
    return bytes(buf)


def record_bytes(rank: int, slots: list[SlotSpec], pid: int = 1000, node: str = "", job_id: int = 1,
                 rt_ns: int = 1_700_000_000_000_000_000, mono_ns: int = 1, full: bool = True,
                 lanes: list[LaneSpec] | None = None, version: int = L.LAYOUT_VER,
                 step_id: int = 0) -> bytes:
    """A whole record; with ``full`` padded to the plugin's fixed size. ``version`` 1
    writes the layout before lanes (for the reader's backward compatibility)."""
    lanes = lanes or []
    if version == 1 and lanes:
        raise ValueError("layout version 1 has no lanes")
    file_size = L.VERSION_SIZES[version][3]
    v = dict.fromkeys(L.HEADER_NAMES, 0)
    v.update(magic=L.MAGIC, layout_ver=version, hdr_size=L.HDR_SIZE, slot_size=L.SLOT_SIZE,
             nslots=L.NSLOTS, file_size=file_size, pid=pid, global_rank=rank, local_rank=0,
             world_size=0, job_id=job_id, step_id=step_id, create_rt_ns=rt_ns, create_mono_ns=mono_ns,
             heartbeat_ns=mono_ns, api_ver=5, hostname=node.encode()[:63], node_name=node.encode()[:31],
             nslots_used=len(slots), slurm_procid=rank, win_ms=1000, clock_id=6, lanes_used=len(lanes))
    head = bytearray(L.HDR_SIZE)
    L.HEADER.pack_into(head, 0, *(v[n] for n in L.HEADER_NAMES))
    data = bytes(head) + b"".join(slot_bytes(s) for s in slots)
    if lanes:
        data += bytes(L.LANES_OFF - len(data)) + b"".join(lane_bytes(ln) for ln in lanes)
    return data + bytes(file_size - len(data)) if full else data


def write_bundle(root: str, records: dict[tuple[str, int], bytes], job: dict | None = None) -> None:
    """Lay records out as a bundle: {(node, rank): bytes} -> nodes/<node>/probe/rank<r>.probe.

    Files are written sparse (header and used slots, then truncated to the full size):
    the reader never reads past the used slots, and 4096 x 108 KiB need not hit the disk.
    """
    os.makedirs(root, exist_ok=True)
    for (node, rank), data in records.items():
        d = os.path.join(root, "nodes", node, "probe")
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, f"rank{rank}.pid{1000 + rank}.probe"), "wb") as f:
            f.write(data.rstrip(b"\0"))
            f.truncate(len(data))
    with open(os.path.join(root, "job.json"), "w") as f:
        json.dump(job or {"job_id": "1"}, f)
