"""After a job ended: wait for the node parts, analyse, store, act, comment.

Started detached by EpilogSlurmctld so the job can finish COMPLETING while
this runs. Each step degrades on its own: no accounting -> the comment waits in
the queue; a node that never delivered -> a coverage entry; a broken analyser
-> coverage, not silence.
"""
from __future__ import annotations

import json
import logging
import os
import time
from typing import Any

from . import comment, spool
from .analysis import run_bundle
from .collect import controller
from .config import Config
from .errors import SlurmError
from .model import Verdict
from .slurm.base import SlurmAccess
from .store import Store

log = logging.getLogger("slurm_attr")

# Accounting writes are asynchronous: the final state can lag the job's end by seconds.
SACCT_SETTLE_S = 10.0


def read_job_json(bundle_dir: str) -> dict[str, Any]:
    try:
        with open(os.path.join(bundle_dir, "job.json"), "rb") as f:
            data = json.loads(f.read(1 << 20))
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _settle_state(slurm: SlurmAccess, job: dict[str, Any], deadline: float) -> dict[str, Any]:
    raw = str(job.get("slurm_job_id") or job.get("job_id", ""))
    while True:
        try:
            row = slurm.sacct_job(raw)
        except SlurmError as err:
            log.info("job %s: accounting not answering (%s); using scontrol's state", raw, err)
            return job
        job = controller.refresh_state(job, row)
        if job.get("state_source") == "sacct" or time.monotonic() >= deadline:
            return job
        time.sleep(0.5)


def finish_job(cfg: Config, slurm: SlurmAccess, store: Store, bundle_dir: str) -> Verdict:
    """The whole after-the-job flow for one bundle; returns the stored verdict."""
    from . import drain

    t0 = time.monotonic()
    job = read_job_json(bundle_dir)
    nodes = [n for n in job.get("nodes") or [] if isinstance(n, str)]
    missing = controller.wait_for_nodes(bundle_dir, nodes, t0 + cfg.analysis.node_wait_s)
    if missing:
        log.warning("job %s: no node part from %s after %.0fs", job.get("job_id"), ",".join(missing),
                    cfg.analysis.node_wait_s)
    job = _settle_state(slurm, job, time.monotonic() + SACCT_SETTLE_S)
    with open(os.path.join(bundle_dir, "job.json"), "w") as f:
        json.dump(job, f, indent=1)

    verdict = run_bundle(bundle_dir, cfg, history=store)
    verdict.actions = drain.apply_policy(cfg, verdict, job, slurm=slurm, store=store, path="central")
    store.save(job, verdict, bundle_path=bundle_dir, analysis_ms=(time.monotonic() - t0) * 1000)
    if verdict.actions:
        store.record_actions(verdict.job_id, verdict.actions, path="central")

    if cfg.comment.enabled:
        text = comment.verdict_text(verdict, cfg.comment.max_len)
        raw = str(job.get("slurm_job_id") or verdict.job_id)
        store.queue_comment(verdict.job_id, raw, cfg.comment.field, text)
        _write_comment_with_retries(cfg, slurm, store, verdict.job_id)
        # Anything an earlier outage left queued goes out now too.
        comment.retry_pending(slurm, store, cfg.comment.max_attempts)
    log.info("job %s: %s (%s) in %.0f ms", verdict.job_id, verdict.cause, verdict.summary,
             (time.monotonic() - t0) * 1000)
    return verdict


def _write_comment_with_retries(cfg: Config, slurm: SlurmAccess, store: Store, job_id: str) -> None:
    # slurmdbd may not have the job's record for a second or two after the end.
    delay = 0.5
    for _ in range(6):
        ok, err = comment.write(slurm, store, job_id, cfg.comment.max_attempts)
        if ok:
            return
        log.info("job %s: comment not written yet (%s)", job_id, err)
        if "no record" not in err:
            return  # accounting is down, not lagging: the queue retries later
        time.sleep(delay)
        delay = min(delay * 2, 4.0)


def bundle_for(cfg: Config, key: str) -> str:
    return spool.bundle_dir(cfg.paths.spool, key)
