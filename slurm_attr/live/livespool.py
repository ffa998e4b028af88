"""Where the live view lives on the spool, and writing/reading its files.

``<spool>/live/`` (root, 0711: nobody lists the jobs), ``<spool>/live/<job>/`` (root, 0755)
    ``summary/<step>/<node>.json``   each node's summary of one step, rewritten every cycle
    ``steps/<step>/nodes/<node>/probe/*.probe``
                                     snapshots of a node's records once a stall is suspected
                                     (a bundle-shaped tree, so the post-mortem probe reader
                                     and rules read it unchanged)
    ``finding.<step>.json``          the step leader's findings (root, 0640, group = the job's)

Each step has its own watchers and leader (srun steps, the batch step): their files never
collide, and ``findings.load`` merges the steps' findings.

Only root (the watchers) writes here. Files are written whole under a temporary name and
renamed, so a reader never sees half a file; every read is bounded and refuses a file
that is not a regular file owned by the writer's identity (the spool is shared: a wrong
owner means someone else put it there).
"""
from __future__ import annotations

import json
import os
import re
import stat
from typing import Any

from .. import atomicfile, safefs
from ..errors import UnsafePath

LIVE = "live"
SUMMARY_CAP = 4 << 20  # a node's summary: 64 ranks x 40 comms is well under this
FINDING_CAP = 1 << 20
_NODE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_JOB = re.compile(r"^\d{1,12}(?:_\d{1,9})?$")
_STEP = re.compile(r"^(?:\d{1,10}|batch|interactive)$")


def valid_node(name: str) -> bool:
    return bool(_NODE.match(name or "")) and name not in (".", "..")


def valid_job(job: str) -> bool:
    return bool(_JOB.match(job or ""))


def valid_step(step: str) -> bool:
    return bool(_STEP.match(step or ""))


def job_dir(spool: str, job: str) -> str:
    if not valid_job(job):
        raise ValueError(f"bad job id {job!r}")
    return os.path.join(spool, LIVE, job)


def ensure_job_dir(spool: str, job: str) -> str:
    """Create <spool>/live (0711) and <spool>/live/<job> (0755: the job's group lists its
    steps' finding files, which only that group may read)."""
    d = job_dir(spool, job)
    for path, mode in ((os.path.join(spool, LIVE), 0o711), (d, 0o755)):
        try:
            os.mkdir(path, mode)
        except FileExistsError:
            pass
        st = os.lstat(path)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
            raise UnsafePath(f"{path}: not a directory of ours")
        if stat.S_IMODE(st.st_mode) != mode:
            os.chmod(path, mode)
    return d


def _ensure_sub(base: str, rel: str, mode: int = 0o700) -> int:
    """A directory fd for base/rel, created component by component without following links."""
    fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    try:
        for part in [p for p in rel.split("/") if p]:
            try:
                os.mkdir(part, mode, dir_fd=fd)
            except FileExistsError:
                pass
            nfd = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), dir_fd=fd)
            os.close(fd)
            fd = nfd
        return fd
    except BaseException:
        os.close(fd)
        raise


def write_atomic(base: str, rel_dir: str, name: str, data: bytes, mode: int = 0o600,
                 gid: int | None = None) -> None:
    """base/rel_dir/name := data, whole or not at all (temp file + rename in one dir fd)."""
    dfd = _ensure_sub(base, rel_dir)
    try:
        atomicfile.write_atomic(name, data, mode=mode, durable=False, dir_fd=dfd, gid=gid)
    finally:
        os.close(dfd)


def write_json(base: str, rel_dir: str, name: str, obj: Any, mode: int = 0o600, gid: int | None = None) -> None:
    write_atomic(base, rel_dir, name, json.dumps(obj, separators=(",", ":")).encode(), mode, gid)


def read_json(base: str, rel: str, cap: int, owner: int | None = None) -> Any:
    """A small JSON file of ours: regular, owned by ``owner`` (default: us), bounded.
    Raises UnsafePath (missing, wrong owner, too big) or ValueError (not JSON)."""
    fd = safefs.open_file(base, rel)
    try:
        st = os.fstat(fd)
        want = os.geteuid() if owner is None else owner
        if st.st_uid != want:
            raise UnsafePath(f"{rel}: owned by uid {st.st_uid}, not {want}")
        res = safefs.read_fd(fd, cap)
    finally:
        os.close(fd)
    if res.truncated:
        raise UnsafePath(f"{rel}: larger than {cap} bytes")
    return json.loads(res.data)
