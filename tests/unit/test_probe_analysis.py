"""The probe's rules on synthetic records: what each must find, and the near misses it must not."""
from __future__ import annotations

from datetime import datetime, timezone

from slurm_attr.bundle import Bundle
from slurm_attr.config import Config
from slurm_attr.probe import analyze
from slurm_attr.probe import layout as L
from slurm_attr.probe.synth import SlotSpec, record_bytes, write_bundle

AR, AG = 4, 2
WORLD = 0x9E3779B97F4A7C15
RT0 = 1_700_000_000_000_000_000
LAST = 5_000_000_000  # monotonic ns of every rank's last event


def _spec(r: int, n: int, **kw) -> SlotSpec:
    """A rank of a healthy-looking ring: 10 AllReduce launched, the 10th (seq 9) hanging on the GPU."""
    base = dict(comm_hash=WORLD, rank=r, nranks=n, name="world", launched={AR: 10}, op_count=10,
                ops=[(o, AR, 1 << 20, 8, -1, o) for o in range(10)], digest=1, kernel=(AR, 9),
                inflight=3, api=(10, 10, 10, 10), last_ns=LAST)
    base.update(kw)
    return SlotSpec(**base)


def _job(tmp_path, n: int = 8, per_node: int = 2, tweak=None, skip=(), end_s: float | None = None,
         ranks_map: dict | None = None) -> Bundle:
    recs = {}
    for r in range(n):
        if r in skip:
            continue
        kw = tweak(r) if tweak else {}
        recs[(f"n{r // per_node}", r)] = record_bytes(r, [_spec(r, n, **(kw or {}))], pid=100 + r,
                                                      node=f"n{r // per_node}", rt_ns=RT0, mono_ns=1)
    job = {"job_id": "7", "ranks": ranks_map or {str(r): f"n{r // per_node}" for r in range(n)}}
    if end_s is not None:
        end = (RT0 + LAST - 1) / 1e9 + end_s
        job["end_time"] = datetime.fromtimestamp(end, tz=timezone.utc).isoformat()
    write_bundle(str(tmp_path), recs, job)
    return Bundle(str(tmp_path))


def _run(bundle):
    return analyze(bundle, Config())


def _named(symptoms, sid):
    return sorted(s.rank for s in symptoms if s.id == sid)


def _nonentry_victim(victim: int):
    def tweak(r):
        if r == victim:  # launched AllReduce up to seq 8, nothing on the GPU
            return dict(launched={AR: 9}, op_count=9, ops=[(o, AR, 1 << 20, 8, -1, o) for o in range(9)],
                        kernel=(AR, 8), inflight=0, api=(9, 9, 9, 9))
        return {}
    return tweak


# ---- probe.non_entry ---------------------------------------------------------------------
def test_non_entry_names_the_rank_and_explains(tmp_path):
    symptoms, coverage = _run(_job(tmp_path, tweak=_nonentry_victim(3)))
    (s,) = symptoms
    assert (s.id, s.cause, s.rank, s.node, s.trusted, s.action, s.role) == (
        "probe.non_entry", "rank_stuck", 3, "n1", False, "none", "root")
    assert s.fields["func"] == "AllReduce" and s.fields["seq"] == 9 and s.fields["comm_rank"] == 3
    assert s.fields["waiting_ranks"] == [0, 1, 2, 4, 5, 6, 7] and s.fields["in_api"] is False
    assert "never launched AllReduce #9" in s.summary and "stuck on the CPU side" in s.summary
    assert {e.source for e in s.evidence} == {"probe"}
    assert s.evidence[0].path.startswith("nodes/n1/probe/rank3.")
    assert all(c.status == "ok" for c in coverage)


def test_non_entry_inside_nccl(tmp_path):
    def tweak(r):
        kw = _nonentry_victim(3)(r)
        if r == 3:
            kw["api"] = (10, 9, 10, 10)  # ncclGroupEnd of the 10th never returned
        return kw
    (s,) = _run(_job(tmp_path, tweak=tweak))[0]
    assert s.fields["in_api"] is True and "inside an NCCL call" in s.summary


def test_lagging_launch_without_a_hang_is_not_non_entry(tmp_path):
    # killed mid-flight: rank 3 had simply not reached the 10th yet, nobody was waiting in it
    def tweak(r):
        kw = _nonentry_victim(3)(r)
        if r != 3:
            kw.update(kernel=(AR, 9), inflight=0, kernel_done=(AR, 9))
        return kw
    assert _run(_job(tmp_path, tweak=tweak))[0] == []


def _copy_engine_job(victim: int, after: bool = False):
    """NCCL 2.29+ running AllGather on the copy engines: no kernel channels, no completion.
    The victim launched 9 of them; the others 10, the 10th their newest launch unless
    ``after`` (then each launched a kernel AllReduce after it, which completed: they were
    not sitting in the AllGather)."""
    def tweak(r):
        n = 9 if r == victim else 10
        ops = [(o, AG, 1 << 20, 10, -1, o) for o in range(n)]
        kw = dict(launched={AG: n}, op_count=n, ops=ops, kernel=None, inflight=0, ce_tasks=n,
                  algo=L.AL_CE, api=(n, n, n, n))
        if after and r != victim:
            kw.update(launched={AG: n, AR: 1}, op_count=n + 1, ops=ops + [(n, AR, 8, 8, -1, 0, 2)],
                      kernel=(AR, 0), kernel_done=(AR, 0), api=(n + 1,) * 4)
        return kw
    return tweak


def test_non_entry_in_a_copy_engine_collective(tmp_path):
    symptoms, _ = _run(_job(tmp_path, tweak=_copy_engine_job(5), end_s=30))
    (s,) = symptoms
    assert (s.id, s.rank, s.fields["func"], s.fields["seq"]) == ("probe.non_entry", 5, "AllGather", 9)
    assert s.fields["waiting_ranks"] == [0, 1, 2, 3, 4, 6, 7]
    assert any("10 by the copy engines" in e.text for e in s.evidence)


def test_copy_engine_collective_launched_past_is_not_non_entry(tmp_path):
    # near miss: the others went on past AllGather #9 (an AllReduce on the GPU, done), so
    # they were not waiting in it
    assert _run(_job(tmp_path, tweak=_copy_engine_job(5, after=True), end_s=30))[0] == []


def test_a_majority_behind_is_not_blamed(tmp_path):
    assert _named(_run(_job(tmp_path, tweak=lambda r: _nonentry_victim(r)(r) if r < 5 else {}))[0],
                  "probe.non_entry") == []


def test_end_time_gates_a_fresh_stall(tmp_path):
    assert _run(_job(tmp_path / "a", tweak=_nonentry_victim(3), end_s=0.5))[0] == []
    (s,) = _run(_job(tmp_path / "b", tweak=_nonentry_victim(3), end_s=600))[0]
    assert abs(s.fields["stalled_s"] - 600) < 1 and s.time.startswith("2023-11-14T")


# ---- probe.inconsistent --------------------------------------------------------------------
def test_inconsistent_count(tmp_path):
    def tweak(r):
        if r == 5:
            return dict(ops=[(o, AR, (1 << 19) if o == 9 else (1 << 20), 8, -1, o) for o in range(10)], digest=2)
        return {}
    (s,) = _run(_job(tmp_path, tweak=tweak))[0]
    assert (s.id, s.cause, s.rank, s.node) == ("probe.inconsistent", "collective_mismatch", 5, "n2")
    assert s.fields["position"] == 9 and s.fields["ambiguous"] is False
    assert "count 524288" in s.fields["issued"] and "count 1048576" in s.fields["expected"]
    assert s.fields["agreeing_ranks"] == [0, 1, 2, 3, 4, 6, 7]


def test_other_function_is_inconsistent_not_non_entry(tmp_path):
    # rank 5 called AllGather where the others called their 10th AllReduce: it "never
    # launched" AllReduce #9 too, but the mismatch is the explanation
    def tweak(r):
        if r == 5:
            return dict(launched={AR: 9, AG: 1}, ops=[(o, AG if o == 9 else AR, 1 << 20, 8, -1, 0 if o == 9 else o)
                                                       for o in range(10)], digest=2, kernel=(AG, 0))
        return {}
    symptoms = _run(_job(tmp_path, tweak=tweak))[0]
    assert [(s.id, s.rank) for s in symptoms] == [("probe.inconsistent", 5)]
    assert symptoms[0].fields["issued"].startswith("AllGather(")


def test_a_tie_is_ambiguous(tmp_path):
    def tweak(r):
        return dict(ops=[(o, AR, 7 if (o == 9 and r == 1) else 1 << 20, 8, -1, o) for o in range(10)], digest=r)
    (s,) = _run(_job(tmp_path, n=2, per_node=1, tweak=tweak))[0]
    assert s.rank == 1 and s.fields["ambiguous"] is True


def test_divergence_older_than_the_ring(tmp_path):
    # same count of collectives, same recent ring, another history digest
    (s,) = _run(_job(tmp_path, tweak=lambda r: dict(digest=99) if r == 6 else {}))[0]
    assert (s.id, s.rank, s.fields["position"]) == ("probe.inconsistent", 6, None)


# ---- probe.link_stall ------------------------------------------------------------------------
def _ring_peers(r: int, n: int, stuck_src: int | None, net=lambda a, b: a // 2 != b // 2):
    """Each rank sends to r+1 and receives from r-1, over the network across nodes."""
    peers = []
    nxt, prv = (r + 1) % n, (r - 1) % n
    if net(r, nxt):
        wait = (0, 0, 1, 0, 0, 0) if r == stuck_src else (0,) * 6
        peers.append({"peer": nxt, "kind": L.PK_NET_SEND, "send_posted": 120, "send_done": 119 if r == stuck_src else 120,
                      "wait": wait, "last_ch": 1, "last_send_ms": 4000 if r == stuck_src else 4990})
    if net(prv, r):
        peers.append({"peer": prv, "kind": L.PK_NET_RECV, "recv_posted": 128, "recv_done": 120,
                      "wait": (0, 0, 0, 8, 0, 0), "last_recv_ms": 4990})
    return peers


def _link_tweak(stuck_src, n=8):
    def tweak(r):
        peers = _ring_peers(r, n, stuck_src)
        return dict(peers=peers, pop_started=4 if peers else 0,
                    in_state=tuple(sum(p.get("wait", (0,) * 6)[i] for p in peers) for i in range(6)))
    return tweak


def test_link_stall_names_both_ends(tmp_path):
    (s,) = _run(_job(tmp_path, tweak=_link_tweak(3)))[0]
    assert (s.id, s.cause, s.rank, s.node) == ("probe.link_stall", "network", 3, "n1")
    f = s.fields
    assert (f["src_rank"], f["dst_rank"], f["src_node"], f["dst_node"]) == (3, 4, "n1", "n2")
    assert f["channel"] == 1 and f["steps_stuck"] == 1 and f["receiver_waiting"] is True
    assert f["links_progressed_after"] == 3  # 1->2, 5->6, 7->0 completed sends after 3->4 froze
    assert "rank 3 (n1) -> rank 4 (n2)" in s.summary
    assert len(s.evidence) == 2


def test_link_stall_without_the_receivers_record(tmp_path):
    (s,) = _run(_job(tmp_path, tweak=_link_tweak(3), skip=(4,)))[0]
    assert s.fields["dst_rank"] is None and s.fields["dst_node"] is None
    assert "comm rank 4" in s.summary and s.fields["receiver_waiting"] is False


def test_sends_stuck_everywhere_are_not_one_link(tmp_path):
    def tweak(r):
        kw = _link_tweak(r)(r)  # every sender has a send stuck
        return kw
    assert _named(_run(_job(tmp_path, tweak=tweak))[0], "probe.link_stall") == []


def test_link_stall_gated_by_end_time(tmp_path):
    # the stuck send completed its last step 1 s before the end: a busy job killed, not a stall
    assert _run(_job(tmp_path / "a", tweak=_link_tweak(3), end_s=0.0))[0] == []
    assert _named(_run(_job(tmp_path / "b", tweak=_link_tweak(3), end_s=120))[0], "probe.link_stall") == [3]


# ---- node attribution and coverage --------------------------------------------------------------
def test_node_comes_from_where_the_record_was_collected(tmp_path):
    # under torchrun job.json's task map (by SLURM_PROCID) does not know framework ranks
    bundle = _job(tmp_path, tweak=_nonentry_victim(3), ranks_map={"3": "wrong-node"})
    (s,) = _run(bundle)[0]
    assert s.node == "n1"


def test_missing_ranks_are_reported_as_coverage(tmp_path):
    symptoms, coverage = _run(_job(tmp_path, skip=(6, 7)))
    assert symptoms == []
    (c,) = [c for c in coverage if c.status == "truncated"]
    assert "6 of 8" in c.detail and c.source == "probe"


def test_empty_bundle(tmp_path):
    (tmp_path / "job.json").write_text('{"job_id": "1"}')
    symptoms, coverage = _run(Bundle(str(tmp_path)))
    assert symptoms == [] and [(c.source, c.status) for c in coverage] == [("probe", "missing")]
