"""The real-format log fixtures with their expected findings marked inside (tests/fixtures/logs)."""
from __future__ import annotations

from pathlib import Path

import pytest

from slurm_attr.rules import load_catalog
from slurm_attr.rules.selftest import fixture_files, run_fixture

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "logs"
FILES = fixture_files([str(FIXTURES)])


def test_rules_fixtures_exist_for_kernel_and_job_output():
    names = {Path(f).parent.name for f in FILES}
    assert {"kernel", "stdout", "nccl"} <= names
    assert len(FILES) >= 10


@pytest.mark.parametrize("path", FILES, ids=[Path(f).name for f in FILES])
def test_rules_fixture(path):
    results = run_fixture(load_catalog(), path)
    assert results, "a fixture without markers tests nothing"
    failed = [f"{r.name}: {r.detail}" for r in results if not r.ok]
    assert failed == []


def test_rules_fixture_markers_detect_a_wrong_expectation(tmp_path):
    f = tmp_path / "wrong.log"
    f.write_text("#@ source: kernel\nNVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.\n#@ expect gpu.xid_48\n")
    [r] = run_fixture(load_catalog(), str(f))
    assert not r.ok and "gpu.xid_79" in r.detail


def test_rules_fixture_strict_mode_reports_unexpected_symptoms(tmp_path):
    f = tmp_path / "strict.log"
    f.write_text("#@ source: kernel\n#@ strict\nnfs: server a not responding, still trying\n#@ expect-none\n")
    results = run_fixture(load_catalog(), str(f))
    assert [r.ok for r in results] == [False, False]
