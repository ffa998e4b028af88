"""Shared test fixtures: where the project's real data lives."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# shared/ sits beside the checkout (../shared), as on the developers' machines and in CI.
SHARED = Path(os.environ.get("SLURM_ATTR_SHARED", REPO.parent / "shared")).resolve()


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO


@pytest.fixture(scope="session")
def shared_fixtures() -> Path:
    path = SHARED / "fixtures"
    if not path.is_dir():
        pytest.fail(f"shared fixtures not found at {path}: set SLURM_ATTR_SHARED")
    return path


@pytest.fixture
def spool_cfg(tmp_path):
    """A config whose spool, verdict store and intake queue are the test's own."""
    from slurm_attr.config import Config

    c = Config()
    c.paths.spool = str(tmp_path / "spool")
    c.paths.database = str(tmp_path / "db" / "sattr.db")
    c.intake.queue_dir = str(tmp_path / "q")
    return c


@pytest.fixture(autouse=True)
def _scheduling_untouched():
    """A test must leave this process's CPU priority as it found it: code under test that
    lowers its own (the live watcher goes SCHED_IDLE + nice 19) would otherwise starve every
    later test beside a CPU-heavy neighbour, which is how a stress-ng run found it."""
    before = (os.sched_getscheduler(0), os.getpriority(os.PRIO_PROCESS, 0))
    yield
    after = (os.sched_getscheduler(0), os.getpriority(os.PRIO_PROCESS, 0))
    assert after == before, f"the test changed this process's scheduling (policy, nice) {before} -> {after}"
