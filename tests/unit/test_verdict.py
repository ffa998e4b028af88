"""decide(): job-wide correlation and refinement over symptoms from every analyser."""
from __future__ import annotations

from slurm_attr.model import Coverage, Evidence, Symptom
from slurm_attr.rules.pyrule import DictHistory
from slurm_attr.rules.jobwide import before_verdict
from slurm_attr.verdict import decide as _decide
from slurm_attr.verdict import tier


def decide(job, symptoms, coverage, history=None):
    """As the analysis decides (analysis.run_bundle): the catalog's job-wide rules first."""
    return _decide(job, before_verdict(symptoms, job, history), coverage)

RANKS = {str(r): f"n{r // 4 + 1}" for r in range(16)}  # 4 nodes x 4 ranks
JOB = {"job_id": "500", "nodes": ["n1", "n2", "n3", "n4"], "ranks": RANKS, "state": "FAILED", "exit_code": 1,
       "end_time": "2024-05-02T10:20:00"}


def sym(sid, cause, role="root", trusted=False, node=None, rank=None, gpu=None, priority=50, action="none",
        source=None, line=1, path=None, time=None, **fields):
    src = source or ("kernel" if trusted else "stdout")
    return Symptom(id=sid, cause=cause, role=role, priority=priority, trusted=trusted, node=node, rank=rank, gpu=gpu,
                   action=action, time=time, summary=sid, fields=dict(fields),
                   evidence=[Evidence(source=src, path=path or (f"nodes/{node}/kernel.log" if trusted else "output/stdout"),
                                      line=line, text=sid)])


def xid(n, node, gpu="0000:3b:00", **kw):
    table = {79: ("gpu_hardware", "root", "reboot", 98), 45: ("unknown", "cascade", "none", 30),
             13: ("user_error", "root", "none", 50), 109: ("gpu_hardware", "root", "reset", 85),
             74: ("nvlink", "root", "drain", 88), 31: ("user_error", "root", "none", 50)}
    cause, role, action, prio = table[n]
    return sym(f"gpu.xid_{n}", cause, role, trusted=True, node=node, gpu=gpu, priority=prio, action=action, xid=n, **kw)


def watchdogs(ranks):
    return [sym("torch.watchdog_timeout", "comm_hang", "cascade", rank=r, priority=40, line=10 + r) for r in ranks]


def remote_errors(ranks):
    return [sym("nccl.remote_error", "network", "cascade", rank=r, priority=36, line=40 + r) for r in ranks]


def roles(v):
    out = {}
    for s in v.symptoms:
        out.setdefault(s.id, set()).add(s.role)
    return out


def test_verdict_xid_on_one_node_beats_cascades_on_all_others():
    syms = [xid(79, "n3"), xid(45, "n3")] + watchdogs([0, 1, 2, 3, 4, 5, 6, 7, 12, 13, 14, 15]) + remote_errors(range(16))
    syms.append(sym("job.failed_exit", "user_error", trusted=True, priority=10, source="slurm"))
    v = decide(JOB, syms, [])
    assert v.cause == "gpu_hardware" and v.domain == "hardware"
    assert v.culprit_nodes == ["n3"] and v.culprit_gpus == ["0000:3b:00"]
    r = roles(v)
    assert r["gpu.xid_79"] == {"root"} and r["gpu.xid_45"] == {"cascade"}
    assert r["torch.watchdog_timeout"] == {"cascade"} and r["nccl.remote_error"] == {"cascade"}
    assert not v.ambiguous and v.alternatives == []
    assert [s.action for s in v.symptoms if s.id == "gpu.xid_79"] == ["reboot"]
    assert "n3" in v.summary and "cascade" in v.summary
    # 12 watchdog lines on three healthy nodes fold into one symptom per node, ranks listed
    folded = [s for s in v.symptoms if s.id == "torch.watchdog_timeout"]
    assert len(folded) == 3 and sorted(r for s in folded for r in s.fields["ranks"]) == [0, 1, 2, 3, 4, 5, 6, 7, 12, 13, 14, 15]


def test_verdict_xid45_alone_is_never_the_root():
    v = decide({**JOB, "state": "CANCELLED"}, [xid(45, "n2"), sym("job.cancelled", "cancelled", trusted=True, priority=44, source="slurm")], [])
    assert v.cause == "cancelled"
    assert roles(v)["gpu.xid_45"] == {"cascade"}


def test_verdict_xid13_then_109_on_one_gpu_is_one_program_fault():
    syms = [xid(13, "n2", time="2024-05-02T10:00:01"), xid(109, "n2", time="2024-05-02T10:00:06"),
            sym("cuda.illegal_address", "user_error", rank=5, priority=55)] + remote_errors([0, 1, 8])
    v = decide(JOB, syms, [])
    assert v.cause == "user_error"
    r = roles(v)
    assert r["gpu.xid_109"] == {"cascade"} and r["gpu.xid_13"] == {"root"}
    assert v.culprit_gpus == ["0000:3b:00"] and "n2" in v.culprit_nodes
    assert not any(s.action != "none" for s in v.symptoms if s.role == "root")


def test_verdict_xid109_on_another_gpu_stays_hardware():
    v = decide(JOB, [xid(13, "n2", gpu="0000:3b:00", time="2024-05-02T10:00:01"),
                     xid(109, "n2", gpu="0000:5e:00", time="2024-05-02T10:00:06")], [])
    assert v.cause == "gpu_hardware" and v.culprit_gpus == ["0000:5e:00"]


def test_verdict_xid109_long_after_xid13_is_the_nodes_health_not_the_cause():
    # Changed with issue 12 item 7 / issue 10 "first failure wins": the Xid 13 program fault came
    # first and ended the job; an Xid 109 an hour later is not its cascade (too late) but not the
    # job's cause either. It keeps its reset action, so the node is still drained.
    from slurm_attr.drain import candidates
    v = decide(JOB, [xid(13, "n2", time="2024-05-02T10:00:01"), xid(109, "n2", time="2024-05-02T11:00:00")], [])
    assert v.cause == "user_error"
    [late] = [s for s in v.symptoms if s.id == "gpu.xid_109"]
    assert late.role == "context" and late.action == "reset"
    assert [c[0] for c in candidates(v)] == ["n2"]


def test_verdict_a_bare_kill_is_not_an_oom():
    syms = [sym("slurm.task_killed", "unknown", "cascade", node="n2", rank=5, priority=15),
            sym("torch.dataloader_killed", "host_oom", "confirmation", rank=5, priority=42),
            sym("job.signaled", "unknown", "context", trusted=True, priority=5, source="slurm", signal=9)]
    v = decide({**JOB, "exit_code": 0, "signal": 9}, syms, [Coverage("kernel", "n2", "missing", "no kernel.log")])
    assert v.cause == "unknown"
    assert any(a["cause"] == "host_oom" for a in v.alternatives)
    assert "kernel@n2" in v.summary


def test_verdict_kernel_oom_confirms_the_slurm_oom():
    syms = [sym("slurm.oom_event", "host_oom", priority=75, line=50),
            sym("host.oom_kill", "host_oom", trusted=True, node="n2", priority=72, comm="python"),
            sym("host.oom_constraint", "host_oom", "confirmation", trusted=True, node="n2", priority=60, job="500"),
            sym("slurm.cancelled", "cancelled", priority=44, line=52)] + remote_errors([0, 1, 9])
    v = decide(JOB, syms, [])
    assert v.cause == "host_oom"
    r = roles(v)
    assert r["slurm.oom_event"] == {"root"} and r["host.oom_kill"] == {"confirmation"}
    assert r["host.oom_constraint"] == {"confirmation"} and r["slurm.cancelled"] == {"cascade"}
    assert v.culprit_nodes == ["n2"]


def test_verdict_kernel_oom_alone_is_host_oom():
    v = decide(JOB, [sym("host.oom_kill", "host_oom", trusted=True, node="n4", priority=72)] + watchdogs([0, 1]), [])
    assert v.cause == "host_oom" and v.culprit_nodes == ["n4"]


def test_verdict_oom_kill_of_another_job_on_a_shared_node_is_not_ours():
    syms = [sym("host.oom_kill", "host_oom", trusted=True, node="n1", priority=72, job="777"),
            sym("python.exception", "user_error", rank=2, priority=20, exc="ValueError")]
    v = decide(JOB, syms, [])
    assert v.cause == "user_error"
    assert roles(v)["host.oom_kill"] == {"context"}


def test_verdict_time_limit_beats_the_teardown_it_causes():
    syms = [sym("job.timeout", "time_limit", trusted=True, priority=60, source="slurm"),
            sym("slurm.cancel_time_limit", "time_limit", priority=60, line=90),
            sym("slurm.task_killed", "unknown", "cascade", priority=15, line=91),
            sym("python.exception", "user_error", rank=3, priority=20, line=95),
            sym("torch.teardown", "unknown", "cascade", priority=24, line=96)] + watchdogs([1, 2])
    v = decide({**JOB, "state": "TIMEOUT"}, syms, [])
    assert v.cause == "time_limit" and v.culprit_nodes == []
    r = roles(v)
    assert r["python.exception"] == {"cascade"} and r["job.timeout"] == {"root"}
    assert not v.ambiguous


def test_verdict_untrusted_hardware_points_at_a_rank_but_never_drains():
    ecc = sym("cuda.ecc_uncorrectable", "gpu_hardware", rank=6, priority=75, action="reset")  # action must be dropped
    v = decide(JOB, [ecc] + remote_errors([0, 1, 2]), [])
    assert v.cause == "gpu_hardware"
    assert v.culprit_nodes == ["n2"] and v.culprit_ranks == [6]
    assert all(s.action == "none" for s in v.symptoms)


def test_verdict_trusted_hardware_outranks_untrusted_claims():
    v = decide(JOB, [sym("cuda.ecc_uncorrectable", "gpu_hardware", rank=1, priority=75), xid(79, "n4")], [])
    assert v.culprit_nodes == ["n4"]
    assert roles(v)["cuda.ecc_uncorrectable"] == {"confirmation"}
    assert tier(xid(79, "n4")) > tier(sym("x", "gpu_hardware"))


def test_verdict_fr_stuck_rank_on_a_node_with_a_fatal_xid_is_hardware():
    fr = sym("fr.rank_stuck", "rank_stuck", rank=12, priority=60, source="fr")
    v = decide(JOB, [fr, xid(79, "n4")] + watchdogs([0, 1, 2, 3]), [])
    assert v.cause == "gpu_hardware" and v.culprit_nodes == ["n4"]
    assert roles(v)["fr.rank_stuck"] == {"confirmation"} and 12 in v.culprit_ranks


def test_verdict_fr_collective_mismatch_alone():
    fr = sym("fr.collective_mismatch", "collective_mismatch", rank=1, priority=60, source="fr")
    v = decide(JOB, [fr] + watchdogs(range(16)), [])
    assert v.cause == "collective_mismatch" and v.domain == "user" and v.culprit_ranks == [1]
    assert roles(v)["torch.watchdog_timeout"] == {"cascade"}


def test_verdict_fr_stuck_rank_explained_by_its_own_exception():
    syms = [sym("fr.rank_stuck", "rank_stuck", rank=3, priority=60, source="fr"),
            sym("python.exception", "user_error", rank=3, priority=20, exc="ValueError")] + watchdogs([0, 1, 2])
    v = decide(JOB, syms, [])
    assert v.cause == "user_error" and v.culprit_ranks == [3]


def test_verdict_fr_stuck_rank_alone():
    v = decide(JOB, [sym("fr.rank_stuck", "rank_stuck", rank=9, priority=60, source="fr")] + watchdogs([0, 4]), [])
    assert v.cause == "rank_stuck" and v.culprit_ranks == [9] and v.culprit_nodes == ["n3"]


def test_verdict_watchdog_timeouts_alone_are_a_hang_never_hardware():
    v = decide(JOB, watchdogs(range(16)) + [sym("job.failed_exit", "user_error", trusted=True, priority=10, source="slurm")], [])
    assert v.cause == "comm_hang" and v.ambiguous
    assert {a["cause"] for a in v.alternatives} >= {"rank_stuck"}
    assert v.culprit_nodes == [] and all(s.action == "none" for s in v.symptoms)


def test_verdict_fr_comm_hang_with_a_trusted_link_down_is_network():
    syms = [sym("fr.comm_hang", "comm_hang", priority=50, source="fr"),
            sym("net.ib_link_down", "network", trusted=True, node="n2", priority=78),
            sym("nccl.ib_completion_error", "network", rank=1, priority=62)] + watchdogs([0, 1, 2])
    v = decide(JOB, syms, [])
    assert v.cause == "network" and v.culprit_nodes == ["n2"]
    r = roles(v)
    assert r["fr.comm_hang"] == {"confirmation"} and r["nccl.ib_completion_error"] == {"confirmation"}


def test_verdict_probe_link_stall_points_at_the_node_of_its_rank():
    v = decide(JOB, [sym("probe.link_stall", "network", rank=13, priority=55, source="probe")] + watchdogs([0, 1]), [])
    assert v.cause == "network" and v.culprit_nodes == ["n4"] and v.culprit_ranks == [13]


def test_verdict_recurring_program_xid_on_one_gpu_is_a_lemon():
    history = DictHistory({("n2", "0000:3b:00", "gpu.xid_13"): ["410", "455"]})
    v = decide(JOB, [xid(13, "n2"), sym("cuda.illegal_address", "user_error", rank=5, priority=55)], [], history=history)
    assert v.cause == "gpu_hardware" and v.culprit_gpus == ["0000:3b:00"]
    [lemon] = [s for s in v.symptoms if s.id == "gpu.xid_recurrent"]
    assert lemon.role == "root" and lemon.action == "drain" and lemon.fields["jobs"] == ["410", "455"]
    assert {e.text.split()[1] for e in lemon.evidence if e.source == "history"} == {"410", "455"}
    assert roles(v)["gpu.xid_13"] == {"confirmation"}


def test_verdict_program_xid_seen_once_before_is_still_the_program():
    history = DictHistory({("n2", "0000:3b:00", "gpu.xid_13"): ["410"]})
    v = decide(JOB, [xid(13, "n2")], [], history=history)
    assert v.cause == "user_error"


def test_verdict_clean_exit_is_none_despite_survived_errors():
    syms = [sym("job.completed", "none", trusted=True, priority=1, source="slurm"),
            sym("cuda.oom", "cuda_oom", rank=2, priority=65), sym("python.exception", "user_error", rank=1, priority=20)]
    v = decide({**JOB, "state": "COMPLETED", "exit_code": 0}, syms, [])
    assert v.cause == "none" and v.domain == "none"
    assert roles(v)["cuda.oom"] == {"context"}


def test_verdict_clean_exit_with_a_dead_gpu_is_none_and_still_drains_the_node():
    # Changed with issue 12 item 7: the job's cause and the node's health are separate answers.
    from slurm_attr.drain import candidates
    syms = [sym("job.completed", "none", trusted=True, priority=1, source="slurm"), xid(79, "n1")]
    v = decide({**JOB, "state": "COMPLETED", "exit_code": 0}, syms, [])
    assert v.cause == "none" and v.culprit_nodes == []
    assert roles(v)["gpu.xid_79"] == {"context"}
    assert [(c[0], c[1]) for c in candidates(v)] == [("n1", "reboot")]
    assert "n1" in v.summary and not v.ambiguous


def test_verdict_completed_state_with_a_slurm_task_failure_is_not_trusted():
    syms = [sym("job.completed", "none", trusted=True, priority=1, source="slurm"),
            sym("slurm.cancel_task_failure", "user_error", "cascade", priority=30),
            sym("python.exception", "user_error", rank=3, priority=20)]
    v = decide({**JOB, "state": "COMPLETED", "exit_code": 0}, syms, [])
    assert v.cause == "user_error" and v.culprit_ranks == [3]


def test_verdict_node_fail_names_the_node_that_sent_nothing():
    cov = [Coverage("node", "n3", "missing", "no collect.json"), Coverage("kernel", "n3", "missing", "")]
    v = decide({**JOB, "state": "NODE_FAIL"}, [sym("job.node_fail", "node_failure", trusted=True, priority=80, source="slurm")] + remote_errors([0]), cov)
    assert v.cause == "node_failure" and v.culprit_nodes == ["n3"]
    assert v.coverage == cov


def test_verdict_node_fail_with_hardware_evidence_is_the_hardware():
    v = decide({**JOB, "state": "NODE_FAIL"}, [sym("job.node_fail", "node_failure", trusted=True, priority=80, source="slurm"), xid(79, "n2")], [])
    assert v.cause == "gpu_hardware" and v.culprit_nodes == ["n2"]
    assert roles(v)["job.node_fail"] == {"cascade"}


def test_verdict_nvlink_errors_next_to_a_lost_gpu_are_its_cascade():
    v = decide(JOB, [xid(79, "n1", gpu="0000:3b:00"), xid(74, "n1", gpu="0000:5e:00")], [])
    assert v.cause == "gpu_hardware" and v.culprit_gpus == ["0000:3b:00"]
    assert roles(v)["gpu.xid_74"] == {"cascade"}


def test_verdict_evidence_for_two_unrelated_causes_is_ambiguous():
    syms = [sym("net.ib_link_down", "network", trusted=True, node="n2", priority=78),
            sym("fs.nfs_not_responding", "filesystem", trusted=True, node="n3", priority=65)]
    v = decide(JOB, syms, [])
    assert v.cause == "network" and v.ambiguous
    assert [a["cause"] for a in v.alternatives] == ["filesystem"]


def test_verdict_one_failing_rank_and_its_cascade():
    syms = [sym("python.exception", "user_error", rank=3, priority=20, exc="ValueError")] + remote_errors([0, 1, 2, 4, 5]) + \
           [sym("torch.root_cause", "user_error", rank=3, priority=35, exitcode=1), sym("slurm.task_exit", "user_error", node="n1", rank=0, priority=22)]
    v = decide(JOB, syms, [])
    assert v.cause == "user_error" and v.culprit_ranks == [3] and v.culprit_nodes == ["n1"]
    assert roles(v)["nccl.remote_error"] == {"cascade"}


def test_verdict_launch_failure_outranks_its_echo():
    syms = [sym("launch.pyxis", "launch_failure", rank=0, priority=68), sym("launch.spank", "launch_failure", rank=0, priority=66),
            sym("slurm.task_exit", "user_error", node="n1", rank=0, priority=22)]
    v = decide(JOB, syms, [])
    assert v.cause == "launch_failure" and v.domain == "infrastructure"
    assert roles(v)["slurm.task_exit"] == {"cascade"}


def test_verdict_cancel_after_an_earlier_exception_is_ambiguous():
    syms = [sym("python.exception", "user_error", rank=3, priority=20, line=10),
            sym("slurm.cancelled", "cancelled", priority=44, line=500)]
    v = decide({**JOB, "state": "CANCELLED"}, syms, [])
    assert v.cause == "cancelled" and v.ambiguous and v.alternatives[0]["cause"] == "user_error"


def test_verdict_does_not_touch_its_input_and_cleans_bad_words():
    s = sym("x.weird", "gremlins", role="chief", action="drain")
    before = s.to_dict()
    v = decide(JOB, [s], [])
    assert s.to_dict() == before
    [out] = v.symptoms
    assert out.cause == "unknown" and out.role == "context" and out.action == "none"


def test_verdict_without_evidence_is_unknown_and_says_what_was_missing():
    v = decide({"job_id": "1"}, [], [Coverage("stdout", None, "missing", "output/stdout")])
    d = v.to_dict()
    assert d["cause"] == "unknown" and d["domain"] == "unknown" and "stdout" in d["summary"]
    assert set(d) >= {"job_id", "cause", "domain", "summary", "culprit", "ambiguous", "alternatives", "symptoms", "coverage", "actions"}


def test_verdict_a_failing_history_store_costs_only_the_recurrence_check():
    class Broken:
        def gpu_symptom_jobs(self, *args):
            raise OSError("database is locked")

    v = decide(JOB, [xid(13, "n2")], [], history=Broken())
    assert v.cause == "user_error"
