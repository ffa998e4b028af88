"""Entry points for Slurm's hooks: ``python -m slurm_attr.hooks node|controller|analyze``.

``node``        node Epilog (root, every node): collect this node's part of the bundle.
``controller``  EpilogSlurmctld (once per job): job.json, output tails, then start
                the analysis detached so neither nodes nor the job wait on it.
``analyze KEY`` the detached analysis of one bundle.

Every path logs and returns 0: a node Epilog that fails drains its node, and
that must only ever happen on purpose (the fast path drains with its own reason).
"""
from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from typing import Any

from . import config as config_mod
from . import spool
from .bundle import valid_node_name

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


def _opted_out(env: dict[str, str]) -> bool:
    # The SPANK plugin passes the user's choice to every hook through job control env.
    return env.get("SPANK_SATTR_ENABLED", "1").strip() == "0"


def node_main(env: dict[str, str]) -> int:
    from .collect.node import NodeJob, collect_node

    job_id = env.get("SLURM_JOB_ID", "")
    node = env.get("SLURMD_NODENAME", "")
    if not spool.valid_job_id(job_id) or not valid_node_name(node):
        log.error("node epilog: bad SLURM_JOB_ID %r or SLURMD_NODENAME %r", job_id, node)
        return 0
    cfg = config_mod.load()
    key = spool.bundle_key(job_id, _int(env.get("SLURM_JOB_RESTART_COUNT")))
    start = _int(env.get("SLURM_JOB_START_TIME")) or None
    doc = collect_node(cfg, NodeJob(job_id=job_id, node=node, bundle_key=key, opted_out=_opted_out(env),
                                    start=float(start) if start else None))
    summary = " ".join(f"{k}={v.get('status')}" for k, v in doc["sources"].items())
    log.info("node %s collected in %.0f ms: %s", node, doc["ms"], summary)
    _fast_path(cfg, job_id, node, key)
    return 0


def _fast_path(cfg: Any, job_id: str, node: str, key: str) -> None:
    """Drain this node before its epilog ends when its own kernel log is fatal."""
    try:
        from . import fastpath
    except ImportError:
        return
    fastpath.run(cfg, job_id, node, spool.bundle_dir(cfg.paths.spool, key))


def controller_main(env: dict[str, str]) -> int:
    from .collect import controller
    from .slurm import from_config

    job_id = env.get("SLURM_JOB_ID", "")
    if not spool.valid_job_id(job_id):
        log.error("controller epilog: bad SLURM_JOB_ID %r", job_id)
        return 0
    cfg = config_mod.load()
    slurm = from_config(cfg, timeout=10)
    job = controller.fetch_job(slurm, job_id)
    if job is None:
        job = {"job_id": job_id, "slurm_job_id": job_id, "nodes": _nodes_from_env(env)}
    # scontrol's NodeList shrinks as nodes finish COMPLETING (our node epilogs are fast):
    # the hook's own SLURM_JOB_NODELIST is the whole allocation.
    env_nodes = _nodes_from_env(env)
    if env_nodes:
        job["nodes"] = env_nodes
    job.setdefault("user", env.get("SLURM_JOB_USER"))
    if env.get("SLURM_JOB_UID", "").isdigit():
        job.setdefault("uid", int(env["SLURM_JOB_UID"]))
    job["opted_out"] = _opted_out(env)
    key = spool.bundle_key(job_id, _int(env.get("SLURM_JOB_RESTART_COUNT")))
    bdir = spool.bundle_dir(cfg.paths.spool, key)
    logs = _glob_list(cfg.collect.scheduler_logs)
    controller.write_controller_part(bdir, job, cfg.collect.output_tail_bytes, logs)
    _spawn_analysis(key, env)
    return 0


def _nodes_from_env(env: dict[str, str]) -> list[str]:
    from .slurm.hostlist import expand

    return expand(env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or "")


def _glob_list(spec: str) -> list[str]:
    import glob

    out: list[str] = []
    for item in (s.strip() for s in spec.split(",")):
        if item:
            out.extend(sorted(glob.glob(item)))
    return out


def _spawn_analysis(key: str, env: dict[str, str]) -> None:
    """Start the analysis in its own session: slurmctld does not wait for it."""
    child_env = {k: v for k, v in env.items() if k.startswith(("SLURM_ATTR_", "SLURM_CONF", "PATH", "LANG", "TZ"))}
    child_env["SLURM_JOB_ID"] = env.get("SLURM_JOB_ID", "")
    with open(os.devnull, "rb") as devnull_in, open(os.devnull, "wb") as devnull_out:
        subprocess.Popen([sys.executable, "-m", "slurm_attr.hooks", "analyze", key], stdin=devnull_in,
                         stdout=devnull_out, stderr=devnull_out, start_new_session=True, env=child_env,
                         close_fds=True)


def _on_alarm(signum: int, frame: object) -> None:
    raise TimeoutError("analysis exceeded [analysis] timeout_s")


def analyze_main(key: str) -> int:
    from .postmortem import finish_job
    from .slurm import from_config
    from .store import Store

    cfg = config_mod.load()
    # A hard stop: a wedged accounting call must not leave analysers piling up.
    signal.signal(signal.SIGALRM, _on_alarm)
    signal.alarm(max(1, int(cfg.analysis.timeout_s)))
    slurm = from_config(cfg, timeout=10)
    store = Store(cfg.paths.database)
    finish_job(cfg, slurm, store, spool.bundle_dir(cfg.paths.spool, key))
    return 0


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
        if what == "analyze" and len(argv) == 2 and spool.valid_job_id(argv[1].split(".r")[0]):
            return analyze_main(argv[1])
        log.error("usage: python -m slurm_attr.hooks node|controller|analyze KEY")
    except BaseException as err:  # noqa: BLE001 - the hook must never fail the node or the job
        log.exception("%s hook failed after %.1fs: %s", what or "?", time.monotonic() - t0, err)
    return 0


if __name__ == "__main__":
    sys.exit(main())
