"""Dump windows that differ per rank (issue 22): a rank whose ring does not hold a collective abstains from its vote.

Built from the real torch 2.13 dumps in shared/fixtures/flight_recorder/gloo: each
rank's own entries (stack frames, thread, timeout and all) are cloned to carry the
fixture's training loop on past the fault, as an NCCL job would (NCCL does not
abort on a mismatch; the ranks keep enqueueing). Then each rank keeps only the
window its ring would hold: the oldest entries are gone (record ids and sequence
numbers start later), the newest is the one it waits in. The loop, as the
fixtures' README says: per step ``sync_grads`` all_reduce [1024], ``reduce_loss``
all_reduce [1], and ``broadcast_params`` [16] on even steps, on the world group.
In s2_skip rank 2 skips ``reduce_loss`` at step 3 (#7) and stays shifted by one.

Truth is stated first in each test; near misses sit beside it.
"""
from __future__ import annotations

import copy
import pickle
from pathlib import Path

import pytest

from slurm_attr import flightrec
from slurm_attr.flightrec import safepickle

STEPS = 9  # #1-#22 on the world group
SYNC, LOSS, BCAST = ("gloo:all_reduce", 1024), ("gloo:all_reduce", 1), ("gloo:broadcast", 16)


def program(steps: int = STEPS) -> list[tuple[str, int]]:
    out = []
    for step in range(1, steps + 1):
        out += [SYNC, LOSS] + ([BCAST] if step % 2 == 0 else [])
    return out


def real(fixtures: Path, case: str, rank: int) -> dict:
    return safepickle.loads((fixtures / "flight_recorder" / "gloo" / case / f"nccl_trace_rank_{rank}").read_bytes())


def job(fixtures: Path, d: Path, windows: dict[int, tuple[int, int]], case: str = "s2_skip",
        ops: dict[int, list[tuple[str, int]]] | None = None, extra: tuple[int, ...] = ()) -> None:
    """Write one dump per rank: its ops (default: the loop; s2_skip's rank 2 without #7), cloned from its own
    real entries, kept from seq ``lo`` to ``hi`` (``windows[rank]``). Ranks in ``extra`` also all_reduce on a
    second group after each world collective, as a rank with more traffic does (its ring then wraps sooner)."""
    for rank, (lo, hi) in windows.items():
        dump = real(fixtures, case, rank)
        tmpl: dict[tuple[str, int], dict] = {}
        for e in dump["entries"]:
            tmpl.setdefault((e["profiling_name"], e["input_sizes"][0][0]), e)
        mine = (ops or {}).get(rank) or [op for i, op in enumerate(program()) if not (case == "s2_skip" and rank == 2 and i == 6)]
        entries, rid, t0 = [], 0, dump["entries"][0]["time_created_ns"]
        for seq, op in enumerate(mine, 1):
            for pg, pid in (("0", 0), ("1", 1)) if rank in extra else (("0", 0),):
                e = copy.deepcopy(tmpl[op] if pg == "0" else tmpl[SYNC])
                e.update(record_id=rid, collective_seq_id=seq, op_id=seq, time_created_ns=t0 + rid * 1_000_000,
                         retired=seq < hi, pg_id=pid, process_group=(pg, "default_pg" if pg == "0" else "extra"))
                rid += 1
                if lo <= seq <= hi:
                    entries.append(e)
        dump["entries"] = entries
        dump["pg_status"] = {str(pid): {"last_enqueued_collective": hi, "last_started_collective": -1, "last_completed_collective": hi - 1}
                             for pid in ((0, 1) if rank in extra else (0,))}
        if rank in extra:
            dump["pg_config"]["1"] = {"name": "1", "desc": "extra", "ranks": str(list(extra))}
        d.mkdir(parents=True, exist_ok=True)
        (d / f"nccl_trace_rank_{rank}").write_bytes(pickle.dumps(dump, protocol=2))


def roots(rep: flightrec.Report) -> list[tuple]:
    return sorted((s.rank, s.fields["pg"], s.fields["collective_seq_id"], s.fields["kind"]) for s in rep.symptoms if s.role == "root")


def notes(rep: flightrec.Report) -> list[str]:
    return [c.detail for c in rep.coverage if c.status == "truncated"]


def test_bystander_whose_ring_wrapped_past_the_divergence_is_not_named(shared_fixtures: Path, tmp_path: Path) -> None:
    """Truth: rank 2 skipped #7. Rank 0 also talks on a second group, so its ring (18 entries; rank 2's holds 20)
    keeps only #12-#20 of the world group: it cannot see #7. Ranks 1 and 3 were blocked in #10 (they hold #1-#10);
    rank 2 enqueued on to its #20 (the others' #21: it is one ahead). Before issue 22 the vote was held from #12
    on only, where ranks 1 and 3 hold nothing: rank 0 against rank 2, a tie nothing broke, and both were named."""
    job(shared_fixtures, tmp_path, {0: (12, 20), 1: (1, 10), 2: (1, 20), 3: (1, 10)}, extra=(0,))
    rep = flightrec.inspect(str(tmp_path))
    assert rep.dumps.traces[0].n_entries == 18 and rep.dumps.traces[0].streams["0"].lo == 12
    assert roots(rep) == [(2, "0", 7, "skip")]
    (s,) = [x for x in rep.symptoms if x.role == "root"]
    assert (s.fields["ambiguous"], s.fields["majority_ranks"], s.fields["abstained_ranks"]) == (False, [1, 3], [0])
    assert "sync_grads" in " ".join(s.fields["culprit_stack"]) and "reduce_loss" in " ".join(s.fields["majority_stack"])
    assert notes(rep) == ["PG 0 (default_pg) #7: rank 0 abstained, its dump does not hold #7 (its ring buffer wrapped "
                          "past it, or the dump ends before it); #7 is held by ranks 1-3"]


def test_every_window_holds_the_divergence(shared_fixtures: Path, tmp_path: Path) -> None:
    """Near miss: the same job with no ring wrapped: rank 2 at #7, as before, and nothing said of windows."""
    job(shared_fixtures, tmp_path, {0: (1, 20), 1: (1, 20), 2: (1, 19), 3: (1, 20)})
    rep = flightrec.inspect(str(tmp_path))
    assert roots(rep) == [(2, "0", 7, "skip")]
    assert notes(rep) == [] and "abstained_ranks" not in rep.symptoms[0].fields
    assert rep.analysis.windows["0"] == (1, 20)


def test_the_real_skip_fixture_is_unchanged(shared_fixtures: Path) -> None:
    rep = flightrec.inspect(str(shared_fixtures / "flight_recorder" / "gloo" / "s2_skip"))
    assert roots(rep) == [(2, "0", 7, "skip")] and notes(rep) == []


def test_culprit_whose_own_ring_wrapped_is_found_where_its_window_begins(shared_fixtures: Path, tmp_path: Path) -> None:
    """Near miss: rank 2's own ring wrapped past #7 (it holds #11-#19). What the others show still convicts it:
    its #11 is what they issue at #12, so it skipped a collective, at or before #11 (its dump cannot say where).
    The report says so instead of placing the skip at #7, which no dump of rank 2 shows."""
    job(shared_fixtures, tmp_path, {0: (1, 20), 1: (1, 20), 2: (11, 19), 3: (1, 20)}, extra=(2,))
    rep = flightrec.inspect(str(tmp_path))
    assert roots(rep) == [(2, "0", 11, "skip")]
    (s,) = [x for x in rep.symptoms if x.role == "root"]
    assert s.fields["first_compared"] is True and "at or before #11" in s.summary
    assert notes(rep) == ["PG 0 (default_pg) #11: rank 2's dump begins at #11, so it was compared with no other rank "
                          "before: it may have diverged earlier, where its ring buffer no longer reaches"]


def test_only_the_culprits_window_reaches_back(shared_fixtures: Path, tmp_path: Path) -> None:
    """Near miss: the other way round. Every other ring wrapped past #7 (they hold #12-#20); only rank 2's reaches
    back. Its #7 is compared with nobody, so the first difference anyone can see is #12, and the report says the
    skip may lie before it."""
    job(shared_fixtures, tmp_path, {0: (12, 20), 1: (12, 20), 2: (1, 20), 3: (12, 20)}, extra=(0, 1, 3))
    rep = flightrec.inspect(str(tmp_path))
    assert roots(rep) == [(2, "0", 12, "skip")]
    assert rep.symptoms[0].fields["first_compared"] is True and "abstained_ranks" not in rep.symptoms[0].fields
    assert notes(rep) == ["PG 0 (default_pg) #12: the other ranks' dumps begin at #12, so rank 2 was compared with no "
                          "other rank before: it may have diverged earlier, where only its own dump reaches"]


def test_one_off_mismatch_outside_the_culprits_window_names_nobody(shared_fixtures: Path, tmp_path: Path) -> None:
    """Near miss: rank 3 passed [1000] at #6 only (s4_size_mismatch's fault) and the job went on; rank 3's ring
    no longer holds #6. No dump shows a difference: FR cannot decide, and names no bystander instead."""
    ops = {3: [("gloo:all_reduce", 1000) if i == 5 else op for i, op in enumerate(program())]}
    job(shared_fixtures, tmp_path, {0: (1, 20), 1: (1, 20), 2: (1, 20), 3: (9, 20)}, case="s4_size_mismatch", ops=ops, extra=(3,))
    rep = flightrec.inspect(str(tmp_path))
    assert [s for s in rep.symptoms if s.id == "fr.collective_mismatch"] == []
    # near miss of the near miss: rank 3's window holds #6: it is named, with rank 0 abstaining
    job(shared_fixtures, tmp_path, {0: (9, 20), 1: (1, 20), 2: (1, 20), 3: (1, 20)}, case="s4_size_mismatch", ops=ops, extra=(0,))
    rep = flightrec.inspect(str(tmp_path))
    assert roots(rep) == [(3, "0", 6, "size")]
    assert rep.symptoms[0].fields["abstained_ranks"] == [0]


def test_two_ranks_truly_diverging_are_both_named(shared_fixtures: Path, tmp_path: Path) -> None:
    """Truth: rank 3 passed [1000] at #6 and rank 2 skipped #7; rank 0's ring holds #12-#20 only. Both culprits are
    named where they diverged; rank 0 is not. (Before issue 22: only rank 2, at #12; rank 3's #6 lay outside.)"""
    ops = {3: [("gloo:all_reduce", 1000) if i == 5 else op for i, op in enumerate(program())]}
    job(shared_fixtures, tmp_path / "d", {0: (12, 20), 1: (1, 20), 3: (1, 20)}, case="s4_size_mismatch", ops=ops, extra=(0,))
    job(shared_fixtures, tmp_path / "d", {2: (1, 19)})
    rep = flightrec.inspect(str(tmp_path / "d"))
    assert roots(rep) == [(2, "0", 7, "skip"), (3, "0", 6, "size")]
    assert {s.rank: s.fields["abstained_ranks"] for s in rep.symptoms if s.role == "root"} == {2: [0], 3: [0]}


def test_tie_at_the_divergence_decided_by_ranks_whose_window_begins_later(shared_fixtures: Path, tmp_path: Path) -> None:
    """Truth: rank 2 skipped reduce_loss at step 1 (#2), before the group had any history. Only ranks 2 and 3 hold
    #2 (ranks 0 and 1 wrapped past it: they hold #9-#20): a tie there. Ranks 0 and 1 join at #9 and side with
    rank 3, whose stream they share; rank 2's stays shifted. Rank 2 diverged at #2; rank 3 is not named."""
    skip2 = [op for i, op in enumerate(program()) if i != 1]
    job(shared_fixtures, tmp_path, {0: (9, 20), 1: (9, 20), 2: (1, 19), 3: (1, 20)}, ops={2: skip2}, extra=(0, 1))
    rep = flightrec.inspect(str(tmp_path))
    assert roots(rep) == [(2, "0", 2, "skip")]
    (s,) = [x for x in rep.symptoms if x.role == "root"]
    assert (s.fields["tie_break"], s.fields["ambiguous"], s.fields["abstained_ranks"]) == ("later", False, [0, 1])


@pytest.mark.parametrize("tail", [6, None])
def test_tail_read_that_misses_the_divergence_is_read_again(shared_fixtures: Path, tmp_path: Path, tail: int | None) -> None:
    """A large dump read by its newest entries only (the loader's tail read) abstains like a wrapped ring; a
    divergence before its window makes the analysis read it whole before concluding, so it votes after all."""
    job(shared_fixtures, tmp_path, {0: (1, 20), 1: (1, 20), 2: (1, 19), 3: (1, 20)})
    rep = flightrec.inspect(str(tmp_path), tail_entries=tail)
    assert roots(rep) == [(2, "0", 7, "skip")]
    assert not any(t.history_truncated for t in rep.dumps.traces.values()) and notes(rep) == []
