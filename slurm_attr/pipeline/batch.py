"""One batch of pending jobs through ``attempt.process``: accounting asked once for the lot
(``slurm.batched``), each job after the host's CPU pressure let it (slurmctld first), the
comments written together every COMMENT_FLUSH_N verdicts or COMMENT_FLUSH_S seconds. The
workers (pool.py) run their batches here, and so does `sattr retry` (``retry_due``): a backlog
costs Slurm the same whoever drains it.
"""
from __future__ import annotations

import logging
import time
from typing import Any

from . import ctldrecord, intake
from ..config import Config
from ..waiting import wait_until

log = logging.getLogger("slurm_attr")

BATCH = 200          # jobs per batch: one sacct call (its id list is bounded at 200 too)
SETTLE_S = 10.0      # a job accounting has no final state for yet waits this long after its end
# A batch's comments are written together (one slurmdbd connection) every this many verdicts
# or seconds, whichever comes first: the Comment trails its verdict by at most a few seconds.
COMMENT_FLUSH_N = 50
COMMENT_FLUSH_S = 5.0
YIELD_POLL_S = 1.0   # how often a yielding worker looks at the host's CPU pressure again


def cpu_pressure(path: str = "/proc/pressure/cpu") -> float | None:
    """The host's CPU pressure: the share of the last 10 s in which some runnable task waited for a
    CPU (PSI "some avg10", percent); None where the kernel has no PSI."""
    try:
        with open(path, "rb") as f:
            line = f.readline(256)
    except OSError:
        return None
    for part in line.split():
        if part.startswith(b"avg10="):
            try:
                return float(part[6:])
            except ValueError:
                return None
    return None


def yield_to_controller(cfg: Config, since: float, sleep: Any = time.sleep, pressure: Any = cpu_pressure) -> float:
    """Before a job: wait while the controller's CPU is under pressure ([analysis] yield_pressure,
    PSI percent; a burst of job ends is exactly when slurmctld needs its host), but never past
    [analysis] yield_max_s after the job's end. Returns the seconds waited."""
    limit = cfg.analysis.yield_pressure
    left = cfg.analysis.yield_max_s - (time.time() - since)
    if limit <= 0 or left <= 0:
        return 0.0
    got = wait_until(pressure, left, YIELD_POLL_S, f"the controller's CPU pressure to fall below {limit:g}%",
                     done=lambda p: p is None or p < limit, sleep=sleep)
    return (got.tries - 1) * YIELD_POLL_S  # one pause between two readings


def raw_id(doc: dict[str, Any]) -> str:
    job = doc.get("job") or {}
    return str(job.get("slurm_job_id") or job.get("job_id") or doc["key"].split(".r")[0])


def retry_due(cfg: Config, slurm: Any = None, limit: int = 20, everything: bool = False,
              open_store: Any = None) -> dict[str, str]:
    """`sattr retry`: one attempt for each pending job whose backoff has passed (or every one, up to
    ``limit``): {key: outcome}. Through the workers' batches: a backlog costs Slurm what it costs
    a worker, not three calls per job (116 jobs: 3.2 s, one at a time 211.7 s)."""
    from ..slurm import from_config
    from ..slurm.batched import Batched

    ctldrecord.ingest(cfg)  # jobs the C front recorded while no worker ran
    todo = (intake.entries(cfg) if everything else intake.due(cfg))[:max(0, limit)]
    batched = Batched(slurm if slurm is not None else from_config(cfg, timeout=10))
    out: dict[str, str] = {}
    for at in range(0, len(todo), BATCH):
        # settle_first=False: each job waits for accounting itself (settle.py), as an admin's
        # retry of a job that just ended expects; a worker moves on and comes back instead.
        out.update(run(cfg, batched, todo[at:at + BATCH], open_store, settle_first=False))
    if "stored" in out.values():
        sweep_comments(cfg, batched, open_store)
    return out


def run(cfg: Config, batched: Any, todo: list[dict[str, Any]], open_store: Any,
        settle_first: bool = True) -> dict[str, str]:
    """``todo`` (intake records) through attempt.process: {key: outcome}. ``settle_first``: a job
    accounting has no final state for yet, ended under SETTLE_S ago, is left "settling" for the
    next batch rather than waited for here."""
    from . import attempt
    from ..collect.controller import SCHEDULER_LOG_CAP, SchedulerLogs, log_paths

    batched.prefetch([raw_id(d) for d in todo])
    logs = None
    out: dict[str, str] = {}
    now = time.time()
    comments: list[str] = []  # job ids whose comment waits for the next flush
    flushed_at = time.monotonic()
    for doc in todo:
        if comments and (len(comments) >= COMMENT_FLUSH_N or time.monotonic() - flushed_at >= COMMENT_FLUSH_S):
            _flush(cfg, batched, comments, open_store)
            flushed_at = time.monotonic()
        key = doc["key"]
        yield_to_controller(cfg, float(doc.get("since") or 0))
        if settle_first and not batched.settled(raw_id(doc)) and now - float(doc.get("since") or 0) < SETTLE_S:
            out[key] = "settling"  # accounting has not written the end yet: the next batch asks again
            continue
        if logs is None and (doc.get("job") or {}).get("facts_source") == "env":
            logs = SchedulerLogs(log_paths(cfg.collect.scheduler_logs), SCHEDULER_LOG_CAP)
        try:
            out[key] = attempt.process(cfg, key, slurm=batched, open_store=open_store, retry_for_s=0, logs=logs,
                                     pending_only=True, sweep_comments=False, comments_to=comments)
        except Exception as err:  # noqa: BLE001 - one job's failure must not stop the others
            log.exception("job %s: worker could not process it: %s", key, err)
            try:  # counted and backed off, or the next look would take it again at once
                intake.failed(cfg, key, f"worker: {type(err).__name__}: {err}")
            except OSError:
                pass
            out[key] = "error"
    _flush(cfg, batched, comments, open_store)
    return out


def _flush(cfg: Config, batched: Any, comments: list[str], open_store: Any) -> None:
    """The queued comments of the batch's stored verdicts, written together (three Slurm calls
    for the lot); what does not go through stays queued for the sweep and the timer."""
    from .finish import flush_comments

    if not comments:
        return
    try:
        flush_comments(cfg, batched.backend, store_for(cfg, open_store), list(comments))
    except Exception as err:  # noqa: BLE001 - the verdicts are stored; the queue keeps the comments
        log.warning("%d comments left queued: %s", len(comments), err)
    comments.clear()


def sweep_comments(cfg: Config, batched: Any, open_store: Any) -> None:
    """The comment queue and recent comments re-checked, once per run, not per job."""
    from .finish import sweep_comment_queue

    if not cfg.comment.enabled:
        return
    try:
        sweep_comment_queue(cfg, batched.backend, store_for(cfg, open_store))
    except Exception as err:  # noqa: BLE001 - the timer's `sattr comments --verify` does it later
        log.warning("comment sweep skipped: %s", err)


def store_for(cfg: Config, open_store: Any) -> Any:
    """The verdict store through the caller's opener (tests pass one), else the site's."""
    if open_store is not None:
        return open_store(cfg)
    from ..store import Store

    return Store(cfg.paths.database)
