"""The shape of NCCL's RAS report in its JSON form (``SET FORMAT json``, 2.28.7+), as
rasreport reads it: only the fields it uses; every other field NCCL writes is skipped.

The writer is NCCL (any process on the node could answer the socket): unknown fields are
ignored, never refused, since each NCCL release adds some. Read with ``jsonshape.lenient``:
a communicator without a usable ``hash``, or a rank entry without a usable ``rank``, is one
dropped entry (``dropped`` counts them, rasreport decodes each entry alone); any other
field of the wrong type or out of bounds reads as absent, as it did before the shapes.
"""
from __future__ import annotations

from typing import Annotated, Any, Optional

import msgspec

MAX_INT = 1 << 62

# A count, rank, size or pid: a non-negative int under 2^62 (bools are not ints here).
Count = Annotated[int, msgspec.Meta(ge=0, lt=MAX_INT)]
# "0x27a079b828ff1a75" (json, 0x%lx); rasreport.norm_hash makes it 16 lower-case digits
Hash = Annotated[str, msgspec.Meta(pattern=r"^\s*(?:0[xX])?[0-9a-fA-F]{1,16}\s*$")]


class RankStatus(msgspec.Struct):
    init_state: Optional[Count] = None  # an ncclResult_t: 0 success, 7 in progress
    async_error: Optional[Count] = None
    abort_flag: bool = False
    finalize_called: bool = False
    destroy_flag: bool = False


class Rank(msgspec.Struct):
    rank: Count  # required: an entry without it is dropped
    host: Optional[str] = None
    pid: Optional[Count] = None
    status: RankStatus = msgspec.field(default_factory=RankStatus)
    collective_counts: dict[str, Count] = {}  # per op; one bad count is left out, the others kept


class MissingStatus(msgspec.Struct):
    unresponsive: bool = False
    considered_dead: bool = False


class MissingRank(msgspec.Struct):
    rank: Count
    host: Optional[str] = None
    pid: Optional[Count] = None
    status: MissingStatus = msgspec.field(default_factory=MissingStatus)


class Comm(msgspec.Struct):
    hash: Hash  # required: an entry without it is dropped
    size: Optional[Count] = None
    # entries decoded one by one (Rank / MissingRank): a bad one is counted, the rest kept
    ranks: list[Any] = []
    missing_ranks: list[Any] = []


class Ras(msgspec.Struct):
    timeouts_count: Count = 0


class Report(msgspec.Struct):
    communicators: list[Any]  # required: without it the document is not a RAS report
    nccl_version: Optional[str] = None
    ras: Ras = msgspec.field(default_factory=Ras)
