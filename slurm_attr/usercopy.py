"""The copy of a verdict its job's user reads: written by root, readable by that user alone.

Users cannot open the verdict database (root's), and the job's Comment is free text
the user fills, so `sattr <job>` for a user reads this copy instead:

    <verdicts>/                 root:root 0711  traverse only: nobody lists the uids
    <verdicts>/<uid>/           root:root 0700 + ACL user:<uid>:--x (mode shows 0710)
    <verdicts>/<uid>/<job>.json root:root 0644, replaced atomically (rename)

Why this shape: the job's user must read the file but never write it, and no other
user may read it. A file in a root-owned directory cannot be written or replaced by
the user; the per-uid directory admits only root and that uid (the ACL), and cannot
be listed even by them. Job ids are guessable, so "not listable" alone (a 0711
directory) would not keep other users out: the ACL on the directory does. Where the
filesystem has no POSIX ACLs, the directory goes to root:<the user's private group>
0710 if that group is the user's alone, else it stays 0700 and the user is told to
ask an admin (never a weaker mode).

The reader trusts the copy only if every directory and the file are root's and not
group/other-writable, and the file names the job and the uid asked for.
"""
from __future__ import annotations

import errno
import grp
import json
import logging
import os
import pwd
import re
import stat
import struct
import time
from typing import Any

from . import safefs
from .atomicfile import write_atomic
from .config import Config
from .errors import NotFound, UnsafePath
from .model import Verdict

log = logging.getLogger("slurm_attr")

# Owner every directory and file of the copy must have; a test may point it at itself.
TRUSTED_UID = 0
MAX_BYTES = 8 << 20
FORMAT = 1
_JOB_ID = re.compile(r"^[0-9]{1,12}(?:_[0-9]{1,10})?$")
# The job facts a user sees beside the verdict (as `sacct` shows them to the same user).
_JOB_KEYS = ("job_id", "slurm_job_id", "user", "uid", "partition", "nodes", "state", "exit_code", "signal",
             "start_time", "end_time", "num_tasks", "restart_count")

_O_PATH = getattr(os, "O_PATH", 0)
_DIR_PATH = _O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
_FILE_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)

# POSIX ACL xattr (linux/posix_acl_xattr.h): le32 version 2, then (le16 tag, le16 perm, le32 id).
_ACL_XATTR = "system.posix_acl_access"
_USER_OBJ, _USER, _GROUP_OBJ, _MASK, _OTHER = 0x01, 0x02, 0x04, 0x10, 0x20
_UNDEFINED_ID = 0xFFFFFFFF


def root_dir(cfg: Config) -> str:
    """[paths] verdicts, or `verdicts` beside the database."""
    explicit = getattr(cfg.paths, "verdicts", "")
    return explicit or os.path.join(os.path.dirname(os.path.abspath(cfg.paths.database)), "verdicts")


def acl_traverse_only(uid: int) -> bytes:
    """An access ACL: owner rwx, `uid` search only, nobody else anything."""
    entries = [(_USER_OBJ, 7, _UNDEFINED_ID), (_USER, 1, uid), (_GROUP_OBJ, 0, _UNDEFINED_ID),
               (_MASK, 1, _UNDEFINED_ID), (_OTHER, 0, _UNDEFINED_ID)]
    return struct.pack("<I", 2) + b"".join(struct.pack("<HHI", t, p, i) for t, p, i in entries)


def valid_job_id(job_id: str) -> bool:
    return bool(_JOB_ID.match(job_id or ""))


# -- writing (root, from the analysis) ---------------------------------------------------------

def _ensure_dir(parent_fd: int | None, path: str, name: str, mode: int) -> int:
    """Open (creating if needed) a root-owned directory without following symlinks."""
    try:
        os.mkdir(name if parent_fd is not None else path, mode, dir_fd=parent_fd)
    except FileExistsError:
        pass
    fd = os.open(name if parent_fd is not None else path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW,
                 dir_fd=parent_fd)
    st = os.fstat(fd)
    if st.st_uid != TRUSTED_UID:
        os.close(fd)
        raise UnsafePath(f"{path}: owned by uid {st.st_uid}, not root")
    return fd


def _share_with(dir_fd: int, path: str, uid: int) -> bool:
    """Let `uid` (only) traverse the directory; False when the filesystem cannot say so."""
    os.fchmod(dir_fd, 0o700)
    if uid == TRUSTED_UID:
        return True
    try:
        os.setxattr(dir_fd, _ACL_XATTR, acl_traverse_only(uid))
        return True
    except OSError as err:
        if err.errno not in (errno.ENOTSUP, errno.EOPNOTSUPP):
            raise
    # No ACLs here: a user-private group (named as the user, no other member) is as narrow.
    try:
        pw = pwd.getpwuid(uid)
        g = grp.getgrgid(pw.pw_gid)
    except KeyError:
        return False
    if g.gr_name != pw.pw_name or any(m != pw.pw_name for m in g.gr_mem):
        log.warning("%s: no POSIX ACLs and uid %d has no private group: the user cannot read the copy",
                    path, uid)
        return False
    os.fchown(dir_fd, TRUSTED_UID, g.gr_gid)
    os.fchmod(dir_fd, 0o710)
    return True


def _uid_of(job: dict[str, Any]) -> int | None:
    uid = job.get("uid")
    if isinstance(uid, int) or (isinstance(uid, str) and uid.isdigit()):
        return int(uid)
    if job.get("user"):
        try:
            return pwd.getpwnam(str(job["user"])).pw_uid
        except KeyError:
            return None
    return None


def publish(cfg: Config, job: dict[str, Any], verdict: Verdict) -> str | None:
    """Write the user's copy of `verdict`; its path, or None when it cannot be shared."""
    job_id = str(verdict.job_id)
    uid = _uid_of(job)
    if uid is None or not valid_job_id(job_id):
        log.info("job %s: no user copy of the verdict (uid %r unknown or odd job id)", job_id, job.get("uid"))
        return None
    root = root_dir(cfg)
    if not getattr(cfg.paths, "verdicts", ""):
        # The default root sits in the database's directory (created 0700): users need to
        # traverse it. The database itself stays 0600.
        parent = os.path.dirname(root)
        os.makedirs(parent, mode=0o700, exist_ok=True)
        st = os.stat(parent)
        if st.st_uid == TRUSTED_UID and not st.st_mode & stat.S_IXOTH:
            os.chmod(parent, stat.S_IMODE(st.st_mode) | stat.S_IXOTH)
    else:
        os.makedirs(os.path.dirname(root), mode=0o755, exist_ok=True)
    root_fd = _ensure_dir(None, root, root, 0o711)
    try:
        os.fchmod(root_fd, 0o711)
        uid_fd = _ensure_dir(root_fd, f"{root}/{uid}", str(uid), 0o700)
        try:
            if not _share_with(uid_fd, f"{root}/{uid}", uid):
                return None
            body = {
                "format": FORMAT,
                "job_id": job_id,
                "uid": uid,
                "written_at": time.time(),
                "job": {k: job[k] for k in _JOB_KEYS if k in job},
                "verdict": verdict.to_dict(),
            }
            data = json.dumps(body, indent=1).encode()
            write_atomic(f"{job_id}.json", data, mode=0o644, durable=True, dir_fd=uid_fd)
            return f"{root}/{uid}/{job_id}.json"
        finally:
            os.close(uid_fd)
    finally:
        os.close(root_fd)


# -- reading (any user, through `sattr <job>`) -----------------------------------------------

def _trusted(st: os.stat_result, what: str) -> None:
    if st.st_uid != TRUSTED_UID or st.st_mode & 0o022:
        raise UnsafePath(f"{what}: not root's alone (uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):o})")


def read(cfg: Config, job_id: str, uid: int) -> dict[str, Any]:
    """The copy of job_id's verdict for `uid`: {"job": {...}, "verdict": Verdict}.

    NotFound when there is none for this uid (another user's job looks the same);
    UnsafePath when something in the chain is not root's.
    """
    if not valid_job_id(job_id):
        raise NotFound(f"no verdict for job {job_id!r}")
    root = root_dir(cfg)
    fds: list[int] = []
    try:
        try:
            fds.append(os.open(root, _DIR_PATH))
            _trusted(os.fstat(fds[-1]), root)
            fds.append(os.open(str(uid), _DIR_PATH, dir_fd=fds[-1]))
            _trusted(os.fstat(fds[-1]), f"{root}/{uid}")
            fds.append(os.open(f"{job_id}.json", _FILE_READ, dir_fd=fds[-1]))
        except FileNotFoundError as err:
            raise NotFound(f"no verdict for job {job_id} yet") from err
        except PermissionError as err:
            raise NotFound(f"no verdict for job {job_id} readable by you (ask an admin: {err.strerror})") from err
        except OSError as err:
            raise UnsafePath(f"{root}: {os.strerror(err.errno or 0)}") from err
        st = os.fstat(fds[-1])
        if not stat.S_ISREG(st.st_mode):
            raise UnsafePath(f"{root}/{uid}/{job_id}.json: not a regular file")
        _trusted(st, f"{root}/{uid}/{job_id}.json")
        got = safefs.read_fd(fds[-1], MAX_BYTES)
    finally:
        for fd in reversed(fds):
            os.close(fd)
    if got.truncated:
        raise UnsafePath(f"{root}/{uid}/{job_id}.json: larger than {MAX_BYTES} bytes")
    data = got.data
    try:
        body = json.loads(data)
        if str(body["job_id"]) != job_id or int(body["uid"]) != uid:
            raise ValueError("names another job or user")
        verdict = Verdict.from_dict(body["verdict"])
        job = body.get("job") if isinstance(body.get("job"), dict) else {}
    except (ValueError, KeyError, TypeError) as err:
        raise UnsafePath(f"{root}/{uid}/{job_id}.json: not a verdict copy ({err})") from err
    return {"job": job, "verdict": verdict}
