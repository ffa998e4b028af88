"""The learned threshold (hang/threshold.py, hang/detect.py) and busy-is-not-stuck (hang/busy.py, hang/procstat.py)
at the default [live] settings: synthetic probe records rewritten every cycle on a virtual
clock, and stand-ins for the ranks' /proc counters and worker-server stacks."""
from __future__ import annotations

import os

import pytest

from slurm_attr.config import Config
from slurm_attr.live import findings
from slurm_attr.live.hang import busy, gpustat, procstat, threshold
from slurm_attr.live.hang.threshold import Gaps, learned
from slurm_attr.live.watcher import Watcher
from slurm_attr.probe.synth import SlotSpec, record_bytes

AR = 4
WORLD = 0x9E3779B97F4A7C15
COMM = f"{WORLD:016x}"
N, PER_NODE = 8, 4


def _tb(*frames: tuple[str, int, str]) -> str:
    return "Thread 0x00007f6253b23040 (most recent call first):\n" + "".join(
        f'  File "{f}", line {ln} in {fn}\n' for f, ln, fn in frames)


SITE = "/opt/venv/lib/python3.11/site-packages"
CKPT = _tb((f"{SITE}/torch/serialization.py", 652, "_save"), (f"{SITE}/torch/serialization.py", 628, "save"),
           ("/home/u/train.py", 90, "save_checkpoint"), ("/home/u/train.py", 150, "<module>"))
STUCK = _tb(("/usr/lib/python3.11/threading.py", 320, "wait"), ("/home/u/train.py", 77, "exchange_state"),
            ("/home/u/train.py", 140, "<module>"))


class Job:
    """8 ranks on two nodes, default Config, one virtual clock; rank r's process is pid
    1000 + r with counters ``cpu[r]``/``io[r]`` and the stack ``stack[r]`` (None: no server)."""

    def __init__(self, tmp, **live):
        self.now = 0.0
        cfg = Config()
        cfg.paths.spool = str(tmp / "spool")
        (tmp / "spool").mkdir()
        for k, v in live.items():
            setattr(cfg.live, k, v)
        self.cfg = cfg
        self.nodes = ["n0", "n1"]
        self.jobdirs = {nd: tmp / f"ev-{nd}" / "9" for nd in self.nodes}
        for d in self.jobdirs.values():
            (d / "probe").mkdir(parents=True)
        self.watchers = [Watcher(cfg, "9", nd, str(self.jobdirs[nd]), leader=(nd == "n0"), nnodes=2,
                                 clock=lambda: self.now, show_job=lambda j: None) for nd in ("n1", "n0")]
        self.cpu, self.io, self.stack = [0] * N, [0] * N, [STUCK] * N
        for w in self.watchers:
            w.node_busy.counters = lambda pid: (procstat.Counters(1, os.getuid(), self.cpu[pid - 1000], self.io[pid - 1000])
                                                if 1000 <= pid < 1000 + N else None)
            w.node_busy.children = lambda pid: []
            w.node_busy.stacks = lambda jobdir, lim, ranks: {g: self.stack[g] for g in ranks if self.stack[g]}

    @property
    def leader(self) -> Watcher:
        return self.watchers[-1]

    def write(self, k: list[int], pend: list[bool]) -> None:
        for r in range(N):
            sp = SlotSpec(comm_hash=WORLD, rank=r, nranks=N, name="world", launched={AR: k[r]}, op_count=k[r],
                          ops=[(o, AR, 1 << 20, 8, -1, o) for o in range(max(0, k[r] - 16), k[r])], digest=k[r],
                          kernel=(AR, k[r] - 1) if pend[r] else None, inflight=3 if pend[r] else 0,
                          api=(k[r],) * 4, last_ns=1 + k[r] * 10_000_000, pop_started=k[r])
            node = self.nodes[r // PER_NODE]
            path = self.jobdirs[node] / "probe" / f"rank{r}.probe"
            path.with_suffix(".tmp").write_bytes(record_bytes(r, [sp], pid=1000 + r, node=node, rt_ns=10**18, mono_ns=1))
            os.replace(path.with_suffix(".tmp"), path)

    def tick(self, k: list[int], pend: list[bool] | None = None, moving: tuple[int, ...] = ()) -> list[dict]:
        """One second: the records as given, the ranks in ``moving`` busy (CPU and storage I/O)."""
        self.now += 1.0
        for r in moving:
            self.cpu[r] += 50
            self.io[r] += 1 << 20
        self.write(k, pend or [True] * N)
        return [f for w in self.watchers for f in w.cycle() if f.get("kind") != "slow"]

    def healthy(self, ticks: int, k0: int = 10) -> int:
        for i in range(ticks):
            assert self.tick([k0 + i] * N, moving=tuple(range(N))) == []
        return k0 + ticks

    def stall(self, k: int, away: int, ticks: int, moving: bool) -> tuple[int, list[dict]]:
        """Rank ``away`` stops before collective k (the others entered it) for up to ``ticks``;
        (the tick the first finding came in, 0 if none; the findings)."""
        ks = [k - 1 if r == away else k for r in range(N)]
        pend = [r != away for r in range(N)]
        for t in range(1, ticks + 1):
            found = self.tick(ks, pend, moving=(away,) if moving else ())
            if found:
                return t, found
        return 0, []


# ---- the learned threshold -----------------------------------------------------------------
def test_gaps_give_margin_times_the_high_quantile_within_floor_and_ceiling():
    g = Gaps()
    for _ in range(threshold.MIN_SAMPLES - 1):
        g.add(2.0)
    assert learned(g, 5.0, 60.0) == 60.0  # too little history: the ceiling
    g.add(2.0)
    assert learned(g, 5.0, 60.0) == pytest.approx(3 * 2.0 if 3 * 2.0 > 5 else 5.0)
    for _ in range(300):  # the ring keeps the last WINDOW; a steady rhythm: the floor
        g.add(0.0)
    assert len(g.ring) == threshold.WINDOW and learned(g, 5.0, 60.0) == 5.0
    for _ in range(30):  # a slower rhythm since: up, but never over the ceiling
        g.add(15.0)
    assert learned(g, 5.0, 60.0) == 45.0 and learned(g, 5.0, 30.0) == 30.0


def test_a_learned_steady_job_is_named_hung_at_the_floor_not_at_hang_after_s(tmp_path):
    job = Job(tmp_path)
    k = job.healthy(20)
    assert job.leader.tracker.threshold(COMM) == 5.0 and job.cfg.live.hang_after_s == 60.0
    ticks, found = job.stall(k, away=5, ticks=70, moving=False)
    assert 5 <= ticks <= 7, ticks
    (f,) = found
    assert (f["class"], f["ranks"], f["threshold_s"]) == ("H1", [5], 5.0) and "busy" not in f


def test_a_job_without_history_waits_for_the_ceiling(tmp_path):
    job = Job(tmp_path)
    k = job.healthy(threshold.MIN_SAMPLES - 5)  # too few gaps learned: hang_after_s
    ticks, found = job.stall(k, away=5, ticks=70, moving=False)
    assert 60 <= ticks <= 62, ticks
    assert found[0]["threshold_s"] == 60.0


def test_a_communicator_whose_collectives_take_4_s_is_not_hung_at_8_s(tmp_path):
    job = Job(tmp_path)
    k = job.healthy(5)
    for i in range(60):  # one collective every 4 s, all ranks inside meanwhile: gaps of 3 s
        assert job.tick([k + i // 4] * N, moving=tuple(range(N))) == []
    k += 15
    assert job.leader.tracker.threshold(COMM) == pytest.approx(9.0)
    for _ in range(8):  # an 8 s collective: slower than any before, still under 3 x 3 s
        assert job.tick([k] * N) == []
    assert job.tick([k + 1] * N, moving=tuple(range(N))) == []
    # learned up: its 7 s without progress is now the p99 (with under 100 gaps, the largest)
    assert job.leader.tracker.threshold(COMM) == pytest.approx(21.0)
    found, ticks = [], 0
    while not found and ticks < 70:  # and one that never completes: a hang at 21 s, not 60
        found, ticks = job.tick([k + 1] * N), ticks + 1
    assert 21 <= ticks <= 23 and found[0]["class"] == "H0", ticks


# ---- busy is not stuck -----------------------------------------------------------------------
def test_a_rank_in_a_checkpoint_whose_counters_move_is_busy_not_hung(tmp_path):
    job = Job(tmp_path)
    k = job.healthy(20)
    job.stack[0] = CKPT
    ticks, found = job.stall(k, away=0, ticks=40, moving=True)  # a 40 s checkpoint, under the ceiling
    assert (ticks, found) == (0, [])
    (note,) = job.leader.doc["notes"]
    assert note["comm"] == COMM and note["why"].startswith("rank 0: checkpoint at ") and "counters moving" in note["why"]
    assert "torch/serialization.py:652 in _save" in note["why"]
    shown = [ln for ln in findings.lines(findings.load(job.cfg.paths.spool, "9")) if ln.startswith("busy")]
    assert len(shown) == 1 and ": rank 0: checkpoint at " in shown[0] and "threshold 5.0 s, reported at 60.0 s" in shown[0]
    assert job.tick([k] * N, moving=tuple(range(N))) == []  # it ends: the job goes on
    # the checkpoint's span is not the communicator's rhythm: the threshold stays at the floor
    job.healthy(3, k + 1)
    assert job.leader.tracker.threshold(COMM) == 5.0


def test_a_checkpoint_judged_busy_does_not_raise_the_ceiling(tmp_path):
    job = Job(tmp_path)
    k = job.healthy(20)
    job.stack[0] = CKPT
    assert job.stall(k, away=0, ticks=33, moving=True) == (0, [])  # a 33 s checkpoint, deferred
    k = job.healthy(20, k + 1)
    assert job.leader.tracker.ceiling(COMM) == 60.0
    ticks, found = job.stall(k, away=0, ticks=80, moving=True)  # the next one lasts: reported at 60 s
    assert 60 <= ticks <= 62 and found[0]["busy"].startswith("rank 0: checkpoint at "), ticks


def test_a_slow_collective_that_ended_still_raises_the_ceiling(tmp_path):
    job = Job(tmp_path)
    k = job.healthy(5)  # too few gaps to learn from: the threshold is the ceiling, 60 s
    for _ in range(33):  # every rank inside one collective for 33 s (nobody idle: never deferred)
        assert job.tick([k] * N) == []
    job.healthy(3, k + 1)
    assert job.leader.tracker.ceiling(COMM) == 4 * 32.0  # 32 s seen without progress, x ADAPT


def test_the_same_stack_with_still_counters_is_a_hang(tmp_path):
    job = Job(tmp_path)
    k = job.healthy(20)
    job.stack[0] = CKPT  # hung in the checkpoint's write: torch.save on the stack, nothing moves
    ticks, found = job.stall(k, away=0, ticks=40, moving=False)
    assert 5 <= ticks <= 7, ticks
    assert found[0]["class"] == "H1" and found[0]["ranks"] == [0] and "busy" not in found[0]


def test_a_checkpoint_that_stops_moving_is_named_then(tmp_path):
    job = Job(tmp_path)
    k = job.healthy(20)
    job.stack[0] = CKPT
    assert job.stall(k, away=0, ticks=20, moving=True) == (0, [])
    ticks, found = job.stall(k, away=0, ticks=40, moving=False)  # the same stall: its counters stop
    assert busy.FROZEN_S <= ticks <= busy.FROZEN_S + 2, ticks
    assert found[0]["ranks"] == [0] and found[0]["quiet_s"] >= 20


def test_a_busy_rank_past_the_ceiling_is_reported_and_says_it_was_busy(tmp_path):
    job = Job(tmp_path)
    k = job.healthy(20)
    job.stack[0] = CKPT
    ticks, found = job.stall(k, away=0, ticks=80, moving=True)
    assert 60 <= ticks <= 62, ticks
    assert found[0]["ranks"] == [0] and found[0]["busy"].startswith("rank 0: checkpoint at ")


def test_without_a_worker_server_moving_counters_are_busy_and_still_ones_stuck(tmp_path):
    job = Job(tmp_path)
    job.stack = [None] * N  # no stacks to be had
    k = job.healthy(20)
    assert job.stall(k, away=3, ticks=30, moving=True) == (0, [])
    assert "storage I/O moving (no stack" in job.leader.doc["notes"][0]["why"]
    (tmp_path / "b").mkdir()
    job2 = Job(tmp_path / "b")
    job2.stack = [None] * N
    k = job2.healthy(20)
    ticks, found = job2.stall(k, away=3, ticks=30, moving=False)
    assert 5 <= ticks <= 7 and found[0]["ranks"] == [3], ticks


@pytest.mark.parametrize("text, kind", [
    (CKPT, "checkpoint"),
    (_tb((f"{SITE}/torch/utils/data/dataloader.py", 1294, "_next_data"), ("/home/u/train.py", 58, "<module>")), "data"),
    (_tb(("/home/u/model.py", 30, "forward"), ("/home/u/train.py", 101, "evaluate"), ("/home/u/train.py", 9, "<module>")),
     "eval"),
    (_tb((f"{SITE}/torch/distributed/distributed_c10d.py", 4159, "barrier"), ("/home/u/train.py", 92, "save_checkpoint"),
         ("/home/u/train.py", 9, "<module>")), "collective"),  # waiting like the others: not busy
    (STUCK, None),
    ("Thread 0x1 (most recent call first):\n  <no Python frame>\n", None),
    ("x" * 5000, None),
])
def test_what_a_stack_says_the_rank_is_doing(text, kind):
    assert busy.stack_kind(text)[0] == kind


def test_a_busy_row_needs_moving_counters_and_a_busy_stack():
    moving = {"still_s": 0.0, "io_still_s": 0.0, "seq": 1, "kind": "checkpoint", "at": "a.py:1 in save"}
    assert busy.rank_busy(moving, False) == "checkpoint at a.py:1 in save, counters moving"
    assert busy.rank_busy({**moving, "still_s": busy.FROZEN_S}, False) is None
    assert busy.rank_busy({**moving, "kind": None}, False) is None  # a stack in nothing busy
    assert busy.rank_busy({**moving, "kind": "collective"}, False) is None
    assert busy.rank_busy({"still_s": 1.0}, True) == "counters moving, its stack asked"
    assert busy.rank_busy({"still_s": 1.0}, False) is None
    assert busy.rank_busy({"still_s": None}, True) is None and busy.rank_busy("x", True) is None


# ---- /proc, read boundedly -------------------------------------------------------------------
def test_proc_stat_is_parsed_from_the_last_parenthesis():
    hostile = b"123 (x) R 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20) S 1 1 1 0 -1 4194560 100 0 0 0 " \
              b"250 50 0 0 20 0 1 0 987654 10 10 18446744073709551615"
    assert procstat.parse_stat(hostile) == (987654, 300)
    assert procstat.parse_stat(b"123 (short) S 1 2") is None and procstat.parse_stat(b"garbage") is None
    io = b"rchar: 999\nwchar: 999\nsyscr: 1\nsyscw: 1\nread_bytes: 4096\nwrite_bytes: 8192\ncancelled_write_bytes: 0\n"
    assert procstat.parse_io(io) == 12288
    assert procstat.parse_io(b"rchar: 1\n") is None and procstat.parse_io(b"read_bytes: x\nwrite_bytes: 1\n") is None


def test_counters_of_a_live_process_and_of_none():
    c = procstat.counters(os.getpid())
    assert c is not None and c.uid == os.getuid() and c.start > 0 and c.cpu_ticks >= 0
    assert procstat.counters(os.getpid()).start == c.start  # the same process: the same identity
    assert procstat.counters(0) is None and procstat.counters(1 << 23) is None and procstat.counters(True) is None


def test_a_node_reads_only_the_jobs_processes_and_answers_only_for_its_own_asked_ranks(tmp_path):
    from slurm_attr.live import livespool
    from slurm_attr.live.dumps import Limits

    uid, asked = os.getuid(), []
    cpu = {1000: 0, 1001: 0, 1500: 0, 2000: 0}
    nb = busy.NodeBusy(str(tmp_path), "9", "0", "n0", str(tmp_path), limits=lambda u: Limits(uid=u),
                       counters=lambda pid: procstat.Counters(1, uid + (pid == 2000), cpu[pid], 0) if pid in cpu else None,
                       children=lambda pid: [1500] if pid == 1000 else [],
                       stacks=lambda jobdir, lim, ranks: asked.append(sorted(ranks)) or {g: CKPT for g in ranks})
    ranks = {1000: 0, 1001: 1, 2000: 5}
    for t in range(1, 4):  # rank 0 waits on its worker (pid 1500), which works; rank 1 is still
        cpu[1500] += 50
        rows = nb.cycle(float(t), ranks, uid)
    assert sorted(rows) == ["1000", "1001"]  # pid 2000 is another user's: never read
    assert rows["1000"]["still_s"] == 0.0 and rows["1001"]["still_s"] is None and asked == []
    livespool.write_json(str(tmp_path), "", busy.req_name("0"), {"job": "9", "seq": 1, "ranks": [
        ["n0", 1000, 0], ["n1", 1001, 1], ["n0", 1001, 7], ["n0", 2000, 5]]})  # theirs, a wrong rank, not the job's
    rows = nb.cycle(4.0, ranks, uid)
    assert asked == [[0]] and rows["1000"]["kind"] == "checkpoint" and rows["1000"]["seq"] == 1
    assert "kind" not in rows["1001"]
    nb.cycle(5.0, ranks, uid)
    assert asked == [[0]]  # a request is answered once


def test_a_real_process_writing_to_storage_moves_and_a_blocked_one_does_not(tmp_path):
    import subprocess
    import sys

    from slurm_attr.live.dumps import Limits

    # the child writes 1 MiB and fsyncs when told, else it blocks reading its stdin
    child = subprocess.Popen([sys.executable, "-c", (
        "import os, sys\n"
        "for line in sys.stdin:\n"
        f"    with open({str(tmp_path / 'ckpt')!r}, 'wb') as f:\n"
        "        f.write(bytes(1 << 20)); f.flush(); os.fsync(f.fileno())\n"
        "    print('ok', flush=True)\n")], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        nb = busy.NodeBusy(str(tmp_path), "9", "0", "n0", str(tmp_path), limits=lambda u: Limits(uid=u))
        ranks = {child.pid: 0}
        assert nb.cycle(1.0, ranks, os.getuid())[str(child.pid)]["still_s"] is None  # first sight: unknown
        child.stdin.write("w\n")
        child.stdin.flush()
        assert child.stdout.readline() == "ok\n"
        row = nb.cycle(2.0, ranks, os.getuid())[str(child.pid)]
        assert (row["still_s"], row["io_still_s"]) == (0.0, 0.0)  # it wrote: moving
        row = nb.cycle(3.0, ranks, os.getuid())[str(child.pid)]
        assert (row["still_s"], row["io_still_s"]) == (1.0, 1.0)  # blocked on its stdin since
        assert nb.cycle(4.0, ranks, os.getuid() + 1) == {}  # another user's process is never read
    finally:
        child.kill()
        child.wait()


def _asked_every_cycle(tmp_path, own_ticks: int) -> dict:
    """A rank asked for its stack every cycle (the leader refreshing a long stall) whose worker
    server's answer costs it 20 CPU ticks and a 4 KiB file write (torch dumps the traceback
    through a file); on its own it moves ``own_ticks`` per cycle. Its node's row after 8 cycles."""
    from slurm_attr.live import livespool
    from slurm_attr.live.dumps import Limits

    uid, cnt = os.getuid(), {"cpu": 0, "io": 0}

    def answer(jobdir, lim, ranks):
        cnt["cpu"] += 20
        cnt["io"] += 4096
        return {g: CKPT for g in ranks}

    nb = busy.NodeBusy(str(tmp_path), "9", "0", "n0", str(tmp_path), limits=lambda u: Limits(uid=u),
                       counters=lambda pid: procstat.Counters(1, uid, cnt["cpu"], cnt["io"]),
                       children=lambda pid: [], stacks=answer, gpu=gpustat.GpuProbe(tool=""))
    row = {}
    for t in range(1, 9):
        livespool.write_json(str(tmp_path), "", busy.req_name("0"), {"job": "9", "seq": t, "ranks": [["n0", 1000, 0]]})
        cnt["cpu"] += own_ticks
        row = nb.cycle(float(t), {1000: 0}, uid)["1000"]
    return row


def test_a_blocked_rank_is_not_moved_by_the_watchers_own_stack_requests(tmp_path):
    row = _asked_every_cycle(tmp_path, own_ticks=0)
    assert row["kind"] == "checkpoint" and row["seq"] == 8
    assert row["still_s"] is None  # never seen moving: what the requests cost it is not its own
    assert busy.rank_busy(row, awaiting=False) is None


def test_a_rank_that_also_moves_on_its_own_while_asked_is_busy(tmp_path):
    row = _asked_every_cycle(tmp_path, own_ticks=50)
    assert row["still_s"] == 0.0 and row["io_still_s"] is None  # CPU of its own; the I/O was ours
    assert busy.rank_busy(row, awaiting=False) == f"checkpoint at {SITE}/torch/serialization.py:652 in _save, counters moving"
