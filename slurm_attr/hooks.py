"""Entry points for Slurm's hooks: ``python -m slurm_attr.hooks node|controller|analyze``.

``node``        node Epilog (root, every node): collect this node's part of the bundle.
``controller``  EpilogSlurmctld (once per job): record the job in the intake and start an
                analysis worker if a slot is free (pipeline/ctldrecord.py); nothing else.
``work``        an analysis worker: drains the intake (pipeline/pool.py).
``analyze KEY`` one bundle's analysis outside the pool (its pending record could not be written).

The node Prolog's gate is ``python -m slurm_attr.gate`` (gate.py), kept apart from these: every
job start waits for it, so it imports only what it needs. The node epilog leaves it a mark of
how far it read the kernel log (``_mark_read``).

Every path logs and returns 0: a node Epilog that fails drains its node, and
that must only ever happen on purpose (the fast path drains with its own reason).
"""
from __future__ import annotations

import logging
import os
import sys
import time
from typing import Any

from . import config as config_mod
from . import spool
from .pipeline.ctldrecord import opted_out

# The node epilog's one question to slurmctld (22.05 only: the trusted job start), kept short.
SCONTROL_TIMEOUT_S = 3.0

log = logging.getLogger("slurm_attr")


def _setup_logging(job_id: str) -> None:
    fmt = logging.Formatter(f"slurm_attr[job {job_id}]: %(levelname)s %(message)s")
    root = logging.getLogger("slurm_attr")
    root.setLevel(logging.INFO)
    h = logging.StreamHandler(sys.stderr)
    h.setFormatter(fmt)
    root.addHandler(h)
    path = os.environ.get("SLURM_ATTR_LOG_FILE")
    if path:
        try:
            fh = logging.FileHandler(path)
            fh.setFormatter(logging.Formatter("%(asctime)s " + fmt._fmt))  # type: ignore[attr-defined]
            root.addHandler(fh)
        except OSError:
            pass


def _int(value: str | None, default: int = 0) -> int:
    try:
        return int(value or default)
    except ValueError:
        return default


def node_main(env: dict[str, str]) -> int:
    """Kernel window into memory -> fast path (Slurm only) -> the bundle part (spool) -> clean-up.

    The order is the point: a full or read-only spool, or a locked database, must not stop a
    fatal node from being drained, and the job's evidence dir and rank maps go whatever failed."""
    from .bundle import valid_node_name
    from .collect import kernel
    from .collect.node import NodeJob, cleanup, collect_node, read_kernel

    job_id = env.get("SLURM_JOB_ID", "")
    node = env.get("SLURMD_NODENAME", "")
    if not spool.valid_job_id(job_id) or not valid_node_name(node):
        log.error("node epilog: bad SLURM_JOB_ID %r or SLURMD_NODENAME %r", job_id, node)
        return 0
    cfg = config_mod.load()
    key = spool.bundle_key(job_id, _int(env.get("SLURM_JOB_RESTART_COUNT")))
    start = _int(env.get("SLURM_JOB_START_TIME")) or None
    from .slurm.cli import CliSlurm

    # uid: a job dir owned by anyone else is neither read nor removed; show_job: the trusted start
    # (22.05's epilog env has no SLURM_JOB_START_TIME), issue 10, asked once and briefly: the whole
    # epilog has PrologEpilogTimeout.
    ctl = CliSlurm(cfg.paths.slurm_bin, env.get("SLURM_CONF") or cfg.paths.slurm_conf, timeout=SCONTROL_TIMEOUT_S)
    job = NodeJob(job_id=job_id, node=node, bundle_key=key, opted_out=opted_out(env),
                  start=float(start) if start else None,
                  uid=_int(env.get("SLURM_JOB_UID"), -1) if env.get("SLURM_JOB_UID", "").isdigit() else None,
                  show_job=ctl.show_job_raw)
    t0 = time.monotonic()
    try:
        try:
            win, win_ms = read_kernel(cfg, job, t0 + cfg.collect.time_budget_s)
        except Exception as err:  # noqa: BLE001 - collect what else there is
            log.exception("node %s: kernel window failed", node)
            win, win_ms = kernel.KernelWindow(b"", "error", f"{type(err).__name__}: {err}"[:300]), 0.0
        acts = _fast_path(cfg, job_id, node, win.text)
        _mark_read(cfg, node, job_id, win)
        if acts:
            _record_fast(cfg, key, node, acts)
        doc = collect_node(cfg, job, window=win, window_ms=win_ms)
        summary = " ".join(f"{k}={v.get('status')}" for k, v in doc["sources"].items())
        log.info("node %s collected in %.0f ms: %s", node, doc["ms"], summary)
    finally:
        # collect_node cleans up too; this covers a failure before or inside it.
        _ranks, err = cleanup(cfg, job)
        if err:
            log.error("node %s: could not remove the job's evidence dir %s/%s (%s): left for the admin",
                      node, cfg.paths.evidence_root, job_id, err)
    return 0


def _fast_path(cfg: Any, job_id: str, node: str, kernel_text: bytes) -> list[Any]:
    """Drain this node before its epilog ends when its own kernel window is fatal."""
    try:
        from . import fastpath
    except ImportError:
        return []
    return fastpath.run(cfg, job_id, node, kernel_text)


def _mark_read(cfg: Any, node: str, job_id: str, win: Any) -> None:
    """Leave when this node's kernel log was read (the window's end): the next job's Prolog gate
    (gate.py) reads only what came after. A window that was not read leaves the mark as it was."""
    from .collect import ledger

    if win.status not in ("ok", "truncated") or not win.span:
        return
    try:
        ledger.write_mark(cfg.paths.node_state, node, float(win.span["end_epoch"]), job_id)
    except (ledger.LedgerError, OSError, KeyError, ValueError) as err:
        log.warning("node %s: last-read mark for the Prolog gate not written (%s)", node, err)


def _record_fast(cfg: Any, key: str, node: str, acts: list[Any]) -> None:
    """The fast path's decisions beside the node part, for the central analysis to store.
    Best effort: the drain itself is in Slurm's reason, which the central side reconciles."""
    import json

    from .collect.nodepart import write_private

    node_dir = os.path.join(spool.bundle_dir(cfg.paths.spool, key), "nodes", node)
    try:
        spool.ensure_dir(node_dir)
        write_private(os.path.join(node_dir, "fastpath.json"),
               json.dumps([a.to_dict() for a in acts], indent=1).encode())
    except OSError as err:
        log.warning("node %s: fast path decision not written to the spool (%s); Slurm's reason has it", node, err)


def analyze_main(key: str) -> int:
    """One job to a stored verdict outside the pool (its pending record could not be written),
    then the spool's retention, at most every few minutes."""
    from . import gc
    from .pipeline import attempt

    cfg = config_mod.load()
    log.info("job %s: %s", key, attempt.process(cfg, key))
    gc.maybe_collect(cfg)
    return 0


def controller_main(env: dict[str, str]) -> int:
    """EpilogSlurmctld: record the job (pipeline/ctldrecord.py), then start a worker if a slot is free."""
    from .pipeline import ctldrecord, pool

    cfg = config_mod.load()
    key, recorded = ctldrecord.record_main(cfg, env)
    if key and recorded:
        pool.kick(cfg, env)
    elif key:
        pool.spawn_single(key, env)
    return 0


def offloaded_main(bundle_dir: str) -> int:
    """An analysis job a worker submitted (``[analysis] offload``): the bundle's findings to
    ``offload.json`` in it. Not a hook: a failure is this job's exit 1, which the worker reads
    as "ended without a result" and analyses the bundle itself."""
    from .pipeline.offload import write_result

    cfg = config_mod.load()
    root = os.path.realpath(spool.bundles_root(cfg.paths.spool))
    real = os.path.realpath(bundle_dir)
    if os.path.dirname(real) != root or not spool.valid_job_id(os.path.basename(real).split(".r")[0]):
        log.error("offloaded: %r is not a bundle of the spool %s", bundle_dir, root)
        return 2
    try:
        return write_result(real, cfg)
    except Exception:  # noqa: BLE001 - said in the job's output; the worker falls back
        log.exception("offloaded analysis of %s failed", real)
        return 1


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    env = dict(os.environ)
    _setup_logging(env.get("SLURM_JOB_ID", "?"))
    t0 = time.monotonic()
    what = argv[0] if argv else ""
    try:
        if what == "node":
            return node_main(env)
        if what == "controller":
            return controller_main(env)
        if what == "work":
            from .pipeline.pool import work_main

            return work_main(env)
        if what == "analyze" and len(argv) == 2 and spool.valid_job_id(argv[1].split(".r")[0]):
            return analyze_main(argv[1])
        if what == "offloaded" and len(argv) == 2:
            return offloaded_main(argv[1])
        log.error("usage: python -m slurm_attr.hooks node|controller|work|analyze KEY|offloaded BUNDLE")
    except BaseException as err:  # noqa: BLE001 - the hook must never fail the node or the job
        log.exception("%s hook failed after %.1fs: %s", what or "?", time.monotonic() - t0, err)
    return 0


if __name__ == "__main__":
    sys.exit(main())
