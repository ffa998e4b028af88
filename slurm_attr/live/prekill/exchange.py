"""Evidence before the kill, the leader's side and the nodes' side of one exchange.

Data flows one way through the spool (root's files, written whole):

    leader: a hang finding, or the job's end within ``[live] dump_before_end_s``
        -> ``<live>/<job>/dumpreq.<step>.json``   {seq, reason, time_ns}
    every node's watcher: a request it has not served
        -> dumps.collect() against its local ranks
        -> ``dumps/<step>/nodes/<node>/fr/nccl_trace_rank_<N>.json``  (bundle-shaped: the
           post-mortem FR reader reads it as it reads an epilog's fr/)
        -> ``dumps/<step>/nodes/<node>/stacks/rank_<N>.txt``
        -> ``dumps/<step>/<node>.json``          what it did, per rank: the stuck line
    leader: every node's result for the request (or a deadline)
        -> the finding gains ``stacks`` (rank N is at FILE:LINE in FUNC) and ``dumps``
        -> ``on_hang = cancel``: scancel, only when the probe's detection and the dumped
           FR/stacks agree, with the GPU-minutes that saves in the finding.

Nothing here reads a file the job wrote except through dumps.py; what the ranks answered
stays untrusted evidence (it names ranks and lines, it never drains).
"""
from __future__ import annotations

import os
import re
import stat
import threading
import time
from datetime import datetime
from typing import Any, Callable

from ... import jsonshape, safefs
from ...collect.jobstate import tres_gpus
from ...config import Config, Live
from ...errors import SattrError, UnsafePath
from ...probe.comms import iso
from ...slurm import from_config
from ...slurm.cancel import CancelRefused
from .. import budget, dumps, livespool
from ..ras import opinion as ras
from ..workerclient import PeerCheck
from .exchangeshape import DumpRequest, NodeHead, NodeResult

REQ_CAP = 64 << 10
RESULT_CAP = 1 << 20
WAIT_S = 30.0  # the leader stops waiting for nodes' results after this long
MAX_STACKS = 64
PROBE_SOURCES = ("snapshot", "summary")  # a finding the native probe detected


def req_name(step: str) -> str:
    return f"dumpreq.{step}.json"


def read_request(live_dir: str, step: str) -> DumpRequest | None:
    """The step's dump request, None when there is none or it is not one (prekillshape)."""
    try:
        return jsonshape.strict(livespool.read_json(live_dir, req_name(step), REQ_CAP), DumpRequest)
    except (UnsafePath, ValueError, OSError, RecursionError):  # msgspec.ValidationError is a ValueError
        return None


def current_seq(live_dir: str, job: str, step: str) -> int:
    req = read_request(live_dir, step)
    return req.seq if req is not None and req.job == job else 0


# ---- the node's side --------------------------------------------------------------------
class NodeDumps:
    """Serves the leader's requests on one node (and polls the ranks' FR for frdetect),
    within the node's budgets: sockets, time and reply bytes held per round (dumps.Limits),
    bytes kept in the live spool for the job (budget.py)."""

    def __init__(self, live_dir: str, job: str, step: str, node: str, jobdir: str,
                 live: Live | None = None, nnodes: int = 1, owner: PeerCheck | None = None,
                 state_dir: str | None = None):
        self.live_dir, self.job, self.step, self.node, self.jobdir = live_dir, job, step, node, jobdir
        self.state_dir = state_dir  # node-local: where the node's budget lock lives
        self.live = live or Live()
        self.cap = budget.share(self.live.job_cap_bytes, self.live.node_cap_bytes, nnodes)
        self.owner = owner
        self.last_poll = float("-inf")
        self.problems: list[str] = []  # the last poll's, for the node's summary
        self.done_seq = current_seq(live_dir, job, step)  # a request from before this watcher is stale

    def job_uid(self) -> int | None:
        """The job's user: the owner of its evidence dir (the plugin chowns it to them)."""
        try:
            st = os.lstat(self.jobdir)
        except OSError:
            return None
        return st.st_uid if stat.S_ISDIR(st.st_mode) else None

    def limits(self, uid: int) -> dumps.Limits:
        # a quarter of the watcher's memory for replies held at once (128 MiB by default): the
        # rest is the interpreter, a decoded reply (frjson's object cap) and its other steps
        return dumps.Limits(uid=uid, max_sockets=self.live.max_sockets, timeout_s=self.live.collect_timeout_s,
                            held_cap=max(dumps.FR_CAP, self.live.watcher_mem_bytes // 4), owner=self.owner)

    def pending(self) -> DumpRequest | None:
        req = read_request(self.live_dir, self.step)
        return req if req is not None and req.job == self.job and req.seq > self.done_seq else None

    def serve(self) -> dict[str, Any] | None:
        """Collect once for a new request; the result as written (None: nothing asked)."""
        req = self.pending()
        if req is None:
            return None
        self.done_seq = req.seq
        uid = self.job_uid()
        base = f"dumps/{self.step}"
        rel = f"{base}/nodes/{self.node}"
        fresh: set[str] = set()  # this collection's files
        dropped: list[str] = []
        last = {"used": 0}

        def save(kind: str, rank: int, data: bytes | bytearray) -> str | None:
            sub, name = ("fr", f"nccl_trace_rank_{rank}.json") if kind == "fr" else ("stacks", f"rank_{rank}.txt")
            with budget.locked(self.state_dir):  # other steps' watchers on this node write too
                kept = budget.NodeBudget.read(self.live_dir, self.node, self.cap, fresh)
                room = kept.room_for(f"{rel}/{sub}/{name}", len(data))
                dropped.extend(kept.dropped)
                if room:
                    livespool.write_atomic(self.live_dir, f"{rel}/{sub}", name, data)
                    kept.wrote(f"{rel}/{sub}/{name}", len(data), time.time_ns())
                    fresh.add(f"{rel}/{sub}/{name}")
                last["used"] = kept.used()
            if not room:
                return (f"not kept: {len(data)} bytes over this node's live budget for the job "
                        f"({last['used']} of {self.cap} bytes used)")
            return None

        res: dict[str, Any] = {"job": self.job, "node": self.node, "seq": req.seq, "reason": req.reason}
        if uid is None:
            res["error"] = "no job dir"
        else:
            res.update(dumps.collect(self.jobdir, self.limits(uid), save))
        res["budget"] = {"cap": self.cap, "used": last["used"], "dropped": dropped[:20]}
        res["time_ns"] = time.time_ns()
        livespool.write_json(self.live_dir, base, f"{self.node}.json", res)
        return res

    def poll(self, now: float, period: float) -> dict[str, Any] | None:
        """Every ``period`` seconds: rank -> FR status or why not (None between polls / no
        servers); ``self.problems`` says what was wrong with the socket directory."""
        if now - self.last_poll < period:
            return None
        self.last_poll = now
        uid = self.job_uid()
        if uid is None:
            return None
        got, self.problems = dumps.poll_fr(self.jobdir, self.limits(uid))
        return {str(r): v for r, v in got.items()}


# ---- the leader's side ------------------------------------------------------------------
def job_facts(show: dict[str, str] | None) -> tuple[int | None, int]:
    """(end time in ns, GPUs) from `scontrol show job` fields; None when unknown."""
    if not show:
        return None, 0
    end_ns = None
    end = show.get("EndTime", "")
    if re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d", end):
        end_ns = int(datetime.fromisoformat(end).timestamp() * 1e9)  # scontrol prints local time
    gpus = 0
    for key in ("AllocTRES", "TRES"):
        gpus = tres_gpus(show.get(key)) or 0
        if gpus:
            break
    return end_ns, gpus


class LeaderDumps:
    def __init__(self, cfg: Config, job: str, step: str, live_dir: str, nnodes: int,
                 end_ns: int | None = None, gpus: int | None = None,
                 show_job: Callable[[str], dict[str, str] | None] | None = None,
                 slurm: Any = None, uid: int | None = None, started: float | None = None,
                 busy: Callable[[dict[str, Any]], str | None] | None = None):
        self.cfg, self.job, self.step, self.live_dir, self.nnodes = cfg, job, step, live_dir, nnodes
        self.busy = busy  # why the finding's ranks are busy now (hang/busy.py): no cancel then
        self.end_ns, self.gpus = end_ns, gpus
        self._show = show_job
        # What cancels (a SlurmAccess; from the config when first needed) and what it checks the
        # job's fresh record against: the job's user (given, else Slurm's answer at the start,
        # _lookup) and when this watcher started, which a later run of the same id cannot match.
        self._slurm = slurm
        self.uid, self.started = uid, time.time() if started is None else started
        self.seq = current_seq(live_dir, job, step)
        self.open: dict[str, Any] | None = None  # the request being answered
        self.before_end_done = False
        self._facts_read = end_ns is not None

    def facts(self) -> None:
        """EndTime and GPUs, read from Slurm once (when not given at start), in a thread: a
        slow slurmctld must not delay a cycle. ``show_job`` is ``prekill.show_job`` bound to
        the config in the real watcher (__main__); without it (tests, a watcher given its end
        time) nothing is asked."""
        if self._facts_read:
            return
        self._facts_read = True
        if self._show is None or (self.cfg.live.dump_before_end_s <= 0 and self.cfg.live.on_hang != "cancel"):
            return
        threading.Thread(target=self._lookup, name="sattr-endtime", daemon=True).start()

    def _lookup(self) -> None:
        try:
            show = self._show(self.job) if self._show else None
        except Exception:  # noqa: BLE001 - no EndTime: no before-end dump, nothing else lost
            show = None
        end_ns, gpus = job_facts(show)
        self.end_ns = self.end_ns or end_ns
        self.gpus = gpus if self.gpus is None else self.gpus
        rec = show or {}
        m = re.fullmatch(r"[^()]*\((\d+)\)", rec.get("UserId", ""))
        if self.uid is None and m and rec.get("JobId") == self.job:  # the job's user, as it started
            self.uid = int(m.group(1))

    def request(self, reason: str, finding: dict[str, Any] | None) -> None:
        self.seq += 1
        now_ns = time.time_ns()
        livespool.write_json(self.live_dir, "", req_name(self.step),
                         {"job": self.job, "step": self.step, "seq": self.seq, "reason": reason, "time_ns": now_ns})
        self.open = {"seq": self.seq, "reason": reason, "time_ns": now_ns, "finding": finding,
                     "t0": time.monotonic()}

    def due_before_end(self, now_ns: int) -> bool:
        b = self.cfg.live.dump_before_end_s
        return (b > 0 and not self.before_end_done and self.end_ns is not None
                and now_ns >= self.end_ns - int(b * 1e9))

    def results(self, seq: int) -> list[dict[str, Any]]:
        try:
            entries = safefs.list_dir(self.live_dir, f"dumps/{self.step}")
        except UnsafePath:
            return []
        out = []
        for name, kind in entries:
            if kind != "file" or not name.endswith(".json") or name.startswith("."):
                continue
            try:
                r = livespool.read_json(self.live_dir, f"dumps/{self.step}/{name}", RESULT_CAP)
                head = jsonshape.strict(r, NodeHead)
            except (UnsafePath, ValueError, OSError, RecursionError):  # ValidationError: not a result
                continue
            if head.seq == seq and head.job == self.job:
                out.append(r)
        return out

    def settle(self, doc: dict[str, Any]) -> bool:
        """Merge the open request's node results once all nodes answered (or WAIT_S went
        by); True when the document changed."""
        if self.open is None:
            return False
        res = self.results(self.open["seq"])
        waited = time.monotonic() - self.open["t0"]
        if len(res) < max(1, self.nnodes) and waited < WAIT_S:
            return False
        req, self.open = self.open, None
        summary = summarize(res, req, self.nnodes)
        f = req["finding"]
        if f is None:
            doc.setdefault("dumps", []).append(summary)
            doc["dumps"] = doc["dumps"][-20:]
            return True
        f["dumps"] = {k: v for k, v in summary.items() if k != "stacks"}
        f["stacks"] = summary["stacks"]
        if self.cfg.live.on_hang == "cancel":
            f["cancel"] = self.cancel(f, res)
        return True

    def cancel(self, f: dict[str, Any], res: list[dict[str, Any]]) -> dict[str, Any]:
        """scancel only when two sources agree: the probe saw no progress, and the ranks'
        own FR shows a collective under way (or their stacks are inside torch.distributed)
        or NCCL's RAS sees that communicator stuck (ras/opinion.py; asked with ``[live] ras = auto``,
        bounded by ``ras_timeout_s``). ``sources`` and ``ras`` record who agreed and what RAS said."""
        busy = self.busy(f) if self.busy is not None else None
        if busy:  # busy is not stuck, whatever the threshold said: never cancel a working rank
            return {"done": False, "why": f"withheld: busy, not stuck ({busy})"[:300]}
        why = agreement(f, res)
        ras_why, ras_said = (ras.second_opinion(self.cfg.live, self.live_dir, self.step, f)
                             if f.get("source") in PROBE_SOURCES else (None, None))
        sources = [name for name, ok in (("probe", True), ("dumps", why), ("ras", ras_why)) if ok]
        if why is None and ras_why is None:
            out = {"done": False, "why": "withheld: one source only (the probe's detection, or the FR "
                                         "poll, without the other agreeing)"}
            return out if ras_said is None else {**out, "ras": ras_said}
        why = "; ".join(w for w in (why, ras_why) if w)
        now_ns = time.time_ns()
        left_s = max(0.0, (self.end_ns - now_ns) / 1e9) if self.end_ns else None
        gpus = self.gpus or 0
        out: dict[str, Any] = {"why": why, "sources": sources, "ras": ras_said,
                               "gpus": gpus, "remaining_s": round(left_s, 1) if left_s is not None else None,
                               "gpu_minutes_saved": round(gpus * left_s / 60, 1) if left_s is not None else None,
                               "reason": f"slurm-attr: cancelled hung job ({f.get('class')} {f.get('what')}); {why}"[:300]}
        try:  # re-read from Slurm and checked first; an array task by ARRAYJOBID_TASKID, never the array
            self._slurm = self._slurm or from_config(self.cfg, timeout=15.0)
            out["target"] = self._slurm.cancel_job(self.job, self.uid, self.started)
            out["done"] = True
        except CancelRefused as err:
            out["done"], out["refused"] = False, str(err)[:200]
        except SattrError as err:
            out["done"], out["error"] = False, str(err)[:200]
        return out


def show_job(cfg: Config, job: str) -> dict[str, str] | None:
    return from_config(cfg, timeout=15.0).show_job(job)


def agreement(f: dict[str, Any], res: list[dict[str, Any]]) -> str | None:
    """Why the dumps agree with a probe-detected hang, None when they do not (or the
    finding did not come from the probe)."""
    if f.get("source") not in PROBE_SOURCES:
        return None
    pending = in_torch = 0
    for r in node_results(res):
        for rr in r.ranks.values():
            if rr.fr is not None and any(enq > comp for enq, comp in rr.fr.pg.values()):
                pending += 1
            if rr.stack is not None and "/torch/distributed/" in str(rr.stack.inner or ""):
                in_torch += 1
    if pending:
        return f"Flight Recorder: {pending} rank(s) with a collective enqueued and not completed"
    if in_torch:
        return f"stacks: {in_torch} rank(s) inside torch.distributed"
    return None


def node_results(res: list[Any]) -> list[NodeResult]:
    """The nodes' results as their shape (prekillshape): the results are ours, their content
    the ranks'; a result that is not an object is left out, a bad field of one reads as absent."""
    out = []
    for r in res:
        try:
            out.append(jsonshape.lenient(r, NodeResult))
        except jsonshape.ValidationError:
            continue
    return out


def summarize(res: list[dict[str, Any]], req: dict[str, Any], nnodes: int) -> dict[str, Any]:
    stacks, fr_ranks, pipes, errors, dropped, pushed = [], [], 0, [], [], []
    done_ns = 0
    for r in sorted(node_results(res), key=lambda x: x.node):
        node = r.node
        done_ns = max(done_ns, r.time_ns)
        pushed += [f"{node}: removed to make room: {d}"[:200] for d in r.budget.dropped[:5]]
        pipes += sum(1 for v in r.pipes.values() if v == "sent")
        for rank, rr in sorted(r.ranks.items(), key=lambda kv: int(kv[0]) if kv[0].isdigit() else -1):
            if not rank.isdigit():
                continue
            if rr.fr is not None:
                fr_ranks.append(int(rank))
            if rr.stack is not None and rr.stack.at is not None and len(stacks) < MAX_STACKS:
                stacks.append({"rank": int(rank), "node": node, "at": rr.stack.at[:300],
                               "inner": str(rr.stack.inner or "")[:300]})
            for msg in (rr.stack_error, rr.fr_error):
                if msg:
                    errors.append(f"rank {rank}: {msg}"[:200])
            for msg, what in ((rr.fr_dropped, "FR"), (rr.stack_dropped, "stack")):
                if msg:
                    dropped.append(f"{node}: {what} of rank {rank} {msg}"[:200])
    latency = round((done_ns - req["time_ns"]) / 1e9, 3) if done_ns else None
    return {"seq": req["seq"], "reason": req["reason"], "requested": iso(req["time_ns"]),
            "nodes_answered": len(res), "nodes": nnodes, "pipes_sent": pipes, "fr_ranks": sorted(fr_ranks),
            "latency_s": latency, "errors": errors[:10], "dropped": (dropped + pushed)[:10], "stacks": stacks}
