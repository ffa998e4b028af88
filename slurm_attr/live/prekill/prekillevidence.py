"""The pre-kill dumps as post-mortem evidence (untrusted: every byte came from the ranks).

- The Flight Recorder the watcher pulled from the live ranks
  (``<spool>/live/<job>/dumps/<step>/nodes/<node>/fr/nccl_trace_rank_<N>.json``, a
  bundle-shaped tree) is analysed by the FR analysis that reads an epilog's dumps, but only
  when the bundle itself holds none: a Gloo job, or one Slurm killed at its time limit,
  otherwise has no FR at all; where the ranks dumped by themselves (watchdog, pipe) those
  dumps are the later and fuller evidence.
- Where each rank was when the dumps were taken (before the job's end, or on a hang):
  one ``live.stacks`` context symptom, so a TIMEOUT verdict can say where the ranks were.
"""
from __future__ import annotations

import os
from typing import Any

from ... import jsonshape
from ...bundle import Bundle
from ...config import Config
from ...model import Coverage, Evidence, Symptom
from .. import findings, livespool
from .exchangeshape import LiveDoc, Summary

STACKS_ID = "live.stacks"
MAX_STEPS = 8


def _bundle_has_fr(bundle: Bundle) -> bool:
    return any(bundle.node_files(n, "fr") for n in bundle.nodes())


def fr_symptoms(bundle: Bundle, cfg: Config, job: str) -> tuple[list[Symptom], list[Coverage]]:
    if _bundle_has_fr(bundle):
        return [], []
    from ... import flightrec

    base = os.path.join(livespool.job_dir(cfg.paths.spool, job), "dumps")
    try:
        steps = sorted(n for n in os.listdir(base) if livespool.valid_step(n))[:MAX_STEPS]
    except OSError:
        return [], []
    out: list[Symptom] = []
    cov: list[Coverage] = []
    for step in steps:
        root = os.path.join(base, step)
        if not os.path.isdir(os.path.join(root, "nodes")) or os.path.islink(root):
            continue
        try:
            rep = flightrec.inspect(root, cfg)
        except flightrec.DumpError as err:
            cov.append(Coverage(source="fr", status="error", detail=f"pre-kill dumps, step {step}: {err}"[:300]))
            continue
        n = len(rep.dumps.traces)
        if not n:
            continue
        for s in rep.symptoms:
            s.trusted = False
            s.fields = {**s.fields, "prekill": True}
            s.evidence = [Evidence(source="live", path=f"{livespool.LIVE}/{job}/dumps/{step}/{e.path}"
                                   if e.path else None, line=e.line, text=e.text) for e in s.evidence]
        out += rep.symptoms
        cov.append(Coverage(source="fr", status="ok",
                            detail=f"pre-kill Flight Recorder of {n} rank(s), step {step}, pulled from the "
                                   f"running ranks by the live watcher"))
    return out, cov


def stacks_symptom(doc: dict[str, Any] | None, job: str) -> list[Symptom]:
    """Where the ranks were at the latest dump (a hang's or the one before the end)."""
    if not doc:
        return []
    try:
        live = jsonshape.lenient(doc, LiveDoc)  # the document's words are the ranks': shape first
    except jsonshape.ValidationError:
        return []
    sets: list[tuple[str, Summary, list[dict[str, Any]]]] = []
    for f in live.findings:
        if f.dumps is not None and f.stacks:
            sets.append(("hang", f.dumps, f.stacks))
    for d in live.dumps:
        if d.stacks:
            sets.append((str(d.reason), d, d.stacks))
    if not sets:
        return []
    reason, d, stacks = max(sets, key=lambda x: str(x[1].requested))
    rows = findings.stack_lines(stacks)
    when = "before the job's end" if reason == "before_end" else "on the hang"
    text = f"ranks at the dump {when} ({d.requested}): " + "; ".join(rows[:8])
    return [Symptom(id=STACKS_ID, cause="unknown", role="context", priority=10, trusted=False,
                    time=d.requested, summary=text[:1000], fields={"reason": reason, "stacks": stacks[:64]},
                    evidence=[Evidence(source="live", path=f"{livespool.LIVE}/{job}/dumps", text=r[:300]) for r in rows[:16]])]
