"""NCCL RAS as a second opinion on a hang (live/ras/opinion.py, live/ras/rasreport.py, prekill.cancel).

The reports are NCCL's as published (NCCL's RAS walkthrough for 2.30.7, NVIDIA/nccl issues
for 2.26.2 and 2.27.3, the user guide for 2.24) or rebuilt from its format strings
(tests/fixtures/ras/README.md). The RAS socket is a small TCP server on 127.0.0.1 that
answers the line protocol as NCCL's src/ras/client_support.cc does; no NCCL runs here.
"""
from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

import pytest
from unix_servers import RasServer

from slurm_attr.config import Config, ConfigError, from_dict
from slurm_attr.configcheck import host_port
from slurm_attr.live.prekill import exchange as prekill
from slurm_attr.live.ras import opinion as ras, rasreport
from slurm_attr.slurm.cli import CliSlurm

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "ras"
STRAGGLER_COMM = "78db921d1c117b4a"  # the walkthrough's straggler communicator
DEAD_COMM = "1bdb83b038775869"  # the walkthrough's exit-fault communicator


def _fix(name: str) -> str:
    return (FIX / name).read_text()


def _report(name: str) -> dict:
    r = rasreport.parse(_fix(name))
    assert "error" not in r, r
    return r


def _comm(r: dict, h: str) -> dict:
    [c] = [c for c in r["comms"] if c["hash"] == h]
    return c


# ---- the parser on published reports ------------------------------------------------------
def test_healthy_text_report_has_the_job_and_no_problem_communicator():
    r = _report("healthy_2.30.7.txt")
    assert (r["version"], r["nodes"], r["processes"], r["gpus"]) == ("2.30.7", 2, 8, 8)
    assert r["groups"] == [{"group": 0, "comms": 1, "nodes": 2, "ranks_per_comm": 8, "ranks": 8,
                            "status": "RUNNING", "errors": "OK"}]
    assert r["comms"] == [] and (r["missing_processes"], r["dead_processes"]) == (0, 0)
    assert ras.opinion(r, {"comm": STRAGGLER_COMM}) is None


def test_straggler_names_the_rank_behind_and_its_count():
    r = _report("straggler_2.30.7.txt")
    c = _comm(r, STRAGGLER_COMM)
    assert c["kinds"] == ["MISMATCH"]
    assert c["ops"] == {"AllReduce": [{"op": 64, "count": 7, "ranks": []}, {"op": 60, "count": 1, "ranks": [7]}]}
    line = ras.opinion(r, {"comm": STRAGGLER_COMM})
    assert line == ("NCCL RAS 2.30.7: communicator 78db921d1c117b4a MISMATCH: AllReduce: rank 7 at "
                    "operation 60 while 7 rank(s) launched up to 64")
    # near miss: the same report about another communicator (another job on the port) says nothing
    assert ras.opinion(r, {"comm": "0000000000000bad"}) is None


def test_a_job_with_a_dead_process_text_and_json():
    inc = _report("incomplete_2.30.7.txt")
    assert (inc["missing_processes"], inc["processes_named"]) == \
        (1, [{"pid": 3748990, "host": "node1", "gpus": "3", "state": "missing"}])
    c = _comm(inc, DEAD_COMM)
    assert (c["kinds"], c["missing"], c["missing_count"], c["hosts"]) == (["INCOMPLETE"], [7], 1, {"7": "node1"})
    assert ras.opinion(inc, {"comm": DEAD_COMM}).endswith("INCOMPLETE: rank 7 not answering")
    js = _report("dead_reconstructed.json")
    assert (js["form"], js["dead_processes"], js["processes"]) == ("json", 1, 7)
    assert ras.opinion(js, {"comm": DEAD_COMM}).endswith("rank 7 dead (unreachable for 60 s)")
    # near miss: 60 s later the survivors had torn the communicator down; only the job-wide DEAD
    # block is left, which names no communicator of ours: no opinion
    late = _report("dead_nocomms_2.30.7.txt")
    assert late["dead_processes"] == 1 and late["comms"] == []
    assert ras.opinion(late, {"comm": DEAD_COMM}) is None


def test_the_2_24_wording_of_a_missing_rank():
    r = _report("dead_2.24_excerpt.txt")
    c = _comm(r, "cf264af53edbe986")
    assert (c["size"], c["missing"], r["dead_processes"]) == (32, [21], 1)
    assert "rank 21 not answering" in ras.opinion(r, {"comm": "cf264af53edbe986"})


def test_json_counts_that_differ_and_a_healthy_json_report():
    r = _report("straggler_reconstructed.json")
    c = _comm(r, STRAGGLER_COMM)
    assert c["ops"]["AllReduce"] == [{"op": 64, "count": 7, "ranks": [0, 1, 2, 3, 4, 5, 6]},
                                     {"op": 60, "count": 1, "ranks": [7]}]
    assert "Broadcast" not in c["ops"]  # every rank at 1: consistent
    assert "AllReduce: rank 7 at operation 60" in ras.opinion(r, {"comm": STRAGGLER_COMM})
    ok = _report("healthy_reconstructed.json")
    assert _comm(ok, STRAGGLER_COMM)["kinds"] == [] and ras.opinion(ok, {"comm": STRAGGLER_COMM}) is None


def test_errors_and_an_aborted_rank():
    r = _report("error_abort_reconstructed.txt")
    c = _comm(r, "5f1e2d3c4b5a6978")
    assert (c["kinds"], c["error_ranks"]) == (["ERROR", "MISMATCH"], [2])
    assert "Remote process error" in c["errors"] and c["status"]["ABORT"]["ranks"] == [2]
    assert "NCCL errors" in ras.opinion(r, {"comm": "5f1e2d3c4b5a6978"})


def test_a_spread_caught_mid_flight_and_a_hung_job_ras_calls_healthy():
    # 2 ranks one operation ahead of 30: what a healthy job sampled mid-flight looks like; it
    # agrees only beside the probe's detection, and second_opinion asks twice (below)
    r = _report("ahead_2.26.2.txt")
    assert _comm(r, "fa93daea854b060b")["ops"]["AllGather"][1] == {"op": 641, "count": 2, "ranks": [12, 13]}
    assert "30 rank(s) at operation 640 while 2 rank(s) launched up to 641" in ras.opinion(r, {"comm": "fa93daea854b060b"})
    # NVIDIA/nccl#1730: the job was hung (GPU side) and RAS said RUNNING/OK: no opinion
    hung = _report("healthy_256_2.26.2.txt")
    assert (hung["nodes"], hung["processes"]) == (32, 256)
    assert ras.opinion(hung, {"comm": "fa93daea854b060b"}) is None


def test_nccl_2_27_3_garbage_ranks_are_dropped():
    r = _report("bug_2.27.3_quoted.txt")
    assert (r["version"], r["nodes"], r["processes"], r["missing_processes"]) == ("2.27.3", 2, 10, 1)
    good = _comm(r, "b3398875b8b2a063")
    assert good["missing"] == [1] and good["size"] == 2
    bad = _comm(r, "93d7000200000001")  # a 0-rank group "missing 255 ranks", rank 1057455228
    assert (bad["missing"], bad["missing_count"]) == ([], 0) and r["dropped"] >= 1
    assert ras.opinion(r, {"comm": "93d7000200000001"}) is None
    assert "rank 1 not answering" in ras.opinion(r, {"comm": "b3398875b8b2a063"})


def test_forged_ranks_outside_the_communicator_are_dropped():
    text = _fix("straggler_2.30.7.txt").replace("Rank 7 has", "Rank 70 has")
    r = rasreport.parse(text)
    assert r["dropped"] == 1 and _comm(r, STRAGGLER_COMM)["ops"]["AllReduce"] == \
        [{"op": 64, "count": 7, "ranks": []}]
    assert ras.opinion(r, {"comm": STRAGGLER_COMM}) is None  # one group left: nothing differs


# ---- hostile or broken output --------------------------------------------------------------
@pytest.mark.parametrize("text", [
    "", "SERVER PROTOCOL 2\nOK\n", "\x00\xff" * 5000, "HTTP/1.1 400 Bad Request\r\n\r\n",
    "{" * 100_000, '{"communicators": "no"}', "[1, 2, 3]",
])
def test_garbage_is_an_error_never_an_exception(text):
    r = rasreport.parse(text)
    assert "error" in r and ras.opinion(r, {"comm": STRAGGLER_COMM}) is None
    assert ras.describe(r) == r["error"][:300]


def test_truncated_reports():
    full = _fix("straggler_2.30.7.txt")
    cut = full[: full.index("  Rank 7 has")]  # the count line of rank 7 never arrived
    r = rasreport.parse(cut, truncated=True)
    assert r["truncated"] and _comm(r, STRAGGLER_COMM)["ops"]["AllReduce"] == [{"op": 64, "count": 7, "ranks": []}]
    assert ras.opinion(r, {"comm": STRAGGLER_COMM}) is None
    js = _fix("straggler_reconstructed.json")
    assert "error" in rasreport.parse(js[: len(js) // 2], truncated=True)
    assert "error" in rasreport.parse(js, truncated=True)  # cut exactly at the cap: not trusted either


def test_huge_and_wrong_typed_reports_stay_bounded():
    # 1 MiB (the client's cap) of 20 KB junk lines after the report: read up to MAX_LINE each, ignored
    long_line = "x" * 20_000 + " Rank 1 has launched up to operation 3\n"
    r = rasreport.parse(_fix("straggler_2.30.7.txt") + long_line * 50)
    assert r["truncated"] is False and _comm(r, STRAGGLER_COMM)["ops"]["AllReduce"][1]["ranks"] == [7]
    many = "\n".join(["Rank 1 -- GPU 0 managed by process 1 on node n"] * (rasreport.MAX_LINES + 10))
    assert rasreport.parse(_fix("straggler_2.30.7.txt") + many)["truncated"] is True
    doc = json.loads(_fix("straggler_reconstructed.json"))
    doc["communicators"][0]["ranks"][0]["collective_counts"]["AllReduce"] = "64"
    doc["communicators"][0]["ranks"][1]["rank"] = True
    doc["communicators"][0]["ranks"][2]["rank"] = 99  # beyond size 8
    doc["communicators"].append({"hash": "not hex"})
    r = rasreport.parse(json.dumps(doc))
    assert r["dropped"] == 3
    assert _comm(r, STRAGGLER_COMM)["ops"]["AllReduce"][1] == {"op": 60, "count": 1, "ranks": [7]}


def test_hash_forms_meet():
    assert rasreport.norm_hash("0x1bdb83b038775869") == rasreport.norm_hash("1BDB83B038775869") == DEAD_COMM
    assert rasreport.norm_hash("0xabc") == "0000000000000abc"
    assert rasreport.norm_hash("0x" + "f" * 17) is None and rasreport.norm_hash(12) is None


# ---- the TCP client against a server speaking NCCL's protocol ------------------------------
@pytest.fixture
def servers():
    made: list[RasServer] = []

    def make(*a, **kw) -> RasServer:
        made.append(RasServer(*a, **kw))
        return made[-1]

    yield make
    for s in made:
        s.close()


def test_client_speaks_the_protocol_and_falls_back_to_text(servers):
    old = servers([_fix("straggler_2.30.7.txt")])  # a pre-2.28.7 RAS: no JSON
    ans = ras.query("127.0.0.1", old.port, timeout_s=4, want_json=True)
    assert (ans.form, ans.truncated) == ("text", False) and ans.text == _fix("straggler_2.30.7.txt")
    assert old.commands == ["CLIENT PROTOCOL 2", "TIMEOUT 2", "SET FORMAT json", "VERBOSE STATUS"]
    new = servers([{"json": _fix("straggler_reconstructed.json"), "text": "unused"}], json_ok=True)
    ans = ras.query("127.0.0.1", new.port, timeout_s=4, want_json=True)
    assert ans.form == "json" and json.loads(ans.text)["nccl_version"] == "2.30.7"
    # the leader's own question: the text form, which grows with the problems, not the job
    plain = servers([{"json": "unused", "text": _fix("straggler_2.30.7.txt")}], json_ok=True)
    ans = ras.query("127.0.0.1", plain.port, timeout_s=4)
    assert ans.form == "text" and "SET FORMAT json" not in plain.commands


def test_connection_refused_is_no_opinion_said_as_such():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    ans = ras.query("127.0.0.1", port, timeout_s=2)
    assert ans.text is None and "connection refused" in ans.note


def test_a_server_that_never_answers_is_bounded_by_the_timeout(servers):
    mute = servers(mute=True)
    ans = ras.query("127.0.0.1", mute.port, timeout_s=0.5)
    assert ans.text is None and "did not answer within 0.5 s" in ans.note


def test_a_server_that_is_not_ras(servers):
    web = servers(hello=b"HTTP/1.1 400 Bad Request\r\n\r\n")
    ans = ras.query("127.0.0.1", web.port, timeout_s=2)
    assert ans.text is None and "is not NCCL RAS" in ans.note


def test_a_huge_report_is_cut_at_the_cap(servers):
    big = servers([_fix("straggler_2.30.7.txt") + "x" * 3_000_000])
    ans = ras.query("127.0.0.1", big.port, timeout_s=5, cap=1 << 20)
    assert ans.truncated and len(ans.text) == 1 << 20
    assert ras.opinion(rasreport.parse(ans.text, ans.truncated), {"comm": STRAGGLER_COMM}) is not None


# ---- second_opinion and prekill's cancel ---------------------------------------------------
def _cfg(port: int | None, **live) -> Config:
    cfg = Config()
    cfg.live.on_hang = "cancel"
    cfg.paths.slurm_bin = "/opt/slurm/bin"
    if port is not None:
        cfg.live.ras_addr = f"127.0.0.1:{port}"
    cfg.live.ras_timeout_s = 3.0
    for k, v in live.items():
        setattr(cfg.live, k, v)
    return cfg


class Ran(CliSlurm):
    """Slurm for the cancel: the job still RUNNING as the watcher's user; scancels recorded."""

    def __init__(self):
        super().__init__(slurm_bin="/opt/slurm/bin")
        self.calls: list[list[str]] = []

    def show_job(self, job_id):
        start = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(time.time() - 60))
        return {"JobId": job_id, "JobState": "RUNNING", "UserId": "alice(1001)", "StartTime": start}

    def run(self, tool, *args):
        self.calls.append([os.path.join(self.slurm_bin, tool), *args])
        return ""


def _res(pending: bool):
    """The dumps: a collective enqueued and not completed (agree) or not (do not)."""
    return [{"node": "n1", "ranks": {"0": {"fr": {"pg": {"0": [4, 3] if pending else [4, 4]}},
                                            "stack": {"at": "/home/u/train.py:3 in f", "inner": "/home/u/train.py:3 in f"}}}}]


def _probe_finding(comm: str = STRAGGLER_COMM) -> dict:
    return {"source": "summary", "class": "H1", "what": "never entered AllReduce #60", "comm": comm, "ranks": [7]}


@pytest.fixture(autouse=True)
def quick_confirm(monkeypatch):
    monkeypatch.setattr(ras, "CONFIRM_S", 0.05)


def test_cancel_withheld_with_the_probe_alone(tmp_path, servers):
    healthy = servers([_fix("healthy_2.30.7.txt")])
    run = Ran()
    ld = prekill.LeaderDumps(_cfg(healthy.port), "91", "0", str(tmp_path), 1, gpus=8, slurm=run, uid=1001)
    c = ld.cancel(_probe_finding(), _res(False))
    assert run.calls == [] and c["done"] is False and c["why"].startswith("withheld")
    assert c["ras"].startswith("no agreement: RAS does not name communicator 78db921d1c117b4a")
    assert (tmp_path / "ras" / "0.1.text").read_text() == _fix("healthy_2.30.7.txt")  # kept: RAS dies with the job


def test_cancel_done_when_the_probe_and_ras_agree(tmp_path, servers):
    stuck = servers([_fix("straggler_2.30.7.txt")])  # the same counts twice: frozen
    run = Ran()
    ld = prekill.LeaderDumps(_cfg(stuck.port), "92", "0", str(tmp_path), 1,
                             end_ns=time.time_ns() + 600 * 10**9, gpus=8, slurm=run, uid=1001)
    c = ld.cancel(_probe_finding(), _res(False))
    assert run.calls == [["/opt/slurm/bin/scancel", "92"]] and c["done"] is True
    assert c["sources"] == ["probe", "ras"]
    assert c["ras"] == c["why"] and c["ras"].startswith("NCCL RAS 2.30.7: communicator 78db921d1c117b4a MISMATCH")
    assert stuck.served == 2 and "rank 7 at operation 60" in c["reason"]


def test_counts_that_move_between_two_queries_do_not_agree(tmp_path, servers):
    moving = _fix("straggler_2.30.7.txt")
    moved = moving.replace("7 ranks have launched up to operation 64", "7 ranks have launched up to operation 65")
    srv = servers([moving, moved])
    run = Ran()
    ld = prekill.LeaderDumps(_cfg(srv.port), "93", "0", str(tmp_path), 1, gpus=8, slurm=run, uid=1001)
    c = ld.cancel(_probe_finding(), _res(False))
    assert run.calls == [] and c["done"] is False and "moved within" in c["ras"]


def test_a_dead_rank_agrees_at_once_and_the_dumps_still_count(tmp_path, servers):
    dead = servers([_fix("incomplete_2.30.7.txt")])
    run = Ran()
    ld = prekill.LeaderDumps(_cfg(dead.port), "94", "0", str(tmp_path), 1, gpus=8, slurm=run, uid=1001)
    c = ld.cancel(_probe_finding(DEAD_COMM), _res(True))
    assert c["done"] is True and c["sources"] == ["probe", "dumps", "ras"] and dead.served == 1
    assert c["why"].startswith("Flight Recorder: 1 rank(s)") and "rank 7 not answering" in c["why"]


def test_ras_never_makes_a_second_source_for_an_fr_finding(tmp_path, servers):
    stuck = servers([_fix("straggler_2.30.7.txt")])
    run = Ran()
    ld = prekill.LeaderDumps(_cfg(stuck.port), "95", "0", str(tmp_path), 1, gpus=8, slurm=run, uid=1001)
    c = ld.cancel(dict(_probe_finding(), source="fr"), _res(True))
    assert run.calls == [] and c["done"] is False and "ras" not in c and stuck.served == 0


def test_ras_off_or_absent_is_todays_behaviour(tmp_path, servers):
    stuck = servers([_fix("straggler_2.30.7.txt")])
    run = Ran()
    off = prekill.LeaderDumps(_cfg(stuck.port, ras="off"), "96", "0", str(tmp_path), 1, gpus=8, slurm=run, uid=1001)
    c = off.cancel(_probe_finding(), _res(False))
    assert run.calls == [] and c["done"] is False and stuck.served == 0 and "not asked" in c["ras"]
    c = off.cancel(_probe_finding(), _res(True))
    assert c["done"] is True and c["sources"] == ["probe", "dumps"]
    refused = socket.socket()
    refused.bind(("127.0.0.1", 0))
    port = refused.getsockname()[1]
    refused.close()
    gone = prekill.LeaderDumps(_cfg(port), "97", "0", str(tmp_path), 1, gpus=8, slurm=run, uid=1001)
    c = gone.cancel(_probe_finding(), _res(True))
    assert c["done"] is True and c["sources"] == ["probe", "dumps"] and "connection refused" in c["ras"]


def test_second_opinion_never_raises(tmp_path, monkeypatch):
    def boom(*a, **kw):
        raise RuntimeError("socket layer exploded")

    monkeypatch.setattr(ras, "query", boom)
    agree, said = ras.second_opinion(_cfg(1).live, str(tmp_path), "0", _probe_finding())
    assert agree is None and said.startswith("RAS query failed: RuntimeError")


# ---- config ------------------------------------------------------------------------------
def test_config_ras_keys():
    lv = Config().live
    assert (lv.ras, lv.ras_addr, lv.ras_timeout_s) == ("auto", "localhost:28028", 5.0)
    lv = from_dict({"live": {"ras": "off", "ras_addr": "[::1]:28030", "ras_timeout_s": 2}}).live
    assert (lv.ras, lv.ras_addr, lv.ras_timeout_s) == ("off", "[::1]:28030", 2.0)
    assert host_port("[::1]:28030") == ("::1", 28030) and host_port("n1.cluster:1") == ("n1.cluster", 1)
    for bad, match in (({"ras": "on"}, "ras must be"), ({"ras_timeout_s": 0}, "ras_timeout_s"),
                       ({"ras_timeout_s": 61}, "ras_timeout_s"), ({"ras_addr": "localhost"}, "ras_addr"),
                       ({"ras_addr": "h:0"}, "ras_addr"), ({"ras_addr": "a b:1"}, "ras_addr")):
        with pytest.raises(ConfigError, match=match):
            from_dict({"live": bad})
    assert os.path.isdir(FIX)
