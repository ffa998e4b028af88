"""A big training job's evidence bundle: N nodes x 8 GPUs, one GPU falls off the bus.

The bundle is what the hooks leave on the spool (DESIGN §3), file for file:

- ``job.json``, ``output/stdout|stderr`` (tails) and ``scheduler/slurm.log``, written by the
  controller side's own ``collect.controller.write_controller_part`` from the job's full output
  and a slurmctld log staged beside the bundle;
- ``nodes/<node>/kernel.log`` (``journalctl -k -o short-iso-precise``: a quiet node's noise over
  the job window), ``fr/nccl_trace_rank_<r>`` (one Flight Recorder dump per rank, torch's pickle
  as ``bench/gen_fr.py`` writes it) and ``collect.json`` with the rank map, as the node epilog
  (``collect.node.collect_node``) writes them.

The fault: at ``t_fail`` GPU ``g`` of one node logs Xid 79 ("GPU has fallen off the bus"), its
rank reports a CUDA error, and the node's eight ranks stop in their last step's first
tensor-parallel all_reduce (the dead rank's entry never starts). Every other rank waits in the
data-parallel all_reduce, which needs one rank of that node in each group: the dead rank's ring
neighbours log NCCL IB completion errors naming its node, and ten minutes later every other
rank's watchdog times out (the cascade). ``xid=False`` is the near miss: the same job without
the kernel's Xid lines and the dead rank's CUDA error, so only the NCCL symptoms remain.

Deterministic per (nodes, seed); the nodes are written by ``workers`` processes, each node from
its own seeded RNG, so the bytes do not depend on the split.

    python bench/bigjob/gen.py OUT --nodes 16 [--seed 0] [--entries 2000] [--no-xid] [--workers 2]
"""
from __future__ import annotations

import argparse
import copy
import json
import multiprocessing
import os
import random
import shutil
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

BENCH = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(BENCH))  # the repository, for slurm_attr
sys.path.insert(0, BENCH)  # bench/, for gen_fr and accuracy

import gen_fr  # noqa: E402
from accuracy import fmt_job, fmt_kernel as fk  # noqa: E402
from accuracy.gen_hw import ADVICE  # noqa: E402
from accuracy.world import GPU_BDFS, HCAS, World  # noqa: E402

from slurm_attr.collect import provenance  # noqa: E402
from slurm_attr.collect.controller import write_controller_part  # noqa: E402
from slurm_attr.collect.node import SourceResult, write_private  # noqa: E402
from slurm_attr.collect.window import Window  # noqa: E402

GPUS = 8
WATCHDOG_S = 600  # torch's default NCCL collective timeout
TP_OP, DP_OP = 0, 4  # indexes in gen_fr's per-step program: where the two sides stop
OUTPUT_CAP = 2 << 20  # [collect] output_tail_bytes


class BigWorld(World):
    """accuracy's World with a big job's layout: gpu-NNNN, eight ranks per node in blocks,
    and one cluster's formats (journalctl, srun --label, current torch and NCCL)."""

    def __init__(self, n_nodes: int, seed: int) -> None:
        self.n_nodes = n_nodes
        super().__init__("bigjob", seed, held=False)
        self.kfmt, self.prefix, self.torch_new = "iso", "label", True
        self.xid_pci, self.xid_who, self.nccl_version, self.ib_old_form = True, "pid", "2.21.5", False

    def _layout(self) -> None:
        self.nodes = [f"gpu-{i:04d}" for i in range(self.n_nodes)]
        self._pool, self.per_node = self.nodes, GPUS
        self._index = {n: i for i, n in enumerate(self.nodes)}
        self.ranks = {r: self.nodes[r // GPUS] for r in range(self.n_nodes * GPUS)}

    def _addresses(self) -> dict[str, str]:
        # thousands of hosts: a /16 (the base class numbers one /24)
        net = f"10.{self.rng.randint(0, 40)}"
        return {n: f"{net}.{i // 250}.{i % 250 + 2}" for i, n in enumerate(self.nodes)}

    # O(1) versions: the base class scans every rank, which is quadratic at 32,768 ranks.
    def ranks_on(self, node: str) -> list[int]:
        i = self._index[node]
        return list(range(i * GPUS, i * GPUS + GPUS))

    def local_rank(self, rank: int) -> int:
        return rank % GPUS


@dataclass
class Plan:
    """Everything about the job that every writer process must agree on."""

    w: BigWorld
    entries: int
    xid: bool
    bad_node: str
    bad_rank: int
    t_fail: datetime
    end: datetime
    seq_tp: int  # collective_seq_id of the TP all_reduce the bad node stops in
    seq_dp: int  # ... and of the DP all_reduce everybody else waits in

    @property
    def world(self) -> int:
        return len(self.w.ranks)

    def epoch(self, t: datetime) -> float:
        return t.replace(tzinfo=timezone.utc).timestamp()  # the generated times are UTC

    def node_rng(self, node: str) -> BigWorld:
        """The world with a node's own RNG: its lines do not depend on which process writes it."""
        w = copy.copy(self.w)
        w.rng = random.Random(f"bigjob:{self.w.job_id}:{node}")
        return w

    def neighbours(self) -> list[int]:
        """Ranks that exchange IB traffic with the dead rank in its DP group (same GPU index):
        its ring neighbours and its tree parent and children, by node index."""
        i, n, g = self.bad_rank // GPUS, self.w.n_nodes, self.bad_rank % GPUS
        idx = {(i - 1) % n, (i + 1) % n, (i - 1) // 2, 2 * i + 1, 2 * i + 2}
        return sorted(j * GPUS + g for j in idx if 0 <= j < n and j != i)


def plan(nodes: int, seed: int = 0, entries: int = 2000, xid: bool = True) -> Plan:
    w = BigWorld(nodes, seed)
    bad_node = w.nodes[w.rng.randrange(nodes)]
    bad_rank = w.any_rank(bad_node)
    t_fail = w.start + w.secs(2 * 3600, 6 * 3600)
    end = t_fail + timedelta(seconds=WATCHDOG_S + 45)
    last = gen_fr.rank_dump(0, GPUS, entries, None)["entries"][-gen_fr.OPS_PER_STEP:]
    return Plan(w, entries, xid, bad_node, bad_rank, t_fail, end,
                last[TP_OP]["collective_seq_id"], last[DP_OP]["collective_seq_id"])


# -- Flight Recorder ------------------------------------------------------------------------
def rank_fr(p: Plan, rank: int) -> bytes:
    """The rank's dump: gen_fr's healthy dump, cut where the rank stopped, timed to the job."""
    d = gen_fr.rank_dump(rank, p.world, p.entries, None)
    entries = d["entries"]
    step = len(entries) - gen_fr.OPS_PER_STEP  # gen_fr leaves the last step scheduled
    on_bad = rank // GPUS == p.bad_rank // GPUS
    stop = step + (TP_OP if on_bad else DP_OP)
    del entries[stop + 1:]
    shift = int(p.epoch(p.t_fail) * 1e9) - entries[-1]["time_created_ns"]
    for e in entries:
        e["time_created_ns"] += shift
    for e in entries[step:]:
        done = e is not entries[-1]
        e["state"] = "completed" if done else ("scheduled" if rank == p.bad_rank else "started")
        e["retired"] = done
        if e["state"] != "scheduled":
            e["time_discovered_started_ns"] = e["time_created_ns"] + 200_000
        if done:
            e["time_discovered_completed_ns"] = e["time_created_ns"] + 900_000
    status = {}
    for e in entries:
        st = status.setdefault(str(e["pg_id"]), {"last_enqueued_collective": -1, "last_started_collective": -1,
                                                 "last_completed_collective": -1})
        st["last_enqueued_collective"] = e["collective_seq_id"]
        if e["state"] == "started":
            st["last_started_collective"] = e["collective_seq_id"]
        elif e["state"] == "completed":
            st["last_completed_collective"] = e["collective_seq_id"]
    d["pg_status"] = status
    return gen_fr.TorchStylePickler().dump(d)


# -- one node's part ------------------------------------------------------------------------
def kernel_lines(p: Plan, node: str, w: BigWorld) -> list[str]:
    """The node's kernel window: a quiet GPU node's noise, the fault, teardown's Xid 45."""
    span = (p.end - w.start).total_seconds()
    timed = [(w.start + timedelta(seconds=w.rng.uniform(-100, span + 100)), m)
             for _ in range(3) for m in fk.noise(w, node)]
    timed += [(w.start + timedelta(seconds=w.rng.uniform(1, 5)), fk.link(h, "ACTIVE")) for h in HCAS[:4]]
    if node == p.bad_node and p.xid:
        bdf, pid = w.gpu_of(p.bad_rank), w.pids[p.bad_rank]
        timed += [(p.t_fail, fk.xid(w, bdf, 79, "GPU has fallen off the bus.", pid)),
                  (p.t_fail + timedelta(microseconds=137), f"NVRM: GPU {bdf}.0: GPU has fallen off the bus."),
                  (p.t_fail + timedelta(microseconds=274), fk.xid(
                      w, bdf, 154, "GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)"))]
    if w.chance(0.02):  # the driver cleans up the channels of a task srun killed
        r = w.any_rank(node)
        timed.append((p.end - timedelta(seconds=w.rng.uniform(1, 8)), fk.xid(w, w.gpu_of(r), 45, "Ch 00000010", w.pids[r])))
    clock = timedelta(seconds=w.offsets[node])
    return [fk.prefix(w.kfmt, t + clock, node) + m for t, m in sorted(timed, key=lambda x: x[0])]


def write_node(out: str, p: Plan, node: str) -> int:
    """nodes/<node>/: kernel.log, fr/, collect.json last (the part's completion marker)."""
    w = p.node_rng(node)
    d = os.path.join(out, "nodes", node)
    os.makedirs(os.path.join(d, "fr"), mode=0o700, exist_ok=True)
    klog = ("\n".join(kernel_lines(p, node, w)) + "\n").encode()
    write_private(os.path.join(d, "kernel.log"), klog)
    ranks = w.ranks_on(node)
    fr_bytes = 0
    for r in ranks:
        data = rank_fr(p, r)
        write_private(os.path.join(d, "fr", f"{gen_fr.PREFIX}{r}"), data)
        fr_bytes += len(data)
    start, end = p.epoch(w.start), p.epoch(p.end) + w.rng.uniform(0.5, 3)
    win = Window(start, end, "scontrol", True, "start from scontrol")
    doc = {
        "version": 1, "node": node, "job_id": w.job_id, "opted_out": False,
        "started": datetime.fromtimestamp(end, timezone.utc).isoformat(timespec="seconds"),
        "ms": round(w.rng.uniform(150, 900), 1),
        "sources": {"kernel": SourceResult(bytes=len(klog), ms=w.rng.uniform(20, 80), detail="").to_dict(),
                    "window": SourceResult(detail=win.detail).to_dict(),
                    "fr": SourceResult(bytes=fr_bytes, files=len(ranks), ms=w.rng.uniform(30, 200)).to_dict(),
                    "probe": SourceResult(status="missing", detail="no files in probe/").to_dict(),
                    # NCCL_DEBUG=INFO set by the user's script: NCCL writes to stdout, not the plugin's file
                    "nccl": SourceResult(status="missing", detail="no files in nccl/").to_dict()},
        "ranks": {"0": ranks},
        "window": win.to_dict(),
        "provenance": {k: provenance.describe(k) for k in ("kernel", "fr", "probe", "nccl")},
        "attributed": None,
    }
    write_private(os.path.join(d, "collect.json"), json.dumps(doc, indent=1).encode())
    return len(klog) + fr_bytes


_P: Plan | None = None


def _init(args: tuple) -> None:
    global _P
    _P = plan(*args)


def _write_nodes(job: tuple[str, list[str]]) -> int:
    out, nodes = job
    return sum(write_node(out, _P, n) for n in nodes)


# -- the job's output and the controller's part -------------------------------------------
def output(p: Plan) -> tuple[list[str], list[str]]:
    """(stdout, stderr) of the whole job, every line labelled by srun with its rank."""
    w = p.w
    lines: list[tuple[datetime, int, str, str]] = []

    def say(t: datetime, rank: int | None, texts, stream: str = "stdout") -> None:
        for text in [texts] if isinstance(texts, str) else texts:
            lines.append((t, len(lines), (f"{rank}: " if rank is not None else "") + text, stream))

    t0 = w.start + timedelta(seconds=20)
    n, world = w.n_nodes, p.world
    comm = f"0x{w.rng.getrandbits(48):x}"
    say(t0, 0, fmt_job.nccl(w, w.nodes[0], 0, "", "INFO", f"NCCL version {w.nccl_version}+cuda12.4"))
    for r in range(world):  # NCCL_DEBUG=INFO: every rank's bootstrap and communicator init
        node, l = w.ranks[r], r % GPUS
        ip, ptr, bus = w.ips[node], f"0x{0x55d0a0000000 + r * 0x3a70:x}", f"{GPU_BDFS[l][5:7]}000"
        info = [f"Bootstrap : Using ib0:{ip}<0>",
                "NET/Plugin: No plugin found (libnccl-net.so), using internal implementation",
                f"NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB [2]mlx5_2:1/IB [3]mlx5_3:1/IB ; OOB ib0:{ip}<0>",
                "Using network IB",
                f"comm {ptr} rank {r} nranks {world} cudaDev {l} nvmlDev {l} busId {bus} commId {comm} - Init START",
                f"comm {ptr} rank {r} nRanks {world} nNodes {n} localRanks {GPUS} localRank {l} MNNVL 0",
                f"comm {ptr} rank {r} nranks {world} cudaDev {l} nvmlDev {l} busId {bus} commId {comm} - Init COMPLETE"]
        say(t0 + timedelta(milliseconds=r % 997), r, [fmt_job.nccl(w, node, r, "", "INFO", m) for m in info])
        say(t0 + timedelta(seconds=5), r, f"[rank{r}] world_size={world} local_rank={l} device=cuda:{l} host={node}")
    span = (p.t_fail - t0).total_seconds()
    for i in range(200):  # rank 0's training log
        say(t0 + timedelta(seconds=span * (i + 1) / 201), 0, fmt_job.progress(w, 50 * (i + 1), 3.5 - 2.2 * i / 200))
    bad_node = p.bad_node
    if p.xid:  # the dead rank: its CUDA error, then nothing
        say(p.t_fail + timedelta(seconds=1), p.bad_rank,
            fmt_job.nccl(w, bad_node, p.bad_rank, "", "WARN", "Cuda failure 'unknown error'"))
        frames = fmt_job.TRAIN_FRAMES + [("/opt/venv/lib/python3.11/site-packages/torch/nn/modules/module.py", 1532,
                                          "_wrapped_call_impl", "return self._call_impl(*args, **kwargs)")]
        say(p.t_fail + timedelta(seconds=2), p.bad_rank,
            fmt_job.traceback(frames, "RuntimeError: CUDA error: unknown error") + ADVICE, "stderr")
    for r in p.neighbours():  # IB completions to the dead rank's GPU fail (transport retry exceeded)
        node = w.ranks[r]
        t = p.t_fail + w.secs(0.5, 3)
        say(t, r, [fmt_job.nccl(w, node, r, "transport/net_ib.cc:1295", "WARN",
                                fmt_job.ib_completion(w, w.ips[bad_node], 12, w.ips[node])),
                   fmt_job.nccl(w, node, r, "", "INFO", "transport/net.cc:1128 -> 6")])
    t_dog = p.t_fail + timedelta(seconds=WATCHDOG_S)
    for r in range(world):
        if r == p.bad_rank:
            continue
        on_bad = w.ranks[r] == bad_node
        seq, numel = (p.seq_tp, 4096 * 1024) if on_bad else (p.seq_dp, 1 << 20)
        t = t_dog + timedelta(milliseconds=w.rng.randint(0, 900))
        texts = fmt_job.watchdog_timeout(w, t, r, seq, "ALLREDUCE", numel, WATCHDOG_S * 1000)
        lines.extend((t, len(lines) + i, f"{r}: {x}", "stderr") for i, x in enumerate(texts))
    t_end = t_dog + timedelta(seconds=5)
    say(t_end, None, "srun: Job step aborted: Waiting up to 32 seconds for job step to finish.", "stderr")
    for node in w.nodes:
        mine = w.ranks_on(node)
        if node == bad_node:
            say(t_end + timedelta(seconds=2), None, fmt_job.srun_tasks(w, node, [p.bad_rank], "Exited with exit code 1"), "stderr")
            mine = [r for r in mine if r != p.bad_rank]
        say(t_end + timedelta(seconds=2), None, fmt_job.srun_tasks(w, node, mine, "Aborted (core dumped)"), "stderr")
    lines.sort(key=lambda x: (x[0], x[1]))
    return [x[2] for x in lines if x[3] == "stdout"], [x[2] for x in lines if x[3] == "stderr"]


def write_controller(out: str, p: Plan) -> None:
    """job.json, output tails and scheduler lines through the controller side's own writer,
    from the job's full output files and a slurmctld log staged beside the bundle."""
    w = p.w
    stage = out.rstrip("/") + ".stage"
    os.makedirs(stage, exist_ok=True)
    try:
        stdout, stderr = output(p)
        paths = {}
        uid = os.getuid()
        for name, lines in (("stdout", stdout), ("stderr", stderr)):
            paths[name] = os.path.join(stage, f"slurm-{w.job_id}.{name[3:]}")
            with open(paths[name], "w") as f:
                f.write("\n".join(lines) + "\n")
            try:  # the job's output is its user's file; the controller copies only such a file
                os.chown(paths[name], w.uid, -1)
                uid = w.uid
            except PermissionError:
                pass
        ctld = os.path.join(stage, "slurmctld.log")
        with open(ctld, "w") as f:
            for t, msg in ((w.start - timedelta(seconds=40), f"_slurm_rpc_submit_batch_job: JobId={w.job_id} InitPrio=4294901757 usec=331"),
                           (w.start, f"sched: Allocate JobId={w.job_id} NodeList={fmt_job.hostlist(w.nodes)} "
                                     f"#CPUs={w.n_nodes * 96} Partition=gpu"),
                           (p.end, f"_job_complete: JobId={w.job_id} WEXITSTATUS 1"),
                           (p.end, f"_job_complete: JobId={w.job_id} done")):
                f.write(fmt_job.ctld(t, msg) + "\n")
        iso = lambda t: t.replace(tzinfo=timezone.utc).isoformat(timespec="seconds")  # noqa: E731
        job = {"job_id": w.job_id, "slurm_job_id": w.job_id, "name": "pretrain", "user": w.user, "uid": uid,
               "account": "ml", "partition": "gpu", "nodes": list(w.nodes), "start_time": iso(w.start),
               "end_time": iso(p.end), "exit_code": 1, "signal": 0, "state": "FAILED", "state_source": "sacct",
               "reason": "NonZeroExitCode", "time_limit": "2-00:00:00", "restart_count": 0,
               "num_tasks": p.world, "batch": True, "stdout_path": paths["stdout"], "stderr_path": paths["stderr"]}
        job = write_controller_part(out, job, OUTPUT_CAP, log_paths=[ctld])
        # where the job's output lived (not the staging dir): the same bytes for every `out`
        job.update(stdout_path=f"/home/{w.user}/runs/slurm-{w.job_id}.out", stderr_path=f"/home/{w.user}/runs/slurm-{w.job_id}.err")
        write_private(os.path.join(out, "job.json"), json.dumps(job, indent=1).encode())
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def truth(p: Plan) -> dict:
    if not p.xid:
        return {"cause_not": "gpu_hardware", "nodes": [], "ranks": [], "drain": [], "near_miss_node": p.bad_node,
                "why": "NCCL timeouts and IB errors only: nothing trusted says the node is broken"}
    return {"cause": "gpu_hardware", "nodes": [p.bad_node], "ranks": [p.bad_rank], "drain": [p.bad_node],
            "why": f"Xid 79 on {p.bad_node} ({p.w.gpu_of(p.bad_rank)}): the GPU fell off the bus"}


def generate(out: str, nodes: int, seed: int = 0, entries: int = 2000, xid: bool = True, workers: int = 2) -> dict:
    """Write the bundle into ``out`` (created); returns its truth (also written as truth.json)."""
    p = plan(nodes, seed, entries, xid)
    os.makedirs(out, mode=0o700, exist_ok=True)
    chunks = [p.w.nodes[i:i + 8] for i in range(0, nodes, 8)]
    if workers > 1 and nodes > 8:
        ctx = multiprocessing.get_context("fork")
        with ProcessPoolExecutor(workers, mp_context=ctx, initializer=_init, initargs=((nodes, seed, entries, xid),)) as pool:
            list(pool.map(_write_nodes, [(out, c) for c in chunks]))
    else:
        for c in chunks:
            for n in c:
                write_node(out, p, n)
    write_controller(out, p)
    t = {"case": f"bigjob/{nodes}/{seed}" + ("" if xid else "/near-miss"), "job_id": p.w.job_id, **truth(p)}
    with open(os.path.join(out, "truth.json"), "w") as f:
        json.dump(t, f, indent=1)
    return t


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--nodes", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--entries", type=int, default=2000, help="Flight Recorder ring entries per rank")
    ap.add_argument("--no-xid", action="store_true", help="the near miss: no Xid lines, no CUDA error")
    ap.add_argument("--workers", type=int, default=2)
    a = ap.parse_args(argv)
    t0 = time.monotonic()
    t = generate(a.out, a.nodes, a.seed, a.entries, not a.no_xid, a.workers)
    print(f"wrote {a.nodes} nodes x {GPUS} GPUs to {a.out} in {time.monotonic() - t0:.1f} s: {t}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
