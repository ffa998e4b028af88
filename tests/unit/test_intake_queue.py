"""The durable intake's pending files: atomic, counted, backed off, given up, described."""
from __future__ import annotations

import json
import os
import threading

import pytest

from slurm_attr.pipeline import intake
from slurm_attr.config import Config


@pytest.fixture
def cfg(tmp_path):
    c = Config()
    c.intake.queue_dir = str(tmp_path / "q")
    c.intake.max_attempts = 3
    c.intake.backoff_max_s = 40.0
    return c


def test_record_is_one_small_root_only_file_and_keeps_since(cfg, tmp_path):
    doc = intake.record(cfg, "1234", {"job_id": "1234", "state": "COMPLETED"})
    path = tmp_path / "q" / "1234.json"
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    assert json.loads(path.read_text())["job"]["state"] == "COMPLETED"
    again = intake.record(cfg, "1234", {"job_id": "1234", "state": "FAILED"})
    assert again["since"] == doc["since"] and intake.load(cfg, "1234")["job"]["state"] == "FAILED"
    # No temporary file is left beside it.
    assert sorted(os.listdir(tmp_path / "q")) == ["1234.json"]


def test_failed_counts_backs_off_and_gives_up(cfg):
    intake.record(cfg, "7", {"job_id": "7"})
    d1 = intake.failed(cfg, "7", "OperationalError: database is locked")
    d2 = intake.failed(cfg, "7", "OperationalError: database is locked")
    assert (d1["attempts"], d2["attempts"]) == (1, 2)
    assert d2["next_try"] - d2["last_try"] == pytest.approx(10.0)  # 5, 10, 20, ... capped
    assert intake.due(cfg, now=d2["last_try"] + 1) == []
    assert [d["key"] for d in intake.due(cfg, now=d2["last_try"] + 11)] == ["7"]
    assert intake.failed(cfg, "7", "still locked") is None  # third of max_attempts=3: given up
    assert intake.load(cfg, "7") is None


def test_backoff_is_capped():
    assert [intake.backoff(n, 40.0) for n in (1, 2, 3, 4, 9)] == [5.0, 10.0, 20.0, 40.0, 40.0]


def test_keys_are_validated_and_hostile_names_ignored(cfg, tmp_path):
    with pytest.raises(ValueError):
        intake.record(cfg, "../etc/passwd", {})
    intake.record(cfg, "55_3.r2", {"job_id": "55_3"})
    (tmp_path / "q" / "evil;rm.json").write_text("{}")
    (tmp_path / "q" / "99.json").write_text("not json")
    assert [d["key"] for d in intake.entries(cfg)] == ["55_3.r2"]
    assert intake.for_job(cfg, "55_3")["key"] == "55_3.r2"
    assert intake.for_job(cfg, "55") is None


def test_symlinked_entry_is_not_followed(cfg, tmp_path):
    (tmp_path / "q").mkdir()
    secret = tmp_path / "secret.json"
    secret.write_text(json.dumps({"job": {"job_id": "1"}, "since": 1}))
    os.symlink(secret, tmp_path / "q" / "1.json")
    assert intake.load(cfg, "1") is None


def test_claim_is_exclusive_per_key(cfg):
    seen = []
    with intake.claim(cfg, "5") as first:
        def other():
            with intake.claim(cfg, "5") as got:
                seen.append(got)
            with intake.claim(cfg, "6") as got6:
                seen.append(got6)
        t = threading.Thread(target=other)
        t.start()
        t.join()
        assert first
    assert seen == [False, True]


def test_describe_says_since_and_last_error(cfg):
    intake.record(cfg, "8", {"job_id": "8"})
    intake.failed(cfg, "8", "database is locked")
    text = intake.describe(intake.load(cfg, "8"))
    assert text.startswith("pending since ") and "1 attempt," in text and text.endswith("last error: database is locked")
    intake.record(cfg, "9", {"job_id": "9"})
    assert intake.describe(intake.load(cfg, "9")).endswith("last error: -")


def test_a_new_job_is_its_own_analysers_before_a_sweep_takes_it(cfg):
    """The hook's analyser of job 8 runs it at once (process); a sweep after another job's
    analysis (due) leaves it until that analyser had its node wait and time limit."""
    doc = intake.record(cfg, "8", {"job_id": "8", "nodes": ["n1", "n2"]})
    assert intake.due(cfg, now=doc["since"] + 1) == []
    later = doc["since"] + cfg.analysis.node_wait_s + cfg.analysis.timeout_s + 1
    assert [d["key"] for d in intake.due(cfg, now=later)] == ["8"]
    # near miss: recorded again (the hook ran twice), the entry keeps its own schedule
    again = intake.record(cfg, "8", {"job_id": "8"})
    assert again["next_try"] == doc["next_try"] and again["since"] == doc["since"]
