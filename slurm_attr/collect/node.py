"""The node side of a job's bundle: run by the node Epilog as root on every node.

Writes ``nodes/<node>/`` of the bundle: the kernel-log window, the job's FR
dumps, probe and NCCL files (copied out of the job's evidence dir, which the job
owns and may have booby-trapped), and ``collect.json`` last, as the marker that
this node's part is complete. Bounded in bytes per source and in time overall.
"""
from __future__ import annotations

import errno
import json
import os
import re
import shutil
import socket
import stat
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from .. import safefs, spool
from ..config import Config
from ..errors import UnsafePath
from . import journal, kernel, ledger, provenance, sharedroot, software, window

# The window comes from collect/window.py, never from a fixed look-back (issue 10: a 24 h
# look-back re-read Xids that were already reported and handled, and drained again).
_SAFE_NAME = re.compile(r"[^A-Za-z0-9._-]")


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


def job_dir_owner_ok(root: str, job_id: str, uid: int | None) -> tuple[bool, str]:
    """Whether <root>/<job_id> may be read/removed: absent, or owned by the job's uid.
    A dir the plugin refused (another uid planted it) belongs to someone else: hands off."""
    if uid is None:
        return True, ""
    try:
        st = os.lstat(os.path.join(root, job_id))
    except FileNotFoundError:
        return True, ""
    except OSError as err:
        return False, str(err)
    if stat.S_ISLNK(st.st_mode):
        return True, ""  # only the link itself is ever removed; nothing behind it is read
    if st.st_uid != uid:
        return False, f"{os.path.join(root, job_id)} is owned by uid {st.st_uid}, not the job's uid {uid}; left alone"
    return True, ""


@dataclass
class SourceResult:
    status: str = "ok"
    bytes: int = 0
    ms: float = 0.0
    files: int = 0
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"status": self.status, "bytes": self.bytes, "ms": round(self.ms, 1)}
        if self.files:
            d["files"] = self.files
        if self.detail:
            d["detail"] = self.detail[:500]
        return d


def safe_name(rel: str) -> str:
    """A flat, harmless file name for a job-chosen relative path."""
    name = _SAFE_NAME.sub("_", rel.replace("/", "__")).lstrip(".")
    return (name or "unnamed")[:200]


def write_private(path: str, data: bytes) -> None:
    """Write a file only root reads (0600, no symlink followed), replaced whole."""
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError as err:
        try:
            os.unlink(tmp)  # never leave half a file using the space that ran out
        except OSError:
            pass
        if err.errno in SPOOL_FULL_ERRNOS:
            raise SpoolFull(err.errno, f"spool: {os.strerror(err.errno)} writing {os.path.basename(path)}") from err
        raise


# A file whose allocated blocks cover less than this share of its size is sparse: a job can
# `truncate -s 2G` a file for free and make root copy gigabytes of zeros onto the spool.
SPARSE_RATIO = 0.5
SPARSE_MIN_BYTES = 1 << 20


def is_sparse(st: os.stat_result) -> bool:
    return st.st_size >= SPARSE_MIN_BYTES and st.st_blocks * 512 < st.st_size * SPARSE_RATIO


class SpoolFull(OSError):
    """Writing to the spool failed for lack of space or a read-only filesystem."""


# Out of space or not writable: root gets EPERM/EACCES from an immutable dir or a root-squashed NFS.
SPOOL_FULL_ERRNOS = (errno.ENOSPC, errno.EROFS, errno.EDQUOT, errno.EFBIG, errno.EPERM, errno.EACCES)


def copy_kind(job_dir: str, kind: str, dest: str, total_cap: int, file_cap: int, max_files: int,
              deadline: float, tail: bool = False, budget: list[int] | None = None,
              own: sharedroot.Ownership | None = None) -> SourceResult:
    """Copy regular files of job_dir/kind into dest, bounded; symlinks and specials are skipped.

    ``budget`` is the job's remaining bytes on this node, shared by all kinds (one element,
    decremented). Sparse files are skipped with a note (their size is not what they cost the job).
    ``own``: on a shared evidence root, only the files of this node's ranks (sharedroot.py).
    """
    res = SourceResult()
    t0 = time.monotonic()
    budget = budget if budget is not None else [total_cap]
    try:
        entries = list(safefs.walk_files(job_dir, kind, max_depth=2))
    except UnsafePath as err:
        return SourceResult(status="missing", detail=str(err))
    skipped = 0
    sparse: list[str] = []
    for rel in entries:
        if not rel.startswith(kind + "/"):
            continue
        if own is not None and not own.keeps(kind, rel):
            continue
        if time.monotonic() > deadline:
            res.status, res.detail = "truncated", "time budget exhausted"
            break
        if res.files >= max_files or res.bytes >= total_cap:
            res.status, res.detail = "truncated", f"caps reached ({max_files} files, {total_cap} bytes)"
            break
        if budget[0] <= 0:
            res.status, res.detail = "truncated", "the job's per-node cap ([collect] job_cap_bytes) reached"
            break
        try:
            fd = safefs.open_file(job_dir, rel)
        except UnsafePath:
            skipped += 1
            continue
        try:
            st = os.fstat(fd)
            if is_sparse(st):
                sparse.append(f"{rel} ({st.st_blocks * 512} of {st.st_size} bytes allocated)")
                continue
            got = safefs.read_fd(fd, min(file_cap, total_cap - res.bytes, budget[0]), tail=tail)
        finally:
            os.close(fd)
        os.makedirs(dest, mode=0o700, exist_ok=True)
        write_private(os.path.join(dest, safe_name(rel[len(kind) + 1:])), got.data)
        res.files += 1
        res.bytes += len(got.data)
        budget[0] -= len(got.data)
        if got.truncated:
            res.status = "truncated"
            res.detail = f"{rel}: kept {len(got.data)} of {got.size} bytes"
    if sparse:
        note = f"skipped {len(sparse)} sparse file(s): {'; '.join(sparse[:4])}"
        res.detail = f"{res.detail}; {note}" if res.detail else note
        if res.status == "ok":
            res.status = "truncated"
    if skipped and not res.detail:
        res.detail = f"skipped {skipped} entries that were not regular files"
    if not res.files and res.status == "ok":
        res.status = "missing"
        res.detail = res.detail or f"no files in {kind}/"
    res.ms = (time.monotonic() - t0) * 1000
    return res


def remove_job_dir(root: str, job_id: str) -> str:
    """Remove <root>/<job_id> without following links; returns '' or what went wrong."""
    path = os.path.join(root, job_id)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return ""
    except OSError as err:
        return str(err)
    try:
        if stat.S_ISDIR(st.st_mode):
            # rmtree uses fd-relative calls on Linux: a link inside is removed, not followed.
            shutil.rmtree(path)
        else:
            os.unlink(path)  # a symlink or file where the dir should be: remove the entry only
    except OSError as err:
        return str(err)
    return ""


def read_rank_map(root: str, job_id: str, node: str, remove: bool = True) -> dict[str, list[int]]:
    """{step: [global ranks]} that ran on this node, from the plugin's root-owned files.

    The plugin writes ``<job>.ranks.<step>.<nodeid>`` with lines
    ``<step> <rank> <nodeid> <step nodelist>``; this node's files are those whose
    nodeid-th host of the step's node list is this node. Only root-owned regular
    files count (the job cannot forge where its ranks ran); ours are removed.
    """
    from ..slurm.hostlist import expand

    out: dict[str, set[int]] = {}
    prefix = f"{job_id}.ranks."
    try:
        names = [n for n, kind in safefs.list_dir(root) if kind == "file" and n.startswith(prefix)]
    except UnsafePath:
        return {}
    for name in names:
        try:
            fd = safefs.open_file(root, name)
        except UnsafePath:
            continue
        try:
            if os.fstat(fd).st_uid != 0:
                continue
            data = safefs.read_fd(fd, 1 << 20).data
        finally:
            os.close(fd)
        mine = False
        for line in data.decode("ascii", errors="replace").splitlines():
            parts = line.split()
            if len(parts) != 4 or not (parts[0].isdigit() and parts[1].isdigit() and parts[2].isdigit()):
                continue
            try:
                hosts = expand(parts[3])
            except ValueError:
                continue
            nodeid = int(parts[2])
            if nodeid < len(hosts) and hosts[nodeid] == node:
                mine = True
                out.setdefault(parts[0], set()).add(int(parts[1]))
        if mine and remove:
            try:
                os.unlink(os.path.join(root, name))
            except OSError:
                pass
    return {k: sorted(v) for k, v in out.items()}


def read_kernel(cfg: Config, job: NodeJob, deadline: float) -> tuple[kernel.KernelWindow, float]:
    """This node's kernel window, in memory (the fast path decides from it before the spool
    is touched): (window, ms)."""
    c = cfg.collect
    tk = time.monotonic()
    # A trusted start, never a fixed look-back (window.py); opted-out jobs get the same window.
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
        ranks = read_rank_map(cfg.paths.evidence_root, job.job_id, job.node)
    except OSError:
        ranks = {}
    ours, why = job_dir_owner_ok(cfg.paths.evidence_root, job.job_id, job.uid)
    if not ours:
        return ranks, why
    if _other_nodes_pending(cfg.paths.evidence_root, job.job_id):
        # A shared evidence root: the job's other nodes still collect their ranks' files from
        # this dir; the last node's epilog removes it.
        return ranks, ""
    err = remove_job_dir(cfg.paths.evidence_root, job.job_id) if cfg.collect.remove_job_dir else ""
    return ranks, err


def _other_nodes_pending(root: str, job_id: str) -> bool:
    """Rank maps of this job left after ours were consumed: other nodes share this root."""
    try:
        return any(kind == "file" and n.startswith(f"{job_id}.ranks.") for n, kind in safefs.list_dir(root))
    except UnsafePath:
        return False


def _spool_full(err: OSError) -> bool:
    return isinstance(err, SpoolFull) or err.errno in SPOOL_FULL_ERRNOS


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
            write_private(os.path.join(node_dir, "journal.log"), jw.text)
        out["journal"] = SourceResult(status=jw.status, bytes=len(jw.text), detail=jw.detail,
                                      ms=(time.monotonic() - tj) * 1000).to_dict()
    version = software.driver_version_text(c.driver_version_file.replace("%n", job.node))
    if version:
        write_private(os.path.join(node_dir, "software.log"), version)
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
    own = sharedroot.ownership(read_rank_map(cfg.paths.evidence_root, job.job_id, job.node, remove=False),
                               socket.gethostname())
    return {kind: copy_kind(job_dir, kind, os.path.join(node_dir, kind), total, per_file, c.max_files, deadline,
                            tail=tail, budget=budget, own=own).to_dict()
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
        if not _spool_full(err):
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
        write_private(os.path.join(node_dir, "kernel.log"), win.text)
        written = True
    if win.attributed:
        # Lines an earlier job owns: context for the analysis, never a root (ledger.py).
        write_private(os.path.join(node_dir, "kernel.attributed.log"), win.attributed)
    return written


def _degrade(node_dir: str, win: kernel.KernelWindow, err: OSError, sources: dict[str, dict[str, Any]],
             kernel_written: bool) -> None:
    """Spool full or read-only: give back what this part took, keep the kernel window (small, trusted)."""
    for kind in ("fr", "probe", "nccl"):
        shutil.rmtree(os.path.join(node_dir, kind), ignore_errors=True)
        sources[kind] = SourceResult(status="error", detail=f"not kept: {err.strerror or err}").to_dict()
    if not kernel_written and (win.text or win.status in ("ok", "truncated")):
        try:
            write_private(os.path.join(node_dir, "kernel.log"), win.text)
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
        write_private(os.path.join(node_dir, "collect.json"), json.dumps(doc, indent=1).encode())
    except OSError as err:
        if not _spool_full(err) and spool_ok:
            raise
        prev = doc["sources"].get("spool", {}).get("detail", "")
        doc["sources"]["spool"] = SourceResult(status="error", detail="; ".join(
            x for x in (prev, f"collect.json not written: {err}") if x)).to_dict()
