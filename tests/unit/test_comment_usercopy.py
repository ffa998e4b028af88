"""The root-written copy of a verdict that `sattr <job>` shows its user (usercopy.py)."""
from __future__ import annotations

import json
import os
import shutil
import stat
import struct
import subprocess
import sys
import tempfile

import pytest

from slurm_attr import usercopy
from slurm_attr.config import Config
from slurm_attr.errors import NotFound, UnsafePath
from slurm_attr.model import Verdict

ALICE, BOB = 61001, 61002


@pytest.fixture
def cfg(tmp_path, monkeypatch):
    monkeypatch.setattr(usercopy, "TRUSTED_UID", os.getuid())
    c = Config()
    c.paths.database = str(tmp_path / "db" / "sattr.db")
    return c


def _v(job="8", cause="gpu_hardware"):
    return Verdict(job_id=job, cause=cause, summary="GPU fell off the bus", culprit_nodes=["n2"])


def test_acl_is_owner_rwx_and_traverse_only_for_the_user():
    raw = usercopy.acl_traverse_only(ALICE)
    version, = struct.unpack_from("<I", raw)
    entries = [struct.unpack_from("<HHI", raw, 4 + 8 * i) for i in range((len(raw) - 4) // 8)]
    assert version == 2
    assert entries == [(0x01, 7, 0xFFFFFFFF), (0x02, 1, ALICE), (0x04, 0, 0xFFFFFFFF), (0x10, 1, 0xFFFFFFFF),
                       (0x20, 0, 0xFFFFFFFF)]


def test_publish_lays_out_root_dirs_and_a_read_only_file(cfg):
    path = usercopy.publish(cfg, {"uid": ALICE, "user": "alice", "partition": "gpu", "state": "FAILED"}, _v())
    root = usercopy.root_dir(cfg)
    assert path == f"{root}/{ALICE}/8.json"
    assert stat.S_IMODE(os.stat(root).st_mode) == 0o711
    # The database's directory (0700 when created) now lets users traverse it, nothing more.
    assert stat.S_IMODE(os.stat(os.path.dirname(root)).st_mode) == 0o701
    assert os.getxattr(f"{root}/{ALICE}", "system.posix_acl_access") == usercopy.acl_traverse_only(ALICE)
    assert stat.S_IMODE(os.stat(f"{root}/{ALICE}").st_mode) == 0o710  # group bits = the ACL mask
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o644
    got = usercopy.read(cfg, "8", ALICE)
    assert got["verdict"].cause == "gpu_hardware" and got["job"]["partition"] == "gpu"
    # Re-analysis replaces the copy in place; no temporary file is left behind.
    usercopy.publish(cfg, {"uid": ALICE}, _v(cause="user_error"))
    assert usercopy.read(cfg, "8", ALICE)["verdict"].cause == "user_error"
    assert os.listdir(f"{root}/{ALICE}") == ["8.json"]


def test_another_uid_finds_nothing(cfg):
    usercopy.publish(cfg, {"uid": ALICE}, _v())
    with pytest.raises(NotFound):
        usercopy.read(cfg, "8", BOB)
    with pytest.raises(NotFound):
        usercopy.read(cfg, "9", ALICE)  # near miss: right user, no such job


@pytest.mark.parametrize("job_id", ["../8", "8/../../x", "", "8.json", "a_1"])
def test_odd_job_ids_are_refused(cfg, job_id):
    with pytest.raises(NotFound):
        usercopy.read(cfg, job_id, ALICE)
    assert usercopy.publish(cfg, {"uid": ALICE}, _v(job=job_id)) is None


def test_copy_not_owned_by_root_is_refused(cfg):
    path = usercopy.publish(cfg, {"uid": ALICE}, _v())
    if os.getuid() != 0:
        pytest.skip("chown needs root")
    os.chown(path, ALICE, -1)
    with pytest.raises(UnsafePath, match="not root's"):
        usercopy.read(cfg, "8", ALICE)


def test_writable_directory_is_refused(cfg):
    usercopy.publish(cfg, {"uid": ALICE}, _v())
    d = f"{usercopy.root_dir(cfg)}/{ALICE}"
    os.chmod(d, 0o777)
    with pytest.raises(UnsafePath, match="not root's"):
        usercopy.read(cfg, "8", ALICE)


def test_symlink_and_swapped_copies_are_refused(cfg):
    usercopy.publish(cfg, {"uid": ALICE}, _v(job="8"))
    d = f"{usercopy.root_dir(cfg)}/{ALICE}"
    os.symlink(f"{d}/8.json", f"{d}/9.json")
    with pytest.raises(UnsafePath):
        usercopy.read(cfg, "9", ALICE)
    os.unlink(f"{d}/9.json")
    shutil.copy(f"{d}/8.json", f"{d}/10.json")  # a copy of job 8 under job 10's name
    with pytest.raises(UnsafePath, match="not a verdict copy"):
        usercopy.read(cfg, "10", ALICE)


def test_garbage_copy_is_refused(cfg):
    usercopy.publish(cfg, {"uid": ALICE}, _v())
    p = f"{usercopy.root_dir(cfg)}/{ALICE}/8.json"
    with open(p, "w") as f:
        json.dump({"job_id": "8", "uid": ALICE}, f)  # no verdict
    with pytest.raises(UnsafePath, match="not a verdict copy"):
        usercopy.read(cfg, "8", ALICE)


def test_unknown_uid_publishes_nothing(cfg):
    assert usercopy.publish(cfg, {"user": "no-such-user-sattr"}, _v()) is None
    assert usercopy.publish(cfg, {}, _v()) is None


def _reachable_python(base, uid):
    """An interpreter and a copy of the package that ``uid`` can reach, under ``base`` (0755):
    the checkout and its venv may sit in a 0700 home (/root/src), where only root gets through.
    The probe needs the standard library alone, so the venv's base interpreter runs it; where
    even that is out of reach (a Python built under /root), the test cannot run as ``uid``."""
    pkg = os.path.join(base, "pkg")
    shutil.copytree(os.path.dirname(usercopy.__file__), os.path.join(pkg, "slurm_attr"),
                    ignore=shutil.ignore_patterns("__pycache__"))
    for d, _dirs, files in os.walk(pkg):
        os.chmod(d, 0o755)
        for name in files:
            os.chmod(os.path.join(d, name), 0o644)
    python = os.path.realpath(sys.executable)
    env = dict(os.environ, PYTHONPATH=pkg)
    try:
        check = subprocess.run([python, "-c", "import slurm_attr.usercopy"], user=uid, group=uid, extra_groups=[],
                               capture_output=True, text=True, env=env, cwd="/")
    except OSError as err:  # the interpreter itself is out of reach
        pytest.skip(f"uid {uid} cannot run {python}: {err}")
    if check.returncode != 0:
        pytest.skip(f"uid {uid} cannot import a copy of the package with {python}: {check.stderr.strip()[-300:]}")
    return python, env


@pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs root")
def test_kernel_lets_only_the_jobs_user_read_it(monkeypatch):
    """The real permission check: a process of the job's uid reads the copy, another uid cannot."""
    monkeypatch.setattr(usercopy, "TRUSTED_UID", 0)
    base = tempfile.mkdtemp(prefix="sattr-copy-")
    try:
        os.chmod(base, 0o755)
        cfg = Config()
        cfg.paths.database = f"{base}/db/sattr.db"
        usercopy.publish(cfg, {"uid": ALICE}, _v())
        probe = ("import sys; from slurm_attr import usercopy; from slurm_attr.config import Config\n"
                 "c = Config(); c.paths.database = sys.argv[1]\n"
                 "try:\n    print(usercopy.read(c, '8', int(sys.argv[2]))['verdict'].cause)\n"
                 "except Exception as e:\n    print(type(e).__name__, e)\n")
        python, env = _reachable_python(base, ALICE)

        def as_uid(uid, reader_uid):
            return subprocess.run([python, "-c", probe, cfg.paths.database, str(reader_uid)], user=uid,
                                  group=uid, extra_groups=[], capture_output=True, text=True, env=env,
                                  cwd="/").stdout.strip()

        assert as_uid(ALICE, ALICE) == "gpu_hardware"
        # Bob asks for Alice's copy by path: the directory does not let him through.
        assert as_uid(BOB, ALICE).startswith("NotFound") and "Permission denied" in as_uid(BOB, ALICE)
        # Nor can he list who has copies.
        listing = subprocess.run([python, "-c", "import os,sys; print(os.listdir(sys.argv[1]))",
                                  usercopy.root_dir(cfg)], user=BOB, group=BOB, extra_groups=[],
                                 capture_output=True, text=True, cwd="/")
        assert "PermissionError" in listing.stderr
    finally:
        shutil.rmtree(base, ignore_errors=True)
