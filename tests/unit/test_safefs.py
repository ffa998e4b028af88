import os

import pytest

from slurm_attr import safefs
from slurm_attr.errors import UnsafePath


@pytest.fixture
def root(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "f.txt").write_bytes(b"hello\nworld\n")
    (tmp_path / "secret").write_text("root:x:0:0")
    return tmp_path


def test_reads_regular_file_bounded(root):
    r = safefs.read_file(str(root), "d/f.txt", cap=5)
    assert r.data == b"hello" and r.truncated and r.size == 12
    r = safefs.read_file(str(root), "d/f.txt", cap=5, tail=True)
    assert r.data == b"orld\n" and r.truncated
    r = safefs.read_file(str(root), "d/f.txt", cap=100)
    assert r.data == b"hello\nworld\n" and not r.truncated


def test_symlinked_file_is_refused(root):
    os.symlink(root / "secret", root / "d" / "link")
    with pytest.raises(UnsafePath, match="symlink"):
        safefs.read_file(str(root), "d/link", 100)


def test_symlinked_directory_component_is_refused(root):
    os.symlink(root, root / "d" / "up")
    with pytest.raises(UnsafePath):
        safefs.read_file(str(root), "d/up/secret", 100)
    with pytest.raises(UnsafePath):
        safefs.read_file(str(root), "../secret", 100)


def test_symlinked_root_is_refused(root, tmp_path_factory):
    other = tmp_path_factory.mktemp("o")
    os.symlink(root, other / "jobdir")
    with pytest.raises(UnsafePath):
        safefs.open_dir(str(other / "jobdir"))


def test_fifo_does_not_block_and_is_refused(root):
    os.mkfifo(root / "d" / "fifo")
    with pytest.raises(UnsafePath, match="not a regular file"):
        safefs.read_file(str(root), "d/fifo", 100)


def test_listing_marks_links_and_specials_as_other(root):
    os.symlink("/etc", root / "d" / "etc")
    os.mkfifo(root / "d" / "p")
    kinds = dict(safefs.list_dir(str(root), "d"))
    assert kinds == {"f.txt": "file", "etc": "other", "p": "other"}
    assert list(safefs.walk_files(str(root), "d")) == ["d/f.txt"]


def test_decode_replaces_invalid_utf8_and_nul():
    assert safefs.decode(b"a\xff\x00b") == "a\ufffdb"
