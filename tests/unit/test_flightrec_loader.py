"""Reading large dumps by head and tail only, and falling back to the whole file when that is not enough.

The dumps come from bench/gen_fr.py, which writes pickles byte-for-byte the way
torch's C++ Pickler does (memoised strings and stack frames, MARK/APPENDS lists).
"""
from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from slurm_attr import flightrec
from slurm_attr.flightrec import safepickle
from slurm_attr.flightrec.loader import load_dumps


def _write_set(gen_fr, d: Path, world: int = 16, **kw) -> None:
    d.mkdir(parents=True, exist_ok=True)
    for r in range(world):
        (d / f"nccl_trace_rank_{r}").write_bytes(gen_fr.TorchStylePickler().dump(gen_fr.rank_dump(r, world, 2000, **kw)))


def test_generator_writes_what_pickle_reads(gen_fr) -> None:
    d = gen_fr.rank_dump(3, 16, 2000, fault_rank=None)
    data = gen_fr.TorchStylePickler().dump(d)
    assert pickle.loads(data) == d
    assert b"q" not in data[:2] and data.count(b"](") > 2000  # lists are not memoised, as in torch


def test_tail_read_matches_full_read(gen_fr, tmp_path: Path) -> None:
    _write_set(gen_fr, tmp_path, fault_rank=13)
    tail = load_dumps(str(tmp_path), tail_entries=256, workers=1)
    full = load_dumps(str(tmp_path), tail_entries=None, workers=1)
    assert all(tr.history_truncated for tr in tail.traces.values())
    assert not any(tr.history_truncated for tr in full.traces.values())
    for r, tr in tail.traces.items():
        assert 240 <= sum(len(s.sigs) for s in tr.streams.values()) <= 300
        for name, st in tr.streams.items():
            ref = full.traces[r].streams[name]
            assert st.hi == ref.hi
            assert all(st.sig(s) == ref.sig(s) for s in range(st.lo, st.hi + 1))
        assert tr.pg_status == full.traces[r].pg_status and tr.pg_config == full.traces[r].pg_config
    rep = flightrec.inspect(str(tmp_path))
    (s,) = rep.symptoms
    assert (s.rank, s.fields["pg"], s.fields["kind"], s.fields["history"]) == (13, "0", "size", "newest entries only")
    assert s.fields["collective_seq_id"] == full.traces[0].streams["0"].hi
    assert s.fields["culprit_stack"] and s.fields["first_differing_frame"] is None  # same call site, same stack


def test_old_divergence_is_found_by_reading_the_whole_history(gen_fr, tmp_path: Path) -> None:
    """Rank 5 skipped a world all_reduce 200 steps ago: every later one is shifted, the tail cannot say where it began."""
    _write_set(gen_fr, tmp_path, fault_rank=5, fault_step=200, fault_kind="skip", vary_world=True)
    full = load_dumps(str(tmp_path), tail_entries=None, workers=1)
    rep = flightrec.inspect(str(tmp_path))
    (s,) = [x for x in rep.symptoms if x.role == "root"]
    assert (s.rank, s.fields["pg"], s.fields["kind"]) == (5, "0", "skip")
    assert s.fields["history"] == "full"
    # step 200 is world collective #201; the full-history analysis agrees
    assert s.fields["collective_seq_id"] == 201
    lo = full.traces[0].streams["0"].lo
    assert lo < 201
    # only the members of the diverging group were read again
    assert not any(tr.history_truncated for tr in rep.dumps.traces.values())


def test_tail_needing_a_string_from_the_middle_falls_back(gen_fr, tmp_path: Path) -> None:
    _write_set(gen_fr, tmp_path, world=8, fault_rank=None)
    d = gen_fr.rank_dump(2, 8, 2000, fault_rank=None)
    name = "worker-thread-first-seen-mid-buffer"
    for e in d["entries"][1000:]:
        e["thread_name"] = name  # defined (BINPUT) at entry 1000, referenced (BINGET) in the tail
    raw = gen_fr.TorchStylePickler().dump(d)
    (tmp_path / "nccl_trace_rank_2").write_bytes(raw)
    got = safepickle.load(lambda off, n: raw[off : off + n], len(raw), 1 << 30, 256)
    assert got.history_truncated is False and len(got.data["entries"]) == 2000
    ds = load_dumps(str(tmp_path), workers=1)
    assert ds.traces[2].history_truncated is False and ds.traces[3].history_truncated is True
    # no fault: the generator leaves every rank waiting in its last step, a hang nobody is blamed for
    roots = [s for s in flightrec.inspect(str(tmp_path)).symptoms if s.role == "root"]
    assert [(s.id, s.rank) for s in roots] == [("fr.comm_hang", None)]


def test_parallel_load_equals_serial(gen_fr, tmp_path: Path, monkeypatch) -> None:
    from slurm_attr.flightrec import loader
    _write_set(gen_fr, tmp_path, world=16, fault_rank=9)
    monkeypatch.setattr(loader, "PARALLEL_MIN_FILES", 4)
    par = load_dumps(str(tmp_path), workers=2)
    ser = load_dumps(str(tmp_path), workers=1)
    assert sorted(par.traces) == sorted(ser.traces) == list(range(16))
    assert par.sigs == ser.sigs and par.members == ser.members
    for r in range(16):
        assert par.traces[r].streams.keys() == ser.traces[r].streams.keys()
        for k, st in par.traces[r].streams.items():
            assert st.sigs == ser.traces[r].streams[k].sigs
    # every field, as the workers sent them (tracewire.py) and as read here
    assert par.traces == ser.traces
    assert par.traces[9] != par.traces[8]  # near miss: the comparison sees a difference


def test_file_over_the_cap(gen_fr, tmp_path: Path) -> None:
    from slurm_attr.config import Config
    _write_set(gen_fr, tmp_path, world=2, fault_rank=None)
    size = (tmp_path / "nccl_trace_rank_0").stat().st_size
    cfg = Config()
    cfg.collect.fr_file_cap_bytes = 1000
    rep = flightrec.inspect(str(tmp_path), cfg)
    assert [c.status for c in rep.coverage] == ["truncated", "truncated"]
    assert "more than the 1000-byte cap" in rep.coverage[0].detail
    # a cap the whole file exceeds but head + tail do not: read in tail mode, within the cap
    cfg.collect.fr_file_cap_bytes = size // 2
    rep = flightrec.inspect(str(tmp_path), cfg, tail_entries=128)
    assert sorted(rep.dumps.traces) == [0, 1] and all(tr.history_truncated for tr in rep.dumps.traces.values())
    rep = flightrec.inspect(str(tmp_path), cfg, tail_entries=None)
    assert [c.status for c in rep.coverage] == ["truncated", "truncated"]


def test_full_history_is_not_cut_by_the_analysis_budget(gen_fr, tmp_path: Path, monkeypatch) -> None:
    """Under a spent budget the verdict's analysis skips dumps (coverage); `sattr fr --full-history` reads them all."""
    import time as real_time

    from slurm_attr.flightrec import loader

    class Late:
        @staticmethod
        def monotonic() -> float:
            return real_time.monotonic() + 1e6  # every budget already spent

    _write_set(gen_fr, tmp_path, world=16, fault_rank=2)
    monkeypatch.setattr(loader, "time", Late)
    cut = flightrec.inspect(str(tmp_path), tail_entries=None, workers=1)
    assert cut.dumps.traces == {} and {c.status for c in cut.coverage} == {"truncated"}
    full = flightrec.inspect(str(tmp_path), tail_entries=None, workers=1, budget=False)
    assert sorted(full.dumps.traces) == list(range(16))
    assert [s.rank for s in full.symptoms if s.role == "root"] == [2]


def test_a_bundles_rank_map_is_read_while_the_workers_load(gen_fr, tmp_path: Path, monkeypatch) -> None:
    """load_dumps reads the bundle's rank map (job.json or the collectors' collect.json) while
    the pool loads the dumps: the same map with workers as without, and none for a plain dir."""
    import json

    from slurm_attr.flightrec import loader
    world = 16
    for r in range(world):
        d = tmp_path / "b" / "nodes" / f"n{r // 8}" / "fr"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"nccl_trace_rank_{r}").write_bytes(gen_fr.TorchStylePickler().dump(gen_fr.rank_dump(r, world, 200, fault_rank=None)))
    ranks = {str(r): f"n{r // 8}" for r in range(world)}
    (tmp_path / "b" / "job.json").write_text(json.dumps({"job_id": "7", "nodes": ["n0", "n1"], "ranks": ranks}))
    monkeypatch.setattr(loader, "PARALLEL_MIN_FILES", 4)
    par = load_dumps(str(tmp_path / "b"), workers=2)
    ser = load_dumps(str(tmp_path / "b"), workers=1)
    want = {r: f"n{r // 8}" for r in range(world)}
    assert par.job_ranks == ser.job_ranks == want and sorted(par.traces) == list(range(world))
    assert par.node_of(9) == "n1" and par.traces == ser.traces
    # near miss: the same dumps in a plain directory carry no rank map
    flat = load_dumps(str(tmp_path / "b" / "nodes" / "n1" / "fr"), workers=2)
    assert flat.job_ranks == {} and sorted(flat.traces) == list(range(8, 16)) and flat.node_of(9) is None
    # ... and a bundle with no dump at all still reads it
    (tmp_path / "e" / "nodes" / "n0").mkdir(parents=True)
    (tmp_path / "e" / "job.json").write_text(json.dumps({"job_id": "8", "ranks": {"0": "n0"}}))
    empty = load_dumps(str(tmp_path / "e"), workers=2)
    assert empty.traces == {} and empty.job_ranks == {0: "n0"}


def test_the_analysis_freezes_the_loaded_traces_only_for_itself(gen_fr, tmp_path: Path) -> None:
    """inspect leaves the GC's frozen generation as it found it: empty after, and someone
    else's frozen objects (rules/parallel.py freezes before forking) stay frozen."""
    import gc

    from slurm_attr.flightrec import loader
    _write_set(gen_fr, tmp_path, world=4, fault_rank=None)
    assert gc.get_freeze_count() == 0
    seen = []
    with loader.frozen_gc():
        seen.append(gc.get_freeze_count())
    assert seen[0] > 0 and gc.get_freeze_count() == 0
    rep = flightrec.inspect(str(tmp_path))
    assert gc.get_freeze_count() == 0 and sorted(rep.dumps.traces) == [0, 1, 2, 3]
    gc.freeze()  # near miss: frozen by someone else before
    try:
        before = gc.get_freeze_count()
        with loader.frozen_gc():
            assert gc.get_freeze_count() == before
        flightrec.inspect(str(tmp_path))
        assert gc.get_freeze_count() == before
    finally:
        gc.unfreeze()
