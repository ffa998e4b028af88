"""The real dumps in shared/fixtures/flight_recorder: every case gives its documented culprit.

Gloo cases carry their ground truth in scenario.json; the NVRx cases in
reference_output.txt (PG, op, size, dtype, missing ranks), restated below with
the sequence number of the collective the missing ranks never reached.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from slurm_attr import flightrec
from slurm_attr.bundle import Bundle
from slurm_attr.config import Config

GLOO = ["s1_healthy", "s2_skip", "s3_op_mismatch", "s4_size_mismatch", "s5_stuck_compute", "s6_subgroup_mismatch"]
KIND = {"skipped_collective": "skip", "op_mismatch": "op", "size_mismatch": "size", "dtype_mismatch": "dtype",
        "stuck_before_collective": "not_reached"}
CAUSE = {"skip": "collective_mismatch", "op": "collective_mismatch", "size": "collective_mismatch",
         "dtype": "collective_mismatch", "not_reached": "rank_stuck"}

# case -> {culprit rank: (pg, seq)}, and the hung collective as reference_output.txt prints it
NVRX = {
    "gpu_error_1st": ({12: ("74", 20537)}, "all_to_all", [[4027, 5120]]),
    "gpu_error_2nd": ({9: ("72", 44791), 14: ("72", 44791)}, "all_to_all", [[2048, 5120]]),
    "lock_gil_1st": ({9: ("72", 45265), 14: ("72", 45265)}, "all_to_all", [[2048, 5120]]),
    "lock_gil_2nd": ({10: ("73", 20947), 15: ("74", 20947)}, "all_to_all", [[4096, 5120]]),
}


def _roots(symptoms):
    return [s for s in symptoms if s.role == "root"]


@pytest.mark.parametrize("fmt", ["pickle", "json"])
@pytest.mark.parametrize("case", GLOO)
def test_gloo_fixture_culprit(shared_fixtures: Path, case: str, fmt: str) -> None:
    base = shared_fixtures / "flight_recorder" / "gloo" / case
    scenario = json.loads((base / "scenario.json").read_text())
    rep = flightrec.inspect(str(base / "json") if fmt == "json" else str(base))
    roots = _roots(rep.symptoms)
    exp = scenario["expected"]
    if exp is None:
        assert rep.symptoms == []
        assert [c.status for c in rep.coverage] == ["ok"]
        return
    assert [s.rank for s in roots] == exp["culprit_ranks"]
    (s,) = roots
    kind = KIND[exp["mismatch_kind"]]
    assert s.id == ("fr.rank_stuck" if kind == "not_reached" else "fr.collective_mismatch")
    assert s.cause == CAUSE[kind]
    assert s.fields["kind"] == kind
    assert s.fields["pg"] == exp["pg_name"]
    assert s.fields["pg_desc"] == exp["pg_desc"]
    assert s.fields["members"] == exp["pg_ranks"]
    assert s.fields["collective_seq_id"] == exp["collective_seq_id"]
    assert s.trusted is False and s.action == "none"
    assert s.evidence and all(e.source == "fr" for e in s.evidence)
    assert s.evidence[0].path.endswith(f"nccl_trace_rank_{s.rank}" + (".json" if fmt == "json" else ""))
    assert s.summary and f"rank {s.rank}" in s.summary


def test_gloo_size_mismatch_fields(shared_fixtures: Path) -> None:
    rep = flightrec.inspect(str(shared_fixtures / "flight_recorder/gloo/s4_size_mismatch"))
    (s,) = rep.symptoms
    assert s.fields["culprit_input_sizes"] == [[1000]]
    assert s.fields["majority_input_sizes"] == [[1024]]
    assert s.fields["culprit_op"] == s.fields["majority_op"] == "all_reduce"
    assert s.fields["culprit_dtypes"] == s.fields["majority_dtypes"] == ["Float"]
    assert s.fields["majority_ranks"] == [0, 1, 2]
    # pickles carry stacks: innermost first, "file:line function"
    assert s.fields["culprit_stack"][0].endswith(" all_reduce")
    assert any("train.py" in f for f in s.fields["majority_stack"])


def test_gloo_skip_first_differing_frame(shared_fixtures: Path) -> None:
    rep = flightrec.inspect(str(shared_fixtures / "flight_recorder/gloo/s2_skip"))
    (s,) = rep.symptoms
    assert s.fields["kind"] == "skip"
    assert s.fields["culprit_input_sizes"] == [[1024]] and s.fields["majority_input_sizes"] == [[1]]
    fd = s.fields["first_differing_frame"]
    # rank 2 called sync_grads from the step loop where the others called reduce_loss
    assert fd["culprit"] != fd["majority"]
    assert fd["culprit"].startswith("/home/alice/train/train.py:") and fd["majority"].startswith("/home/alice/train/train.py:")


def test_gloo_json_has_no_stacks(shared_fixtures: Path) -> None:
    rep = flightrec.inspect(str(shared_fixtures / "flight_recorder/gloo/s4_size_mismatch/json"))
    (s,) = rep.symptoms
    assert s.fields["culprit_stack"] == [] and s.fields["first_differing_frame"] is None


def test_gloo_subgroup_downstream_groups_are_cascade(shared_fixtures: Path) -> None:
    rep = flightrec.inspect(str(shared_fixtures / "flight_recorder/gloo/s6_subgroup_mismatch"))
    roots = _roots(rep.symptoms)
    cascades = [s for s in rep.symptoms if s.role == "cascade"]
    assert [(s.rank, s.fields["pg"]) for s in roots] == [(1, "1")]
    assert {s.id for s in cascades} == {"fr.downstream_hang"}
    # DP0 = {0, 2}: rank 0 never got there (blocked in TP0); DP1 = {1, 3}: rank 1 likewise
    assert sorted((s.fields["pg"], s.fields["pg_desc"], tuple(s.fields["behind_ranks"])) for s in cascades) == [
        ("3", "DP0", (0,)), ("4", "DP1", (1,))]
    for s in cascades:
        assert s.fields["root_ranks"] == [1]
        assert s.cause == "collective_mismatch"  # inherits the root's cause
        assert all(v == {"pg": "1", "collective_seq_id": 3} for v in s.fields["blocked_in"].values())


@pytest.mark.parametrize("case", sorted(NVRX))
def test_nvrx_fixture_culprits(shared_fixtures: Path, case: str) -> None:
    culprits, op, sizes = NVRX[case]
    rep = flightrec.inspect(str(shared_fixtures / "flight_recorder" / "nvrx" / case))
    roots = _roots(rep.symptoms)
    assert {s.rank: (s.fields["pg"], s.fields["collective_seq_id"]) for s in roots} == culprits
    for s in roots:
        assert s.id == "fr.rank_stuck" and s.cause == "rank_stuck" and s.fields["kind"] == "not_reached"
        assert s.fields["pg_desc"] == "EXPERT_MODEL_PARALLEL_GROUP"
        assert s.fields["majority_op"] == op
        assert s.fields["majority_input_sizes"] == sizes
        assert s.fields["majority_dtypes"] == ["BFloat16"]
        assert s.trusted is False


def test_nvrx_gil_locked_ranks_have_no_entries(shared_fixtures: Path) -> None:
    rep = flightrec.inspect(str(shared_fixtures / "flight_recorder/nvrx/lock_gil_2nd"))
    for s in _roots(rep.symptoms):
        assert s.fields["culprit_entries"] == 0
        assert s.fields["culprit_last_collective"] is None
        # it is missing from its other groups too; the first in program order is reported
        assert s.fields["also_missing_in"]


def _bundle(tmp_path: Path, src: Path, layout: dict[str, list[int]]) -> Bundle:
    root = tmp_path / "bundle"
    ranks = {}
    for node, rs in layout.items():
        (root / "nodes" / node / "fr").mkdir(parents=True)
        for r in rs:
            ranks[str(r)] = node
            shutil.copy(src / f"nccl_trace_rank_{r}", root / "nodes" / node / "fr" / f"nccl_trace_rank_{r}")
    (root / "job.json").write_text(json.dumps({"job_id": "77", "nodes": sorted(layout), "ranks": ranks}))
    return Bundle(str(root))


def test_analyze_bundle_names_node_and_coverage(shared_fixtures: Path, tmp_path: Path) -> None:
    src = shared_fixtures / "flight_recorder/gloo/s4_size_mismatch"
    b = _bundle(tmp_path, src, {"gpu-a": [0, 1], "gpu-b": [2, 3]})
    symptoms, cov = flightrec.analyze(b, Config())
    (s,) = symptoms
    assert (s.rank, s.node, s.id) == (3, "gpu-b", "fr.collective_mismatch")
    assert s.evidence[0].path == "nodes/gpu-b/fr/nccl_trace_rank_3"
    assert sorted((c.node, c.status) for c in cov) == [("gpu-a", "ok"), ("gpu-b", "ok")]


def test_analyze_bundle_missing_dump_still_localises(shared_fixtures: Path, tmp_path: Path) -> None:
    src = shared_fixtures / "flight_recorder/gloo/s2_skip"
    b = _bundle(tmp_path, src, {"gpu-a": [0, 2], "gpu-b": [3]})  # rank 1's dump never arrived
    # job.json knows rank 1 lives on gpu-b
    data = json.loads((Path(b.root) / "job.json").read_text())
    data["ranks"]["1"] = "gpu-b"
    (Path(b.root) / "job.json").write_text(json.dumps(data))
    symptoms, cov = flightrec.analyze(Bundle(b.root), Config())
    (s,) = symptoms
    assert (s.rank, s.node, s.fields["kind"], s.fields["collective_seq_id"]) == (2, "gpu-a", "skip", 7)
    assert s.fields["ranks_without_dump"] == [1]
    assert any(c.status == "missing" and c.node == "gpu-b" and "rank 1" in c.detail for c in cov)


def test_analyze_bundle_without_dumps(tmp_path: Path) -> None:
    (tmp_path / "b" / "nodes" / "n1").mkdir(parents=True)
    (tmp_path / "b" / "job.json").write_text('{"job_id": "5"}')
    symptoms, cov = flightrec.analyze(Bundle(str(tmp_path / "b")), Config())
    assert symptoms == []
    assert [(c.source, c.status) for c in cov] == [("fr", "missing")]
