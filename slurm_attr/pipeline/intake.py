"""The durable intake: every ended job is a pending file until its verdict and comment are stored.

``<[intake] queue_dir>/<key>.json`` on the controller's local disk, written atomically
(temporary file, fsync, rename) by EpilogSlurmctld before any analysis work. It holds
the job's facts as slurmctld gave them, so an analysis can run even when the spool has
no job.json (full, read-only), plus since/attempts/last_error/next_try. The analyser
removes it once the verdict and the comment (queued in the store) are stored; a failure
leaves it with the error and a backoff, and the next hook run, ``sattr retry`` or a timer
tries again. Nothing here imports the analysis: attempt.py drives it.
"""
from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import time
from contextlib import contextmanager
from typing import Any, Iterator

from .. import spool
from ..atomicfile import write_atomic
from ..config import Config

log = logging.getLogger("slurm_attr")

MAX_ENTRY_BYTES = 1 << 20  # a pending file is job facts and an error line: small
# A job the C front (sattr-record) recorded and no worker has read yet: its hook environment.
ENV_SUFFIX = ".env"
# facts_source of a job whose front record was empty or torn (ctldrecord.py): only its key is known,
# its facts are asked of accounting before the analysis (attempt.py).
TORN = "torn"
BACKOFF_START_S = 5.0
# Made by the catch-up from accounting (catchup.py), its time set by a hook that finds the
# controller side off ([analysis] enabled = false; the C front does the same): the catch-up
# leaves the jobs that ended before that time alone.
OFF_STAMP = ".off"


def _path(cfg: Config, key: str) -> str:
    if not valid_key(key):
        raise ValueError(f"bad pending key {key!r}")
    return os.path.join(cfg.intake.queue_dir, f"{key}.json")


def valid_key(key: str) -> bool:
    base, _, restart = key.partition(".r")
    return spool.valid_job_id(base) and (not restart or restart.isdigit())


def backoff(attempts: int, cap: float) -> float:
    """Seconds before the next try after ``attempts`` failures: 5, 10, 20, ... up to cap."""
    return min(cap, BACKOFF_START_S * (2 ** max(0, attempts - 1)))


def _atomic_write(path: str, doc: dict[str, Any]) -> None:
    # Durable: the pending file is the only record of an ended job until its verdict is stored.
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    write_atomic(path, json.dumps(doc, indent=1, default=str).encode(), mode=0o600, durable=True)


def stamp_off(cfg: Config, create: bool = False, when: float | None = None) -> None:
    """The controller side is off now (see OFF_STAMP), or ``when``; a hook stamps only a file the
    catch-up made (``create``). Best effort."""
    path = os.path.join(cfg.intake.queue_dir, OFF_STAMP)
    try:
        if create:
            os.makedirs(cfg.intake.queue_dir, mode=0o700, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | (os.O_CREAT if create else 0), 0o600)
        try:
            os.utime(fd, None if when is None else (when, when))
        finally:
            os.close(fd)
    except FileNotFoundError:
        pass
    except OSError as err:
        log.warning("cannot stamp %s: %s", path, err)


def off_until(cfg: Config) -> float | None:
    """When a hook last found the controller side off; None when none ever did."""
    try:
        return os.lstat(os.path.join(cfg.intake.queue_dir, OFF_STAMP)).st_mtime
    except OSError:
        return None


def load(cfg: Config, key: str) -> dict[str, Any] | None:
    try:
        fd = os.open(_path(cfg, key), os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        data = os.read(fd, MAX_ENTRY_BYTES)
    finally:
        os.close(fd)
    try:
        doc = json.loads(data)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def record(cfg: Config, key: str, job: dict[str, Any], note: str = "", since: float | None = None,
           first_try: float | None = None) -> dict[str, Any]:
    """Mark the job pending (keeping an earlier entry's ``since`` and attempts).

    A new entry's first try is its own analyser's (the hook starts one per job, which waits
    for the job's node parts): another process's sweep (``retry_due`` after its own job)
    takes it only once that analyser had its time, node wait and analysis limit. Swept at
    once, a job was analysed before its last node's part landed and stored `unknown`
    moments before its own analysis stored the real verdict (seen on the 26.05 cluster).

    ``since`` and ``first_try`` for a new entry with no analyser of its own waiting (the catch-up
    from accounting, catchup.py: since the job's end, due at once)."""
    now = time.time()
    first = now + cfg.analysis.node_wait_s + cfg.analysis.timeout_s if first_try is None else first_try
    doc = load(cfg, key) or {"key": key, "since": now if since is None else since, "attempts": 0, "last_error": "",
                             "next_try": first}
    doc["job"] = job
    doc["job_id"] = str(job.get("job_id") or key.split(".r")[0])
    if note:
        doc["note"] = note[:500]
    _atomic_write(_path(cfg, key), doc)
    return doc


def note(cfg: Config, key: str, text: str) -> None:
    """Attach a remark (e.g. 'spool full: job.json not written') without counting an attempt."""
    doc = load(cfg, key)
    if doc is not None:
        doc["note"] = text[:500]
        _atomic_write(_path(cfg, key), doc)


def mark(cfg: Config, key: str, **fields: Any) -> dict[str, Any] | None:
    """Set fields of a pending entry (an offloaded analysis's job id, say) without counting an
    attempt; None when the entry is gone."""
    doc = load(cfg, key)
    if doc is not None:
        doc.update(fields)
        _atomic_write(_path(cfg, key), doc)
    return doc


def failed(cfg: Config, key: str, error: str, partial: bool = False) -> dict[str, Any] | None:
    """Count a failed attempt: keep the error, schedule the next try. After
    ``[intake] max_attempts`` the entry is given up (removed) and None returned."""
    doc = load(cfg, key)
    if doc is None:
        return None
    now = time.time()
    doc["attempts"] = int(doc.get("attempts") or 0) + 1
    doc["last_error"] = error[:500]
    doc["last_try"] = now
    doc["partial_stored"] = bool(partial or doc.get("partial_stored"))
    doc["next_try"] = now + backoff(doc["attempts"], cfg.intake.backoff_max_s)
    if doc["attempts"] >= cfg.intake.max_attempts:
        log.error("job %s: giving up after %d attempts (last error: %s)%s", doc.get("job_id"), doc["attempts"],
                  error, "; its partial verdict stays" if doc["partial_stored"] else "")
        done(cfg, key)
        return None
    _atomic_write(_path(cfg, key), doc)
    return doc


def done(cfg: Config, key: str) -> None:
    try:
        os.unlink(_path(cfg, key))
    except FileNotFoundError:
        pass


def entries(cfg: Config) -> list[dict[str, Any]]:
    """Every pending entry, oldest first. Unreadable ones are skipped."""
    try:
        names = os.listdir(cfg.intake.queue_dir)
    except OSError:
        return []
    out = []
    for name in names:
        if not name.endswith(".json") or name.startswith("."):
            continue
        key = name[:-5]
        if not valid_key(key):
            continue
        doc = load(cfg, key)
        if doc is not None:
            doc["key"] = key
            out.append(doc)
    out.sort(key=lambda d: float(d.get("since") or 0))
    return out


def keys(cfg: Config) -> set[str]:
    """Every pending job's key, those only in the C front's records too (never pruned as done)."""
    try:
        raw = {n[:-len(ENV_SUFFIX)] for n in os.listdir(cfg.intake.queue_dir)
               if n.endswith(ENV_SUFFIX) and not n.startswith(".")}
    except OSError:
        raw = set()
    return {d["key"] for d in entries(cfg)} | {k for k in raw if valid_key(k)}


def backlog(cfg: Config) -> tuple[int, float | None]:
    """(pending jobs, when the oldest was recorded) with the C front's records not ingested
    yet counted by their file's time: a stopped worker shows as a growing, ageing queue."""
    docs = entries(cfg)
    known = {d["key"] for d in docs}
    times = [float(d["since"]) for d in docs if isinstance(d.get("since"), (int, float))]
    n = len(docs)
    try:
        names = [x for x in os.listdir(cfg.intake.queue_dir) if x.endswith(ENV_SUFFIX) and not x.startswith(".")]
    except OSError:
        names = []
    for name in names:
        key = name[:-len(ENV_SUFFIX)]
        if key in known or not valid_key(key):
            continue
        try:
            times.append(os.lstat(os.path.join(cfg.intake.queue_dir, name)).st_mtime)
            n += 1
        except OSError:
            continue  # ingested meanwhile
    return n, (min(times) if times else None)


def due(cfg: Config, now: float | None = None) -> list[dict[str, Any]]:
    now = time.time() if now is None else now
    return [d for d in entries(cfg) if float(d.get("next_try") or 0) <= now]


def for_job(cfg: Config, job_id: str) -> dict[str, Any] | None:
    """The pending entry of a job id (any attempt), newest attempt first."""
    found = [d for d in entries(cfg) if str(d.get("job_id")) == job_id or d["key"].split(".r")[0] == job_id]
    return found[-1] if found else None


@contextmanager
def claim(cfg: Config, key: str) -> Iterator[bool]:
    """One analyser per job at a time: a non-blocking flock on ``.<key>.lock``. Yields False when
    another process holds it (it will store the verdict, or leave the entry for later)."""
    os.makedirs(cfg.intake.queue_dir, mode=0o700, exist_ok=True)
    path = os.path.join(cfg.intake.queue_dir, f".{key}.lock")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            if err.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                yield False
                return
            raise
        try:
            yield True
        finally:
            try:
                # A process that opened the old file before this unlink may then lock it and run
                # the same job again: harmless (a re-analysis replaces the rows; the drain ledger
                # stops a second drain), and it keeps the queue dir from filling with lock files.
                os.unlink(path)
            except OSError:
                pass
    finally:
        os.close(fd)


def describe(doc: dict[str, Any]) -> str:
    """``pending since 2026-12-01 20:30:01, 2 attempts, last error: database is locked``."""
    from datetime import datetime

    def ts(v: Any) -> str:
        try:
            return datetime.fromtimestamp(float(v)).strftime("%Y-%m-%d %H:%M:%S")
        except (TypeError, ValueError, OverflowError, OSError):
            return "?"

    parts = [f"pending since {ts(doc.get('since'))}"]
    n = int(doc.get("attempts") or 0)
    if n:
        parts.append(f"{n} attempt{'s' if n != 1 else ''}")
        parts.append(f"next try {ts(doc.get('next_try'))}")
    parts.append(f"last error: {doc.get('last_error') or '-'}")
    if doc.get("note"):
        parts.append(f"note: {doc['note']}")
    return ", ".join(parts)
