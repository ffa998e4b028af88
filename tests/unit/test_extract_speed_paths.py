"""The fast paths of extraction give the answers of the plain ones (issue 15, row 1).

Correctness only, no timing: the anchored prefilter against the one-pass automaton on lines
built to hit its edge cases, counted repeats against built ones, the JSON codec that carries a
helper's symptoms (and never pickle), and the small shortcuts (rank prefix, evidence, literals).
"""
from __future__ import annotations

import pickle
import threading
from pathlib import Path

import pytest

from slurm_attr.bundle import Bundle
from slurm_attr.config import Config
from slurm_attr.model import Coverage, Evidence, Symptom
from slurm_attr.rules import analyze, load_catalog, parallel, wire
from slurm_attr.rules.extract import MAX_EVIDENCE, _evidence, extract_buffer
from slurm_attr.rules.literals import required_any
from slurm_attr.rules.prefilter import Prefilter
from slurm_attr.rules.scan import rank_prefix

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "bundles" / "xid79_cascade"

# Real formats (kernel log as journalctl -k prints it; the mlx5 lines from the shared bench corpus).
XID63 = ("2026-11-30T10:00:{s:02d}+0000 gpu-0001 kernel: NVRM: Xid (PCI:0000:{bus}:00): 63, pid='<unknown>', "
         "name=<unknown>, Row Remapper: New row (0x{row:08x}) was marked for remapping, reset gpu to activate.")
XID79 = "2026-11-30T10:00:59+0000 gpu-0001 kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus."
MLX_BENIGN = ("2026-11-30T10:00:02+0000 gpu-0001 kernel: mlx5_core 0000:25:00.0: mlx5_pcie_event:301:(pid 70240): "
              "PCIe slot advertised sufficient power (27W).")
MLX_FATAL = ("2026-11-30T10:00:02+0000 gpu-0001 kernel: mlx5_core 0000:25:00.0: mlx5_health_try_recover:327:(pid 812): "
             "health compromised - reached miss count")


def _lines(pf, buf, max_line=16 << 10):
    return [(s, e, set(p)) for s, e, p in pf.lines(buf, max_line)]


def test_extract_speed_anchors_find_a_keyword_hidden_by_an_overlapping_one():
    # "fatal machine check" is reported first; "machine check exception" starts inside it and
    # goes on: the first pass cannot see it, the line must still reach both rules.
    spec = {"fatal machine check": [0], "machine check exception": [1], "link down": [2]}
    anchored, plain = Prefilter(spec), Prefilter(spec, use_anchors=False)
    assert anchored._anchors is not None
    both = b"mce: fatal machine check exception on cpu 3\n"
    near = b"mce: fatal machine check, exception on cpu 3\n"  # near miss: the second keyword is broken
    assert _lines(anchored, both) == _lines(plain, both) == [(0, len(both) - 1, {0, 1})]
    assert _lines(anchored, near) == _lines(plain, near) == [(0, len(near) - 1, {0})]


def test_extract_speed_anchors_count_a_keyword_inside_another():
    spec = {"nic link is down": [0], "link is down": [1]}
    anchored, plain = Prefilter(spec), Prefilter(spec, use_anchors=False)
    line = b"e1000e: eth0 NIC Link is Down\n"
    other = b"bond0: link is down for slave eth1\n"
    assert _lines(anchored, line) == _lines(plain, line) == [(0, len(line) - 1, {0, 1})]
    assert _lines(anchored, other) == _lines(plain, other) == [(0, len(other) - 1, {1})]


def test_extract_speed_anchors_cut_at_max_line_like_the_full_pass():
    # The long keyword crosses the cut; the short one inside it ends before the cut and counts.
    spec = {"nic link is down": [0], "nic link": [1]}
    anchored, plain = Prefilter(spec), Prefilter(spec, use_anchors=False)
    buf = b"x" * 10 + b" NIC Link is Down\n"
    assert _lines(anchored, buf, max_line=22) == _lines(plain, buf, max_line=22) == [(0, len(buf) - 1, {1})]
    assert _lines(anchored, buf, max_line=15) == _lines(plain, buf, max_line=15) == []


def test_extract_speed_guarded_lines_need_their_literal():
    spec = ({"mlx5_core": [0, 1], "nvrm: xid": [2]}, {0: {"health compromised"}})
    anchored, plain = Prefilter(*spec), Prefilter(*spec, use_anchors=False)
    buf = "\n".join([MLX_BENIGN, MLX_FATAL, XID79, "health compromised without the device word"]).encode() + b"\n"
    got = _lines(anchored, buf)
    assert got == _lines(plain, buf)
    assert [p for _s, _e, p in got] == [{1}, {0, 1}, {2}]


def _xid_log(n_gpus: int, repeats: int) -> bytes:
    lines = [XID63.format(s=i % 60, bus=f"{0x10 + g:02x}", row=i) for i in range(repeats) for g in range(n_gpus)]
    return ("\n".join(lines) + "\n").encode()


def test_extract_speed_repeats_are_counted_not_lost():
    cat = load_catalog()
    syms = extract_buffer(cat, "kernel", "gpu-0001", "nodes/gpu-0001/kernel.log", _xid_log(3, 12))
    xid63 = sorted((s for s in syms if s.id == "gpu.xid_63"), key=lambda s: s.gpu)
    assert [s.gpu for s in xid63] == ["0000:10:00", "0000:11:00", "0000:12:00"]
    for k, s in enumerate(xid63):
        assert s.fields["occurrences"] == 12
        assert len(s.evidence) == MAX_EVIDENCE
        assert [e.line for e in s.evidence] == [1 + k + 3 * i for i in range(MAX_EVIDENCE)]  # GPUs interleave
    # near miss: one line of each GPU is one finding each, seen once
    once = extract_buffer(cat, "kernel", "gpu-0001", "p", _xid_log(3, 1))
    assert sorted(s.fields.get("occurrences", 1) for s in once if s.id == "gpu.xid_63") == [1, 1, 1]


def test_extract_speed_counted_repeats_equal_the_line_by_line_answer():
    # extract_lines feeds the same engine line by line numbers; a gap in numbering shows they are used
    cat = load_catalog()
    text = _xid_log(2, 9).decode().splitlines() + [XID79]
    numbered = [(10 + 2 * i, t) for i, t in enumerate(text)]
    from slurm_attr.rules.extract import extract_lines

    by_lines = extract_lines(cat, "kernel", "n1", "k", numbered)
    by_buffer = extract_buffer(cat, "kernel", "n1", "k", ("\n".join(text) + "\n").encode(), linenos=[n for n, _ in numbered])
    assert [s.to_dict() for s in by_lines] == [s.to_dict() for s in by_buffer]
    root = [s for s in by_lines if s.id == "gpu.xid_79"]
    assert len(root) == 1 and root[0].evidence[0].line == numbered[-1][0]


def test_extract_speed_rank_prefix_shortcut():
    assert rank_prefix(XID79) is None  # a timestamp's digits are no srun label
    assert rank_prefix("3: [rank3]: RuntimeError: NCCL error") == 3
    assert rank_prefix("[PG ID 0 PG GUID 0(default_pg) Rank 5] Watchdog caught collective operation timeout") == 5
    assert rank_prefix("[PG ID 1 PG GUID 1 Rank 5] Watchdog caught collective operation timeout") is None  # a sub-group's rank
    assert rank_prefix("12: some task output") == 12
    assert rank_prefix("Rank5 had an error") is None  # near miss: no tag


def test_extract_speed_evidence_shortcut_is_the_same_object():
    a = _evidence("kernel", "nodes/n1/kernel.log", 7, "NVRM: Xid")
    b = Evidence(source="kernel", path="nodes/n1/kernel.log", line=7, text="NVRM: Xid")
    assert a == b and hash(a) == hash(b) and a.to_dict() == b.to_dict()
    assert a != Evidence(source="kernel", path="nodes/n1/kernel.log", line=8, text="NVRM: Xid")


def test_extract_speed_no_newline_literal_is_required():
    # lines are searched one at a time: a literal spanning a newline would gate a rule on text no line holds
    assert required_any(r"first line\nsecond line") == frozenset({"second line"})
    assert required_any(r"health compromised") == frozenset({"health compromised"})


def _sample() -> tuple[list[Symptom], list[Coverage]]:
    s = Symptom(id="gpu.xid_79", cause="gpu_hardware", trusted=True, node="n1", gpu="0000:3b:00", time="2026-11-30T10:00:59",
                summary="Xid 79", fields={"xid": 79, "ranks": [1, 2], "uptime": 12.5, "text": "fallen \udcff off"},
                evidence=[Evidence(source="kernel", path="nodes/n1/kernel.log", line=3, text=XID79)])
    return [s], [Coverage(source="kernel", node="n1", status="truncated", detail="read the last 4 of 6 bytes")]


def test_extract_speed_wire_round_trip_is_exact():
    import json

    result = _sample()
    back = wire.decode(json.loads(json.dumps(wire.encode(result))))
    assert [s.to_dict() for s in back[0]] == [s.to_dict() for s in result[0]]
    assert back[0] == result[0] and back[1] == result[1]
    assert type(back[0][0].evidence[0]) is Evidence


def test_extract_speed_wire_refuses_what_json_would_change():
    syms, cov = _sample()
    syms[0].fields["pair"] = (1, 2)  # a tuple would come back a list
    assert wire.encode((syms, cov)) is None
    syms, cov = _sample()
    syms[0].extra = "x"  # an attribute the model does not have would be lost
    assert wire.encode((syms, cov)) is None
    assert wire.encode(_sample()) is not None  # near miss: the plain sample goes
    with pytest.raises(ValueError):
        wire.decode([[["too", "short"]], []])
    with pytest.raises(ValueError):
        wire.decode("not a result")


def test_extract_speed_helpers_never_unpickle(monkeypatch, tmp_path):
    import shutil

    bundle_dir = tmp_path / "b"
    shutil.copytree(FIXTURE, bundle_dir)
    cfg = Config()
    seq_s, seq_c = analyze(Bundle(str(bundle_dir)), cfg)

    def refuse(*_a, **_k):
        raise AssertionError("pickle.loads called")

    monkeypatch.setattr(pickle, "loads", refuse)
    monkeypatch.setattr(parallel, "PARALLEL_MIN", 0)
    monkeypatch.setattr(parallel, "_cpus", lambda: 2)
    monkeypatch.setattr(threading, "active_count", lambda: 1)
    par_s, par_c = analyze(Bundle(str(bundle_dir)), cfg)
    assert [s.to_dict() for s in par_s] == [s.to_dict() for s in seq_s]
    assert par_c == seq_c


def _odd(bundle, catalog, task):  # module level: forked helpers run it too
    return {"path": task[2], "set": {1}}  # a set: no codec carries it, so this process redoes it


def test_extract_speed_a_result_the_codec_cannot_carry_is_redone_here(monkeypatch):
    monkeypatch.setattr(parallel, "PARALLEL_MIN", 0)
    monkeypatch.setattr(parallel, "_cpus", lambda: 2)
    monkeypatch.setattr(threading, "active_count", lambda: 1)
    tasks = [("kernel", f"n{i}", f"nodes/n{i}/kernel.log", 1 << 20) for i in range(4)]
    got = parallel.run(Bundle(str(FIXTURE)), load_catalog(), tasks, _odd)
    assert got == [{"path": t[2], "set": {1}} for t in tasks]


def test_extract_speed_malformed_helper_output_is_ignored():
    codec = parallel.PlainCodec()
    assert parallel._helper_results(b"\x80not json", 3, codec) == {}
    assert parallel._helper_results(b'[[0, {"t": [1, 2]}], [7, 1], ["x", 1], [1, {"zz": 1}]]', 3, codec) == {0: (1, 2)}


@pytest.mark.parametrize("text", [
    "Row Remapper: New row (0x000034c4) was marked for remapping, reset gpu to activate.",
    "Row Remapper: Remapping FAILED for row 0x1",
    "Row Remapper: NO SPARE rows left",
    "Row Remapper: no  spare rows",  # near miss: two spaces
    "Row Remapper: row 0x1 PENDING",
    "Row Remapper: row 0x1 recorded",  # near miss: neither
    "Row Remapper: no \u017fpare rows",  # long s: case-folds to s under re.I, not under lower()
    "Row Remapper: \u212aelvin unable",  # non-ASCII text: the regex decides
])
def test_extract_speed_xid_remap_words_answer_like_the_regex(text):
    import re

    from slurm_attr.rulebook import gpu_xid

    old_failed = re.compile(r"fail|unable|no (?:spare|more)", re.I)
    old_remap = re.compile(r"reset gpu to activate|reboot to activate|marked for remapping|pending", re.I)
    assert gpu_xid._says(gpu_xid._REMAP_FAILED, gpu_xid._REMAP_FAILED_WORDS, text) == bool(old_failed.search(text))
    assert gpu_xid._says(gpu_xid._REMAP, gpu_xid._REMAP_WORDS, text) == bool(old_remap.search(text))
