"""The shapes of a bundle's two JSON files of ours (bundle.py): ``job.json`` (the controller
side's scheduler facts) and ``nodes/<node>/collect.json`` (what a node collector did), as
far as the bundle itself reads them.

Both are written by our collectors, but a bundle is re-analysed anywhere, by any later
release, and neither file names the release that wrote it: unknown fields are ignored,
never refused. A bundle is hostile input too (module doc of bundle.py): read with
``jsonshape.lenient``, a field of the wrong type reads as absent, one bad entry of a list
or mapping is left out and the rest kept, as the hand-written checks before the shapes did.
"""
from __future__ import annotations

from typing import Annotated, Any, Optional

import msgspec

# a global rank (torch's are int32); bools are not ranks
Rank = Annotated[int, msgspec.Meta(ge=0, lt=1 << 31)]
MAX_ATTRIBUTED = 100_000  # ledger lines read per node


class JobDoc(msgspec.Struct):
    """job.json beyond ``job_id`` (kept as written) and ``ranks`` (bundle.parse_ranks)."""
    nodes: list[str] = []  # a name that is not a string is left out
    provenance: Optional[dict[str, Any]] = None


class Source(msgspec.Struct):
    """One source a node collector read: ``sources.<name>`` of collect.json."""
    status: str = "error"  # bundle maps anything outside ok/missing/error/truncated to error
    detail: Any = ""  # shown as str(detail): whatever the collector wrote


class AttributedLine(msgspec.Struct):
    """A kernel line an earlier job already owns (collect/ledger.py): by its line number in
    kernel.attributed.log, or by its line key; either may be absent or wrong on its own."""
    line: Optional[int] = None
    key: Optional[str] = None
    job_id: Optional[str] = None


class Attributed(msgspec.Struct):
    lines: list[AttributedLine] = []  # a line that is not an object is left out


class CollectDoc(msgspec.Struct):
    ranks: dict[str, list[Rank]] = {}  # step -> the ranks the collector saw; a bad rank left out
    sources: dict[str, Source] = {}
    # the collector writes null when the node had nothing attributed (collect_node)
    attributed: Optional[Attributed] = None
    provenance: Optional[dict[str, Any]] = None
