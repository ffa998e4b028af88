"""cluster/treecopy.sh: the tree a debootstrap root gets (versions.sh, fresh.sh) is the one a
newcomer has, from a git checkout and from a source tarball alike (issue 27: `make test` from a
tarball stopped at "fatal: not a git repository")."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "cluster" / "treecopy.sh"


def _tree(root: Path) -> None:
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "mod.py").write_text("x = 1\n")
    (root / ".venv" / "bin").mkdir(parents=True)
    (root / ".venv" / "bin" / "python").write_text("")
    (root / "pkg" / "__pycache__").mkdir()
    (root / "pkg" / "__pycache__" / "mod.pyc").write_text("")
    (root / "slurm-12.out").write_text("")
    (root / "docs").mkdir()
    (root / "docs" / "slurm-12.out").write_text("kept: the pattern is anchored to the top")
    (root / ".gitignore").write_text("# build outputs\n/.venv/\n__pycache__/\n/slurm-*.out\n")


def _copy(src: Path, dest: Path) -> set[str]:
    subprocess.run(["bash", "-c", f'. "{SCRIPT}"; copy_tree "$1" "$2"', "_", str(src), str(dest)], check=True)
    return {str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file()}


WANT = {".gitignore", "pkg/mod.py", "docs/slurm-12.out"}


def test_a_source_tarball_is_copied_less_what_gitignore_names(tmp_path):
    src = tmp_path / "src"
    _tree(src)
    assert _copy(src, tmp_path / "out") == WANT


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_a_git_checkout_is_copied_as_git_lists_it(tmp_path):
    src = tmp_path / "src"
    _tree(src)
    subprocess.run(["git", "init", "-q", str(src)], check=True)
    subprocess.run(["git", "-C", str(src), "add", "pkg/mod.py"], check=True)
    # near miss of the tarball case: an untracked file git does not ignore travels too, .git does not
    (src / "notes.txt").write_text("untracked")
    assert _copy(src, tmp_path / "out") == WANT | {"notes.txt"}
