"""The node side of a job's bundle: run by the node Epilog as root on every node.

Writes ``nodes/<node>/`` of the bundle: the kernel-log window, the job's FR
dumps, probe and NCCL files (copied out of the job's evidence dir, which the job
owns and may have booby-trapped), and ``collect.json`` last, as the marker that
this node's part is complete. Bounded in bytes per source and in time overall.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import stat
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from .. import safefs, spool
from ..config import Config
from ..errors import UnsafePath
from . import kernel

# Without a known start, look this far back in the kernel log (bounded by the byte cap anyway).
DEFAULT_WINDOW_S = 24 * 3600
_SAFE_NAME = re.compile(r"[^A-Za-z0-9._-]")


@dataclass
class NodeJob:
    job_id: str  # numeric SLURM_JOB_ID: names the evidence dir
    node: str
    bundle_key: str
    opted_out: bool = False
    start: float | None = None  # epoch, when known
    end: float = field(default_factory=time.time)


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


def _write(path: str, data: bytes) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)
    os.replace(tmp, path)


def _job_start_hint(root: str, job_id: str) -> float | None:
    """When the job's first step started on this node: the earliest ctime of the job's dir
    and of the plugin's rank-map files (root-owned, created as each step's tasks launch).
    Either may be gone (opted out, or another node's epilog removed a shared dir)."""
    times = []
    try:
        st = os.lstat(os.path.join(root, job_id))
        if stat.S_ISDIR(st.st_mode):
            times.append(st.st_ctime)
    except OSError:
        pass
    try:
        for name, kind in safefs.list_dir(root):
            if kind == "file" and name.startswith(f"{job_id}.ranks."):
                try:
                    times.append(os.lstat(os.path.join(root, name)).st_ctime)
                except OSError:
                    continue
    except UnsafePath:
        pass
    return min(times) if times else None


def copy_kind(job_dir: str, kind: str, dest: str, total_cap: int, file_cap: int, max_files: int,
              deadline: float, tail: bool = False) -> SourceResult:
    """Copy regular files of job_dir/kind into dest, bounded; symlinks and specials are skipped."""
    res = SourceResult()
    t0 = time.monotonic()
    try:
        entries = list(safefs.walk_files(job_dir, kind, max_depth=2))
    except UnsafePath as err:
        return SourceResult(status="missing", detail=str(err))
    skipped = 0
    for rel in entries:
        if not rel.startswith(kind + "/"):
            continue
        if time.monotonic() > deadline:
            res.status, res.detail = "truncated", "time budget exhausted"
            break
        if res.files >= max_files or res.bytes >= total_cap:
            res.status, res.detail = "truncated", f"caps reached ({max_files} files, {total_cap} bytes)"
            break
        try:
            got = safefs.read_file(job_dir, rel, min(file_cap, total_cap - res.bytes), tail=tail)
        except UnsafePath:
            skipped += 1
            continue
        os.makedirs(dest, mode=0o700, exist_ok=True)
        _write(os.path.join(dest, safe_name(rel[len(kind) + 1:])), got.data)
        res.files += 1
        res.bytes += len(got.data)
        if got.truncated:
            res.status = "truncated"
            res.detail = f"{rel}: kept {len(got.data)} of {got.size} bytes"
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


def read_rank_map(root: str, job_id: str, node: str) -> dict[str, list[int]]:
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
        if mine:
            try:
                os.unlink(os.path.join(root, name))
            except OSError:
                pass
    return {k: sorted(v) for k, v in out.items()}


def collect_node(cfg: Config, job: NodeJob) -> dict[str, Any]:
    """Write this node's part of the bundle; return what collect.json says."""
    c = cfg.collect
    t0 = time.monotonic()
    deadline = t0 + c.time_budget_s
    started = datetime.now(timezone.utc)
    node_dir = os.path.join(spool.bundle_dir(cfg.paths.spool, job.bundle_key), "nodes", job.node)
    spool.ensure_dir(node_dir)
    sources: dict[str, dict[str, Any]] = {}

    # 1. Kernel log: trusted, the evidence a drain rests on. First, so a slow job dir cannot starve it.
    start = job.start or _job_start_hint(cfg.paths.evidence_root, job.job_id) or (job.end - DEFAULT_WINDOW_S)
    tk = time.monotonic()
    win = kernel.read_window(c.kernel_source, c.kernel_file, job.node, start - c.window_slack_s,
                             job.end + c.window_slack_s, c.kernel_cap_bytes,
                             timeout=max(1.0, min(10.0, deadline - time.monotonic())))
    if win.text or win.status in ("ok", "truncated"):
        _write(os.path.join(node_dir, "kernel.log"), win.text)
    sources["kernel"] = SourceResult(status=win.status, bytes=len(win.text), ms=(time.monotonic() - tk) * 1000,
                                     detail=win.detail).to_dict()

    # 2. What the job wrote. Skipped entirely when the user opted out.
    job_dir = os.path.join(cfg.paths.evidence_root, job.job_id)
    if job.opted_out:
        for kind in ("fr", "probe", "nccl"):
            sources[kind] = SourceResult(status="missing", detail="job opted out (--attr=off)").to_dict()
    else:
        try:
            os.close(safefs.open_dir(job_dir))
            dir_ok = True
        except UnsafePath as err:
            dir_ok = False
            for kind in ("fr", "probe", "nccl"):
                sources[kind] = SourceResult(status="missing", detail=f"job dir: {err}").to_dict()
        if dir_ok:
            caps = {"fr": (c.fr_cap_bytes, c.fr_file_cap_bytes, False),
                    "probe": (c.probe_cap_bytes, c.probe_cap_bytes, False),
                    "nccl": (c.nccl_cap_bytes, c.nccl_cap_bytes, True)}
            for kind, (total, per_file, tail) in caps.items():
                sources[kind] = copy_kind(job_dir, kind, os.path.join(node_dir, kind), total, per_file,
                                          c.max_files, deadline, tail=tail).to_dict()
    ranks = read_rank_map(cfg.paths.evidence_root, job.job_id, job.node)
    if c.remove_job_dir:
        err = remove_job_dir(cfg.paths.evidence_root, job.job_id)
        if err:
            sources["jobdir_cleanup"] = SourceResult(status="error", detail=err).to_dict()

    doc = {
        "version": 1,
        "node": job.node,
        "job_id": job.job_id,
        "opted_out": job.opted_out,
        "started": started.isoformat(timespec="seconds"),
        "ms": round((time.monotonic() - t0) * 1000, 1),
        "sources": sources,
        "ranks": ranks,
    }
    # Last: its presence tells the controller side this node is done.
    _write(os.path.join(node_dir, "collect.json"), json.dumps(doc, indent=1).encode())
    return doc
