"""The native probe's records: reading them and localising a hang from them.

The NCCL profiler plugin (spank/probe/) keeps one fixed-size record per rank; the node
epilog copies them into the bundle's nodes/<node>/probe/. ``analyze`` reads them all
(bounded, hostile input), regroups them by communicator and reports, as untrusted
symptoms (evidence source "probe"):

- ``probe.non_entry`` (rank_stuck): ranks that never launched the collective the others
  are stuck in;
- ``probe.inconsistent`` (collective_mismatch): ranks that issued another function,
  count, datatype or root at the same position;
- ``probe.link_stall`` (network): a network send toward one peer that never completed,
  naming both ends.
"""
from __future__ import annotations

import errno
import importlib
import os
from typing import TYPE_CHECKING, Any

from .. import safefs
from ..errors import UnsafePath
from ..model import Coverage

if TYPE_CHECKING:
    from ..bundle import Bundle
    from ..config import Config
    from ..model import Symptom

__all__ = ["analyze"]

# What the reader reports when there is nothing to read, and the shortcut below with it.
NO_NODES = "the bundle has no node parts"
NO_PROBE_DIR = "no probe files (probe off, or NCCL without profiler support)"

# Most bundles hold no probe record: `sattr analyze` then needs none of the reader's or the
# rules' modules (a few ms of a one-log analysis). Submodules load on first use.
_SUBMODULES = {"entry", "comms", "layout", "linkstall", "mismatch", "nonentry", "reader", "record", "synth"}


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def no_probe_dirs(bundle: Bundle, nodes: list[str]) -> bool:
    """True when no node has a nodes/<node>/probe at all (ENOENT, opened as the reader opens
    it: no symlink followed). Anything else, an empty or unreadable directory included, is
    False: the full reader then says what it is."""
    for node in nodes:
        try:
            os.close(safefs.open_dir(bundle.root, f"nodes/{node}/probe"))
        except UnsafePath as err:
            if getattr(err.__cause__, "errno", None) == errno.ENOENT:
                continue
        return False
    return True


def analyze(bundle: Bundle, cfg: Config) -> tuple[list[Symptom], list[Coverage]]:
    """Symptoms from the bundle's probe records, and coverage of what could be read
    (entry.analyze; answered here, without it, when no node has a probe directory)."""
    nodes = bundle.nodes()
    if not nodes:
        return [], [Coverage(source="probe", status="missing", detail=NO_NODES)]
    if no_probe_dirs(bundle, nodes):
        return [], [Coverage(source="probe", node=n, status="missing", detail=NO_PROBE_DIR) for n in nodes]
    from .entry import analyze as full

    return full(bundle, cfg)
