"""One attempt per pending job until its verdict is stored: the pool's workers, ``sattr retry``
and its timer all come through here.

Outcomes of one attempt:

- stored: verdict and comment (queued) in the store -> the pending entry is removed;
- "database is locked" (another writer) or a store that cannot be opened -> retried in
  this process with backoff for ``[intake] retry_for_s``, then left pending;
- the job's state unknown only for want of accounting -> left pending (nothing stored), re-analysed
  once accounting answers;
- the analysis timed out (``[analysis] timeout_s``) or crashed -> a partial verdict from the job's
  state and the trusted kernel findings is stored with a coverage entry naming the failure,
  and the entry stays pending so a later retry may replace it.
"""
from __future__ import annotations

import logging
import os
import signal
import sqlite3
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator

from .. import spool
from ..config import Config
from ..errors import StoreError
from . import intake

log = logging.getLogger("slurm_attr")

PARTIAL_TIMEOUT_S = 30.0


class AnalysisTimeout(BaseException):
    """The analysis ran past [analysis] timeout_s. A BaseException so that the analysers'
    own ``except Exception`` (one broken analyser costs only its coverage) cannot swallow it."""


def _on_alarm(signum: int, frame: object) -> None:
    raise AnalysisTimeout("analysis exceeded [analysis] timeout_s")


@contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """SIGALRM after ``seconds`` (fractions allowed), then again every interval until the block
    is left; main thread only. The repeat is what makes it a hard limit: an exception raised
    by a signal handler is swallowed where Python cannot propagate it (a ``__del__``, a GC or
    weakref callback: "Exception ignored in ..."), and a single alarm landing there was lost."""
    old = signal.signal(signal.SIGALRM, _on_alarm)
    first = max(0.001, float(seconds))
    signal.setitimer(signal.ITIMER_REAL, first, max(0.05, min(1.0, first)))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def transient(err: BaseException) -> bool:
    """Worth retrying soon: the verdict database busy or not openable right now."""
    from ..store import is_locked

    return isinstance(err, StoreError) or (isinstance(err, sqlite3.OperationalError) and is_locked(err)) or \
        is_locked(err)


def _default_slurm(cfg: Config) -> Any:
    from ..slurm import from_config

    return from_config(cfg, timeout=10)


def _default_store(cfg: Config) -> Any:
    from ..store import Store

    return Store(cfg.paths.database)


def process(cfg: Config, key: str, slurm: Any = None, open_store: Callable[[Config], Any] | None = None,
            retry_for_s: float | None = None, sleep: Callable[[float], None] = time.sleep,
            logs: Any = None, pending_only: bool = False, sweep_comments: bool = True,
            comments_to: list[str] | None = None) -> str:
    """One pending job through to a stored verdict; returns stored|pending|partial|busy|gone.

    ``logs``: the daemon logs a worker read once for its batch (collect.controller.SchedulerLogs);
    ``pending_only``: a job no longer pending is done (another worker stored it), not re-recorded;
    ``sweep_comments``: the comment re-checks after the verdict (a worker does them once a batch);
    ``comments_to``: queue the comment and add the job id here (a worker writes its batch's together)."""
    from .finish import finish_job
    from .settle import AccountingPending, read_job_json

    open_store = open_store or _default_store
    slurm = slurm if slurm is not None else _default_slurm(cfg)
    retry_for_s = cfg.intake.retry_for_s if retry_for_s is None else retry_for_s
    bdir = spool.bundle_dir(cfg.paths.spool, key)
    with intake.claim(cfg, key) as mine:
        if not mine:
            return "busy"
        entry = intake.load(cfg, key)
        if entry is None and pending_only:
            return "gone"
        if entry is None:
            # Started without an intake record (it could not be written, or an older hook):
            # record it now so a failure below is not lost.
            facts = read_job_json(bdir)
            if not facts:
                return "gone"
            try:
                entry = intake.record(cfg, key, facts)
            except OSError as err:
                log.error("job %s: cannot record it as pending (%s)", key, err)
                entry = {"job": facts}
        facts = _entry_facts(cfg, key, bdir, entry.get("job") or {}, slurm, logs)
        if facts is None:
            return "pending"
        gathered, outcome = _offloaded(cfg, key, entry, bdir, facts, slurm, open_store)
        if outcome:
            return outcome
        give_up_at = time.monotonic() + retry_for_s
        while True:
            store = None
            progress: dict[str, Any] = {}
            try:
                try:
                    with time_limit(cfg.analysis.timeout_s):
                        store = open_store(cfg)
                        last = int((intake.load(cfg, key) or {}).get("attempts") or 0) + 1 >= cfg.intake.max_attempts
                        finish_job(cfg, slurm, store, bdir, job_facts=facts, notes=_earlier_failures(cfg, key),
                                   progress=progress, allow_unknown=last, sweep_comments=sweep_comments,
                                   comments_to=comments_to, gathered=gathered, ended_at=_ended_at(entry))
                except BaseException as err:
                    if not progress.get("stored") or isinstance(err, (KeyboardInterrupt, SystemExit)):
                        raise
                    # The verdict is in; what failed after it (the comment) has its own queue.
                    log.warning("job %s: verdict stored; a later step failed (%s: %s)", key, type(err).__name__, err)
                intake.done(cfg, key)
                return "stored"
            except AccountingPending as err:
                log.warning("job %s: %s; left pending", key, err)
                intake.failed(cfg, key, str(err))
                return "pending"
            except AnalysisTimeout:
                return _partial(cfg, key, facts, bdir, store, open_store,
                                f"analysis timed out after {cfg.analysis.timeout_s:g}s", slurm)
            except Exception as err:  # noqa: BLE001 - every failure ends in a stored or pending state
                if transient(err):
                    doc = intake.failed(cfg, key, f"{type(err).__name__}: {err}")
                    wait = intake.backoff(int((doc or {}).get("attempts") or 1), cfg.intake.backoff_max_s)
                    if doc is None or time.monotonic() + wait > give_up_at:
                        log.warning("job %s: %s; left pending for the next run", key, err)
                        return "pending"
                    log.info("job %s: %s; retrying in %.0fs", key, err, wait)
                    sleep(wait)
                    continue
                log.exception("job %s: analysis failed", key)
                return _partial(cfg, key, facts, bdir, store, open_store,
                                f"analysis crashed: {type(err).__name__}: {err}", slurm)


def _offloaded(cfg: Config, key: str, entry: dict[str, Any], bdir: str, facts: dict[str, Any], slurm: Any,
               open_store: Callable[[Config], Any]) -> tuple[Any, str]:
    """(what an offloaded analysis job found, "") to conclude now; (None, outcome) when this
    attempt ends here: "offloaded" (submitted, or its job still runs) or a partial verdict's
    outcome (its job ended without a result: the next attempt analyses here); (None, "") when
    the bundle is analysed here."""
    from ..errors import SlurmError
    from . import offload
    from .finish import prepare_job

    off = entry.get("offload")
    if off:
        found = offload.result(bdir)
        if found is not None:
            return found, ""
        state = offload.ended_without_result(slurm, str(off.get("job_id")))
        if state is None:
            return None, "offloaded"
        intake.mark(cfg, key, offload=None, offload_failed=True)
        return None, _partial(cfg, key, facts, bdir, None, open_store,
                              f"the offloaded analysis job {off.get('job_id')} ended {state} without a result", slurm)
    if not offload.wanted(cfg, bdir, facts, entry):
        return None, ""
    job, _err = prepare_job(cfg, slurm, bdir, facts, _ended_at(entry))
    if not job.get("state"):
        return None, ""  # the analysis here says why (accounting): nothing to offload yet
    try:
        offload.submit(cfg, slurm, key, bdir)
    except SlurmError as err:
        log.warning("job %s: offload refused (%s); analysed here", key, err)
        return None, ""
    return None, "offloaded"


def _ended_at(entry: dict[str, Any]) -> float | None:
    """When the job ended, as its intake record says (the hook's time, or accounting's end for
    a job the catch-up recorded); None when the record does not say."""
    since = entry.get("since")
    return float(since) if isinstance(since, (int, float)) and since > 0 else None


def _entry_facts(cfg: Config, key: str, bdir: str, facts: dict[str, Any], slurm: Any,
                 logs: Any) -> dict[str, Any] | None:
    """The pending entry's facts, a torn record's asked of accounting (None: it did not answer),
    and the bundle's controller part written from them when it has none yet."""
    if facts.get("facts_source") == intake.TORN:
        facts = _torn_facts(cfg, key, facts, slurm)  # type: ignore[assignment]
        if facts is None:
            return None
    # From accounting (catchup.py, a torn record): a bundle only where the nodes wrote one.
    source = facts.get("facts_source")
    if (source == "env" or (source == "sacct" and os.path.isdir(bdir))) \
            and not os.path.exists(os.path.join(bdir, "job.json")):
        _controller_part(cfg, key, bdir, facts, logs)
    return facts


def _torn_facts(cfg: Config, key: str, facts: dict[str, Any], slurm: Any) -> dict[str, Any] | None:
    """A torn hook record's facts (its key only) from accounting, kept in the entry; None when
    accounting did not answer (the entry stays pending with the error and a backoff)."""
    from ..errors import SlurmError
    from .settle import facts_from_accounting

    try:
        facts = facts_from_accounting(slurm, facts)
    except SlurmError as err:
        intake.failed(cfg, key, f"hook record torn, accounting asked for its facts: {err}"[:500])
        return None
    try:
        intake.record(cfg, key, facts)
    except OSError as err:
        log.warning("job %s: facts from accounting not kept in the intake (%s)", key, err)
    return facts


def _controller_part(cfg: Config, key: str, bdir: str, facts: dict[str, Any], logs: Any) -> None:
    """The bundle's controller part (job.json, output tails, daemon lines), written by the analysis
    from the facts the hook recorded: the hook itself only records (issue 23)."""
    from ..collect import controller

    try:
        controller.write_controller_part(bdir, facts, cfg.collect.output_tail_bytes,
                                         None if logs is not None else controller.log_paths(cfg.collect.scheduler_logs), logs=logs)
    except OSError as err:
        # Spool full or read-only: the facts are in the pending record; the analysis uses them.
        log.error("job %s: controller part not written to the spool (%s)", key, err)
        try:
            intake.note(cfg, key, f"spool: {err.strerror or err}: analysed from the job's facts")
        except OSError:
            pass


def _earlier_failures(cfg: Config, key: str) -> list[Any]:
    """A coverage entry naming what delayed this verdict (the fault it was stored through)."""
    from ..model import Coverage

    doc = intake.load(cfg, key) or {}
    out = []
    if str(doc.get("note") or "").startswith("spool:"):  # the controller could not write its part
        out.append(Coverage(source="spool", status="error", detail=str(doc["note"])[:300]))
    n = int(doc.get("attempts") or 0)
    if n:
        out.append(Coverage(source="intake", status="error",
                            detail=f"stored after {n} failed attempt(s); last error: {doc.get('last_error') or '?'}"[:300]))
    return out


def _partial(cfg: Config, key: str, facts: dict[str, Any], bdir: str, store: Any,
             open_store: Callable[[Config], Any], failure: str, slurm: Any) -> str:
    """Store what is known (job state + trusted kernel findings) rather than nothing."""
    from .. import comment
    from . import reconcile
    from .finish import partial_verdict
    from .settle import read_job_json, settle_state

    try:
        with time_limit(min(PARTIAL_TIMEOUT_S, max(5.0, cfg.analysis.timeout_s))):
            job = read_job_json(bdir) or dict(facts)
            if job.get("state_source") not in ("sacct", "scontrol"):
                # One question to accounting (or slurmctld): a finished job's state is cheap to learn.
                job, _err = settle_state(slurm, job, time.monotonic())
            have_bundle = os.path.isdir(bdir)
            try:  # the fast path's drain for this job, when the node's kernel lines never reached the spool
                fast = reconcile.fast_decisions(bdir if have_bundle else "", job, slurm, store)
                extra = reconcile.reason_symptoms(bdir if have_bundle else "", fast)
            except Exception as err:  # noqa: BLE001 - then the partial rests on the bundle alone
                log.warning("job %s: fast path decisions not read: %s", key, err)
                fast, extra = [], []
            v = partial_verdict(cfg, job, bdir, failure, extra=extra)
            if v.cause == "unknown" and not job.get("state"):
                raise RuntimeError("job state unknown: not stored as `unknown`")
            store = store if store is not None else open_store(cfg)
            reconcile.record_fast(store, v.job_id, fast)
            store.save(job, v, bundle_path=bdir, analysis_ms=0.0)
            if cfg.comment.enabled:
                comment.queue_verdict(cfg, store, v, str(job.get("slurm_job_id") or v.job_id))
    except BaseException as err:  # noqa: BLE001 - then the entry stays pending with both errors
        log.error("job %s: %s; the partial verdict failed too: %s", key, failure, err)
        intake.failed(cfg, key, f"{failure}; partial verdict failed: {type(err).__name__}: {err}")
        return "pending"
    log.warning("job %s: %s; stored a partial verdict (%s)", key, failure, v.cause)
    intake.failed(cfg, key, failure, partial=True)
    return "partial"

