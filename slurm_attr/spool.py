"""Where bundles live on the spool and how they are named.

``<spool>/bundles/<key>`` with key = the numeric Slurm job id (unique for array
tasks too), plus ``.r<N>`` for the N-th requeue, so each attempt has its own bundle.
"""
from __future__ import annotations

import os
import re

_JOB_ID = re.compile(r"^\d{1,12}(?:_\d{1,9})?$")


def valid_job_id(job_id: str) -> bool:
    return bool(_JOB_ID.match(job_id or ""))


def bundle_key(job_id: str, restart_count: int = 0) -> str:
    return job_id if restart_count <= 0 else f"{job_id}.r{restart_count}"


def bundles_root(spool: str) -> str:
    return os.path.join(spool, "bundles")


def bundle_dir(spool: str, key: str) -> str:
    return os.path.join(bundles_root(spool), key)


def ensure_dir(path: str, mode: int = 0o700) -> str:
    """Create a root-only directory (and parents) for bundle data."""
    os.makedirs(path, mode=mode, exist_ok=True)
    return path
