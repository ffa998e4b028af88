"""Retention by job (issue 21): the job over its live budget loses its data first, nobody
else's; a pending job's bundle and one whose verdict is not stored yet are never removed for space."""
from __future__ import annotations

import json
import os
import time

import pytest
from click.testing import CliRunner

from slurm_attr import access, gc
from slurm_attr.pipeline import intake
from slurm_attr.cli import main
from slurm_attr.store import Store

from test_drain_fakes import hw_verdict

KiB, MiB = 1 << 10, 1 << 20
OTHERS = [str(100 + i) for i in range(14)]  # the other jobs' bundles, oldest first


@pytest.fixture
def cfg(spool_cfg):
    spool_cfg.spool.keep_days = 0
    spool_cfg.live.job_cap_bytes = MiB
    return spool_cfg


def _write(path, size, t):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(os.urandom(size))
    os.utime(path, (t, t))


def _age(root, t):
    """Every file and dir under root (and root) last written at t."""
    for d, dirs, files in os.walk(root):
        for name in files + dirs:
            os.utime(os.path.join(d, name), (t, t))
    os.utime(root, (t, t))


def _bundle(cfg, key, size, age_s, verdict=True, user="alice"):
    d = os.path.join(cfg.paths.spool, "bundles", key)
    _write(os.path.join(d, "nodes", "n1", "kernel.log"), size, 0)
    _age(d, time.time() - age_s)
    if verdict:
        job = key.split(".r")[0]
        Store(cfg.paths.database).save({"job_id": job, "slurm_job_id": job, "user": user, "uid": 1000},
                                       hw_verdict(job), bundle_path=d)
    return d


def _live(cfg, job, dumps, age_s, steps=0, summary=4 * KiB):
    """A live dir as the watchers write it: summary, finding, dump request, pre-kill dumps
    (dumps/<step>/nodes/<node>/{fr,stacks}/ and dumps/<step>/<node>.json), probe snapshots."""
    d = os.path.join(cfg.paths.spool, "live", job)
    t = time.time() - age_s
    _write(os.path.join(d, "summary", "0", "n1.json"), summary, t)
    _write(os.path.join(d, "finding.0.json"), 2 * KiB, t)
    _write(os.path.join(d, "dumpreq.0.json"), 100, t)
    if dumps:
        _write(os.path.join(d, "dumps", "0", "nodes", "n1", "fr", "rank_0"), dumps, t)
        _write(os.path.join(d, "dumps", "0", "nodes", "n1", "stacks", "rank_0.txt"), 8 * KiB, t)
        _write(os.path.join(d, "dumps", "0", "n1.json"), KiB, t)
    if steps:
        _write(os.path.join(d, "steps", "0", "nodes", "n1", "probe", "r0.probe"), steps, t)
    _age(d, t)
    return d


def _others(cfg):
    # 14 jobs' small bundles, 14 h .. 1 h old, verdicts stored; one is another user's.
    for i, key in enumerate(OTHERS):
        _bundle(cfg, key, 64 * KiB, (14 - i) * 3600, user="bob" if i == 3 else "alice")


def _tree(cfg):
    out = []
    for d, dirs, files in os.walk(cfg.paths.spool):
        out += [os.path.relpath(os.path.join(d, n), cfg.paths.spool) for n in files + dirs]
    return sorted(out)


def _left(cfg, sub="bundles"):
    return sorted(os.listdir(os.path.join(cfg.paths.spool, sub)))


def _others_bytes(cfg):
    return sum(gc.tree_bytes(os.path.join(cfg.paths.spool, "bundles", k)) for k in OTHERS)


def test_the_job_over_its_live_budget_loses_its_dumps_and_nobody_else_a_byte(cfg):
    # The red team's shape: one running job filled its live dir far past its budget; with the
    # cap scaled to the spool, retention that skips a busy dir removed all 14 other bundles.
    d = _live(cfg, "900", dumps=3 * MiB, steps=64 * KiB, age_s=5)
    _others(cfg)
    cfg.spool.max_bytes = _others_bytes(cfg) + 256 * KiB
    held = gc.tree_bytes(d)
    res = gc.collect(cfg)
    assert [r["key"] for r in res.removed] == ["live/900/dumps"]
    assert res.removed[0]["why"] == f"live data {held} bytes, over its job's budget of 1048576 bytes; the rest kept (running)"
    assert res.removed[0]["bytes"] > 3 * MiB and res.removed[0]["job"] == "900"
    assert _left(cfg) == OTHERS
    # What its job and the post-mortem still read stays; only the re-creatable bulk went.
    assert sorted(os.listdir(d)) == ["dumpreq.0.json", "finding.0.json", "steps", "summary"]
    assert res.bytes_after == gc.tree_bytes(d) + _others_bytes(cfg) <= cfg.spool.max_bytes


def test_the_larger_bulky_part_goes_first_and_the_other_only_while_still_over(cfg):
    d = _live(cfg, "900", dumps=1536 * KiB, steps=2 * MiB, age_s=5)
    res = gc.collect(cfg)
    assert [r["key"] for r in res.removed] == ["live/900/steps", "live/900/dumps"]
    assert sorted(os.listdir(d)) == ["dumpreq.0.json", "finding.0.json", "summary"]


def test_a_running_job_within_its_budget_loses_its_live_dumps_before_anyone_a_bundle(cfg):
    """Within its budget the job is not punished by the budget pass, but over max_bytes the
    live bulk (what its ranks chose to answer) goes before another job's bundle."""
    d = _live(cfg, "900", dumps=600 * KiB, steps=128 * KiB, age_s=5)
    _others(cfg)
    sizes = [gc.tree_bytes(os.path.join(cfg.paths.spool, "bundles", k)) for k in OTHERS]
    cfg.spool.max_bytes = gc.tree_bytes(d) + sum(sizes) - 3 * sizes[0] - 1
    res = gc.collect(cfg)
    assert [r["key"] for r in res.removed] == ["live/900/dumps"]  # the larger part was enough
    assert res.removed[0]["why"].endswith("live dumps (the job's own answers) before any bundle")
    assert _left(cfg) == OTHERS and sorted(os.listdir(d)) == ["dumpreq.0.json", "finding.0.json", "steps", "summary"]
    assert res.bytes_after <= cfg.spool.max_bytes


def test_near_miss_without_live_bulk_the_oldest_others_go_as_before(cfg):
    d = _live(cfg, "900", dumps=0, age_s=5)
    before = sorted(os.listdir(d))
    _others(cfg)
    sizes = [gc.tree_bytes(os.path.join(cfg.paths.spool, "bundles", k)) for k in OTHERS]
    cfg.spool.max_bytes = gc.tree_bytes(d) + sum(sizes) - 3 * sizes[0] - 1
    res = gc.collect(cfg)
    assert [r["key"] for r in res.removed] == OTHERS[:4]
    assert all(r["why"] == f"spool over {cfg.spool.max_bytes} bytes" for r in res.removed)
    assert _left(cfg) == OTHERS[4:] and sorted(os.listdir(d)) == before


def test_largest_overage_first_and_a_finished_jobs_whole_live_dir_may_go(cfg):
    _live(cfg, "901", dumps=2 * MiB, age_s=3 * 3600)        # over by ~1 MiB; ended, verdict stored
    _bundle(cfg, "901", 8 * KiB, 3 * 3600)
    _live(cfg, "902", dumps=4 * MiB, age_s=5)                # over by ~3 MiB; running
    _others(cfg)
    cfg.spool.max_bytes = 0  # the budget pass needs no spool cap: a budget is per job
    res = gc.collect(cfg)
    assert [r["key"] for r in res.removed] == ["live/902/dumps", "live/901"]
    assert "kept (running)" in res.removed[0]["why"] and "kept" not in res.removed[1]["why"]
    assert _left(cfg, "live") == ["902"] and _left(cfg) == sorted(OTHERS + ["901"])


def test_an_over_budget_pending_job_keeps_its_findings_and_its_bundle(cfg):
    d = _live(cfg, "903", dumps=2 * MiB, age_s=3 * 3600)     # ended, not busy, still pending
    _bundle(cfg, "903", 64 * KiB, 3 * 3600, verdict=False)
    intake.record(cfg, "903", {"job_id": "903"})
    _others(cfg)
    cfg.spool.max_bytes = 1  # everything else may go for space
    res = gc.collect(cfg)
    assert res.removed[0]["key"] == "live/903/dumps" and "kept (pending)" in res.removed[0]["why"]
    assert sorted(os.listdir(d)) == ["dumpreq.0.json", "finding.0.json", "summary"]
    assert "903" in _left(cfg) and res.kept_pending == ["903", "live/903"]
    assert [r["key"] for r in res.removed[1:]] == OTHERS  # the others go for space, oldest first


def test_a_pending_jobs_bundle_is_never_removed_by_age_or_size(cfg):
    cfg.spool.keep_days = 1
    cfg.spool.max_bytes = 1
    _bundle(cfg, "300", 64 * KiB, 30 * 86400, verdict=False)
    _bundle(cfg, "300.r1", 64 * KiB, 20 * 86400, verdict=False)
    _bundle(cfg, "301", 64 * KiB, 10 * 86400)
    intake.record(cfg, "300.r1", {"job_id": "300"})
    res = gc.collect(cfg)
    assert [r["key"] for r in res.removed] == ["301"]
    assert res.kept_pending == ["300", "300.r1"]  # a pending attempt keeps its job's earlier one too
    assert _left(cfg) == ["300", "300.r1"]


def test_a_bundle_without_a_stored_verdict_is_not_removed_for_space(cfg):
    _bundle(cfg, "400", 64 * KiB, 5 * 3600, verdict=False)   # oldest: its controller hook is late
    _bundle(cfg, "401", 64 * KiB, 4 * 3600)
    _bundle(cfg, "402", 64 * KiB, 3 * 3600)
    cfg.spool.max_bytes = gc.tree_bytes(os.path.join(cfg.paths.spool, "bundles", "402")) * 2
    res = gc.collect(cfg)
    assert [r["key"] for r in res.removed] == ["401"]
    assert res.kept_unverdicted == ["400"] and _left(cfg) == ["400", "402"]


def test_a_requeued_jobs_newest_attempt_without_its_verdict_keeps_the_job(cfg):
    _bundle(cfg, "410", 64 * KiB, 6 * 3600)                  # attempt 0's verdict stored
    _bundle(cfg, "410.r1", 64 * KiB, 5 * 3600, verdict=False)
    _bundle(cfg, "411", 64 * KiB, 4 * 3600)
    cfg.spool.max_bytes = 1
    res = gc.collect(cfg)
    assert [r["key"] for r in res.removed] == ["411"] and res.kept_unverdicted == ["410", "410.r1"]
    # Near miss: once attempt 1's verdict is stored the job goes like any other, all of it.
    d = os.path.join(cfg.paths.spool, "bundles", "410.r1")
    Store(cfg.paths.database).save({"job_id": "410", "slurm_job_id": "410"}, hw_verdict("410"), bundle_path=d)
    res = gc.collect(cfg)
    assert [r["key"] for r in res.removed] == ["410", "410.r1"] and _left(cfg) == []


def test_orphans_go_by_age_and_after_a_day_for_space_logged(cfg, caplog):
    _bundle(cfg, "420", 64 * KiB, 2 * 86400, verdict=False)  # no verdict for two days
    _bundle(cfg, "421", 64 * KiB, 3600)
    cfg.spool.max_bytes = 1
    res = gc.collect(cfg)
    assert [(r["key"], r["why"]) for r in res.removed] == [
        ("420", "spool over 1 bytes, no verdict stored"), ("421", "spool over 1 bytes")]
    _bundle(cfg, "422", 64 * KiB, 10 * 86400, verdict=False)
    cfg.spool.max_bytes, cfg.spool.keep_days = 0, 7
    res = gc.collect(cfg)
    assert [(r["key"], r["why"]) for r in res.removed] == [("422", "older than 7 days, no verdict stored")]
    assert "job 422 has had no verdict" in caplog.text


def test_a_jobs_live_dir_ages_and_counts_with_its_bundle(cfg):
    # Job 430's bundle is the oldest, but its live dir was written later: the job is younger
    # than 431, whose bundle and live dir go together.
    _bundle(cfg, "430", 64 * KiB, 10 * 3600)
    _live(cfg, "430", dumps=0, age_s=2 * 3600)
    _bundle(cfg, "431", 64 * KiB, 8 * 3600)
    _live(cfg, "431", dumps=0, age_s=7 * 3600)  # no live bulk: the live-bulk pass has nothing to take
    _bundle(cfg, "432", 64 * KiB, 3600)
    cfg.spool.max_bytes = gc.collect(cfg, dry_run=True).bytes_before - 10 * KiB
    res = gc.collect(cfg)
    assert [r["key"] for r in res.removed] == ["431", "live/431"]
    assert _left(cfg) == ["430", "432"] and _left(cfg, "live") == ["430"]


def test_dry_run_removes_nothing_and_plans_the_same(cfg):
    _live(cfg, "900", dumps=3 * MiB, steps=512 * KiB, age_s=5)
    _live(cfg, "901", dumps=2 * MiB, age_s=1800)
    _bundle(cfg, "901", 8 * KiB, 1800)
    _bundle(cfg, "440", 64 * KiB, 5.5 * 3600, verdict=False)
    _others(cfg)
    cfg.spool.max_bytes = _others_bytes(cfg) // 4
    before = _tree(cfg)
    dry = gc.collect(cfg, dry_run=True)
    assert _tree(cfg) == before
    real = gc.collect(cfg)
    assert dry.removed == real.removed and dry.bytes_after == real.bytes_after
    assert dry.kept_unverdicted == real.kept_unverdicted == ["440"]  # the spool fits before 900, which runs
    keys = [r["key"] for r in real.removed]
    assert keys[:2] == ["live/900/dumps", "live/901"]  # budgets first: 900's snapshots fit in it
    assert keys[2] == "live/900/steps"  # then live bulk, the job's own answers, before any bundle
    rest = keys[3:]  # then the oldest, never 440 (unverdicted and recent), until the spool fits
    assert rest and rest == (OTHERS + ["901"])[:len(rest)] and real.bytes_after <= cfg.spool.max_bytes
    assert _tree(cfg) != before and "440" in _left(cfg)


def test_gc_command_says_why_each_went(tmp_path, monkeypatch, cfg):
    path = tmp_path / "c.toml"
    path.write_text(f'[paths]\ndatabase = "{cfg.paths.database}"\nspool = "{cfg.paths.spool}"\n'
                    f'[intake]\nqueue_dir = "{cfg.intake.queue_dir}"\n'
                    f'[spool]\nkeep_days = 0\nmax_bytes = {64 * KiB}\n[live]\njob_cap_bytes = {MiB}\n')
    monkeypatch.setattr(access, "caller", lambda: (0, "root"))
    _live(cfg, "900", dumps=3 * MiB, age_s=5)
    _bundle(cfg, "450", 64 * KiB, 3600, verdict=False)

    def run(*args):
        return CliRunner().invoke(main, ["--config", str(path), *args], catch_exceptions=False)

    out = run("gc", "--dry-run")
    assert out.exit_code == 0, out.output
    line = out.stdout.splitlines()[0]
    assert line.startswith("would remove live/900/dumps (") and "over its job's budget of 1048576 bytes" in line
    assert "kept 450: no verdict stored for its job yet" in out.stderr
    assert os.path.isdir(os.path.join(cfg.paths.spool, "live", "900", "dumps"))
    doc = json.loads(run("gc", "--json").stdout)
    assert [r["key"] for r in doc["removed"]] == ["live/900/dumps"] and doc["kept_unverdicted"] == ["450", "live/900"]
    assert not os.path.exists(os.path.join(cfg.paths.spool, "live", "900", "dumps"))


def test_store_tells_which_attempts_have_verdicts_in_one_query(tmp_path):
    store = Store(str(tmp_path / "s.db"))
    # An array task: stored as 465_6, keyed on the spool by its own raw id 470.
    store.save({"job_id": "465_6", "slurm_job_id": "470"}, hw_verdict("465_6"), bundle_path="/sp/bundles/470.r2")
    store.save({"job_id": "480", "slurm_job_id": "480"}, hw_verdict("480"), bundle_path="/sp/bundles/480")
    store.save({"job_id": "481", "slurm_job_id": "481"}, hw_verdict("481"))  # analysed without a bundle
    assert store.verdict_attempts(["470", "480", "481", "482", "465"]) == {"470": 2, "480": 0, "481": 0}
    assert store.verdict_attempts([]) == {}
