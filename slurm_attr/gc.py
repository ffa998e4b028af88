"""Spool retention, by job: what one job filled is removed before anyone else's data.

A job's spool data is its bundles (``bundles/<id>``, a requeued run's ``bundles/<id>.rN``) and
its live dir (``live/<id>``: node summaries, probe snapshots, pre-kill dumps), grouped by the
numeric job id (an array task's own id). Its age is its newest write, its size all of it, live
dir included. Sizes count allocated blocks, which is what fills a disk. Three passes:

1. **Budget.** A live dir over ``[live] job_cap_bytes`` is pruned before any other job's data is
   touched, largest overage first (a job's ranks choose what its watchers write: DESIGN 5). One
   its job may still need (written in the last ``LIVE_BUSY_S``, pending, or without a verdict
   yet) loses only its bulky, re-creatable parts (``dumps/``, then ``steps/`` if still over);
   its findings, summaries and dump requests stay. Any other goes whole.
2. **Age.** A job whose newest data is older than ``[spool] keep_days`` goes, oldest first.
   One with no verdict stored and none pending goes too (an orphan: no analysis will come for
   it), logged as such, so orphans cannot pile up.
3. **Live bulk.** Over ``[spool] max_bytes``, the live dirs' dumps and snapshots go first,
   largest first, running jobs' too (never a pending job's): they are what a job's own ranks
   chose to answer, untrusted and re-creatable, while a bundle holds the node's kernel log
   and the scheduler's facts. So a job that filled its live budget loses that before anyone
   else loses a bundle.
4. **Size.** Then the oldest jobs until the spool fits ``[spool] max_bytes``.

Never removed: a pending job's data (its analysis still needs it: ``intake``), a live dir
written in the last ``LIVE_BUSY_S`` (its watchers write there), and, by the size pass, the data
of a job with no verdict stored for its newest bundle until ``ORPHAN_GRACE_S`` after its last
write (its node parts may land before the controller hook records it pending).

``sattr gc`` runs it; the analyser runs it too, at most every ``AUTO_EVERY_S``.
"""
from __future__ import annotations

import logging
import os
import shutil
import stat
import time
from dataclasses import dataclass, field
from typing import Any

from . import spool, turns
from .pipeline import intake
from .config import Config

log = logging.getLogger("slurm_attr")

AUTO_EVERY_S = 600.0
LIVE_BUSY_S = 600.0  # watchers rewrite their summaries every few seconds while the job runs
# The controller hook records a job pending seconds after its node epilogs wrote its bundle; a
# day without either a pending record or a verdict means no analysis is coming.
ORPHAN_GRACE_S = 86400.0
STAMP = ".gc-stamp"
# Re-creatable bulk of a live dir: pre-kill dumps (FR, stacks) and probe snapshots. A running
# job's watchers write them again when needed; findings, summaries and dump requests are small
# and are what `sattr JOB` and the post-mortem read.
BULKY = ("dumps", "steps")


@dataclass
class GcResult:
    removed: list[dict[str, Any]] = field(default_factory=list)
    kept_pending: list[str] = field(default_factory=list)
    kept_unverdicted: list[str] = field(default_factory=list)
    bytes_before: int = 0
    bytes_after: int = 0
    errors: list[str] = field(default_factory=list)


@dataclass
class _Job:
    """One job's spool data: its bundles (oldest attempt first) and its live dir."""
    id: str
    bundles: list[dict[str, Any]] = field(default_factory=list)
    live: dict[str, Any] | None = None
    pending: bool = False
    settled: bool = False  # its newest bundle's verdict (and so every earlier one's) is stored

    @property
    def items(self) -> list[dict[str, Any]]:
        return self.bundles + ([self.live] if self.live else [])

    @property
    def mtime(self) -> float:
        return max(i["mtime"] for i in self.items)

    @property
    def bytes(self) -> int:
        return sum(i["bytes"] for i in self.items)


def tree_bytes(path: str) -> int:
    """Allocated bytes under path, links not followed."""
    return _tree(path, 0.0)[0]


def _tree(path: str, mtime: float) -> tuple[int, float]:
    """(allocated bytes, newest mtime) under path in one walk, links not followed. The newest
    mtime is what ages a live dir: a watcher's rewrite of summary/<step>/<node>.json changes
    that file and its own dir, not the job dir."""
    total = 0
    for root, dirs, files in os.walk(path, followlinks=False):
        for name in files + dirs:
            try:
                st = os.lstat(os.path.join(root, name))
            except OSError:
                continue
            total += st.st_blocks * 512
            mtime = max(mtime, st.st_mtime)
    return total, mtime


def _job_of(name: str) -> str:
    """The numeric job id a spool name belongs to: ``123`` for ``123`` and ``123.r2``."""
    return name.split(".r", 1)[0]


def _attempt(name: str) -> int:
    rest = name.partition(".r")[2]
    return int(rest) if rest.isdigit() else 0


def _dirs(root: str, prefix: str = "", newest: bool = False) -> list[dict[str, Any]]:
    try:
        names = os.listdir(root)
    except OSError:
        return []
    out = []
    for name in names:
        path = os.path.join(root, name)
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if not stat.S_ISDIR(st.st_mode):
            continue
        size, last = _tree(path, st.st_mtime)
        out.append({"key": prefix + name, "name": name, "job": _job_of(name), "path": path,
                    "mtime": last if newest else st.st_mtime, "bytes": size, "live": bool(prefix)})
    return out


def bundles(cfg: Config) -> list[dict[str, Any]]:
    """Every bundle and live dir on the spool: key, job, path, mtime, bytes; oldest first."""
    out = _dirs(spool.bundles_root(cfg.paths.spool))
    out += _dirs(os.path.join(cfg.paths.spool, "live"), prefix="live/", newest=True)
    out.sort(key=lambda b: (b["mtime"], b["key"]))
    return out


def _stored_attempts(cfg: Config, ids: set[str]) -> dict[str, int] | None:
    """store.verdict_attempts for these jobs; {} with no database yet (nothing was ever stored);
    None when the store cannot answer (then no job counts as settled: space is not worth a
    bundle whose verdict may be missing)."""
    if not os.path.exists(cfg.paths.database):
        return {}
    from .store import Store

    try:
        return Store(cfg.paths.database).verdict_attempts(ids)
    except Exception as err:  # noqa: BLE001 - locked or broken store: keep, retry next run
        log.warning("spool gc: verdict store unreadable (%s); no bundle removed for space", err)
        return None


def _jobs(cfg: Config, items: list[dict[str, Any]], res: GcResult) -> list[_Job]:
    """Group the spool's dirs by job and mark which are pending and which settled."""
    jobs: dict[str, _Job] = {}
    for it in items:
        job = jobs.setdefault(it["job"], _Job(it["job"]))
        if it["live"]:
            job.live = it
        else:
            job.bundles.append(it)
    pending = intake.keys(cfg)
    stored = _stored_attempts(cfg, set(jobs))
    if stored is None:
        res.errors.append("verdict store unreadable: no bundle removed for space")
    for job in jobs.values():
        job.bundles.sort(key=lambda b: (_attempt(b["name"]), b["name"]))
        job.pending = job.id in pending or any(b["name"] in pending for b in job.bundles)
        newest = max((_attempt(b["name"]) for b in job.bundles), default=0)
        job.settled = stored is not None and job.id in stored and stored[job.id] >= newest
    return sorted(jobs.values(), key=lambda j: (j.mtime, j.id))


class _Run:
    """One gc run: the plan and (unless dry_run) its removals, in the order decided."""

    def __init__(self, cfg: Config, dry_run: bool, now: float) -> None:
        self.cfg, self.dry_run, self.now = cfg, dry_run, now
        self.res = GcResult()
        self.total = 0
        self.gone: set[str] = set()  # paths removed (or, dry-run, planned) by an earlier pass

    def busy(self, job: _Job) -> bool:
        return job.live is not None and self.now - job.live["mtime"] < LIVE_BUSY_S

    def remove(self, job: _Job, item: dict[str, Any], why: str, path: str = "", key: str = "",
               size: int | None = None) -> bool:
        """Remove item (or path inside it, a part of size bytes) and record why."""
        path, key = path or item["path"], key or item["key"]
        size = item["bytes"] if size is None else size
        if path in self.gone or os.path.dirname(path) in self.gone:
            return True  # a dry run plans on a tree it does not change: count it once
        self.gone.add(path)
        if not self.dry_run:
            try:
                if stat.S_ISDIR(os.lstat(path).st_mode):
                    shutil.rmtree(path)  # fd-relative on Linux: links inside are removed, not followed
                else:
                    os.unlink(path)  # a link or file where a dir belongs: never followed
            except FileNotFoundError:
                pass
            except OSError as err:
                self.res.errors.append(f"{key}: {err}")
                return False
        self.total -= size
        item["bytes"] -= size
        self.res.removed.append({"key": key, "job": job.id, "bytes": size, "why": why})
        return True

    def drop(self, job: _Job, why: str) -> None:
        """Remove every dir of the job but a busy live dir; drop it from further passes."""
        for it in list(job.items):
            if it is job.live and self.busy(job):
                continue  # its job may still be running: its watchers write here
            if self.remove(job, it, why):
                if it is job.live:
                    job.live = None
                else:
                    job.bundles.remove(it)


def _part_bytes(root: str, part: str) -> int:
    """Allocated bytes of root/part and everything under it; 0 when it is not there."""
    path = os.path.join(root, part)
    try:
        return os.lstat(path).st_blocks * 512 + tree_bytes(path)
    except OSError:
        return 0


def _budget_pass(run: _Run, jobs: list[_Job]) -> None:
    """Live dirs over ``[live] job_cap_bytes``, largest overage first, before anything else."""
    cap = run.cfg.live.job_cap_bytes
    over = [(j, j.live) for j in jobs if j.live is not None and j.live["bytes"] > cap]
    over.sort(key=lambda jl: (cap - jl[1]["bytes"], jl[0].id))
    for job, live in over:
        why = f"live data {live['bytes']} bytes, over its job's budget of {cap} bytes"
        if not (run.busy(job) or job.pending or not job.settled):
            if run.remove(job, live, why):
                job.live = None
            continue
        # Its job may run, or its analysis may still read the findings: only the bulk goes,
        # the larger part first, until the dir fits its budget (snapshots are evidence too).
        keep = "running" if run.busy(job) else "pending" if job.pending else "no verdict yet"
        for size, part in sorted(((_part_bytes(live["path"], p), p) for p in BULKY), reverse=True):
            if live["bytes"] <= cap or size == 0:
                break
            run.remove(job, live, f"{why}; the rest kept ({keep})", path=os.path.join(live["path"], part),
                       key=f"{live['key']}/{part}", size=size)


def _age_pass(run: _Run, jobs: list[_Job]) -> None:
    """Jobs whose newest data is older than keep_days, oldest first; never a pending one's."""
    days = run.cfg.spool.keep_days
    if days <= 0:
        return
    cutoff = run.now - days * 86400
    for job in jobs:
        if not job.items or job.mtime >= cutoff:
            continue
        if job.pending:
            run.res.kept_pending += [i["key"] for i in job.items]
            continue
        why = f"older than {days:g} days"
        if not job.settled:
            why += ", no verdict stored"
            log.warning("spool gc: job %s has had no verdict for %g days; removing its spool data", job.id, days)
        run.drop(job, why)


def _live_bulk_pass(run: _Run, jobs: list[_Job]) -> None:
    """Over max_bytes: live dumps and snapshots before any bundle, the largest first."""
    cap = run.cfg.spool.max_bytes
    if cap <= 0 or run.total <= cap:
        return
    parts = sorted(((_part_bytes(j.live["path"], p), j, p) for j in jobs if j.live is not None and not j.pending
                    for p in BULKY), key=lambda x: (-x[0], x[1].id, x[2]))
    for size, job, part in parts:
        if run.total <= cap or size == 0:
            return
        live = job.live
        run.remove(job, live, f"spool over {cap} bytes: live {part} (the job's own answers) before any bundle",
                   path=os.path.join(live["path"], part), key=f"{live['key']}/{part}", size=size)


def _size_pass(run: _Run, jobs: list[_Job]) -> None:
    """The oldest jobs until the spool fits max_bytes; never a pending job's data, nor a
    job's whose verdict is not stored yet (within ORPHAN_GRACE_S of its last write)."""
    cap = run.cfg.spool.max_bytes
    if cap <= 0:
        return
    for job in jobs:
        if run.total <= cap:
            return
        if not job.items:
            continue
        if job.pending:
            run.res.kept_pending += [i["key"] for i in job.items if i["key"] not in run.res.kept_pending]
            continue
        if not job.settled and run.now - job.mtime < ORPHAN_GRACE_S:
            run.res.kept_unverdicted += [i["key"] for i in job.items]
            continue
        run.drop(job, f"spool over {cap} bytes" + ("" if job.settled else ", no verdict stored"))


def collect(cfg: Config, dry_run: bool = False, now: float | None = None) -> GcResult:
    """Prune the spool by job (module docstring); dry_run plans the same and removes nothing."""
    run = _Run(cfg, dry_run, time.time() if now is None else now)
    items = bundles(cfg)
    run.total = run.res.bytes_before = sum(b["bytes"] for b in items)
    jobs = _jobs(cfg, items, run.res)
    _budget_pass(run, jobs)
    _age_pass(run, jobs)
    _live_bulk_pass(run, jobs)
    _size_pass(run, jobs)
    run.res.bytes_after = run.total
    return run.res


def maybe_collect(cfg: Config, now: float | None = None) -> GcResult | None:
    """Run ``collect`` when the last run is older than AUTO_EVERY_S; never raises."""
    now = time.time() if now is None else now
    try:
        if not turns.take(cfg.intake.queue_dir, STAMP, AUTO_EVERY_S, now):
            return None
        res = collect(cfg, now=now)
    except Exception as err:  # noqa: BLE001 - retention must never cost a verdict
        log.error("spool gc failed: %s", err)
        return None
    if res.removed:
        log.info("spool gc: removed %d bundles (%d bytes), %d bytes left", len(res.removed),
                 res.bytes_before - res.bytes_after, res.bytes_after)
    return res
