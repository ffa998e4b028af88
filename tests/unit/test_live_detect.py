"""Live watch on synthetic probe records rewritten every cycle as a running job would: the
aggregation across nodes, hang detection and classification (H1 non-entry, H3 link stall),
and the near misses (a slow job that progresses, a communicator at rest, a late rank)."""
from __future__ import annotations

import os
import re
import stat

import pytest

from slurm_attr.config import Config
from slurm_attr.live import findings
from slurm_attr.live.nodeview import STEP_UNSET, of_another_step
from slurm_attr.live.watcher import Watcher
from slurm_attr.probe import layout as L
from slurm_attr.probe.record import parse_header
from slurm_attr.probe.synth import SlotSpec, record_bytes

AR = 4
WORLD = 0x9E3779B97F4A7C15
RT0 = 1_700_000_000_000_000_000
JOB = "55"


def spec(r: int, n: int, k: int, **kw) -> SlotSpec:
    """Rank r after launching k AllReduce, the last (seq k-1) on the GPU."""
    base = dict(comm_hash=WORLD, rank=r, nranks=n, name="world", launched={AR: k}, op_count=k,
                ops=[(o, AR, 1 << 20, 8, -1, o) for o in range(max(0, k - 16), k)], digest=k,
                kernel=(AR, k - 1), inflight=3, api=(k, k, k, k), last_ns=1 + k * 10_000_000,
                pop_started=k)
    base.update(kw)
    return SlotSpec(**base)


class Sim:
    """n ranks over two nodes (own evidence dirs, one spool), a watcher per node, one clock."""

    def __init__(self, tmp, n: int = 8, per_node: int = 4, hang_after: float = 10.0):
        self.n, self.per_node, self.now = n, per_node, 0.0
        self.step_id = 0  # each rank's SLURM_STEP_ID, as its record carries it
        cfg = Config()
        cfg.paths.spool = str(tmp / "spool")
        (tmp / "spool").mkdir()
        cfg.live.hang_after_s, cfg.live.interval_s = hang_after, 1.0
        self.cfg = cfg
        self.nodes = [f"n{i}" for i in range(n // per_node)]
        self.jobdirs = {nd: tmp / f"evidence-{nd}" / JOB for nd in self.nodes}
        for d in self.jobdirs.values():
            (d / "probe").mkdir(parents=True)
        # non-leaders first: the leader reads the summaries they wrote this cycle
        self.watchers = [Watcher(cfg, JOB, nd, str(self.jobdirs[nd]), leader=(nd == self.nodes[0]),
                                 nnodes=len(self.nodes), clock=lambda: self.now)
                         for nd in reversed(self.nodes)]

    def node_of(self, r: int) -> str:
        return self.nodes[r // self.per_node]

    def write(self, kw_of) -> None:
        for r in range(self.n):
            data = record_bytes(r, [spec(r, self.n, **kw_of(r))], pid=100 + r, node=self.node_of(r),
                                rt_ns=RT0, mono_ns=1, step_id=self.step_id)
            name = f"rank{r}.probe" if self.step_id == 0 else f"rank{r}.s{self.step_id}.probe"
            path = self.jobdirs[self.node_of(r)] / "probe" / name
            tmp = path.with_suffix(".tmp")
            tmp.write_bytes(data)
            os.replace(tmp, path)

    def tick(self, dt: float = 1.0) -> list[dict]:
        self.now += dt
        out = []
        for w in self.watchers:
            out += w.cycle()
        return out

    def run(self, ticks: int, kw_of=None) -> list[dict]:
        found = []
        for _ in range(ticks):
            if kw_of is not None:
                self.write(kw_of)
            found += self.tick()
        return found


def _healthy(sim: Sim, ticks: int = 5, start: int = 10) -> int:
    k = start
    for _ in range(ticks):
        sim.write(lambda r, k=k: {"k": k})
        assert sim.tick() == []
        k += 1
    return k


# ---- H1: one rank never enters -------------------------------------------------------------
def test_non_entry_is_detected_classified_and_stored(tmp_path):
    sim = Sim(tmp_path)
    k = _healthy(sim)
    # rank 5 stops before AllReduce #k; everyone else launched it and waits on the GPU
    sim.write(lambda r: {"k": k, "inflight": 0} if r == 5 else {"k": k + 1})
    found = []
    ticks = 0
    while not found and ticks < 30:
        found = sim.tick()
        ticks += 1
    assert 10 <= ticks <= 12, ticks  # hang_after_s = 10, one-second cycles
    (f,) = found
    assert (f["class"], f["cause"], f["ranks"], f["nodes"], f["source"]) == ("H1", "rank_stuck", [5], ["n1"], "snapshot")
    assert f["waiting_ranks"] == [0, 1, 2, 3, 4, 6, 7]
    # stored for `sattr JOB`: root's, readable by the job's group only, one line a person reads
    path = tmp_path / "spool" / "live" / JOB / "finding.0.json"
    st = os.stat(path)
    assert stat.S_IMODE(st.st_mode) == 0o640 and st.st_uid == os.geteuid()
    (line,) = findings.lines(findings.load(sim.cfg.paths.spool, JOB))[:1]
    assert re.match(rf"hang detected \d\d:\d\d:\d\d: rank 5 never entered AllReduce #{k} \[H1, world [0-9a-f]{{16}}\]"
                    r"; ranks waiting since \d\d:\d\d:\d\d$", line), line
    # the same stall is reported once, not every cycle
    assert sim.run(20) == []


def test_a_rank_late_by_one_collective_that_catches_up_is_no_hang(tmp_path):
    sim = Sim(tmp_path)
    k = _healthy(sim)
    # rank 5 is one collective behind for 8 s (under the 10 s threshold), then catches up
    sim.write(lambda r: {"k": k, "inflight": 0} if r == 5 else {"k": k + 1})
    assert sim.run(8) == []
    snaps = tmp_path / "spool" / "live" / JOB / "steps" / "0" / "nodes"
    assert len(list(snaps.glob("*/probe/*.probe"))) == 8  # suspected after 5 s: snapshots taken
    assert _healthy(sim, ticks=20, start=k + 1) and sim.run(0) == []
    assert list(snaps.glob("*/probe/*.probe")) == []  # over: a later stall must not read them


# ---- H3: a link stops completing ---------------------------------------------------------------
def _link(r: int, n: int, per_node: int, stuck_src: int | None, k: int) -> dict:
    """Ring sends r -> r+1 over the network across nodes; stuck_src's send never completes."""
    peers = []
    nxt, prv = (r + 1) % n, (r - 1) % n
    if r // per_node != nxt // per_node:
        stuck = r == stuck_src
        peers.append({"peer": nxt, "kind": L.PK_NET_SEND, "send_posted": 10 * k, "send_done": 10 * k - stuck,
                      "wait": (0, 0, 1, 0, 0, 0) if stuck else (0,) * 6, "last_ch": 1,
                      "last_send_ms": 4000 if stuck else 4990})
    if prv // per_node != r // per_node:
        peers.append({"peer": prv, "kind": L.PK_NET_RECV, "recv_posted": 10 * k, "recv_done": 10 * k - 1,
                      "wait": (0, 0, 0, 1, 0, 0), "last_recv_ms": 4990})
    return dict(k=k, peers=peers,
                in_state=tuple(sum(p.get("wait", (0,) * 6)[i] for p in peers) for i in range(6)))


def test_link_stall_names_both_ends(tmp_path):
    sim = Sim(tmp_path)
    k = _healthy(sim)
    sim.write(lambda r: _link(r, 8, 4, 3, k))
    found = sim.run(15)
    (f,) = found
    assert (f["class"], f["cause"], f["ranks"], f["nodes"]) == ("H3", "network", [3, 4], ["n0", "n1"])
    assert "rank 3 (n0) -> rank 4 (n1): network sends never completed" in findings.headline(f)


def test_link_traffic_that_keeps_moving_is_no_hang(tmp_path):
    sim = Sim(tmp_path)
    k = _healthy(sim)
    # the same picture (a send waiting on the network) but the counters move every cycle
    for i in range(30):
        sim.write(lambda r, i=i: _link(r, 8, 4, 3, k + i))
        assert sim.tick() == []


# ---- slow but progressing, at rest, adaptive --------------------------------------------------------
def test_slow_progress_and_rest_are_no_hang(tmp_path):
    sim = Sim(tmp_path)
    k = _healthy(sim)
    # one collective every 3 s (kernels always in flight): slow, but never 10 s without progress
    for i in range(60):
        sim.write(lambda r, i=i: {"k": k + i // 3})
        assert sim.tick() == []
    # then a long compute phase: nothing under way, nobody behind, for 5 x the threshold
    sim.write(lambda r: {"k": k + 20, "inflight": 0})
    assert sim.run(50) == []


def test_threshold_adapts_to_the_longest_collective(tmp_path):
    sim = Sim(tmp_path)
    k = _healthy(sim)
    # an 8 s collective (under 10 s) ends: the threshold becomes 4 x 8 = 32 s
    assert sim.run(8) == []
    k = _healthy(sim, ticks=2, start=k + 1)
    assert sim.watchers[-1].tracker.threshold(f"{WORLD:016x}") == pytest.approx(32.0, abs=1.0)
    # a 20 s collective is no longer a hang (and raises the threshold to 80 s) ...
    assert sim.run(20) == []
    k = _healthy(sim, ticks=2, start=k + 1)
    assert sim.watchers[-1].tracker.threshold(f"{WORLD:016x}") == pytest.approx(80.0, abs=4.0)
    # ... and one that stays stuck past it is: every rank entered, none completes (H0)
    found, ticks = [], 0
    while not found and ticks < 120:
        found, ticks = sim.tick(), ticks + 1
    assert 76 <= ticks <= 84, ticks
    assert len(found) == 1 and found[0]["class"] == "H0" and found[0]["ranks"] == []
    assert found[0]["nodes"] == ["n0", "n1"]


# ---- hostile records ------------------------------------------------------------------------------
def test_garbage_and_symlinks_in_the_probe_dir_do_not_stop_the_watch(tmp_path):
    sim = Sim(tmp_path)
    k = _healthy(sim)
    pdir = sim.jobdirs["n1"] / "probe"
    (pdir / "junk.probe").write_bytes(b"\xff" * 9000)
    os.symlink("/etc/shadow", pdir / "evil.probe")
    os.mkfifo(pdir / "fifo.probe")
    sim.write(lambda r: {"k": k, "inflight": 0} if r == 5 else {"k": k + 1})
    found = sim.run(12)
    assert [f["ranks"] for f in found] == [[5]]
    summary = (tmp_path / "spool" / "live" / JOB / "summary" / "0" / "n1.json").read_text()
    assert "junk.probe" in summary and "evil.probe" in summary
    assert not (tmp_path / "spool" / "live" / JOB / "steps" / "0" / "nodes" / "n1" / "probe" / "evil.probe").exists()


def test_a_restarted_workers_old_record_is_no_hang(tmp_path):
    """torchrun restarted rank 5: its old process's file stays, frozen inside a collective of
    a communicator nobody uses any more; the new process (newer record) runs on."""
    sim = Sim(tmp_path)
    old = record_bytes(5, [spec(5, 8, 7, comm_hash=0x1234)], pid=99, node="n1", rt_ns=RT0 - 10**12, mono_ns=1)
    (sim.jobdirs["n1"] / "probe" / "rank5.old.probe").write_bytes(old)
    k = _healthy(sim)
    assert _healthy(sim, ticks=30, start=k) and sim.run(0) == []
    # near miss: without a newer process of rank 5 the old file counts again (and so does
    # the world communicator, whose records nobody rewrites any more)
    (sim.jobdirs["n1"] / "probe" / "rank5.probe").unlink()
    found = sim.run(15)
    assert sorted(f["comm"] for f in found) == ["0000000000001234", f"{WORLD:016x}"]


# ---- records of an earlier step, and the batch step's watcher beside an srun step ----------
def _frozen_step(sim: Sim, rt_ns: int) -> None:
    """An earlier step's ranks (other global ranks: a smaller step's), killed inside
    AllReduce #7 of a communicator of their own."""
    for r in range(sim.n):
        old = record_bytes(r + 100, [spec(r, sim.n, 7, comm_hash=0x5151)], pid=50 + r, node=sim.node_of(r),
                           rt_ns=rt_ns, mono_ns=1)
        (sim.jobdirs[sim.node_of(r)] / "probe" / f"rank{r}.step0.probe").write_bytes(old)


def test_a_watcher_leaves_out_the_records_of_steps_before_its_own(tmp_path):
    sim = Sim(tmp_path)
    _frozen_step(sim, RT0 - 600 * 10**9)  # ten minutes before this step began
    for w in sim.watchers:
        w.since_ns = RT0 - 2 * 10**9  # what __main__ gives a watcher the plugin started
    k = _healthy(sim)
    assert _healthy(sim, ticks=30, start=k) and sim.run(0) == []
    # near miss: a watcher reading every record (since_ns None) calls the frozen step a hang
    for w in sim.watchers:
        w.since_ns = None
    found, k = [], k + 30
    for k in range(k, k + 15):
        sim.write(lambda r, k=k: {"k": k})
        found += sim.tick()
    assert [f["comm"] for f in found] == ["0000000000005151"]


def test_the_batch_steps_watcher_steps_aside_while_an_srun_step_watches_its_node(tmp_path):
    sim = Sim(tmp_path)
    n0 = sim.nodes[0]
    # the batch script's watcher on the first node: the same probe dir as the srun step's
    batch = Watcher(sim.cfg, JOB, n0, str(sim.jobdirs[n0]), leader=True, nnodes=1,
                    clock=lambda: sim.now, step="batch")
    sim.watchers.append(batch)
    k = _healthy(sim)
    sim.write(lambda r: {"k": k, "inflight": 0} if r == 5 else {"k": k + 1})
    found = sim.run(15)
    assert [(f["class"], f["step"]) for f in found] == [("H1", "0")]  # once, by step 0's leader
    live = tmp_path / "spool" / "live" / JOB
    assert not (live / "finding.batch.json").exists() and not (live / "summary" / "batch" / f"{n0}.json").exists()
    assert batch.yielded == "0"
    # the srun step ends (its watchers leave): the batch watcher reads again, but not the
    # records that step left behind, frozen where it was killed
    for w in sim.watchers[:-1]:
        w.leave()
    sim.watchers = [batch]
    assert sim.run(20) == [] and batch.yielded is None and batch.since_ns is not None
    assert (live / "summary" / "batch" / f"{n0}.json").exists()
    # near miss: a batch-step watcher alone (no srun step) watches the ranks it sees: ranks the
    # batch script started itself, whose env has no SLURM_STEP_ID (Slurm sets none there)
    (tmp_path / "solo").mkdir()
    solo = Sim(tmp_path / "solo", per_node=8)
    solo.step_id = STEP_UNSET
    solo.watchers = [Watcher(solo.cfg, JOB, solo.nodes[0], str(solo.jobdirs[solo.nodes[0]]), leader=True,
                             nnodes=1, clock=lambda: solo.now, step="batch")]
    k = _healthy(solo)
    solo.write(lambda r: {"k": k, "inflight": 0} if r == 5 else {"k": k + 1})
    assert [(f["class"], f["step"], f["ranks"]) for f in solo.run(15)] == [("H1", "batch", [5])]


def test_two_steps_on_the_same_nodes_each_judge_their_own_ranks(tmp_path):
    """`srun A & srun B & wait`: both steps' ranks write into the job's probe dir of each node.
    Step 1's rank 5 stops entering: step 1's watchers report it, step 0's (healthy) do not."""
    sim = Sim(tmp_path)
    step1 = [Watcher(sim.cfg, JOB, nd, str(sim.jobdirs[nd]), leader=(nd == sim.nodes[0]),
                     nnodes=len(sim.nodes), clock=lambda: sim.now, step="1")
             for nd in reversed(sim.nodes)]
    sim.watchers += step1

    def both(kw0, kw1):
        sim.step_id = 0
        sim.write(kw0)
        sim.step_id = 1
        sim.write(kw1)

    for k in range(10, 15):
        both(lambda r, k=k: {"k": k}, lambda r, k=k: {"k": k})
        assert sim.tick() == []
    found = []
    for i in range(15):
        k = 15 + i
        both(lambda r, k=k: {"k": k}, lambda r: {"k": 14, "inflight": 0} if r == 5 else {"k": 15})
        found += sim.tick()
    assert [(f["class"], f["step"], f["ranks"]) for f in found] == [("H1", "1", [5])]
    # a record without a step (a launcher that cleared the env) is no other step's: it stays
    sim.step_id = STEP_UNSET
    sim.write(lambda r: {"k": 30})
    # the second node's dir holds 12 records now: 4 of each step and 4 without one
    assert len(list((sim.jobdirs["n1"] / "probe").iterdir())) == 12
    for w in (sim.watchers[0], step1[0]):  # step 0's and step 1's watcher there
        assert w.node_cycle(sim.now)["ranks"] == [4, 4, 5, 5, 6, 6, 7, 7]  # its own 4, the 4 unset


@pytest.mark.parametrize("step_id,step,other", [
    (1, "1", False), (1, "0", True), (0, "1", True),            # numbered steps
    (0xFFFFFFFB, "batch", False), (0, "batch", True),           # SLURM_BATCH_SCRIPT
    (0xFFFFFFFB, "0", True), (0xFFFFFFFA, "batch", True),       # an interactive step's ranks
    (STEP_UNSET, "0", False), (STEP_UNSET, "batch", False),     # no SLURM_STEP_ID: not known
])
def test_which_records_name_another_step(step_id, step, other):
    rec = parse_header(record_bytes(0, [], step_id=step_id), "probe/x", "n0")
    assert of_another_step(rec, step) is other
