"""The per-node, per-step watcher loop (``python -m slurm_attr.live watch``).

Every ``[live] interval_s``: read the local records, write this node's summary (and, once
a local communicator looks stalled, snapshots of its records) to the spool. The leader
(the step's first node) then reads every node's summary, detects hangs (below the
ceiling, only once the ranks waited for are not busy: hang/busy.py) and writes the findings.
It ends when the step does (its slurmstepd is gone, or the job's evidence dir is) and
never touches the job: it only reads the job's files, at idle CPU priority.
Any error in a cycle is recorded in the summary and the loop goes on.
"""
from __future__ import annotations

import hashlib
import os
import time
from typing import Any, Callable

from .. import safefs
from ..config import Config
from ..errors import UnsafePath
from ..probe.comms import iso
from . import findings, livespool
from .budget import NodeBudget, locked
from .hang import classify
from .hang.busy import LeaderBusy, NodeBusy
from .hang.detect import Tracker, combine
from .hang.frdetect import FrTracker, poll_period
from .host import Host
from .nodeview import LocalStall, current, of_another_step, read_local, read_snapshot, summarize
from .prekill.exchange import LeaderDumps, NodeDumps
from .slow import anomalies as slow
from .stepd import Stepd

MAX_NODES = 8192
STALE_CYCLES = 10  # a summary older than this many intervals: its watcher is gone


class Watcher:
    def __init__(self, cfg: Config, job: str, node: str, jobdir: str, leader: bool = False,
                 nnodes: int = 0, gid: int | None = None, stepd_pid: int | None = None,
                 since_ns: int | None = None,
                 clock: Callable[[], float] = time.monotonic, step: str = "0",
                 end_ns: int | None = None, gpus: int | None = None,
                 show_job: Callable[[str], dict[str, str] | None] | None = None):
        if not livespool.valid_node(node):
            raise ValueError(f"bad node name {node!r}")
        if not livespool.valid_step(step):
            raise ValueError(f"bad step {step!r}")
        self.cfg, self.job, self.node, self.jobdir, self.step = cfg, job, node, jobdir, step
        self.leader, self.nnodes, self.gid, self.clock = leader, nnodes, gid, clock
        self.live_dir = livespool.ensure_job_dir(cfg.paths.spool, job)
        # snapshots from half the lowest threshold on: there for the leader's classification
        floor = min(cfg.live.hang_after_s, cfg.live.hang_floor_s)
        self.local = LocalStall(max(2 * cfg.live.interval_s, floor / 2))
        self.tracker = Tracker(cfg.live.hang_after_s, floor_s=cfg.live.hang_floor_s)
        self.slow = slow.SlowTracker(cfg.live, job, step)  # S1-S3 (slow/anomalies.py)
        self.snap_digest: dict[str, bytes] = {}
        self.stepd = Stepd(stepd_pid) if stepd_pid else None
        self.sum_dir = f"summary/{step}"
        self.step_dir = os.path.join(self.live_dir, "steps", step)  # bundle-shaped snapshots
        self.doc: dict[str, Any] = findings.load_step(cfg.paths.spool, job, step) or {"findings": []}
        self.cycles = 0
        self.yielded: str | None = None  # the step this batch-step watcher steps aside for
        # Records created before this (an earlier step's ranks, frozen where they ended) are
        # left out; None reads them all (a watcher started after its step, as in the tests).
        self.since_ns = since_ns
        # evidence before the kill (prekill/exchange.py): every node serves the leader's dump requests
        # and, for jobs without probe records, polls its ranks' FR for hang/frdetect.py
        # only the ranks of this step answer its watcher (their servers descend from its
        # slurmstepd): worker sockets carry no step, and every step's watcher saw them all
        self.node_dumps = NodeDumps(self.live_dir, job, step, node, jobdir, cfg.live, nnodes,
                                    owner=self.stepd.owns if self.stepd is not None else None,
                                    state_dir=cfg.paths.node_state if self.stepd is not None else None)
        self.fr_poll_s = poll_period(cfg.live.interval_s, cfg.live.hang_after_s)
        self.last_fr: dict[str, Any] = {}
        self.fr_tracker = FrTracker(cfg.live.hang_after_s)
        # a cancel re-reads the job and checks it is still the job's user's run that started
        # before this step's watcher: the user is the evidence dir's owner (the plugin chowns
        # it to them; only root could give it away), the start the plugin's fork of the watcher
        started = since_ns / 1e9 + 2 if since_ns is not None else None
        self.leader_dumps = LeaderDumps(cfg, job, step, self.live_dir, nnodes, end_ns=end_ns, gpus=gpus,
                                        show_job=show_job, uid=self.node_dumps.job_uid(),
                                        started=started, busy=self._busy_now) if leader else None
        # busy is not stuck (hang/busy.py): every node's counters and stacks, the leader's judgement
        self.node_busy = NodeBusy(self.live_dir, job, step, node, jobdir, self.node_dumps.limits)
        self.busy = LeaderBusy(self.live_dir, job, step) if leader else None
        self.last_sums: list[dict[str, Any]] = []

    # ---- the node's part --------------------------------------------------------------
    def node_cycle(self, now: float) -> dict[str, Any]:
        records, problems, sizes = read_local(self.jobdir, self.node)
        # Not this step's to judge: another step's ranks (their header says so), and records
        # made before this watcher started (an earlier step's, frozen where they ended).
        since, ours = self.since_ns, []
        for r in records:
            if of_another_step(r, self.step) or (since is not None and r.create_rt_ns < since):
                sizes.pop(os.path.basename(r.path), None)
            else:
                ours.append(r)
        records = ours
        summary = summarize(self.job, self.node, records, problems)
        summary["seq"] = self.cycles
        if not summary["comms"]:  # no probe records here: the ranks' own FR, where they serve it
            fr = self.node_dumps.poll(now, self.fr_poll_s)
            self.last_fr = fr if fr is not None else self.last_fr
            summary["fr"] = self.last_fr
            # what a rank's answer could not be used for, and why: the leader's coverage
            summary["fr_problems"] = (self.node_dumps.problems + [
                f"rank {r} FR poll: {v['error']}" for r, v in self.last_fr.items()
                if isinstance(v, dict) and v.get("error")])[:10]
        summary["slow"] = slow.node_part(self.jobdir, current(records))  # collective entry times (S1/S3)
        pids = {m["pid"]: m.get("g") for c in summary["comms"] for m in c["members"] if isinstance(m.get("pid"), int)}
        summary["busy"] = self.node_busy.cycle(now, pids, self.node_dumps.job_uid())
        if self.local.update(summary, now):
            summary["snapshots"] = self._snapshot(sizes)
        elif self.snap_digest:
            self._drop_snapshots()  # the stall is over: a later one must not read these
        summary["step"] = self.step
        livespool.write_json(self.live_dir, self.sum_dir, f"{self.node}.json", summary)
        return summary

    def _snapshot(self, sizes: dict[str, int]) -> int:
        """Copy changed records to nodes/<node>/probe (a stalled job's do not change), within
        the node's live budget for the job (they are never dropped for a dump; a record
        that does not fit is not copied)."""
        written = 0
        rel = f"steps/{self.step}/nodes/{self.node}/probe"
        for name, size in sizes.items():
            data = read_snapshot(self.jobdir, name, size)
            if data is None:
                continue
            digest = hashlib.blake2b(data, digest_size=16).digest()
            if self.snap_digest.get(name) == digest:
                continue
            with locked(self.node_dumps.state_dir):
                if NodeBudget.read(self.live_dir, self.node, self.node_dumps.cap).used() + len(data) > self.node_dumps.cap:
                    continue
                livespool.write_atomic(self.live_dir, rel, name, data)
            self.snap_digest[name] = digest
            written += 1
        return written

    # ---- the leader's part ------------------------------------------------------------
    def summaries(self) -> tuple[list[dict[str, Any]], list[str]]:
        out, problems = [], []
        try:
            entries = safefs.list_dir(self.live_dir, self.sum_dir)
        except UnsafePath:
            return [], ["no node summaries yet"]
        now_ns = time.time_ns()
        stale_ns = int(STALE_CYCLES * self.cfg.live.interval_s * 1e9)
        for name, kind in entries[:MAX_NODES]:
            if kind != "file" or not name.endswith(".json") or name.startswith("."):
                continue
            try:
                s = livespool.read_json(self.live_dir, f"{self.sum_dir}/{name}", livespool.SUMMARY_CAP)
            except (UnsafePath, ValueError, OSError) as err:
                problems.append(f"{name}: {err}")
                continue
            if (not isinstance(s, dict) or s.get("job") != self.job or s.get("step") != self.step
                    or not isinstance(s.get("comms"), list)):
                problems.append(f"{name}: not a summary of this job")
                continue
            if isinstance(s.get("now_ns"), int) and now_ns - s["now_ns"] > stale_ns:
                problems.append(f"{s.get('node')}: summary stale (watcher gone?)")
            out.append(s)
        return out, problems

    def leader_cycle(self, now: float) -> list[dict[str, Any]]:
        sums, problems = self.summaries()
        self.last_sums = sums
        new = []
        lb = self.busy
        if lb is not None:
            lb.see(sums)
        hangs = self.tracker.update(sums, now, defer=(lambda h: lb.judge(h.members, now)) if lb else None)
        for hang in hangs:
            f = classify.finding(hang, self.cfg, self.step_dir, self.job)
            f["step"] = self.step
            why = lb.judge(hang.members, now) if lb is not None else None
            if why:  # reported at the ceiling although busy: say so
                f["busy"] = why
            new.append(f)
        noted = self._notes(now)
        relinked = classify.link_cascades(new, self.doc.get("findings", []))
        if not any(s.get("comms") for s in sums):  # no probe anywhere: the FR poll's view
            for f in self.fr_tracker.update(sums, now, self.job):
                f["step"] = self.step
                new.append(f)
        changed = self._prekill([f for f in new if f.get("kind") != "slow"]) or relinked or noted
        new += self.slow.cycle(sums, self.doc)  # S1-S3: new slow findings, standing ones refreshed
        problems += [f"{s.get('node')}: {p}" for s in sums for p in (s.get("fr_problems") or [])[:2]
                     if isinstance(p, str)]
        reporting = f"{len(sums)} of {self.nnodes or '?'} node(s) reporting"
        cov = "; ".join([reporting] + problems[:3])
        if new or changed or cov != self.doc.get("coverage"):
            self.doc["findings"] = self.doc.get("findings", []) + new
            self.doc["coverage"] = cov
            findings.save(self.cfg.paths.spool, self.job, self.step, self.doc, self.gid)
        return new

    def _notes(self, now: float) -> bool:
        """Stalls deferred as busy this cycle into the document's notes (one per stall, the
        latest why), and the suspects' stacks asked; True when the notes changed."""
        if self.busy is None:
            return False
        self.busy.ask(self.tracker.suspects, now)
        notes, changed = self.doc.setdefault("notes", []), False
        for hang, why in self.tracker.notes:
            since = iso(hang.since_wall_ns)
            old = next((n for n in notes if n.get("comm") == hang.comm and n.get("since") == since), None)
            if old is not None and old.get("why") == why:
                continue
            if old is None:
                old = {"comm": hang.comm, "label": hang.label, "since": since, "step": self.step}
                notes.append(old)
            old.update(why=why, quiet_s=hang.quiet_s, threshold_s=hang.threshold_s, ceiling_s=hang.ceiling_s,
                       noted=iso(time.time_ns()))
            changed = True
        del notes[:-findings.MAX_FINDINGS]
        return changed

    def _busy_now(self, f: dict[str, Any]) -> str | None:
        """Why the ranks a finding names are busy now (before on_hang = cancel acts)."""
        if self.busy is None:
            return None
        members = combine(self.last_sums).get(str(f.get("comm")), {}).get("members")
        return self.busy.judge(members, self.clock()) if members else None

    # ---- the loop ---------------------------------------------------------------------
    def step_alive(self) -> bool:
        if not os.path.isdir(self.jobdir):
            return False
        return self.stepd.alive() if self.stepd is not None else True

    def _prekill(self, hangs: list[dict[str, Any]]) -> bool:
        """The leader asks every node for dumps on a new hang or before the job's end, and
        merges their answers into the finding; True when the findings changed."""
        ld = self.leader_dumps
        if ld is None:
            return False
        if ld.open is None and hangs and self.cfg.live.on_hang != "record":
            ld.request("hang", hangs[0])
        ld.facts()
        if ld.open is None and ld.due_before_end(time.time_ns()):
            ld.before_end_done = True
            ld.request("before_end", None)
        return ld.settle(self.doc)

    def yields_to(self) -> str | None:
        """The numbered step whose watcher runs on this node, when this is the batch step's.
        Worker sockets carry no step (nor do probe records whose ranks lost SLURM_STEP_ID), so
        the batch script's watcher and its srun step's would read the same ranks and report,
        dump and cancel twice; the srun step's watchers see all of its nodes, so the batch one
        steps aside while one runs."""
        if self.step != "batch":
            return None
        try:
            steps = safefs.list_dir(self.live_dir, "summary")
        except (UnsafePath, ValueError):
            return None
        fresh_ns = time.time_ns() - int(STALE_CYCLES * self.cfg.live.interval_s * 1e9)
        for name, kind in steps:
            if kind != "dir" or name == self.step or not livespool.valid_step(name):
                continue
            try:  # the spool is root's: only watchers write there
                st = os.lstat(os.path.join(self.live_dir, "summary", name, f"{self.node}.json"))
            except OSError:
                continue
            if st.st_mtime_ns >= fresh_ns:
                return name
        return None

    def cycle(self) -> list[dict[str, Any]]:
        now = self.clock()
        self.cycles += 1
        other = self.yields_to()
        if other is not None:
            if self.yielded != other:  # nothing of ours may look current meanwhile
                self.yielded = other
                self.leave()
            return []
        if self.yielded is not None:  # back from stepping aside: that step's records are not ours
            self.yielded, self.since_ns = None, time.time_ns()
        self.node_cycle(now)
        new = self.leader_cycle(now) if self.leader else []
        if self.node_dumps.serve() is not None and self.leader_dumps is not None:
            # the leader's own node answered in this cycle: one node's job is settled now
            if self.leader_dumps.settle(self.doc):
                findings.save(self.cfg.paths.spool, self.job, self.step, self.doc, self.gid)
        return new

    def run(self, max_cycles: int | None = None) -> None:
        """Watch this step alone until it ends (or ``max_cycles``): the tests' and a hand-started
        watcher's loop; the plugin's watchers run through host.py, which may hold several."""
        h = Host(self.cfg.live.interval_s, lambda a: self, clock=self.clock)
        h.add(self)
        h.run(max_cycles)

    def note(self, text: str) -> None:
        try:
            livespool.write_json(self.live_dir, self.sum_dir, f"{self.node}.err", {"node": self.node, "error": text[:500]})
        except OSError:
            pass

    def leave(self) -> None:
        """The node's summary and snapshots go with the step; the findings stay."""
        for rel in (f"{self.sum_dir}/{self.node}.json", f"{self.sum_dir}/{self.node}.err"):
            try:
                os.unlink(os.path.join(self.live_dir, rel))
            except OSError:
                pass
        self._drop_snapshots()

    def _drop_snapshots(self) -> None:
        snap = os.path.join(self.step_dir, "nodes", self.node, "probe")
        for name in list(self.snap_digest):
            try:
                os.unlink(os.path.join(snap, name))
            except OSError:
                pass
        self.snap_digest.clear()
