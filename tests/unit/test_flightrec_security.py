"""Hostile dumps: nothing a job writes may run code, hang the analysis or reach the terminal raw.

Every payload here would run ``touch <canary>`` under plain ``pickle.load`` or
``eval`` (what torch's own analyser does); the canary must never appear and
each file must show up as a coverage entry.
"""
from __future__ import annotations

import copyreg
import json
import os
import pickle
import struct
import time
from pathlib import Path

import pytest

from slurm_attr import flightrec
from slurm_attr.flightrec import safepickle
from slurm_attr.flightrec.trace import parse_ranks
from slurm_attr.flightrec.types import DumpError


def _entry(seq: int, size: int = 4, desc: str = "default_pg") -> dict:
    return {"record_id": seq, "pg_id": 0, "process_group": ("0", desc), "collective_seq_id": seq, "p2p_seq_id": 0,
            "op_id": seq, "profiling_name": "nccl:all_reduce", "time_created_ns": 1000 + seq, "input_sizes": [[size]],
            "output_sizes": [[size]], "input_dtypes": ["Float"], "output_dtypes": ["Float"], "state": "completed",
            "time_discovered_started_ns": None, "time_discovered_completed_ns": None, "retired": True,
            "timeout_ms": 1000, "is_p2p": False, "thread_name": "python", "thread_id": "1"}


def _dump(entries: list, ranks: str = "[0, 1]") -> dict:
    return {"version": "2.10", "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": ranks}},
            "comm_lib_version": "", "pg_status": {"0": {"last_enqueued_collective": len(entries), "last_started_collective": -1,
                                                          "last_completed_collective": len(entries)}}, "entries": entries}


class _Payload:
    def __init__(self, canary: Path):
        self.cmd = f"touch {canary}"

    def __reduce__(self):
        return (os.system, (self.cmd,))


@pytest.fixture
def canary(tmp_path: Path) -> Path:
    return tmp_path / "canary"


def _write(d: Path, rank: int, data: bytes) -> None:
    d.mkdir(parents=True, exist_ok=True)
    (d / f"nccl_trace_rank_{rank}").write_bytes(data)


def _healthy(d: Path, rank: int, **kw) -> None:
    _write(d, rank, pickle.dumps(_dump([_entry(1), _entry(2)], **kw), protocol=2))


def _assert_refused(d: Path, canary: Path, rank: int) -> None:
    rep = flightrec.inspect(str(d))
    assert not canary.exists(), "a dump executed code"
    bad = [c for c in rep.coverage if c.status == "error" and f"nccl_trace_rank_{rank}" in c.detail]
    assert bad, rep.coverage
    assert rank not in rep.dumps.traces


@pytest.mark.parametrize("protocol", [2, 4], ids=["GLOBAL", "STACK_GLOBAL"])
def test_reduce_to_os_system_is_refused(tmp_path: Path, canary: Path, protocol: int) -> None:
    d = tmp_path / "d"
    _healthy(d, 0)
    evil = _dump([_entry(1), _entry(2)])
    evil["entries"][1]["state"] = _Payload(canary)
    data = pickle.dumps(evil, protocol=protocol)
    assert (b"\x93" if protocol == 4 else b"csystem") in data.replace(b"cposix\nsystem", b"csystem")
    _write(d, 1, data)
    _assert_refused(d, canary, 1)


def test_inst_obj_and_persistent_id_are_refused(tmp_path: Path, canary: Path) -> None:
    cmd = f"touch {canary}".encode()
    arg = b"X" + struct.pack("<I", len(cmd)) + cmd
    payloads = {
        1: b"\x80\x02(" + arg + b"ios\nsystem\n.",  # INST
        2: b"\x80\x02(cos\nsystem\n" + arg + b"o.",  # OBJ
        3: b"\x80\x02" + arg + b"Q.",  # BINPERSID
    }
    d = tmp_path / "d"
    _healthy(d, 0)
    for rank, data in payloads.items():
        _write(d, rank, data)
    for rank in payloads:
        _assert_refused(d, canary, rank)


def test_ext_opcode_is_refused_even_with_a_warm_extension_cache(tmp_path: Path, canary: Path) -> None:
    d = tmp_path / "d"
    _healthy(d, 0)
    code = 0xF1
    copyreg.add_extension(os.system.__module__, "system", code)
    try:
        evil = _dump([_entry(1), _entry(2)])
        evil["entries"][0]["state"] = _Payload(canary)
        data = pickle.dumps(evil, protocol=2)
        assert b"\x82" + bytes([code]) in data  # EXT1
        # Someone in this process resolved the extension once: the C unpickler now
        # serves it from its cache without asking find_class (research §3).
        assert pickle.loads(b"\x80\x02\x82" + bytes([code]) + b".") is os.system
        assert safepickle.extensions_registered()
        _write(d, 1, data)
        _assert_refused(d, canary, 1)
    finally:
        copyreg.remove_extension(os.system.__module__, "system", code)
    # with the registry empty, an EXT opcode is simply an unknown code
    assert not safepickle.extensions_registered()
    _assert_refused(d, canary, 1)


@pytest.mark.parametrize("fmt", ["pickle", "json"])
def test_ranks_string_is_never_evaluated(tmp_path: Path, canary: Path, fmt: str) -> None:
    expr = f"__import__('os').system('touch {canary}')"
    d = tmp_path / "d"
    for rank in (0, 1):
        dump = _dump([_entry(1), _entry(2, size=8 if rank else 4)], ranks=expr if rank else "[0, 1]")
        if fmt == "json":
            d.mkdir(exist_ok=True)
            (d / f"nccl_trace_rank_{rank}.json").write_text(json.dumps(dump))
        else:
            _write(d, rank, pickle.dumps(dump, protocol=2))
    rep = flightrec.inspect(str(d))
    assert not canary.exists()
    assert any(c.status == "error" and "nccl_trace_rank_1" in c.detail and "not a list of ranks" in c.detail for c in rep.coverage)
    # the dump itself is still used: membership comes from the sane rank's pg_config
    assert sorted(rep.dumps.traces) == [0, 1]
    assert [s.fields["members"] for s in rep.symptoms] == [[0, 1]]


@pytest.mark.parametrize("text,want", [
    ("[0, 1, 2]", (0, 1, 2)), ("[]", ()), ("[3]", (3,)), ("[2,1]", (1, 2)),
    ("__import__('os').system('x')", None), ("[0, 1] + [2]", None), ("[0x10]", None), ("[-1]", None),
    ("[1e3]", None), ("[" + "1, " * 10 + "1", None), ("(0, 1)", None), (12, None), ([0, 1], (0, 1)), ([0, "1"], None),
])
def test_parse_ranks_is_strict(text, want) -> None:
    assert parse_ranks(text) == want


def test_parse_ranks_caps_huge_strings() -> None:
    huge = "[" + ", ".join(["1"] * 2_000_000) + "]"
    t = time.thread_time()  # CPU, not wall: load on the machine must not fail it
    assert parse_ranks(huge) is None
    assert time.thread_time() - t < 1


def test_memo_dag_and_self_reference_do_not_hang(tmp_path: Path) -> None:
    # A tuple DAG whose naive walk is 2**60 steps, and a list that contains itself.
    t: object = (1,)
    for _ in range(60):
        t = (t, t)
    loop: list = []
    loop.append(loop)
    entries = [_entry(1), _entry(2), _entry(3)]
    entries[1]["input_sizes"] = [[t]]
    entries[2]["output_sizes"] = loop
    d = tmp_path / "d"
    _write(d, 0, pickle.dumps(_dump(entries), protocol=2))
    _healthy(d, 1)
    start = time.process_time()  # CPU, not wall: load on the machine must not fail it
    rep = flightrec.inspect(str(d))
    assert time.process_time() - start < 5
    assert rep.dumps.traces[0].bad_entries == 2
    assert any("2 malformed entries skipped" in c.detail for c in rep.coverage)


def test_huge_length_fields_and_junk(tmp_path: Path) -> None:
    d = tmp_path / "d"
    _healthy(d, 0)
    _write(d, 1, b"\x80\x02X" + struct.pack("<I", 2**31 - 1) + b"abc")  # BINUNICODE asking for 2 GiB
    _write(d, 2, b"\x80\x04\x8d" + struct.pack("<Q", 2**62) + b"x")  # BINUNICODE8 asking for 4 EiB
    _write(d, 3, b"")  # writer killed before the first byte
    _write(d, 4, b"GARBAGE")
    _write(d, 5, pickle.dumps(_dump([_entry(1), _entry(2)]), protocol=2)[:-40])  # truncated by a kill
    rep = flightrec.inspect(str(d))
    errors = {c.detail.split(":")[0] for c in rep.coverage if c.status == "error"}
    assert errors == {f"nccl_trace_rank_{r}" for r in (1, 2, 3, 4, 5)}
    assert sorted(rep.dumps.traces) == [0]


def test_terminal_escapes_in_dump_strings_are_neutralised(tmp_path: Path) -> None:
    d = tmp_path / "d"
    nasty = "\x1b]0;owned\x07\x1b[2J"
    for rank in (0, 1, 2):
        entries = [_entry(1, desc=nasty), _entry(2, size=4 if rank else 5, desc=nasty)]
        dump = _dump(entries, ranks="[0, 1, 2]")
        dump["pg_config"]["0"]["desc"] = nasty
        _write(d, rank, pickle.dumps(dump, protocol=2))
    rep = flightrec.inspect(str(d))
    (s,) = rep.symptoms
    assert s.rank == 0
    text = json.dumps(s.to_dict())
    assert "\x1b" not in s.summary and "\x07" not in s.summary and "\\u001b" not in text


def test_restricted_unpickler_direct() -> None:
    with pytest.raises(DumpError):
        safepickle.loads(pickle.dumps(_Payload(Path("/nonexistent/x"))))
    assert safepickle.loads(pickle.dumps({"a": [1, (2, "x")], "b": None, "c": 1.5})) == {"a": [1, (2, "x")], "b": None, "c": 1.5}


def test_symlinked_dump_is_not_followed(tmp_path: Path) -> None:
    d = tmp_path / "d"
    _healthy(d, 0)
    secret = tmp_path / "secret"
    secret.write_bytes(pickle.dumps(_dump([_entry(1)]), protocol=2))
    os.symlink(secret, d / "nccl_trace_rank_1")
    rep = flightrec.inspect(str(d))
    assert sorted(rep.dumps.traces) == [0]
