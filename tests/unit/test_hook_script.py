"""epilog/hook.sh: one script for the three Slurm hooks, its role from the name Slurm calls it by
(the prolog.sh, epilog.sh and epilog_slurmctld.sh links) or from its first argument. Each role
runs its own Python entry and exits 0 whatever that entry did; only the Prolog's deliberate
drain is non-zero (tests/unit/test_gate.py::test_prolog_script_fails_only_on_a_deliberate_drain)."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

HOOKS = Path(__file__).resolve().parents[2] / "epilog"


def _run(tmp_path, script: str, *args: str, record: bool = False) -> tuple[int, str, bool]:
    """(exit status, the args the fake Python got, whether the native front ran)."""
    seen = tmp_path / "py.args"
    fake = tmp_path / "python"
    fake.write_text(f'#!/bin/sh\necho "$*" > {seen}\nexit 3\n')
    fake.chmod(0o755)
    front = tmp_path / "sattr-record"
    front.write_text(f"#!/bin/sh\ntouch {tmp_path}/front.ran\n")
    front.chmod(0o755 if record else 0o644)  # not executable: the Python hook instead
    env = dict(os.environ, SLURM_ATTR_PYTHON=str(fake), SLURM_ATTR_RECORD=str(front), SLURM_JOB_ID="77")
    proc = subprocess.run(["sh", str(HOOKS / script), *args], env=env, capture_output=True, timeout=30)
    return proc.returncode, seen.read_text().strip() if seen.exists() else "", (tmp_path / "front.ran").exists()


@pytest.mark.parametrize("script,args,want", [
    ("epilog.sh", (), "-m slurm_attr.hooks node"),
    ("epilog_slurmctld.sh", (), "-m slurm_attr.hooks controller"),
    ("prolog.sh", (), "-m slurm_attr.gate"),
    ("hook.sh", ("node",), "-m slurm_attr.hooks node"),
    ("hook.sh", ("controller",), "-m slurm_attr.hooks controller"),
])
def test_each_role_runs_its_entry_and_exits_zero(tmp_path, script, args, want):
    assert _run(tmp_path, script, *args) == (0, want, False)


def test_the_controller_hands_over_to_the_native_front_when_installed(tmp_path):
    (tmp_path / "ctld").mkdir()
    (tmp_path / "node").mkdir()
    assert _run(tmp_path / "ctld", "epilog_slurmctld.sh", record=True) == (0, "", True)
    # near miss: the node epilog never takes the controller's front
    assert _run(tmp_path / "node", "epilog.sh", record=True) == (0, "-m slurm_attr.hooks node", False)


def test_an_unknown_role_runs_nothing_and_exits_zero(tmp_path):
    assert _run(tmp_path, "hook.sh", "bogus") == (0, "", False)


def test_the_role_links_point_at_the_one_script():
    for name in ("prolog.sh", "epilog.sh", "epilog_slurmctld.sh"):
        assert os.readlink(HOOKS / name) == "hook.sh"
