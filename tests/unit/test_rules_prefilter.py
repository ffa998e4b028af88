"""The prefilter: every line a rule must see, and only those, in one pass; both engines agree."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from slurm_attr.bundle import MAX_LINE
from slurm_attr.rules import load_catalog, prefilter
from slurm_attr.rules.extract import extract_buffer
from slurm_attr.rules.prefilter import Prefilter

FIXTURE_LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "logs"
MLX_FATAL = b"2026-11-30T10:00:02+0000 gpu-0001 kernel: mlx5_core 0000:25:00.0: mlx5_health_try_recover:327:(pid 812): health compromised - reached miss count\n"
MLX_BENIGN = b"2026-11-30T10:00:02+0000 gpu-0001 kernel: mlx5_core 0000:25:00.0: mlx5_pcie_event:301:(pid 70240): PCIe slot advertised sufficient power (27W).\n"


def _lines(pf, buf, max_line=MAX_LINE):
    return [(s, e, set(p)) for s, e, p in pf.lines(buf, max_line)]


@pytest.mark.parametrize("automaton,anchors", [(True, True), (True, False), (False, False)])
def test_rules_prefilter_overlapping_keywords_both_count(automaton, anchors):
    pf = Prefilter({"abcd": [0], "bcde": [1]}, use_automaton=automaton, use_anchors=anchors)
    assert _lines(pf, b"noise\nxxABCDExx\n") == [(6, 15, {0, 1})]
    assert _lines(pf, b"abcxde\nab cd\n") == []  # near miss: the letters, not the keyword


@pytest.mark.parametrize("automaton", [True, False])
def test_rules_prefilter_required_literal_gates_its_rule(automaton):  # (two passes: the default)
    # rule 0 lists mlx5_core but its regex needs "health compromised" (or another phrase);
    # rule 1 lists mlx5_core and needs nothing more.
    pf = Prefilter({"mlx5_core": [0, 1]}, {0: {"health compromised", "fatal error "}}, use_automaton=automaton)
    buf = MLX_BENIGN + MLX_FATAL
    assert _lines(pf, buf) == [(0, len(MLX_BENIGN) - 1, {1}), (len(MLX_BENIGN), len(buf) - 1, {0, 1})]
    only_gated = Prefilter({"mlx5_core": [0]}, {0: {"health compromised"}}, use_automaton=automaton)
    assert [p for _s, _e, p in _lines(only_gated, buf)] == [{0}]  # the benign line never reaches Python
    # the literal alone, without the keyword, selects nothing
    assert _lines(only_gated, b"health compromised on something else\n") == []


@pytest.mark.parametrize("automaton", [True, False])
def test_rules_prefilter_only_the_part_of_a_line_the_rules_see_counts(automaton):
    pf = Prefilter({"nvrm: xid": [0]}, use_automaton=automaton)
    far = b"x" * 100 + b" NVRM: Xid (PCI:0000:3b:00): 79\n"
    assert _lines(pf, far, max_line=200) == [(0, len(far) - 1, {0})]
    assert _lines(pf, far, max_line=100) == []  # beyond the cut the regex never looks


def test_rules_prefilter_slices_never_split_a_line(monkeypatch):
    text = b"".join(b"line %d noise\n" % i + (MLX_FATAL if i % 7 == 0 else b"") for i in range(300)) + b"no newline mlx5_core"
    pf = Prefilter({"mlx5_core": [0], "noise": [1]})
    whole = _lines(pf, text)
    monkeypatch.setattr(prefilter, "SLICE", 37)
    assert _lines(pf, text) == whole
    assert whole[-1] == (text.rfind(b"\n") + 1, len(text), {0})
    assert sum(1 for _s, _e, p in whole if 0 in p) == 300 // 7 + 1 + 1


def _fixture_buffers():
    out = []
    for root, _dirs, files in os.walk(FIXTURE_LOGS):
        for name in sorted(files):
            with open(os.path.join(root, name), "rb") as f:
                out.append(f.read())
    return out


@pytest.mark.parametrize("source", ["kernel", "stdout", "stderr", "nccl", "scheduler"])
def test_rules_prefilter_engines_agree_on_real_logs(source):
    index = load_catalog().index(source)
    ac = index.prefilter
    assert ac.engine == "aho-corasick"
    spec = (dict(zip(ac.keywords, ac.positions)), {p: index.rules[p].required for p in ac.guarded})
    fallback = Prefilter(*spec, use_automaton=False)
    one_pass = Prefilter(*spec, use_anchors=False)
    two_pass = Prefilter(*spec, use_anchors=True)
    assert fallback.engine == "regex"
    assert two_pass._anchors is not None or len(ac.keywords) > prefilter.ANCHORS_MAX
    bufs = _fixture_buffers()
    # every line of every fixture once more, each with its neighbours cut off and upper-cased
    bufs.append(b"\n".join(line.upper() for buf in bufs for line in buf.split(b"\n")))
    total = 0
    for buf in bufs:
        got = _lines(ac, buf)
        assert got == _lines(fallback, buf) == _lines(one_pass, buf) == _lines(two_pass, buf)
        total += len(got)
    assert total > 0


def test_rules_prefilter_gate_changes_no_finding():
    # The same extraction with the required literals ignored: identical symptoms, so the gate
    # only ever skipped lines whose regex could not match.
    cat = load_catalog()
    for source in ("kernel", "stdout", "stderr", "nccl"):
        index = cat.index(source)
        gated = index.prefilter
        for buf in _fixture_buffers() + [MLX_BENIGN * 3 + MLX_FATAL]:
            with_gate = [s.to_dict() for s in extract_buffer(cat, source, "n1", "f", buf)]
            index.prefilter = Prefilter(dict(zip(gated.keywords, gated.positions)))
            try:
                without = [s.to_dict() for s in extract_buffer(cat, source, "n1", "f", buf)]
            finally:
                index.prefilter = gated
            assert with_gate == without
