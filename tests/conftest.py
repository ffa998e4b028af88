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
def gen_fr(repo_root: Path):
    """bench/gen_fr.py, the Flight Recorder dump generator, as a module."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gen_fr", repo_root / "bench" / "gen_fr.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


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


@pytest.fixture
def cfg(tmp_path):
    """A node's config, all under the test's own directory: evidence root (made), spool and
    node state, and the kernel log read from the file kern-<node>.log. A test file that needs
    more (another window slack, a slurm.conf) overrides it with ``def cfg(cfg)``; files whose
    tests read a verdict store keep a ``cfg`` of their own."""
    from slurm_attr.config import Config

    c = Config()
    c.paths.evidence_root = str(tmp_path / "evidence")
    c.paths.spool = str(tmp_path / "spool")
    c.paths.node_state = str(tmp_path / "state")
    c.collect.kernel_source = "file"
    c.collect.kernel_file = str(tmp_path / "kern-%n.log")
    os.makedirs(c.paths.evidence_root)
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
