"""The breaker's state from Slurm itself: sinfo -R with %H, reason stamps, partition sizes."""
from __future__ import annotations

import time
from datetime import datetime

from slurm_attr import breaker, drain, fastpath, slurmstate
from slurm_attr.slurmstate import SlurmView, limit_check, parse_sinfo_reasons

from test_drain_fakes import FakeSlurm


def _stamp(epoch: float) -> str:
    return datetime.fromtimestamp(epoch).strftime("%Y-%m-%dT%H:%M:%S")


def test_parse_sinfo_reasons_as_slurm_prints_them():
    # `sinfo -R -h -o '%N|%H|%E'` on 22.05: hostlists compressed, reason last (may hold '|').
    text = ("n[1-2]|2026-12-01T20:30:05|SATTR: gpu_hardware xid79 gpu3b:00 job 1234\n"
            "n4|2026-12-01T09:00:00|ticket 7 | bad PSU\n"
            "garbage line\n")
    rows = parse_sinfo_reasons(text)
    assert [(r.node, r.ours) for r in rows] == [("n1", True), ("n2", True), ("n4", False)]
    assert rows[2].reason == "ticket 7 | bad PSU"
    assert rows[0].at == datetime(2026, 12, 1, 20, 30, 5).timestamp()
    assert slurmstate.slurm_time("Unknown") is None


def test_node_state_keeps_the_reason_time_from_scontrols_stamp():
    st = slurmstate.NodeState.from_record({"NodeName": "n1", "State": "IDLE+DRAIN",
                                           "Reason": "SATTR: x job 5 [root@2026-12-01T20:00:00]"})
    assert st.reason == "SATTR: x job 5" and st.ours and st.drained
    assert st.reason_time == datetime(2026, 12, 1, 20, 0, 0).timestamp()
    assert slurmstate.reason_job(st.reason) == "5"


def test_limit_check_counts_only_our_recent_drains():
    now = time.time()
    recs = [{"NodeName": f"n{i}", "State": "IDLE", "Partitions": "p"} for i in range(1, 21)]
    recs[0].update(State="IDLE+DRAIN", Reason=f"SATTR: a job 1 [root@{_stamp(now - 60)}]")
    recs[1].update(State="IDLE+DRAIN", Reason=f"SATTR: a job 2 [root@{_stamp(now - 7200)}]")  # out of window
    recs[2].update(State="IDLE+DRAIN", Reason=f"ticket 4 [admin@{_stamp(now - 10)}]")  # not ours
    view = SlurmView.build(recs)
    assert limit_check(view, "n9", ["p"], max_drains=2, window_s=3600, max_partition_percent=100, now=now) == ""
    why = limit_check(view, "n9", ["p"], max_drains=1, window_s=3600, max_partition_percent=100, now=now)
    assert "1 automatic drains" in why and "n1" in why
    # A breaker reset after n1's drain: it no longer counts.
    assert limit_check(view, "n9", ["p"], max_drains=1, window_s=3600, max_partition_percent=100,
                       since=now - 30, now=now) == ""
    # Partition share: 20 nodes at 10 % = 2; n1 and n2 are ours -> a third would exceed it.
    why = limit_check(view, "n9", ["p"], max_drains=99, window_s=3600, max_partition_percent=10, now=now)
    assert "3 of 20 nodes of partition p" in why


def test_sinfo_times_override_missing_stamps():
    now = time.time()
    recs = [{"NodeName": "n1", "State": "IDLE+DRAIN", "Reason": "SATTR: a job 1", "Partitions": "p"},
            {"NodeName": "n2", "State": "IDLE", "Partitions": "p"}]
    rows = parse_sinfo_reasons(f"n1|{_stamp(now - 5)}|SATTR: a job 1\n")
    assert SlurmView.build(recs).drains_since(now - 60) == []
    assert SlurmView.build(recs, rows).drains_since(now - 60) == ["n1"]


def test_dependencies_run_one_way():
    import ast
    import inspect

    def imports(mod):
        tree = ast.parse(inspect.getsource(mod))
        return {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}

    assert "drain" not in imports(breaker) and "breaker" in imports(drain)
    assert not {"drain", "breaker"} & imports(slurmstate)
    assert "store" not in imports(fastpath)


def test_fast_view_uses_sinfo_when_the_backend_has_it():
    class WithReasons(FakeSlurm):
        def reasons(self):
            return parse_sinfo_reasons(f"n1|{_stamp(time.time())}|SATTR: a job 1\n")

    s = WithReasons()
    s.set_state("n1", "IDLE+DRAIN", "SATTR: a job 1")  # the fake stamps 2026-01-01
    assert fastpath.slurm_view(s).drains_since(time.time() - 60) == ["n1"]
    assert fastpath.slurm_view(FakeSlurm()).reason_times == {}


def test_beyond_caps_ranks_a_burst_the_same_way_on_every_node():
    """Four epilogs drained in the same second (each passed the check before the others drained):
    every node ranks them (reason time, name) alike; exactly the first max_drains stay."""
    now = time.time()
    recs = [{"NodeName": f"n{i}", "State": "IDLE+DRAIN", "Partitions": "p",
             "Reason": f"SATTR: gpu_hardware xid79 job {i} [root@{_stamp(now)}]"} for i in range(1, 5)]
    view = SlurmView.build(recs)
    beyond = [n for n in ("n1", "n2", "n3", "n4")
              if slurmstate.beyond_caps(view, n, max_drains=2, window_s=3600, max_partition_percent=100, now=now)]
    assert beyond == ["n3", "n4"]
    # Near miss: an earlier drain outranks a later one whatever the names.
    recs[3]["Reason"] = f"SATTR: gpu_hardware xid79 job 4 [root@{_stamp(now - 30)}]"
    view = SlurmView.build(recs)
    beyond = [n for n in ("n1", "n2", "n3", "n4")
              if slurmstate.beyond_caps(view, n, max_drains=2, window_s=3600, max_partition_percent=100, now=now)]
    assert beyond == ["n2", "n3"]
    # The partition share counts the same way: 4 nodes at 50 % = 2 may be ours.
    assert slurmstate.beyond_caps(view, "n1", max_drains=9, window_s=3600, max_partition_percent=50, now=now) == ""
    assert "partition p" in slurmstate.beyond_caps(view, "n3", max_drains=9, window_s=3600,
                                                   max_partition_percent=50, now=now)


def test_fast_path_in_a_burst_undoes_its_own_drain_when_ranked_past_the_cap(monkeypatch):
    from test_drain_fakes import drain_cfg
    from slurm_attr.model import Action

    monkeypatch.setattr(fastpath, "SETTLE_S", 0.0)
    # As in a burst: the check before draining saw none of the others' drains yet.
    monkeypatch.setattr(fastpath, "limit_check", lambda *a, **k: "")
    s = FakeSlurm()
    for n in ("n1", "n2", "n4"):
        s.drain(n, f"SATTR: gpu_hardware xid79 job {n}")
    cfg = drain_cfg(max_drains=2, window_s=3600)
    act = Action(kind="drain", node="n3", reason="SATTR: gpu_hardware xid79 job 3", applied=False)
    fastpath._decide(cfg, act, s)
    assert not act.applied and act.blocked_by == slurmstate.BLOCK_BREAKER
    assert "n3" not in s.drained() and ("resume", "n3") in s.calls
    # Near miss: a node whose drain Slurm shows first keeps it (the others' stamps are later).
    s.resume("n2")
    later = _stamp(time.time() + 60)
    for n in ("n1", "n4"):
        s.recs[n]["Reason"] = f"SATTR: gpu_hardware xid79 job {n} [root@{later}]"
    act2 = Action(kind="drain", node="n2", reason="SATTR: gpu_hardware xid79 job 2", applied=False)
    fastpath._decide(cfg, act2, s)
    assert act2.applied and "n2" in s.drained()
