"""One node's view: its local ranks' probe records -> a small summary (+ snapshots).

The records are in the job's evidence dir (``<jobdir>/probe``), written by the job: hostile.
They are read exactly as the post-mortem reader reads a bundle (probe/reader.py: the
directory opened without following links, files by d_type, bounded positioned reads,
O_NOFOLLOW|O_NONBLOCK, every bad file one coverage line), once per cycle.

The summary keeps per communicator and local rank only what the job-wide view needs:
how many of each collective it launched, the last one (op/count/dtype), the collective on
the GPU, steps waiting, whether it is inside an NCCL call, a progress counter, the time
of its last event and per-peer send/recv progress. A *snapshot* (the record's header and
used slots, byte for byte) is written only once a local communicator looks stalled, so
the leader can run the post-mortem rules on it; a stalled job's records do not change, so
it is written once per stall, not every cycle.
"""
from __future__ import annotations

import os
import time
from typing import Any

from .. import safefs
from ..errors import UnsafePath
from ..probe import layout as L
from ..probe.comms import Comm, group, member_activity_ns
from ..probe.reader import MAX_FILES_PER_NODE, probe_files, read_record, ReadState
from ..probe.record import ProbeFormatError, RankRecord

VERSION = 1
MAX_PEERS_LISTED = 16  # the record's own peer table holds at most NPEERS
_RFLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)


# A record's step_id is its rank's SLURM_STEP_ID (spank/probe/probe_file.c); the probe writes
# UINT32_MAX when the env had none. Slurm's batch script step is SLURM_BATCH_SCRIPT.
STEP_UNSET = 0xFFFFFFFF
_BATCH_SCRIPT = 0xFFFFFFFB
_FIRST_SPECIAL = 0xFFFFFFF0


def of_another_step(rec: RankRecord, step: str) -> bool:
    """Whether a record names a step other than ``step`` ("batch" or a number): two sruns on
    one node share its probe dir. A record without a step (a launcher that cleared the env)
    is not known to be another's, and stays (the watcher's start time still sorts it)."""
    sid = rec.step_id
    if sid == STEP_UNSET:
        return False
    if step == "batch":
        return sid != _BATCH_SCRIPT
    return not step.isdigit() or sid != int(step) or sid >= _FIRST_SPECIAL


def read_local(jobdir: str, node: str) -> tuple[list[RankRecord], list[str], dict[str, int]]:
    """(records, problems, name -> bytes to snapshot) of ``<jobdir>/probe``."""
    try:
        dfd = safefs.open_dir(jobdir, "probe")
    except UnsafePath as err:
        return [], [f"probe dir: {err}"], {}
    records: list[RankRecord] = []
    problems: list[str] = []
    sizes: dict[str, int] = {}
    state = ReadState()
    try:
        names, odd = probe_files(dfd)
        problems += [f"{n}: not a regular file" for n in odd[:5]]
        if len(names) > MAX_FILES_PER_NODE:
            problems.append(f"{len(names)} probe files, read {MAX_FILES_PER_NODE}")
            names = names[:MAX_FILES_PER_NODE]
        for name in names:
            try:
                rec = read_record(dfd, name, f"probe/{name}", node, state)
            except (ProbeFormatError, OSError) as err:
                problems.append(f"{name}: {err}")
                continue
            records.append(rec)
            # what a snapshot copies: header and used slots, then lanes at their offset
            sizes[name] = (L.LANES_OFF + rec.lanes_used * L.LANE_SIZE if rec.lanes_used
                           else L.HDR_SIZE + rec.nslots_used * L.SLOT_SIZE)
    finally:
        os.close(dfd)
    return records, problems, sizes


def read_snapshot(jobdir: str, name: str, size: int) -> bytes | None:
    """The first ``size`` bytes of one record (bounded by the layout), or None."""
    size = min(size, L.FILE_SIZE)
    try:
        dfd = safefs.open_dir(jobdir, "probe")
    except UnsafePath:
        return None
    try:
        fd = os.open(name, _RFLAGS, dir_fd=dfd)
    except OSError:
        return None
    finally:
        os.close(dfd)
    try:
        data = os.pread(fd, size, 0)
    except OSError:
        return None
    finally:
        os.close(fd)
    return data if len(data) == size else None


def _progress(m: Any) -> int:
    """A number that grows with any progress of this rank on this communicator: every
    counter the probe keeps only ever increases within one process."""
    return (m.op_count + sum(m.func_seq) + m.kch_started + m.kch_stopped + m.coll_tasks + m.p2p_tasks
            + m.pop_started + m.pop_stopped + m.send_done + m.recv_done + m.coll_api_enter + m.p2p_api_enter)


def _in_api(m: Any) -> bool | None:
    if m.group_api_enter == 0 and m.coll_api_enter == 0 and m.p2p_api_enter == 0:
        return None
    return (m.group_api_enter > m.group_api_exit or m.coll_api_enter > m.coll_api_exit
            or m.p2p_api_enter > m.p2p_api_exit)


def member_summary(m: Any) -> dict[str, Any]:
    rec = m.rec
    last = m.ops[-1] if m.ops else None
    cur = m.kch_op(m.kch_cur) if m.kch_inflight else None
    peers = []
    for p in m.peers[:MAX_PEERS_LISTED]:
        peers.append([p.peer, p.send_done, p.recv_done, p.wait[L.W_SEND_NET], p.wait[L.W_RECV_NET],
                      rec.rt_ms(p.last_send_ms), rec.rt_ms(p.last_recv_ms)])
    return {
        "cr": m.rank, "g": rec.global_rank if rec.global_rank >= 0 else None, "pid": rec.pid,
        "file": rec.path.rsplit("/", 1)[-1],
        "fs": list(m.func_seq), "ops": m.op_count,
        "last": [last.func, last.count, last.dtype, last.seq] if last else None,
        "kern": list(cur) if cur else None, "wait": list(m.in_state), "api": _in_api(m),
        "prog": _progress(m), "act": member_activity_ns(m), "peers": peers,
    }


def pending(member: dict[str, Any]) -> bool:
    """The rank has a collective under way: on the GPU, steps waiting, or inside NCCL."""
    return bool(member.get("kern")) or any(member.get("wait") or ()) or member.get("api") is True


def current(records: list[RankRecord]) -> list[RankRecord]:
    """Records not superseded by a newer process of the same global rank: a restarted
    worker (torchrun, elastic) leaves its dead predecessor's file, frozen mid-collective,
    which would otherwise look like a hang on a communicator nobody uses any more."""
    newest: dict[int, int] = {}
    for r in records:
        if r.global_rank >= 0:
            newest[r.global_rank] = max(newest.get(r.global_rank, r.create_rt_ns), r.create_rt_ns)
    return [r for r in records if r.global_rank < 0 or r.create_rt_ns >= newest[r.global_rank]]


def summarize(job: str, node: str, records: list[RankRecord], problems: list[str],
              now_ns: int | None = None) -> dict[str, Any]:
    records = current(records)
    comms: list[Comm] = group(records)
    out = []
    for c in comms:
        out.append({"hash": f"{c.hash:016x}", "label": c.label, "nranks": c.nranks,
                    "members": [member_summary(m) for _, m in sorted(c.members.items())]})
    return {"v": VERSION, "job": job, "node": node, "now_ns": now_ns or time.time_ns(),
            "ranks": sorted(r.global_rank for r in records if r.global_rank >= 0),
            "comms": out, "problems": problems[:20]}


class LocalStall:
    """Which local communicators have a collective under way and no local progress for
    ``after_s``: the node's cue to snapshot its records for the leader's classification.
    Communicators at rest (nothing under way) never trigger it, so an idle side
    communicator costs nothing."""

    def __init__(self, after_s: float):
        self.after_s = after_s
        self._seen: dict[tuple[str, int], tuple[int, float]] = {}  # (comm, crank) -> (prog, since)

    def update(self, summary: dict[str, Any], now: float) -> bool:
        stalled = False
        seen: dict[tuple[str, int], tuple[int, float]] = {}
        for c in summary["comms"]:
            latest, busy = 0.0, False
            for m in c["members"]:
                key = (c["hash"], m["cr"])
                old = self._seen.get(key)
                since = old[1] if old is not None and old[0] == m["prog"] else now
                seen[key] = (m["prog"], since)
                latest = max(latest, since)
                busy = busy or pending(m)
            if busy and now - latest >= self.after_s:
                stalled = True
        self._seen = seen
        return stalled
