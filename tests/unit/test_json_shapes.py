"""The JSON shapes of issue 27 (jsonshape, rasshape, exchangeshape, findingshape, bundleshape):
per shape a good document, a near miss (one field of the wrong type or out of bounds) and
what the reader does with it: the same outcome the hand-written checks had."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Optional

import msgspec
import pytest

from slurm_attr import jsonshape
from slurm_attr.bundle import Bundle
from slurm_attr.live import findings, livespool
from slurm_attr.live.prekill import exchange as prekill, prekillevidence
from slurm_attr.live.ras import rasreport

RAS = Path(__file__).resolve().parents[1] / "fixtures" / "ras"
STRAGGLER = "78db921d1c117b4a"


# ---- the loader --------------------------------------------------------------------------
class Inner(msgspec.Struct):
    n: int = 0


class Doc(msgspec.Struct):
    key: str
    count: Optional[int] = None
    inner: Inner = msgspec.field(default_factory=Inner)
    by: dict[str, int] = {}
    items: list[int] = []


def test_lenient_keeps_the_good_fields_and_strict_names_the_bad_one():
    good = {"key": "k", "count": 3, "inner": {"n": 2}, "by": {"a": 1}, "items": [1, 2], "new": "field"}
    assert jsonshape.lenient(good, Doc) == Doc("k", 3, Inner(2), {"a": 1}, [1, 2])  # unknown field ignored
    near = {"key": "k", "count": True, "inner": {"n": "2"}, "by": {"a": 1, "b": "x"}, "items": [1, None, 3]}
    assert jsonshape.lenient(near, Doc) == Doc("k", None, Inner(0), {"a": 1}, [1, 3])
    with pytest.raises(jsonshape.ValidationError, match="Expected `int \\| null`, got `bool` - at `\\$.count`"):
        jsonshape.strict(near, Doc)
    with pytest.raises(jsonshape.ValidationError, match="Expected `str`, got `int` - at `\\$.key`"):
        jsonshape.lenient({"key": 5, "count": "x"}, Doc)  # a required field: the object fails
    with pytest.raises(jsonshape.ValidationError, match="missing required field `key`"):
        jsonshape.lenient({"count": "x"}, Doc)
    with pytest.raises(jsonshape.ValidationError):
        jsonshape.lenient([1], Doc)


# ---- NCCL's RAS report (rasshape) --------------------------------------------------------
def _ras() -> dict:
    return json.loads((RAS / "straggler_reconstructed.json").read_text())


def _comm(r, h):
    return next(c for c in r["comms"] if c["hash"] == h)


def test_ras_json_good_and_a_wrong_size_reads_as_absent():
    r = rasreport.parse(json.dumps(_ras()))
    assert (r["form"], r["dropped"], _comm(r, STRAGGLER)["size"]) == ("json", 0, 8)
    doc = _ras()
    doc["communicators"][0]["size"] = "8"  # near miss: the communicator is kept, its size unknown
    doc["communicators"][0]["ranks"][0]["pid"] = -1  # out of bounds: the rank kept, its process not counted
    r2 = rasreport.parse(json.dumps(doc))
    assert (_comm(r2, STRAGGLER)["size"], r2["dropped"], r2["processes"]) == (None, 0, r["processes"] - 1)
    assert _comm(r2, STRAGGLER)["ops"] == _comm(r, STRAGGLER)["ops"]


def test_ras_json_without_its_communicators_says_which_field():
    doc = _ras()
    doc["communicators"] = {"0": "no"}
    assert rasreport.parse(json.dumps(doc)) == \
        {"error": "not a RAS JSON report: Expected `array`, got `object` - at `$.communicators`"}
    del doc["communicators"]
    assert rasreport.parse(json.dumps(doc))["error"] == \
        "not a RAS JSON report: Object missing required field `communicators`"
    # NaN is not JSON: the report is unreadable, never half read
    assert rasreport.parse('{"communicators": [], "nccl_version": NaN}')["error"].startswith(
        "unreadable RAS report: DecodeError")


def test_ras_json_a_huge_or_bool_rank_is_one_dropped_entry():
    doc = _ras()
    doc["communicators"][0]["ranks"][0]["rank"] = 1 << 70
    doc["communicators"][0]["ranks"][1]["rank"] = False
    doc["communicators"][0]["ranks"][2]["status"]["abort_flag"] = "yes"  # not a bool: not an abort
    r = rasreport.parse(json.dumps(doc))
    assert r["dropped"] == 2 and "ABORT" not in _comm(r, STRAGGLER)["status"]
    doc["communicators"][0]["ranks"][2]["status"]["abort_flag"] = True
    assert _comm(rasreport.parse(json.dumps(doc)), STRAGGLER)["status"]["ABORT"]["ranks"] == [2]


# ---- the pre-kill exchange (exchangeshape) -----------------------------------------------
def _req(tmp_path, **doc):
    livespool.write_json(str(tmp_path), "", prekill.req_name("0"), {"job": "5", "step": "0", "reason": "hang", **doc})


@pytest.mark.parametrize("seq,want", [(3, 3), ("3", 0), (True, 0), (-1, 0), (1 << 70, 0)])
def test_dump_request_seq_must_be_a_plain_count(tmp_path, seq, want):
    _req(tmp_path, seq=seq)
    assert prekill.current_seq(str(tmp_path), "5", "0") == want
    assert prekill.current_seq(str(tmp_path), "6", "0") == 0  # another job's request


def test_a_node_serves_only_a_well_formed_request(tmp_path):
    nd = prekill.NodeDumps(str(tmp_path), "5", "0", "n1", str(tmp_path / "nojob"))
    _req(tmp_path, seq=1)
    got = nd.pending()
    assert (got.job, got.seq, got.reason) == ("5", 1, "hang")
    _req(tmp_path, seq=2, job=5)  # near miss: the job id as a number
    assert nd.pending() is None


def test_node_results_keep_the_good_rows():
    req = {"seq": 1, "reason": "hang", "time_ns": 1_000_000_000}
    good = {"job": "5", "node": "n1", "seq": 1, "time_ns": 1_500_000_000, "pipes": {"0": "sent"},
            "ranks": {"0": {"fr": {"pg": {"0": [4, 3]}}, "stack": {"at": "/a.py:1 in f", "inner": "/torch/x"}}}}
    s = prekill.summarize([good], req, 1)
    assert (s["fr_ranks"], s["pipes_sent"], s["latency_s"]) == ([0], 1, 0.5)
    assert prekill.agreement({"source": "snapshot"}, [good]).startswith("Flight Recorder: 1 rank")
    near = json.loads(json.dumps(good))
    near["ranks"]["0"]["stack"]["at"] = 7  # a stack without its text: no stack, the FR still counts
    near["ranks"]["0"]["fr"]["pg"]["0"] = [True, False]  # bools are not seqs: nothing pending
    near["time_ns"] = -5
    s = prekill.summarize([near], req, 1)
    assert (s["stacks"], s["fr_ranks"], s["latency_s"]) == ([], [0], None)
    assert prekill.agreement({"source": "snapshot"}, [near]) is None
    near["ranks"]["0"]["fr"]["pg"]["0"] = [5, -1]  # torch's "none completed yet"
    assert prekill.agreement({"source": "snapshot"}, [near]).startswith("Flight Recorder: 1 rank")


# ---- the findings document (findingshape) and its stacks (exchangeshape.LiveDoc) ---------
def _spool(tmp_path):
    spool = str(tmp_path / "spool")
    os.makedirs(spool)
    livespool.ensure_job_dir(spool, "77")
    return spool


def test_findings_header_checked_and_a_bad_coverage_reads_as_absent(tmp_path):
    spool = _spool(tmp_path)
    f = {"class": "H0", "what": "x"}
    findings.save(spool, "77", "0", {"findings": [f], "coverage": "2 of 2", "extra": 1}, gid=None)
    assert findings.load_step(spool, "77", "0")["extra"] == 1  # the document kept whole
    assert findings.load(spool, "77")["coverage"] == "step 0: 2 of 2"
    findings.save(spool, "77", "0", {"findings": [f], "coverage": 5, "dumps": "x"}, gid=None)
    got = findings.load(spool, "77")
    assert (got["findings"], got["coverage"], got["dumps"]) == ([f], "", [])
    d = livespool.job_dir(spool, "77")
    livespool.write_json(d, "", findings.name("0"), {"job": "77", "step": "0", "findings": {"0": f}}, mode=0o640)
    assert findings.load_step(spool, "77", "0") is None and findings.load(spool, "77") is None
    livespool.write_json(d, "", findings.name("0"), {"job": 77, "step": "0", "findings": [f]}, mode=0o640)
    assert findings.load_step(spool, "77", "0") is None


def test_stacks_symptom_takes_the_latest_dump_and_skips_bad_rows():
    row = {"rank": 1, "node": "n2", "at": "/home/u/train.py:212 in step"}
    doc = {"findings": [{"dumps": {"requested": "2026-01-01T00:00:01+00:00"}, "stacks": [row, "junk"]}],
           "dumps": [{"reason": "before_end", "requested": "2026-01-01T00:00:00+00:00", "stacks": [row]}]}
    [s] = prekillevidence.stacks_symptom(doc, "77")
    assert (s.time, s.fields["reason"], s.fields["stacks"]) == ("2026-01-01T00:00:01+00:00", "hang", [row])
    doc["findings"][0]["dumps"] = "2026"  # near miss: a finding's dumps that is not a summary
    [s] = prekillevidence.stacks_symptom(doc, "77")
    assert (s.time, s.fields["reason"]) == ("2026-01-01T00:00:00+00:00", "before_end")
    doc["dumps"][0]["requested"] = 1  # the time is not a string: the symptom has none
    assert prekillevidence.stacks_symptom(doc, "77")[0].time is None


# ---- the bundle's job.json and collect.json (bundleshape) --------------------------------
def _bundle(tmp_path, job, collect) -> Bundle:
    root = tmp_path / "b"
    (root / "nodes" / "n1").mkdir(parents=True, exist_ok=True)
    (root / "job.json").write_text(job if isinstance(job, str) else json.dumps(job))
    (root / "nodes" / "n1" / "collect.json").write_text(json.dumps(collect))
    return Bundle(str(root))


def test_collect_json_sources_ranks_and_ledger_lines(tmp_path):
    collect = {"sources": {"kernel": {"status": "ok", "detail": "12 lines"}, "fr": {"status": "weird", "detail": 3}},
               "ranks": {"0": [0, 1], "1": [2, True, "3", 1 << 40]},
               "attributed": {"lines": [{"line": 4, "job_id": "9", "key": "k"}, {"line": "5", "job_id": "9", "key": "k2"}, 7]},
               "provenance": {"kernel": "node"}}
    b = _bundle(tmp_path, {"job_id": 1, "nodes": ["n1", 2], "provenance": {"job": "controller"}}, collect)
    assert [(c.source, c.status, c.detail) for c in b.collector_coverage()] == \
        [("fr", "error", "3"), ("kernel", "ok", "12 lines")]
    assert (b.ranks(), b.nodes()) == ({0: "n1", 1: "n1"}, ["n1"])  # step 1's bad ranks left out: 1 rank < 2
    assert (b.attributed_lines("n1"), b.attributed_keys()) == ({4: "9"}, {"k": "9", "k2": "9"})
    assert b.provenance() == {"job": "controller", "kernel": "node"}


def test_collect_json_of_the_wrong_shape_is_ignored_not_fatal(tmp_path):
    b = _bundle(tmp_path, {"job_id": 1, "nodes": "n1", "provenance": ["x"]},
                {"sources": ["kernel"], "ranks": [0, 1], "attributed": {"lines": "x"}})
    assert (b.collector_coverage(), b.ranks(), b.attributed_lines("n1"), b.provenance()) == ([], {}, {}, {})
    assert b.nodes() == ["n1"]  # from nodes/, not from the string


def test_job_json_that_is_not_json_is_a_coverage_note(tmp_path):
    b = _bundle(tmp_path, '{"job_id": 5, "x": NaN}', {})
    assert b.job_id == "b"  # named after its directory, as for a missing job.json
    [c] = [c for c in b.coverage if c.source == "job"]
    assert c.status == "error" and c.detail.startswith("job.json: bad JSON: JSON is malformed")
    b = _bundle(tmp_path, '[1, 2]', {})  # JSON but not an object: as if absent, no note (as before)
    assert b.job_id == "b" and [c for c in b.coverage if c.source == "job"] == []


def test_ras_json_a_missing_rank_is_dead_only_when_nccl_says_true():
    doc = json.loads((RAS / "dead_reconstructed.json").read_text())
    r = rasreport.parse(json.dumps(doc))
    assert (r["dead_processes"], _comm(r, "1bdb83b038775869")["dead"]) == (1, [7])
    miss = doc["communicators"][0]["missing_ranks"][0]
    miss["status"] = {"unresponsive": "true", "considered_dead": 1}  # near miss: not bools
    miss["pid"] = "3748990"
    r = rasreport.parse(json.dumps(doc))
    c = _comm(r, "1bdb83b038775869")
    assert (r["dead_processes"], c["dead"], c["missing"], c["status"]["NOCOMM"]["count"]) == (0, [], [], 1)
