"""What a job's ranks can make the root watcher hold, wait for and write (issue 21): the
worker-server client's rounds (workerclient.py), the bounded FR decoding (frjson.py) and the
node's share of the live spool (budget.py), each against a hostile reply and beside the
near miss of an ordinary one."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

import pytest

from slurm_attr.live import budget, dumps, frjson, workerclient

UID = os.getuid()
GOOD = {"entries": [{"collective_seq_id": 4, "pg_id": 0, "retired": False, "state": "scheduled",
                     "profiling_name": "gloo:all_reduce", "input_sizes": [[8]]}],
        "pg_status": {"0": {"last_enqueued_collective": "4", "last_completed_collective": "3"}}}


SERVERS = os.path.join(os.path.dirname(__file__), "worker_servers.py")


class Servers:
    """The job's worker servers, in a process of their own (worker_servers.py)."""

    def __init__(self, d: str):
        self.d, self.proc = d, None

    def add(self, rank: int, body: bytes | None, length: bool = True) -> None:
        suffix = ".never" if body is None else "" if length else ".nolength"
        with open(f"{self.d}/reply_{rank}{suffix}", "wb") as f:
            f.write(body or b"")

    def start(self) -> str:
        self.proc = subprocess.Popen([sys.executable, SERVERS, self.d], stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout.readline().strip() == "ready"
        return self.d

    def requests(self, rank: int) -> list[bytes]:
        try:
            with open(f"{self.d}/requests_{rank}", "rb") as f:
                return f.read().splitlines()
        except FileNotFoundError:
            return []

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def servers():
    d = tempfile.mkdtemp(prefix="sattr-b-", dir="/tmp")  # sun_path is 108 bytes
    os.mkdir(f"{d}/ws")
    s = Servers(d)
    yield s
    s.stop()
    subprocess.run(["rm", "-rf", d], check=False)


# ---- frjson: decoded within a budget ----------------------------------------------------------
def test_a_flat_16_mib_reply_is_refused_before_it_is_decoded():
    flat = b'{"entries":[' + b",".join([b"{}"] * (16 * 1024 * 1024 // 3 - 10)) + b"]}"
    with pytest.raises(frjson.FrReplyError, match="JSON objects, over the watcher's cap of 250000"):
        frjson.decode(flat)
    # near miss: a 2000-entry ring, as torch writes it, decodes
    ring = json.dumps({"entries": [dict(GOOD["entries"][0], collective_seq_id=i, retired=True)
                                   for i in range(1, 2001)]}).encode()
    assert frjson.status(frjson.decode(ring)) == {"0": [2000, 2000]}


def test_depth_in_a_field_nobody_reads_is_refused_or_skipped_never_a_crash():
    """msgspec skips an unknown field; how deep it may go depends on the Python (3.11: the
    interpreter's recursion limit; 3.14 skips it without recursing): refused, or decoded."""
    body = b'{"x":' + b"[" * 200000 + b"]" * 200000 + b',"entries":[{"collective_seq_id":3,"pg_id":0,"retired":true}]}'
    try:
        doc = frjson.decode(body)
    except frjson.FrReplyError as err:
        assert str(err) == "nested too deep to decode"
    else:
        assert frjson.status(doc) == {"0": [3, 3]}


@pytest.mark.parametrize("body", [
    b'{"entries":' + b"[" * 200000 + b"]" * 200000 + b"}",  # deep where entries are
    b'{"entries":[{"collective_seq_id":true}]}',  # a bool is not a sequence number
    b'{"entries":[{"collective_seq_id":1,"pg_id":[1]}]}',
    b"\xff\xfe not json",
])
def test_hostile_shapes_are_one_refused_reply(body):
    with pytest.raises(frjson.FrReplyError):
        frjson.decode(body)


def test_real_fields_and_unknown_ones():
    doc = frjson.decode(json.dumps(dict(GOOD, frames=[{"name": "f"}] * 10, version="2.10")).encode())
    assert (frjson.status(doc), frjson.pending(doc)) == ({"0": [4, 0]}, "gloo:all_reduce #4")


# ---- workerclient: one deadline, memory admitted, peers checked ------------------------------
def test_slow_servers_cost_one_timeout_not_one_each(servers):
    for r in range(32):
        servers.add(r, None)  # accept, never answer
    d = servers.start()
    t0 = time.monotonic()
    res = dumps.collect(d, dumps.Limits(UID, max_sockets=64, timeout_s=10), lambda *a: None)
    took = time.monotonic() - t0
    assert len(res["ranks"]) == 32 and all(r["fr_error"] == "no complete reply in time" for r in res["ranks"].values())
    # 64 requests of 3 s each, together: one request's time, far from 64 x 3 s
    assert took < 10, took


def test_sockets_over_the_cap_are_not_asked_and_said_so(servers):
    for r in range(6):
        servers.add(r, json.dumps(GOOD).encode())
    got, problems = dumps.poll_fr(servers.start(), dumps.Limits(UID, max_sockets=4))
    assert sorted(got) == [0, 1, 2, 3] and problems == ["2 socket(s) over the node's cap of 4 not asked"]
    assert got[0] == {"pg": {"0": [4, 0]}, "pend": "gloo:all_reduce #4"}
    assert servers.requests(5) == [] and servers.requests(3) == [b"POST /handler/fr_trace_json HTTP/1.1"]


def test_replies_wait_for_the_memory_budget_and_are_all_read(servers):
    """Four 1 MiB replies, 2.5 MiB held at most: never more than two at once, and all four read."""

    class Watched(workerclient.Fetch):
        peak = 0

        def _admit(self) -> None:
            super()._admit()
            self.peak = max(self.peak, self.held)

    for r in range(4):
        servers.add(r, b"x" * (1 << 20))
    got: list = []
    with workerclient.Sockets(servers.start(), UID) as ss:
        targets = {(r, "fr_trace_json"): p for r, p in ss.ranks.items()}
        f = Watched(targets, uid=UID, deadline=time.monotonic() + 5, caps={"fr_trace_json": 2 << 20},
                    held_cap=int(2.5 * (1 << 20)),
                    on_reply=lambda rep: got.append(len(rep.data) if rep.data is not None else rep.error))
        f.run()
    assert got == [1 << 20] * 4 and 0 < f.peak <= 2 << 20, (got, f.peak)


def test_a_reply_bigger_than_the_budget_is_refused_at_its_headers(servers):
    servers.add(0, b"y" * (3 << 20))
    servers.add(1, b"z" * (3 << 20), length=False)  # no Content-Length: read to its cap, then refused
    got: dict = {}
    with workerclient.Sockets(servers.start(), UID) as ss:
        workerclient.Fetch({(r, "fr_trace_json"): p for r, p in ss.ranks.items()}, uid=UID,
                           deadline=time.monotonic() + 5, caps={"fr_trace_json": 2 << 20}, held_cap=64 << 20,
                           on_reply=lambda rep: got.__setitem__(rep.key[0], rep)).run()
    assert got[0].error == f"reply of {3 << 20} bytes is over the {2 << 20}-byte cap"
    assert got[1].error == f"reply over the {2 << 20}-byte cap"


def test_a_server_of_another_step_gets_no_request(servers):
    servers.add(0, json.dumps(GOOD).encode())
    d = servers.start()
    seen: list[int] = []

    def not_ours(pid: int) -> str:
        seen.append(pid)
        return f"served by process {pid}, not of this step"

    got, _ = dumps.poll_fr(d, dumps.Limits(UID, owner=not_ours))
    assert seen == [servers.proc.pid]  # the peer's pid, from the kernel
    assert got == {0: {"error": f"served by process {servers.proc.pid}, not of this step"}}
    deadline = time.monotonic() + 10
    while not os.path.exists(f"{d}/requests_0") and time.monotonic() < deadline:  # the server's thread, under load
        time.sleep(0.05)
    assert servers.requests(0) == [b""]  # the connection closed, nothing sent
    # near miss: the step check agrees -> the reply is read
    got, _ = dumps.poll_fr(d, dumps.Limits(UID, owner=lambda pid: None))
    assert got[0]["pend"] == "gloo:all_reduce #4"


def test_a_poll_of_hostile_replies_records_why_per_rank(servers):
    servers.add(0, b'{"entries":' + b"[" * 200000 + b"]" * 200000 + b"}")
    servers.add(1, b'{"entries":[' + b",".join([b"{}"] * 300000) + b"]}")
    servers.add(2, json.dumps(GOOD).encode())
    got, _ = dumps.poll_fr(servers.start(), dumps.Limits(UID))
    assert got[0]["error"].startswith("not a Flight Recorder document")
    assert got[1]["error"] == "300001 JSON objects, over the watcher's cap of 250000"
    assert got[2] == {"pg": {"0": [4, 0]}, "pend": "gloo:all_reduce #4"}


# ---- budget: the node's share of the job's live spool ------------------------------------------
NOW = time.time()


def _put(live: str, rel: str, size: int, age_s: float) -> None:
    path = os.path.join(live, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(b"d" * size)
    os.utime(path, (NOW - age_s, NOW - age_s))


def test_share_is_the_smaller_of_the_node_cap_and_the_jobs_part():
    assert budget.share(1 << 30, 128 << 20, 1) == 128 << 20
    assert budget.share(1 << 30, 128 << 20, 512) == 2 << 20


def test_older_dumps_go_first_then_the_largest_and_never_the_collections_own(tmp_path):
    live = str(tmp_path)
    _put(live, "dumps/0/nodes/n1/fr/nccl_trace_rank_0.json", 300, age_s=100)  # oldest
    _put(live, "dumps/1/nodes/n1/fr/nccl_trace_rank_0.json", 200, age_s=50)
    _put(live, "dumps/1/nodes/n1/stacks/rank_0.txt", 400, age_s=50)  # as old, larger: before the 200
    _put(live, "dumps/0/nodes/n2/fr/nccl_trace_rank_9.json", 5000, age_s=200)  # another node's: not ours
    _put(live, "summary/0/n1.json", 100, age_s=0)  # counted, never dropped
    b = budget.NodeBudget.read(live, "n1", cap=1200)
    assert b.used() == 1000
    assert b.room_for("dumps/2/nodes/n1/fr/nccl_trace_rank_0.json", 500)  # 300 must go: the oldest
    assert not os.path.exists(f"{live}/dumps/0/nodes/n1/fr/nccl_trace_rank_0.json")
    assert os.path.exists(f"{live}/dumps/1/nodes/n1/stacks/rank_0.txt")
    b.wrote("dumps/2/nodes/n1/fr/nccl_trace_rank_0.json", 500, time.time_ns())
    assert b.room_for("dumps/2/nodes/n1/fr/nccl_trace_rank_1.json", 300)  # the larger of the two as old
    assert not os.path.exists(f"{live}/dumps/1/nodes/n1/stacks/rank_0.txt")
    assert os.path.exists(f"{live}/dumps/1/nodes/n1/fr/nccl_trace_rank_0.json")
    b.wrote("dumps/2/nodes/n1/fr/nccl_trace_rank_1.json", 300, time.time_ns())
    # what this collection wrote is never dropped for more of it: 1100 used, 200 droppable
    assert not b.room_for("dumps/2/nodes/n1/fr/nccl_trace_rank_2.json", 400)
    assert os.path.exists(f"{live}/dumps/1/nodes/n1/fr/nccl_trace_rank_0.json")  # nothing dropped for nothing
    assert [d.split(" (")[0] for d in b.dropped] == ["n1/fr/nccl_trace_rank_0.json of step 0",
                                                     "n1/stacks/rank_0.txt of step 1"]
    assert os.path.getsize(f"{live}/dumps/0/nodes/n2/fr/nccl_trace_rank_9.json") == 5000


def test_a_collection_over_the_nodes_budget_keeps_what_fits_and_says_what_not(servers, tmp_path):
    from slurm_attr.config import Live
    from slurm_attr.live.prekill.exchange import NodeDumps, req_name
    from slurm_attr.live import livespool

    big = json.dumps(dict(GOOD, pad="p" * (3 << 20))).encode()  # 3 MiB FR each
    for r in range(4):
        servers.add(r, big)
    d = servers.start()
    (tmp_path / "spool").mkdir()
    live = livespool.ensure_job_dir(str(tmp_path / "spool"), "55")
    nd = NodeDumps(live, "55", "0", "n1", d, Live(node_cap_bytes=8 << 20), nnodes=1)
    livespool.write_json(live, "", req_name("0"), {"job": "55", "step": "0", "seq": 1, "reason": "hang"})
    res = nd.serve()
    kept = sorted(os.listdir(f"{live}/dumps/0/nodes/n1/fr"))
    assert len(kept) == 2, kept  # 2 x 3 MiB fit in 8 MiB; the stacks' 404s are not saved
    dropped = [r for r, row in res["ranks"].items() if "fr_dropped" in row]
    assert len(dropped) == 2 and "over this node's live budget for the job" in res["ranks"][dropped[0]]["fr_dropped"]
    assert res["budget"]["cap"] == 8 << 20 and res["budget"]["used"] <= 8 << 20


def test_sattr_live_says_what_the_budget_did_not_keep_and_what_was_cancelled():
    from slurm_attr.live import findings
    from slurm_attr.live.prekill.exchange import summarize

    res = [{"job": "5", "node": "n1", "seq": 1, "time_ns": 2_000_000_000, "pipes": {},
            "ranks": {"3": {"fr_dropped": "not kept: 16777216 bytes over this node's live budget for the job "
                                          "(134217728 of 134217728 bytes used)", "stack": None}},
            "budget": {"dropped": ["n1/fr/nccl_trace_rank_9.json of step 1 (16777216 bytes, older)"]}}]
    s = summarize(res, {"seq": 1, "reason": "hang", "time_ns": 1_000_000_000}, 1)
    assert s["dropped"] == ["n1: FR of rank 3 not kept: 16777216 bytes over this node's live budget for the job "
                            "(134217728 of 134217728 bytes used)",
                            "n1: removed to make room: n1/fr/nccl_trace_rank_9.json of step 1 (16777216 bytes, older)"]
    f = {"class": "H0", "what": "every rank entered x #7 and none completes", "label": "pg 0", "dumps": s,
         "cancel": {"done": True, "target": "465_6", "why": "Flight Recorder: 2 rank(s) ..."}}
    out = findings.lines({"findings": [f]})
    assert "    n1: FR of rank 3 not kept: 16777216 bytes over this node's live budget" in "\n".join(out)
    assert "  cancelled 465_6: Flight Recorder: 2 rank(s) ..." in out
    # near misses: a refused cancel says why; a collection that kept everything says nothing more
    f["cancel"] = {"done": False, "refused": "job 465 is COMPLETING, not RUNNING", "why": "stacks: 2 rank(s)"}
    f["dumps"] = summarize([dict(res[0], ranks={}, budget={})], {"seq": 1, "reason": "hang", "time_ns": 1}, 1)
    out = findings.lines({"findings": [f]})
    assert out[1:] == [f"  {findings.dump_line(f['dumps'])}",
                       "  not cancelled: Slurm's record no longer matched (job 465 is COMPLETING, not RUNNING); "
                       "stacks: 2 rank(s)"]
