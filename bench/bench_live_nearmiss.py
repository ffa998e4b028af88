"""Near misses and hangs for the live watcher at its DEFAULT settings, on a time-scaled harness.

    python3 bench/bench_live_nearmiss.py [--runs 50] [--hang-runs 20] [--scenario a,b,...] [--no-stacks]
        [--gaps] [--cancel]

Each run is an 8-rank job over two nodes (4 ranks each) played on synthetic probe records
(slurm_attr.probe.synth, rewritten before every watcher cycle as the probe would leave
them), with the real watchers (slurm_attr.live.watcher, default Config: hang_after_s 60,
hang_floor_s 5, interval_s 1) on a virtual clock, so a 200 s job plays in about a second.
The ranks' processes are stand-ins too: their CPU and storage-I/O counters (what
hang/procstat.py reads from /proc) and their Python stacks (what the worker server's
``dump_traceback`` answers; none with --no-stacks) follow what each rank is doing. The
watchers' code is the real one from the records on; the job and its processes are
modelled (see ``Job``), each run with its own random draw (seeded by its number).

Near misses (a finding is a false hang; goal 0): checkpoint (rank 0 writes 20-40 s every
40 iterations while the others wait in a barrier), eval (an evaluation phase: metric
all-reduces every 3-4 s with ranks arriving up to 2.5 s apart, then rank 0 computes the
metrics 8-12 s while the others wait), dataload (one rank's data loader stalls 10 s, its
workers reading), longckpt (one 70-90 s checkpoint, past the ceiling: a finding is due at
60 s, marked busy, and with --cancel no scancel), gc (a 2 s pause of one rank every ~15 s), slowdown (the collectives slow
down gradually from 2 per second to one every 8 s). Hangs (latency = finding - onset, in
virtual seconds; goal p90 <= 15 s): H1 (a rank blocks before a collective), H3 (a network
send never completes), H0 (every rank inside, none completes), ckpt_hang (rank 0's
checkpoint write blocks for good: its stack still in torch.save, its counters still).

--no-busy runs them with the learned threshold alone (no busy check): the near misses the
busy check is there for must then give false hangs, or the scenario tests nothing.
--gaps prints each healthy scenario's gap distribution as the tracker learned it (the data
behind hang/threshold.py's QUANTILE and MARGIN). --cancel runs the near misses with
on_hang = cancel and a Slurm stand-in that counts scancels. --cost N: what the busy check
adds to a node's cycle with real processes (hang/procstat.py on 8 live ranks, each a shell
waiting on two children, so every cycle also reads the children: the worst case), CPU per
cycle over N cycles.
"""
from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from slurm_attr.config import Config  # noqa: E402
from slurm_attr.live.hang import procstat  # noqa: E402
from slurm_attr.live.watcher import Watcher  # noqa: E402
from slurm_attr.probe import layout as L  # noqa: E402
from slurm_attr.probe.synth import SlotSpec, record_bytes  # noqa: E402

AR = 4
WORLD = 0x9E3779B97F4A7C15
N, PER_NODE = 8, 4
NEAR = ("checkpoint", "eval", "dataload", "gc", "slowdown", "longckpt")
TMP = "/dev/shm" if os.path.isdir("/dev/shm") else None  # the bench's files: renames on tmpfs are cheap
HANGS = {"H1": "H1", "H3": "H3", "H0": "H0", "ckpt_hang": "H1"}

STACKS = {  # what dump_traceback answers for a rank doing this (innermost frame first, as printed)
    "train": [("/opt/venv/lib/python3.11/site-packages/torch/nn/modules/linear.py", 117, "forward"),
              ("/home/u/train.py", 61, "train_step"), ("/home/u/train.py", 140, "<module>")],
    "checkpoint": [("/opt/venv/lib/python3.11/site-packages/torch/serialization.py", 652, "_save"),
                   ("/opt/venv/lib/python3.11/site-packages/torch/serialization.py", 628, "save"),
                   ("/home/u/train.py", 90, "save_checkpoint"), ("/home/u/train.py", 150, "<module>")],
    "eval": [("/opt/venv/lib/python3.11/site-packages/torch/nn/modules/linear.py", 117, "forward"),
             ("/home/u/train.py", 101, "evaluate"), ("/home/u/train.py", 160, "<module>")],
    "data": [("/usr/lib/python3.11/threading.py", 324, "wait"),
             ("/opt/venv/lib/python3.11/site-packages/torch/utils/data/dataloader.py", 1133, "_get_data"),
             ("/opt/venv/lib/python3.11/site-packages/torch/utils/data/dataloader.py", 1294, "_next_data"),
             ("/home/u/train.py", 58, "train_step"), ("/home/u/train.py", 140, "<module>")],
    "stuck": [("/usr/lib/python3.11/threading.py", 320, "wait"), ("/home/u/train.py", 77, "exchange_state"),
              ("/home/u/train.py", 61, "train_step"), ("/home/u/train.py", 140, "<module>")],
}


def traceback_text(kind: str) -> str:
    frames = STACKS.get(kind, STACKS["train"])
    return "Thread 0x00007f6253b23040 (most recent call first):\n" + "".join(
        f'  File "{f}", line {ln} in {fn}\n' for f, ln, fn in frames)


class Job:
    """One simulated run. ``plan`` is a list of segments, each (seconds, what, args):

    - ("train", rate): every rank pending, rate collectives complete per second;
    - ("away", ranks, activity, cpu, io, kids): those ranks stop before the next collective
      (nothing under way) doing ``activity``; the others entered it and wait; counters move
      as given (kids: its children move instead); it completes at the segment's end;
    - ("rest", activity): every rank computes, nothing under way (an evaluation step);
    - ("slow", gap): every rank pending, one collective completes every ``gap`` seconds;
    - ("hang", kind, rank): the onset of a hang that never ends (H1: rank blocks outside,
      H0: all inside and still, H3: rank's send to its successor across nodes never completes,
      ckpt_hang: rank blocks in its checkpoint's last write, stack still in torch.save, the
      others still in the barrier they entered before it: the stall goes on, only the
      rank's counters stop).
    """

    def __init__(self, root: str, plan: list, stacks: bool = True, cancel: bool = False, busy: bool = True):
        self.plan, self.stacks_on, self.now = plan, stacks, 0.0
        cfg = Config()
        cfg.paths.spool = os.path.join(root, "spool")
        os.makedirs(cfg.paths.spool)
        if cancel:
            cfg.live.on_hang = "cancel"
            cfg.live.ras = "off"
        self.cfg = cfg
        self.nodes = [f"n{i}" for i in range(N // PER_NODE)]
        self.jobdirs = {nd: os.path.join(root, f"ev-{nd}", "77") for nd in self.nodes}
        for d in self.jobdirs.values():
            os.makedirs(os.path.join(d, "probe"))
        self.cancels = 0
        self.watchers = [Watcher(cfg, "77", nd, self.jobdirs[nd], leader=(nd == self.nodes[0]), nnodes=len(self.nodes),
                                 clock=lambda: self.now, show_job=lambda j: None) for nd in reversed(self.nodes)]
        for w in self.watchers:
            if not busy:
                w.busy = None  # the learned threshold alone (--no-busy)
            w.node_busy.counters, w.node_busy.children, w.node_busy.stacks = self.counters, self.children, self.stacks
            if w.leader_dumps is not None:
                w.leader_dumps._slurm = self  # noqa: SLF001 - the bench's Slurm stand-in counts scancels
                w.leader_dumps.end_ns = None
        self.k = [10] * N  # collectives each rank launched
        self.pend = [True] * N
        self.doing = ["train"] * N
        self.cpu = [0] * N
        self.io = [0] * N
        self.kid_cpu = [0] * N
        self.kid_io = [0] * N
        self.link: int | None = None

    # ---- the Slurm and process stand-ins ---------------------------------------------
    def cancel_job(self, job, uid, started):
        self.cancels += 1
        return job

    def counters(self, pid: int):
        uid = os.getuid()
        if 1000 <= pid < 1000 + N:
            r = pid - 1000
            return procstat.Counters(1, uid, self.cpu[r], self.io[r])
        if 5000 <= pid < 5000 + N:
            r = pid - 5000
            return procstat.Counters(1, uid, self.kid_cpu[r], self.kid_io[r])
        return None

    def children(self, pid: int) -> list[int]:
        return [pid - 1000 + 5000] if 1000 <= pid < 1000 + N else []

    def stacks(self, jobdir, lim, ranks):
        return {g: traceback_text(self.doing[g]) for g in ranks} if self.stacks_on else {}

    # ---- the job ----------------------------------------------------------------------
    def write(self) -> None:
        for r in range(N):
            k = self.k[r]
            kw = dict(comm_hash=WORLD, rank=r, nranks=N, name="world", launched={AR: k}, op_count=k,
                      ops=[(o, AR, 1 << 20, 8, -1, o) for o in range(max(0, k - 16), k)], digest=k,
                      kernel=(AR, k - 1) if self.pend[r] else None, inflight=3 if self.pend[r] else 0,
                      api=(k, k, k, k), last_ns=1 + k * 10_000_000, pop_started=k)
            if self.link is not None and self.pend[r]:
                kw.update(self._link(r, k))
            node = self.nodes[r // PER_NODE]
            data = record_bytes(r, [SlotSpec(**kw)], pid=1000 + r, node=node, rt_ns=1_700_000_000 * 10**9, mono_ns=1)
            path = os.path.join(self.jobdirs[node], "probe", f"rank{r}.probe")
            with open(path + ".tmp", "wb") as f:
                f.write(data)
            os.replace(path + ".tmp", path)

    def _link(self, r: int, k: int) -> dict:
        peers = []
        nxt, prv = (r + 1) % N, (r - 1) % N
        if r // PER_NODE != nxt // PER_NODE:
            stuck = r == self.link
            peers.append({"peer": nxt, "kind": L.PK_NET_SEND, "send_posted": 10 * k, "send_done": 10 * k - stuck,
                          "wait": (0, 0, 1, 0, 0, 0) if stuck else (0,) * 6, "last_ch": 1,
                          "last_send_ms": 4000 if stuck else 4990})
        if prv // PER_NODE != r // PER_NODE:
            peers.append({"peer": prv, "kind": L.PK_NET_RECV, "recv_posted": 10 * k, "recv_done": 10 * k - 1,
                          "wait": (0, 0, 0, 1, 0, 0), "last_recv_ms": 4990})
        return {"peers": peers, "in_state": tuple(sum(p.get("wait", (0,) * 6)[i] for p in peers) for i in range(6))}

    def _move(self, r: int, cpu: bool, io: bool, kids: bool = False) -> None:
        if kids:
            self.kid_cpu[r] += 60 * cpu
            self.kid_io[r] += (50 << 20) * io
        else:
            self.cpu[r] += 80 * cpu
            self.io[r] += (200 << 20) * io

    def play(self, until: float) -> tuple[list[tuple[float, dict]], float | None]:
        """Run the plan to its end (or ``until``): (virtual time, finding) pairs and the hang's onset."""
        found: list[tuple[float, dict]] = []
        t0, onset, K, frac = 0.0, None, 10, 0.0
        for seg in self.plan:
            dur, what, args = seg[0], seg[1], seg[2:]
            end = t0 + dur
            pending_done, k0 = False, K
            while self.now < min(end, until):
                self.now += 1.0
                if what == "train":
                    frac += args[0]
                    K += int(frac)
                    frac -= int(frac)
                    self.k, self.pend, self.doing = [K] * N, [True] * N, ["train"] * N
                    for r in range(N):
                        self._move(r, True, False)
                elif what == "slow":
                    K = k0 + int((self.now - t0) / args[0] + 1e-9)
                    self.k, self.pend, self.doing = [K] * N, [True] * N, ["train"] * N
                elif what == "rest":
                    self.k, self.pend, self.doing = [K] * N, [False] * N, [args[0]] * N
                    for r in range(N):
                        self._move(r, True, False)
                elif what == "away":
                    ranks, act, cpu, io, kids = args
                    for r in range(N):
                        away = r in ranks
                        self.k[r], self.pend[r], self.doing[r] = (K if away else K + 1), not away, (act if away else "train")
                        if away:
                            self._move(r, cpu, io, kids)
                    pending_done = True
                elif what == "hang":
                    kind, victim = args
                    onset = t0 if onset is None else onset
                    if kind == "H1" or kind == "ckpt_hang":
                        base = K - 1 if kind == "ckpt_hang" else K  # ckpt_hang: the checkpoint's barrier, still
                        for r in range(N):
                            self.k[r], self.pend[r] = (base if r == victim else base + 1), r != victim
                            self.doing[r] = ("checkpoint" if kind == "ckpt_hang" else "stuck") if r == victim else "train"
                    elif kind == "H0":
                        self.k, self.pend = [K + 1] * N, [True] * N
                    elif kind == "H3":
                        self.link, self.k, self.pend = victim, [K + 1] * N, [True] * N
                self.write()
                for w in self.watchers:
                    found += [(self.now, f) for f in w.cycle() if f.get("kind") != "slow"]
                if onset is not None and found:
                    return found, onset
            if pending_done:
                K += 1
            t0 = end
            if self.now >= until:
                break
        return found, onset


# ---- scenario plans -------------------------------------------------------------------------
def plan(name: str, rng: random.Random) -> list:
    tr = lambda s: (s, "train", rng.uniform(1.6, 2.4))  # noqa: E731 - ~2 iterations a second
    if name == "checkpoint":
        out = [tr(30)]
        for _ in range(3):  # every 40 iterations (~20 s), a 20-40 s checkpoint by rank 0
            out += [(rng.randint(20, 40), "away", (0,), "checkpoint", True, True, False), tr(20)]
        return out
    if name == "longckpt":  # one checkpoint longer than the ceiling (hang_after_s 60): reported, never cancelled
        return [tr(30), (rng.randint(70, 90), "away", (0,), "checkpoint", True, True, False), tr(20)]
    if name == "eval":
        out = [tr(30)]
        for _ in range(8):  # metric all-reduces: ranks compute 3-4 s, arrive up to 2.5 s apart
            late = rng.sample(range(N), rng.randint(1, 3))
            out += [(rng.randint(2, 3), "rest", "eval"), (rng.randint(1, 3), "away", tuple(late), "eval", True, False, False)]
        return out + [(rng.randint(8, 12), "away", (0,), "eval", True, False, False), tr(30)]
    if name == "dataload":
        out = [tr(30)]
        for _ in range(3):  # one rank's loader stalls 10 s: the rank waits on its workers, they read
            out += [(10, "away", (rng.randrange(N),), "data", False, True, True), tr(20)]
        return out
    if name == "gc":
        out = [tr(30)]
        for _ in range(8):
            out += [(2, "away", (rng.randrange(N),), "train", True, False, False), tr(rng.randint(12, 18))]
        return out
    if name == "slowdown":  # one collective every 0.5 s ... 8 s, 25 % slower every 3 collectives
        out, gap = [tr(30)], 0.5
        while gap <= 8:
            out.append((3, "train", 1 / gap) if gap < 1 else (round(3 * gap), "slow", gap))
            gap *= 1.25
        return out + [tr(20)]
    onset_at = rng.uniform(40, 80)
    if name == "ckpt_hang":
        return [tr(onset_at), (rng.randint(20, 40), "away", (0,), "checkpoint", True, True, False), (600, "hang", name, 0)]
    return [tr(onset_at), (600, "hang", name, rng.randrange(N) if name != "H3" else rng.choice((3, 7)))]


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, -int(-q * len(xs) // 1) - 1))]


def near_misses(runs: int, names: list[str], stacks: bool, cancel: bool, gaps: bool, busy: bool = True) -> None:
    for name in names:
        false, cancels, t0, all_gaps, marked = 0, 0, time.monotonic(), [], 0
        notes = 0
        for i in range(runs):
            with tempfile.TemporaryDirectory(dir=TMP) as root:
                job = Job(root, plan(name, random.Random(i)), stacks, cancel, busy)
                found, _ = job.play(1e9)
                false += bool(found)
                marked += any(f.get("busy") for _t, f in found)
                cancels += job.cancels
                leader = job.watchers[-1]
                notes += len(leader.doc.get("notes") or [])
                st = leader.tracker.state.get(f"{WORLD:016x}")
                if gaps and st is not None and st.gaps is not None:
                    all_gaps.append(list(st.gaps.ring))
                for t, f in found[:2] if name != "longckpt" else ():
                    print(f"  {name} run {i}: FALSE HANG at {t:.0f} s: {f['class']} ranks {f['ranks']} "
                          f"quiet {f['quiet_s']} s threshold {f['threshold_s']} s busy {f.get('busy')}", flush=True)
        print(f"near miss {name}{'' if stacks else ' (no worker server)'}{'' if busy else ' (NO busy check)'}: "
              f"{false} of {runs} runs with a false hang"
              f"{f', {cancels} scancels (on_hang = cancel)' if cancel else ''}; {notes} busy notes; "
              f"{marked} findings marked busy; "
              f"{time.monotonic() - t0:.1f} s wall", flush=True)
        if gaps and all_gaps:
            _gap_report(name, all_gaps)


def _gap_report(name: str, runs: list[list[float]]) -> None:
    flat = [g for r in runs for g in r]
    zero = sum(1 for g in flat if g == 0) / len(flat)
    worst = 0.0
    for r in runs:  # each gap against the p99 of the gaps before it (the threshold's base then)
        for j in range(10, len(r)):
            q = _pct(r[:j], 0.99)
            if r[j] > 0:
                worst = max(worst, r[j] / max(q, 1.0))
    print(f"  gaps of {name}: {len(flat)} in {len(runs)} runs, {zero:.1%} zero, p99 {_pct(flat, 0.99):.1f} s, "
          f"max {max(flat):.1f} s; largest gap / p99 of the gaps before it (p99 floored at 1 s): {worst:.2f}", flush=True)


def hangs(runs: int, names: list[str], stacks: bool) -> None:
    for name in names:
        lat, wrong, missed = [], 0, 0
        for i in range(runs):
            with tempfile.TemporaryDirectory(dir=TMP) as root:
                job = Job(root, plan(name, random.Random(1000 + i)), stacks)
                found, onset = job.play(400)
            first = [f for _, f in found if not f.get("behind")]
            if not first or onset is None:
                missed += 1
                print(f"  {name} run {i}: no finding", flush=True)
                continue
            t = next(t for t, f in found if f is first[0])
            lat.append(t - onset)
            wrong += first[0]["class"] != HANGS[name]
            if first[0]["class"] != HANGS[name]:
                print(f"  {name} run {i}: class {first[0]['class']} (expected {HANGS[name]})", flush=True)
        if lat:
            print(f"hang {name}{'' if stacks else ' (no worker server)'}: {len(lat)} of {runs} found, {wrong} misclassified;"
                  f" latency after onset p50 {statistics.median(lat):.1f} s, p90 {_pct(lat, 0.9):.1f} s, "
                  f"max {max(lat):.1f} s (virtual seconds, interval_s 1)", flush=True)
        else:
            print(f"hang {name}: none of {runs} found", flush=True)


def cost(cycles: int) -> None:
    import subprocess

    from slurm_attr.live.hang.busy import NodeBusy

    procs = [subprocess.Popen(["bash", "-c", "sleep 600 & sleep 600 & wait"]) for _ in range(N)]
    try:
        time.sleep(0.5)
        nb = NodeBusy("/nonexistent", "77", "0", "n0", "/nonexistent", limits=None)
        ranks = {p.pid: r for r, p in enumerate(procs)}
        rows = nb.cycle(0.0, ranks, os.getuid())
        c0 = time.process_time()
        for i in range(cycles):
            rows = nb.cycle(float(i + 1), ranks, os.getuid())
        per = (time.process_time() - c0) / cycles
        kids = sum(len(nb.procs[p].kids) for p in nb.procs)
        print(f"busy check, node side, {len(rows)} live ranks ({kids} children read each cycle): {per * 1e3:.3f} ms CPU "
              f"per cycle = {per * 100:.3f} % of one core at interval_s = 1 ({cycles} cycles)", flush=True)
    finally:
        for p in procs:
            p.kill()
            p.wait()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--hang-runs", type=int, default=20)
    ap.add_argument("--scenario", default=",".join(NEAR + tuple(HANGS)))
    ap.add_argument("--no-stacks", action="store_true")
    ap.add_argument("--cancel", action="store_true")
    ap.add_argument("--gaps", action="store_true")
    ap.add_argument("--cost", type=int, default=0)
    ap.add_argument("--no-busy", action="store_true", help="the learned threshold alone: what the busy check prevents")
    a = ap.parse_args()
    if a.cost:
        cost(a.cost)
        return 0
    names = a.scenario.split(",")
    near_misses(a.runs, [n for n in names if n in NEAR], not a.no_stacks, a.cancel, a.gaps, not a.no_busy)
    if a.hang_runs:
        hangs(a.hang_runs, [n for n in names if n in HANGS], not a.no_stacks)
    return 0


if __name__ == "__main__":
    sys.exit(main())
