"""Missing dumps (issue 12 item 3): the rank every dumped member waits for is the suspect.

Truth first, from shared/fixtures/flight_recorder/gloo/*/scenario.json and its
README (real torch 2.13 Gloo dumps, correct pg_config): a dump is deleted to
make the case, everything else is the fixture as it is. Near misses beside each:
a missing dump of a bystander, of a rank whose group completed (NCCL state
``completed``), and of most of a group.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from slurm_attr import flightrec
from test_flightrec_analysis import E, write


def _copy(shared_fixtures: Path, scenario: str, tmp_path: Path, drop: tuple[int, ...]) -> tuple[Path, dict]:
    src = shared_fixtures / "flight_recorder" / "gloo" / scenario
    meta = json.loads((src / "scenario.json").read_text())
    out = tmp_path / scenario
    out.mkdir()
    for f in src.iterdir():
        if f.name.startswith("nccl_trace_rank_") and int(f.name.rsplit("_", 1)[1]) not in drop:
            shutil.copy(f, out / f.name)
    return out, meta


def _by_role(rep: flightrec.Report, role: str) -> list:
    return [s for s in rep.symptoms if s.role == role]


def test_subgroup_culprit_without_dump(shared_fixtures: Path, tmp_path: Path) -> None:
    """s6: rank 1 broke TP0 ('1', ranks 0,1) at seq 3 and left no dump; rank 0's DP0 hang is downstream of it."""
    d, meta = _copy(shared_fixtures, "s6_subgroup_mismatch", tmp_path, (1,))
    exp = meta["expected"]
    assert (exp["culprit_ranks"], exp["pg_name"], exp["collective_seq_id"]) == ([1], "1", 3)
    rep = flightrec.inspect(str(d))
    (root,) = _by_role(rep, "root")
    assert (root.id, root.cause, root.rank, root.fields["pg"], root.fields["collective_seq_id"]) == ("fr.rank_stuck", "rank_stuck", 1, "1", 3)
    assert root.fields["no_dump"] is True and "no dump" in root.fields["culprit_evidence"]
    assert root.fields["ranks_without_dump"] == [1] and root.fields["waiting_ranks"] == [0]
    assert "left no Flight Recorder dump" in root.summary
    assert [e.text for e in root.evidence][0] == "rank 1: no Flight Recorder dump"
    (down,) = _by_role(rep, "cascade")
    assert (down.fields["pg"], down.fields["behind_ranks"], down.fields["root_ranks"]) == ("3", [0], [1])
    assert any(c.status == "missing" and c.detail == "no dump for rank 1" for c in rep.coverage)


def test_subgroup_bystander_without_dump(shared_fixtures: Path, tmp_path: Path) -> None:
    """Near miss: rank 3 (not in TP0) left no dump; the culprit is still rank 1's size mismatch, rank 3 is not named."""
    d, _ = _copy(shared_fixtures, "s6_subgroup_mismatch", tmp_path, (3,))
    rep = flightrec.inspect(str(d))
    (root,) = _by_role(rep, "root")
    assert (root.id, root.rank, root.fields["kind"]) == ("fr.collective_mismatch", 1, "size")
    assert all(s.rank != 3 for s in rep.symptoms)


@pytest.mark.parametrize("scenario,culprit,seq", [("s5_stuck_compute", 0, 6), ("s3_op_mismatch", 1, 7)])
def test_world_group_culprit_without_dump(shared_fixtures: Path, tmp_path: Path, scenario: str, culprit: int, seq: int) -> None:
    d, meta = _copy(shared_fixtures, scenario, tmp_path, (culprit,))
    assert (meta["expected"]["culprit_ranks"], meta["expected"]["collective_seq_id"]) == ([culprit], seq)
    rep = flightrec.inspect(str(d))
    (root,) = _by_role(rep, "root")
    assert (root.id, root.rank, root.fields["pg"], root.fields["collective_seq_id"], root.fields["no_dump"]) == ("fr.rank_stuck", culprit, "0", seq, True)
    assert root.fields["confidence"] == "medium"  # the others are still waiting in it (not retired)


def test_healthy_run_missing_one_dump_blames_nobody(shared_fixtures: Path, tmp_path: Path) -> None:
    """Near miss: s1 completed; rank 2's dump is gone. Gloo cannot say a finished op from a failed one: context only."""
    d, _ = _copy(shared_fixtures, "s1_healthy", tmp_path, (2,))
    rep = flightrec.inspect(str(d))
    assert _by_role(rep, "root") == [] and _by_role(rep, "cascade") == []
    assert [(s.rank, s.fields["no_dump"]) for s in _by_role(rep, "context")] == [(2, True)]


W4 = {"0": [0, 1, 2, 3]}


def _steps(n: int, done_last: bool) -> list[dict]:
    out = [E("0", s, "all_reduce", ((64,),)) for s in range(1, n + 1)]
    if not done_last:
        out[-1].update(state="started", retired=False)
    return out


def test_nccl_waiting_group_names_the_rank_without_dump(tmp_path: Path) -> None:
    for r in (0, 1, 3):
        write(tmp_path, r, _steps(5, done_last=False), W4)
    rep = flightrec.inspect(str(tmp_path))
    (root,) = _by_role(rep, "root")
    assert (root.rank, root.fields["collective_seq_id"], root.fields["no_dump"], root.fields["waiting_ranks"]) == (2, 5, True, [0, 1, 3])


def test_nccl_completed_group_missing_dump_names_nobody(tmp_path: Path) -> None:
    """Near miss: the same job where the last collective completed everywhere (NCCL says so)."""
    for r in (0, 1, 3):
        write(tmp_path, r, _steps(5, done_last=True), W4)
    rep = flightrec.inspect(str(tmp_path))
    assert rep.symptoms == []
    assert [c.detail for c in rep.coverage if c.status == "missing"] == ["no dump for rank 2"]


def test_most_dumps_missing_names_nobody(tmp_path: Path) -> None:
    """Near miss: 5 of 8 dumps missing (a node's collection failed): FR cannot say who the others wait for."""
    g = {"0": list(range(8))}
    for r in (0, 1, 2):
        write(tmp_path, r, _steps(5, done_last=False), g)
    rep = flightrec.inspect(str(tmp_path))
    assert _by_role(rep, "root") == []


def test_half_of_a_group_missing_names_nobody(tmp_path: Path) -> None:
    """Near miss: 4 of 8 dumps missing: as many silent ranks as waiting ones, no suspect."""
    g = {"0": list(range(8))}
    for r in (0, 1, 2, 3):
        write(tmp_path, r, _steps(5, done_last=False), g)
    assert _by_role(flightrec.inspect(str(tmp_path)), "root") == []
