"""Which rank an NCCL channel line speaks for, and which rank is the other end.

`Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/0` is printed by the sender (rank 0 sends to 1);
the `[receive]` form by the receiver, with the sender still on the left. A regex cannot swap the
two, so the refiner does: the symptom's rank is always the rank that printed the line, peer_rank
the other end, dev the transport that carries the connection.
"""
from __future__ import annotations

from typing import Mapping, Optional

from slurm_attr.model import Symptom


def channel_ends(sym: Symptom, groups: Mapping[str, str]) -> Optional[Symptom]:
    """Make rank the printing rank: the right-hand rank of a [receive] line."""
    if groups.get("op") == "receive":
        left, right = sym.rank, sym.fields.get("peer_rank")
        if isinstance(right, int):
            sym.rank = right
        if isinstance(left, int):
            sym.fields["peer_rank"] = left
    return sym


REFINERS = {"channel_ends": channel_ends}
