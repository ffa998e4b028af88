"""The verdict store's retention ([store] keep_days, `sattr prune`): old jobs go with every row
that is theirs; recent ones, each node's newest drain record and the breaker stay."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from slurm_attr import store as store_mod, storeretention
from slurm_attr.cli import main
from slurm_attr.config import from_dict
from slurm_attr.errors import ConfigError
from slurm_attr.model import Action, Coverage, Evidence, Symptom, Verdict
from slurm_attr.store import Store

DAY = 86400.0
NOW = 1_900_000_000.0


def _save(st: Store, monkeypatch, job: str, days_ago: float) -> None:
    monkeypatch.setattr(store_mod, "_now", lambda: NOW - days_ago * DAY)
    sym = Symptom(id="gpu.xid_79", cause="gpu_hardware", trusted=True, node="n1", gpu="0000:3b:00",
                  evidence=[Evidence("kernel", "nodes/n1/kernel.log", 3, "NVRM: Xid (PCI:0000:3b:00): 79")])
    st.save({"job_id": job, "user": "alice", "partition": "gpu", "nodes": ["n1"], "state": "FAILED", "gpus": 8,
             "elapsed_s": 3600.0}, Verdict(job_id=job, cause="gpu_hardware", culprit_nodes=["n1"], symptoms=[sym],
                                           coverage=[Coverage("kernel", "n1", "ok", "journalctl -k")]))
    st.record_actions(job, [Action(kind="drain", node="n1", reason=f"SATTR: job {job}", applied=True)], "")
    st.queue_comment(job, job, "Comment", f"gpu_hardware {job}")


def _count(st: Store, table: str, job: str) -> int:
    return st.db.execute(f"select count(*) from [{table}] where job_id = ?", [job]).fetchone()[0]


@pytest.fixture
def st(tmp_path, monkeypatch) -> Store:
    s = Store(str(tmp_path / "sattr.db"))
    _save(s, monkeypatch, "old", 500)
    _save(s, monkeypatch, "recent", 10)
    _save(s, monkeypatch, "edge", 399)  # inside 400 days: stays
    return s


def test_prune_removes_an_old_jobs_every_row_and_keeps_recent_ones(st):
    res = storeretention.prune(st, 400, now=NOW)
    assert res.jobs == 1
    for table in ("jobs", "verdicts", "symptoms", "evidence", "coverage", "actions", "comments", "fleet"):
        assert _count(st, table, "old") == 0, table
        assert _count(st, table, "recent") >= 1 and _count(st, table, "edge") >= 1, table
    assert res.rows["verdicts"] == 1 and res.rows["evidence"] == 1


def test_a_dry_run_counts_and_removes_nothing(st):
    res = storeretention.prune(st, 400, now=NOW, dry_run=True)
    assert res.jobs == 1 and _count(st, "verdicts", "old") == 1


def test_keep_days_zero_keeps_everything_and_under_31_is_refused(st):
    assert storeretention.prune(st, 0, now=NOW).jobs == 0 and _count(st, "verdicts", "old") == 1
    with pytest.raises(ValueError):
        storeretention.prune(st, 30, now=NOW)
    with pytest.raises(ConfigError):
        from_dict({"store": {"keep_days": 7}})
    assert from_dict({"store": {"keep_days": 31}}).store.keep_days == 31.0


def test_each_nodes_newest_drain_record_stays_however_old(st):
    st.ledger_record("n1", "a", "drain", "", "SATTR: a", at=NOW - 600 * DAY)
    st.ledger_record("n1", "b", "drain", "", "SATTR: b", at=NOW - 500 * DAY)
    st.ledger_record("n2", "c", "drain", "", "SATTR: c", at=NOW - 450 * DAY)
    res = storeretention.prune(st, 400, now=NOW)
    left = st.db.execute("select node, job_id from drain_ledger order by node").fetchall()
    assert left == [("n1", "b"), ("n2", "c")] and res.rows["drain_ledger"] == 1


def test_the_daily_turn_prunes_once(tmp_path, monkeypatch, st):
    cfg = from_dict({"paths": {"database": st.db.conn.execute("pragma database_list").fetchone()[2]},
                     "intake": {"queue_dir": str(tmp_path / "queue")}, "store": {"keep_days": 400}})
    first = storeretention.maybe_prune(cfg, now=NOW)
    assert first is not None and first.jobs == 1
    assert storeretention.maybe_prune(cfg, now=NOW + 3600) is None  # the same day: not again


def test_sattr_prune_json(tmp_path, st, monkeypatch):
    conf = tmp_path / "sattr.toml"
    db = st.db.conn.execute("pragma database_list").fetchone()[2]
    conf.write_text(f'[paths]\ndatabase = "{db}"\n[store]\nkeep_days = 400\n')
    monkeypatch.setattr(storeretention.time, "time", lambda: NOW)
    out = CliRunner().invoke(main, ["--config", str(conf), "prune", "--dry-run", "--json"])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.output)
    assert doc["jobs"] == 1 and doc["dry_run"] is True
    bad = CliRunner().invoke(main, ["--config", str(conf), "prune", "--days", "7"])
    assert bad.exit_code != 0 and "at least 31" in bad.output
