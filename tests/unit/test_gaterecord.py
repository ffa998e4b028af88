"""The Prolog gate's decisions reach the central store (slurm_attr/gaterecord.py): held-back ones
(dry-run, the breaker) leave nothing in Slurm, so without the record they would live only in the
node's syslog. Near misses: records that are not what they claim are dropped and removed."""
from __future__ import annotations

import json
import os

import msgspec
import pytest

from slurm_attr import gate, gaterecord
from slurm_attr.model import Action
from slurm_attr.store import Store

from test_drain_fakes import FakeSlurm
from test_gate import NOW, XID79, mark, stamped, write_log
from test_gate import cfg  # noqa: F401 - the gate's node config (its slurm.conf) for the end-to-end case

HELD = Action(kind="drain", node="n2", reason="SATTR: gpu_hardware xid79 gpu3b:00 idle before job 77",
              applied=False, blocked_by="dry-run")
DONE = Action(kind="drain", node="n2", reason="SATTR: gpu_hardware xid79 gpu3b:00 idle before job 78",
              applied=True)


@pytest.fixture
def store(tmp_path):
    return Store(str(tmp_path / "sattr.db"))


def gate_dir(spool) -> str:
    return os.path.join(spool, gaterecord.DIR)


def test_held_back_and_applied_decisions_reach_the_store_once(tmp_path, store):
    spool = str(tmp_path / "spool")
    assert gaterecord.write(spool, "n2", "77", [HELD], now=1000.0)
    assert gaterecord.write(spool, "n2", "78", [DONE], now=1001.0)
    assert gaterecord.record_all(store, spool) == 2
    assert os.listdir(gate_dir(spool)) == []  # taken: removed
    held = store.actions("77")
    assert [(a["path"], a["actor"], a["applied"], a["blocked_by"]) for a in held] == [
        ("gate", "prolog@n2", 0, "dry-run")]
    assert not store.ledger_has("n2", ["77"])  # a held-back drain is no drain
    done = store.actions("78")
    assert [(a["path"], a["applied"], a["reason"]) for a in done] == [("gate", 1, DONE.reason)]
    assert store.ledger_has("n2", ["78"])  # the breaker counts it, and Slurm's reason is not counted again
    # the same record again (a remove that failed last time): not stored twice
    gaterecord.write(spool, "n2", "77", [HELD], now=1000.0)
    assert gaterecord.record_all(store, spool) == 0 and len(store.actions("77")) == 1


def test_gate_leaves_its_dry_run_decision_for_the_store(cfg, tmp_path, store):  # noqa: F811
    mark(cfg, NOW - 600)
    write_log(tmp_path, stamped(XID79, NOW - 300))
    cfg.drain.dry_run = True
    assert gate.check(cfg, "n2", "77", now=NOW, slurm=FakeSlurm()) == 0
    gaterecord.record_all(store, cfg.paths.spool)
    [row] = store.actions("77")
    assert (row["node"], row["applied"], row["blocked_by"], row["path"]) == ("n2", 0, "dry-run", "gate")
    assert row["reason"].startswith("SATTR: gpu_hardware xid79 gpu3b:00 idle before job 77")


def test_quiet_gate_leaves_no_record(cfg, tmp_path):  # noqa: F811
    # near miss: nothing fatal, nothing decided, nothing written
    mark(cfg, NOW - 600)
    write_log(tmp_path, stamped("NVRM: Xid (PCI:0000:3b:00): 43, pid=1, Ch 00000008", NOW - 300))
    assert gate.check(cfg, "n2", "77", now=NOW, slurm=FakeSlurm()) == 0
    assert not os.path.exists(gate_dir(cfg.paths.spool))


def _plant(spool, name: str, data: bytes) -> None:
    os.makedirs(gate_dir(spool), exist_ok=True)
    with open(os.path.join(gate_dir(spool), name), "wb") as f:
        f.write(data)


def _doc(**over) -> bytes:
    doc = {"node": "n2", "job": "77", "at": 1000.0,
           "actions": [{"kind": "drain", "reason": "SATTR: x", "applied": False, "blocked_by": "dry-run"}]}
    doc.update(over)
    return json.dumps(doc).encode()


@pytest.mark.parametrize("name,data,why", [
    ("77-n2.json", _doc(), None),  # the good one, beside its near misses
    ("77-n3.json", _doc(), "names another node than the record inside"),
    ("77-n2.json", _doc(actions=[{"kind": "drain", "reason": "x", "applied": "yes"}]), "applied is not a bool"),
    ("77-n2.json", _doc(at=-1), "a time before the epoch"),
    ("77-n2.json", _doc(job="77; rm -rf /"), "a job id that is not one"),
    ("77-n2.json", _doc(actions=[{"kind": "drain", "reason": "x", "applied": True}] * 17), "too many decisions"),
    ("77-n2.json", b"{" * 20000, "over the size cap"),
    ("77-n2.json", b"not json", "not JSON"),
])
def test_a_record_is_taken_only_when_it_is_what_it_claims(tmp_path, store, name, data, why):
    spool = str(tmp_path / "spool")
    _plant(spool, name, data)
    added = gaterecord.record_all(store, spool)
    assert os.listdir(gate_dir(spool)) == []  # good or bad, it does not stay to fill the directory
    assert added == (1 if why is None else 0), why


def test_a_link_in_the_gate_dir_is_not_followed(tmp_path, store):
    spool = str(tmp_path / "spool")
    target = tmp_path / "elsewhere.json"
    target.write_bytes(_doc())
    os.makedirs(gate_dir(spool))
    os.symlink(target, os.path.join(gate_dir(spool), "77-n2.json"))
    assert gaterecord.record_all(store, spool) == 0
    assert target.exists() and store.actions("77") == []


def test_a_node_whose_records_are_not_taken_stops_adding_them(tmp_path, monkeypatch):
    spool = str(tmp_path / "spool")
    monkeypatch.setattr(gaterecord, "MAX_PER_NODE", 3)
    assert all(gaterecord.write(spool, "n2", str(j), [HELD]) for j in (1, 2, 3))
    assert gaterecord.write(spool, "n2", "4", [HELD]) is False
    assert gaterecord.write(spool, "n3", "4", [HELD]) is True  # near miss: another node's own budget
    assert len(os.listdir(gate_dir(spool))) == 4


def test_the_record_is_the_shape_it_states(tmp_path):
    spool = str(tmp_path / "spool")
    gaterecord.write(spool, "n2", "", [DONE], now=5.0)
    raw = open(os.path.join(gate_dir(spool), "idle-n2.json"), "rb").read()
    rec = msgspec.json.decode(raw, type=gaterecord.GateRecord)
    assert (rec.node, rec.job, rec.at, rec.actions[0].applied) == ("n2", "idle", 5.0, True)
    assert oct(os.stat(os.path.join(gate_dir(spool), "idle-n2.json")).st_mode & 0o777) == "0o600"
