"""The shapes of the pre-kill exchange's spool files (exchange.py), as their readers use them.

Both files are root's and written by a watcher of ours, but by the watcher release on that
node: during a rolling upgrade the leader and the nodes may run different releases and
nothing in the files names one. So no shape forbids unknown fields (a newer writer adding
one must not make an older reader drop the request or the result). What a node's result
says about a rank came from the rank (a stack's text, the FR summary): read with
``jsonshape.lenient``, a wrong field is left out and the rest of the row kept, as the
hand-written checks before the shapes did.
"""
from __future__ import annotations

from typing import Annotated, Any, Optional

import msgspec

MAX_SEQ = 1 << 62
Seq = Annotated[int, msgspec.Meta(ge=0, lt=MAX_SEQ)]  # bools are not ints here
Ns = Annotated[int, msgspec.Meta(ge=0, le=(1 << 63) - 1)]
# an FR collective seq: torch starts its counters at -1 ("none yet")
FrSeq = Annotated[int, msgspec.Meta(ge=-MAX_SEQ, lt=MAX_SEQ)]


class DumpRequest(msgspec.Struct):
    """``dumpreq.<step>.json``, LeaderDumps.request's: a request without a usable job or
    seq is no request (both required)."""
    job: str
    seq: Seq
    reason: Optional[str] = None


class NodeHead(msgspec.Struct):
    """What picks a node's result (``dumps/<step>/<node>.json``) for a request."""
    job: str
    seq: Seq


class Stack(msgspec.Struct):
    at: Optional[str] = None  # "file:line in func": a stack without it is not listed, its inner still read
    inner: Any = None  # shown as str(inner), whatever it is (the old reader did)


class FrRow(msgspec.Struct):
    # pg id -> [last enqueued, last completed] (frjson.status); a bad pair is left out
    pg: dict[str, tuple[FrSeq, FrSeq]] = {}


class RankRow(msgspec.Struct):
    fr: Optional[FrRow] = None
    stack: Optional[Stack] = None
    # why a rank's FR or stack is missing (dumps.collect's words), shown when set
    fr_error: Any = None
    stack_error: Any = None
    fr_dropped: Any = None
    stack_dropped: Any = None


class Budget(msgspec.Struct):
    dropped: list[str] = []  # one that is not a string is left out


class NodeResult(msgspec.Struct):
    node: str = "?"
    time_ns: Ns = 0
    budget: Budget = msgspec.field(default_factory=Budget)
    pipes: dict[str, Any] = {}  # rank -> "sent" or why not
    ranks: dict[str, RankRow] = {}  # rank -> what it answered; a row that is not an object is left out


# ---- the dumps' summaries as the findings document keeps them (prekillevidence) ----------
class Summary(msgspec.Struct):
    """prekill.summarize's document: a finding's ``dumps`` (its stacks beside it in the
    finding) or one of the document's ``dumps`` (stacks inside)."""
    requested: Optional[str] = None  # ISO time: the latest summary is the one shown
    reason: Any = None  # shown as str(reason), whatever it is (the old reader did)
    stacks: list[dict[str, Any]] = []  # a row that is not an object is left out


class FindingStacks(msgspec.Struct):
    dumps: Optional[Summary] = None
    stacks: list[dict[str, Any]] = []


class LiveDoc(msgspec.Struct):
    """findings.load's merged document, the fields that say where the ranks were."""
    findings: list[FindingStacks] = []  # a finding that is not an object is left out
    dumps: list[Summary] = []
