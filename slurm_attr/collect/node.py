"""The node side of a job's bundle: run by the node Epilog as root on every node.

Writes ``nodes/<node>/`` of the bundle: the kernel-log window, the job's FR
dumps, probe and NCCL files (copied out of the job's evidence dir, which the job
owns and may have booby-trapped: jobfiles.py), and ``collect.json`` last, as the marker that
this node's part is complete (how the part's files are written: nodepart.py). Bounded in
bytes per source and in time overall.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from .. import safefs, spool
from ..config import Config
from ..errors import UnsafePath
from . import jobfiles, journal, kernel, ledger, nodepart, provenance, sharedroot, software, window
# write_private: bench/ still reaches it through this module.
from .nodepart import SourceResult, write_private  # noqa: F401


@dataclass
class NodeJob:
    job_id: str  # numeric SLURM_JOB_ID: names the evidence dir
    node: str
    bundle_key: str
    opted_out: bool = False
    start: float | None = None  # epoch, when known
    end: float = field(default_factory=time.time)
    # The job's uid (SLURM_JOB_UID): a job dir owned by anyone else is neither read nor removed.
    uid: int | None = None
    # Raw `scontrol -o show job` reader for the trusted start (CliSlurm.show_job_raw); None: not asked.
    show_job: Any = None



def read_kernel(cfg: Config, job: NodeJob, deadline: float) -> tuple[kernel.KernelWindow, float]:
    """This node's kernel window, in memory (the fast path decides from it before the spool
    is touched): (window, ms)."""
    c = cfg.collect
    tk = time.monotonic()
    # A trusted start, never a fixed look-back (window.py; issue 10: a 24 h look-back re-read
    # Xids already reported and handled, and drained again); opted-out jobs get the same window.
    span = window.resolve(job.job_id, job.end, c.window_slack_s, env_start=job.start, show_job=job.show_job,
                          evidence_root=cfg.paths.evidence_root)
    win = kernel.read_window(c.kernel_source, c.kernel_file, job.node, span.start - c.window_slack_s,
                             span.end + c.window_slack_s, c.kernel_cap_bytes,
                             timeout=max(1.0, min(10.0, deadline - time.monotonic())))
    win.span = span.to_dict()
    _split_attributed(cfg, job, win)
    return win, (time.monotonic() - tk) * 1000


def _split_attributed(cfg: Config, job: NodeJob, win: kernel.KernelWindow) -> None:
    """Move kernel lines an earlier job already owns (node ledger) out of win.text, and record
    this window's rule-matching lines for this job. So neither the fast path nor the analysis
    can make them a root or drain twice. Any failure ships every line (losing a fatal Xid is
    worse than a second look at an old one) and says so in win.ledger."""
    if not win.text.strip():
        return
    try:
        matched = ledger.matched_line_indexes(win.text, cfg.analysis.extra_rules)
        if not matched:
            return
        with ledger.Ledger(cfg.paths.node_state, job.node) as led:
            fresh, old, records, new_keys = ledger.split_window(win.text, job.node, job.job_id, led, matched)
            recorded = led.record(new_keys, job.job_id)
        win.text, win.attributed, win.attributed_lines = fresh, old, records
        win.ledger = {"status": "ok", "detail": f"{len(records)} line(s) attributed earlier, {recorded} recorded"}
    except Exception as err:  # noqa: BLE001 - the epilog must go on; the window stays whole
        win.ledger = {"status": "error", "detail": f"ledger: {type(err).__name__}: {err}"[:300]}


def cleanup(cfg: Config, job: NodeJob) -> tuple[dict[str, list[int]], str]:
    """Remove this node's rank maps (returning what they said) and the job's evidence dir.

    Runs whatever happened before it: a job dir left behind is the next job's surprise and
    the evidence root's slow leak. Returns (ranks, error or '')."""
    try:
        ranks = jobfiles.read_rank_map(cfg.paths.evidence_root, job.job_id, job.node)
    except OSError:
        ranks = {}
    ours, why = jobfiles.job_dir_owner_ok(cfg.paths.evidence_root, job.job_id, job.uid)
    if not ours:
        return ranks, why
    if jobfiles.other_nodes_pending(cfg.paths.evidence_root, job.job_id):
        # A shared evidence root: the job's other nodes still collect their ranks' files from
        # this dir; the last node's epilog removes it.
        return ranks, ""
    err = jobfiles.remove_job_dir(cfg.paths.evidence_root, job.job_id) if cfg.collect.remove_job_dir else ""
    return ranks, err



def _root_sources(cfg: Config, job: NodeJob, win: kernel.KernelWindow, node_dir: str,
                  deadline: float) -> dict[str, dict[str, Any]]:
    """Beside the kernel window, what root's own records say (trusted): the named units'
    journal records (Fabric Manager) and the NVIDIA driver's version (collect/software.py)."""
    c = cfg.collect
    out: dict[str, dict[str, Any]] = {}
    units = journal.parse_units(c.journal_units)
    if units and win.span:
        # Root system units' journal records, trusted by journald's fields.
        tj = time.monotonic()
        jw = journal.read_units(units, win.span["start_epoch"] - c.window_slack_s,
                                win.span["end_epoch"] + c.window_slack_s, c.kernel_cap_bytes,
                                timeout=max(1.0, min(5.0, deadline - time.monotonic())))
        if jw.text:
            nodepart.write_private(os.path.join(node_dir, "journal.log"), jw.text)
        out["journal"] = SourceResult(status=jw.status, bytes=len(jw.text), detail=jw.detail,
                                      ms=(time.monotonic() - tj) * 1000).to_dict()
    version = software.driver_version_text(c.driver_version_file.replace("%n", job.node))
    if version:
        nodepart.write_private(os.path.join(node_dir, "software.log"), version)
        out["software"] = SourceResult(bytes=len(version), detail=c.driver_version_file).to_dict()
    return out


def _job_sources(cfg: Config, job: NodeJob, node_dir: str, deadline: float) -> dict[str, dict[str, Any]]:
    """The job's own files (FR dumps, probe records, NCCL logs), each kind within its caps and
    the job's cap on this node; none when the user opted out or the dir is not the job user's."""
    c = cfg.collect
    kinds = ("fr", "probe", "nccl")
    if job.opted_out:
        return {k: SourceResult(status="missing", detail="job opted out (--attr=off)").to_dict() for k in kinds}
    job_dir = os.path.join(cfg.paths.evidence_root, job.job_id)
    try:
        fd = safefs.open_dir(job_dir)
        try:
            owner = os.fstat(fd).st_uid
        finally:
            os.close(fd)
    except UnsafePath as err:
        return {k: SourceResult(status="missing", detail=f"job dir: {err}").to_dict() for k in kinds}
    if job.uid is not None and owner != job.uid:
        # A dir the plugin refused (planted by another uid) is that uid's: never read it.
        return {k: SourceResult(status="error", detail=(
            f"job dir owned by uid {owner}, not the job's uid {job.uid}: not read")).to_dict() for k in kinds}
    caps = {"fr": (c.fr_cap_bytes, c.fr_file_cap_bytes, False),
            "probe": (c.probe_cap_bytes, c.probe_cap_bytes, False),
            "nccl": (c.nccl_cap_bytes, c.nccl_cap_bytes, True)}
    budget = [c.job_cap_bytes]  # one cap for the whole job on this node, besides each kind's
    # Read, not consumed: clean-up removes the map files once collection is over.
    ranks = jobfiles.read_rank_map(cfg.paths.evidence_root, job.job_id, job.node, remove=False)
    own = sharedroot.ownership(ranks, socket.gethostname())
    return {kind: jobfiles.copy_kind(job_dir, kind, os.path.join(node_dir, kind), total, per_file, c.max_files,
                                     deadline, tail=tail, budget=budget, own=own).to_dict()
            for kind, (total, per_file, tail) in caps.items()}


def collect_node(cfg: Config, job: NodeJob, window: kernel.KernelWindow | None = None,
                 window_ms: float = 0.0) -> dict[str, Any]:
    """Write this node's part of the bundle; return what collect.json says.

    ``window`` is the kernel window the epilog already read (for the fast path). A full or
    read-only spool degrades to the kernel window alone (and, failing that, to nothing on
    the spool); the job dir and rank maps are removed in every case."""
    t0 = time.monotonic()
    deadline = t0 + cfg.collect.time_budget_s
    started = datetime.now(timezone.utc)
    node_dir = os.path.join(spool.bundle_dir(cfg.paths.spool, job.bundle_key), "nodes", job.node)
    # 1. Kernel log: trusted, the evidence a drain rests on. First, so a slow job dir cannot starve it.
    if window is None:
        window, window_ms = read_kernel(cfg, job, deadline)
    win = window
    sources = _kernel_sources(win, window_ms)
    ranks: dict[str, list[int]] = {}
    kernel_written = False
    spool_ok = True
    try:
        spool.ensure_dir(node_dir)
        kernel_written = _write_kernel(node_dir, win)
        sources.update(_root_sources(cfg, job, win, node_dir, deadline))
        # 2. What the job wrote. Skipped entirely when the user opted out.
        sources.update(_job_sources(cfg, job, node_dir, deadline))
    except OSError as err:
        if not nodepart.spool_full(err):
            raise
        spool_ok = False
        _degrade(node_dir, win, err, sources, kernel_written)
    finally:
        ranks, err_clean = cleanup(cfg, job)
        if err_clean:
            sources["jobdir_cleanup"] = SourceResult(status="error", detail=err_clean).to_dict()
    doc = _collect_doc(job, win, sources, ranks, started, t0)
    _write_collect_json(node_dir, doc, spool_ok)
    return doc


def _kernel_sources(win: kernel.KernelWindow, window_ms: float) -> dict[str, dict[str, Any]]:
    sources = {"kernel": SourceResult(status=win.status, bytes=len(win.text), ms=window_ms, detail=win.detail).to_dict()}
    if win.span:
        # No trusted start lowers coverage: the window is only the job's elapsed time or the slack.
        sources["window"] = SourceResult(status="ok" if win.span.get("trusted_start") else "truncated",
                                         detail=str(win.span.get("detail", ""))).to_dict()
    if win.ledger:
        sources["ledger"] = SourceResult(status=win.ledger["status"], detail=win.ledger["detail"]).to_dict()
    return sources


def _write_kernel(node_dir: str, win: kernel.KernelWindow) -> bool:
    """kernel.log (and the lines an earlier job owns beside it); whether kernel.log was written."""
    written = False
    if win.text or win.status in ("ok", "truncated"):
        nodepart.write_private(os.path.join(node_dir, "kernel.log"), win.text)
        written = True
    if win.attributed:
        # Lines an earlier job owns: context for the analysis, never a root (ledger.py).
        nodepart.write_private(os.path.join(node_dir, "kernel.attributed.log"), win.attributed)
    return written


def _degrade(node_dir: str, win: kernel.KernelWindow, err: OSError, sources: dict[str, dict[str, Any]],
             kernel_written: bool) -> None:
    """Spool full or read-only: give back what this part took, keep the kernel window (small, trusted)."""
    for kind in ("fr", "probe", "nccl"):
        shutil.rmtree(os.path.join(node_dir, kind), ignore_errors=True)
        sources[kind] = SourceResult(status="error", detail=f"not kept: {err.strerror or err}").to_dict()
    if not kernel_written and (win.text or win.status in ("ok", "truncated")):
        try:
            nodepart.write_private(os.path.join(node_dir, "kernel.log"), win.text)
            kernel_written = True
        except OSError:
            pass
    sources["spool"] = SourceResult(status="error", detail=(
        f"{err.strerror or err}: kept {'only the kernel window' if kernel_written else 'nothing'} "
        "on the spool")).to_dict()


def _collect_doc(job: NodeJob, win: kernel.KernelWindow, sources: dict[str, dict[str, Any]],
                 ranks: dict[str, list[int]], started: datetime, t0: float) -> dict[str, Any]:
    doc = {
        "version": 1,
        "node": job.node,
        "job_id": job.job_id,
        "opted_out": job.opted_out,
        "started": started.isoformat(timespec="seconds"),
        "ms": round((time.monotonic() - t0) * 1000, 1),
        "sources": sources,
        "ranks": ranks,
        # Issue 10: where the window came from, who wrote each source, which lines were old.
        "window": win.span,
        "provenance": {k: provenance.describe(k) for k in ("kernel", "fr", "probe", "nccl")
                       + (("journal",) if "journal" in sources else ())},
        "attributed": {"file": "kernel.attributed.log", "lines": win.attributed_lines} if win.attributed else None,
    }
    if win.attributed:
        doc["provenance"]["kernel_attributed"] = provenance.describe("kernel_attributed")
    return doc


def _write_collect_json(node_dir: str, doc: dict[str, Any], spool_ok: bool) -> None:
    """Last: its presence tells the controller side this node is done."""
    try:
        nodepart.write_private(os.path.join(node_dir, "collect.json"), json.dumps(doc, indent=1).encode())
    except OSError as err:
        if not nodepart.spool_full(err) and spool_ok:
            raise
        prev = doc["sources"].get("spool", {}).get("detail", "")
        doc["sources"]["spool"] = SourceResult(status="error", detail="; ".join(
            x for x in (prev, f"collect.json not written: {err}") if x)).to_dict()
