"""From a bundle to one verdict: the analysers in order, then the decision.

extract (rules over logs and scheduler facts) + Flight Recorder + native probe
-> symptoms and coverage -> verdict.decide. Pure: reads the bundle, writes
nothing; the caller stores the verdict and applies the drain policy.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Callable

from .bundle import Bundle
from .config import Config
from .model import Coverage, Symptom, Verdict

log = logging.getLogger("slurm_attr")

Analyser = Callable[[Bundle, Config], "tuple[list[Symptom], list[Coverage]]"]


# (coverage source name, module): each module exposes analyze(bundle, cfg).
ANALYSERS = (("rules", "slurm_attr.rules"), ("fr", "slurm_attr.flightrec"), ("probe", "slurm_attr.probe"),
             ("live", "slurm_attr.live"))


def _analysers() -> list[tuple[str, Analyser]]:
    import importlib

    return [(name, importlib.import_module(mod).analyze) for name, mod in ANALYSERS]


@dataclass
class Gathered:
    """What the analysers found in a bundle, before the decision: the part of an analysis that
    grows with the bundle (an offloaded analysis job computes it, pipeline/offload.py)."""
    job: dict[str, Any]
    symptoms: list[Symptom]
    coverage: list[Coverage]

    def to_dict(self) -> dict[str, Any]:
        return {"job": self.job, "symptoms": [s.to_dict() for s in self.symptoms],
                "coverage": [c.to_dict() for c in self.coverage]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Gathered":
        return cls(job=dict(d["job"]), symptoms=[Symptom.from_dict(s) for s in d["symptoms"]],
                   coverage=[Coverage(**c) for c in d["coverage"]])


def run_bundle(path: str, cfg: Config, history: object | None = None, job: dict | None = None,
               extra: "list[Symptom] | None" = None) -> Verdict:
    """Analyse the bundle at path. One failing analyser costs its coverage, not the verdict.

    ``job``: scheduler facts the caller holds (the intake's copy) over the bundle's job.json,
    for when the spool could not take job.json. ``extra``: symptoms found outside the bundle."""
    return conclude(gather(path, cfg, job), history, extra)


def gather(path: str, cfg: Config, job: dict | None = None) -> Gathered:
    """Every analyser over the bundle: symptoms and coverage (reads only the bundle)."""
    t0 = time.monotonic()
    bundle = Bundle(path)
    if job:
        bundle.job = {**bundle.job, **job, "job_id": str(job.get("job_id") or bundle.job["job_id"])}
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
    # The rank map may come from the node collectors rather than job.json: decide sees the same.
    job = dict(bundle.job)
    if "ranks" not in job and bundle.ranks():
        job["ranks"] = {str(r): n for r, n in bundle.ranks().items()}
    _bound_output_times(bundle, cfg, symptoms, job)
    _mark_attributed(bundle, symptoms)
    log.debug("gathered %s in %.0f ms", path, (time.monotonic() - t0) * 1000)
    return Gathered(job=job, symptoms=symptoms, coverage=unique)


def conclude(g: Gathered, history: object | None = None, extra: "list[Symptom] | None" = None) -> Verdict:
    """The decision over what was gathered, with the store's history (recurrences, earlier
    drains) and ``extra`` symptoms found outside the bundle (Slurm's drain reason)."""
    from . import verdict as verdict_mod
    from .rules.jobwide import before_verdict

    symptoms = before_verdict([*g.symptoms, *(extra or [])], g.job, history)  # type: ignore[arg-type]
    return verdict_mod.decide(dict(g.job), symptoms, list(g.coverage))


def _bound_output_times(bundle: Bundle, cfg: Config, symptoms: list[Symptom], job: dict) -> None:
    """Untimed lines of the job's output (a traceback) get the times of the timed lines around
    them, so that the verdict can tell which rank failed first (reason/firstfailure.py). Reads
    the same bounded tail, numbered the same way, as the rules analyser did."""
    from .errors import UnsafePath
    from .reason.timeline import bound_untimed, clock_of

    for name in ("stdout", "stderr"):
        rel = f"output/{name}"
        mine = [s for s in symptoms if s.role == "root" and not s.trusted and s.evidence and s.evidence[0].path == rel
                and s.time is None]
        if not mine:
            continue
        try:
            res = bundle.read(rel, cfg.collect.output_tail_bytes, tail=True)
        except UnsafePath:
            continue
        data = res.data
        if res.truncated:
            nl = data.find(b"\n")
            data = data[nl + 1:] if nl >= 0 else b""  # the first line of a tail is partial (as sources._read)
        lines = data.decode("utf-8", errors="replace").split("\n")
        bound_untimed(mine, rel, lines, clock_of(job))


def _mark_attributed(bundle: Bundle, symptoms: list[Symptom]) -> None:
    """Kernel lines an earlier job's verdict or drain already used (the node ledger, see
    bundle.already_attributed) are context for this job: never its root, never a second drain."""
    for s in symptoms:
        if not s.trusted:
            continue
        try:
            owner = bundle.already_attributed(s)
        except Exception:  # noqa: BLE001 - a broken ledger costs this check, not the verdict
            log.exception("ledger check failed for %s", s.id)
            return
        if owner and owner != str(bundle.job.get("job_id")):
            s.fields["attributed_to"] = owner
