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

from .analysis import analyze

__all__ = ["analyze"]
