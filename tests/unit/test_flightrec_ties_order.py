"""Two-member groups, collective order across groups, stragglers (issue 12 items 3 and 9).

Synthetic dumps with torch 2.13's schema (entries as test_flightrec_analysis.E
writes them, pg_config with real descriptions). Truth is stated first in each
test; a near miss sits beside each case.
"""
from __future__ import annotations

import pickle
from pathlib import Path

from slurm_attr import flightrec
from test_flightrec_analysis import E


def dump(d: Path, rank: int, entries: list[dict], groups: dict[str, tuple[str, list[int]]]) -> None:
    """One rank's dump: ``groups`` is name -> (desc, members); entries get record and local pg ids."""
    pids: dict[str, int] = {}
    status: dict[int, list[int]] = {}
    for i, e in enumerate(entries):
        e["record_id"] = i
        e["time_created_ns"] = 1_000_000 * (i + 1)
        pid = e["pg_id"] = pids.setdefault(e["process_group"][0], len(pids))
        st = status.setdefault(pid, [-1, -1])
        st[0] = max(st[0], e["collective_seq_id"])
        if e["retired"]:
            st[1] = max(st[1], e["collective_seq_id"])
    cfg = {n: {"name": n, "desc": desc, "ranks": str(m)} for n, (desc, m) in groups.items() if rank in m}
    data = {"version": "2.10", "pg_config": cfg, "comm_lib_version": "2.27", "entries": entries,
            "pg_status": {str(k): {"last_enqueued_collective": a, "last_started_collective": -1, "last_completed_collective": b}
                          for k, (a, b) in status.items()}}
    d.mkdir(parents=True, exist_ok=True)
    (d / f"nccl_trace_rank_{rank}").write_bytes(pickle.dumps(data, protocol=2))


def roots(d: Path) -> list[tuple]:
    rep = flightrec.inspect(str(d))
    return [(s.rank, s.fields["pg"], s.fields["collective_seq_id"], s.fields["kind"], s.fields["ambiguous"]) for s in rep.symptoms if s.role == "root"]


def c(pg: str, seq: int, desc: str, size: int = 64, op: str = "all_reduce", done: bool = True) -> dict:
    e = E(pg, seq, op, ((size,),), desc=desc)
    if not done:
        e.update(state="started", retired=False)
    return e


# 8 ranks, tensor-parallel pairs TP0..TP3 ('1'..'4'), world '0'
TP = {"0": ("default_pg", list(range(8))), **{str(1 + g): (f"TP{g}", [2 * g, 2 * g + 1]) for g in range(4)}}


def _tp_job(d: Path, culprit: int, first_op_of: dict[int, str] | None = None) -> None:
    """Each rank: world all_reduce #1, then its TP pair's #1 (a first op: no history) and #2 [64]."""
    for r in range(8):
        g = 1 + r // 2
        desc = f"TP{r // 2}"
        first = (first_op_of or {}).get(g, "all_reduce")
        es = [c("0", 1, "default_pg", 8), c(str(g), 1, desc, 64, op=first)]
        es.append(c(str(g), 2, desc, 32 if r == culprit else 64, done=False))
        dump(d, r, es, TP)


def test_pair_tie_broken_by_sibling_groups(tmp_path: Path) -> None:
    """Truth: rank 2 (the LOWER rank of TP1, so rank order cannot be what decides) passed [32]; TP0/2/3 pass [64] at #2."""
    _tp_job(tmp_path, culprit=2)
    rep = flightrec.inspect(str(tmp_path))
    (s,) = [x for x in rep.symptoms if x.role == "root"]
    assert (s.rank, s.fields["pg"], s.fields["collective_seq_id"], s.fields["kind"]) == (2, "2", 2, "size")
    assert s.fields["tie_break"] == "siblings" and s.fields["ambiguous"] is False and "tied_with" not in s.fields


def test_pair_with_a_different_program_is_no_sibling(tmp_path: Path) -> None:
    """Near miss: TP1's own first op was an all_gather, unlike TP0/2/3: they are no siblings; both ranks named, ambiguous."""
    _tp_job(tmp_path, culprit=2, first_op_of={2: "all_gather"})
    assert sorted(roots(tmp_path)) == [(2, "2", 2, "size", True), (3, "2", 2, "size", True)]


def test_pair_tie_history_beats_siblings(tmp_path: Path) -> None:
    """The group's own history comes first: TP1 repeated all_reduce [64] before, so [64] is expected; rank 3 broke it."""
    groups = {"0": ("default_pg", [0, 1]), "1": ("TP0", [0, 1])}
    for r in (0, 1):
        es = [c("1", s, "TP0", 64) for s in range(1, 4)] + [c("1", 4, "TP0", 32 if r == 1 else 64, done=False)]
        dump(tmp_path, r, es, groups)
    rep = flightrec.inspect(str(tmp_path))
    (s,) = [x for x in rep.symptoms if x.role == "root"]
    assert (s.rank, s.fields["tie_break"], s.fields["ambiguous"]) == (1, "history", False)


W = {"0": ("default_pg", [0, 1, 2, 3]), "1": ("mirror", [0, 1, 2, 3])}


def _order_job(d: Path, swapped: set[int], world: dict = W) -> None:
    """Two steps of: world all_reduce, then mirror all_reduce. In step 3 the swapped ranks issue mirror first; all hang."""
    for r in world["0"][1]:
        es = []
        for s in (1, 2):
            es += [c("0", s, "default_pg"), c("1", s, "mirror", 8)]
        if r in swapped:
            es.append(c("1", 3, "mirror", 8, done=False))
        else:
            es.append(c("0", 3, "default_pg", done=False))
        dump(d, r, es, world)


def test_order_names_only_the_rank_whose_order_differs(tmp_path: Path) -> None:
    """Truth: rank 3 issued mirror #3 before world #3; ranks 0-2 wait in world #3 for it, it waits in mirror #3 for them."""
    _order_job(tmp_path, {3})
    rep = flightrec.inspect(str(tmp_path))
    (s,) = [x for x in rep.symptoms if x.role == "root"]
    assert (s.id, s.rank, s.fields["pg"], s.fields["collective_seq_id"], s.fields["kind"]) == ("fr.collective_mismatch", 3, "0", 3, "order")
    assert s.fields["waits_in"] == {"pg": "1", "collective_seq_id": 3} and s.fields["ambiguous"] is False
    (down,) = [x for x in rep.symptoms if x.role == "cascade"]
    assert (down.fields["pg"], down.fields["behind_ranks"], down.fields["root_ranks"]) == ("1", [0, 1, 2], [3])


def test_order_even_split_names_both(tmp_path: Path) -> None:
    """Near miss: two ranks, one each way: no majority order; both named, ambiguous."""
    world = {"0": ("default_pg", [0, 1]), "1": ("mirror", [0, 1])}
    _order_job(tmp_path, {1}, world)
    assert sorted(roots(tmp_path)) == [(0, "1", 3, "order", True), (1, "0", 3, "order", True)]


def test_rank_that_never_issued_either_is_stuck_not_order(tmp_path: Path) -> None:
    """Near miss: rank 3 is in neither collective (a straggler in compute): rank_stuck, not an ordering fault."""
    for r in range(4):
        es = []
        for s in (1, 2):
            es += [c("0", s, "default_pg"), c("1", s, "mirror", 8)]
        if r != 3:
            es.append(c("0", 3, "default_pg", done=False))
        dump(tmp_path, r, es, W)
    assert roots(tmp_path) == [(3, "0", 3, "not_reached", False)]


def test_straggler_at_time_limit(tmp_path: Path) -> None:
    """Truth: 63 of 64 ranks wait in world #41; rank 17 last completed #40 (slow, not hung in a collective)."""
    world = {"0": ("default_pg", list(range(64)))}
    for r in range(64):
        es = [c("0", s, "default_pg") for s in range(1, 41)]
        if r != 17:
            es.append(c("0", 41, "default_pg", done=False))
        dump(tmp_path, r, es, world)
    rep = flightrec.inspect(str(tmp_path))
    (s,) = rep.symptoms
    assert (s.id, s.rank, s.fields["collective_seq_id"], s.fields["waiting_ranks"]) == ("fr.rank_stuck", 17, 41, [r for r in range(64) if r != 17])
    # near miss: the same dumps where #41 completed everywhere it was issued (a live snapshot): no straggler claimed
    for r in range(64):
        if r != 17:
            es = [c("0", s, "default_pg") for s in range(1, 42)]
            dump(tmp_path, r, es, world)
    assert flightrec.inspect(str(tmp_path)).symptoms == []
