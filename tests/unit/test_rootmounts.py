"""cluster/rootmounts.sh: a debootstrap root is removed only after everything mounted into it
is unmounted, and never through a mount (the host's /dev is rbind-mounted into the roots; an
`rm -rf` that crossed it deleted the host's device nodes). Near miss: a sibling whose name
starts with the root's keeps its mount."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "cluster" / "rootmounts.sh"


def _sh(cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", f". {SCRIPT}; {cmd}"], capture_output=True, text=True)


def _mounted(path: Path) -> bool:
    with open("/proc/mounts") as f:
        return any(line.split()[1] == str(path) for line in f)


@pytest.fixture
def host(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("bind mounts need root (CI and `make test` run as root)")
    src = tmp_path / "host"
    (src / "sub").mkdir(parents=True)
    (src / "sub" / "node").write_text("the host's\n")
    yield src
    for p in sorted((str(p) for p in tmp_path.rglob("*") if p.is_dir() and _mounted(p)), reverse=True):
        subprocess.run(["umount", "-l", p], check=False)


def test_remove_unmounts_first_and_keeps_what_was_mounted(tmp_path, host):
    root, sibling = tmp_path / "root", tmp_path / "root2"
    for d in (root / "dev", root / "sys", sibling / "dev"):
        d.mkdir(parents=True)
    subprocess.run(["mount", "--rbind", str(host), str(root / "dev")], check=True)
    subprocess.run(["mount", "--bind", str(host), str(root / "sys")], check=True)
    subprocess.run(["mount", "--bind", str(host), str(sibling / "dev")], check=True)
    out = _sh(f"root_remove {root}")
    assert out.returncode == 0, out.stderr
    assert not root.exists()
    assert (host / "sub" / "node").read_text() == "the host's\n"  # nothing deleted through the mount
    assert _mounted(sibling / "dev") and (sibling / "dev" / "sub" / "node").exists()  # not ours


def test_unmount_of_a_root_with_nothing_mounted_is_a_no_op(tmp_path):
    (tmp_path / "r").mkdir()
    out = _sh(f"root_unmount {tmp_path / 'r'} && root_remove {tmp_path / 'r'}")
    assert out.returncode == 0, out.stderr
    assert not (tmp_path / "r").exists()
