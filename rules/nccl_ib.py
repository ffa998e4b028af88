"""InfiniBand work-completion status codes: a failed path versus a flush after it."""
from __future__ import annotations

from typing import Mapping, Optional

from slurm_attr.model import Symptom

# ibv_wc_status values that only report work flushed after the queue pair already failed.
_FLUSH = {5}  # IBV_WC_WR_FLUSH_ERR


def ib_status(sym: Symptom, groups: Mapping[str, str]) -> Optional[Symptom]:
    """A flushed work request follows an earlier error on the same queue pair: cascade."""
    if sym.fields.get("status") in _FLUSH:
        sym.role = "cascade"
    return sym


REFINERS = {"ib_status": ib_status}
