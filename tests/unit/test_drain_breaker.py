"""The circuit breaker: a cap per sliding window, a share of a partition, alert-only until reset."""
from __future__ import annotations

import threading
import time

import pytest

from slurm_attr import breaker, drain
from slurm_attr.breaker import Breaker, partition_allowance
from slurm_attr.store import Store

from test_drain_fakes import FakeSlurm, drain_cfg, hw_verdict


def _run(cfg, store, slurm, jobs_nodes):
    out = []
    for job, node in jobs_nodes:
        acts = drain.apply_policy(cfg, hw_verdict(job, node), {"slurm_job_id": job}, slurm=slurm, store=store)
        store.record_actions(job, acts, path="central")
        out += acts
    return out


def test_cap_two_five_hardware_verdicts_two_drains_three_blocked():
    store = Store(memory=True)
    slurm = FakeSlurm({f"n{i}": ["gpu"] for i in range(1, 9)})
    acts = _run(drain_cfg(max_drains=2, window_s=3600), store, slurm,
                [(str(100 + i), f"n{i}") for i in range(1, 6)])
    assert [a.applied for a in acts] == [True, True, False, False, False]
    assert [a.blocked_by for a in acts[2:]] == ["circuit breaker"] * 3
    assert slurm.drained() == ["n1", "n2"]
    # All five decisions are stored, and the breaker says why it tripped.
    rows = store.actions()
    assert len(rows) == 5 and sum(r["applied"] for r in rows) == 2
    st = store.breaker()
    assert st["tripped"] and "2 automatic drains" in st["why"] and "max 2" in st["why"]


def test_tripped_breaker_stays_tripped_after_the_window_until_reset():
    store = Store(memory=True)
    slurm = FakeSlurm({f"n{i}": ["gpu"] for i in range(1, 9)})
    cfg = drain_cfg(max_drains=1, window_s=1)
    _run(cfg, store, slurm, [("1", "n1"), ("2", "n2")])
    assert store.breaker()["tripped"]
    time.sleep(1.1)  # the window has slid past the first drain: still alert-only
    assert _run(cfg, store, slurm, [("3", "n3")])[0].blocked_by == "circuit breaker"
    store.reset_breaker("alice", "checked")
    assert _run(cfg, store, slurm, [("4", "n4")])[0].applied
    assert slurm.drained() == ["n1", "n4"]


def test_reset_starts_the_window_afresh():
    store = Store(memory=True)
    slurm = FakeSlurm({f"n{i}": ["gpu"] for i in range(1, 9)})
    cfg = drain_cfg(max_drains=2, window_s=3600)
    _run(cfg, store, slurm, [("1", "n1"), ("2", "n2"), ("3", "n3")])
    assert store.breaker()["tripped"]
    store.reset_breaker("root", "real faults")
    acts = _run(cfg, store, slurm, [("4", "n4"), ("5", "n5"), ("6", "n6")])
    assert [a.applied for a in acts] == [True, True, False]


def test_max_drains_zero_is_alert_only():
    store = Store(memory=True)
    slurm = FakeSlurm()
    acts = _run(drain_cfg(max_drains=0), store, slurm, [("1", "n1")])
    assert acts[0].blocked_by == "circuit breaker" and slurm.drained() == []


@pytest.mark.parametrize("total,pct,allowed", [(4, 10, 1), (4, 0, 1), (4, 50, 2), (40, 10, 4), (39, 10, 3),
                                               (10, 100, 10), (0, 10, 1)])
def test_partition_allowance_floor_of_one(total, pct, allowed):
    assert partition_allowance(total, pct) == allowed


def test_partition_share_four_nodes_ten_percent_allows_one():
    store = Store(memory=True)
    slurm = FakeSlurm()  # n1..n4 in partition debug
    cfg = drain_cfg(max_drains=10, max_partition_percent=10.0)
    acts = _run(cfg, store, slurm, [("1", "n1"), ("2", "n2")])
    assert [(a.applied, a.blocked_by) for a in acts] == [(True, None), (False, "circuit breaker")]
    assert "partition debug" in store.breaker()["why"]


def test_partition_share_counts_current_sattr_drains_not_admin_drains():
    store = Store(memory=True)
    slurm = FakeSlurm({f"n{i}": ["gpu"] for i in range(1, 5)})
    slurm.admin_drain("n4", "maintenance")  # not ours: does not use our share
    slurm.set_state("n3", "IDLE+DRAIN", "SATTR: gpu_hardware xid79 job 1")  # ours, from earlier
    cfg = drain_cfg(max_drains=10, max_partition_percent=50.0)  # 2 of 4
    acts = _run(cfg, store, slurm, [("7", "n1"), ("8", "n2")])
    assert [(a.applied, a.blocked_by) for a in acts] == [(True, None), (False, "circuit breaker")]


def test_partition_share_is_per_partition():
    store = Store(memory=True)
    slurm = FakeSlurm({"a1": ["a"], "a2": ["a"], "b1": ["b"], "b2": ["b"]})
    cfg = drain_cfg(max_drains=10, max_partition_percent=10.0)
    acts = _run(cfg, store, slurm, [("1", "a1"), ("2", "b1")])
    assert all(a.applied for a in acts)


def test_undrained_node_frees_its_partition_slot():
    store = Store(memory=True)
    slurm = FakeSlurm()
    cfg = drain_cfg(max_drains=10, max_partition_percent=10.0)
    assert _run(cfg, store, slurm, [("1", "n1")])[0].applied
    drain.undrain(slurm, store, ["n1"], "fixed", "root", settle_s=0)
    # At once: a settled drain counts through Slurm's state only.
    assert _run(cfg, store, slurm, [("2", "n2")])[0].applied


def test_unsettled_claim_of_another_process_counts_until_it_is_stale():
    store = Store(memory=True)
    slurm = FakeSlurm()
    cfg = drain_cfg(max_drains=10, max_partition_percent=10.0)
    with store.transaction():
        store.ledger_claim("n1", "1", "drain", "fast", ["debug"], "SATTR: x job 1")  # scontrol not run yet
    assert _run(cfg, store, slurm, [("2", "n2")])[0].blocked_by == "circuit breaker"
    store.reset_breaker("root")
    store.db.execute("update drain_ledger set at = at - ?", [breaker.INFLIGHT_S + 1])
    store.db.conn.commit()
    assert _run(cfg, store, slurm, [("3", "n3")])[0].applied


def test_concurrent_analysers_cannot_both_take_the_last_slot(tmp_path):
    db = str(tmp_path / "sattr.db")
    Store(db)  # create and migrate once
    slurm = FakeSlurm({f"n{i}": ["gpu"] for i in range(1, 9)})
    lock = threading.Lock()
    cfg = drain_cfg(max_drains=1)
    results = []
    barrier = threading.Barrier(6)

    def worker(i: int) -> None:
        store = Store(db)  # one connection per analyser, as separate processes have
        barrier.wait()
        acts = drain.apply_policy(cfg, hw_verdict(str(i), f"n{i}"), {}, slurm=slurm, store=store)
        with lock:
            results.extend(acts)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(1, 7)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(a.applied for a in results) == 1
    assert len(slurm.drained()) == 1


def test_status_reports_window_and_partitions():
    store = Store(memory=True)
    slurm = FakeSlurm()
    cfg = drain_cfg(max_drains=3, max_partition_percent=50.0)
    _run(cfg, store, slurm, [("1", "n1")])
    st = Breaker(store, cfg.drain).status(slurm)
    assert st["tripped"] is False and st["drains_in_window"] == 1 and st["max_drains"] == 3
    assert st["partitions"] == [{"partition": "debug", "total": 4, "drained_by_us": ["n1"], "allowed": 2}]


def test_breaker_state_persists_in_the_database(tmp_path):
    db = str(tmp_path / "sattr.db")
    slurm = FakeSlurm({f"n{i}": ["gpu"] for i in range(1, 9)})
    cfg = drain_cfg(max_drains=1)
    _run(cfg, Store(db), slurm, [("1", "n1"), ("2", "n2")])
    # A new process (another analyser, a node epilog) sees the tripped state.
    assert Store(db).breaker()["tripped"]
    assert _run(cfg, Store(db), slurm, [("3", "n3")])[0].blocked_by == "circuit breaker"
