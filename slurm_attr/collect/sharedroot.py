"""Which of a job dir's files this node collects, when the evidence root may be shared.

On most sites the evidence root is node-local and every file in the job's dir was written
on this node. Where it is a shared filesystem, every node's epilog sees every rank's
files; each node then collects only the files of the ranks that the trusted rank map
places on it, so no bundle ever holds a file twice:

- Flight Recorder dumps are named by global rank (``nccl_trace_rank_<r>``, as the plugin's
  TORCH_FR_DUMP_TEMP_FILE prefix makes torch name them, with any suffix torch adds);
- probe records by rank (``rank<r>.pid<p>.probe``);
- NCCL debug files by host (``nccl.<host>.<pid>.log``, NCCL's %h.%p): the node's own
  hostname, short or full.

A file whose name says neither (the job may write anything there) goes to the node that
hosts global rank 0, so it is still collected exactly once. With no rank map (opted out,
the plugin absent) the node cannot tell and collects everything, as before.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

_FR = re.compile(r"nccl_trace_rank_(\d+)(?:\D.*)?$")
_PROBE = re.compile(r"rank(\d+)\.pid\d+\.probe$")
_NCCL = re.compile(r"nccl\.(.+)\.\d+\.log$")


@dataclass(frozen=True)
class Ownership:
    ranks: frozenset[int]   # global ranks of any step placed on this node by the rank map
    hosts: frozenset[str]   # this node's host names (short and full)
    has_rank0: bool         # this node hosts global rank 0 of the job's first step

    def keeps(self, kind: str, rel: str) -> bool:
        """Whether this node collects ``rel`` (a path under the job dir, e.g. ``fr/x``)."""
        name = rel.rsplit("/", 1)[-1]
        m = _FR.match(name) if kind == "fr" else _PROBE.match(name) if kind == "probe" else None
        if m:
            return int(m.group(1)) in self.ranks
        if kind == "nccl":
            m = _NCCL.match(name)
            if m:
                host = m.group(1)
                return host in self.hosts or host.split(".", 1)[0] in self.hosts
        return self.has_rank0


# Slurm's special step ids (batch, extern, interactive...) sit at the top of the 32-bit range.
_SPECIAL_STEP = 0xFFFFFFF0


def _step_order(step: str) -> tuple[int, int, str]:
    """Real steps first, lowest id first; the batch and extern steps and odd keys after."""
    if step.isdigit() and int(step) < _SPECIAL_STEP:
        return (0, int(step), step)
    return (1, 0, step)


def ownership(rank_map: dict[str, list[int]], hostname: str) -> Ownership | None:
    """The node's share from its rank map ({step: [ranks]}); None when there is no map."""
    if not rank_map:
        return None
    ranks = frozenset(r for rs in rank_map.values() for r in rs)
    first = min(rank_map, key=_step_order)
    hosts = {hostname, hostname.split(".", 1)[0]} if hostname else set()
    return Ownership(ranks=ranks, hosts=frozenset(hosts), has_rank0=0 in rank_map[first])
