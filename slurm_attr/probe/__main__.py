"""Debug dump of probe records: ``python -m slurm_attr.probe PATH [--json]``.

PATH is a record file, a directory of them, or a bundle (then the analysis runs too).
For developers and bug reports; the CLI proper is ``sattr``.
"""
from __future__ import annotations

import json
import os
import stat
import sys
from typing import Any

from ..bundle import Bundle
from ..config import Config
from ..errors import SattrError
from . import layout as L
from .entry import analyze
from .record import ProbeFormatError, RankRecord, parse, ring

CAP = L.FILE_SIZE + 1


def _files(path: str) -> list[str]:
    if os.path.isfile(path):
        return [path]
    out = []
    for root, _dirs, names in os.walk(path):  # os.walk does not follow directory symlinks
        out.extend(os.path.join(root, n) for n in names if n.endswith(".probe"))
    return sorted(out)


def _read(path: str) -> bytes:
    """A record's bytes: no symlink, no FIFO, at most one file's size (bundles are hostile)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ProbeFormatError("not a regular file")
        return os.pread(fd, CAP, 0)
    finally:
        os.close(fd)


def _op(op: tuple[int, int] | None) -> str | None:
    return f"{L.func_name(op[0])} #{op[1]}" if op else None


def _slot_dict(s: Any) -> dict[str, Any]:
    return {
        "index": s.index, "comm_hash": f"{s.comm_hash:016x}", "name": s.name, "state": s.state,
        "rank": s.rank, "nranks": s.nranks, "nnodes": s.nnodes, "api_ver": s.api_ver,
        "launched": {L.func_name(f): n for f, n in enumerate(s.func_seq) if n},
        "api_calls": {L.func_name(f): n for f, n in enumerate(s.api_func) if n},
        "api": [s.group_api_enter, s.group_api_exit, s.coll_api_enter, s.coll_api_exit],
        "collectives": s.op_count, "copy_engine": s.ce_tasks, "p2p_tasks": s.p2p_tasks,
        "kernel": {"started": s.kch_started, "stopped": s.kch_stopped, "inflight": f"{s.kch_inflight:#x}",
                   "current": _op(s.kch_op(s.kch_cur)), "done": _op(s.kch_op(s.kch_done))},
        "net": {"send": [s.send_posted, s.send_done], "recv": [s.recv_posted, s.recv_done],
                "bytes": [s.send_bytes, s.recv_bytes], "window_ms": s.win_ms,
                "window_steps": [s.win_send_steps, s.win_recv_steps]},
        "waiting": {L.WAITS[i]: n for i, n in enumerate(s.in_state) if n},
        "ops": [e._asdict() for e in s.ops],
        "peers": [p._asdict() for p in s.peers],
        "channels": s.channels(),
    }


def _record_dict(rec: RankRecord, data: bytes) -> dict[str, Any]:
    return {
        "path": rec.path, "rank": rec.global_rank, "pid": rec.pid, "host": rec.hostname,
        "node": rec.node_name, "job": rec.job_id, "step": rec.step_id, "nccl": rec.nccl_version,
        "api": rec.api_ver, "flags": rec.flags, "dropped": rec.dropped_total,
        "pxn_foreign": rec.pxn_foreign, "slots": [_slot_dict(s) for s in rec.slots],
        "problems": rec.problems, "recent": ring(data)[-10:],
    }


def main(argv: list[str]) -> int:
    args = [a for a in argv if a != "--json"]
    if len(args) != 1:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    out: dict[str, Any] = {"records": [], "errors": []}
    for path in _files(args[0]):
        try:
            data = _read(path)
            rec = parse(data, path)
        except (OSError, ProbeFormatError) as err:
            out["errors"].append(f"{path}: {err}")
            continue
        out["records"].append(_record_dict(rec, data))
    if os.path.isdir(os.path.join(args[0], "nodes")):
        try:
            symptoms, coverage = analyze(Bundle(args[0]), Config())
        except SattrError as err:
            out["errors"].append(str(err))
        else:
            out["symptoms"] = [s.to_dict() for s in symptoms]
            out["coverage"] = [c.to_dict() for c in coverage]
    if "--json" in argv:
        json.dump(out, sys.stdout, indent=1, default=str)
        print()
        return 0
    for r in out["records"]:
        print(f"{r['path']}: rank {r['rank']} pid {r['pid']} on {r['node'] or r['host']} "
              f"(job {r['job']}, NCCL {r['nccl']}, API v{r['api']}, dropped {r['dropped']})")
        for s in r["slots"]:
            print(f"  comm {s['comm_hash']} {s['name']} rank {s['rank']}/{s['nranks']} state {s['state']}: "
                  f"launched {s['launched']} kernel {s['kernel']['current']} inflight {s['kernel']['inflight']} "
                  f"waiting {s['waiting']}")
            for p in s["peers"]:
                waits = {L.WAITS[i]: n for i, n in enumerate(p["wait"]) if n}
                print(f"    peer {p['peer']}: send {p['send_done']}/{p['send_posted']} "
                      f"recv {p['recv_done']}/{p['recv_posted']} ch {p['last_ch']} {waits}")
    for e in out["errors"]:
        print(f"error: {e}")
    for s in out.get("symptoms", []):
        print(f"{s['id']}: {s['summary']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
