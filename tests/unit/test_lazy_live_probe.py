"""A bundle with no probe directory and a job with no live spool directory (most jobs) are
answered without the probe's reader and rules and without the live evidence modules (slow/anomalies.py
pulls statistics, decimal, fractions): the same symptoms and coverage the full paths give,
and none of their modules imported. Near misses (a probe record, an empty or symlinked probe
directory, a live spool directory) take the full path."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import slurm_attr.live.evidence as live_full
import slurm_attr.probe.entry as probe_full
from slurm_attr import live, probe
from slurm_attr.bundle import Bundle
from slurm_attr.config import Config
from slurm_attr.live import findings, livespool
from slurm_attr.probe.synth import SlotSpec, record_bytes, write_bundle

HEAVY = ("slurm_attr.live.evidence", "slurm_attr.live.slow.anomalies", "slurm_attr.live.slow.slowevidence",
         "slurm_attr.live.prekill.prekillevidence", "slurm_attr.probe.entry", "slurm_attr.probe.reader",
         "slurm_attr.probe.record")
JOB = "4242"


def _cfg(tmp_path) -> Config:
    cfg = Config()
    cfg.paths.spool = str(tmp_path / "spool")
    os.makedirs(cfg.paths.spool, exist_ok=True)
    return cfg


def _plain(tmp_path, job: dict | None = None, nodes=("n0", "n1")):
    """A bundle as a node epilog without probe leaves it: a kernel log per node, an output."""
    root = tmp_path / "bundle"
    for n in nodes:
        (root / "nodes" / n).mkdir(parents=True)
        (root / "nodes" / n / "kernel.log").write_text("[  1.0] nothing to see\n")
    (root / "output").mkdir(parents=True)
    (root / "output" / "stderr").write_text("done\n")
    doc = {"job_id": JOB, "state": "COMPLETED", "exit_code": 0, "nodes": list(nodes),
           "end_time": "2026-12-01T14:05:00+00:00"}
    (root / "job.json").write_text(json.dumps(job if job is not None else doc))
    return root


def _probe_bundle(tmp_path, state="COMPLETED"):
    """Two nodes of probe records (test_probe_analysis's healthy ring, rank 3 behind)."""
    recs = {}
    for r in range(4):
        k = 9 if r == 3 else 10  # rank 3 never launched AllReduce #9, the others hang in it
        sp = SlotSpec(comm_hash=0x9E3779B97F4A7C15, rank=r, nranks=4, name="world", launched={4: k}, op_count=k,
                      ops=[(o, 4, 1 << 20, 8, -1, o) for o in range(k)], digest=1, kernel=(4, k - 1),
                      inflight=0 if r == 3 else 3, api=(k, k, k, k), last_ns=5_000_000_000)
        recs[(f"n{r // 2}", r)] = record_bytes(r, [sp], pid=100 + r, node=f"n{r // 2}",
                                               rt_ns=1_700_000_000_000_000_000, mono_ns=1)
    root = tmp_path / "pbundle"
    write_bundle(str(root), recs, {"job_id": JOB, "state": state, "exit_code": 0, "nodes": ["n0", "n1"],
                                   "end_time": "2026-12-01T14:05:00+00:00"})
    return root


def _dicts(result):
    symptoms, coverage = result
    return [s.to_dict() for s in symptoms], [c.to_dict() for c in coverage]


@pytest.fixture
def spies(monkeypatch):
    """Which full paths ran (the package's analyze imports them at call time)."""
    ran: list[str] = []
    for name, mod in (("probe", probe_full), ("live", live_full)):
        real = mod.analyze

        def spy(bundle, cfg, _real=real, _name=name):
            ran.append(_name)
            return _real(bundle, cfg)
        monkeypatch.setattr(mod, "analyze", spy)
    return ran


def test_no_probe_no_live_imports_nothing_of_the_analyses(tmp_path):
    root = _plain(tmp_path)
    cfg = _cfg(tmp_path)
    code = ("import sys, json; from slurm_attr.bundleanalysis import run_bundle; from slurm_attr.config import Config; "
            f"cfg = Config(); cfg.paths.spool = {cfg.paths.spool!r}; v = run_bundle({str(root)!r}, cfg); "
            f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert json.loads(out.splitlines()[-1]) == []


@pytest.mark.parametrize("shape", ["plain", "failed", "job_json_node_only", "no_nodes", "live_off", "bad_job_id"])
def test_shortcut_gives_what_the_full_path_gives(tmp_path, spies, shape):
    cfg = _cfg(tmp_path)
    if shape == "failed":
        root = _plain(tmp_path, {"job_id": JOB, "state": "FAILED", "exit_code": 1, "nodes": ["n0"]}, nodes=("n0",))
    elif shape == "job_json_node_only":  # n9 named by job.json, its part never arrived
        root = _plain(tmp_path, {"job_id": JOB, "state": "COMPLETED", "nodes": ["n0", "n9"]}, nodes=("n0",))
    elif shape == "no_nodes":
        root = _plain(tmp_path, {"job_id": JOB}, nodes=())
    elif shape == "bad_job_id":
        root = _plain(tmp_path, {"job_id": "../x", "state": "COMPLETED", "nodes": ["n0"]}, nodes=("n0",))
    else:
        root = _plain(tmp_path)
    if shape == "live_off":
        cfg.live.enabled = False
    b = Bundle(str(root))
    got_probe, got_live = _dicts(probe.analyze(b, cfg)), _dicts(live.analyze(b, cfg))
    assert spies == []  # the shortcuts answered
    assert got_probe == _dicts(probe_full.analyze(b, cfg))
    assert got_live == _dicts(live_full.analyze(b, cfg)) == ([], [])
    assert spies == ["probe", "live"]
    assert b.coverage == Bundle(str(root)).coverage  # no side effect on the bundle's own coverage
    if shape == "no_nodes":
        assert got_probe[1] == [{"source": "probe", "node": None, "status": "missing",
                                 "detail": "the bundle has no node parts"}]
    else:
        assert got_probe[0] == [] and {c["status"] for c in got_probe[1]} == {"missing"}
        assert [c["node"] for c in got_probe[1]] == b.nodes()


def test_a_probe_record_takes_the_full_path(tmp_path, spies):
    cfg = _cfg(tmp_path)
    b = Bundle(str(_probe_bundle(tmp_path)))
    got_probe, got_live = _dicts(probe.analyze(b, cfg)), _dicts(live.analyze(b, cfg))
    assert spies == ["probe", "live"]
    assert got_probe == _dicts(probe_full.analyze(b, cfg))
    assert got_live == _dicts(live_full.analyze(b, cfg))
    assert [s["id"] for s in got_probe[0]] == ["probe.non_entry"] and got_probe[0][0]["rank"] == 3


@pytest.mark.parametrize("odd", ["empty_dir", "other_file", "symlink", "one_node_only"])
def test_anything_in_the_probe_place_takes_the_full_path(tmp_path, spies, odd):
    cfg = _cfg(tmp_path)
    root = _plain(tmp_path)
    probe_dir = root / "nodes" / "n1" / "probe"
    if odd == "symlink":
        (tmp_path / "elsewhere").mkdir()
        os.symlink(tmp_path / "elsewhere", probe_dir)
    else:
        probe_dir.mkdir()
        if odd == "other_file":
            (probe_dir / "README").write_text("x")
    if odd == "one_node_only":
        src = _probe_bundle(tmp_path) / "nodes" / "n0" / "probe"
        for name in os.listdir(src):
            (probe_dir / name).write_bytes((src / name).read_bytes())
    b = Bundle(str(root))
    got_probe, got_live = _dicts(probe.analyze(b, cfg)), _dicts(live.analyze(b, cfg))
    assert spies == ["probe", "live"]
    assert got_probe == _dicts(probe_full.analyze(b, cfg))
    assert got_live == _dicts(live_full.analyze(b, cfg))
    n1 = [c for c in got_probe[1] if c["node"] == "n1"]
    assert n1 and n1[0]["detail"] != probe.NO_PROBE_DIR


@pytest.mark.parametrize("what", ["finding", "empty_dir"])
def test_a_live_spool_dir_for_the_job_takes_the_full_path(tmp_path, spies, what):
    cfg = _cfg(tmp_path)
    livespool.ensure_job_dir(cfg.paths.spool, JOB)
    if what == "finding":
        f = {"job": JOB, "detected": "2026-12-01T14:02:10+00:00", "class": "H1", "cause": "rank_stuck",
             "comm": "ab", "label": "world ab", "ranks": [3], "nodes": ["n1"], "waiting_ranks": [0, 1, 2],
             "waiting_since": "2026-12-01T14:01:05+00:00", "what": "never entered AllReduce #9",
             "symptoms": [{"id": "probe.non_entry", "fields": {"func": "AllReduce", "seq": 9}}]}
        findings.save(cfg.paths.spool, JOB, "0", {"job": JOB, "findings": [f], "coverage": "2 of 2 node(s) reporting"},
                      gid=None)
    b = Bundle(str(_plain(tmp_path)))
    got = _dicts(live.analyze(b, cfg))
    assert spies == ["live"]
    spies.clear()
    assert got == _dicts(live_full.analyze(b, cfg))
    if what == "finding":
        assert [s["id"] for s in got[0]] == ["live.hang"] and got[1][0]["status"] == "ok"
    # another job of the same spool has none: the shortcut again
    other = tmp_path / "other"
    other.mkdir()
    (other / "job.json").write_text(json.dumps({"job_id": "4243", "nodes": ["n0"]}))
    spies.clear()
    assert live.analyze(Bundle(str(other)), cfg) == ([], [])
    assert spies == []


def test_lazy_names_resolve():
    assert probe.reader.SOURCE == "probe" and probe.layout is not None
    assert live.livespool is livespool and live.slow.slowevidence.postmortem is not None
    from slurm_attr.live import analyze as live_analyze
    from slurm_attr.probe import analyze as probe_analyze
    assert live_analyze is live.analyze and probe_analyze is probe.analyze
    with pytest.raises(AttributeError):
        probe.no_such_thing  # noqa: B018
    with pytest.raises(AttributeError):
        live.no_such_thing  # noqa: B018
