"""Matching logic on small synthetic dumps with the real schema: each case one rule of the analyser."""
from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import pytest

from slurm_attr import flightrec
from slurm_attr.flightrec.blame import analyse
from slurm_attr.flightrec.loader import load_dumps
from slurm_attr.flightrec.symptoms import first_difference, ranges


def E(pg: str, seq: int, op: str = "all_reduce", sizes: Any = ((4,),), dtype: str = "Float", *, desc: str = "", pid: int = 0,
      done: bool = True, t: int = 0, p2p: int | None = None, backend: str = "nccl", frames: list | None = None) -> dict:
    """One FR entry as torch 2.13 writes it."""
    e = {"record_id": 0, "pg_id": pid, "process_group": (pg, desc or ("default_pg" if pg == "0" else f"G{pg}")),
         "collective_seq_id": seq, "p2p_seq_id": p2p or 0, "op_id": seq, "profiling_name": f"{backend}:{op}",
         "time_created_ns": t, "input_sizes": [list(s) for s in sizes], "output_sizes": [list(s) for s in sizes],
         "input_dtypes": [dtype] * len(sizes), "output_dtypes": [dtype] * len(sizes),
         "state": "completed" if done else "scheduled", "time_discovered_started_ns": None,
         "time_discovered_completed_ns": None, "retired": done, "timeout_ms": 600000, "is_p2p": p2p is not None,
         "thread_name": "python", "thread_id": "7"}
    if frames is not None:
        e["frames"] = frames
    return e


def write(d: Path, rank: int, entries: list[dict], groups: dict[str, list[int]] | None = None,
          status: dict[int, tuple[int, int]] | None = None, fmt: str = "pickle", keep_pids: bool = False) -> None:
    """A dump for ``rank``: entries get record ids (and local pg ids in order unless ``keep_pids``)."""
    pids: dict[str, int] = {}
    for i, e in enumerate(entries):
        e["record_id"] = i
        if not keep_pids:
            e["pg_id"] = pids.setdefault(e["process_group"][0], len(pids))
        e["time_created_ns"] = e["time_created_ns"] or 1_000_000 * (i + 1)
    if status is None:
        status = {}
        for e in entries:
            if not e["is_p2p"]:
                pid = e["pg_id"]
                enq, comp = status.get(pid, (-1, -1))
                status[pid] = (max(enq, e["collective_seq_id"]), max(comp, e["collective_seq_id"]) if e["retired"] else comp)
    cfg = {name: {"name": name, "desc": "default_pg" if name == "0" else f"G{name}", "ranks": str(members)}
           for name, members in (groups or {}).items() if rank in members}
    dump = {"version": "2.10", "pg_config": cfg, "comm_lib_version": "2.27",
            "pg_status": {str(k): {"last_enqueued_collective": v[0], "last_started_collective": -1, "last_completed_collective": v[1]}
                          for k, v in status.items()},
            "entries": entries}
    d.mkdir(parents=True, exist_ok=True)
    if fmt == "json":
        (d / f"nccl_trace_rank_{rank}.json").write_text(json.dumps(dump))
    else:
        (d / f"nccl_trace_rank_{rank}").write_bytes(pickle.dumps(dump, protocol=2))


def roots(d: Path) -> list[tuple]:
    rep = flightrec.inspect(str(d))
    return [(s.id, s.rank, s.fields["pg"], s.fields["collective_seq_id"], s.fields["kind"]) for s in rep.symptoms if s.role == "root"]


def program(step_ops: list[tuple[str, int]], steps: int) -> list[dict]:
    """A repeating step on group '0': (op, size) per call."""
    out, seq = [], 0
    for _ in range(steps):
        for op, size in step_ops:
            seq += 1
            out.append(E("0", seq, op, ((size,),)))
    return out


W4 = {"0": [0, 1, 2, 3]}


def test_healthy_dumps_give_nothing(tmp_path: Path) -> None:
    for r in range(4):
        write(tmp_path, r, program([("all_reduce", 1024), ("all_reduce", 1)], 5), W4)
    rep = flightrec.inspect(str(tmp_path))
    assert rep.symptoms == [] and [c.status for c in rep.coverage] == ["ok"]


def test_majority_vote_not_first_rank(tmp_path: Path) -> None:
    """The culprit is rank 0, whose dump sorts first: torch's analyser would blame everyone else."""
    for r in range(4):
        entries = program([("all_reduce", 1024)], 4)
        if r == 0:
            entries[2]["input_sizes"] = entries[2]["output_sizes"] = [[1000]]
        write(tmp_path, r, entries, W4)
    assert roots(tmp_path) == [("fr.collective_mismatch", 0, "0", 3, "size")]


@pytest.mark.parametrize("mutate,kind", [
    (lambda e: e.update(profiling_name="nccl:all_gather"), "op"),
    (lambda e: e.update(input_dtypes=["BFloat16"], output_dtypes=["BFloat16"]), "dtype"),
    (lambda e: e.update(input_sizes=[[3, 4]], output_sizes=[[3, 4]]), "size"),
])
def test_kinds(tmp_path: Path, mutate, kind: str) -> None:
    for r in range(4):
        entries = program([("all_reduce", 12), ("broadcast", 2)], 3)
        if r == 2:
            mutate(entries[3])
        write(tmp_path, r, entries, W4)
    assert roots(tmp_path) == [("fr.collective_mismatch", 2, "0", 4, kind)]


def test_skip_with_lookahead_when_the_others_went_on(tmp_path: Path) -> None:
    """NCCL ranks enqueue ahead: the majority's k+1 exists and equals the culprit's k."""
    step = [("all_reduce", 100), ("all_reduce", 1), ("broadcast", 7)]
    for r in range(4):
        entries = program(step, 4)
        if r == 1:
            del entries[4]  # skips step 2's all_reduce [1]
            for e in entries[4:]:
                e["collective_seq_id"] -= 1
        write(tmp_path, r, entries, W4)
    assert roots(tmp_path) == [("fr.collective_mismatch", 1, "0", 5, "skip")]


def test_two_rank_tie_broken_by_history(tmp_path: Path) -> None:
    """Two ranks disagree: the one whose signature the group's history never followed that way is the culprit."""
    g = {"0": [0, 1]}
    for r in range(2):
        entries = program([("all_reduce", 64)], 5)
        if r == 1:
            entries[4]["input_sizes"] = entries[4]["output_sizes"] = [[32]]
        write(tmp_path, r, entries, g)
    rep = flightrec.inspect(str(tmp_path))
    (s,) = rep.symptoms
    assert (s.rank, s.fields["kind"], s.fields["ambiguous"]) == (1, "size", False)


def test_two_rank_tie_without_history_is_ambiguous(tmp_path: Path) -> None:
    g = {"0": [0, 1]}
    write(tmp_path, 0, [E("0", 1, "all_reduce", ((8,),))], g)
    write(tmp_path, 1, [E("0", 1, "all_reduce", ((9,),))], g)
    rep = flightrec.inspect(str(tmp_path))
    # issue 12 item 3: still tied after history and siblings -> both ranks named, each ambiguous
    assert sorted(s.rank for s in rep.symptoms) == [0, 1]
    for s in rep.symptoms:
        assert s.fields["ambiguous"] is True and s.fields["confidence"] == "low"
        assert s.fields["tied_with"] == [1 - s.rank]


def test_all_to_all_sizes_may_differ(tmp_path: Path) -> None:
    for r in range(4):
        write(tmp_path, r, [E("0", 1, "all_to_all", ((100 + r, 8),)), E("0", 2, "all_reduce", ((4,),))], W4)
    assert flightrec.inspect(str(tmp_path)).symptoms == []


def test_stuck_rank_and_healthy_lag(tmp_path: Path) -> None:
    for r in range(4):
        entries = program([("all_reduce", 4)], 3)
        if r == 3:
            entries = entries[:2]  # never reached seq 3
        else:
            entries[2].update(state="scheduled", retired=False)  # waiting in it
        write(tmp_path, r, entries, W4)
    assert roots(tmp_path) == [("fr.rank_stuck", 3, "0", 3, "not_reached")]
    # the same lag in a dump where seq 3 completed everywhere else is no finding (a live dump)
    for r in range(3):
        write(tmp_path, r, program([("all_reduce", 4)], 3), W4)
    assert roots(tmp_path) == []


def test_comm_hang_all_entered_none_completed(tmp_path: Path) -> None:
    for r in range(4):
        entries = program([("all_reduce", 4)], 3)
        entries[2].update(state="scheduled", retired=False)
        write(tmp_path, r, entries, W4)
    rep = flightrec.inspect(str(tmp_path))
    (s,) = rep.symptoms
    assert (s.id, s.cause, s.rank, s.fields["kind"], s.fields["collective_seq_id"]) == ("fr.comm_hang", "comm_hang", None, "hang", 3)
    assert s.fields["waiting_ranks"] == [0, 1, 2, 3]


def test_hang_with_a_missing_dump_blames_the_missing_rank(tmp_path: Path) -> None:
    for r in (0, 1, 3):
        entries = program([("all_reduce", 4)], 3)
        entries[2].update(state="scheduled", retired=False)
        write(tmp_path, r, entries, W4)
    rep = flightrec.inspect(str(tmp_path))
    (s,) = rep.symptoms
    assert (s.id, s.rank, s.fields["no_dump"], s.fields["ranks_without_dump"]) == ("fr.rank_stuck", 2, True, [2])
    assert any(c.status == "missing" and "rank 2" in c.detail for c in rep.coverage)


def test_wrapped_buffers_compare_every_seq_some_rank_holds(tmp_path: Path) -> None:
    """Rank 0 also talks on group '1', so its ring holds fewer of group '0's collectives: it abstains before #29."""
    groups = {"0": [0, 1, 2, 3], "1": [0, 5]}
    full = program([("all_reduce", 8), ("all_reduce", 1)], 20)
    full[37]["input_sizes"] = full[37]["output_sizes"] = [[2]]  # rank 2's fault, below
    for r in range(4):
        entries = [dict(e) for e in full]
        if r == 2:
            entries[37] = E("0", 38, "all_reduce", ((3,),))
        if r == 0:
            # interleave group '1' traffic and keep only the newest 12 entries of group '0' (wrapped)
            entries = [x for e in entries[-12:] for x in (e, E("1", e["collective_seq_id"], "all_reduce", ((5,),)))]
        else:
            entries = [e for e in entries[-25:]]
        write(tmp_path, r, entries, groups)
    write(tmp_path, 5, [E("1", s, "all_reduce", ((5,),)) for s in range(29, 41)], groups)
    ds = load_dumps(str(tmp_path))
    an = analyse(ds)
    assert an.windows["0"] == (16, 40)  # the union: #16-#28 are voted on by ranks 1-3
    assert roots(tmp_path) == [("fr.collective_mismatch", 2, "0", 38, "size")]
    assert [f.abstained for f in an.roots] == [()]  # every rank holds #38


def test_downstream_groups_are_cascade_not_roots(tmp_path: Path) -> None:
    """TP {0,1}, {2,3}; DP {0,2}, {1,3}. Rank 1 is stuck in compute before its TP all_reduce."""
    groups = {"0": [0, 1, 2, 3], "1": [0, 1], "2": [2, 3], "3": [0, 2], "4": [1, 3]}
    tp = {0: "1", 1: "1", 2: "2", 3: "2"}
    dp = {0: "3", 1: "4", 2: "3", 3: "4"}
    for r in range(4):
        entries = []
        for step in (1, 2, 3):
            entries.append(E(tp[r], step, "all_reduce", ((64,),)))
            entries.append(E(dp[r], step, "all_reduce", ((1024,),)))
        if r == 1:
            entries = entries[:4]  # never issued TP seq 3
        if r == 0:
            entries = entries[:5]
            entries[4].update(state="scheduled", retired=False)  # waits in TP seq 3 for rank 1
        if r in (2, 3):
            entries[5].update(state="scheduled", retired=False)  # waits in DP #3 for rank 0 / rank 1
        write(tmp_path, r, entries, groups)
    rep = flightrec.inspect(str(tmp_path))
    got = [(s.id, s.role, s.rank, s.fields["pg"], s.fields["collective_seq_id"]) for s in rep.symptoms]
    assert got == [
        ("fr.rank_stuck", "root", 1, "1", 3),
        # rank 0 never reached DP0 #3: it waits in TP0 #3. A downstream hang names its victims in
        # behind_ranks, not as the symptom's rank (a verdict must not take them for culprits).
        ("fr.downstream_hang", "cascade", None, "3", 3),
    ]
    assert rep.symptoms[1].fields["behind_ranks"] == [0]
    root = rep.symptoms[0]
    assert root.fields["also_missing_in"] == [{"pg": "4", "collective_seq_id": 3}]
    assert rep.symptoms[1].fields["root_ranks"] == [1]


def test_ranks_waiting_on_each_other_are_an_order_mismatch(tmp_path: Path) -> None:
    """Rank 0 calls A then B, rank 1 calls B then A: each waits for the other."""
    groups = {"1": [0, 1], "2": [0, 1]}
    write(tmp_path, 0, [E("1", 1, pid=1, done=False)], groups, status={1: (1, 0), 2: (-1, -1)}, keep_pids=True)
    write(tmp_path, 1, [E("2", 1, pid=2, done=False)], groups, status={1: (-1, -1), 2: (1, 0)}, keep_pids=True)
    got = roots(tmp_path)
    assert sorted(got) == [("fr.collective_mismatch", 0, "2", 1, "order"), ("fr.collective_mismatch", 1, "1", 1, "order")]


def test_zero_entry_rank_mapped_through_peers(tmp_path: Path) -> None:
    """An only-active dump of a GIL-locked rank: no entries, pg_status keyed by local pg ids only."""
    groups = {"0": [0, 1, 2, 3], "7": [0, 1, 2, 3]}
    for r in (0, 1, 2):
        write(tmp_path, r, [E("7", 11, pid=1, done=False), E("7", 12, pid=1, done=False)], groups,
              status={0: (5, 5), 1: (12, 10)}, keep_pids=True)
    write(tmp_path, 3, [], groups, status={0: (5, 5), 1: (10, 10)}, keep_pids=True)
    assert roots(tmp_path) == [("fr.rank_stuck", 3, "7", 11, "not_reached")]


def test_p2p_entries_are_not_voted_on(tmp_path: Path) -> None:
    for r in range(2):
        peer = 1 - r
        op = f"send {r}->{peer}" if r == 0 else f"recv {r}<-{peer}"
        write(tmp_path, r, [E("0", 1), E("0", 1, op, p2p=1), E("0", 2)], {"0": [0, 1]})
    rep = flightrec.inspect(str(tmp_path))
    assert rep.symptoms == []
    assert set(rep.dumps.traces[0].p2p) == {"0"}


def test_coalesced_entries_with_one_seq_compare_as_one(tmp_path: Path) -> None:
    for r in range(3):
        entries = [E("0", 1), E("0", 2, sizes=((4,),)), E("0", 2, sizes=((8,),)), E("0", 3)]
        if r == 1:
            entries[2]["input_sizes"] = entries[2]["output_sizes"] = [[9]]
        write(tmp_path, r, entries, {"0": [0, 1, 2]})
    assert roots(tmp_path) == [("fr.collective_mismatch", 1, "0", 2, "size")]


def test_json_and_pickle_agree(tmp_path: Path) -> None:
    for fmt in ("pickle", "json"):
        d = tmp_path / fmt
        for r in range(4):
            entries = program([("all_reduce", 4), ("all_gather", 2)], 3)
            if r == 3:
                entries[5]["profiling_name"] = "nccl:all_reduce"
            write(d, r, entries, W4, fmt=fmt)
    assert roots(tmp_path / "pickle") == roots(tmp_path / "json") == [("fr.collective_mismatch", 3, "0", 6, "op")]


def test_stacks_and_first_differing_frame(tmp_path: Path) -> None:
    def stack(*fns):
        return [{"name": n, "filename": f"/srv/{f}.py", "line": ln} for n, f, ln in fns]
    inner = [("all_reduce", "c10d", 10), ("wrapper", "logger", 5)]
    good = stack(*inner, ("step", "train", 40), ("main", "train", 90))
    bad = stack(*inner, ("eval_step", "train", 77), ("main", "train", 90))
    for r in range(3):
        entries = [E("0", 1, frames=good), E("0", 2, frames=good if r != 1 else bad)]
        if r == 1:
            entries[1]["input_sizes"] = entries[1]["output_sizes"] = [[5]]
        write(tmp_path, r, entries, {"0": [0, 1, 2]})
    (s,) = flightrec.inspect(str(tmp_path)).symptoms
    assert s.fields["first_differing_frame"] == {"culprit": "/srv/train.py:77 eval_step", "majority": "/srv/train.py:40 step",
                                                 "depth_from_outermost": 1}
    assert s.fields["culprit_stack"][0] == "/srv/c10d.py:10 all_reduce"


def test_first_difference_and_ranges() -> None:
    assert first_difference(["a", "b", "m"], ["a", "b", "m"]) is None
    assert first_difference(["x", "m"], ["y", "z", "m"])["depth_from_outermost"] == 1
    assert first_difference([], ["a"]) is None
    assert ranges([5, 0, 1, 2, 7, 8]) == "0-2,5,7-8"


def test_prefix_detection_and_pickle_preferred(tmp_path: Path) -> None:
    for r in range(3):
        entries = program([("all_reduce", 4)], 2)
        if r == 1:
            entries[1]["input_sizes"] = entries[1]["output_sizes"] = [[6]]
        dump = {"version": "2.10", "pg_config": {}, "pg_status": {}, "entries": entries}
        (tmp_path / f"myjob-r{r}").write_bytes(pickle.dumps(dump, protocol=2))
        (tmp_path / f"myjob-r{r}.json").write_text(json.dumps(dump))
    (tmp_path / "notes.txt").write_text("hello")
    (tmp_path / "myjob-r1.tmp").write_text("partial")
    ds = load_dumps(str(tmp_path))
    assert ds.prefix == "myjob-r" and sorted(ds.traces) == [0, 1, 2]
    assert all(tr.fmt == "pickle" for tr in ds.traces.values())
    # a broken pickle falls back to its JSON twin
    (tmp_path / "myjob-r1").write_bytes(b"\x80\x02}(")
    ds = load_dumps(str(tmp_path))
    assert ds.traces[1].fmt == "json" and ds.traces[1].path == "myjob-r1.json"
    assert roots(tmp_path) == [("fr.collective_mismatch", 1, "0", 2, "size")]


def test_files_not_named_like_dumps(tmp_path: Path) -> None:
    (tmp_path / "trace.bin").write_bytes(b"\x80\x02}.")
    (tmp_path / "notes").write_text("x")
    rep = flightrec.inspect(str(tmp_path))
    assert rep.symptoms == []
    assert [(c.status, c.detail.split(" ")[0]) for c in rep.coverage] == [("error", "2")]


def test_tail_budget_by_job_size() -> None:
    from slurm_attr.flightrec.loader import tail_for
    assert [tail_for(n) for n in (4, 512, 1024, 4096, 100_000)] == [512, 512, 256, 64, 64]
