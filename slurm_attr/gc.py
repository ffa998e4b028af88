"""Spool retention: bundles older than ``[spool] keep_days`` go, then the oldest until the
bundles together fit ``[spool] max_bytes``. A pending job's bundle is never pruned (its
analysis still needs it). Sizes count allocated blocks, which is what fills a disk.

The live view's per-job dirs (``<spool>/live/<job>``: node summaries, snapshots, pre-kill
dumps) count and age the same way, keyed ``live/<job>``; one written to in the last
``LIVE_BUSY_S`` belongs to a job that may still run and stays, as does a pending job's.

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

from . import intake, spool
from .config import Config

log = logging.getLogger("slurm_attr")

AUTO_EVERY_S = 600.0
LIVE_BUSY_S = 600.0  # watchers rewrite their summaries every few seconds while the job runs
STAMP = ".gc-stamp"


@dataclass
class GcResult:
    removed: list[dict[str, Any]] = field(default_factory=list)
    kept_pending: list[str] = field(default_factory=list)
    bytes_before: int = 0
    bytes_after: int = 0
    errors: list[str] = field(default_factory=list)


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
        out.append({"key": prefix + name, "job": name, "path": path,
                    "mtime": last if newest else st.st_mtime, "bytes": size})
    return out


def bundles(cfg: Config) -> list[dict[str, Any]]:
    """Every bundle and live dir on the spool: key, job, path, mtime, bytes; oldest first."""
    out = _dirs(spool.bundles_root(cfg.paths.spool))
    out += _dirs(os.path.join(cfg.paths.spool, "live"), prefix="live/", newest=True)
    out.sort(key=lambda b: (b["mtime"], b["key"]))
    return out


def collect(cfg: Config, dry_run: bool = False, now: float | None = None) -> GcResult:
    now = time.time() if now is None else now
    res = GcResult()
    pending = intake.keys(cfg)
    items = bundles(cfg)
    total = sum(b["bytes"] for b in items)
    res.bytes_before = total
    cutoff = now - cfg.spool.keep_days * 86400 if cfg.spool.keep_days > 0 else None
    for b in items:  # oldest first
        old = cutoff is not None and b["mtime"] < cutoff
        over = cfg.spool.max_bytes > 0 and total > cfg.spool.max_bytes
        if not (old or over):
            continue
        if b["job"] in pending or b["key"] in pending:
            res.kept_pending.append(b["key"])
            continue
        if b["key"].startswith("live/") and now - b["mtime"] < LIVE_BUSY_S:
            continue  # its job may still be running: its watchers write here
        why = f"older than {cfg.spool.keep_days:g} days" if old else f"spool over {cfg.spool.max_bytes} bytes"
        if not dry_run:
            try:
                shutil.rmtree(b["path"])  # fd-relative on Linux: links inside are removed, not followed
            except OSError as err:
                res.errors.append(f"{b['key']}: {err}")
                continue
        total -= b["bytes"]
        res.removed.append({"key": b["key"], "bytes": b["bytes"], "why": why})
    res.bytes_after = total
    return res


def maybe_collect(cfg: Config, now: float | None = None) -> GcResult | None:
    """Run ``collect`` when the last run is older than AUTO_EVERY_S; never raises."""
    now = time.time() if now is None else now
    stamp = os.path.join(cfg.intake.queue_dir, STAMP)
    try:
        if now - os.lstat(stamp).st_mtime < AUTO_EVERY_S:
            return None
    except FileNotFoundError:
        pass
    except OSError:
        return None
    try:
        os.makedirs(cfg.intake.queue_dir, mode=0o700, exist_ok=True)
        os.close(os.open(stamp, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o600))
        os.utime(stamp, (now, now))
        res = collect(cfg, now=now)
    except Exception as err:  # noqa: BLE001 - retention must never cost a verdict
        log.error("spool gc failed: %s", err)
        return None
    if res.removed:
        log.info("spool gc: removed %d bundles (%d bytes), %d bytes left", len(res.removed),
                 res.bytes_before - res.bytes_after, res.bytes_after)
    return res
