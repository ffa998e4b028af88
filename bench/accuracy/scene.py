"""A generated incident before it is written: timed lines per source, scheduler facts, and the
ground truth written first (what a generator claims happened).

A generator builds one Scene from a World; ``writer.write`` renders it as a bundle (DESIGN §3).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Callable, Iterable

from . import fmt_job, fmt_kernel
from .world import World


@dataclass
class Truth:
    """What the verdict should say. Empty lists: nothing to check (no culprit expected)."""

    cause: str
    nodes: list[str] = field(default_factory=list)
    ranks: list[int] = field(default_factory=list)
    drain: list[str] = field(default_factory=list)
    why: str = ""
    cause_not: str | None = None  # fixtures, context lines: "anything but this cause"
    not_root: str | None = None  # near-miss rule lines: "this rule's symptom is no root"
    accept: list[str] = field(default_factory=list)  # other causes that also pass (an echo alone: unknown)

    def to_dict(self) -> dict:
        d = {"cause": self.cause, "nodes": self.nodes, "ranks": self.ranks, "drain": self.drain, "why": self.why}
        for key in ("cause_not", "not_root", "accept"):
            if getattr(self, key):
                d[key] = getattr(self, key)
        return d


@dataclass
class Line:
    t: datetime
    seq: int
    text: str
    stream: str = "stdout"


class Scene:
    """Timed lines per source. Times are the true times; writer applies each node's clock."""

    def __init__(self, w: World) -> None:
        self.w = w
        self._seq = 0
        self.out: list[Line] = []
        self.kernel: dict[str, list[Line]] = {n: [] for n in w.nodes}
        self.journal: dict[str, list[Line]] = {}
        self.nccl: dict[str, list[Line]] = {}
        self.sched: list[Line] = []
        self.fr: dict[str, list[tuple[str | bytes, str]]] = {}  # (real dump's path, or derived bytes; file name)
        self.job: dict = {"job_id": w.job_id, "user": w.user, "partition": w.pick(["gpu"], ["batch", "h100"]),
                          "nodes": list(w.nodes), "ranks": {str(r): n for r, n in w.ranks.items()},
                          "start_time": w.start.isoformat(), "state": "FAILED", "exit_code": 1, "signal": 0}
        self.end: datetime | None = None
        self.t_fail: datetime | None = None  # when the failure that ended the job happened
        self.truth = Truth(cause="unknown")
        self.protect_out = False  # the truth needs the job's output
        self.protect_kernel: set[str] = set()  # the truth needs these nodes' kernel logs
        self.absent: set[str] = set()  # nodes whose epilog never reported (no directory)
        self.ranks_from_output = True  # the expected ranks are knowable only from the output
        self.protect_sched = False  # the truth needs the daemons' lines
        self.nccl_info = w.chance(0.5)  # NCCL_DEBUG=INFO: bootstrap lines map addresses to hosts
        self.noisy = True

    # -- adding lines --------------------------------------------------------------------
    def _next(self) -> int:
        self._seq += 1
        return self._seq

    def say(self, t: datetime, rank: int | None, texts: str | Iterable[str], stream: str = "stdout") -> None:
        """Lines a rank printed; the launcher's prefix is added (srun -l, torchrun)."""
        for text in [texts] if isinstance(texts, str) else texts:
            self.out.append(Line(t, self._next(), self._prefix(rank) + text, stream))

    def _prefix(self, rank: int | None) -> str:
        style = self.w.prefix
        if rank is None or style == "none":
            return ""
        if style == "label":
            return f"{rank}: "
        if style == "rank":
            return f"[rank{rank}]: "
        if style == "default":  # older torchrun --tee: role + local rank
            return f"[default{self.w.local_rank(rank)}]:"
        return f"{rank}: [rank{rank}]: "

    def torch_says(self, t: datetime, rank: int, texts: Iterable[str]) -> None:
        """C++ torch lines: they carry their own "[rankN]:" (new) so only srun's label is added."""
        label = f"{rank}: " if self.w.prefix in ("label", "both") else ""
        for text in texts:
            self.out.append(Line(t, self._next(), label + text, "stderr"))

    def slurm_says(self, t: datetime, texts: str | Iterable[str]) -> None:
        """srun/slurmstepd lines: unlabelled, on the job's stderr."""
        for text in [texts] if isinstance(texts, str) else texts:
            self.out.append(Line(t, self._next(), text, "stderr"))

    def klog(self, node: str, t: datetime, msgs: str | Iterable[str]) -> None:
        for i, msg in enumerate([msgs] if isinstance(msgs, str) else msgs):
            self.kernel.setdefault(node, []).append(Line(t + timedelta(microseconds=i * 137), self._next(), msg))

    def jlog(self, node: str, t: datetime, unit: str, msg: str) -> None:
        self.journal.setdefault(node, []).append(Line(t, self._next(), f"{unit}: {msg}"))

    def nccl_log(self, node: str, t: datetime, text: str) -> None:
        self.nccl.setdefault(node, []).append(Line(t, self._next(), text))

    def ctld(self, t: datetime, msg: str, daemon: str = "slurmctld") -> None:
        self.sched.append(Line(t, self._next(), f"{daemon}.log: {fmt_job.ctld(t, msg)}"))

    # -- common stretches ----------------------------------------------------------------
    def training(self, until: datetime, loss_to: float = 1.2) -> None:
        """Healthy progress lines from rank 0 (and a few others) up to ``until``."""
        w = self.w
        span = (until - w.start).total_seconds()
        n = w.rng.randint(6, 24)
        step0 = w.rng.randint(0, 5000)
        self.say(w.start + timedelta(seconds=3), 0, f"NCCL version {w.nccl_version}+cuda12.{w.rng.randint(1, 4)}")
        for i in range(n):
            t = w.start + timedelta(seconds=span * (i + 1) / (n + 1))
            loss = 3.5 - (3.5 - loss_to) * (i + 1) / n + w.rng.uniform(-0.05, 0.05)
            self.say(t, 0 if w.chance(0.7) else w.any_rank(), fmt_job.progress(w, step0 + i * 50, loss))

    def finish(self, end: datetime, state: str, exit_code: int = 0, signal: int = 0) -> None:
        self.end = end
        self.job.update({"end_time": end.replace(microsecond=0).isoformat(), "state": state,
                         "exit_code": exit_code, "signal": signal})

    def expect(self, cause: str, nodes: Iterable[str] = (), ranks: Iterable[int] = (), drain: Iterable[str] = (),
               why: str = "") -> None:
        self.truth = Truth(cause, sorted(set(nodes)), sorted(set(ranks)), sorted(set(drain)), why)

    def cascade(self, t0: datetime, culprits: Iterable[int], timeout_s: int | None = None,
                what: str = "Exited with exit code 1") -> datetime:
        """What the healthy ranks print after one rank or node is gone: watchdog timeouts (or
        ncclRemoteError), NCCL socket errors naming the dead peer, torchrun/srun teardown.
        Returns when the last of it was printed."""
        w = self.w
        bad = set(culprits)
        bad_nodes = {w.ranks[r] for r in bad}
        timeout_s = timeout_s or w.pick([600, 1800], [300, 1200])
        seq, op = w.rng.randint(100, 90_000), w.pick(["ALLREDUCE", "_ALLGATHER_BASE"], ["_REDUCE_SCATTER_BASE", "ALLTOALL_BASE"])
        numel = w.rng.choice([50331648, 8388608, 1048576])
        watchdog = w.chance(0.6)
        t_end = t0 + timedelta(seconds=timeout_s + 5 if watchdog else 8)
        for r in sorted(w.ranks):
            if r in bad:
                continue
            t = t0 + (timedelta(seconds=timeout_s, milliseconds=w.rng.randint(0, 900)) if watchdog else w.secs(1, 6))
            if watchdog:
                self.torch_says(t, r, fmt_job.watchdog_timeout(w, t, r, seq, op, numel, timeout_s * 1000))
            elif w.chance(0.5):
                self.say(t, r, fmt_job.remote_error(w, r), stream="stderr")
        dead = sorted(bad_nodes)[0]
        ib_cascade = w.chance(0.3)  # the survivors' queue pairs to the dead ranks time out (retry exceeded)
        for node in w.others(list(bad_nodes))[:3]:
            r = w.ranks_on(node)[0]
            port = w.rng.randint(30_000, 60_000)
            if ib_cascade:
                msg = "NET/IB : " + fmt_job.ib_completion(w, w.ips[dead], 12, w.ips[node]).split("NET/IB : ", 1)[1]
                self.nccl_log(node, t0 + w.secs(0.5, 3), fmt_job.nccl(w, node, r, "transport/net_ib.cc:1295", "WARN", msg))
            else:
                self.nccl_log(node, t0 + w.secs(0.5, 3), fmt_job.nccl(
                    w, node, r, "misc/socket.cc:49", "WARN", f"socketProgress: Connection closed by remote peer {w.short(dead)}<{port}>"))
            self.nccl_log(node, t0 + w.secs(3, 4), fmt_job.nccl(w, node, r, "", "INFO", "misc/socket.cc:750 -> 6"))
        if w.chance(0.25):  # the driver cleans up the channels of the ranks srun kills (Xid 45, any node)
            for node in w.others(list(bad_nodes))[:2]:
                r = w.ranks_on(node)[0]
                self.klog(node, t_end + w.secs(30, 40), fmt_kernel.xid(w, w.gpu_of(r), 45, "Ch 00000010", w.pids[r]))
        self.teardown(t_end, bad, what)
        return t_end + timedelta(seconds=35)

    def teardown(self, t: datetime, failed: Iterable[int], what: str = "Exited with exit code 1") -> None:
        """srun's report of the tasks: the failed ones with ``what`` (none if empty), the rest terminated."""
        w = self.w
        failed = set(failed)
        if w.chance(0.4):
            self.slurm_says(t, fmt_job.torchrun_sigterm(w, t, w.rng.randint(2000, 90_000)))
        self.slurm_says(t + timedelta(seconds=1), "srun: Job step aborted: Waiting up to 32 seconds for job step to finish.")
        for node in w.nodes:
            mine = w.ranks_on(node)
            bad = [r for r in mine if r in failed]
            if bad and what:
                self.slurm_says(t + timedelta(seconds=2), fmt_job.srun_tasks(w, node, bad, what))
            rest = [r for r in mine if r not in failed]
            if rest:
                self.slurm_says(t + timedelta(seconds=33), fmt_job.srun_tasks(w, node, rest, w.pick(["Terminated"], ["Killed"])))


Generator = Callable[[World], Scene]
