"""The node epilog's fast path: drain THIS node before its epilog ends on fatal local evidence.

A node goes back to IDLE the moment its own Epilog exits (research/slurm.md §3), long
before the central analysis has a verdict. So when the kernel log the collector just
wrote (``nodes/<node>/kernel.log``, trusted: the job cannot write it) matches a
catalog rule whose action is drain, reset or reboot, the epilog applies the drain
policy to this one node itself, with the same etiquette, breaker and dry-run as the
central path (drain.apply_policy, path "fast"), and records the decision in the
verdict database. The central analysis then finds the node drained by us and
records "already drained" instead of draining it twice.

Cost: nothing but a stat when the window's kernel log is empty; otherwise the rule
catalog load without its inline cases (~100-200 ms cold; logged on every run) plus
one pass over at most ``[collect] kernel_cap_bytes`` (~100 ms for 4 MB). Slurm and
the database are touched only when a fatal line matched.
Never raises: the epilog must exit 0 whatever happens here.
"""
from __future__ import annotations

import logging
import os
import time
from typing import Any, Callable

from . import drain, safefs
from .config import Config
from .errors import SattrError, StoreError, UnsafePath
from .model import Action, Symptom, Verdict

log = logging.getLogger("slurm_attr")

# Slurm calls from a node epilog: short, the whole epilog has PrologEpilogTimeout.
SLURM_TIMEOUT_S = 5.0


def _catalog_api() -> tuple[Callable[..., Any], Callable[..., list[Symptom]]]:
    """(catalog loader, extract_lines). The loader skips the inline rule cases: running them
    is ~85% of a cold load (measured ~700 ms of ~850 ms in the test cluster's venv, against
    ~100 ms without), and they already run in CI, in every central analysis and in the rule
    tests; an epilog must be quick."""
    from .rules import build_catalog, extract_lines

    def load(extra_dir: str | None = None) -> Any:
        return build_catalog(extra_dir, check=False)

    return load, extract_lines


def _open_slurm(cfg: Config) -> Any:
    from .slurm import default_backend

    return default_backend(cfg.paths.slurm_bin, cfg.paths.slurm_conf, timeout=SLURM_TIMEOUT_S)


def _open_store(cfg: Config) -> Any:
    from .store import Store

    # Never create it here: a database that only this node sees would hold a breaker of its own.
    if not os.path.exists(cfg.paths.database):
        raise StoreError(f"no verdict database at {cfg.paths.database} on this node")
    return Store(cfg.paths.database)


def fatal_symptoms(symptoms: list[Symptom], node: str) -> list[Symptom]:
    """This node's symptoms that may take it out on their own (trusted, catalog action)."""
    return [s for s in symptoms if s.node == node and drain.may_drain(s, hardware_verdict=False)]


def local_verdict(job_id: str, node: str, fatal: list[Symptom]) -> Verdict:
    """A one-node verdict for the policy: the worst fatal symptom is its root."""
    worst = max(fatal, key=drain.severity)
    return Verdict(job_id=job_id, cause=worst.cause, summary=worst.summary, culprit_nodes=[node],
                   culprit_gpus=[str(worst.gpu)] if worst.gpu not in (None, "") else [], symptoms=fatal)


def run(cfg: Config, job_id: str, node: str, bundle_dir: str, slurm: Any = None, store: Any = None) -> list[Action]:
    """Check this node's kernel log and drain the node if it is fatal. Never raises.

    ``slurm`` and ``store`` are for tests; the epilog opens the configured ones.
    Returns the decisions (empty when nothing fatal was found or on error).
    """
    t0 = time.monotonic()
    try:
        return _run(cfg, job_id, node, bundle_dir, slurm, store, t0)
    except Exception as err:  # noqa: BLE001 - the node epilog must exit 0, always
        log.exception("fast path on %s failed after %.0f ms: %s", node, (time.monotonic() - t0) * 1000, err)
        return []


def _run(cfg: Config, job_id: str, node: str, bundle_dir: str, slurm: Any, store: Any, t0: float) -> list[Action]:
    if not cfg.drain.enabled or not cfg.drain.fast_path:
        return []  # the central analysis still records its decision
    rel = f"nodes/{node}/kernel.log"
    try:
        res = safefs.read_file(bundle_dir, rel, cfg.collect.kernel_cap_bytes)
    except UnsafePath as err:
        log.info("fast path on %s: no kernel log (%s)", node, err)
        return []
    if not res.data.strip():
        return []
    lines = [(i, safefs.decode(raw).rstrip("\r")) for i, raw in enumerate(res.data.split(b"\n"), 1) if raw.strip()]

    tc = time.monotonic()
    load_catalog, extract_lines = _catalog_api()
    catalog = load_catalog(cfg.analysis.extra_rules or None)  # the same catalog the central analysis uses
    catalog_ms = (time.monotonic() - tc) * 1000
    tx = time.monotonic()
    symptoms = extract_lines(catalog, "kernel", node, rel, lines)
    # The same refinement as the central analysis, on this node's lines alone: an Xid 109
    # after an Xid 13 on the same GPU is one program fault (cascade, no action), Xid 45 is
    # never a root. Only what stays a root may drain.
    from .verdict import decide

    refined = decide({"job_id": job_id, "nodes": [node]}, symptoms, [])
    extract_ms = (time.monotonic() - tx) * 1000
    fatal = fatal_symptoms([s for s in refined.symptoms if s.role == "root"], node)
    if not fatal:
        log.info("fast path on %s: nothing fatal in %d kernel lines (catalog %.0f ms, match %.0f ms)",
                 node, len(lines), catalog_ms, extract_ms)
        return []

    verdict = local_verdict(job_id, node, fatal)
    tp = time.monotonic()
    try:
        store = store if store is not None else _open_store(cfg)
    except SattrError as err:
        # The breaker's state lives in the database: without it the node is not drained
        # here; the central analysis (which has the database) decides instead.
        log.error("fast path on %s: %s fatal, but the verdict database is unavailable (%s); "
                  "leaving the drain to the central analysis", node, fatal[0].id, err)
        return []
    slurm = slurm if slurm is not None else _open_slurm(cfg)
    acts = drain.apply_policy(cfg, verdict, {"slurm_job_id": job_id}, slurm=slurm, store=store, path="fast")
    try:
        store.record_actions(job_id, acts, path="fast", actor=f"epilog@{node}")
    except Exception as err:  # noqa: BLE001 - the drain stands; losing its record must not fail the epilog
        log.error("fast path on %s: could not record the decision: %s", node, err)
    policy_ms = (time.monotonic() - tp) * 1000
    for a in acts:
        log.warning("fast path on %s: %s %s (%s) in %.0f ms [catalog %.0f ms, match %.0f ms, policy %.0f ms]",
                    node, a.kind, "applied" if a.applied else f"blocked: {a.blocked_by}", a.reason,
                    (time.monotonic() - t0) * 1000, catalog_ms, extract_ms, policy_ms)
    return acts
