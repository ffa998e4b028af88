"""One rank of a live-watch scenario job (bench/bench_live_cluster.py): near misses and a hang
after a checkpoint, played by real processes on the test cluster.

    srun -N2 --ntasks-per-node=4 python live_scenario.py SCENARIO --t0 EPOCH --seed S \
        [--episodes N] [--torch] [--info FILE]

Each Slurm task is one rank (SLURM_PROCID of SLURM_NTASKS). The NCCL side is modelled: every
rank writes its probe record (slurm_attr.probe.synth, the probe's layout) into the
$SLURM_ATTR_PROBE_DIR the plugin set, in place, only when its collective state changes, as
the probe would leave it. What the busy check reads is real: each rank's CPU and storage I/O
(/proc), its data-loader child, and, with --torch (torch.distributed imported, so the plugin's
worker_hook starts torch's worker server), its Python stack through ``dump_traceback``:
the functions below are named for what a training script does (save_checkpoint, evaluate,
fetch_batch, exchange_state).

The ranks need no messages: all of them play one plan (seeded by --seed) on the wall clock
from --t0, second by second, as bench/bench_live_nearmiss.py's ``Job`` plays it on a virtual
clock. Scenarios: checkpoint (rank 0 writes a 20-40 s checkpoint while the others wait in
the barrier they entered, every ~40 iterations), eval (metric all-reduces with ranks
arriving up to 3 s apart, then rank 0 computes metrics 8-12 s), dataload (one rank's loader
stalls 10 s, its worker reading), gc (a 2 s pause of one rank), slowdown (collectives from
2 per second down to one every 8 s), each --episodes times; ckpt_hang (after 30-50 s of
training, a 20-40 s checkpoint of rank 0 whose last write blocks for good: its stack stays
in save_checkpoint, its counters stop). --info: rank 0 writes there (JSON) the start, the
plan's episodes and, for ckpt_hang, the onset's wall time.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)

from slurm_attr.probe.synth import SlotSpec, record_bytes  # noqa: E402

AR = 4
WORLD = 0x9E3779B97F4A7C15
TICK = 0.25
CLOCK = 6  # CLOCK_MONOTONIC_COARSE, the probe's clock (header clock_id)
NEAR = ("checkpoint", "eval", "dataload", "gc", "slowdown")
HANGS = ("ckpt_hang",)
HANG_S = 600  # a hang lasts until the bench cancels the job


def plan(name: str, rng: random.Random, n: int, episodes: int) -> list:
    """Segments (seconds, what, args...), as bench_live_nearmiss.plan with ``episodes``."""
    tr = lambda s: (s, "train", rng.uniform(1.6, 2.4))  # noqa: E731 - ~2 iterations a second
    out = [tr(30)]
    if name == "checkpoint":
        for _ in range(episodes):
            out += [(rng.randint(20, 40), "away", (0,), "checkpoint", True, True, False), tr(20)]
    elif name == "eval":
        for _ in range(episodes):
            for _ in range(4):  # metric all-reduces: ranks compute 2-3 s, arrive 1-3 s apart
                late = tuple(rng.sample(range(n), rng.randint(1, 3)))
                out += [(rng.randint(2, 3), "rest", "eval"), (rng.randint(1, 3), "away", late, "eval", True, False, False)]
            out += [(rng.randint(8, 12), "away", (0,), "eval", True, False, False), tr(15)]
    elif name == "dataload":
        for _ in range(episodes):
            out += [(10, "away", (rng.randrange(n),), "data", False, True, True), tr(15)]
    elif name == "gc":
        for _ in range(episodes):
            out += [(2, "away", (rng.randrange(n),), "gc", True, False, False), tr(rng.randint(12, 18))]
    elif name == "slowdown":
        for _ in range(episodes):
            gap = 0.5
            while gap <= 8:
                out.append((3, "train", 1 / gap) if gap < 1 else (round(3 * gap), "slow", gap))
                gap *= 1.25
            out.append(tr(15))
    elif name == "ckpt_hang":
        out = [tr(rng.randint(30, 50)), (rng.randint(20, 40), "away", (0,), "checkpoint", True, True, False),
               (HANG_S, "hang", 0)]
    else:
        raise SystemExit(f"unknown scenario {name!r}")
    return out


def timeline(segs: list, n: int) -> tuple[list[list[tuple]], int | None]:
    """Per second, per rank: (k launched, pending, doing, moving); and the hang's onset second."""
    out: list[list[tuple]] = []
    k, frac, onset = 10, 0.0, None
    for seg in segs:
        dur, what, args = seg[0], seg[1], seg[2:]
        k0 = k
        for i in range(dur):
            if what == "train":
                frac += args[0]
                k, frac = k + int(frac), frac - int(frac)
                out.append([(k, True, "train", True)] * n)
            elif what == "slow":
                out.append([(k0 + int((i + 1) / args[0] + 1e-9), True, "train", True)] * n)
            elif what == "rest":
                out.append([(k, False, args[0], True)] * n)
            elif what == "away":
                ranks, act, cpu, io, _kids = args
                out.append([(k, False, act, cpu or io) if r in ranks else (k + 1, True, "train", False) for r in range(n)])
            elif what == "hang":  # rank args[0]'s checkpoint blocks: the others still in its barrier
                onset = len(out) - i if onset is None else onset
                out.append([(k - 1, False, "blocked", False) if r == args[0] else (k, True, "train", False)
                            for r in range(n)])
        if what == "slow":
            k = out[-1][0][0]
        elif what == "away":
            k += 1
    return out, onset


class Rank:
    def __init__(self, rank: int, n: int, use_torch: bool):
        self.rank, self.n = rank, n
        self.node = os.environ.get("SLURMD_NODENAME", "")
        self.job = int(os.environ.get("SLURM_JOB_ID", "0"))
        step = os.environ.get("SLURM_STEP_ID", "0")
        self.step = int(step) if step.isdigit() else 0
        self.torch = None
        if use_torch:
            import torch
            import torch.distributed  # noqa: F401 - the plugin's worker_hook starts the worker server on it
            self.torch = torch
        d = os.environ["SLURM_ATTR_PROBE_DIR"]
        self.path = os.path.join(d, f"rank{rank}.pid{os.getpid()}.probe")
        self.rt, self.mono = time.time_ns(), time.clock_gettime_ns(CLOCK)
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        self.written: tuple | None = None
        self.last_ns = self.mono
        self.scratch = os.path.join(os.environ.get("SLURM_SUBMIT_DIR", "/tmp"), f".ckpt-{self.job}-{rank}")
        self.kid: int | None = None
        full = record_bytes(rank, [], pid=os.getpid(), node=self.node, job_id=self.job, rt_ns=self.rt,
                            mono_ns=self.mono, step_id=self.step)
        os.pwrite(self.fd, full, 0)

    def write(self, k: int, pend: bool) -> None:
        if self.written is not None and self.written[0] != k:
            self.last_ns = time.clock_gettime_ns(CLOCK)  # progress: a collective launched
        if self.written == (k, pend):
            return
        self.written = (k, pend)
        slot = SlotSpec(comm_hash=WORLD, rank=self.rank, nranks=self.n, name="world", launched={AR: k}, op_count=k,
                        ops=[(o, AR, 1 << 20, 8, -1, o) for o in range(max(0, k - 16), k)], digest=k,
                        kernel=(AR, k - 1) if pend else None, inflight=3 if pend else 0, api=(k, k, k, k),
                        last_ns=self.last_ns, pop_started=k)
        data = record_bytes(self.rank, [slot], pid=os.getpid(), node=self.node, job_id=self.job, rt_ns=self.rt,
                            mono_ns=self.mono, full=False, step_id=self.step)
        os.pwrite(self.fd, data, 0)

    # ---- what the rank does for one tick, in functions named as a training script's ------
    def act(self, doing: str, moving: bool, until: float) -> None:
        {"train": train_step, "checkpoint": save_checkpoint, "eval": evaluate, "data": fetch_batch,
         "gc": collect_garbage, "blocked": save_checkpoint_blocked}.get(doing, exchange_state)(self, moving, until)
        if doing != "data" and self.kid is not None:
            stop_loader(self)


def spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    x = 0
    while time.perf_counter() < end:
        x += 1


def rest(until: float) -> None:
    time.sleep(max(0.0, until - time.time()))


def train_step(r: Rank, moving: bool, until: float) -> None:
    spin(0.01)
    rest(until)


def save_checkpoint(r: Rank, moving: bool, until: float) -> None:
    """A shard of the checkpoint: CPU (serialising) and storage writes."""
    spin(0.04)
    blob = os.urandom(256 << 10)
    with open(r.scratch, "ab") as f:
        if r.torch is not None:
            r.torch.save(r.torch.frombuffer(bytearray(blob), dtype=r.torch.uint8), f)
        else:
            f.write(blob)
    if os.path.getsize(r.scratch) > 32 << 20:
        os.truncate(r.scratch, 0)
    rest(until)


def save_checkpoint_blocked(r: Rank, moving: bool, until: float) -> None:
    """The checkpoint's last write never returns (a dead file server): still, in save_checkpoint."""
    rest(until)


def evaluate(r: Rank, moving: bool, until: float) -> None:
    spin(0.05)
    rest(until)


def collect_garbage(r: Rank, moving: bool, until: float) -> None:
    spin(max(0.0, until - time.time()) * 0.8)  # a GC pause burns CPU
    rest(until)


def fetch_batch(r: Rank, moving: bool, until: float) -> None:
    """The rank waits on its loader worker (a child that reads and decodes)."""
    if r.kid is None:
        r.kid = os.fork()
        if r.kid == 0:
            loader_worker(r.scratch + ".data")
    rest(until)


def loader_worker(path: str) -> None:
    try:
        with open(path, "wb") as f:
            f.write(os.urandom(4 << 20))
        while True:
            fd = os.open(path, os.O_RDONLY)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # read from storage, not the cache
            while os.read(fd, 1 << 20):
                spin(0.01)
            os.close(fd)
            time.sleep(0.05)
    finally:
        os._exit(0)


def stop_loader(r: Rank) -> None:
    try:
        os.kill(r.kid, 9)
        os.waitpid(r.kid, 0)
    except OSError:
        pass
    r.kid = None


def exchange_state(r: Rank, moving: bool, until: float) -> None:
    rest(until)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("scenario", choices=NEAR + HANGS)
    ap.add_argument("--t0", type=float, required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--episodes", type=int, default=3)
    ap.add_argument("--torch", action="store_true")
    ap.add_argument("--info", default="")
    a = ap.parse_args()
    rank, n = int(os.environ["SLURM_PROCID"]), int(os.environ["SLURM_NTASKS"])
    segs = plan(a.scenario, random.Random(a.seed), n, a.episodes)
    tl, onset = timeline(segs, n)
    if rank == 0 and a.info:
        with open(a.info + ".tmp", "w") as f:
            json.dump({"scenario": a.scenario, "t0": a.t0, "seconds": len(tl), "episodes": a.episodes if a.scenario in NEAR else 1,
                       "onset": a.t0 + onset if onset is not None else None,
                       "onset_s": onset}, f)
        os.replace(a.info + ".tmp", a.info)
    r = Rank(rank, n, a.torch)
    try:
        while True:
            now = time.time()
            s = int(now - a.t0)
            if s < 0:
                time.sleep(min(TICK, -s))
                continue
            if s >= len(tl):
                # The job's last collective completes before it exits, as a real job's does: a
                # record left "in flight" through the interpreter's teardown (torch loaded, a
                # loaded machine: seconds) reads as every rank waiting, a hang (H0, seen once).
                r.write(tl[-1][rank][0], False)
                return 0
            k, pend, doing, moving = tl[s][rank]
            r.write(k, pend)
            r.act(doing, moving, min(now + TICK, a.t0 + s + 1))
    finally:
        if r.kid is not None:
            stop_loader(r)
        for p in (r.scratch, r.scratch + ".data"):
            try:
                os.unlink(p)
            except OSError:
                pass


if __name__ == "__main__":
    sys.exit(main())
