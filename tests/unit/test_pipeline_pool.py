"""The worker pool (issue 23): one sacct per batch, jobs accounting has not settled wait (others
go first), jobs whose node parts are missing wait up to node_wait_s, the slot is given back."""
import os
import time

import pytest

from slurm_attr.pipeline import attempt, batch, intake
from slurm_attr.config import load
from slurm_attr.errors import SlurmUnavailable
from slurm_attr.pipeline import pool
from slurm_attr.slurm.batched import Batched


class Acct:
    """A backend whose accounting rows are given per job; counts its calls."""

    def __init__(self, rows, down=False):
        self.rows, self.down, self.calls = rows, down, []

    def sacct_jobs(self, ids):
        self.calls.append(("sacct_jobs", tuple(ids)))
        if self.down:
            raise SlurmUnavailable("slurmdbd down")
        return {i: self.rows[i] for i in ids if i in self.rows}

    def sacct_job(self, job_id):
        self.calls.append(("sacct_job", job_id))
        return self.rows.get(job_id)

    def nodes(self):
        self.calls.append(("nodes",))
        return [{"NodeName": "n1", "State": "IDLE"}]


@pytest.fixture
def cfg(tmp_path):
    c = load(None)
    c.intake.queue_dir = str(tmp_path / "q")
    c.paths.spool = str(tmp_path / "spool")
    c.analysis.node_wait_s = 30.0
    c.comment.enabled = False
    c.analysis.yield_pressure = 0  # the machine's own load must not pace these tests
    return c


def _pending(cfg, job_id, nodes=(), since=None, parts=()):
    intake.record(cfg, job_id, {"job_id": job_id, "slurm_job_id": job_id, "nodes": list(nodes)})
    if since is not None:
        doc = intake.load(cfg, job_id)
        doc["since"] = since
        intake._atomic_write(intake._path(cfg, job_id), doc)
    for n in parts:
        d = os.path.join(cfg.paths.spool, "bundles", job_id, "nodes", n)
        os.makedirs(d, exist_ok=True)
        open(os.path.join(d, "collect.json"), "w").close()


def test_one_batch_one_sacct_and_the_unsettled_job_waits_its_turn(cfg, monkeypatch):
    final = {"State": "FAILED", "ExitCode": "1:0"}
    backend = Acct({"11": final, "12": final})
    now = time.time()
    _pending(cfg, "13", since=now - 0.02)  # oldest, but accounting has no final row yet: after the others
    _pending(cfg, "11", since=now - 0.01)
    _pending(cfg, "12", since=now)
    order = []

    def process(cfg_, key, slurm=None, **kw):
        order.append(key)
        assert kw["pending_only"] and not kw["sweep_comments"]
        slurm.sacct_job(key)
        if key == "13":
            backend.rows["13"] = final
        intake.done(cfg_, key)
        return "stored"
    monkeypatch.setattr(attempt, "process", process)
    monkeypatch.setattr(batch, "SETTLE_S", 0.3)
    monkeypatch.setattr(pool, "POLL_S", 0.05)
    fd = pool._take_slot(cfg)
    counts = pool.work(cfg, fd, slurm=backend, open_store=lambda c: None)
    assert order == ["11", "12", "13"] and counts["stored"] == 3
    assert backend.calls[0] == ("sacct_jobs", ("13", "11", "12"))
    # 11 and 12 came from the batch's rows; 13 was asked on its own only after its settle time.
    assert ("sacct_job", "11") not in backend.calls and ("sacct_job", "12") not in backend.calls
    assert intake.entries(cfg) == []
    assert pool._take_slot(cfg) is not None  # the slot went back


def test_a_job_waits_for_its_node_parts_but_not_past_node_wait(cfg, monkeypatch):
    now = time.time()
    _pending(cfg, "21", nodes=["n1", "n2"], since=now, parts=["n1"])        # n2 not in yet
    _pending(cfg, "22", nodes=["n1", "n2"], since=now - 60, parts=["n1"])   # waited long enough
    _pending(cfg, "23", nodes=["n1"], since=now, parts=["n1"])              # complete
    assert pool._ready(cfg, intake.load(cfg, "21") | {"key": "21"}, now) is None
    assert pool._ready(cfg, intake.load(cfg, "22") | {"key": "22"}, now) is True
    assert pool._ready(cfg, intake.load(cfg, "23") | {"key": "23"}, now) is True
    _pending(cfg, "24", nodes=["n1"], since=now)                            # no bundle dir yet
    assert pool._ready(cfg, intake.load(cfg, "24") | {"key": "24"}, now) is None
    assert pool._ready(cfg, intake.load(cfg, "24") | {"key": "24"}, now + 31) is True
    failed = intake.failed(cfg, "23", "database is locked")  # a short backoff: this worker waits it out
    assert pool._ready(cfg, failed | {"key": "23"}, now) is None
    # near miss: a long backoff is not this run's (`sattr retry` and later hooks take it)
    assert pool._ready(cfg, failed | {"key": "23", "next_try": now + pool.BACKOFF_WAIT_S + 5}, now) is False


def test_a_job_the_worker_cannot_process_is_backed_off_not_spun_on(cfg, monkeypatch):
    monkeypatch.setattr(pool, "BACKOFF_WAIT_S", 0.0)  # every backoff is a long one here
    _pending(cfg, "41", since=time.time() - 60)
    calls = []

    def boom(cfg_, key, **kw):
        calls.append(key)
        raise RuntimeError("bug")
    monkeypatch.setattr(attempt, "process", boom)
    counts = pool.work(cfg, pool._take_slot(cfg), slurm=Acct({"41": {"State": "FAILED"}}), open_store=lambda c: None)
    assert calls == ["41"] and counts["error"] == 1
    assert intake.load(cfg, "41")["attempts"] == 1


def test_accounting_down_is_asked_once_per_batch(cfg):
    backend = Acct({}, down=True)
    b = Batched(backend)
    b.prefetch(["1", "2"])
    assert b.settled("1")  # waiting would not help
    with pytest.raises(SlurmUnavailable):
        b.sacct_job("1")
    assert backend.calls == [("sacct_jobs", ("1", "2"))]
    b.node_record("n1"), b.node_record("n2")
    assert backend.calls.count(("nodes",)) == 1


def test_a_job_another_worker_stored_is_not_analysed_again(cfg, monkeypatch):
    calls = []
    monkeypatch.setattr("slurm_attr.pipeline.finish.finish_job", lambda *a, **k: calls.append(a))
    assert attempt.process(cfg, "31", slurm=object(), pending_only=True) == "gone"
    assert calls == []


def test_a_batchs_comments_are_written_together_every_n_verdicts(cfg, monkeypatch):
    """Each stored verdict only queues its comment; the worker writes them in groups of
    COMMENT_FLUSH_N (and the rest at the batch's end), never one Slurm write per job."""
    from slurm_attr.store import Store

    cfg.comment.enabled = True
    store = Store(memory=True)
    final = {"State": "FAILED", "ExitCode": "1:0"}
    ids = [str(j) for j in range(300, 307)]
    backend = Acct({j: final for j in ids})
    writes = []
    backend.set_job_comments = lambda items: writes.append([i[0] for i in items]) or {i[0]: None for i in items}
    now = time.time()
    for n, j in enumerate(ids):
        _pending(cfg, j, since=now - 10 + n * 0.001)

    def process(cfg_, key, slurm=None, comments_to=None, **kw):
        store.queue_comment(key, key, "Comment", f"SATTR1: none - job {key}")
        comments_to.append(key)
        intake.done(cfg_, key)
        return "stored"
    monkeypatch.setattr(attempt, "process", process)
    monkeypatch.setattr(batch, "COMMENT_FLUSH_N", 3)
    # accounting: empty until written, then our text (what the read-back checks)
    backend.job_comments = lambda job_ids, field: {j: f"SATTR1: none - job {j}" if j in sum(writes, []) else ""
                                                   for j in job_ids}
    pool.work(cfg, pool._take_slot(cfg), slurm=backend, open_store=lambda c: store)
    assert writes == [ids[0:3], ids[3:6], ids[6:7]]
    assert all(store.comment(j)["status"] == "written" for j in ids)


def test_a_worker_yields_to_a_busy_controller_but_not_past_yield_max_s(cfg):
    cfg.analysis.yield_pressure, cfg.analysis.yield_max_s = 30.0, 60.0
    slept = []
    readings = iter([80.0, 55.0, 12.0])
    waited = batch.yield_to_controller(cfg, time.time(), sleep=slept.append, pressure=lambda: next(readings))
    assert waited == 2 * batch.YIELD_POLL_S and len(slept) == 2
    # near misses: a job that ended yield_max_s ago is not held back at all, and no PSI means no wait
    assert batch.yield_to_controller(cfg, time.time() - 61, sleep=slept.append, pressure=lambda: 99.0) == 0
    assert batch.yield_to_controller(cfg, time.time(), sleep=slept.append, pressure=lambda: None) == 0
    assert len(slept) == 2


def test_cpu_pressure_reads_psi(tmp_path):
    f = tmp_path / "cpu"
    f.write_text("some avg10=42.50 avg60=10.00 avg300=1.00 total=123\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n")
    assert batch.cpu_pressure(str(f)) == 42.5
    assert batch.cpu_pressure(str(tmp_path / "missing")) is None


def test_a_job_in_a_short_backoff_is_retried_by_the_worker_that_has_the_slot(cfg, monkeypatch):
    """The database was locked for the first try: the same worker tries again once the backoff
    ends, instead of giving its slot back and leaving the job to the next job's end or the timer."""
    monkeypatch.setattr(intake, "BACKOFF_START_S", 0.2)
    monkeypatch.setattr(pool, "POLL_S", 0.05)
    _pending(cfg, "51", since=time.time() - 60)
    calls = []

    def process(cfg_, key, **kw):
        calls.append(key)
        if len(calls) == 1:
            intake.failed(cfg_, key, "OperationalError: database is locked")
            return "pending"
        intake.done(cfg_, key)
        return "stored"
    monkeypatch.setattr(attempt, "process", process)
    counts = pool.work(cfg, pool._take_slot(cfg), slurm=Acct({"51": {"State": "FAILED"}}), open_store=lambda c: None)
    assert calls == ["51", "51"] and counts["stored"] == 1 and intake.entries(cfg) == []


def test_a_running_worker_takes_the_changed_config_for_its_next_batch(tmp_path):
    """An admin's change (here offload) applies to the jobs a running worker takes next; a file
    that no longer loads keeps the config in use; an unchanged file is not read again."""
    import os as _os

    from slurm_attr import config as config_mod
    from slurm_attr.pipeline import pool as pool_mod

    path = tmp_path / "slurm_attr.toml"
    path.write_text('[analysis]\noffload = "off"\n')
    cfg = config_mod.load(str(path))
    seen = pool_mod.config_stamp(cfg)
    same, seen2 = pool_mod.reloaded(cfg, seen)
    assert same is cfg and seen2 == seen
    path.write_text('[analysis]\noffload = "slurm"\n')
    _os.utime(path, ns=(1, 1))  # a different stamp even within the clock's resolution
    fresh, seen3 = pool_mod.reloaded(cfg, seen)
    assert fresh.analysis.offload == "slurm" and seen3 != seen
    path.write_text("[analysis]\nofload = 1\n")  # a typo: unknown key
    _os.utime(path, ns=(2, 2))
    kept, seen4 = pool_mod.reloaded(fresh, seen3)
    assert kept is fresh and seen4 != seen3


def test_the_metrics_textfile_follows_the_batches_verdicts(cfg, monkeypatch, tmp_path):
    """[metrics] textfile: rewritten after a batch that stored verdicts (its numbers are the
    store's then) and once at the run's end (the queue's age); never without the setting."""
    from prometheus_client.parser import text_string_to_metric_families

    from slurm_attr.model import Verdict
    from slurm_attr.store import Store

    store = Store(memory=True)
    cfg.metrics.textfile = str(tmp_path / "sattr.prom")
    ids = ["401", "402"]
    for n, j in enumerate(ids):
        _pending(cfg, j, since=time.time() - 10 + n * 0.001)
    seen = []

    def process(cfg_, key, slurm=None, comments_to=None, **kw):
        store.save({"job_id": key, "state": "FAILED"}, Verdict(job_id=key, cause="user_error"))
        intake.done(cfg_, key)
        return "stored"
    real = pool._publish_metrics
    monkeypatch.setattr(attempt, "process", process)
    monkeypatch.setattr(pool, "_publish_metrics", lambda c, o: seen.append(1) or real(c, o))
    pool.work(cfg, pool._take_slot(cfg), slurm=Acct({j: {"State": "FAILED"} for j in ids}), open_store=lambda c: store)
    fams = {f.name: f for f in text_string_to_metric_families(open(cfg.metrics.textfile).read())}
    assert sum(s.value for s in fams["sattr_verdicts"].samples if s.name == "sattr_verdicts_total") == 2
    assert [s.value for s in fams["sattr_pending_jobs"].samples] == [0]
    assert len(seen) == 2  # the batch, then the run's end
    os.unlink(cfg.metrics.textfile)
    cfg.metrics.textfile = ""
    _pending(cfg, "403", since=time.time())
    pool.work(cfg, pool._take_slot(cfg), slurm=Acct({"403": {"State": "FAILED"}}), open_store=lambda c: store)
    assert not os.path.exists(str(tmp_path / "sattr.prom"))
