"""The real plugin, driven without a GPU by spank/tests/probe_harness (8 rank processes, an
application and a proxy thread each, NCCL's event order, faults injected, everything
SIGKILLed mid-hang), then the Python analysis on the records it left: it must name exactly
the injected rank or link. Also keeps the C and Python record layouts in step.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from datetime import datetime
from pathlib import Path

import pytest

from slurm_attr.bundle import Bundle
from slurm_attr.config import Config
from slurm_attr.probe import analyze
from slurm_attr.probe import layout as L

REPO = Path(__file__).resolve().parents[2]
SPANK = REPO / "spank"
LIB = SPANK / "build" / "libnccl-profiler-sattr.so"
HARNESS = SPANK / "build" / "tests" / "probe_harness"
RANKS, PER_NODE = 8, 2
# The harness compresses a hang of minutes into a second: the job "ends" this much later.
HANG_S = 60


@pytest.fixture(scope="module")
def harness() -> Path:
    if not (shutil.which("make") and (shutil.which("cc") or shutil.which("gcc"))):
        pytest.skip("no C toolchain to build the probe")
    res = subprocess.run(["make", "-s", "-C", str(SPANK), "-f", "probe.mk", "probe-harness"],
                         capture_output=True, text=True, timeout=300)
    if res.returncode != 0:
        pytest.fail(f"building the probe failed:\n{res.stdout}\n{res.stderr}")
    return HARNESS


def _play(harness: Path, out: Path, scenario: str, api: int = 5, end_in_s: float = HANG_S) -> Bundle:
    res = subprocess.run([str(harness), "run", "--plugin", str(LIB), "--out", str(out), "--scenario", scenario,
                          "--api", str(api)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    end = datetime.now().timestamp() + end_in_s
    job = {"job_id": "4242", "end_time": datetime.fromtimestamp(end).isoformat(),
           "nodes": [f"node{i}" for i in range(RANKS // PER_NODE)],
           "ranks": {str(r): f"node{r // PER_NODE}" for r in range(RANKS)}}
    (out / "job.json").write_text(json.dumps(job))
    return Bundle(str(out))


def _found(bundle: Bundle):
    symptoms, coverage = analyze(bundle, Config())
    assert [c.status for c in coverage] == ["ok"] * (RANKS // PER_NODE), coverage
    return symptoms


def test_layout_matches_the_c_header(harness):
    c = json.loads(subprocess.run([str(harness), "layout"], capture_output=True, text=True, check=True).stdout)
    assert (c["magic"].encode(), c["layout_ver"], c["hdr_size"], c["slot_size"], c["nslots"], c["file_size"]) == (
        L.MAGIC, L.LAYOUT_VER, L.HDR_SIZE, L.SLOT_SIZE, L.NSLOTS, L.FILE_SIZE)
    assert (c["hring"], c["opring"], c["nchan"], c["npeers"]) == (L.HRING, L.OPRING, L.NCHAN, L.NPEERS)
    assert c["file_size"] <= 112 * 1024  # version 2: 110,592 B with the lane pool
    assert (c["nlanes"], c["lane_size"], c["lanes_off"]) == (L.NLANES, L.LANE_SIZE, L.LANES_OFF)
    lane = L.field_offsets(L.LANE_FIELDS)
    assert (c["lane"]["bind"], c["lane"]["claims"], c["lane"]["net"], c["lane"]["peers"]) == (
        lane["bind"], lane["claims"], L.LANE_CORE_OFF, L.LANE_PEERS_OFF)
    for name in ("send_posted", "in_state", "last_progress_ns", "win_start_ns", "base_recv_bytes"):
        assert c["lane"][f"net.{name}"] == lane[name], name
    assert c["sizes"] == {"hring_ent": L.HRING_ENT.size, "op_ent": L.OP_ENT.size, "chan": 8, "peer": L.PEER_ENT.size}
    assert c["slot"]["ops"] == L.OPS_OFF and c["slot"]["chan"] == L.CHAN_OFF and c["slot"]["peers"] == L.PEERS_OFF
    assert c["hdr"]["ring"] == L.RING_OFF
    for name, fields in (("hdr", L.HEADER_FIELDS), ("slot", L.SLOT_FIELDS), ("op_ent", L.OP_FIELDS),
                         ("peer", L.PEER_FIELDS), ("hring_ent", L.HRING_FIELDS)):
        py = L.field_offsets(fields)
        assert set(c[name]) - set(py) <= {"ring", "ops", "chan", "peers"}, name  # checked above
        shared = set(py) & set(c[name])
        assert {k: py[k] for k in shared} == {k: c[name][k] for k in shared}, name


def test_non_entry(harness, tmp_path):
    symptoms = _found(_play(harness, tmp_path, "nonentry"))
    assert {(s.id, s.rank) for s in symptoms} == {("probe.non_entry", 3)}
    s = symptoms[0]
    assert (s.node, s.fields["func"], s.fields["seq"], s.fields["in_api"]) == ("node1", "AllReduce", 8, False)
    assert s.fields["stalled_s"] >= HANG_S - 5


def test_inconsistent_count(harness, tmp_path):
    symptoms = _found(_play(harness, tmp_path, "count"))
    assert {(s.id, s.rank) for s in symptoms} == {("probe.inconsistent", 5)}
    assert symptoms[0].fields["position"] == 8 and "count 524288" in symptoms[0].fields["issued"]


def test_link_stall(harness, tmp_path):
    symptoms = _found(_play(harness, tmp_path, "linkstall"))
    assert [(s.id, s.fields["src_rank"], s.fields["dst_rank"]) for s in symptoms] == [("probe.link_stall", 3, 4)]
    f = symptoms[0].fields
    assert (f["src_node"], f["dst_node"], f["receiver_waiting"]) == ("node1", "node2", True)


@pytest.mark.parametrize("scenario, api, expected", [
    ("nonentry", 4, {("probe.non_entry", 3)}),
    ("nonentry", 3, {("probe.non_entry", 3)}),
    ("linkstall", 4, {("probe.link_stall", 3)}),
    ("count", 4, {("probe.inconsistent", 5)}),
    ("nonentry", 6, {("probe.non_entry", 3)}),
    ("linkstall", 6, {("probe.link_stall", 3)}),
    ("count", 6, {("probe.inconsistent", 5)}),
])
def test_other_profiler_apis(harness, tmp_path, scenario, api, expected):
    assert {(s.id, s.rank) for s in _found(_play(harness, tmp_path, scenario, api=api))} == expected


def test_healthy_job_has_no_findings(harness, tmp_path):
    bundle = _play(harness, tmp_path, "healthy", end_in_s=1)
    assert _found(bundle) == []
    files = [p for p in tmp_path.rglob("*.probe")]
    assert len(files) == RANKS and all(os.path.getsize(p) == L.FILE_SIZE <= 112 * 1024 for p in files)


def test_job_killed_mid_flight_has_no_findings(harness, tmp_path):
    # a time limit or scancel: SIGKILL while the ring moves; the job ended right then
    time.sleep(0.01)
    assert _found(_play(harness, tmp_path, "killed", end_in_s=0)) == []
