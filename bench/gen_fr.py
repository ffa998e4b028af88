"""Generate synthetic Flight Recorder dumps with the real schema, for the benchmark.

The layout follows research/flight-recorder.md §6 "Scaling": every rank dumps a
pickle named ``nccl_trace_rank_<rank>`` holding the torch 2.13 top-level dict
(version 2.10, pg_config, pg_status, entries). Each training step issues four
ops on the rank's tensor-parallel group (8 consecutive ranks), one all_reduce on
its data-parallel group (ranks with equal ``rank % tp``) and one all_reduce on
the world group; each entry carries a 24-frame stack whose frame dicts are
shared, as torch memoises them. The ring keeps the last ``entries`` records, so
the buffer has wrapped. In the last step ``fault_rank`` all_reduces a tensor of
a different size on the world group (a size mismatch), unless ``fault_rank`` is
None.

Usage::

    python bench/gen_fr.py OUTDIR --ranks 1024 [--entries 2000] [--fault-rank N]
"""
from __future__ import annotations

import argparse
import os
import struct
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any

TP = 8
OPS_PER_STEP = 6
PREFIX = "nccl_trace_rank_"


def _stack(site: str, line: int) -> list[dict[str, Any]]:
    """A 24-frame stack for one call site: the c10d wrappers, the user's code, the launcher."""
    frames: list[dict[str, Any]] = [
        {"name": site.split(":")[0], "filename": "/opt/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", "line": 3245},
        {"name": "wrapper", "filename": "/opt/venv/lib/python3.11/site-packages/torch/distributed/c10d_logger.py", "line": 83},
        {"name": site.split(":")[1], "filename": "/home/alice/train/model.py", "line": line},
    ]
    for i in range(21):
        frames.append({"name": f"layer_{i}", "filename": f"/home/alice/train/stack_{i % 5}.py", "line": 100 + i * 7})
    return frames


# (pg kind, op, sizes, dtype, call site); the per-step program every rank runs.
_PROGRAM = [
    ("tp", "all_reduce", [[4096, 1024]], "BFloat16", "all_reduce:attn_out", 210),
    ("tp", "_all_gather_base", [[512, 1024]], "BFloat16", "_all_gather_base:seq_gather", 231),
    ("tp", "_reduce_scatter_base", [[4096, 1024]], "BFloat16", "_reduce_scatter_base:seq_scatter", 245),
    ("tp", "all_reduce", [[4096, 4096]], "BFloat16", "all_reduce:mlp_out", 262),
    ("dp", "all_reduce", [[1 << 20]], "Float", "all_reduce:grad_sync", 301),
    ("world", "all_reduce", [[1]], "Float", "all_reduce:loss_sync", 322),
]


def _out_sizes(op: str, sizes: list[list[int]]) -> list[list[int]]:
    if op == "_all_gather_base":
        return [[sizes[0][0] * TP, *sizes[0][1:]]]
    if op == "_reduce_scatter_base":
        return [[sizes[0][0] // TP, *sizes[0][1:]]]
    return sizes


def rank_dump(rank: int, world: int, entries: int, fault_rank: int | None, fault_step: int | None = None,
              fault_kind: str = "size", vary_world: bool = False) -> dict[str, Any]:
    """The dict one rank would dump.

    ``fault_kind`` "size": the faulty rank's world all_reduce has one element more
    at ``fault_step`` (default: the last step); "skip": it does not issue it at all.
    ``vary_world``: the world all_reduce alternates between 1 and 2 elements per
    step, so that a skipped one shifts every later signature.
    """
    n_tp = world // TP
    tp_idx, dp_idx = rank // TP, rank % TP
    pgs = {
        "world": ("0", "default_pg", list(range(world)), 0),
        "tp": (str(1 + tp_idx), "TENSOR_MODEL_PARALLEL_GROUP", list(range(tp_idx * TP, tp_idx * TP + TP)), 1),
        "dp": (str(1 + n_tp + dp_idx), "DATA_PARALLEL_GROUP", list(range(dp_idx, world, TP)), 2),
    }
    stacks = {site: _stack(site, line) for _, _, _, _, site, line in _PROGRAM}
    pg_tuples = {k: (v[0], v[1]) for k, v in pgs.items()}
    steps = entries // OPS_PER_STEP + 67  # enough that the ring has wrapped
    if fault_step is None:
        fault_step = steps - 1
    total = steps * OPS_PER_STEP
    first = total - entries
    seq = {"world": 0, "tp": 0, "dp": 0}
    out: list[dict[str, Any]] = []
    t0 = 1_758_600_000_000_000_000 + rank * 1000
    rid = 0
    for step in range(steps):
        for kind, op, sizes, dtype, site, _line in _PROGRAM:
            faulty = fault_rank == rank and step == fault_step and kind == "world"
            if faulty and fault_kind == "skip":
                continue
            if vary_world and kind == "world":
                sizes = [[1 + step % 2]]
            seq[kind] += 1
            if rid >= first:
                if faulty:
                    sizes = [[sizes[0][0] + 1]]
                name, _desc, _ranks, pg_id = pgs[kind]
                out.append({
                    "frames": list(stacks[site]),
                    "record_id": rid,
                    "pg_id": pg_id,
                    "process_group": pg_tuples[kind],
                    "thread_name": "pt_main_thread",
                    "thread_id": "140000000000000",
                    "collective_seq_id": seq[kind],
                    "p2p_seq_id": 0,
                    "op_id": seq[kind],
                    "profiling_name": "nccl:" + op,
                    "time_created_ns": t0 + rid * 1_000_000,
                    "input_sizes": [list(s) for s in sizes],
                    "input_dtypes": [dtype],
                    "output_sizes": _out_sizes(op, sizes),
                    "output_dtypes": [dtype],
                    "state": "completed" if step < steps - 1 else "scheduled",
                    "time_discovered_started_ns": None,
                    "time_discovered_completed_ns": None,
                    "retired": step < steps - 1,
                    "timeout_ms": 600000,
                    "is_p2p": False,
                })
            rid += 1
    last = {k: seq[k] for k in seq}
    return {
        "version": "2.10",
        "pg_config": {v[0]: {"name": v[0], "desc": v[1], "ranks": str(v[2])} for v in pgs.values()},
        "comm_lib_version": "2.27.3",
        "pg_status": {
            str(v[3]): {
                "last_enqueued_collective": last[k],
                "last_started_collective": -1,
                "last_completed_collective": last[k] - 1,
            }
            for k, v in pgs.items()
        },
        "entries": out,
    }


class TorchStylePickler:
    """Writes pickles the way torch's C++ Pickler does (protocol 2).

    Strings are memoised on first use (BINPUT, then BINGET); dicts that are shared
    (stack frames) are memoised after their SETITEMS; lists and entry dicts are
    not memoised and always use MARK ... APPENDS / SETITEMS. Python's own pickler
    memoises every container instead, which makes files torch never writes.
    """

    def __init__(self) -> None:
        self.out: list[bytes] = []
        self.memo: dict[Any, int] = {}
        self.stacks: dict[tuple[int, ...], bytes] = {}

    def _put(self) -> None:
        i = len(self.memo) - 1
        self.out.append(b"q" + bytes([i]) if i < 256 else b"r" + struct.pack("<I", i))

    def _get(self, i: int) -> None:
        self.out.append(b"h" + bytes([i]) if i < 256 else b"j" + struct.pack("<I", i))

    def dump(self, obj: Any) -> bytes:
        self.out = [b"\x80\x02"]
        self._save(obj)
        self.out.append(b".")
        return b"".join(self.out)

    def _save(self, obj: Any) -> None:
        out = self.out
        t = type(obj)
        if t is str:
            i = self.memo.get(obj)
            if i is not None:
                self._get(i)
                return
            b = obj.encode()
            out.append(b"X" + struct.pack("<I", len(b)) + b)
            self.memo[obj] = len(self.memo)
            self._put()
        elif t is bool:
            out.append(b"\x88" if obj else b"\x89")
        elif t is int:
            if 0 <= obj < 256:
                out.append(b"K" + bytes([obj]))
            elif 0 <= obj < 65536:
                out.append(b"M" + struct.pack("<H", obj))
            elif -(1 << 31) <= obj < 1 << 31:
                out.append(b"J" + struct.pack("<i", obj))
            else:
                n = (obj.bit_length() + 8) // 8
                out.append(b"\x8a" + bytes([n]) + obj.to_bytes(n, "little", signed=True))
        elif obj is None:
            out.append(b"N")
        elif t is float:
            out.append(b"G" + struct.pack(">d", obj))
        elif t is tuple and len(obj) == 2:
            self._save(obj[0])
            self._save(obj[1])
            out.append(b"\x86")
        elif t is list and obj and type(obj[0]) is dict and "filename" in obj[0]:
            # A stack: its frames are shared dicts, so after the first time the list
            # is always the same run of BINGETs; cache it (generation speed only).
            key = tuple(map(id, obj))
            cached = self.stacks.get(key)
            if cached is None:
                known = all(("dict", id(x)) in self.memo for x in obj)
                mark = len(out)
                out.append(b"](")
                for x in obj:
                    self._save(x)
                out.append(b"e")
                if known:
                    self.stacks[key] = b"".join(out[mark:])
            else:
                out.append(cached)
        elif t is list:
            out.append(b"](")
            for x in obj:
                self._save(x)
            out.append(b"e")
        elif t is dict:
            key = ("dict", id(obj))
            shared = "filename" in obj  # stack frames are the shared dicts in torch dumps
            if shared and key in self.memo:
                self._get(self.memo[key])
                return
            out.append(b"}(")
            for k, v in obj.items():
                self._save(k)
                self._save(v)
            out.append(b"u")
            if shared:
                self.memo[key] = len(self.memo)
                self._put()
        else:
            raise TypeError(f"cannot pickle {t.__name__}")


def _write_range(args: tuple[str, int, int, int, int, int | None]) -> int:
    outdir, lo, hi, world, entries, fault_rank = args
    for rank in range(lo, hi):
        data = TorchStylePickler().dump(rank_dump(rank, world, entries, fault_rank))
        with open(os.path.join(outdir, f"{PREFIX}{rank}"), "wb") as f:
            f.write(data)
    return hi - lo


def generate(outdir: str, world: int, entries: int = 2000, fault_rank: int | None = None, workers: int = 2) -> None:
    """Write ``world`` dumps to ``outdir`` (created if needed)."""
    if world % TP:
        raise SystemExit(f"--ranks must be a multiple of {TP}")
    os.makedirs(outdir, exist_ok=True)
    chunk = max(1, world // (workers * 8))
    jobs = [(outdir, lo, min(world, lo + chunk), world, entries, fault_rank) for lo in range(0, world, chunk)]
    with ProcessPoolExecutor(workers) as pool:
        for _ in pool.map(_write_range, jobs):
            pass


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("outdir")
    ap.add_argument("--ranks", type=int, default=1024)
    ap.add_argument("--entries", type=int, default=2000)
    ap.add_argument("--fault-rank", type=int, default=None, help="default: 3/4 of the world, plus 3")
    ap.add_argument("--healthy", action="store_true", help="no fault")
    ap.add_argument("--workers", type=int, default=2)
    a = ap.parse_args(argv)
    fault = None if a.healthy else (a.fault_rank if a.fault_rank is not None else a.ranks * 3 // 4 + 3)
    t = time.time()
    generate(a.outdir, a.ranks, a.entries, fault, a.workers)
    print(f"wrote {a.ranks} dumps to {a.outdir} in {time.time() - t:.1f}s (fault rank {fault})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
