"""Who a verdict names: the root placed by its peers when it names no node, the ranks that saw
the failure first-hand, and the node a slurmd's own log file names."""
from __future__ import annotations

from slurm_attr.model import Evidence, Symptom
from slurm_attr.rules.catalog import load_catalog
from slurm_attr.rules.extract import extract_lines
from slurm_attr.rules.jobwide import before_verdict
from slurm_attr.rules.scan import daemon_log_node
from slurm_attr.verdict import decide as _decide

NODES = ["n1", "n2", "n3", "n4", "n5"]
ONE_PER_NODE = {"job_id": "700", "nodes": NODES, "ranks": {str(i): n for i, n in enumerate(NODES)},
                "state": "FAILED", "exit_code": 1, "end_time": "2024-05-02T10:20:00"}
FOUR_PER_NODE = {**ONE_PER_NODE, "ranks": {str(r): NODES[r // 4] for r in range(20)}}


def decide(job, syms):
    return _decide(job, before_verdict(syms, job, None), [])


def sym(sid, cause, role="root", trusted=False, node=None, rank=None, gpu=None, priority=50, **fields):
    return Symptom(id=sid, cause=cause, role=role, priority=priority, trusted=trusted, node=node, rank=rank, gpu=gpu,
                   summary=sid, fields=dict(fields),
                   evidence=[Evidence(source="kernel" if trusted else "stdout", path="output/stdout", line=1, text=sid)])


def traceback_without_rank():
    # the program's exception, printed without a launcher label: no rank, no node
    return sym("python.exception", "user_error", priority=20, exc="IndexError")


def closed_by(peer, reporters):
    # NCCL on each reporter: "socketProgress: Connection closed by remote peer <peer>"
    return [sym("nccl.remote_closed", "network", "cascade", node=n, priority=36, peer_node=peer) for n in reporters]


def test_an_unlabelled_exception_is_placed_where_every_failing_connection_meets():
    v = decide(ONE_PER_NODE, [traceback_without_rank()] + closed_by("n2", ["n1", "n3", "n4"]))
    assert v.cause == "user_error"
    assert v.culprit_nodes == ["n2"] and v.culprit_ranks == [1]  # n2 runs rank 1 alone
    assert any("n2 is on every failing connection" in r for r in v.reasoning)


def test_placed_by_peers_names_no_rank_when_the_node_runs_several():
    v = decide(FOUR_PER_NODE, [traceback_without_rank()] + closed_by("n2", ["n1", "n3", "n4"]))
    assert v.culprit_nodes == ["n2"] and v.culprit_ranks == []


def test_placed_by_peers_near_miss_one_connection_cannot_tell_its_ends_apart():
    v = decide(ONE_PER_NODE, [traceback_without_rank()] + closed_by("n2", ["n1"]))
    assert v.cause == "user_error" and v.culprit_nodes == []
    assert not any("failing connection" in r for r in v.reasoning)


def test_placed_by_peers_near_miss_connections_with_no_common_node():
    syms = [traceback_without_rank()] + closed_by("n2", ["n1"]) + closed_by("n4", ["n3"]) + closed_by("n5", ["n1"])
    v = decide(ONE_PER_NODE, syms)
    assert v.cause == "user_error" and v.culprit_nodes == []


def test_placed_by_peers_near_miss_a_labelled_root_keeps_its_own_node():
    labelled = sym("python.exception", "user_error", rank=4, priority=20, exc="IndexError")
    v = decide(ONE_PER_NODE, [labelled] + closed_by("n2", ["n1", "n3", "n4"]))
    assert v.culprit_nodes == ["n5"] and v.culprit_ranks == [4]


def test_placed_by_peers_near_miss_a_cause_of_the_whole_job_names_no_node():
    cancel = sym("job.cancelled", "cancelled", trusted=True, priority=44)
    v = decide({**ONE_PER_NODE, "state": "CANCELLED"}, [cancel] + closed_by("n2", ["n1", "n3", "n4"]))
    assert v.cause == "cancelled" and v.culprit_nodes == []


def gpu_fault_on_n2():
    xid = sym("gpu.xid_48", "gpu_hardware", trusted=True, node="n2", gpu="0000:3a:00", priority=98, xid=48)
    xid.action = "drain"
    return xid


def test_the_rank_on_the_failed_gpu_is_the_culprit_not_its_neighbours():
    syms = [gpu_fault_on_n2(),
            sym("cuda.ecc_uncorrectable", "gpu_hardware", "confirmation", rank=6, priority=60),
            # ranks 5 and 7 share the node but not the GPU: their NCCL errors are the cascade
            sym("nccl.remote_error", "network", "cascade", rank=5, priority=36),
            sym("nccl.remote_error", "network", "cascade", rank=7, priority=36),
            sym("nccl.remote_error", "network", "cascade", rank=0, priority=36)]
    v = decide(FOUR_PER_NODE, syms)
    assert v.cause == "gpu_hardware" and v.culprit_nodes == ["n2"] and v.culprit_ranks == [6]


def test_near_miss_a_node_fault_no_rank_confirms_names_every_rank_that_failed_there():
    mce = sym("host.mce_fatal", "host_hardware", trusted=True, node="n2", priority=95)
    syms = [mce] + [sym("nccl.remote_error", "network", "cascade", rank=r, priority=36) for r in (4, 5, 7, 0)]
    v = decide(FOUR_PER_NODE, syms)
    assert v.cause == "host_hardware" and v.culprit_ranks == [4, 5, 7]  # rank 0 is on n1


def test_a_bare_task_exit_names_the_rank_only_when_nothing_stronger_does():
    exited = sym("slurm.task_exit", "user_error", "root", trusted=True, node="n1", rank=0, priority=22)
    strong = sym("python.exception", "user_error", rank=3, priority=20, exc="ValueError")
    v = decide(FOUR_PER_NODE, [strong, exited])
    assert v.culprit_ranks == [3]
    v = decide(FOUR_PER_NODE, [traceback_without_rank(), exited])
    assert v.cause == "user_error" and v.culprit_ranks == [0]


def test_a_slurmd_log_named_for_its_node_names_the_node():
    assert daemon_log_node("slurmd-gpu-a026.log: [2024-08-09T17:06:48.000] error: [job 3454519] prolog failed status=1:0") == "gpu-a026"
    assert daemon_log_node("slurmd.n07.example.org.log: [2024-08-09T17:06:48.000] error: x") == "n07.example.org"
    # near misses: the controller's log, one slurmd log for all nodes, a line that only mentions one
    assert daemon_log_node("slurmctld.log: [2024-08-09T17:06:46.442] sched: Allocate JobId=1 NodeList=n[1-2]") is None
    assert daemon_log_node("slurmd.log: [2024-08-09T17:06:48.000] error: [job 1] prolog failed status=1:0") is None
    assert daemon_log_node("slurmctld.log: see slurmd-n3.log: for more") is None


def test_a_prolog_failure_in_one_slurmd_log_is_placed_on_that_node():
    cat = load_catalog()
    lines = ["slurmctld.log: [2024-08-09T17:06:46.442] sched: Allocate JobId=3454519 NodeList=n[1-2] #CPUs=128",
             "slurmd-n2.log: [2024-08-09T17:06:48.000] error: [job 3454519] prolog failed status=1:0"]
    found = [s for s in extract_lines(cat, "scheduler", None, "scheduler/slurm.log", enumerate(lines, 1))
             if s.id == "slurm.prolog_failure"]
    assert [s.node for s in found] == ["n2"]
    # near miss: the same line in the job's own output is the job's word, not the daemon's file
    out = [s for s in extract_lines(cat, "stdout", None, "output/stdout", enumerate(lines[1:], 1))
           if s.id == "slurm.prolog_failure"]
    assert [s.node for s in out] == [None]


def task_exit(node):
    # srun: "error: <node>: tasks 1,6: Exited with exit code 1" (the others: "Terminated")
    return sym("slurm.task_exit", "user_error", "root", node=node, priority=22, exitcode=1)


def test_an_unlabelled_error_is_placed_on_the_one_node_whose_tasks_exited_on_their_own():
    killed = [sym("slurm.task_killed", "cancelled", "cascade", node=n, priority=20) for n in ("n1", "n3", "n4")]
    v = decide(FOUR_PER_NODE, [traceback_without_rank(), task_exit("n2")] + killed)
    assert v.cause == "user_error" and v.culprit_nodes == ["n2"] and v.culprit_ranks == []
    assert any("only the tasks on n2 exited" in r for r in v.reasoning)


def test_near_miss_tasks_that_exited_on_several_nodes_place_nothing():
    v = decide(FOUR_PER_NODE, [traceback_without_rank(), task_exit("n2"), task_exit("n3")])
    assert v.cause == "user_error" and v.culprit_nodes == []


def test_the_rank_flight_recorder_finds_out_of_step_is_the_mismatchs_culprit():
    """Rank 2 skipped a collective; Gloo's size check fires on rank 1, where rank 2's next
    collective's data arrived. Flight Recorder, comparing every rank, names rank 2 (policy
    localised_by): the culprit is rank 2, not the rank that detected it."""
    gloo = sym("torch.gloo_size_mismatch", "collective_mismatch", node="n2", rank=1, priority=62)
    fr = sym("fr.collective_mismatch", "collective_mismatch", node="n3", rank=2, priority=64)
    v = decide(ONE_PER_NODE, [gloo, fr])
    assert v.cause == "collective_mismatch" and (v.culprit_ranks, v.culprit_nodes) == ([2], ["n3"])
    # near miss: without the analysers' finding, the rank that reported it is all there is
    v = decide(ONE_PER_NODE, [sym("torch.gloo_size_mismatch", "collective_mismatch", node="n2", rank=1, priority=62)])
    assert (v.culprit_ranks, v.culprit_nodes) == ([1], ["n2"])


def _ib_errors(reporters, peer="10.9.163.62"):
    # NCCL on each reporter: "NET/IB : Got completion from peer 10.9.163.62<31268> with status=12"
    return [sym("nccl.ib_completion_error", "network", node=n, priority=58, peer_ip=peer) for n in reporters]


def bare_assert(node="n2", rank=1):
    return sym("python.exception_bare", "user_error", node=node, rank=rank, priority=22, exc="AssertionError")


def test_connections_to_an_unmapped_address_fail_because_the_one_process_elsewhere_died():
    """Every failing connection ends at one address no record maps; the one rank that failed on
    its own is on a node none of the reporters is: that process's death is the cause."""
    v = decide(ONE_PER_NODE, [bare_assert()] + _ib_errors(["n1", "n3", "n4"]))
    assert (v.cause, v.culprit_nodes, v.culprit_ranks) == ("user_error", ["n2"], [1])
    assert any("the process that died" in r for r in v.reasoning)


def test_near_misses_of_a_death_at_the_unmapped_address():
    from slurm_attr.reason import netloc, policy

    ranks = {i: n for i, n in enumerate(NODES)}
    level = policy.load().group("rank_level")

    def step(syms):
        return netloc.explain_by_a_death(syms, netloc.vote(syms), ranks, level)

    assert step([bare_assert()] + _ib_errors(["n1", "n3", "n4"])) is not None  # the positive, as a step
    # the failed rank sits on a reporting node: its error may be the network's consequence
    syms = [bare_assert(node="n3", rank=2)] + _ib_errors(["n1", "n3", "n4"])
    assert step(syms) is None and all(s.role == "root" for s in syms)
    # two nodes with their own failures: whose the address is cannot be told
    assert step([bare_assert(), sym("python.exception", "user_error", node="n5", rank=4)] + _ib_errors(["n1", "n3", "n4"])) is None
    # a link that really went down (the kernel's word)
    assert step([bare_assert(), sym("net.ib_port_down", "network", trusted=True, node="n1")] + _ib_errors(["n1", "n3", "n4"])) is None
    # the address is mapped to a node (n2 itself): the vote names the node, nothing to infer
    assert step([bare_assert()] + [sym("nccl.ib_completion_error", "network", node=n, peer_node="n2") for n in ("n1", "n3")]) is None
