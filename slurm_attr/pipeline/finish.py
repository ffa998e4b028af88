"""Stage: analyse the settled job and publish: wait for the node parts, analyse, store, act, comment.

Run by a worker (pool.py) through attempt.py, so the job finishes COMPLETING while this runs.
Each step degrades on its own: no accounting -> the state comes from slurmctld and the comment
waits in the queue (or, when nothing tells the state, the job stays pending in the intake and is
re-analysed once accounting answers: a COMPLETED job is never stored as `unknown`); a node that
never delivered -> a coverage entry; a broken analyser -> coverage, not silence; the whole
analysis timing out or crashing -> ``partial_verdict`` (attempt.py) from what is known.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import time
from typing import Any

from .. import comment, spool
from ..bundleanalysis import Gathered, conclude, run_bundle
from ..collect import controller
from ..config import Config
from ..errors import SattrError, SlurmError
from ..model import Coverage, Verdict
from ..slurm.base import SlurmAccess
from ..store import Store
from ..waiting import wait_until
from . import settle

log = logging.getLogger("slurm_attr")

# Each analysis re-checks the comments written this long ago at most (and this many).
VERIFY_WINDOW_S = 3600.0
VERIFY_LIMIT = 200


def _analysis_dir(cfg: Config, bundle_dir: str) -> tuple[str, bool]:
    """The bundle, or (when the spool never got it) an empty local stand-in: (path, is_stand_in)."""
    if os.path.isdir(bundle_dir):
        return bundle_dir, False
    path = os.path.join(cfg.intake.queue_dir, "work", os.path.basename(bundle_dir.rstrip("/")))
    os.makedirs(path, mode=0o700, exist_ok=True)
    return path, True


def finish_job(cfg: Config, slurm: SlurmAccess, store: Store, bundle_dir: str,
               job_facts: dict[str, Any] | None = None, notes: list[Coverage] | None = None,
               progress: dict[str, Any] | None = None, allow_unknown: bool = True,
               sweep_comments: bool = True, comments_to: list[str] | None = None,
               gathered: Gathered | None = None, ended_at: float | None = None) -> Verdict:
    """The whole after-the-job flow for one bundle; returns the stored verdict.

    ``job_facts``: the intake's copy of the job's facts, used where the bundle has no job.json.
    Raises AccountingPending (nothing stored) when the verdict would be `unknown` for want of the
    job's final state, unless ``allow_unknown`` (the last attempt: partial over nothing).
    ``progress["stored"]`` turns true once the verdict is in the store (the caller then never
    replaces it with a partial one if a later step, e.g. the comment, fails). ``sweep_comments``:
    also retry queued comments and re-check recent ones (a worker does that once per batch).
    ``comments_to``: only queue the comment and add the job id to this list (a worker writes its
    batch's comments together, ``flush_comments``); None: write it here. ``gathered``: what an
    offloaded analysis job found in the bundle (offload.py): concluded here instead of analysing.
    ``ended_at``: when the job ended (the intake's record, epoch seconds): the node parts are
    waited for until node_wait_s after it, not node_wait_s from now (see node_wait_s)."""
    from .. import drain
    from . import reconcile

    t0 = time.monotonic()
    job, acct_err = prepare_job(cfg, slurm, bundle_dir, job_facts, ended_at)
    nodes = [n for n in job.get("nodes") or [] if isinstance(n, str)]
    adir, stand_in = _analysis_dir(cfg, bundle_dir)
    if stand_in and nodes:
        # The fast path's drain (in Slurm's reason) is the only word a node has here: let it land.
        raw = str(job.get("slurm_job_id") or job.get("job_id", ""))
        if not controller.wait_for_epilogs(slurm, raw, t0 + node_wait_s(cfg, ended_at)):
            log.warning("job %s: node epilogs not finished %.0fs after its end", raw, cfg.analysis.node_wait_s)
    fast = reconcile.fast_decisions(bundle_dir if not stand_in else "", job, slurm, store)
    extra = reconcile.reason_symptoms(bundle_dir if not stand_in else "", fast)
    try:
        if gathered is not None:  # an offloaded job read the bundle (offload.py); the decision is here
            gathered.job = {**gathered.job, **job, "job_id": str(job.get("job_id") or gathered.job.get("job_id"))}
            verdict = conclude(gathered, history=store, extra=extra)
        else:
            verdict = run_bundle(adir, cfg, history=store, job=job, extra=extra)
    finally:
        if stand_in:
            shutil.rmtree(adir, ignore_errors=True)
    if not job.get("state") and verdict.cause == "unknown" and not allow_unknown:
        # Never store a finished job as `unknown` only because its state was not known yet.
        why = f"accounting unavailable ({acct_err})" if acct_err else "no final state in accounting or slurmctld yet"
        raise settle.AccountingPending(f"job state unknown: {why}")
    if acct_err:
        verdict.coverage.append(Coverage(source="accounting", status="error",
                                         detail=f"sacct failed ({acct_err}); state from slurmctld"[:300]))
    verdict.coverage.extend(notes or [])
    if stand_in:
        verdict.coverage.append(Coverage(source="spool", status="missing",
                                         detail=f"no bundle at {bundle_dir}: analysed from the job's facts"))
    verdict.actions = drain.apply_policy(cfg, verdict, job, slurm=slurm, store=store, path="central")
    _requeue(cfg, verdict, job, slurm, store)
    reconcile.record_fast(store, verdict.job_id, fast)
    store.save(job, verdict, bundle_path=bundle_dir if not stand_in else "",
               analysis_ms=(time.monotonic() - t0) * 1000)
    if progress is not None:
        progress["stored"] = True
    if verdict.actions:
        store.record_actions(verdict.job_id, verdict.actions, path="central")
    _publish_user_copy(cfg, job, verdict)

    if cfg.comment.enabled:
        comment.queue_verdict(cfg, store, verdict, str(job.get("slurm_job_id") or verdict.job_id))
        if comments_to is not None:
            comments_to.append(verdict.job_id)
        else:
            flush_comments(cfg, slurm, store, [verdict.job_id])
        if comments_to is None and sweep_comments:
            sweep_comment_queue(cfg, slurm, store, verdict.job_id)
    log.info("job %s: %s (%s) in %.0f ms", verdict.job_id, verdict.cause, verdict.summary,
             (time.monotonic() - t0) * 1000)
    return verdict


def _requeue(cfg: Config, verdict: Verdict, job: dict[str, Any], slurm: SlurmAccess, store: Store) -> None:
    """Requeue around the drained node where the site asks for it (requeue.py); the decision
    goes into the verdict for `sattr JOB`. After the drain: the node is out before the job returns."""
    from .. import requeue

    verdict.requeue = requeue.for_verdict(cfg, verdict, job, slurm=slurm, store=store)


def node_wait_s(cfg: Config, ended_at: float | None, now: float | None = None) -> float:
    """How much longer a job's node parts are worth waiting for: until [analysis] node_wait_s after
    the job's end (``ended_at``, epoch seconds), never more than node_wait_s from now. A part still
    missing by then is not coming soon (its node epilog failed, the spool was full): a later
    attempt (`sattr retry`, the next worker) must not wait the whole time again for every such
    job, or a backlog of them takes node_wait_s each (200 jobs after a full spool: over an hour)."""
    wait = cfg.analysis.node_wait_s
    if not ended_at:
        return wait
    left = float(ended_at) + wait - (time.time() if now is None else now)
    return max(0.0, min(wait, left))


def prepare_job(cfg: Config, slurm: SlurmAccess, bundle_dir: str, job_facts: dict[str, Any] | None,
                ended_at: float | None = None) -> tuple[dict[str, Any], str]:
    """The job's facts settled: its node parts waited for (until node_wait_s after the job's end,
    ``ended_at``; node_wait_s from now without it), its final state from accounting (or
    slurmctld), job.json rewritten with them. (job, accounting's error)."""
    t0 = time.monotonic()
    job = settle.read_job_json(bundle_dir) or dict(job_facts or {})
    nodes = [n for n in job.get("nodes") or [] if isinstance(n, str)]
    if os.path.isdir(bundle_dir):
        missing = controller.wait_for_nodes(bundle_dir, nodes, t0 + node_wait_s(cfg, ended_at))
        if missing:
            log.warning("job %s: no node part from %s %.0fs after its end", job.get("job_id"), ",".join(missing),
                        cfg.analysis.node_wait_s)
    job, acct_err = settle.settle_state(slurm, job, time.monotonic() + settle.SACCT_SETTLE_S)
    try:
        with open(os.path.join(bundle_dir, "job.json"), "w") as f:
            json.dump(job, f, indent=1)
    except OSError as err:
        log.warning("job %s: job.json not updated on the spool (%s); analysing from the facts in memory",
                    job.get("job_id"), err)
    return job, acct_err


def sweep_comment_queue(cfg: Config, slurm: SlurmAccess, store: Store, job_id: str = "") -> None:
    """Anything an earlier outage left queued goes out now too, and comments a slurmctld restart
    reset to the user's text get ours back (the timer's `comments --verify` covers the rest; this
    bounded pass is one sacct call). Skipped when ``job_id``'s own comment did not go through:
    accounting is down, and a third timeout would only delay the next job."""
    comment.retry_pending(slurm, store, cfg.comment.max_attempts, cfg.comment.max_len)
    try:
        mine = store.comment_status(job_id) if job_id else "written"
        if mine != "written":
            raise SlurmError("accounting did not take this job's comment")
        comment.verify_recent(slurm, store, VERIFY_WINDOW_S, cfg.comment.max_attempts, cfg.comment.max_len,
                              limit=VERIFY_LIMIT)
    except SlurmError as err:
        log.info("job %s: comment verification skipped (%s)", job_id or "-", err)


def partial_verdict(cfg: Config, job: dict[str, Any], bundle_dir: str, failure: str,
                    extra: list[Any] | None = None) -> Verdict:
    """What is known without the full analysis: the job's state and the trusted kernel findings.

    Used when the analysis timed out or crashed. Reads only the nodes' kernel.log (bounded,
    the catalog without its inline cases); the coverage entry names the failure."""
    from .. import safefs
    from ..verdict import decide

    symptoms = list(extra or [])  # e.g. the fast path's finding from Slurm's reason (reconcile.py)
    cov = [Coverage(source="analysis", status="error", detail=f"partial verdict: {failure}"[:300])]
    try:
        from ..rules import build_catalog, extract_lines

        catalog = build_catalog(cfg.analysis.extra_rules or None, check=False)
        nodes_dir = os.path.join(bundle_dir, "nodes")
        for node in sorted(os.listdir(nodes_dir)) if os.path.isdir(nodes_dir) else []:
            rel = f"nodes/{node}/kernel.log"
            try:
                data = safefs.read_file(bundle_dir, rel, cfg.collect.kernel_cap_bytes).data
            except Exception:  # noqa: BLE001 - one node's file must not cost the others
                continue
            lines = [(i, safefs.decode(r)) for i, r in enumerate(data.split(b"\n"), 1) if r.strip()]
            symptoms.extend(s for s in extract_lines(catalog, "kernel", node, rel, lines) if s.trusted)
        for rule in catalog.job_rules:  # the scheduler's facts: TIMEOUT, OOM, CANCELLED, COMPLETED...
            sym = rule.run(job)
            if sym is not None:
                symptoms.append(sym)
        from ..rules.jobwide import refine

        refine(symptoms, job, catalog)
    except Exception as err:  # noqa: BLE001 - the partial verdict rests on the job state then
        cov.append(Coverage(source="kernel", status="error", detail=f"not read for the partial verdict: {err}"[:300]))
    return decide(job, symptoms, cov)


def flush_comments(cfg: Config, slurm: SlurmAccess, store: Store, job_ids: list[str],
                   sleep: Any = time.sleep) -> dict[str, str]:
    """Write the queued comments of ``job_ids`` together (comment.write_many); a job accounting
    has no record of yet is asked again (slurmdbd may lag the end by a second or two), the
    others wait in the queue when accounting is down. {job id: error} of those not written."""
    todo = list(job_ids)

    def write() -> dict[str, str]:
        nonlocal todo
        got = comment.write_many(slurm, store, todo, cfg.comment.max_attempts, cfg.comment.max_len)
        failed = {j: err for j, (ok, err) in got.items() if not ok}
        todo = [j for j, err in failed.items() if "no record" in err]
        return failed

    def settled(failed: dict[str, str]) -> bool:
        # All written, or accounting is down, not lagging: the queue retries later.
        return not todo or any("no record" not in e and "did not keep" not in e for e in failed.values())

    pauses = iter((0.5, 1.0, 2.0, 4.0, 4.0))  # doubling, at most 4 s, between six tries
    failed = wait_until(write, None, lambda _: next(pauses), f"accounting's records of {len(job_ids)} job(s) to comment",
                        done=settled, max_tries=6, sleep=sleep).value
    for j, err in failed.items():
        log.info("job %s: comment not written yet (%s)", j, err)
    return failed


def _publish_user_copy(cfg: Config, job: dict[str, Any], verdict: Verdict) -> None:
    # What `sattr <job>` shows the job's user (the database is root's, the Comment is theirs).
    from .. import usercopy

    try:
        usercopy.publish(cfg, job, verdict)
    except (OSError, SattrError) as err:
        log.warning("job %s: user copy of the verdict not written: %s", verdict.job_id, err)


def bundle_for(cfg: Config, key: str) -> str:
    return spool.bundle_dir(cfg.paths.spool, key)
