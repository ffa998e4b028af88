"""``python -m slurm_attr.live watch ...``: what the plugin's watcher.c execs, as root,
detached from the step. Exit status is never seen by the job; a bad argument or config
only ends this watcher (the job runs as without it, and the findings' coverage says so).
"""
from __future__ import annotations

import argparse
import os
import sys

from .. import config as config_mod


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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m slurm_attr.live")
    sub = p.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("watch", help="watch one job step on this node")
    w.add_argument("--job", required=True)
    w.add_argument("--node", default=None, help="this node's Slurm name")
    w.add_argument("--nodelist", default=None, help="the step's node list (with --nodeid, instead of --node)")
    w.add_argument("--nodeid", type=int, default=None)
    w.add_argument("--step", default="0", help="the step id (batch, 0, 1, ...)")
    w.add_argument("--jobdir", required=True, help="the job's evidence dir on this node")
    w.add_argument("--leader", action="store_true", help="this node also combines and detects")
    w.add_argument("--nnodes", type=int, default=0)
    w.add_argument("--gid", type=int, default=None, help="the job's group (may read the findings)")
    w.add_argument("--stepd-pid", type=int, default=None, help="end when this process is gone")
    w.add_argument("--config", default=None)
    w.add_argument("--cycles", type=int, default=None, help="stop after N cycles (tests)")
    a = p.parse_args(argv)
    node = a.node
    if node is None and a.nodelist is not None and a.nodeid is not None:
        # the plugin's task context does not know the node's name: the nodeid-th of the list
        from ..slurm.hostlist import expand

        names = expand(a.nodelist)
        node = names[a.nodeid] if 0 <= a.nodeid < len(names) else None
    if node is None:
        p.error("--node, or --nodelist with --nodeid, is required")
    cfg = config_mod.load(a.config)
    if not cfg.live.enabled:
        return 0
    from .watcher import Watcher, process_start_ns

    _quiet_priority()
    # The plugin forks this watcher before its step's first task execs, so every record of the
    # step is newer than this process; older ones are an earlier step's (2 s: boot time's
    # 1 s resolution). Without a plugin (--stepd-pid unset) all records count.
    started = process_start_ns(os.getpid()) if a.stepd_pid is not None else None
    from .prekill import show_job

    # the leader reads the job's EndTime and GPUs from Slurm once (dumps before the end, cancel)
    Watcher(cfg, a.job, node, a.jobdir, leader=a.leader, nnodes=a.nnodes, gid=a.gid,
            stepd_pid=a.stepd_pid, step=a.step, since_ns=started - 2 * 10**9 if started else None,
            show_job=(lambda j: show_job(cfg, j)) if a.leader else None).run(max_cycles=a.cycles)
    return 0


if __name__ == "__main__":
    sys.exit(main())
