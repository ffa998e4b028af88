"""``python -m slurm_attr.live watch ...``: what the plugin's watcher.c execs, as root,
detached from the step. Exit status is never seen by the job; a bad argument or config
only ends this watcher (the job runs as without it, and the findings' coverage says so).
"""
from __future__ import annotations

import argparse
import os
import resource
import sys

from .. import config as config_mod
from . import livespool
from .host import Host, Slots, StepArgs


def _quiet_priority() -> None:
    """Idle CPU class and lowest nice: the job's ranks always run first."""
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):
        pass
    try:
        os.nice(19)
    except OSError:
        pass


def _step_id(step: str) -> int:
    """The step's number in Slurm's names (the stepd socket): batch and interactive are the
    special values slurm.h gives them."""
    return {"batch": 0xFFFFFFFB, "interactive": 0xFFFFFFFA}.get(step) or int(step)


def _memory_cap(limit: int) -> None:
    """The watcher's data segment (RLIMIT_DATA: heap and private mappings, not the address
    space reserved and never used): a reply past what workerclient and frjson admit would
    end in MemoryError inside one cycle, which the host catches, not in the node's memory."""
    try:
        resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
    except (ValueError, OSError):
        pass


def _args(a: argparse.Namespace, p: argparse.ArgumentParser) -> StepArgs:
    if a.stepd_pid is not None:
        # Started by the plugin: the node is the one slurmstepd itself names (its stepd
        # socket), never the job's environment, which the user may have set.
        from .stepd import Stepd, process_start_ns

        node = Stepd(a.stepd_pid).node_name(a.job, _step_id(a.step))
        if node is None:
            p.exit(1, f"slurm_attr.live: job {a.job} step {a.step}: this node's name is not in slurmstepd "
                      f"{a.stepd_pid}'s socket; not watching\n")
        # The plugin forks this watcher before its step's first task execs, so every record of
        # the step is newer than this process; older ones are an earlier step's (2 s: boot
        # time's 1 s resolution).
        started = process_start_ns(os.getpid())
        since = started - 2 * 10**9 if started else None
    else:
        node, since = a.node, None
        if node is None:
            p.error("--node is required without --stepd-pid")
    if not livespool.valid_node(node or ""):
        p.error(f"bad node name {node!r}")
    return StepArgs(job=a.job, node=node, step=a.step, jobdir=a.jobdir, leader=a.leader, nnodes=a.nnodes,
                    gid=a.gid, stepd_pid=a.stepd_pid, since_ns=since)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m slurm_attr.live")
    sub = p.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("watch", help="watch one job step on this node")
    w.add_argument("--job", required=True)
    w.add_argument("--node", default=None, help="this node's Slurm name (a watcher started by hand)")
    w.add_argument("--nodelist", default=None, help=argparse.SUPPRESS)  # older plugins pass it; unused
    w.add_argument("--nodeid", type=int, default=None)
    w.add_argument("--step", default="0", help="the step id (batch, 0, 1, ...)")
    w.add_argument("--jobdir", required=True, help="the job's evidence dir on this node")
    w.add_argument("--leader", action="store_true", help="this node also combines and detects")
    w.add_argument("--nnodes", type=int, default=0)
    w.add_argument("--gid", type=int, default=None, help="the job's group (may read the findings)")
    w.add_argument("--stepd-pid", type=int, default=None, help="the step's slurmstepd: its node, its ranks, its end")
    w.add_argument("--config", default=None)
    w.add_argument("--cycles", type=int, default=None, help="stop after N cycles (tests)")
    a = p.parse_args(argv)
    if not (livespool.valid_job(a.job) and livespool.valid_step(a.step)):
        p.error("bad --job or --step")
    cfg = config_mod.load(a.config)
    if not cfg.live.enabled:
        return 0
    args = _args(a, p)
    slots = Slots(cfg.paths.node_state, cfg.live.max_watchers)
    if slots.take(wait_s=2 * cfg.live.interval_s) is None:
        slots.enqueue(args)  # a running watcher adopts the step
        if slots.take() is None:  # unless every host ended meanwhile: then this one hosts
            return 0
        args = None
    _quiet_priority()
    _memory_cap(cfg.live.watcher_mem_bytes)
    from .prekill.exchange import show_job
    from .watcher import Watcher

    def make(s: StepArgs) -> Watcher:
        # the leader reads the job's EndTime and GPUs from Slurm once (dumps before the end, cancel)
        return Watcher(cfg, s.job, s.node, s.jobdir, leader=s.leader, nnodes=s.nnodes, gid=s.gid,
                       stepd_pid=s.stepd_pid, step=s.step, since_ns=s.since_ns,
                       show_job=(lambda j: show_job(cfg, j)) if s.leader else None)

    host = Host(cfg.live.interval_s, make, slots, cfg.live.steps_per_watcher)
    try:
        if args is not None:
            host.add(make(args))
        host.run(max_cycles=a.cycles)
    finally:
        slots.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
