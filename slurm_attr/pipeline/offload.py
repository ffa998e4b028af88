"""Stage (optional): a big bundle's analysis as a Slurm job, off the controller (issue 23, item 3).

``[analysis] offload = "slurm"``: a worker that meets a bundle of at least ``offload_min_nodes``
nodes or ``offload_min_bytes`` bytes submits ``python -m slurm_attr.hooks offloaded BUNDLE`` to
the site's partition/QOS instead of analysing it, records the job id in the pending entry and
goes on with other jobs. The offloaded job runs the analysers (analysis.gather, the part that
grows with the bundle) and writes what they found to ``BUNDLE/offload.json``; the worker's
next look concludes it with the store's history exactly as a local analysis does (drain
policy, store, comment: finish.py). The analysis job ending without a result (cancelled,
failed, out of time) costs a partial verdict and a retry, analysed on the controller then:
the offload never loses a job.

The spool must be the same path on the controller and the analysis nodes (a shared
filesystem; on the test cluster, one machine). The job runs as root, like the worker.
"""
from __future__ import annotations

import json
import logging
import os
import shlex
import sys
import time
from typing import Any

from ..bundleanalysis import Gathered, gather
from ..atomicfile import write_atomic
from ..config import Config
from ..errors import SlurmError
from ..slurm.base import FINAL_STATES
from . import intake

log = logging.getLogger("slurm_attr")

RESULT = "offload.json"
RESULT_MAX_BYTES = 256 << 20  # what the analysers found: symptoms and coverage, bounded
# A worker asks accounting about a running offload at most this often (the result file is
# looked for every pass).
POLL_S = 10.0


def wanted(cfg: Config, bundle_dir: str, job: dict[str, Any], doc: dict[str, Any]) -> bool:
    """Whether this job's analysis goes to Slurm: offload on, never failed for it, big enough."""
    a = cfg.analysis
    if a.offload != "slurm" or doc.get("offload_failed") or not os.path.isdir(bundle_dir):
        return False
    if len([n for n in job.get("nodes") or [] if isinstance(n, str)]) >= a.offload_min_nodes:
        return True
    return _bytes_at_least(bundle_dir, a.offload_min_bytes)


def _bytes_at_least(root: str, limit: int) -> bool:
    """Whether the files under root add up to ``limit`` bytes (stops as soon as they do)."""
    total = 0
    stack = [root]
    while stack:
        try:
            with os.scandir(stack.pop()) as it:
                for e in it:
                    if e.is_dir(follow_symlinks=False):
                        stack.append(e.path)
                    elif e.is_file(follow_symlinks=False):
                        total += e.stat(follow_symlinks=False).st_size
                        if total >= limit:
                            return True
        except OSError:
            continue
    return False


def submit(cfg: Config, slurm: Any, key: str, bundle_dir: str) -> str:
    """sbatch the analysis job (the worker's environment goes with it: the same configuration);
    its id is recorded in the pending entry. Raises SlurmError."""
    a = cfg.analysis
    python = a.offload_python or sys.executable
    cmd = " ".join(shlex.quote(x) for x in (python, "-m", "slurm_attr.hooks", "offloaded", bundle_dir))
    opts = [f"--job-name=sattr-analysis-{key}", f"--time={max(1, a.offload_time_s // 60)}",
            f"--output={os.path.join(bundle_dir, 'offload.out')}", "--nodes=1", "--no-requeue"]
    for flag, value in (("--partition", a.offload_partition), ("--qos", a.offload_qos),
                        ("--account", a.offload_account)):
        if value:
            opts.append(f"{flag}={value}")
    job_id = slurm.submit_batch(cmd, opts)
    intake.mark(cfg, key, offload={"job_id": job_id, "submitted": time.time()})
    log.info("job %s: analysis offloaded to Slurm job %s", key, job_id)
    return job_id


def result(bundle_dir: str) -> Gathered | None:
    """The offloaded job's findings, None while there are none (or they do not read)."""
    path = os.path.join(bundle_dir, RESULT)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        data = os.read(fd, RESULT_MAX_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > RESULT_MAX_BYTES:
        log.error("%s: over %d bytes, not read", path, RESULT_MAX_BYTES)
        return None
    try:
        return Gathered.from_dict(json.loads(data))
    except (ValueError, KeyError, TypeError) as err:
        log.error("%s: not an analysis result (%s)", path, err)
        return None


def ended_without_result(slurm: Any, job_id: str) -> str | None:
    """The analysis job's final state when it ended (None while it runs or nobody can tell)."""
    try:
        row = slurm.sacct_job(job_id)
    except SlurmError:
        return None
    state = ((row or {}).get("State") or "").split(" ")[0]
    return state if state in FINAL_STATES else None


def write_result(bundle_dir: str, cfg: Config) -> int:
    """The offloaded job's side (``python -m slurm_attr.hooks offloaded BUNDLE``)."""
    from .settle import read_job_json

    t0 = time.monotonic()
    g = gather(bundle_dir, cfg, read_job_json(bundle_dir) or None)
    data = json.dumps(g.to_dict(), default=str).encode()
    # Durable like the intake: the worker takes the result's presence as the analysis done.
    write_atomic(os.path.join(bundle_dir, RESULT), data, mode=0o600, durable=True)
    log.info("%s: %d symptoms, %d coverage entries in %.1f s", bundle_dir, len(g.symptoms), len(g.coverage),
             time.monotonic() - t0)
    return 0
