"""PyTorch Flight Recorder analysis: which rank broke which collective, with evidence.

Layout (one module per thing it owns):

- ``safepickle``  restricted unpickler; head+tail reading of large dumps
- ``trace``       validated per-rank records (signatures interned, strict rank lists)
- ``loader``      finding dumps in a bundle, prefix detection, parallel loading
- ``wire``        the plain values a loader worker sends its traces back as
- ``groups``      process groups and their expected members
- ``vote``        per-group alignment by seq id and majority vote (windows that differ abstain)
- ``blame``       stuck and missing ranks, root vs cascade
- ``siblings``    tie-breaking in two-member groups by groups of the same shape
- ``symptoms``    findings -> Symptom / Coverage
- ``matrix``      the rank x sequence matrix and its terminal rendering
- ``html``        the self-contained HTML report

Entry point for the verdict: ``analyze(bundle, cfg)``.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ..model import Coverage

if TYPE_CHECKING:  # the names below, imported when first used (see __getattr__)
    from ..bundle import Bundle
    from ..config import Config
    from ..model import Symptom
    from .divergences import Analysis, Finding
    from .loader import DumpSet, load_dumps
    from .matrix import Matrix, build_matrix
    from .report import Report, inspect
    from .types import DumpError

__all__ = [
    "Analysis", "DumpError", "DumpSet", "Finding", "Matrix", "Report",
    "analyze", "build_matrix", "inspect", "load_dumps",
]

NO_DUMPS = "no Flight Recorder dumps found"

# Most bundles hold no dump (no torch, FR off): `sattr analyze` then needs none of the loader's
# or the analysis's modules, whose import is a tenth of a one-log analysis. They load on first use.
_LAZY = {"Analysis": "blame", "Finding": "blame", "DumpSet": "loader", "load_dumps": "loader",
         "Matrix": "matrix", "build_matrix": "matrix", "Report": "report", "inspect": "report",
         "DumpError": "types",
         "_workers": "report"}  # bench/bench_flightrec.py sizes its memory bound with it
_SUBMODULES = {"blame", "groups", "loader", "matrix", "matrixhtml", "report", "safepickle", "siblings", "symptoms",
               "trace", "tracewire", "types", "vote"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def analyze(bundle: Bundle, cfg: Config) -> tuple[list[Symptom], list[Coverage]]:
    """Flight Recorder symptoms and coverage for one bundle (the verdict's FR input).

    Symptoms: ``fr.collective_mismatch``, ``fr.rank_stuck``, ``fr.comm_hang``
    (roots, one per culprit rank; ``no_dump`` in fields when the rank left no
    dump) and ``fr.downstream_hang`` (cascade, one per downstream group, its
    ranks in ``behind_ranks``); a missing dump nobody is seen waiting for is a
    ``context`` note; all untrusted. A healthy set of dumps gives none.
    """
    if not any(bundle.node_files(node, "fr") for node in bundle.nodes()):
        return [], [Coverage(source="fr", node=None, status="missing", detail=NO_DUMPS)]
    from .report import inspect
    from .types import DumpError

    try:
        rep = inspect(bundle, cfg)
    except DumpError as err:
        return [], [Coverage(source="fr", node=None, status="error", detail=str(err)[:400])]
    return rep.symptoms, rep.coverage
