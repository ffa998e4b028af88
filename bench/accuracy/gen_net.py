"""Network and hang classes: IB/RoCE link down, NIC firmware fatal, NCCL IB errors that all name
one peer (no kernel evidence), and a collective hang where every rank waits (comm_hang).

NCCL's lines (net_ib.cc completion errors, async port events, socket errors) and torch's
DistBackendError follow failure-signals.md §5; kernel link lines §4.
"""
from __future__ import annotations

from datetime import datetime, timedelta
from typing import Callable

from . import fmt_job
from .scene import Scene
from .world import HCAS, World


def _ib_errors(s: Scene, t: datetime, bad: str, status: int = 12) -> None:
    """Every other node's ranks lose their connections to ``bad``: completion errors naming
    its address in their NCCL files, torch's remote error on their stderr."""
    w = s.w
    for node in w.others([bad]):
        for r in w.ranks_on(node)[: w.rng.randint(1, 3)]:
            line = fmt_job.ib_completion(w, w.ips[bad], status, w.ips[node])
            src = w.pick(["transport/net_ib.cc:1295"], ["transport/net_ib.cc:1696", "transport/net_ib/p2p.cc:1020"])
            s.nccl_log(node, t + w.secs(0, 2), fmt_job.nccl(w, node, r, src, "WARN", line))
            if w.chance(0.5):
                s.say(t + w.secs(2, 5), r, fmt_job.remote_error(w, r, line), stream="stderr")
    # the bad node's own ranks see their peers vanish, naming several of them
    for r in w.ranks_on(bad)[:2]:
        for peer in w.others([bad])[:2]:
            line = fmt_job.ib_completion(w, w.ips[peer], status, w.ips[bad])
            s.nccl_log(bad, t + w.secs(0, 2), fmt_job.nccl(w, bad, r, "transport/net_ib.cc:1295", "WARN", line))


def _link_failure(w: World, kernel_lines: Callable[[], list[str]], why: str, status: int = 12) -> Scene:
    s = Scene(w)
    bad = w.any_node()
    t = w.start + w.secs(900, 5 * 3600)
    s.training(t)
    s.klog(bad, t - w.secs(0.5, 20), kernel_lines())
    s.protect_kernel.add(bad)
    if w.chance(0.5):
        r = w.ranks_on(bad)[0]
        s.nccl_log(bad, t, fmt_job.nccl(w, bad, r, "", "WARN", "NET/IB : Got async event : port error"))
    _ib_errors(s, t, bad, status)
    s.teardown(t + w.secs(5, 60), [r for r in w.ranks if w.ranks[r] != bad][:1])
    s.finish(t + w.secs(70, 120), "FAILED", 1)
    s.expect("network", [bad], [], [], why)
    return s


def net_ib_link_down(w: World) -> Scene:
    hca = w.rng.choice(HCAS)
    # the IB port as mlx5 reports it, or (held-out) its IPoIB netdev losing carrier
    line = w.pick([f"mlx5_core {hca[0]} {hca[1]}: Port: 1 Link DOWN"], [f"mlx5_core {hca[0]} ibp{int(hca[0][5:7], 16)}s0: Link down"])
    return _link_failure(w, lambda: [line], "the node's IB port went down; every connection to it failed")


def net_roce_link_down(w: World) -> Scene:
    bdf, _ = w.rng.choice(HCAS)
    dev = f"ens{w.rng.randint(1, 9)}f{w.rng.randint(0, 1)}np{w.rng.randint(0, 1)}"
    line = w.pick([f"mlx5_core {bdf} {dev}: Link down"], [f"bnxt_en {bdf} {dev}: NIC Link is Down", f"ice {bdf} {dev}: NIC Link is Down"])
    return _link_failure(w, lambda: [line], "the node's RoCE netdev lost its link")


def net_nic_fatal(w: World) -> Scene:
    bdf, _ = w.rng.choice(HCAS)
    return _link_failure(w, lambda: [f"mlx5_core {bdf}: poll_health:800:(pid 0): Fatal error 1 detected",
                                     f"mlx5_core {bdf}: print_health_info:424:(pid 0): assert_var[0] 0x{w.rng.getrandbits(32):08x}",
                                     f"mlx5_core {bdf}: mlx5_health_try_recover:330:(pid {w.rng.randint(100, 900)}): handling bad device here"],
                         "the HCA's firmware reported a fatal error")


def net_peer_vote(w: World) -> Scene:
    """No kernel line anywhere: NCCL's completion errors on every node name one address."""
    s = _link_failure(w, lambda: [], "IB errors on every other node name this node's address; no kernel evidence")
    s.nccl_info = True  # the bootstrap lines are what maps an address to a host
    return s


def comm_hang(w: World) -> Scene:
    """Every rank entered the same collective and none completed; nothing else is wrong."""
    s = Scene(w)
    t = w.start + w.secs(900, 5 * 3600)
    s.training(t)
    timeout = w.pick([600, 1800], [300, 1200])
    seq = w.rng.randint(100, 90_000)
    op = w.pick(["ALLREDUCE", "_ALLGATHER_BASE"], ["_REDUCE_SCATTER_BASE"])
    tt = t + timedelta(seconds=timeout)
    for r in sorted(w.ranks):
        at = tt + w.secs(0, 0.9)
        s.torch_says(at, r, fmt_job.watchdog_timeout(w, at, r, seq, op, 8388608, timeout * 1000))
        if w.chance(0.2):
            s.torch_says(at + timedelta(seconds=480), r, [
                f"[rank{r}]:[{fmt_job.glog(at + timedelta(seconds=480))} ProcessGroupNCCL.cpp:1595] {fmt_job.pg_tag(w, r)} "
                "ProcessGroupNCCL's watchdog got stuck for 480 seconds without making progress in monitoring enqueued "
                "collectives. This typically indicates a NCCL/CUDA API (e.g., CudaEventDestroy) hang blocking the watchdog, "
                "and could be triggered by another thread holding the GIL inside a CUDA api (for example, CudaEventDestroy), "
                "or other deadlock-prone behaviors."])
    s.teardown(tt + timedelta(seconds=6), [w.any_rank()], "Aborted (core dumped)")
    s.finish(tt + timedelta(seconds=45), "FAILED", 1)
    s.protect_out = True
    s.expect("comm_hang", why="every rank timed out in the same collective (same SeqNum); no node or rank stands out")
    return s


CLASSES = {
    "net_ib_link_down": ("network", net_ib_link_down),
    "net_roce_link_down": ("network", net_roce_link_down),
    "net_nic_fatal": ("network", net_nic_fatal),
    "net_peer_vote": ("network", net_peer_vote),
    "comm_hang_all_ranks": ("comm_hang", comm_hang),
}
