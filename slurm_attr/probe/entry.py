"""The probe analysis entry: read the records, regroup by communicator, run the rules."""
from __future__ import annotations

import gc

from ..bundle import Bundle
from ..config import Config
from ..model import Coverage, Symptom
from . import linkstall, mismatch, nonentry
from .comms import Comm, group, job_end_ns
from .reader import SOURCE, read_bundle

MAX_INCOMPLETE_LISTED = 5


def analyze(bundle: Bundle, cfg: Config) -> tuple[list[Symptom], list[Coverage]]:
    """Symptoms from the bundle's probe records, and coverage of what could be read.

    Untrusted by construction (the job wrote the records): symptoms point at ranks,
    nodes and links, never justify a drain. ``cfg`` is accepted for the analysers'
    common signature; the probe has no settings of its own yet.
    """
    del cfg
    # Tens of thousands of small acyclic-at-birth objects: the cyclic GC would rescan the
    # growing heap over and over while they are built (a third of the time at 4096 ranks).
    paused = gc.isenabled()
    gc.disable()
    try:
        records, coverage = read_bundle(bundle)
        comms = group(records)
    finally:
        if paused:
            gc.enable()
    end_ns = job_end_ns(bundle)
    symptoms: list[Symptom] = []
    for comm in comms:
        found = mismatch.find(bundle, comm)
        blamed = {(s.fields.get("comm_hash"), s.fields.get("comm_rank")) for s in found}
        # A rank that issued another collective also "never launched" the expected one:
        # the mismatch is the finer explanation, so it is not reported twice.
        found += [s for s in nonentry.find(bundle, comm, end_ns)
                  if (s.fields.get("comm_hash"), s.fields.get("comm_rank")) not in blamed]
        found += linkstall.find(bundle, comm, end_ns)
        symptoms.extend(found)
    coverage.extend(_incomplete(comms))
    return symptoms, coverage


def _incomplete(comms: list[Comm]) -> list[Coverage]:
    """One coverage line for communicators whose ranks' records are not all there."""
    short = [c for c in comms if len(c.members) < c.nranks]
    dup = [c for c in comms if c.duplicates]
    out = []
    if short:
        listed = ", ".join(f"{c.label}: {len(c.members)} of {c.nranks}" for c in short[:MAX_INCOMPLETE_LISTED])
        more = f" and {len(short) - MAX_INCOMPLETE_LISTED} more" if len(short) > MAX_INCOMPLETE_LISTED else ""
        out.append(Coverage(source=SOURCE, status="truncated",
                            detail=f"communicators with records missing for some ranks: {listed}{more}"))
    if dup:
        out.append(Coverage(source=SOURCE, status="error",
                            detail=f"{sum(c.duplicates for c in dup)} records claim a comm rank another record "
                                   f"already has (restarted processes?); the newest was kept"))
    return out
