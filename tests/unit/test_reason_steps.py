"""The verdict's reasoning steps one by one: line times, placeholder-free summaries, the network
vote, first failure, the attempt, contradiction. Each positive case has its near-miss."""
from __future__ import annotations

from datetime import datetime

import pytest

from slurm_attr.model import Coverage, Evidence, Symptom
from slurm_attr.reason import contradiction, firstfailure, jobattempt, netloc
from slurm_attr.reason.timeline import Clock, line_time
from slurm_attr.rules.template import fill
from slurm_attr.verdict import decide

JOB = {"job_id": "9", "nodes": ["n1", "n2"], "ranks": {str(r): f"n{r // 4 + 1}" for r in range(8)},
       "state": "FAILED", "exit_code": 1, "start_time": "2024-05-02T09:00:00+02:00", "end_time": "2024-05-02T10:20:00+02:00"}
CLEAN = [Coverage("kernel", "n1", "ok", "journalctl -k"), Coverage("kernel", "n2", "ok", "journalctl -k")]


def sym(sid, cause, text, role="root", trusted=False, node=None, rank=None, line=1, path=None, priority=50, action="none", **fields):
    src = "kernel" if trusted else "stdout"
    return Symptom(id=sid, cause=cause, role=role, priority=priority, trusted=trusted, node=node, rank=rank, action=action,
                   summary=sid, fields=dict(fields),
                   evidence=[Evidence(source=src, path=path or (f"nodes/{node}/kernel.log" if trusted else "output/stdout"),
                                      line=line, text=text)])



# -- line times -------------------------------------------------------------------------------
@pytest.mark.parametrize("line,expect", [
    ("[rank0]:[E1206 18:44:12.715298746 ProcessGroupNCCL.cpp:607] [Rank 0] Watchdog caught", "2024-12-06T18:44:12.715299"),
    ("[80746] [rank0]:[E321 02:07:08.408271257 ProcessGroupNCCL.cpp:607] [Rank 0] Watchdog", "2024-03-21T02:07:08.408271"),
    ("[Thu May  2 10:00:01 2024] NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=python, GPU has fallen off the bus.", "2024-05-02T10:00:01"),
    ("May 02 09:00:14 gpu-012 kernel: IPv6: ADDRCONF(NETDEV_CHANGE): ib0: link becomes ready", "2024-05-02T09:00:14"),
    ("[2026-09-09 10:46:33] ubuntu2:319733:319761 [1] transport/net_ib/p2p.cc:648 NCCL WARN NET/IB: Got completion", "2026-09-09T10:46:33"),
])
def test_timeline_reads_real_prefixes(line, expect):
    t = line_time(line, Clock(2024))
    assert t is not None and abs(t - (datetime.fromisoformat(expect) - datetime(1970, 1, 1)).total_seconds()) < 1e-3


@pytest.mark.parametrize("line", [
    "[rank3]: ValueError: bad timestamp 2024-01-01 00:00:00 in shard header",  # a date inside a message
    "[ 4443.974372] mlx5_core 0000:53:00.0 mlx5_3: Port: 1 Link DOWN",  # uptime only: no wall clock
    "[rank6]: KeyError: 'labels'",
])
def test_timeline_near_misses_have_no_time(line):
    assert line_time(line, Clock(2024)) is None


def test_timeline_puts_offset_and_local_times_on_one_scale():
    from slurm_attr.reason.timeline import clock_of, parse_iso
    clock = clock_of(JOB)  # job.json carries the cluster's offset (+02:00)
    start = parse_iso(JOB["start_time"], clock)
    # journalctl -o short-iso in UTC and dmesg -T in local time: the same instant, one second after the start
    assert line_time("2024-05-02T07:00:01+00:00 n1 kernel: NVRM: Xid", clock) == start + 1
    assert line_time("[Thu May  2 09:00:01 2024] NVRM: Xid", clock) == start + 1
    # near-miss: the same local text read as UTC would be two hours off
    assert line_time("[Thu May  2 09:00:01 2024] NVRM: Xid", Clock(2024)) == start + 1 + 7200


# -- summaries without placeholders (issue 9) ----------------------------------------------------
@pytest.mark.parametrize("template,values,expect", [
    ("the job saw a lost GPU {gpu}", {}, "the job saw a lost GPU"),
    ("rank {rank}: {exc}: {message}", {"exc": "AssertionError", "message": "loss is nan"}, "AssertionError: loss is nan"),
    ("NCCL saw a fatal network device event ({reason}{value}{rc})", {"reason": "port error"}, "NCCL saw a fatal network device event (port error)"),
    ("NCCL InfiniBand completion error (status {status}) talking to {peer}", {"status": 12},
     "NCCL InfiniBand completion error (status 12) talking to a peer"),
    ("the kernel OOM killer killed {comm} (pid {pid})", {"comm": "python"}, "the kernel OOM killer killed python"),
])
def test_template_leaves_missing_fields_out(template, values, expect):
    assert fill(template, values) == expect


def test_template_with_every_field_is_unchanged():
    assert fill("rank {rank}: {exc}: {message}", {"rank": 3, "exc": "ValueError", "message": "x"}) == "rank 3: ValueError: x"
    assert fill("NCCL saw a fatal network device event ({reason}{value}{rc})", {"reason": "port error", "value": "", "rc": ""}) == \
        "NCCL saw a fatal network device event (port error)"


# -- the network vote ----------------------------------------------------------------------------
def ib(node, peer_ip, line):
    return sym("nccl.ib_completion_error", "network", f"{node}:1:2 [0] NCCL WARN NET/IB : Got completion from peer {peer_ip}<50826> with status=12",
               node=node, line=line, peer=f"{peer_ip}<50826>", peer_ip=peer_ip)


def test_vote_names_the_node_on_every_failing_connection():
    job = {**JOB, "nodes": ["n1", "n2", "n3"], "node_addrs": {"n1": ["10.0.0.1"], "n2": ["10.0.0.2"], "n3": ["10.0.0.3"]}}
    syms = [ib("n1", "10.0.0.3", 1), ib("n2", "10.0.0.3", 2), ib("n3", "10.0.0.1", 3)]
    netloc.resolve_peers(syms, netloc.AddressBook(job, job["nodes"]))
    v = netloc.vote(syms)
    assert v.decisive and v.winners == ["n3"] and v.tally["n3"] == 2 and v.tally["n1"] == 1


def test_vote_near_miss_one_connection_cannot_tell_its_ends_apart():
    job = {**JOB, "nodes": ["n1", "n2", "n3"], "node_addrs": {"n1": ["10.0.0.1"], "n2": ["10.0.0.2"], "n3": ["10.0.0.3"]}}
    syms = [ib("n1", "10.0.0.3", 1), ib("n1", "10.0.0.3", 2)]  # one connection reported twice
    netloc.resolve_peers(syms, netloc.AddressBook(job, job["nodes"]))
    v = netloc.vote(syms)
    assert not v.decisive and v.winners == ["n1", "n3"] and len(v.edges) == 1


def test_vote_maps_addresses_through_nccl_info_lines_when_slurm_has_none():
    book = netloc.AddressBook({}, ["gpu-017", "gpu-018"])
    book.add_hosts(netloc.addrs_from_nccl_info([
        "gpu-017:12345:12345 [3] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB ; OOB ib0:10.0.0.17<0>",
        "gpu-018:2222:2222 [0] NCCL INFO Bootstrap : Using ib0:10.0.0.18<0>",
        "gpu-019:2222:2222 [0] NCCL INFO Bootstrap : Using ib0:10.0.0.19<0>"]))  # not a job node
    assert book.node_of("10.0.0.17") == "gpu-017" and book.node_of("10.0.0.18") == "gpu-018"
    assert book.node_of("10.0.0.19") is None


def test_peer_address_from_a_roce_gid_when_the_peer_field_is_missing():
    s = sym("nccl.ib_completion_error", "network", "x NET/IB : Got completion from peer with status=12 localGid ::ffff:10.0.0.1 remoteGids::ffff:10.0.0.3")
    assert netloc.peer_addr(s) == "10.0.0.3"


# -- first failure --------------------------------------------------------------------------------
def test_first_failure_by_time_across_files():
    exc = sym("python.exception", "user_error", "6: [rank6]:[W502 10:00:01.1 1 x.py:1] KeyError: 'labels'", rank=6, node="n2", priority=20)
    ibe = sym("nccl.ib_completion_error", "network", "[2024-05-02 10:00:04] n1:1:2 [0] NCCL WARN NET/IB : Got completion",
              node="n1", rank=1, path="nodes/n1/nccl/x.log", priority=62)
    o = firstfailure.order([ibe, exc], [ibe, exc], JOB)
    assert o.first is exc and o.later == [ibe] and o.how == "time"


def test_first_failure_near_miss_trusted_fault_within_a_minute_is_not_demoted():
    exc = sym("cuda.error", "user_error", "5: [rank5]:[E502 10:00:09.2 1 x.cpp:1] CUDA error: unknown error", rank=5, node="n2")
    xid = sym("gpu.xid_79", "gpu_hardware", "May 02 10:00:40 n2 kernel: NVRM: Xid (PCI:0000:3b:00): 79", trusted=True, node="n2", priority=98)
    o = firstfailure.order([exc, xid], [exc, xid], JOB)
    assert o.first is exc and o.later == []  # 31 s: within the kernel clock's margin, the tier decides
    late = sym("gpu.xid_79", "gpu_hardware", "May 02 10:03:40 n2 kernel: NVRM: Xid (PCI:0000:3b:00): 79", trusted=True, node="n2", priority=98)
    assert firstfailure.order([exc, late], [exc, late], JOB).later == [late]


def test_untimed_line_is_ordered_by_the_timed_lines_around_it():
    exc = sym("python.exception", "user_error", "6: [rank6]: KeyError: 'labels'", rank=6, node="n2", line=5, priority=20)
    net = sym("nccl.ib_completion_error", "network", "[2024-05-02 10:00:04] n1:1:2 [0] NCCL WARN NET/IB : Got completion",
              node="n1", rank=1, line=9, priority=62)
    o = firstfailure.order([net, exc], [net, exc], JOB)
    assert o.first is exc and o.later == [net]


# -- the attempt -----------------------------------------------------------------------------------
def test_earlier_attempts_lines_are_context():
    old = sym("slurm.cancel_node_failure", "node_failure",
              "slurmstepd: error: *** JOB 9 ON n2 CANCELLED AT 2024-05-02T08:41:13 DUE TO NODE FAILURE, SEE SLURMCTLD LOG FOR DETAILS ***", line=2)
    new = sym("python.exception", "user_error", "0: [rank0]: RuntimeError: PytorchStreamReader failed reading zip archive", rank=0, line=7)
    stale = jobattempt.mark_earlier([old, new], {**JOB, "restart_count": 1})
    assert stale == [old] and old.role == "context" and "earlier attempt" in old.status.earlier
    assert new.role == "root"


def test_near_miss_a_node_failure_of_this_attempt_is_not_earlier():
    now = sym("slurm.cancel_node_failure", "node_failure",
              "slurmstepd: error: *** JOB 9 ON n2 CANCELLED AT 2024-05-02T09:51:13 DUE TO NODE FAILURE, SEE SLURMCTLD LOG FOR DETAILS ***")
    assert jobattempt.mark_earlier([now], {**JOB, "restart_count": 1, "state": "NODE_FAIL"}) == []
    assert now.role == "root"


# -- restarts inside the job (elastic) -----------------------------------------------------------
RESTART = "INFO:torch.distributed.elastic.agent.server.api:[default] Worker group FAILED. 2/3 attempts left; will restart worker group"


def test_a_failure_before_torchruns_restart_was_survived():
    oom = sym("cuda.oom", "cuda_oom", "3: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", rank=3, line=40)
    restart = sym("torch.elastic_restart", "unknown", RESTART, role="context", line=55)
    err = sym("python.exception", "user_error", "5: ValueError: too many values to unpack (expected 2)", rank=5, line=90)
    xid = sym("gpu.xid_79", "gpu_hardware", "[Thu May  2 09:10:00 2024] NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.",
              trusted=True, node="n1", action="drain", line=3)
    assert jobattempt.mark_survived([oom, restart, err, xid]) == [oom]
    assert oom.role == "context" and "lived through" in oom.status.earlier and err.role == "root"
    assert xid.role == "root" and xid.action == "drain"  # a broken GPU stays broken across a restart


def test_near_miss_without_a_restart_nothing_was_survived():
    oom = sym("cuda.oom", "cuda_oom", "3: torch.OutOfMemoryError: CUDA out of memory.", rank=3, line=40)
    start = sym("torch.elastic_start", "unknown", "INFO:torch.distributed.elastic.agent.server.api:[default] Starting worker group",
                role="context", line=55)
    err = sym("python.exception", "user_error", "5: ValueError: boom", rank=5, line=90)
    assert jobattempt.mark_survived([oom, start, err]) == [] and oom.role == "root"


def test_the_verdict_takes_the_error_after_the_last_restart():
    oom = sym("cuda.oom", "cuda_oom", "3: torch.OutOfMemoryError: CUDA out of memory.", rank=3, line=40, priority=60)
    restart = sym("torch.elastic_restart", "unknown", RESTART, role="context", line=55)
    err = sym("python.exception", "user_error", "5: ValueError: boom", rank=5, line=90)
    v = decide(JOB, [oom, restart, err], CLEAN)
    assert v.cause == "user_error" and v.culprit_ranks == [5], (v.cause, v.culprit_ranks)


# -- contradiction ---------------------------------------------------------------------------------
def lost_gpu(node="n2"):
    return sym("gpu.lost_in_output", "gpu_hardware", "6: [Thu May  2 09:41:07 2024] NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.",
               rank=6, node=node, priority=70)


def test_claim_contradicted_by_a_clean_covered_kernel_log():
    s = lost_gpu()
    contradiction.check([s], CLEAN, JOB, ["n1", "n2"])
    assert s.status.claim == "contradicted" and s.status.kernel_format_copy is True
    assert "not confirmed by n2's kernel log" in s.status.claim_note


def test_claim_near_misses_confirmed_and_unchecked():
    s, xid = lost_gpu(), sym("gpu.xid_79", "gpu_hardware", "May 02 09:41:07 n2 kernel: NVRM: Xid", trusted=True, node="n2")
    contradiction.check([s, xid], CLEAN, JOB, ["n1", "n2"])
    assert s.status.claim == "confirmed"
    s = lost_gpu()
    contradiction.check([s], [CLEAN[0], Coverage("kernel", "n2", "missing", "no kernel.log")], JOB, ["n1", "n2"])
    assert s.status.claim == "unconfirmed"


def test_decide_lets_the_next_root_speak_and_never_drains_on_a_claim():
    exc = sym("python.exception", "user_error", "6: [rank6]: KeyError: 'labels'", rank=6, node="n2", priority=20, exc="KeyError")
    v = decide(JOB, [lost_gpu(), exc], CLEAN)
    assert v.cause == "user_error" and v.culprit_ranks == [6]
    assert "not confirmed by the kernel log" in v.summary
    v = decide(JOB, [lost_gpu(), exc], [CLEAN[0]])  # near-miss: no kernel log for n2: the claim may stand
    assert v.cause == "gpu_hardware" and all(s.action == "none" for s in v.symptoms)


def test_exit_code_alone_is_unknown_but_a_crash_signal_is_the_program():
    v = decide(JOB, [sym("job.failed_exit", "user_error", "", priority=10)], [Coverage("stdout", None, "missing", "output/stdout")])
    assert v.cause == "unknown" and "stdout" in v.summary
    v = decide({**JOB, "exit_code": 0, "signal": 11}, [sym("job.signaled", "user_error", "", priority=12, signal=11)], [])
    assert v.cause == "user_error"


def _srun_exit(node, task, line, code=1):
    return sym("slurm.task_exit", "user_error", f"srun: error: {node}: task {task}: Exited with exit code {code}",
               node=node, rank=task, line=line, priority=22, exitcode=code)


def test_without_times_srun_exit_order_names_the_first_failing_node():
    exc = sym("python.exception", "user_error", "6: [rank6]: KeyError: 'labels'", rank=6, node="n2", line=4, priority=20)
    net = sym("nccl.ib_completion_error", "network", "n1:1:2 [0] NCCL WARN NET/IB : Got completion from peer 10.0.0.2<1> with status=12",
              node="n1", path="nodes/n1/nccl/x.log", priority=62)
    exits = [_srun_exit("n2", 6, 20), _srun_exit("n1", 1, 21, code=134)]
    o = firstfailure.order([net, exc], [net, exc] + exits, JOB)
    assert o.first is exc and o.later == [net] and o.how == "srun exit order"


def test_near_miss_srun_names_the_other_node_first():
    exc = sym("python.exception", "user_error", "6: [rank6]: KeyError: 'labels'", rank=6, node="n2", line=4, priority=20)
    net = sym("nccl.ib_completion_error", "network", "n1:1:2 [0] NCCL WARN NET/IB : Got completion from peer 10.0.0.2<1> with status=12",
              node="n1", path="nodes/n1/nccl/x.log", priority=62)
    exits = [_srun_exit("n1", 1, 20), _srun_exit("n2", 6, 21)]
    o = firstfailure.order([net, exc], [net, exc] + exits, JOB)
    assert o.first is net and o.later == []  # a program error on the other node is not an echo: the tier decides


def test_vote_on_an_unmapped_address_names_no_reporter_as_culprit():
    # No node_addrs and no NCCL INFO lines: the address every failing connection shares is still
    # the suspect, and the nodes that merely reported it are not.
    syms = [ib("n1", "10.9.9.9", 1), ib("n2", "10.9.9.9", 2), ib("n3", "10.9.9.9", 3)]
    v = decide({**JOB, "nodes": ["n1", "n2", "n3", "n4"]}, syms, [])
    assert v.cause == "network" and v.culprit_nodes == []
    [vote] = [s for s in v.symptoms if s.id == "net.peer_vote"]
    assert vote.fields["addresses"] == ["10.9.9.9"] and "10.9.9.9" in v.summary


def test_near_miss_the_same_errors_with_the_address_mapped_name_the_node():
    syms = [ib("n1", "10.9.9.9", 1), ib("n2", "10.9.9.9", 2), ib("n3", "10.9.9.9", 3)]
    v = decide({**JOB, "nodes": ["n1", "n2", "n3", "n4"], "node_addrs": {"n4": ["10.9.9.9"]}}, syms, [])
    assert v.cause == "network" and v.culprit_nodes == ["n4"] and not v.ambiguous


def test_a_kernel_line_an_earlier_job_owns_is_context_and_never_drains():
    from slurm_attr.drain import candidates
    old = sym("gpu.xid_79", "gpu_hardware", "May 02 09:30:00 n2 kernel: NVRM: Xid (PCI:0000:3b:00): 79", trusted=True,
              node="n2", priority=98, action="reboot", attributed_to="4100")
    exc = sym("python.exception", "user_error", "6: [rank6]: KeyError: 'labels'", rank=6, node="n2", priority=20)
    v = decide(JOB, [old, exc], CLEAN)
    assert v.cause == "user_error" and candidates(v) == []
    [x] = [s for s in v.symptoms if s.id == "gpu.xid_79"]
    assert x.role == "context" and "4100" in x.status.earlier
    # near-miss: the same line owned by no one is this job's fault
    fresh = sym("gpu.xid_79", "gpu_hardware", "May 02 09:30:00 n2 kernel: NVRM: Xid (PCI:0000:3b:00): 79", trusted=True,
                node="n2", priority=98, action="reboot")
    v = decide(JOB, [fresh, exc], CLEAN)
    assert v.cause == "gpu_hardware" and [c[0] for c in candidates(v)] == ["n2"]


ADDRS5 = {f"n{i}": [f"10.0.0.{i}"] for i in range(1, 6)}


def _voted(pairs):
    job = {**JOB, "nodes": list(ADDRS5), "node_addrs": ADDRS5}
    syms = [ib(a, ADDRS5[b][0], i) for i, (a, b) in enumerate(pairs)]
    netloc.resolve_peers(syms, netloc.AddressBook(job, job["nodes"]))
    return netloc.vote(syms)


def test_vote_tolerates_one_teardown_pair_among_many():
    v = _voted([("n1", "n3"), ("n2", "n3"), ("n4", "n3"), ("n5", "n3"), ("n1", "n2")])
    assert v.winners == ["n3"] and v.tally["n3"] == 4


def test_vote_near_miss_no_clear_majority_names_no_one():
    v = _voted([("n1", "n3"), ("n2", "n3"), ("n1", "n2"), ("n4", "n5")])
    assert v.winners == []


def test_a_hang_whose_failing_connections_share_a_node_says_so_without_blaming_it():
    job = {**JOB, "nodes": ["n1", "n2", "n3"], "node_addrs": {"n1": ["10.0.0.1"], "n2": ["10.0.0.2"], "n3": ["10.0.0.3"]}}
    closed = [sym("nccl.remote_closed", "network", f"{a}:1:2 [0] misc/socket.cc:49 NCCL WARN socketProgress: Connection closed by remote peer n2<4000{i}>",
                  role="cascade", node=a, line=i, peer=f"n2<4000{i}>", peer_host="n2") for i, a in enumerate(["n1", "n3", "n1"])]
    hang = [sym("torch.watchdog_timeout", "comm_hang", "[rank0]:[E502 10:10:03.1 1 ProcessGroupNCCL.cpp:616] Watchdog caught", role="cascade", rank=0, line=9)]
    v = decide(job, closed + hang, [])
    assert v.cause == "comm_hang" and v.culprit_nodes == [] and "all involve n2" in v.summary
    v = decide(job, closed[:1] + hang, [])  # near-miss: one connection names no node
    assert v.cause == "comm_hang" and "all involve" not in v.summary


def test_a_naive_job_window_reads_zoned_lines_as_wall_clock():
    # A hand-made job.json without offsets: a journalctl line in +00:00 is not moved two hours
    # away from a naive window (which would make a fresh Xid look stale).
    from slurm_attr.reason.timeline import clock_of, parse_iso
    job = {"start_time": "2024-05-02T09:00:00", "end_time": "2024-05-02T10:00:00"}
    clock = clock_of(job)
    assert line_time("2024-05-02T09:30:00+02:00 n1 kernel: NVRM: Xid", clock) == parse_iso(job["start_time"], clock) + 1800


def _root_cause(rank, host, when, line):
    text = (f"Root Cause (first observed failure):\n[0]:\n  time      : {when}\n  host      : {host}\n"
            f"  rank      : {rank} (local_rank: {rank % 4})\n  exitcode  : 1 (pid: 4242)")
    s = sym("torch.root_cause", "user_error", "", rank=rank, node=host, line=line, priority=35, exitcode=1)
    s.evidence = [Evidence(source="stdout", path="output/stdout", line=line + i, text=t) for i, t in enumerate(text.split("\n"))]
    return s


def test_torchrun_root_cause_blocks_time_the_ranks_they_name():
    # rank 6's traceback, its node's torchrun block; minutes later rank 3's traceback and its block
    b = sym("python.exception", "user_error", "6: [rank6]: KeyError: 'labels'", rank=6, node="n2", line=5, priority=20)
    a = sym("python.exception", "user_error", "3: [rank3]: ValueError: shapes do not match", rank=3, node="n1", line=50, priority=20)
    blocks = [_root_cause(6, "n2", "2024-05-02_10:00:01", 40), _root_cause(3, "n1", "2024-05-02_10:02:30", 60)]
    v = decide(JOB, [a, b] + blocks, [])
    assert v.cause == "user_error" and v.culprit_ranks == [6]
    v = decide(JOB, [a, b], [])  # near-miss: without the blocks nothing orders the two ranks
    assert v.culprit_ranks == [3, 6]


def test_a_program_xid_does_not_confirm_a_hardware_claim():
    ecc = sym("cuda.ecc_uncorrectable", "gpu_hardware", "2: [rank2]: RuntimeError: CUDA error: uncorrectable ECC error encountered",
              rank=2, node="n1", priority=75)
    xid13 = sym("gpu.xid_13", "user_error", "May 02 09:40:00 n1 kernel: NVRM: Xid (PCI:0000:3b:00): 13, Graphics SM Warp Exception",
                trusted=True, node="n1", priority=50)
    v = decide(JOB, [ecc, xid13], CLEAN)
    assert v.cause == "user_error" and {s.status.claim for s in v.symptoms if s.id == "cuda.ecc_uncorrectable"} == {"contradicted"}
    xid48 = sym("gpu.xid_48", "gpu_hardware", "May 02 09:40:00 n1 kernel: NVRM: Xid (PCI:0000:3b:00): 48, An uncorrectable double bit error",
                trusted=True, node="n1", priority=90, action="reset")
    v = decide(JOB, [ecc, xid48], CLEAN)  # near-miss: a real ECC Xid confirms it
    assert v.cause == "gpu_hardware" and {s.status.claim for s in v.symptoms if s.id == "cuda.ecc_uncorrectable"} == {"confirmed"}


def test_nccl_init_lines_give_errors_from_nccl_files_their_rank():
    init = [sym("nccl.comm_rank", "network", f"n2:4242:4300 [{d}] NCCL INFO comm 0x55d2 rank {4 + d} nranks 8 cudaDev {d} busId 5e000 - Init COMPLETE",
                role="context", node="n2", host="n2", cuda_dev=d, nranks=8, rank=None) for d in range(4)]
    for d, s in enumerate(init):
        s.rank = 4 + d
    sub = sym("nccl.comm_rank", "network", "n2:4242:4400 [1] NCCL INFO comm 0x66aa rank 0 nranks 2 cudaDev 1", role="context",
              node="n2", host="n2", cuda_dev=1, nranks=2)
    sub.rank = 0  # a sub-communicator's rank: ignored
    err = sym("nccl.ib_completion_error", "network", "n2:4242:4390 [1] NCCL WARN NET/IB : Got completion from peer 10.0.0.1<1> with status=12",
              node="n2", host="n2", cuda_dev=1, path="nodes/n2/nccl/x.log")
    other = sym("nccl.ib_completion_error", "network", "n9:1:2 [1] NCCL WARN NET/IB : Got completion", node=None, host="n9", cuda_dev=1)
    netloc.assign_ranks(init + [sub, err, other])
    assert err.rank == 5 and other.rank is None  # near-miss: a host the init lines never named


def test_a_fault_after_the_job_ended_is_not_its_cause_but_still_drains():
    from slurm_attr.drain import candidates
    exc = sym("python.exception", "user_error", "1: [rank1]: AssertionError: loss is nan", rank=1, node="n1", priority=20)
    late = sym("gpu.xid_79", "gpu_hardware", "May 02 10:24:00 n2 kernel: NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.",
               trusted=True, node="n2", priority=98, action="reboot")
    v = decide(JOB, [exc, late], CLEAN)  # the job ended at 10:20 (local)
    assert v.cause == "user_error" and [c[0] for c in candidates(v)] == ["n2"]
    assert [s.status.after_end for s in v.symptoms if s.id == "gpu.xid_79"] == [True]
    during = sym("gpu.xid_79", "gpu_hardware", "May 02 10:19:00 n2 kernel: NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.",
                 trusted=True, node="n2", priority=98, action="reboot")
    v = decide(JOB, [exc, during], CLEAN)  # near-miss: during the job, with an untimed exception: the Xid decides
    assert v.cause == "gpu_hardware"


def test_a_kernel_event_on_another_node_within_the_margin_came_with_the_teardown_srun_started():
    """The program's error on n2, srun's first exit on n2; an Xid on n1 30 s later, within the
    kernel clocks' margin: it came with the teardown (still drains: its action is kept)."""
    exc = sym("cuda.error", "user_error", "5: [rank5]:[E502 10:00:09.2 1 x.cpp:1] ValueError: bad shape", rank=5, node="n2")
    xid = sym("gpu.xid_79", "gpu_hardware", "May 02 10:00:40 n1 kernel: NVRM: Xid (PCI:0000:3b:00): 79", trusted=True, node="n1",
              priority=98, action="drain")
    o = firstfailure.order([exc, xid], [exc, xid, _srun_exit("n2", 5, 20)], JOB)
    assert o.first is exc and o.later == [xid] and xid.action == "drain"
    # near misses: srun's first exit on the Xid's node, or no exit order at all, for a failure on
    # the Xid's own node whose class a device fault raises: the tier decides
    for extra in ([_srun_exit("n1", 1, 20)], []):
        exc2 = sym("cuda.error", "user_error", "1: [rank1]:[E502 10:00:09.2 1 x.cpp:1] RuntimeError: CUDA error: unknown error",
                   rank=1, node="n1", exc="RuntimeError")
        xid2 = sym("gpu.xid_79", "gpu_hardware", "May 02 10:00:40 n1 kernel: NVRM: Xid (PCI:0000:3b:00): 79", trusted=True,
                   node="n1", priority=98)
        assert firstfailure.order([exc2, xid2], [exc2, xid2] + extra, JOB).later == []


def _xid79(node, when):
    return sym("gpu.xid_79", "gpu_hardware", f"May 02 {when} {node} kernel: NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.",
               trusted=True, node=node, priority=98, action="reboot")


def test_a_fault_the_kernel_clock_puts_just_before_an_own_failure_elsewhere_did_not_cause_it():
    """An Xid on n1 that n1's kernel clock puts 12 s before rank 5's ValueError on n2: a GPU fault
    reaches other nodes only through the collectives, so it did not raise that; the exception is
    the first failure and the Xid is the node's health (its drain is kept)."""
    from slurm_attr.drain import candidates
    exc = sym("python.exception", "user_error", "5: [rank5]:[E502 10:00:12.0 1 x.cpp:1] ValueError: bad shape", rank=5,
              node="n2", priority=20, exc="ValueError")
    v = decide(JOB, [exc, _xid79("n1", "10:00:00")], CLEAN)
    assert v.cause == "user_error" and v.culprit_nodes == ["n2"] and [c[0] for c in candidates(v)] == ["n1"]
    assert any("a fault on another node cannot have caused it" in r for r in v.reasoning)


@pytest.mark.parametrize("case", ["beyond_margin", "same_node_device_error", "first_hand_on_fault_node", "collective_borne"])
def test_near_misses_of_the_own_failure_the_fault_cannot_have_caused(case):
    exc = sym("python.exception", "user_error", "5: [rank5]:[E502 10:00:12.0 1 x.cpp:1] ValueError: bad shape", rank=5,
              node="n2", priority=20, exc="ValueError")
    xid = _xid79("n1", "10:00:00")
    extra = []
    if case == "beyond_margin":  # the kernel's clock puts the fault 90 s earlier: it came first
        xid = _xid79("n1", "09:58:42")
    elif case == "same_node_device_error":  # on the fault's node, as a device error: the fault's
        exc = sym("cuda.error", "user_error", "1: [rank1]:[E502 10:00:12.0 1 x.cpp:1] RuntimeError: CUDA error: unknown error",
                  rank=1, node="n1", priority=20, exc="RuntimeError")
    elif case == "first_hand_on_fault_node":  # a rank on the fault's node failed first-hand before
        extra = [sym("cuda.launch_failure", "gpu_hardware", "2: [rank2]:[E502 10:00:05.0 1 x.cpp:1] CUDA error: unspecified launch failure",
                     rank=2, node="n1", priority=70, line=3)]
    elif case == "collective_borne":  # a loss check that an all-reduce's non-finite values set off
        exc = sym("train.nonfinite_loss", "user_error", "5: [rank5]:[E502 10:00:12.0 1 x.cpp:1] loss is nan, stopping",
                  rank=5, node="n2", priority=20)
    v = decide(JOB, [exc, xid] + extra, CLEAN)
    assert v.cause == "gpu_hardware" and v.culprit_nodes == ["n1"]


def test_an_exception_no_device_fault_raises_is_the_programs_wherever_it_ran():
    """A ModuleNotFoundError printed without a launcher label, 13 s before an Xid by the clocks:
    no GPU fault raises it, so the Xid came with the teardown; near miss: a RuntimeError (what
    CUDA errors are raised as) in the same place leaves the Xid the cause."""
    exc = sym("python.exception", "user_error", "[E502 10:00:00.0 1 x.cpp:1] ModuleNotFoundError: No module named 'flash_attn'",
              priority=20, exc="ModuleNotFoundError")
    v = decide(JOB, [exc, _xid79("n1", "10:00:13")], CLEAN)
    assert v.cause == "user_error"
    exc = sym("python.exception", "user_error", "[E502 10:00:00.0 1 x.cpp:1] RuntimeError: CUDA error: unknown error",
              priority=20, exc="RuntimeError")
    assert decide(JOB, [exc, _xid79("n1", "10:00:13")], CLEAN).cause == "gpu_hardware"


def test_srun_exit_order_puts_an_untimed_own_failure_before_a_timed_echo_elsewhere():
    """A timed IB error on n1 (what a peer prints when the process at the other end died) and rank
    6's untimed AssertionError on n2, whose task srun says exited first: the exception came
    first. Near miss: srun's first exit on n1."""
    def case(first_exit_node):
        exc = sym("python.exception_bare", "user_error", "6: [rank6]: AssertionError", rank=6, node="n2", line=4, priority=20)
        net = sym("nccl.ib_completion_error", "network",
                  "[2024-05-02 10:00:01] n1:1:2 [0] NCCL WARN NET/IB : Got completion from peer 10.0.0.2<1> with status=12",
                  node="n1", path="nodes/n1/nccl/x.log", priority=62)
        exits = ([_srun_exit("n2", 6, 20), _srun_exit("n1", 1, 21, code=134)] if first_exit_node == "n2"
                 else [_srun_exit("n1", 1, 20, code=134), _srun_exit("n2", 6, 21)])
        return firstfailure.order([net, exc], [net, exc] + exits, JOB), exc, net
    o, exc, net = case("n2")
    assert o.first is exc and o.later == [net] and o.how.startswith("srun exit order")
    o, exc, net = case("n1")
    assert o.first is net
