"""From a bundle to one verdict: the analysers in order, then the decision.

extract (rules over logs and scheduler facts) + Flight Recorder + native probe
-> symptoms and coverage -> verdict.decide. Pure: reads the bundle, writes
nothing; the caller stores the verdict and applies the drain policy.
"""
from __future__ import annotations

import logging
import time
from typing import Callable

from .bundle import Bundle
from .config import Config
from .model import Coverage, Symptom, Verdict

log = logging.getLogger("slurm_attr")

Analyser = Callable[[Bundle, Config], "tuple[list[Symptom], list[Coverage]]"]


# (coverage source name, module): each module exposes analyze(bundle, cfg).
ANALYSERS = (("rules", "slurm_attr.rules"), ("fr", "slurm_attr.flightrec"), ("probe", "slurm_attr.probe"))


def _analysers() -> list[tuple[str, Analyser]]:
    import importlib

    return [(name, importlib.import_module(mod).analyze) for name, mod in ANALYSERS]


def run_bundle(path: str, cfg: Config, history: object | None = None) -> Verdict:
    """Analyse the bundle at path. One failing analyser costs its coverage, not the verdict."""
    from . import verdict as verdict_mod

    t0 = time.monotonic()
    bundle = Bundle(path)
    symptoms: list[Symptom] = []
    coverage: list[Coverage] = list(bundle.collector_coverage())
    for name, fn in _analysers():
        try:
            s, c = fn(bundle, cfg)
        except Exception as err:  # a bug in one analyser must not cost the others' verdict
            log.exception("analyser %s failed on %s", name, path)
            coverage.append(Coverage(source=name, status="error", detail=f"analyser failed: {type(err).__name__}: {err}"[:300]))
            continue
        symptoms.extend(s)
        coverage.extend(c)
    coverage.extend(bundle.coverage)  # job.json problems etc.
    # The collector and the analyser of a source may both report the same gap: say it once.
    seen: set[tuple[str, str | None, str]] = set()
    unique = []
    for c in coverage:
        key = (c.source, c.node, c.status)
        if c.status == "ok" or key not in seen:
            unique.append(c)
        seen.add(key)
    coverage = unique
    # The rank map may come from the node collectors rather than job.json: decide sees the same.
    job = dict(bundle.job)
    if "ranks" not in job and bundle.ranks():
        job["ranks"] = {str(r): n for r, n in bundle.ranks().items()}
    v = verdict_mod.decide(job, symptoms, coverage, history=history)  # type: ignore[arg-type]
    log.debug("analysed %s in %.0f ms", path, (time.monotonic() - t0) * 1000)
    return v
