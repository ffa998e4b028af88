"""atomicfile.write_atomic: the one write-then-rename (issue 27). A writer killed between its write
and its rename leaves the old file whole; a failed write leaves no temporary; no link is followed."""
from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import textwrap

import pytest

from slurm_attr import atomicfile
from slurm_attr.atomicfile import is_temp, temp_name, write_atomic

# The child writes the new contents, then stops just before its rename and says so; the test
# kills it there with SIGKILL (no handler, no clean-up runs: what a power cut or the OOM killer does).
_CHILD = textwrap.dedent("""
    import os, sys, time
    from slurm_attr import atomicfile
    path, durable, use_dir_fd = sys.argv[1], sys.argv[2] == "1", sys.argv[3] == "1"
    def stop(*a, **k):
        sys.stdout.write("before-rename\\n"); sys.stdout.flush()
        time.sleep(3600)
    os.replace = stop
    if use_dir_fd:
        dfd = os.open(os.path.dirname(path), os.O_RDONLY | os.O_DIRECTORY)
        atomicfile.write_atomic(os.path.basename(path), b"NEW" * 1000, mode=0o600, durable=durable, dir_fd=dfd)
    else:
        atomicfile.write_atomic(path, b"NEW" * 1000, mode=0o600, durable=durable)
""")


@pytest.mark.parametrize("durable", [True, False])
@pytest.mark.parametrize("use_dir_fd", [True, False])
def test_a_writer_killed_before_its_rename_leaves_the_old_file_whole(tmp_path, durable, use_dir_fd):
    target = tmp_path / "state.json"
    target.write_bytes(b"OLD")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.getcwd()] + sys.path))
    child = subprocess.Popen([sys.executable, "-c", _CHILD, str(target), "1" if durable else "0",
                              "1" if use_dir_fd else "0"], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert child.stdout.readline() == "before-rename\n"
        child.send_signal(signal.SIGKILL)
    finally:
        child.wait()
        child.stdout.close()
    assert child.returncode == -signal.SIGKILL
    assert target.read_bytes() == b"OLD"
    # What is left is the dead writer's temporary, named as such and holding all it wrote.
    left = sorted(os.listdir(tmp_path))
    assert left == sorted(["state.json", temp_name("state.json", child.pid)])
    assert is_temp(temp_name("state.json", child.pid)) and not is_temp("state.json")
    assert (tmp_path / temp_name("state.json", child.pid)).read_bytes() == b"NEW" * 1000
    # The next write replaces the file whole, and only the dead writer's temporary stays.
    write_atomic(str(target), b"NEXT", mode=0o600, durable=durable)
    assert target.read_bytes() == b"NEXT"
    assert sorted(os.listdir(tmp_path)) == left


def test_a_temporary_left_under_our_own_pid_is_replaced(tmp_path):
    stale = tmp_path / temp_name("f")
    stale.write_bytes(b"half of an earlier write")
    write_atomic(str(tmp_path / "f"), b"whole", mode=0o600, durable=False)
    assert os.listdir(tmp_path) == ["f"] and (tmp_path / "f").read_bytes() == b"whole"


def test_is_temp_names_only_write_atomic_temporaries():
    assert is_temp(".kernel.log.4242.tmp")
    assert not is_temp("kernel.log.4242.tmp")  # near miss: not a dot file
    assert not is_temp(".kernel.log.tmp")  # near miss: no pid
    assert not is_temp(".42.json")


@pytest.mark.parametrize("durable", [True, False])
def test_a_failed_rename_leaves_no_temporary_and_the_old_file(tmp_path, durable):
    (tmp_path / "d").mkdir()  # a directory where the file goes: the rename fails
    with pytest.raises(IsADirectoryError):
        write_atomic(str(tmp_path / "d"), b"data", mode=0o600, durable=durable)
    assert os.listdir(tmp_path) == ["d"]
    # near miss: the same write to a free name succeeds
    write_atomic(str(tmp_path / "e"), b"data", mode=0o600, durable=durable)
    assert sorted(os.listdir(tmp_path)) == ["d", "e"]


def test_a_failed_write_leaves_no_temporary(tmp_path, monkeypatch):
    (tmp_path / "f").write_bytes(b"OLD")
    dfd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        def full(fd, data):
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(atomicfile.os, "write", full)
        with pytest.raises(OSError) as got:
            write_atomic("f", b"data", mode=0o600, durable=True, dir_fd=dfd)
        monkeypatch.undo()
        assert got.value.errno == 28
        assert os.listdir(tmp_path) == ["f"] and (tmp_path / "f").read_bytes() == b"OLD"
    finally:
        os.close(dfd)


@pytest.mark.parametrize("durable, syncs", [(True, 2), (False, 0)])
def test_durable_syncs_the_file_and_its_directory(tmp_path, monkeypatch, durable, syncs):
    calls = []
    real = os.fsync
    monkeypatch.setattr(atomicfile.os, "fsync", lambda fd: (calls.append(stat.S_IFMT(os.fstat(fd).st_mode)), real(fd)))
    write_atomic(str(tmp_path / "f"), b"x", mode=0o600, durable=durable)
    assert len(calls) == syncs
    if durable:
        assert calls == [stat.S_IFREG, stat.S_IFDIR]


def test_mode_is_the_callers_whatever_the_umask(tmp_path):
    old = os.umask(0o077)
    try:
        write_atomic(str(tmp_path / "shared"), b"x", mode=0o644, durable=False)
        write_atomic(str(tmp_path / "private"), b"x", mode=0o600, durable=False)
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "shared").st_mode) == 0o644
    assert stat.S_IMODE(os.stat(tmp_path / "private").st_mode) == 0o600


def test_no_link_is_followed(tmp_path):
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    # A link where the file goes is replaced (the link itself), not written through.
    (tmp_path / "out").symlink_to(victim)
    write_atomic(str(tmp_path / "out"), b"ours", mode=0o600, durable=False)
    assert not (tmp_path / "out").is_symlink() and (tmp_path / "out").read_bytes() == b"ours"
    # A link planted under the temporary's name is removed, not written through.
    (tmp_path / temp_name("out2")).symlink_to(victim)
    write_atomic(str(tmp_path / "out2"), b"ours", mode=0o600, durable=False)
    assert victim.read_bytes() == b"precious" and (tmp_path / "out2").read_bytes() == b"ours"
    assert sorted(os.listdir(tmp_path)) == ["out", "out2", "victim"]


def test_dir_fd_takes_a_name_not_a_path(tmp_path):
    dfd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with pytest.raises(ValueError):
            write_atomic("sub/f", b"x", mode=0o600, durable=False, dir_fd=dfd)
        write_atomic("f", b"x", mode=0o600, durable=False, dir_fd=dfd)
    finally:
        os.close(dfd)
    assert os.listdir(tmp_path) == ["f"]


def test_dir_fd_writes_into_the_opened_dir_even_when_the_path_is_swapped_for_a_link(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "elsewhere").mkdir()
    dfd = os.open(tmp_path / "real", os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        os.rename(tmp_path / "real", tmp_path / "moved")
        (tmp_path / "real").symlink_to(tmp_path / "elsewhere")
        write_atomic("ledger.json", b"x", mode=0o600, durable=True, dir_fd=dfd)
    finally:
        os.close(dfd)
    assert os.listdir(tmp_path / "moved") == ["ledger.json"]
    assert os.listdir(tmp_path / "elsewhere") == []
