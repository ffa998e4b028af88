"""cluster/pyslurm.sh: which release line fits which Slurm, and where the cached wheel is found.

A stand-in `slurmd -V` on PATH plays each Slurm release; the build itself (minutes of
Cython) is exercised by `testcluster.sh up` and the integration contract tests.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "cluster" / "pyslurm.sh"


def run(tmp_path: Path, version: str, *args: str, vendor: Path | None = None) -> subprocess.CompletedProcess:
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    fake = bindir / "slurmd"
    fake.write_text(f"#!/bin/sh\necho 'slurm-wlm {version}'\n")  # Debian's `slurmd -V` wording
    fake.chmod(0o755)
    if vendor is None:
        vendor = tmp_path / "vendor"
        vendor.mkdir(exist_ok=True)
        for line in ("22.5", "24.11"):
            (vendor / f"pyslurm-{line}.x.tar.gz").write_bytes(b"")
    env = dict(os.environ, PATH=f"{bindir}:{os.environ['PATH']}", SATTR_VENDOR=str(vendor),
               SATTR_PYSLURM_CACHE=str(tmp_path / "cache"))
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=60)


@pytest.mark.parametrize("version,line", [("22.05.8", "22.5"), ("24.11.5", "24.11")])
def test_release_line_of_each_vendored_slurm(tmp_path, version, line):
    proc = run(tmp_path, version, "line")
    assert proc.returncode == 0 and proc.stdout.strip() == line


def test_no_line_for_a_slurm_without_a_branch(tmp_path):
    # 26.05 has no PySlurm branch yet: exit 3, which testcluster.sh reads as "use the CLI"
    proc = run(tmp_path, "26.05.5", "line")
    assert proc.returncode == 3 and "no pyslurm release line for Slurm 26.05.5" in proc.stderr
    proc = run(tmp_path, "26.05.5", "build", sys.executable)
    assert proc.returncode == 3


def test_cached_wheel_is_found_by_slurm_version_and_python(tmp_path):
    tag = "cp%d%d" % sys.version_info[:2]
    assert run(tmp_path, "22.05.8", "path", sys.executable).returncode == 1  # nothing built yet
    cached = tmp_path / "cache" / f"slurm-22.05.8-{tag}"
    cached.mkdir(parents=True)
    whl = cached / f"pyslurm-22.5.3-{tag}-{tag}-linux_x86_64.whl"
    whl.write_bytes(b"")
    proc = run(tmp_path, "22.05.8", "path", sys.executable)
    assert proc.returncode == 0 and proc.stdout.strip() == str(whl)
    # near miss: another Slurm micro release is another key (the wheel links that libslurm)
    assert run(tmp_path, "22.05.9", "path", sys.executable).returncode == 1
