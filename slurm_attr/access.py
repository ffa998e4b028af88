"""Who may see which verdict: admins see every job, users their own (as sacct does).

Admins: root, Slurm's SlurmUser, and members of [access] admin_group. The verdict
database is root's; a user who cannot open it gets their own job's verdict from the
copy the analysis wrote for them as root (usercopy.py). Never from the job's Comment:
that is free text the user fills, and an `sattr1: ...` typed there is not a verdict.
"""
from __future__ import annotations

import grp
import os
import pwd
from dataclasses import dataclass, field
from typing import Any

from . import usercopy
from .config import Config
from .errors import NotFound, PermissionDenied, SlurmError, StoreError, UnsafePath
from .model import Verdict
from .slurm import default_backend
from .store import Store
from .waiting import wait_until


@dataclass
class JobView:
    verdict: Verdict
    job: dict[str, Any] = field(default_factory=dict)
    comment_status: str | None = None
    source: str = "database"  # database | copy (the root-written per-user copy)
    comments: list[dict[str, Any]] = field(default_factory=list)  # the queue's entry per accounting field
    earlier: list[dict[str, Any]] = field(default_factory=list)  # a requeued job's earlier attempts' verdicts


def caller() -> tuple[int, str]:
    uid = os.getuid()
    try:
        return uid, pwd.getpwuid(uid).pw_name
    except KeyError:
        return uid, str(uid)


def is_admin(cfg: Config, uid: int, name: str, slurm_user: str = "slurm") -> bool:
    if uid == 0 or name == slurm_user:
        return True
    if cfg.access.admin_group:
        try:
            g = grp.getgrnam(cfg.access.admin_group)
        except KeyError:
            return False
        if name in g.gr_mem:
            return True
        try:
            return pwd.getpwnam(name).pw_gid == g.gr_gid
        except KeyError:
            return False
    return False


def can_read_database(path: str) -> bool:
    """Whether this process may open the verdict database (it is root's by default)."""
    return os.path.exists(path) and os.access(path, os.R_OK) and os.access(os.path.dirname(path) or ".", os.X_OK)



def _check_owner(job: dict[str, Any], uid: int, name: str, job_id: str) -> None:
    owner_uid = job.get("uid")
    owner = job.get("user")
    if (owner_uid is not None and int(owner_uid) == uid) or (owner and owner == name):
        return
    raise PermissionDenied(f"job {job_id} belongs to another user: you can see only your own jobs")


def job_view(cfg: Config, job_id: str) -> JobView:
    uid, name = caller()
    admin = is_admin(cfg, uid, name)
    if can_read_database(cfg.paths.database):
        try:
            store = Store(cfg.paths.database)
        except StoreError:
            store = None
        if store is not None:
            v = store.verdict(job_id)
            job = store.job(job_id)
            if not admin:
                _check_owner(job, uid, name, job_id)
            return JobView(verdict=v, job=job, comment_status=store.comment_status(job_id),
                           comments=store.job_comments(job_id), earlier=store.earlier_attempts(job_id))
    if admin and os.path.exists(cfg.paths.database):
        raise StoreError(f"cannot read {cfg.paths.database}")
    return _from_user_copy(cfg, job_id, uid, name, admin)


def check_job(cfg: Config, job_id: str) -> None:
    """Raise PermissionDenied, as ``job_view`` does, when the caller may not read job_id: for
    the commands that read a job's bundle rather than its verdict (`sattr fr`, `sattr report`),
    whose files another user cannot open, which would otherwise read as an empty answer.
    Owner by the verdict database where readable, else by the caller's own copy of the
    verdict, else by accounting (a job accounting cannot name stays the OS's to refuse)."""
    uid, name = caller()
    if is_admin(cfg, uid, name):
        return
    if can_read_database(cfg.paths.database):
        try:
            job = Store(cfg.paths.database).job(job_id)
        except (StoreError, NotFound):
            job = {}
        if job:
            _check_owner(job, uid, name, job_id)
            return
    try:
        usercopy.read(cfg, job_id, uid)  # kept under the caller's own uid: their job
        return
    except (NotFound, UnsafePath):
        pass
    _check_in_accounting(cfg, job_id, name, admin=False)


# Seen on Slurm 22.05 right after the job's comment was written: for a second or two sacct
# shows the record with User=root and an empty Partition, until slurmdbd has the job's own
# records. Such a row is not an answer yet; a complete row naming another user is.
_SETTLE_TRIES = 8
_SETTLE_S = 0.5


def _from_user_copy(cfg: Config, job_id: str, uid: int, name: str, admin: bool) -> JobView:
    # The copy sits under the caller's own uid: another user's job is simply not there.
    try:
        got = usercopy.read(cfg, job_id, uid)
        return JobView(verdict=got["verdict"], job=got["job"], source="copy")
    except NotFound:
        # Say why: another user's job, a job accounting does not know, or not analysed yet.
        _check_in_accounting(cfg, job_id, name, admin)
        raise


def _check_in_accounting(cfg: Config, job_id: str, name: str, admin: bool) -> None:
    slurm = default_backend(cfg.paths.slurm_bin, cfg.paths.slurm_conf, backend=cfg.slurm.backend)
    try:
        row = wait_until(lambda: slurm.sacct_job(job_id), None, _SETTLE_S, f"accounting's own record of job {job_id}",
                         done=lambda r: bool(admin or not r or r.get("User") == name or r.get("Partition")),
                         max_tries=_SETTLE_TRIES).value
    except SlurmError:
        return  # the copy's answer (not found) stands
    if not row:
        raise NotFound(f"job {job_id} is not in accounting")
    if not admin and row.get("User") != name:
        raise PermissionDenied(f"job {job_id} belongs to another user: you can see only your own jobs")
