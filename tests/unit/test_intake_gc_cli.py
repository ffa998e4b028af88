"""Spool retention (never a pending job's bundle) and the intake's commands: list --pending, retry, gc, show."""
from __future__ import annotations

import json
import os
import time

import pytest
from click.testing import CliRunner

from slurm_attr import access, gc
from slurm_attr.pipeline import attempt, intake
from slurm_attr.cli import main
from slurm_attr.store import Store

from test_drain_fakes import hw_verdict

MiB = 1 << 20


@pytest.fixture
def cfg(spool_cfg):
    return spool_cfg


def _bundle(cfg, key, size, age_days):
    d = os.path.join(cfg.paths.spool, "bundles", key)
    os.makedirs(os.path.join(d, "nodes", "n1"), exist_ok=True)
    with open(os.path.join(d, "nodes", "n1", "kernel.log"), "wb") as f:
        f.write(os.urandom(size))
    t = time.time() - age_days * 86400
    os.utime(d, (t, t))
    return d


def test_keep_days_prunes_old_bundles_but_never_a_pending_one(cfg):
    cfg.spool.keep_days = 7
    cfg.spool.max_bytes = 0
    _bundle(cfg, "1", 1000, 30)
    _bundle(cfg, "2", 1000, 20)
    _bundle(cfg, "3", 1000, 1)
    intake.record(cfg, "2", {"job_id": "2"})
    res = gc.collect(cfg)
    assert [r["key"] for r in res.removed] == ["1"] and res.kept_pending == ["2"]
    assert sorted(os.listdir(os.path.join(cfg.paths.spool, "bundles"))) == ["2", "3"]


def test_max_bytes_prunes_oldest_first_down_to_the_cap(cfg):
    cfg.spool.keep_days = 0
    cfg.spool.max_bytes = int(2.5 * MiB)
    for i, age in enumerate((5, 4, 3, 2)):
        _bundle(cfg, str(10 + i), MiB, age)
    res = gc.collect(cfg, dry_run=True)
    assert [r["key"] for r in res.removed] == ["10", "11"]
    assert len(os.listdir(os.path.join(cfg.paths.spool, "bundles"))) == 4  # dry run: nothing removed
    res = gc.collect(cfg)
    assert res.bytes_after <= cfg.spool.max_bytes < res.bytes_before
    assert sorted(os.listdir(os.path.join(cfg.paths.spool, "bundles"))) == ["12", "13"]


def test_sizes_count_allocated_blocks_not_apparent_size(cfg):
    d = _bundle(cfg, "5", 10, 0)
    with open(os.path.join(d, "sparse"), "wb") as f:
        f.truncate(1 << 30)
    assert gc.tree_bytes(d) < MiB


def test_maybe_collect_runs_at_most_every_few_minutes(cfg):
    cfg.spool.keep_days = 1
    _bundle(cfg, "1", 10, 3)
    assert gc.maybe_collect(cfg) is not None
    _bundle(cfg, "2", 10, 3)
    assert gc.maybe_collect(cfg) is None  # too soon
    assert os.path.isdir(os.path.join(cfg.paths.spool, "bundles", "2"))
    assert gc.maybe_collect(cfg, now=time.time() + gc.AUTO_EVERY_S + 1) is not None
    assert not os.path.isdir(os.path.join(cfg.paths.spool, "bundles", "2"))


@pytest.fixture
def cli(tmp_path, monkeypatch, cfg):
    path = tmp_path / "c.toml"
    path.write_text(f'[paths]\ndatabase = "{cfg.paths.database}"\nspool = "{cfg.paths.spool}"\n'
                    f'[intake]\nqueue_dir = "{cfg.intake.queue_dir}"\n')
    monkeypatch.setattr(access, "caller", lambda: (0, "root"))

    def run(*args):
        return CliRunner().invoke(main, ["--config", str(path), *args], catch_exceptions=False)

    return run


def test_list_pending_and_show_say_since_and_last_error(cli, cfg):
    intake.record(cfg, "77", {"job_id": "77"})
    intake.failed(cfg, "77", "OperationalError: database is locked")
    out = cli("list", "--pending")
    assert out.exit_code == 0 and "77" in out.output and "database is locked" in out.output
    rows = json.loads(cli("list", "--pending", "--json").output)
    assert rows[0]["job_id"] == "77" and rows[0]["attempts"] == 1
    Store(cfg.paths.database)
    shown = cli("77")
    assert shown.exit_code == 0
    assert shown.output.startswith("job 77: pending since ") and "last error: OperationalError: database is locked" in shown.output
    # Near miss: a job neither stored nor pending is still "not found".
    assert cli("78").exit_code == 4


def test_show_of_a_partial_verdict_says_it_is_still_pending(cli, cfg):
    store = Store(cfg.paths.database)
    store.save({"job_id": "79", "user": "root", "uid": 0, "nodes": ["n2"]}, hw_verdict("79", "n2"))
    intake.record(cfg, "79", {"job_id": "79"})
    intake.failed(cfg, "79", "analysis timed out after 120s", partial=True)
    out = cli("79")
    assert out.exit_code == 0 and "n2" in out.output
    assert "pending since" in out.output and "timed out" in out.output


def test_retry_command_attempts_due_jobs(cli, cfg, monkeypatch):
    long_ago = time.time() - 3600
    with monkeypatch.context() as m:  # recorded long ago: its own analyser had its time
        m.setattr(intake.time, "time", lambda: long_ago)
        intake.record(cfg, "80", {"job_id": "80"})
    intake.record(cfg, "81", {"job_id": "81"})  # near miss: just ended, its own analyser's
    calls = []
    monkeypatch.setattr(attempt, "process", lambda c, key, **k: calls.append(key) or "stored")
    monkeypatch.setattr("slurm_attr.pipeline.reconcile.reconcile_all", lambda store, slurm: 0)
    out = cli("retry", "--json")
    assert out.exit_code == 0, out.output
    assert json.loads(out.output)["attempted"] == {"80": "stored"} and calls == ["80"]


def test_gc_command_dry_run(cli, cfg):
    cfg.spool.keep_days = 14
    _bundle(cfg, "1", 10, 30)
    out = cli("gc", "--dry-run")
    assert out.exit_code == 0 and "would remove 1" in out.output
    assert os.path.isdir(os.path.join(cfg.paths.spool, "bundles", "1"))


def _live(cfg, job, size, age_s):
    d = os.path.join(cfg.paths.spool, "live", job)
    os.makedirs(os.path.join(d, "summary", "0"), exist_ok=True)
    f = os.path.join(d, "summary", "0", "n1.json")
    with open(f, "wb") as fh:
        fh.write(os.urandom(size))
    t = time.time() - age_s
    for p in (f, os.path.join(d, "summary", "0"), os.path.join(d, "summary"), d):
        os.utime(p, (t, t))
    return d


def test_live_dirs_age_and_count_like_bundles_but_a_busy_one_stays(cfg):
    cfg.spool.keep_days = 7
    cfg.spool.max_bytes = 0
    _live(cfg, "41", 1000, 30 * 86400)   # old: goes
    _live(cfg, "42", 1000, 30 * 86400)   # old but pending: stays
    _live(cfg, "43", 1000, 60)           # written a minute ago: its job may run
    intake.record(cfg, "42", {"job_id": "42"})
    res = gc.collect(cfg)
    assert [r["key"] for r in res.removed] == ["live/41"]
    assert res.kept_pending == ["live/42"]
    assert sorted(os.listdir(os.path.join(cfg.paths.spool, "live"))) == ["42", "43"]


def test_max_bytes_counts_live_dirs_and_spares_a_running_jobs(cfg):
    cfg.spool.keep_days = 0
    cfg.spool.max_bytes = int(1.5 * MiB)
    _bundle(cfg, "50", MiB, 2)
    _live(cfg, "51", MiB, 3 * 86400)
    _live(cfg, "52", MiB, 5)  # near miss: over the cap, but busy
    res = gc.collect(cfg)
    assert [r["key"] for r in res.removed] == ["live/51", "50"]
    assert os.listdir(os.path.join(cfg.paths.spool, "live")) == ["52"]
