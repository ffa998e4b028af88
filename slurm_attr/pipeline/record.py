"""EpilogSlurmctld: record the ended job, start a worker if a slot is free, return.

The hook runs inside slurmctld's script runner once per job; at a burst (an array cancelled, a
reservation ending) thousands run within a minute. So it asks slurmctld nothing (every fact it
records is in its own environment: collect.jobstate.facts_from_env), reads no user file and
analyses nothing: one small fsynced file in the intake and, at most, one process started.
"""
from __future__ import annotations

import logging
import os
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
    from ..collect.jobstate import facts_from_env

    job_id = env.get("SLURM_JOB_ID", "")
    if not spool.valid_job_id(job_id):
        log.error("controller epilog: bad SLURM_JOB_ID %r", job_id)
        return "", False
    if not cfg.analysis.enabled:
        return "", False
    job = facts_from_env(env)
    job["opted_out"] = opted_out(env)
    restart = env.get("SLURM_JOB_RESTART_COUNT", "")
    key = spool.bundle_key(job_id, int(restart) if restart.isdigit() else 0)
    try:
        intake.record(cfg, key, job)
    except OSError as err:
        log.error("job %s: could not record it as pending in %s (%s); analysing without a safety net",
                  job_id, cfg.intake.queue_dir, err)
        _facts_to_spool(cfg, key, job)
        return key, False
    return key, True


def _facts_to_spool(cfg: Any, key: str, job: dict[str, Any]) -> None:
    import json

    from ..collect.node import write_private

    bdir = spool.bundle_dir(cfg.paths.spool, key)
    try:
        spool.ensure_dir(bdir)
        write_private(os.path.join(bdir, "job.json"), json.dumps(job, indent=1).encode())
    except OSError as err:
        log.error("job %s: not written to the spool either (%s): lost", key, err)
