"""The node epilog's fast path: drain THIS node before its epilog ends on fatal local evidence.

A node goes back to IDLE the moment its own Epilog exits (research/slurm.md §3), long
before the central analysis has a verdict. So the epilog reads the node's kernel window
into memory first and, when it matches a catalog rule whose action is drain, reset or
reboot (trusted: the job cannot write the kernel log), drains this one node itself with
``scontrol update`` before anything touches the spool or the verdict database.

It needs neither: the spool may be full or read-only, and the database lives on the
controller's local disk only (one SQLite file written from every node over a network
filesystem is a known way to corrupt it). The circuit breaker's state comes from Slurm
itself (slurmstate.py): our drains are the nodes whose reason starts with ``SATTR:``,
with the reasons' timestamps and the partitions' sizes, so every node sees the same
state. The decision is recorded durably later: in ``nodes/<node>/fastpath.json`` when the
spool takes it, and in any case by the central analysis, which reconciles its store
from Slurm's reasons (pipeline/reconcile.py). A breaker a person tripped in the database
is not visible here; the limits themselves are.

Cost: nothing when the window is empty; otherwise the rule catalog load without its
inline cases (~100-200 ms cold; logged on every run) plus one pass over at most
``[collect] kernel_cap_bytes``. Slurm is asked only when a fatal line matched.
Never raises: the epilog must exit 0 whatever happens here.
"""
from __future__ import annotations

import logging
import time
from typing import Any, Callable

from . import drain, safefs
from .config import Config
from .errors import SlurmError, UnsafePath
from .model import Action, Symptom, Verdict
from .slurmstate import BLOCK_ALREADY, BLOCK_BREAKER, NOT_OURS, SlurmView, beyond_caps, limit_check
from .waiting import wait_until

log = logging.getLogger("slurm_attr")

# Slurm calls from a node epilog: short, the whole epilog has PrologEpilogTimeout.
SLURM_TIMEOUT_S = 5.0


def _catalog_api() -> tuple[Callable[..., Any], Callable[..., list[Symptom]]]:
    """(catalog loader, extract_lines). The loader skips the inline rule cases: running them
    is ~85% of a cold load (measured ~700 ms of ~850 ms in the test cluster's venv, against
    ~100 ms without), and they already run in CI, in every central analysis and in the rule
    tests; an epilog must be quick. The cached catalog (load_catalog): the ledger's scan in the
    same epilog then reuses it instead of building a second one."""
    from .rules import extract_lines, load_catalog

    return load_catalog, extract_lines


def open_slurm(cfg: Config) -> Any:
    """The configured Slurm backend, with the short timeout a node hook needs."""
    from .slurm import default_backend

    return default_backend(cfg.paths.slurm_bin, cfg.paths.slurm_conf, timeout=SLURM_TIMEOUT_S, backend=cfg.slurm.backend)


def fatal_symptoms(symptoms: list[Symptom], node: str) -> list[Symptom]:
    """This node's symptoms that may take it out on their own (trusted, catalog action)."""
    return [s for s in symptoms if s.node == node and drain.may_drain(s, hardware_verdict=False)]


def local_verdict(job_id: str, node: str, fatal: list[Symptom]) -> Verdict:
    """A one-node verdict for the policy: the worst fatal symptom is its root."""
    worst = max(fatal, key=drain.severity)
    return Verdict(job_id=job_id, cause=worst.cause, summary=worst.summary, culprit_nodes=[node],
                   culprit_gpus=[str(worst.gpu)] if worst.gpu not in (None, "") else [], symptoms=fatal)


def run(cfg: Config, job_id: str, node: str, kernel: "bytes | str", slurm: Any = None) -> list[Action]:
    """Check this node's kernel window and drain the node if it is fatal. Never raises.

    ``kernel`` is the window's text as read into memory by the epilog, or (offline, tests)
    a bundle directory whose ``nodes/<node>/kernel.log`` is read. ``slurm`` is for tests;
    the epilog opens the configured backend. Returns the decisions (empty when nothing
    fatal was found or on error).
    """
    t0 = time.monotonic()
    try:
        return _run(cfg, job_id, node, kernel, slurm, t0)
    except Exception as err:  # noqa: BLE001 - the node epilog must exit 0, always
        log.exception("fast path on %s failed after %.0f ms: %s", node, (time.monotonic() - t0) * 1000, err)
        return []


def _kernel_bytes(cfg: Config, node: str, kernel: "bytes | str") -> bytes:
    if isinstance(kernel, (bytes, bytearray)):
        return bytes(kernel[-cfg.collect.kernel_cap_bytes:]) if len(kernel) > cfg.collect.kernel_cap_bytes else bytes(kernel)
    try:
        return safefs.read_file(kernel, f"nodes/{node}/kernel.log", cfg.collect.kernel_cap_bytes).data
    except UnsafePath as err:
        log.info("fast path on %s: no kernel log (%s)", node, err)
        return b""


def _run(cfg: Config, job_id: str, node: str, kernel: "bytes | str", slurm: Any, t0: float) -> list[Action]:
    if not cfg.drain.enabled or not cfg.drain.fast_path:
        return []  # the central analysis still records its decision
    rel = f"nodes/{node}/kernel.log"
    data = _kernel_bytes(cfg, node, kernel)
    if not data.strip():
        return []
    lines = [(i, safefs.decode(raw).rstrip("\r")) for i, raw in enumerate(data.split(b"\n"), 1) if raw.strip()]
    fatal, catalog_ms, extract_ms = find_fatal(cfg, job_id, node, rel, lines)
    if not fatal:
        log.info("fast path on %s: nothing fatal in %d kernel lines (catalog %.0f ms, match %.0f ms)",
                 node, len(lines), catalog_ms, extract_ms)
        return []

    tp = time.monotonic()
    slurm = slurm if slurm is not None else open_slurm(cfg)
    acts = decide_all(cfg, local_verdict(job_id, node, fatal), slurm)
    policy_ms = (time.monotonic() - tp) * 1000
    for a in acts:
        log.warning("fast path on %s: %s %s (%s) in %.0f ms [catalog %.0f ms, match %.0f ms, policy %.0f ms]",
                    node, a.kind, "applied" if a.applied else f"blocked: {a.blocked_by}", a.reason,
                    (time.monotonic() - t0) * 1000, catalog_ms, extract_ms, policy_ms)
    return acts


def find_fatal(cfg: Config, job_id: str, node: str, rel: str,
               lines: list[tuple[int, str]]) -> tuple[list[Symptom], float, float]:
    """(this node's fatal root symptoms among these kernel lines, catalog ms, match ms): the
    catalog's rules and its job refiners, as the central analysis runs them. Also the node
    Prolog's gate (gate.py) decides with this, so both paths agree on what is fatal."""
    tc = time.monotonic()
    load_catalog, extract_lines = _catalog_api()
    catalog = load_catalog(cfg.analysis.extra_rules or None)  # the same catalog the central analysis uses
    catalog_ms = (time.monotonic() - tc) * 1000
    tx = time.monotonic()
    symptoms = extract_lines(catalog, "kernel", node, rel, lines)
    # The catalog's own job-wide refinement, as the central analysis runs it, on this node's
    # lines alone: an Xid 109 after an Xid 13 on the same GPU is one program fault (cascade, no
    # action). Only what stays a root may drain.
    from .rules.jobwide import refine

    refine(symptoms, {"job_id": job_id, "nodes": [node]}, catalog)
    extract_ms = (time.monotonic() - tx) * 1000
    return fatal_symptoms([s for s in symptoms if s.role == "root"], node), catalog_ms, extract_ms


def decide_all(cfg: Config, verdict: Verdict, slurm: Any,
               reason_of: Callable[[str], str] | None = None) -> list[Action]:
    """One decision per node this verdict would take out, carried out with the breaker's state
    read from Slurm. ``reason_of`` rewrites the drain reason (the gate names no finished job)."""
    acts = []
    for cand_node, action, reason in drain.candidates(verdict):
        kind = "reboot" if action in ("reboot", "reset") and cfg.drain.reboot else "drain"
        act = Action(kind=kind, node=cand_node, reason=reason_of(reason) if reason_of else reason, applied=False)
        try:
            _decide(cfg, act, slurm)
        except Exception as err:  # noqa: BLE001 - log and leave it to the central path
            log.exception("fast path decision for %s failed", cand_node)
            act.applied, act.blocked_by = False, f"error: {type(err).__name__}: {err}"[:200]
        acts.append(act)
    return acts


def _decide(cfg: Config, act: Action, slurm: Any) -> None:
    """drain.apply_policy's order, with the breaker's state read from Slurm instead of a database."""
    node = act.node or ""
    try:
        rec = slurm.show_node(node)
    except SlurmError as err:
        act.blocked_by = f"slurm error: {err}"[:200]
        return
    if not rec:
        act.blocked_by = "node unknown to Slurm"
        return
    st = drain.NodeState.from_record(rec)
    if st.out_of_service:
        act.blocked_by = BLOCK_ALREADY if st.ours else f"{NOT_OURS}: {st.describe()}"[:200]
        return
    if cfg.drain.dry_run:
        act.blocked_by = drain.BLOCK_DRY_RUN
        return
    try:
        view = slurm_view(slurm)
    except SlurmError as err:
        act.blocked_by = f"slurm error: {err}"[:200]
        return
    why = limit_check(view, node, st.partitions, cfg.drain.max_drains, cfg.drain.window_s,
                      cfg.drain.max_partition_percent)
    if why:
        log.warning("fast path: circuit breaker: %s", why)
        act.blocked_by = BLOCK_BREAKER
        return
    used, err = drain._carry_out(slurm, node, act.kind, act.reason)
    act.kind = used
    if err is not None:
        act.blocked_by = err
        return
    act.applied = True
    if used == "drain":
        _verify_caps(cfg, act, slurm)


# Nodes whose drains land in the same second are ordered by name; a second look after this
# long sees every drain of such a burst, so the node ranked past a cap finds out.
SETTLE_S = 1.0


def _verify_caps(cfg: Config, act: Action, slurm: Any) -> None:
    """Drain first, then check the breaker's caps against every drain Slurm now shows; a node
    ranked past a cap resumes itself (its own drain, just set) and counts as blocked."""
    node = act.node or ""

    def look() -> tuple[SlurmView | None, str]:
        try:
            view = slurm_view(slurm)
        except SlurmError as err:
            log.warning("fast path: could not re-read Slurm after draining %s: %s", node, err)
            return None, ""
        return view, beyond_caps(view, node, cfg.drain.max_drains, cfg.drain.window_s, cfg.drain.max_partition_percent)

    # Not finding such a burst is the usual outcome: said at debug level only.
    view, why = wait_until(look, None, SETTLE_S, f"a concurrent burst of drains past the caps with {node}'s",
                           done=lambda got: got[0] is None or bool(got[1]), max_tries=2, level=logging.DEBUG).value
    if view is None or not why:
        return
    st = view.nodes.get(node)
    if st is None or not st.ours or (st.reason or "") != act.reason:
        return  # not our drain any more (an admin acted): leave it as it is
    try:
        slurm.resume(node)
    except SlurmError as err:
        log.error("fast path: %s; resuming %s failed: %s", why, node, err)
        return
    log.warning("fast path: circuit breaker after a concurrent burst: %s; %s resumed", why, node)
    act.applied, act.blocked_by = False, BLOCK_BREAKER


def slurm_view(slurm: Any) -> SlurmView:
    """Node records plus, where the backend has it, ``sinfo -R``'s reason timestamps."""
    records = slurm.nodes()
    reasons = getattr(slurm, "reasons", None)
    rows = reasons() if callable(reasons) else []
    return SlurmView.build(records, rows)
