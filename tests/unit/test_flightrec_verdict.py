"""Flight Recorder findings through the whole verdict (issue 12 items 3 and 9), on bundles of real dumps.

The dumps are the shared fixtures (real torch 2.13 Gloo, 4 ranks, two per node)
laid out as the node epilog writes them, with a job.json; truth from each
scenario.json. Near misses beside each: the same job with the whole set of
dumps, or a state that changes the cause.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from slurm_attr.bundleanalysis import run_bundle
from slurm_attr.config import Config


def bundle(shared_fixtures: Path, tmp_path: Path, scenario: str, state: str, drop: tuple[int, ...] = ()) -> Path:
    src = shared_fixtures / "flight_recorder" / "gloo" / scenario
    root = tmp_path / scenario
    ranks = {}
    for r in range(4):
        node = f"n{1 + r // 2}"
        ranks[str(r)] = node
        (root / "nodes" / node / "fr").mkdir(parents=True, exist_ok=True)
        if r not in drop:
            shutil.copy(src / f"nccl_trace_rank_{r}", root / "nodes" / node / "fr")
    job = {"job_id": "9", "nodes": ["n1", "n2"], "ranks": ranks, "state": state, "exit_code": 0 if state == "TIMEOUT" else 1}
    (root / "job.json").write_text(json.dumps(job))
    return root


def verdict_of(path: Path):
    """What `sattr analyze DIR` decides: every analyser (rules, Flight Recorder, probe), then the verdict."""
    return run_bundle(str(path), Config())


def test_straggler_at_time_limit_is_the_culprit(shared_fixtures: Path, tmp_path: Path) -> None:
    """s5: rank 0 sleeps before sync_grads (seq 6) while 1-3 wait in it; the job then hits its time limit."""
    meta = json.loads((shared_fixtures / "flight_recorder" / "gloo" / "s5_stuck_compute" / "scenario.json").read_text())
    assert meta["expected"]["culprit_ranks"] == [0]
    v = verdict_of(bundle(shared_fixtures, tmp_path, "s5_stuck_compute", "TIMEOUT"))
    assert (v.cause, v.culprit_ranks, v.culprit_nodes) == ("time_limit", [0], ["n1"])


def test_time_limit_without_a_straggler_names_nobody(shared_fixtures: Path, tmp_path: Path) -> None:
    """Near miss: a healthy FR picture (s1) at the time limit: time_limit, no culprit."""
    v = verdict_of(bundle(shared_fixtures, tmp_path, "s1_healthy", "TIMEOUT"))
    assert (v.cause, v.culprit_ranks, v.culprit_nodes) == ("time_limit", [], [])


def test_missing_dump_of_the_subgroup_culprit(shared_fixtures: Path, tmp_path: Path) -> None:
    """s6 without rank 1's dump: rank 1 is the suspect, rank 0 (blocked behind it) is not a culprit."""
    v = verdict_of(bundle(shared_fixtures, tmp_path, "s6_subgroup_mismatch", "FAILED", drop=(1,)))
    assert (v.cause, v.culprit_ranks, v.culprit_nodes) == ("rank_stuck", [1], ["n1"])
    (root,) = [s for s in v.symptoms if s.id == "fr.rank_stuck"]
    assert root.role == "root" and root.fields["no_dump"] is True


def test_whole_subgroup_job_names_only_the_culprit(shared_fixtures: Path, tmp_path: Path) -> None:
    """Near miss: every dump present: collective_mismatch on rank 1; the downstream DP hangs add no culprit rank."""
    v = verdict_of(bundle(shared_fixtures, tmp_path, "s6_subgroup_mismatch", "FAILED"))
    assert (v.cause, v.culprit_ranks) == ("collective_mismatch", [1])


def test_straggler_without_a_dump_at_time_limit(shared_fixtures: Path, tmp_path: Path) -> None:
    """s5 with the sleeping rank's dump gone (killed at the limit before it dumped): the waiting ranks still name it."""
    v = verdict_of(bundle(shared_fixtures, tmp_path, "s5_stuck_compute", "TIMEOUT", drop=(0,)))
    assert (v.cause, v.culprit_ranks) == ("time_limit", [0])


def test_time_limit_with_a_missing_dump_nobody_waits_for(shared_fixtures: Path, tmp_path: Path) -> None:
    """Near miss: s1 (healthy picture) at the limit with rank 2's dump gone: only a note, no culprit."""
    v = verdict_of(bundle(shared_fixtures, tmp_path, "s1_healthy", "TIMEOUT", drop=(2,)))
    assert (v.cause, v.culprit_ranks) == ("time_limit", [])
