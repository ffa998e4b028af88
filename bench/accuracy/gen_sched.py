"""Scheduler classes: time limit, cancel (one where the cancel precedes the network errors its
teardown causes), preemption, and a node Slurm lost.

Slurm's words (slurmstepd banners, srun's task reports, slurmctld lines) follow
failure-signals.md §7; the job.json state is Slurm's, but may be absent (the collector could not
ask sacct), in which case the job's output or the daemons' lines must carry the truth.
"""
from __future__ import annotations

from datetime import datetime, timedelta

from . import fmt_job
from .scene import Scene
from .world import World


def _teardown_noise(s: Scene, t: datetime, ib: bool = False) -> None:
    """What a killed multi-node job prints after the kill: torchrun's SIGTERM, torch's
    SignalException, NCCL errors as peers vanish (IB flush errors when ``ib``)."""
    w = s.w
    for r in sorted(w.ranks)[: w.rng.randint(1, len(w.ranks))]:
        at = t + w.secs(0.5, 8)
        if w.chance(0.3):
            s.say(at, r, f"torch.distributed.elastic.multiprocessing.api.SignalException: Process {w.pids[r]} got signal: 15", stream="stderr")
        elif w.chance(0.5):
            s.say(at, r, fmt_job.remote_error(w, r), stream="stderr")
    if ib:
        for node in w.nodes:
            peer = w.any_node([node])
            r = w.ranks_on(node)[0]
            line = fmt_job.ib_completion(w, w.ips[peer], w.pick([5, 12], [13]), w.ips[node])
            s.nccl_log(node, t + w.secs(1, 6), fmt_job.nccl(w, node, r, "transport/net_ib.cc:1295", "WARN", line))
            if w.chance(0.5):
                s.say(t + w.secs(2, 7), r, fmt_job.remote_error(w, r, line), stream="stderr")
    s.teardown(t + w.secs(1, 3), [], "")


def _state(s: Scene, state: str, exit_code: int, signal: int, end: datetime) -> None:
    s.finish(end, state, exit_code, signal)
    if s.w.held and s.w.chance(0.25):  # sacct was unreachable: no state in job.json
        for k in ("state", "exit_code", "signal"):
            s.job[k] = None
        s.protect_out = True


def time_limit(w: World) -> Scene:
    s = Scene(w)
    limit = timedelta(hours=w.rng.choice([1, 2, 4, 8, 24]), minutes=w.rng.choice([0, 0, 30]))
    t = w.start + limit
    s.training(t - timedelta(seconds=30))
    s.t_fail = t
    s.slurm_says(t, fmt_job.cancel_banner(w, w.nodes[0], t, "TIME LIMIT"))
    if w.chance(0.5):
        s.slurm_says(t, fmt_job.cancel_banner(w, w.any_node(), t, "TIME LIMIT", step=True))
    s.ctld(t, f"Time limit exhausted for JobId={w.job_id}")
    _teardown_noise(s, t, ib=w.chance(0.3))
    _state(s, "TIMEOUT", 0, w.pick([0, 15]), t + timedelta(seconds=w.rng.randint(5, 40)))
    s.expect("time_limit", why="the job ran out of time; everything after is its teardown")
    return s


def _cancel(w: World, ib: bool, why: str) -> Scene:
    s = Scene(w)
    t = w.start + w.secs(600, 8 * 3600)
    s.training(t - timedelta(seconds=5))
    s.t_fail = t
    s.ctld(t - timedelta(seconds=1), f"_slurm_rpc_kill_job: REQUEST_KILL_JOB JobId={w.job_id} uid {w.uid}")
    s.slurm_says(t, fmt_job.cancel_banner(w, w.nodes[0], t))
    if w.chance(0.6):
        s.slurm_says(t, fmt_job.cancel_banner(w, w.any_node(), t, step=True))
    _teardown_noise(s, t, ib=ib)
    _state(s, w.pick([f"CANCELLED by {w.uid}", "CANCELLED"]), 0, 15, t + timedelta(seconds=w.rng.randint(5, 40)))
    s.expect("cancelled", why=why)
    return s


def cancelled(w: World) -> Scene:
    return _cancel(w, False, "scancel; the errors after it are the teardown")


def cancelled_then_net(w: World) -> Scene:
    return _cancel(w, True, "scancel first; the IB completion errors (flush, retry exceeded) come after it, from the teardown")


def preempted(w: World) -> Scene:
    s = Scene(w)
    t = w.start + w.secs(600, 8 * 3600)
    s.training(t - timedelta(seconds=5))
    s.slurm_says(t, fmt_job.cancel_banner(w, w.nodes[0], t, "PREEMPTION"))
    _teardown_noise(s, t, ib=w.chance(0.3))
    _state(s, "PREEMPTED", 0, 15, t + timedelta(seconds=w.rng.randint(5, 40)))
    s.expect("preempted", why="the job was preempted for a higher-priority one")
    return s


def node_failure(w: World) -> Scene:
    """A node stops answering: no epilog there, Slurm marks it DOWN, the others lose its ranks."""
    s = Scene(w)
    bad = w.any_node()
    t = w.start + w.secs(600, 8 * 3600)
    s.training(t)
    if w.chance(0.7):
        s.absent.add(bad)
    s.ctld(t + timedelta(seconds=w.rng.randint(60, 300)), f"error: Nodes {bad} not responding")
    down = t + timedelta(seconds=w.rng.randint(301, 600))
    s.ctld(down, f"error: Nodes {bad} not responding, setting DOWN")
    s.ctld(down, f"Killing JobId={w.job_id} on failed node {bad}")
    end = s.cascade(t, w.ranks_on(bad), what="")
    s.slurm_says(down, [f"srun: error: Node failure on {bad}",
                        fmt_job.cancel_banner(w, w.any_node([bad]), down, "NODE FAILURE")])
    _state(s, "NODE_FAIL", 0, 0, max(end, down + timedelta(seconds=5)))
    s.noisy = not w.chance(0.2)
    s.protect_sched = True  # slurmctld's lines are what name the lost node
    s.expect("node_failure", [bad], why="Slurm lost the node (NODE_FAIL); nothing finer is known")
    return s


CLASSES = {
    "time_limit": ("time_limit", time_limit),
    "cancelled": ("cancelled", cancelled),
    "cancelled_then_net_errors": ("cancelled", cancelled_then_net),
    "preempted": ("preempted", preempted),
    "node_failure": ("node_failure", node_failure),
}
