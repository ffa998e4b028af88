"""The probe record's binary layout (version 2), mirrored from spank/probe/sattr_probe_layout.h.

Version 2 appends a pool of lanes after the slots (per-thread copies of a slot's
proxy-side group, merged by the reader); version 1 records (no pool) are still read.

Every field is named with its byte offset; the formats below are assembled from those
offsets with explicit padding, so a drift between C and Python shows up as a wrong offset
in ``tests/unit/test_probe_layout.py`` (which compares them with ``probe_harness layout``),
never as silently shifted numbers.
"""
from __future__ import annotations

import struct

MAGIC = b"SATTRPRB"
LAYOUT_VER = 2
HDR_SIZE = 4096
SLOT_SIZE = 2304
NSLOTS = 40
NLANES = 16
LANE_SIZE = 896
LANES_OFF = HDR_SIZE + NSLOTS * SLOT_SIZE
FILE_SIZE = LANES_OFF + NLANES * LANE_SIZE
V1_FILE_SIZE = LANES_OFF  # version 1: no lane pool
# (hdr_size, slot_size, nslots, file_size) each readable version must announce
VERSION_SIZES = {1: (HDR_SIZE, SLOT_SIZE, NSLOTS, V1_FILE_SIZE), 2: (HDR_SIZE, SLOT_SIZE, NSLOTS, FILE_SIZE)}
HRING = 60
OPRING = 16
NCHAN = 64
NPEERS = 12
NFUNC = 12
NWAIT = 6

# Codes the plugin writes (enums in sattr_probe_layout.h); index = code.
FUNCS = ("Broadcast", "Reduce", "AllGather", "ReduceScatter", "AllReduce", "SendRecv", "Send",
         "Recv", "AlltoAll", "Gather", "Scatter", "other")
F_SEND, F_RECV, F_SENDRECV = 6, 7, 5
DTYPES = ("unknown", "ncclInt8", "ncclUint8", "ncclInt32", "ncclUint32", "ncclInt64", "ncclUint64",
          "ncclFloat16", "ncclFloat32", "ncclFloat64", "ncclBfloat16", "ncclFloat8e4m3",
          "ncclFloat8e5m2")
ALGOS = ("unknown", "TREE", "RING", "COLLNET_DIRECT", "COLLNET_CHAIN", "NVLS", "NVLS_TREE", "PAT", "CE")
AL_CE = ALGOS.index("CE")  # our code for a collective the copy engines run (v6 CeColl)
PROTOS = ("unknown", "LL", "LL128", "SIMPLE")
# Wait states of proxy steps, in gauge order (research/nccl-probe.md 3).
WAITS = ("SendGPUWait", "SendPeerWait", "SendWait", "RecvWait", "RecvFlushWait", "RecvGPUWait")
W_SEND_GPU, W_SEND_PEER, W_SEND_NET, W_RECV_NET, W_RECV_FLUSH, W_RECV_GPU = range(NWAIT)

SLOT_ACTIVE, SLOT_FINALIZED = 1, 2
# peer kind bits
PK_NET_SEND, PK_NET_RECV, PK_P2P_SEND, PK_P2P_RECV = 1, 2, 4, 8
# header flags
HF_SLOTS_FULL, HF_STEPS_FULL, HF_PEERS_FULL, HF_REOPENED, HF_LANES_FULL = 1, 2, 4, 8, 16
# kch_cur / kch_done: (func << 56) | ((seq mod 2**36) + 1)
KCH_SEQ_BITS = 36


def _compile(fields: list[tuple[str, int, str]], size: int) -> tuple[struct.Struct, tuple[str, ...]]:
    """A little-endian Struct for (name, offset, format) fields, padding the gaps.

    A format with a count ("12Q") yields that many values, named name0..nameN.
    """
    fmt, names, pos = "<", [], 0
    for name, off, f in fields:
        if off < pos:
            raise ValueError(f"{name} at {off} overlaps the previous field")
        if off > pos:
            fmt += f"{off - pos}x"
        fmt += f
        pos = off + struct.calcsize("<" + f)
        n = len(struct.unpack("<" + f, bytes(struct.calcsize("<" + f))))
        names.extend([name] if n == 1 or f.endswith("s") else [f"{name}{i}" for i in range(n)])
    if pos > size:
        raise ValueError(f"fields end at {pos}, beyond {size}")
    if pos < size:
        fmt += f"{size - pos}x"
    return struct.Struct(fmt), tuple(names)


HEADER_FIELDS = [
    ("magic", 0, "8s"), ("layout_ver", 8, "I"), ("hdr_size", 12, "I"), ("slot_size", 16, "I"),
    ("nslots", 20, "I"), ("file_size", 24, "Q"), ("pid", 32, "I"), ("global_rank", 36, "i"),
    ("local_rank", 40, "i"), ("world_size", 44, "i"), ("job_id", 48, "Q"), ("step_id", 56, "I"),
    ("nccl_version", 60, "I"), ("create_rt_ns", 64, "Q"), ("create_mono_ns", 72, "Q"),
    ("heartbeat_ns", 80, "Q"), ("event_mask", 88, "I"), ("api_ver", 92, "I"),
    ("hostname", 96, "64s"), ("nslots_used", 160, "I"), ("flags", 164, "I"),
    ("ring_head", 168, "I"), ("pxn_foreign", 172, "I"), ("dropped_total", 176, "Q"),
    ("node_name", 184, "32s"), ("slurm_procid", 216, "i"), ("win_ms", 220, "I"),
    ("clock_id", 224, "I"), ("inits", 228, "I"), ("proc_nonce", 232, "Q"),
    ("lanes_used", 240, "I"), ("lanes_full", 244, "I"),  # version 2 (zero in version 1)
]
HEADER, HEADER_NAMES = _compile(HEADER_FIELDS, 256)
RING_OFF = 256

HRING_FIELDS = [
    ("tag", 0, "I"), ("slot", 4, "B"), ("func", 5, "B"), ("dtype", 6, "B"), ("kind", 7, "B"),
    ("root_or_peer", 8, "i"), ("nch", 12, "B"), ("algo", 13, "B"), ("proto", 14, "B"),
    ("flags", 15, "B"), ("comm_hash", 16, "Q"), ("seq", 24, "Q"), ("count", 32, "Q"),
    ("start_ns", 40, "Q"), ("opi", 48, "Q"),
]
HRING_ENT, HRING_NAMES = _compile(HRING_FIELDS, 64)

# The part of a slot the analysis reads every time (0..703); rings and tables follow.
SLOT_FIELDS = [
    ("comm_hash", 0, "Q"), ("state", 8, "I"), ("api_ver", 12, "I"), ("rank", 16, "i"),
    ("nranks", 20, "i"), ("nnodes", 24, "i"), ("lane_owner", 28, "I"), ("init_ns", 32, "Q"), ("fini_ns", 40, "Q"),
    ("comm_name", 48, "16s"), ("coll_api_enter", 64, "Q"), ("coll_api_exit", 72, "Q"),
    ("p2p_api_enter", 80, "Q"), ("p2p_api_exit", 88, "Q"), ("group_api_enter", 96, "Q"),
    ("group_api_exit", 104, "Q"), ("last_api_ns", 112, "Q"), ("graph_captured", 120, "I"),
    ("api_last_func", 124, "I"), ("api_func", 128, "12I"), ("api_last_count", 176, "Q"),
    ("func_seq", 192, "12Q"), ("coll_tasks", 288, "Q"), ("p2p_tasks", 296, "Q"),
    ("last_task_ns", 304, "Q"), ("op_count", 312, "Q"), ("last_seq", 320, "Q"),
    ("last_func", 328, "B"), ("last_dtype", 329, "B"), ("last_algo", 330, "B"),
    ("last_proto", 331, "B"), ("last_nch", 332, "B"), ("last_nwarps", 333, "B"),
    ("last_flags", 334, "H"), ("last_count", 336, "Q"), ("last_root", 344, "i"),
    ("last_peer", 348, "i"), ("last_start_ns", 352, "Q"), ("op_digest", 360, "Q"), ("ce_tasks", 368, "Q"),
    ("kch_started", 384, "Q"), ("kch_stopped", 392, "Q"), ("kch_inflight", 400, "Q"),
    ("kch_cur", 408, "Q"), ("kch_done", 416, "Q"), ("kch_start_ptimer", 424, "Q"),
    ("kch_stop_ptimer", 432, "Q"), ("kch_last_ns", 440, "Q"), ("send_posted", 448, "Q"),
    ("send_done", 456, "Q"), ("recv_posted", 464, "Q"), ("recv_done", 472, "Q"),
    ("send_bytes", 480, "Q"), ("recv_bytes", 488, "Q"), ("pop_started", 496, "Q"),
    ("pop_stopped", 504, "Q"), ("in_state", 512, "6I"), ("steps_dropped", 536, "I"),
    ("peers_dropped", 540, "I"), ("last_progress_ns", 544, "Q"), ("last_send_done_ns", 552, "Q"),
    ("last_recv_done_ns", 560, "Q"), ("win_start_ns", 576, "Q"), ("win_ms", 584, "I"),
    ("win_closed", 588, "I"), ("win_send_steps", 592, "Q"), ("win_recv_steps", 600, "Q"),
    ("win_send_bytes", 608, "Q"), ("win_recv_bytes", 616, "Q"), ("base_send_steps", 624, "Q"),
    ("base_recv_steps", 632, "Q"), ("base_send_bytes", 640, "Q"), ("base_recv_bytes", 648, "Q"),
]
SLOT_FIXED, SLOT_NAMES = _compile(SLOT_FIELDS, 704)
# The subset every rule reads for every rank: one small unpack per slot (4096 ranks).
SLOT_HOT_NAMES = ("comm_hash", "state", "rank", "nranks", "func_seq", "op_count", "op_digest",
                  "kch_started", "kch_inflight", "kch_cur", "pop_started", "in_state")
SLOT_STAMPS = ("init_ns", "last_api_ns", "last_task_ns", "kch_last_ns", "last_progress_ns")
SLOT_HOT, SLOT_HOT_FIELDNAMES = _compile(
    [f for f in SLOT_FIELDS if f[0] in SLOT_HOT_NAMES or f[0] in SLOT_STAMPS], 704)
OPS_OFF, CHAN_OFF, PEERS_OFF = 704, 1216, 1728

OP_FIELDS = [
    ("tag", 0, "I"), ("func", 4, "B"), ("dtype", 5, "B"), ("algo", 6, "B"), ("proto", 7, "B"),
    ("root", 8, "i"), ("nch", 12, "B"), ("nwarps", 13, "B"), ("flags", 14, "H"),
    ("count", 16, "Q"), ("seq", 24, "Q"),
]
OP_ENT, OP_NAMES = _compile(OP_FIELDS, 32)
OPS = struct.Struct("<" + OP_ENT.format[1:] * OPRING)  # the whole ring in one call
CHANS = struct.Struct(f"<{2 * NCHAN}I")

PEER_FIELDS = [
    ("key", 0, "I"), ("last_ch", 4, "B"), ("kind", 5, "B"), ("send_posted", 8, "I"),
    ("send_done", 12, "I"), ("recv_posted", 16, "I"), ("recv_done", 20, "I"),
    ("wait", 24, "6H"), ("last_send_ms", 36, "I"), ("last_recv_ms", 40, "I"),
    ("p2p_ops", 44, "I"),
]
PEER_ENT, PEER_NAMES = _compile(PEER_FIELDS, 48)
PEERS = struct.Struct("<" + PEER_ENT.format[1:] * NPEERS)

# A pool lane: bind = (writer token << 32) | (slot index + 1), then the same proxy-side
# fields as a slot's 448..703 (the lane core) at 64.., then a peer table at 320.
CORE_OFF = 448  # where a slot's own lane core starts
LANE_CORE_OFF, LANE_PEERS_OFF = 64, 320
CORE_FIELDS = [f for f in SLOT_FIELDS if CORE_OFF <= f[1] < 704]
LANE_FIELDS = [("bind", 0, "Q"), ("claims", 8, "I")] + [
    (n, o - CORE_OFF + LANE_CORE_OFF, f) for n, o, f in CORE_FIELDS]
LANE, LANE_NAMES = _compile(LANE_FIELDS, LANE_PEERS_OFF)
# how the reader merges a lane's core into its slot: the latest stamp, else the sum
CORE_MAX = frozenset(("last_progress_ns", "last_send_done_ns", "last_recv_done_ns", "win_start_ns", "win_ms"))

assert HEADER.size == 256 and SLOT_FIXED.size == 704 and OPS.size == OPRING * 32
assert LANE_PEERS_OFF + PEERS.size == LANE_SIZE and LANES_OFF % 64 == 0
assert PEERS.size == NPEERS * 48 and PEERS_OFF + PEERS.size == SLOT_SIZE
assert CHAN_OFF + CHANS.size == PEERS_OFF and RING_OFF + HRING * HRING_ENT.size == HDR_SIZE


def field_offsets(fields: list[tuple[str, int, str]]) -> dict[str, int]:
    """name -> offset, as the C side reports them (for the cross-check test)."""
    return {name: off for name, off, _ in fields}


def func_name(code: int) -> str:
    return FUNCS[code] if 0 <= code < len(FUNCS) else "other"


def dtype_name(code: int) -> str:
    return DTYPES[code] if 0 <= code < len(DTYPES) else "unknown"


def wait_name(index: int) -> str:
    return WAITS[index]
