"""EpilogSlurmctld: record the ended job, start a worker if a slot is free, return.

The hook runs inside slurmctld's script runner once per job; at a burst (an array cancelled, a
reservation ending) thousands run within a minute. So it asks slurmctld nothing (every fact it
records is in its own environment: collect.jobstate.facts_from_env), reads no user file and
analyses nothing: one small file in the intake and, at most, one process started. The native
front (spank/tools/sattr_record.c) fsyncs it only with ``[intake] hook_fsync``: without, a crash
may lose or tear it, and the catch-up from accounting (catchup.py) or the torn-record path below
(``checked_body``, ``record_torn``) stands in.
"""
from __future__ import annotations

import logging
import os
import time
import zlib
from typing import Any

from .. import spool
from . import intake

log = logging.getLogger("slurm_attr")


def opted_out(env: dict[str, str]) -> bool:
    # The SPANK plugin passes the user's choice to every hook through job control env.
    return env.get("SPANK_SATTR_ENABLED", "1").strip() == "0"


def record_main(cfg: Any, env: dict[str, str]) -> tuple[str, bool]:
    """The ended job into the intake (the durable pending record): (key, recorded). ("", False):
    nothing to do (a bad id, or the controller side turned off); (key, False): the record could
    not be written and the facts went to the spool's job.json for an analysis outside the pool."""
    try:
        key = record_facts(cfg, env)
    except OSError as err:
        key = _key(env)
        log.error("job %s: could not record it as pending in %s (%s); analysing without a safety net",
                  key, cfg.intake.queue_dir, err)
        _facts_to_spool(cfg, key, _facts(env))
        return key, False
    return key, bool(key)


def record_facts(cfg: Any, env: dict[str, str], since: float | None = None) -> str:
    """Write the pending record from a hook environment; its key, or "" when there is nothing to
    record (a bad job id, the controller side turned off). OSError when it cannot be written.
    ``since``: when the job ended, where that was earlier than now (a front record read later)."""
    job_id = env.get("SLURM_JOB_ID", "")
    if not spool.valid_job_id(job_id):
        log.error("controller epilog: bad SLURM_JOB_ID %r", job_id)
        return ""
    if not cfg.analysis.enabled:
        intake.stamp_off(cfg)
        return ""
    key = _key(env)
    intake.record(cfg, key, _facts(env), since=since)
    return key


def _key(env: dict[str, str]) -> str:
    restart = env.get("SLURM_JOB_RESTART_COUNT", "")
    return spool.bundle_key(env.get("SLURM_JOB_ID", ""), int(restart) if restart.isdigit() else 0)


def _facts(env: dict[str, str]) -> dict[str, Any]:
    from ..collect.jobstate import facts_from_env

    job = facts_from_env(env)
    job["opted_out"] = opted_out(env)
    return job


def parse_env_record(data: bytes) -> dict[str, str]:
    """The C front's record: NUL-separated NAME=value, only the SLURM_* and SPANK_SATTR_* names."""
    out: dict[str, str] = {}
    for item in data.split(b"\0"):
        name, sep, value = item.partition(b"=")
        key = name.decode("ascii", "replace")
        if sep and key.startswith(("SLURM_", "SPANK_SATTR_")):
            out[key] = value.decode("utf-8", "replace")
    return out


TRAILER = b"SATTR_RECORD_END="


def checked_body(data: bytes) -> bytes | None:
    """The record's variables when its trailer checks (``SATTR_RECORD_END=<bytes>,<crc32 hex>``,
    the last NUL-terminated item: sattr_record.c); None for an empty, torn or cut record. Without
    ``[intake] hook_fsync`` the front does not fsync, and a crash can leave any of those."""
    if not data.endswith(b"\0"):
        return None
    at = data.rfind(TRAILER, 0, len(data) - 1)
    if at < 0 or (at and data[at - 1] != 0):
        return None
    size, _, crc = data[at + len(TRAILER):-1].partition(b",")
    body = data[:at]
    if not size.isdigit() or int(size) != at or len(crc) != 8:
        return None
    try:
        return body if int(crc, 16) == zlib.crc32(body) else None
    except ValueError:
        return None


def record_torn(cfg: Any, key: str, since: float | None = None) -> str:
    """A front record that does not check: the job is known by its file name only, and its facts
    are asked of accounting before the analysis (attempt.py). An entry already there (the catch-up
    or the Python hook wrote one) keeps its facts. Returns the key, "" when it names no job."""
    if not intake.valid_key(key):
        log.error("%s%s in the intake names no job: dropped", key, intake.ENV_SUFFIX)
        return ""
    if not cfg.analysis.enabled or intake.load(cfg, key) is not None:
        return key
    raw, _, restart = key.partition(".r")
    job: dict[str, Any] = {"job_id": raw, "slurm_job_id": raw, "facts_source": intake.TORN}
    if restart:
        job["restart_count"] = int(restart)
    log.warning("job %s: its hook record is empty or torn (a crash before it reached the disk?); "
                "its facts will be asked of accounting", key)
    intake.record(cfg, key, job, note="hook record empty or torn: facts from accounting", since=since)
    return key


def ingest(cfg: Any) -> int:
    """The C front's records (spank/tools/sattr_record.c: ``<key>.env``) into the intake's pending
    records; returns how many. One that cannot be recorded now stays for the next look; one whose
    trailer does not check is recorded by its name (record_torn)."""
    qdir = cfg.intake.queue_dir
    try:
        names = sorted(n for n in os.listdir(qdir) if n.endswith(intake.ENV_SUFFIX) and not n.startswith("."))
    except OSError:
        return 0
    done = 0
    for name in names:
        path = os.path.join(qdir, name)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
            try:
                data = os.read(fd, intake.MAX_ENTRY_BYTES + 1)
                # Written at the job's end: a worker busy with a backlog reads it later, and the
                # node wait and the yield to slurmctld count from the end, not from this read.
                ended = min(os.fstat(fd).st_mtime, time.time())
            finally:
                os.close(fd)
            body = checked_body(data[:intake.MAX_ENTRY_BYTES])
            if body is None:
                record_torn(cfg, name[:-len(intake.ENV_SUFFIX)], since=ended)
            else:
                record_facts(cfg, parse_env_record(body), since=ended)
            os.unlink(path)
            done += 1
        except OSError as err:
            log.warning("%s: not recorded yet (%s)", path, err)
    return done


def _facts_to_spool(cfg: Any, key: str, job: dict[str, Any]) -> None:
    import json

    from ..collect.nodepart import write_private

    bdir = spool.bundle_dir(cfg.paths.spool, key)
    try:
        spool.ensure_dir(bdir)
        write_private(os.path.join(bdir, "job.json"), json.dumps(job, indent=1).encode())
    except OSError as err:
        log.error("job %s: not written to the spool either (%s): lost", key, err)
