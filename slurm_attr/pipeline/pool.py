"""At most ``[analysis] workers`` analysis workers on the controller, started by the hooks.

Slots are lock files ``<queue_dir>/.worker-<i>.lock``. The hook that recorded a job takes a free
slot (a non-blocking flock) and starts a worker that inherits the locked file, so the slot is the
worker's from its first instant: a burst of 5,000 hooks starts at most ``workers`` workers, and
no daemon is needed. A worker drains the intake in batches (one sacct and one node listing per
batch, the daemon logs read once: batch.py), each job through ``attempt.process``, at low CPU
and I/O priority. With nothing left it gives its slot back and looks once more: a hook that found every
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
from . import batch, catchup, ctldrecord, intake, offload
from ..config import Config

log = logging.getLogger("slurm_attr")

METRICS_STAMP, METRICS_EVERY_S = ".metrics-turn", 5.0  # [metrics] textfile from the batches (_metrics_turn)
POLL_S = 0.5         # while the only jobs left wait for node parts or accounting
BACKOFF_WAIT_S = 30.0  # a job whose next try is this close keeps the worker waiting for it
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
        todo = [d for d, r in states if r][:batch.BATCH]
        waiting = any(r is None for _d, r in states)
        if todo:
            done = batch.run(cfg, batched, todo, open_store)
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
        metrics.publish(cfg, batch.store_for(cfg, open_store))
    except Exception as err:  # noqa: BLE001 - the store would not open; the next batch tries again
        log.warning("metrics not published: %s", err)


def _after_run(cfg: Config, batched: Any, counts: Counter[str], open_store: Any) -> None:
    """Once per run, not per job: the comment queue and recent comments re-checked, the spool
    pruned; once a day, the store too."""
    from .. import diag, gc, storeretention

    if counts.get("stored"):
        batch.sweep_comments(cfg, batched, open_store)
    gc.maybe_collect(cfg)
    storeretention.maybe_prune(cfg)  # [store] keep_days
    _publish_metrics(cfg, open_store)  # the queue's age too, when nothing was stored
    diag.maybe_start_auto(cfg)  # [actions] auto_undrain, detached: a diagnostic must not hold this slot
    import resource

    use = [resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    log.info("worker done: %s; %d Slurm calls for its batches; cpu %.2fs",
             " ".join(f"{k}={v}" for k, v in sorted(counts.items())) or "nothing to do", batched.calls,
             sum(u.ru_utime + u.ru_stime for u in use))


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
