"""The job's evidence dir on this node (<evidence_root>/<job_id>): whose it is, copying its files
out (FR dumps, probe records, NCCL logs) within caps, the plugin's rank maps beside it, and
removing it when the node's part is collected.

The job owns the dir and may have booby-trapped it: every read goes through safefs.py (no link
followed, regular files only, bounded), a dir of another uid is left alone, and a sparse file is
skipped rather than copied as gigabytes of zeros.
"""
from __future__ import annotations

import os
import re
import shutil
import stat
import time

from .. import safefs
from ..errors import UnsafePath
from . import nodepart, sharedroot
from .nodepart import SourceResult

_SAFE_NAME = re.compile(r"[^A-Za-z0-9._-]")


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


def safe_name(rel: str) -> str:
    """A flat, harmless file name for a job-chosen relative path."""
    name = _SAFE_NAME.sub("_", rel.replace("/", "__")).lstrip(".")
    return (name or "unnamed")[:200]


# A file whose allocated blocks cover less than this share of its size is sparse: a job can
# `truncate -s 2G` a file for free and make root copy gigabytes of zeros onto the spool.
SPARSE_RATIO = 0.5
SPARSE_MIN_BYTES = 1 << 20


def is_sparse(st: os.stat_result) -> bool:
    return st.st_size >= SPARSE_MIN_BYTES and st.st_blocks * 512 < st.st_size * SPARSE_RATIO


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
        nodepart.write_private(os.path.join(dest, safe_name(rel[len(kind) + 1:])), got.data)
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


def other_nodes_pending(root: str, job_id: str) -> bool:
    """Rank maps of this job left after ours were consumed: other nodes share this root."""
    try:
        return any(kind == "file" and n.startswith(f"{job_id}.ranks.") for n, kind in safefs.list_dir(root))
    except UnsafePath:
        return False

