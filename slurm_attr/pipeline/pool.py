"""At most ``[analysis] workers`` analysis workers on the controller, started by the hooks.

Slots are lock files ``<queue_dir>/.worker-<i>.lock``. The hook that recorded a job takes a free
slot (a non-blocking flock) and starts a worker that inherits the locked file, so the slot is the
worker's from its first instant: a burst of 5,000 hooks starts at most ``workers`` workers, and
no daemon is needed. A worker drains the intake in batches (one sacct and one node listing per
batch, the daemon logs read once), each job through ``attempt.process``, at low CPU and I/O
priority. With nothing left it gives its slot back and looks once more: a hook that found every
slot taken relies on that look. Before each batch the worker re-reads the site config when its
file changed: a worker may drain the queue for long, and an admin's change (offload, actions,
drain limits) applies to the next batch, not to the next worker. A killed worker loses nothing: its jobs stay pending (their
claim locks die with it) and the next worker, or ``sattr retry``, takes them.
"""
from __future__ import annotations

import errno
import fcntl
import logging
import os
import subprocess
import sys
import time
from collections import Counter
from typing import Any

from .. import spool
from . import catchup, ctldrecord, intake, offload
from ..config import Config
from ..waiting import wait_until

log = logging.getLogger("slurm_attr")

METRICS_STAMP, METRICS_EVERY_S = ".metrics-turn", 5.0  # [metrics] textfile from the batches (_metrics_turn)
BATCH = 200          # jobs per batch: one sacct call (its id list is bounded at 200 too)
POLL_S = 0.5         # while the only jobs left wait for node parts or accounting
SETTLE_S = 10.0      # a job accounting has no final state for yet waits this long after its end
# A batch's comments are written together (one slurmdbd connection) every this many verdicts
# or seconds, whichever comes first: the Comment trails its verdict by at most a few seconds.
COMMENT_FLUSH_N = 50
COMMENT_FLUSH_S = 5.0
BACKOFF_WAIT_S = 30.0  # a job whose next try is this close keeps the worker waiting for it
YIELD_POLL_S = 1.0   # how often a yielding worker looks at the host's CPU pressure again
_offload_asked: dict[str, float] = {}  # pending key -> when this worker last asked about its analysis job
FD_ENV = "SLURM_ATTR_WORKER_FD"


def slots(cfg: Config) -> int:
    if cfg.analysis.workers > 0:
        return cfg.analysis.workers
    return max(1, (os.cpu_count() or 1) // 4)


def _take_slot(cfg: Config) -> int | None:
    """A locked slot file's descriptor, or None when every slot is held."""
    os.makedirs(cfg.intake.queue_dir, mode=0o700, exist_ok=True)
    for i in range(slots(cfg)):
        fd = os.open(os.path.join(cfg.intake.queue_dir, f".worker-{i}.lock"),
                     os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except OSError as err:
            os.close(fd)
            if err.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise
    return None


def _child_env(env: dict[str, str]) -> dict[str, str]:
    out = {k: v for k, v in env.items() if k.startswith(("SLURM_ATTR_", "SLURM_CONF", "PATH", "LANG", "TZ"))}
    out["SLURM_JOB_ID"] = env.get("SLURM_JOB_ID", "")
    return out


def kick(cfg: Config, env: dict[str, str]) -> bool:
    """Start a worker holding a free slot; False when every slot is busy (a worker will see the job)."""
    try:
        fd = _take_slot(cfg)
    except OSError as err:
        log.error("no worker slot (%s): the job stays pending for `sattr retry`", err)
        return False
    if fd is None:
        return False
    try:
        _detached(["work"], {**_child_env(env), FD_ENV: str(fd)}, (fd,))
    finally:
        os.close(fd)  # the worker's inherited copy keeps the lock
    return True


def spawn_single(key: str, env: dict[str, str]) -> None:
    """One job's analysis, outside the pool: only when its pending record could not be written."""
    _detached(["analyze", key], _child_env(env))


def _detached(args: list[str], env: dict[str, str], fds: tuple[int, ...] = ()) -> None:
    """``python -m slurm_attr.hooks ARGS`` in its own session, no pipes: slurmctld waits for neither."""
    with open(os.devnull, "rb") as dn_in, open(os.devnull, "wb") as dn_out:
        subprocess.Popen([sys.executable, "-m", "slurm_attr.hooks", *args], stdin=dn_in, stdout=dn_out,
                         stderr=dn_out, start_new_session=True, env=env, pass_fds=fds)


def lower_priority() -> None:
    """slurmctld comes first on its own host: the batch scheduling class at nice 19 (the CPU
    share of a nice-19 task beside a nice-0 one is about 1.5%, where nice 10 left ~10%: a burst
    of job ends then slowed `squeue` 1.66x at p90 on the 2-core test controller) and the lowest
    best-effort I/O class. Workers catch up once the burst's own load is over."""
    try:
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
    except (OSError, AttributeError):
        pass
    try:
        os.nice(19 - os.nice(0))
    except OSError:
        pass
    import ctypes
    import platform

    nr = {"x86_64": 251, "aarch64": 30, "ppc64le": 273}.get(platform.machine())
    if nr is None:
        return
    try:  # ioprio_set(IOPRIO_WHO_PROCESS, self, class best-effort (2) << 13 | level 7)
        ctypes.CDLL(None, use_errno=True).syscall(nr, 1, 0, (2 << 13) | 7)
    except (OSError, AttributeError):
        pass


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


def _nodes_in(bdir: str, nodes: list[str]) -> bool:
    return all(os.path.exists(os.path.join(bdir, "nodes", n, "collect.json")) for n in nodes)


def _ready(cfg: Config, doc: dict[str, Any], now: float) -> bool | None:
    """True: analyse now; None: later (its node parts may still come, its short backoff ends
    soon); False: not this run's (a failed job in a long backoff: `sattr retry` and later hooks
    take it)."""
    if int(doc.get("attempts") or 0) and float(doc.get("next_try") or 0) > now:
        # A short backoff (a locked database, accounting a moment behind) is waited out by the
        # worker that has the slot: given back, the job would wait for the next job's end or the
        # timer. A long one is `sattr retry`'s and the later hooks'.
        return None if float(doc["next_try"]) - now <= BACKOFF_WAIT_S else False
    if doc.get("offload"):
        # Its analysis runs as a Slurm job: take it when the result is there, and ask accounting
        # whether that job ended without one at most every offload.POLL_S.
        if os.path.exists(os.path.join(spool.bundle_dir(cfg.paths.spool, doc["key"]), offload.RESULT)):
            return True
        if now - _offload_asked.get(doc["key"], 0.0) >= offload.POLL_S:
            _offload_asked[doc["key"]] = now
            return True
        return None
    if now - float(doc.get("since") or 0) >= cfg.analysis.node_wait_s:
        return True
    # No bundle dir yet is "not yet" too: the node epilogs run beside this hook, not before it.
    nodes = [n for n in (doc.get("job") or {}).get("nodes") or [] if isinstance(n, str)]
    return True if _nodes_in(spool.bundle_dir(cfg.paths.spool, doc["key"]), nodes) else None


def _raw_id(doc: dict[str, Any]) -> str:
    job = doc.get("job") or {}
    return str(job.get("slurm_job_id") or job.get("job_id") or doc["key"].split(".r")[0])


def work(cfg: Config, fd: int, slurm: Any = None, open_store: Any = None) -> Counter[str]:
    """Drain the intake while holding slot ``fd``; returns the outcomes counted."""
    from ..slurm import from_config
    from ..slurm.batched import Batched

    batched = Batched(slurm if slurm is not None else from_config(cfg, timeout=10))
    counts: Counter[str] = Counter()
    seen = config_stamp(cfg)
    while True:
        cfg, seen = reloaded(cfg, seen)
        ctldrecord.ingest(cfg)  # what the C front recorded since the last look
        now = time.time()
        docs = intake.entries(cfg)
        states = [(d, _ready(cfg, d, now)) for d in docs]
        todo = [d for d, r in states if r][:BATCH]
        waiting = any(r is None for _d, r in states)
        if todo:
            done = _batch(cfg, batched, todo, open_store)
            counts.update(done.values())
            if "stored" in done.values() and _metrics_turn(cfg):
                _publish_metrics(cfg, open_store)
            if all(v in ("busy", "settling", "offloaded") for v in done.values()):
                time.sleep(POLL_S)  # all taken by the other workers, or waiting for accounting
            continue
        if waiting:
            time.sleep(POLL_S)
            continue
        if catchup.maybe_run(cfg, batched.backend):
            continue  # jobs accounting has and the intake had not (catchup.py): drained with this slot
        os.close(fd)  # nothing left: the slot goes back, then one more look (see the module doc)
        ctldrecord.ingest(cfg)
        if not any(_ready(cfg, d, time.time()) is not False for d in intake.entries(cfg)):
            break
        got = _take_slot(cfg)
        if got is None:
            break  # another worker holds a slot and will see it
        fd = got
    _after_run(cfg, batched, counts, open_store)
    return counts


def config_stamp(cfg: Config) -> tuple[int, int, int] | None:
    """(inode, size, mtime) of the file the config came from; None for defaults or no file."""
    try:
        st = os.stat(cfg.source) if cfg.source else None
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns) if st else None


def reloaded(cfg: Config, seen: tuple[int, int, int] | None) -> tuple[Config, tuple[int, int, int] | None]:
    """The config read again when its file changed since ``seen``; a file that no longer loads
    keeps the one in use (logged once per change)."""
    from .. import config as config_mod
    from ..errors import ConfigError

    now = config_stamp(cfg)
    if now is None or now == seen:
        return cfg, seen
    try:
        fresh = config_mod.load(cfg.source)
    except ConfigError as err:
        log.warning("config changed but does not load (%s); this worker keeps the one it has", err)
        return cfg, now
    log.info("config %s changed: re-read for the next batch", cfg.source)
    return fresh, now


def retry_due(cfg: Config, slurm: Any = None, limit: int = 20, everything: bool = False,
              open_store: Any = None) -> dict[str, str]:
    """`sattr retry`: one attempt for each pending job whose backoff has passed (or every one, up to
    ``limit``): {key: outcome}. Through the workers' batches, so a backlog costs Slurm what it
    costs a worker (one sacct per BATCH jobs, comments written together, one sweep at the end),
    not three calls per job: 200 jobs left by a full spool took 1.8 s each one at a time."""
    from ..slurm import from_config
    from ..slurm.batched import Batched

    ctldrecord.ingest(cfg)  # jobs the C front recorded while no worker ran
    todo = (intake.entries(cfg) if everything else intake.due(cfg))[:max(0, limit)]
    batched = Batched(slurm if slurm is not None else from_config(cfg, timeout=10))
    out: dict[str, str] = {}
    for at in range(0, len(todo), BATCH):
        # settle_first=False: each job waits for accounting itself (settle.py), as an admin's
        # retry of a job that just ended expects; a worker moves on and comes back instead.
        out.update(_batch(cfg, batched, todo[at:at + BATCH], open_store, settle_first=False))
    if "stored" in out.values() and cfg.comment.enabled:
        from .finish import sweep_comment_queue

        try:
            sweep_comment_queue(cfg, batched.backend, open_store(cfg) if open_store else _store(cfg))
        except Exception as err:  # noqa: BLE001 - the timer's `sattr comments --verify` does it later
            log.warning("comment sweep skipped: %s", err)
    return out


def _batch(cfg: Config, batched: Any, todo: list[dict[str, Any]], open_store: Any,
           settle_first: bool = True) -> dict[str, str]:
    from . import attempt
    from ..collect.controller import SCHEDULER_LOG_CAP, SchedulerLogs, log_paths

    batched.prefetch([_raw_id(d) for d in todo])
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
        if settle_first and not batched.settled(_raw_id(doc)) and now - float(doc.get("since") or 0) < SETTLE_S:
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
        flush_comments(cfg, batched.backend, open_store(cfg) if open_store else _store(cfg), list(comments))
    except Exception as err:  # noqa: BLE001 - the verdicts are stored; the queue keeps the comments
        log.warning("%d comments left queued: %s", len(comments), err)
    comments.clear()


def _metrics_turn(cfg: Config) -> bool:
    """Whether a batch may rewrite the metrics now: each render reads the whole store (~0.1 s at
    100,000 verdicts), so a stream of one-job batches rewrites at most every METRICS_EVERY_S
    (the run's end always does: the file is current once the queue is drained)."""
    from .. import turns

    if not cfg.metrics.textfile:
        return False
    try:
        return turns.take(cfg.intake.queue_dir, METRICS_STAMP, METRICS_EVERY_S, time.time())
    except OSError:
        return True


def _publish_metrics(cfg: Config, open_store: Any) -> None:
    """The site's metrics textfile, after each batch that stored verdicts (a batch, not each
    verdict: in a burst, one store read per BATCH jobs)."""
    if not cfg.metrics.textfile:
        return
    from ..fleet import metrics

    try:
        metrics.publish(cfg, open_store(cfg) if open_store else _store(cfg))
    except Exception as err:  # noqa: BLE001 - the store would not open; the next batch tries again
        log.warning("metrics not published: %s", err)


def _after_run(cfg: Config, batched: Any, counts: Counter[str], open_store: Any) -> None:
    """Once per run, not per job: the comment queue and recent comments re-checked, the spool
    pruned; once a day, the store too."""
    from .. import diag, gc, storeretention
    from .finish import sweep_comment_queue

    if counts.get("stored") and cfg.comment.enabled:
        try:
            store = open_store(cfg) if open_store else _store(cfg)
            sweep_comment_queue(cfg, batched.backend, store)
        except Exception as err:  # noqa: BLE001 - the timer's `sattr comments --verify` does it later
            log.warning("comment sweep skipped: %s", err)
    gc.maybe_collect(cfg)
    storeretention.maybe_prune(cfg)  # [store] keep_days
    _publish_metrics(cfg, open_store)  # the queue's age too, when nothing was stored
    diag.maybe_start_auto(cfg)  # [actions] auto_undrain, detached: a diagnostic must not hold this slot
    import resource

    use = [resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    log.info("worker done: %s; %d Slurm calls for its batches; cpu %.2fs",
             " ".join(f"{k}={v}" for k, v in sorted(counts.items())) or "nothing to do", batched.calls,
             sum(u.ru_utime + u.ru_stime for u in use))


def _store(cfg: Config) -> Any:
    from ..store import Store

    return Store(cfg.paths.database)


def work_main(env: dict[str, str]) -> int:
    """``python -m slurm_attr.hooks work``: the slot comes locked from the hook (FD_ENV), or is
    taken here (a site's systemd unit, `sattr` by hand); none free: nothing to do."""
    from .. import config as config_mod

    cfg = config_mod.load()
    fd = int(env[FD_ENV]) if env.get(FD_ENV, "").isdigit() else _take_slot(cfg)
    if fd is None:
        return 0
    lower_priority()
    work(cfg, fd)
    return 0
