"""Produce fresh, real Flight Recorder dumps with torch (CPU, Gloo) for the FR tests.

Run as a script: ``python fr_scenarios.py OUTDIR [SCENARIO ...]``. torch is
imported once; each scenario forks ``world`` ranks that run a small training
loop on localhost (Gloo, stock torch: its ``pg_config`` is the broken one, see
research/flight-recorder.md §4), inject one fault, and leave one dump per rank
at ``OUTDIR/<scenario>/nccl_trace_rank_<rank>`` (pickle) and ``json/...json``.

How dumps are taken: Gloo has no watchdog, so every rank snapshots its recorder
(``_dump_fr_trace``) right after issuing each collective (``async_op=True``),
before waiting in it - the dump a watchdog would have written while the rank
waits. A mismatched transfer makes Gloo SIGABRT the rank that receives more
bytes than it expected; so the faulty rank issues its faulty collective first
and the others issue theirs only after its snapshot is written (a store key),
and sizes are chosen so that only the faulty rank can abort.

Ground truth (culprit, group name, seq id) is recorded by the ranks' own
bookkeeping in ``OUTDIR/<scenario>/expected.json``.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import sys
import time
from dataclasses import asdict, dataclass, field
from datetime import timedelta


@dataclass
class Scenario:
    name: str
    world: int = 8
    steps: int = 4
    tp: int = 0  # tensor-parallel group size; 0: world group only
    extra: tuple[int, ...] = ()  # ranks that also all_reduce on an extra group every step
    fault: str | None = None  # skip | op | size | dtype | dtype_same_width | stuck | tp_size
    rank: int = 0  # the faulty rank
    step: int = 3  # the faulty step
    buffer: int = 2000  # TORCH_FR_BUFFER_SIZE
    timeout: float = 6.0  # how long a rank waits once the fault is in flight (its dump is written by then)
    drop: tuple[int, ...] = ()  # dumps deleted afterwards (missing dumps)
    snap_every: bool = True  # snapshot after every collective (False: only at the end)
    mirror: bool = False  # a second group of every rank, all_reduced after reduce_loss each step
    expect: dict = field(default_factory=dict)


SCENARIOS = {
    s.name: s
    for s in (
        Scenario("healthy"),
        Scenario("skip", fault="skip", rank=5),
        Scenario("op", fault="op", rank=2),
        Scenario("size", fault="size", rank=7),
        Scenario("dtype", fault="dtype", rank=4),
        Scenario("stuck", fault="stuck", rank=3),
        Scenario("subgroup", tp=2, fault="tp_size", rank=5),
        Scenario("wrap", steps=12, extra=(0, 1, 2, 3), fault="size", rank=6, step=11, buffer=20),
        # rank 5 all_reduces int32 grads once, at step 2 (#3): as wide as float32, so Gloo does not abort and the
        # job runs to its end; ranks 0-3 also use an extra group, so their rings (30 entries) wrapped past #3
        Scenario("wrap_past", steps=10, extra=(0, 1, 2, 3), fault="dtype_same_width", rank=5, step=2, buffer=30),
        Scenario("long", world=2, steps=1000, snap_every=False),  # full 2000-entry rings: read head + tail
        # rank 3 issues the mirror group's all_reduce before the world's reduce_loss at step 3: a deadlock
        Scenario("order", mirror=True, fault="order", rank=3),
        Scenario("order_pair", world=2, mirror=True, fault="order", rank=1),  # one rank each way: no majority order
        # two-member TP groups: the first TP collective of all, so the group has no history to vote with
        Scenario("tp_first", tp=2, fault="tp_size", rank=4, step=1),
        # one two-member group and nothing of its shape to compare with
        Scenario("pair", world=2, tp=2, fault="tp_size", rank=0, step=1),
    )
}
# Derived from a scenario's dumps by deleting some (no torch run of their own).
DERIVED = {"size_missing": ("size", (1,)), "stuck_missing_culprit": ("stuck", (3,)),
           "size_missing_culprit": ("size", (7,)), "subgroup_missing_culprit": ("subgroup", (5,)),
           "healthy_missing": ("healthy", (2,))}


# The groups' own timeout: a collective that is not part of the fault completes, however loaded
# the machine (with 3 s, a rank descheduled under CI load timed out of a healthy broadcast and
# its dump showed a second, made-up fault). Only a wait that the fault dooms ends sooner (finish).
GROUP_TIMEOUT = 120.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(sc: Scenario, rank: int, out: str, port: int) -> None:
    os.environ["TORCH_FR_BUFFER_SIZE"] = str(sc.buffer)
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=sc.world,
                            timeout=timedelta(seconds=GROUP_TIMEOUT))
    store = dist.distributed_c10d._get_default_store()
    groups = {"world": None}
    if sc.tp:
        for g in range(sc.world // sc.tp):
            ranks = list(range(g * sc.tp, g * sc.tp + sc.tp))
            pg = dist.new_group(ranks, timeout=timedelta(seconds=GROUP_TIMEOUT))
            if rank in ranks:
                groups["tp"] = pg
        for g in range(sc.tp):
            ranks = list(range(g, sc.world, sc.tp))
            pg = dist.new_group(ranks, timeout=timedelta(seconds=GROUP_TIMEOUT))
            if rank in ranks:
                groups["dp"] = pg
    if sc.extra:
        pg = dist.new_group(list(sc.extra), timeout=timedelta(seconds=GROUP_TIMEOUT))
        if rank in sc.extra:
            groups["extra"] = pg
    if sc.mirror:
        groups["mirror"] = dist.new_group(list(range(sc.world)), timeout=timedelta(seconds=GROUP_TIMEOUT))
    seq = {k: 0 for k in groups}
    path = os.path.join(out, f"nccl_trace_rank_{rank}")
    jpath = os.path.join(out, "json", f"nccl_trace_rank_{rank}.json")

    def snap() -> None:
        for p, data in ((path, torch._C._distributed_c10d._dump_fr_trace()), (jpath, torch._C._distributed_c10d._dump_fr_trace_json())):
            tmp = os.path.join(out, f".tmp-{rank}")
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, p)

    def name(key: str) -> str:
        pg = groups[key]
        return dist.distributed_c10d._get_process_group_name(pg) if pg is not None else "0"

    def coll(key: str, fn, *args, faulty: bool = False, gate: bool = False, **kw) -> None:
        """Issue, snapshot, wait. ``faulty``: this is the fault; ``gate``: wait until it was issued."""
        if gate:
            store.wait(["fault_issued"], timedelta(seconds=30))
        seq[key] += 1
        if faulty:
            with open(os.path.join(out, "expected.json"), "w") as f:
                json.dump({"culprit": rank, "pg": name(key), "seq": seq[key]}, f)
        work = fn(*args, group=groups[key], async_op=True, **kw)
        if sc.snap_every or faulty or gate:
            snap()
        if faulty:
            store.set("fault_issued", "1")
        finish(work)

    def finish(work) -> None:
        """Wait for a collective; once the fault is in flight, at most sc.timeout more: a
        collective the fault deadlocked never completes, and this rank's dump is written."""
        noticed = None
        polls = 0
        while not work.is_completed():
            polls += 1
            if noticed is None and polls % 25 == 0 and store.check(["fault_issued"]):
                noticed = time.monotonic()
            if noticed is not None and time.monotonic() - noticed > sc.timeout:
                raise TimeoutError("the fault is in flight: this collective will not complete")
            time.sleep(0.002)
        work.wait()  # raises what the collective failed with

    grads = torch.ones(1024)
    metrics = torch.ones(2048)  # larger than grads: a rank that skips to sync_grads can only abort itself
    params = torch.ones(16)
    tp_t = torch.ones(64)
    extra_t = torch.ones(8)
    f_rank = rank == sc.rank

    def tp_allreduce(step: int) -> None:
        if sc.fault == "tp_size" and step == sc.step and f_rank:
            coll("tp", dist.all_reduce, torch.ones(32), faulty=True)
        else:
            coll("tp", dist.all_reduce, tp_t, gate=sc.fault == "tp_size" and step == sc.step and rank in range(sc.rank - sc.rank % sc.tp, sc.rank - sc.rank % sc.tp + sc.tp))

    def sync_grads(step: int) -> None:
        key = "dp" if sc.tp else "world"
        fault_here = step == sc.step and sc.fault in ("size", "dtype", "dtype_same_width", "stuck")
        if fault_here and f_rank and sc.fault == "size":
            coll(key, dist.all_reduce, torch.ones(1000), faulty=True)
        elif fault_here and f_rank and sc.fault == "dtype":
            coll(key, dist.all_reduce, grads.half(), faulty=True)
        elif fault_here and f_rank and sc.fault == "dtype_same_width":
            coll(key, dist.all_reduce, grads.int(), faulty=True)
        elif fault_here and f_rank and sc.fault == "stuck":
            with open(os.path.join(out, "expected.json"), "w") as f:
                json.dump({"culprit": rank, "pg": name(key), "seq": seq[key] + 1}, f)
            store.set("fault_issued", "1")
            time.sleep(120)  # stuck in "compute" for good: the parent kills it
        elif sc.fault == "skip" and f_rank and step == sc.step + 1:
            coll(key, dist.all_reduce, grads, faulty=True)
        else:
            coll(key, dist.all_reduce, grads, gate=fault_here and sc.fault != "stuck")

    def reduce_loss(step: int) -> None:
        if step == sc.step and sc.fault == "skip" and f_rank:
            return  # the bug: this rank skips reduce_loss
        if step == sc.step and sc.fault == "op" and f_rank:
            coll("world", dist.all_gather, [torch.ones(2048) for _ in range(sc.world)], metrics, faulty=True)
            return
        coll("world", dist.all_reduce, metrics, gate=step == sc.step and sc.fault in ("skip", "op"))

    def mirror_allreduce(step: int) -> None:
        coll("mirror", dist.all_reduce, extra_t)

    def broadcast_params(step: int) -> None:
        coll("world", dist.broadcast, params, src=0)

    def extra_allreduce(step: int) -> None:
        coll("extra", dist.all_reduce, extra_t)

    try:
        for step in range(1, sc.steps + 1):
            if sc.tp:
                tp_allreduce(step)
            if "extra" in groups:
                extra_allreduce(step)
            sync_grads(step)
            if sc.fault == "order" and f_rank and step == sc.step:
                # the bug: this rank issues the two collectives in the other order
                with open(os.path.join(out, "expected.json"), "w") as f:
                    json.dump({"culprit": rank, "pg": "0", "seq": seq["world"] + 1}, f)
                store.set("fault_issued", "1")
                mirror_allreduce(step)
                reduce_loss(step)
            else:
                reduce_loss(step)
                if "mirror" in groups:
                    mirror_allreduce(step)
            if step % 2 == 0:
                broadcast_params(step)
        coll("world", dist.barrier)
        snap()  # the healthy end: everything completed
    except Exception:
        pass  # a collective timed out or failed: the last snapshot is this rank's dump


def run(sc: Scenario, outdir: str) -> dict:
    out = os.path.join(outdir, sc.name)
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(os.path.join(out, "json"))
    port = _free_port()
    t0 = time.time()
    pids = {}
    for rank in range(sc.world):
        pid = os.fork()
        if pid == 0:
            try:
                _rank_main(sc, rank, out, port)
            finally:
                os._exit(0)
        pids[pid] = rank
    deadline = t0 + GROUP_TIMEOUT + 3 * sc.timeout + 20
    codes = {}
    while pids and time.time() < deadline:
        if sc.fault == "stuck" and list(pids.values()) == [sc.rank]:
            break  # only the sleeping rank is left: its dump is its last snapshot
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            time.sleep(0.05)
            continue
        codes[pids.pop(pid)] = os.waitstatus_to_exitcode(status)
    for pid, rank in pids.items():
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        codes[rank] = -9
    info = asdict(sc)
    info.update({"exit_codes": codes, "wall_s": round(time.time() - t0, 2)})
    exp = os.path.join(out, "expected.json")
    if os.path.exists(exp):
        with open(exp) as f:
            info["expected"] = json.load(f)
    with open(os.path.join(out, "scenario.json"), "w") as f:
        json.dump(info, f, indent=1)
    return info


def derive(outdir: str, name: str, base: str, drop: tuple[int, ...]) -> None:
    src, dst = os.path.join(outdir, base), os.path.join(outdir, name)
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst)
    for r in drop:
        for p in (os.path.join(dst, f"nccl_trace_rank_{r}"), os.path.join(dst, "json", f"nccl_trace_rank_{r}.json")):
            if os.path.exists(p):
                os.remove(p)


def main(argv: list[str]) -> int:
    outdir, names = argv[0], argv[1:] or [*SCENARIOS, *DERIVED]
    import torch  # noqa: F401 - once, before forking: the ranks share the import
    from torch._C._profiler import gather_traceback, symbolize_tracebacks

    # The first stack symbolisation in a process takes seconds; do it once here.
    symbolize_tracebacks([gather_traceback(True, True, False)])
    for n in names:
        if n in SCENARIOS:
            info = run(SCENARIOS[n], outdir)
            print(f"{n}: {info['wall_s']}s exit codes {info['exit_codes']}", flush=True)
    for n in names:
        if n in DERIVED:
            base, drop = DERIVED[n]
            derive(outdir, n, base, drop)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
