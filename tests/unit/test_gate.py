"""Issue 24 item 4: the node Prolog's gate drains a node whose GPU failed while it was idle.

The real catalog decides what is fatal (as the fast path does); Slurm is the in-memory fake whose
behaviour test_drain_fakes.py pins to the real scontrol's.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slurm_attr import gate
from slurm_attr.collect import ledger

from test_drain_fakes import FakeSlurm

REPO = Path(__file__).resolve().parents[2]
NOW = time.time()
XID79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid=2331, name=python, GPU has fallen off the bus."
XID13 = "NVRM: Xid (PCI:0000:3b:00): 13, pid=2331, name=python, Graphics SM Warp Exception on (GPC 0, TPC 0, SM 0)"
BENIGN = "IPv6: ADDRCONF(NETDEV_CHANGE): ib0: link becomes ready"


def stamped(msg: str, t: float) -> str:
    """A kernel line as journalctl -k -o short-iso prints it (the test cluster's file source)."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(t))
    return f"{stamp[:-2]}:{stamp[-2:]} hgx-07 kernel: {msg}"


@pytest.fixture
def cfg(cfg, tmp_path, monkeypatch):  # tests/conftest.py's, with this node's slurm.conf
    c = cfg
    c.collect.window_slack_s = 2
    c.drain.max_partition_percent = 100.0
    (tmp_path / "spool-n2").mkdir()
    (tmp_path / "slurm.conf").write_text(f"SlurmdSpoolDir={tmp_path}/spool-%n\n")
    c.paths.slurm_conf = str(tmp_path / "slurm.conf")
    monkeypatch.setattr(gate, "boot_time", lambda: None)  # this machine's uptime must not matter
    monkeypatch.setattr("slurm_attr.fastpath.SETTLE_S", 0.0)
    return c


def write_log(tmp_path, *lines: str, node: str = "n2") -> None:
    (tmp_path / f"kern-{node}.log").write_text("".join(f"{ln}\n" for ln in lines))


def mark(cfg, t: float, job: str = "41", node: str = "n2") -> None:
    ledger.write_mark(cfg.paths.node_state, node, t, job)


def owner_of(cfg, line: str, node: str = "n2"):
    with ledger.Ledger(cfg.paths.node_state, node) as led:
        return led.owner(ledger.line_key(node, line))


# -- the deliberate drain --------------------------------------------------------------------------


def test_fatal_xid_while_idle_drains_before_the_job_and_owns_the_line(cfg, tmp_path):
    mark(cfg, NOW - 600)
    xid = stamped(XID79, NOW - 300)
    write_log(tmp_path, stamped(BENIGN, NOW - 310), xid)
    slurm = FakeSlurm()
    assert gate.check(cfg, "n2", "77", now=NOW, slurm=slurm) == gate.RC_DRAINED
    assert slurm.drained() == ["n2"]
    assert slurm.reason("n2").startswith("SATTR: gpu_hardware xid79 gpu3b:00 idle before job 77 [root@")
    # The next job's epilog (or gate) does not take this line for its own.
    assert owner_of(cfg, xid) == "prolog:77"
    assert ledger.read_mark(cfg.paths.node_state, "n2") == (pytest.approx(NOW, abs=0.01), "prolog:77")


def test_without_a_job_the_reason_says_idle(cfg, tmp_path):
    mark(cfg, NOW - 600)
    write_log(tmp_path, stamped(XID79, NOW - 300))
    slurm = FakeSlurm()
    assert gate.check(cfg, "n2", "", now=NOW, slurm=slurm) == gate.RC_DRAINED
    assert slurm.reason("n2").startswith("SATTR: gpu_hardware xid79 gpu3b:00 idle [root@")


def test_node_already_drained_by_us_still_requeues_the_job(cfg, tmp_path):
    mark(cfg, NOW - 600)
    write_log(tmp_path, stamped(XID79, NOW - 300))
    slurm = FakeSlurm()
    slurm.drain("n2", "SATTR: gpu_hardware xid79 gpu3b:00 job 40")
    assert gate.check(cfg, "n2", "77", now=NOW, slurm=slurm) == gate.RC_DRAINED
    assert slurm.reason("n2").startswith("SATTR: gpu_hardware xid79 gpu3b:00 job 40")  # not rewritten


# -- near misses: exit 0, nothing drained ------------------------------------------------------------


def test_a_job_still_running_here_owns_the_new_lines(cfg, tmp_path):
    """A shared node: job 76's step still runs (its slurmstepd socket in slurmd's spool dir), so
    the Xid is 76's to judge (its epilog, its fast path), not an idle failure for job 77's gate."""
    mark(cfg, NOW - 600)
    write_log(tmp_path, stamped(XID79, NOW - 5))
    (tmp_path / "spool-n2" / "n2_76.4294967291").touch()
    (tmp_path / "spool-n2" / "n2_77.4294967291").touch()  # the starting job's own step: not another
    slurm = FakeSlurm()
    assert gate.check(cfg, "n2", "77", now=NOW, slurm=slurm) == 0
    assert slurm.drained() == [] and owner_of(cfg, stamped(XID79, NOW - 5)) is None
    # Near miss: only the starting job's own step (or another node's) in the spool: the gate acts.
    (tmp_path / "spool-n2" / "n2_76.4294967291").unlink()
    (tmp_path / "spool-n2" / "n3_76.0").touch()
    assert gate.check(cfg, "n2", "77", now=NOW, slurm=slurm) == gate.RC_DRAINED


def test_non_fatal_xid_does_not_drain(cfg, tmp_path):
    mark(cfg, NOW - 600)
    xid13 = stamped(XID13, NOW - 300)
    write_log(tmp_path, xid13)
    slurm = FakeSlurm()
    assert gate.check(cfg, "n2", "77", now=NOW, slurm=slurm) == 0
    assert slurm.drained() == [] and slurm.calls == []
    assert owner_of(cfg, xid13) is None  # judged, not owned: its job (if any) keeps it


def test_xid_already_attributed_to_a_job_does_not_drain(cfg, tmp_path):
    xid = stamped(XID79, NOW - 300)
    write_log(tmp_path, xid)
    mark(cfg, NOW - 600)
    with ledger.Ledger(cfg.paths.node_state, "n2") as led:
        led.record([ledger.line_key("n2", xid)], "40")  # the epilog of job 40 attributed it
    slurm = FakeSlurm()
    assert gate.check(cfg, "n2", "77", now=NOW, slurm=slurm) == 0
    assert slurm.drained() == [] and slurm.calls == []
    assert owner_of(cfg, xid) == "40"


def test_xid_older_than_the_last_job_is_not_read(cfg, tmp_path):
    write_log(tmp_path, stamped(XID79, NOW - 300))
    mark(cfg, NOW - 100)  # the last job's epilog read the log after the Xid
    slurm = FakeSlurm()
    assert gate.check(cfg, "n2", "77", now=NOW, slurm=slurm) == 0
    assert slurm.calls == []
    mark(cfg, NOW - 400)  # control: the same line after the last job drains
    assert gate.check(cfg, "n2", "77", now=NOW, slurm=slurm) == gate.RC_DRAINED


def test_without_a_mark_only_the_last_hour_is_read(cfg, tmp_path):
    write_log(tmp_path, stamped(XID79, NOW - 2 * 3600))
    slurm = FakeSlurm()
    assert gate.check(cfg, "n2", "77", now=NOW, slurm=slurm) == 0 and slurm.calls == []
    write_log(tmp_path, stamped(XID79, NOW - 1800))
    assert gate.check(cfg, "n2", "77", now=NOW, slurm=slurm) == gate.RC_DRAINED


def test_nothing_before_the_last_boot(cfg, tmp_path, monkeypatch):
    mark(cfg, NOW - 600)
    write_log(tmp_path, stamped(XID79, NOW - 300))
    monkeypatch.setattr(gate, "boot_time", lambda: NOW - 120)  # a reboot re-initialised the GPU
    slurm = FakeSlurm()
    assert gate.check(cfg, "n2", "77", now=NOW, slurm=slurm) == 0 and slurm.calls == []


@pytest.mark.parametrize("section,key", [("actions", "prolog_gate"), ("drain", "enabled")])
def test_gate_or_drain_disabled_returns_at_once(cfg, tmp_path, monkeypatch, section, key):
    mark(cfg, NOW - 600)
    write_log(tmp_path, stamped(XID79, NOW - 300))
    setattr(getattr(cfg, section), key, False)
    monkeypatch.setattr(gate, "read_since", lambda *a: pytest.fail("the kernel log was read"))
    slurm = FakeSlurm()
    assert gate.check(cfg, "n2", "77", now=NOW, slurm=slurm) == 0 and slurm.calls == []


def test_dry_run_records_nothing_drains_nothing_and_the_job_runs(cfg, tmp_path, caplog):
    mark(cfg, NOW - 600)
    xid = stamped(XID79, NOW - 300)
    write_log(tmp_path, xid)
    cfg.drain.dry_run = True
    slurm = FakeSlurm()
    with caplog.at_level("WARNING", logger="slurm_attr"):
        assert gate.check(cfg, "n2", "77", now=NOW, slurm=slurm) == 0
    assert slurm.drained() == [] and "blocked: dry-run" in caplog.text and "the job runs" in caplog.text
    assert owner_of(cfg, xid) is None  # the job's own epilog still sees it


def test_breaker_blocks_the_gate_too(cfg, tmp_path, caplog):
    mark(cfg, NOW - 600)
    write_log(tmp_path, stamped(XID79, NOW - 300))
    cfg.drain.max_drains = 1
    slurm = FakeSlurm()
    slurm.drain("n3", "SATTR: gpu_hardware xid79 gpu3b:00 job 39")  # the one drain the window allows
    with caplog.at_level("WARNING", logger="slurm_attr"):
        assert gate.check(cfg, "n2", "77", now=NOW, slurm=slurm) == 0
    assert slurm.drained() == ["n3"] and "blocked: circuit breaker" in caplog.text


def test_someone_elses_drain_is_left_alone(cfg, tmp_path):
    mark(cfg, NOW - 600)
    write_log(tmp_path, stamped(XID79, NOW - 300))
    slurm = FakeSlurm()
    slurm.admin_drain("n2", "admin: bad fan")
    assert gate.check(cfg, "n2", "77", now=NOW, slurm=slurm) == 0
    assert slurm.reason("n2").startswith("admin: bad fan")


def test_untrusted_or_unreadable_ledger_keeps_out_of_the_way(cfg, tmp_path):
    mark(cfg, NOW - 600)
    write_log(tmp_path, stamped(XID79, NOW - 300))
    os.chmod(cfg.paths.node_state, 0o777)  # writable by others: nothing in it is trusted
    slurm = FakeSlurm()
    assert gate.check(cfg, "n2", "77", now=NOW, slurm=slurm) == 0 and slurm.calls == []


# -- speed: the catalog only for a line that may drain ------------------------------------------------


def test_quiet_lines_do_not_load_the_catalog_once_keywords_are_cached(cfg, tmp_path, monkeypatch):
    mark(cfg, NOW - 600)
    write_log(tmp_path, stamped(XID13, NOW - 300))
    assert gate.check(cfg, "n2", "77", now=NOW, slurm=FakeSlurm()) == 0  # loads it, caches the keywords
    assert gate.cached_keywords(cfg)
    assert ledger.read_mark(cfg.paths.node_state, "n2")[0] == pytest.approx(NOW)  # judged up to now
    mark(cfg, NOW - 600)
    write_log(tmp_path, stamped(BENIGN, NOW - 300))
    monkeypatch.setattr(gate, "_classify", lambda *a: pytest.fail("classified a line no drain rule can match"))
    assert gate.check(cfg, "n2", "77", now=NOW, slurm=FakeSlurm()) == 0
    write_log(tmp_path, stamped(XID79, NOW - 300))  # near miss: a keyword line is classified
    with pytest.raises(pytest.fail.Exception):
        gate.check(cfg, "n2", "77", now=NOW, slurm=FakeSlurm())


def test_keyword_cache_of_another_catalog_is_not_used(cfg, tmp_path):
    ledger.write_state_file(cfg.paths.node_state, gate.KEYWORDS_FILE,
                            b'{"v": 1, "fingerprint": "stale", "keywords": ["nothing-matches-this"]}')
    assert gate.cached_keywords(cfg) is None
    mark(cfg, NOW - 600)
    write_log(tmp_path, stamped(XID79, NOW - 300))
    assert gate.check(cfg, "n2", "77", now=NOW, slurm=FakeSlurm()) == gate.RC_DRAINED


def test_every_kernel_line_that_may_drain_holds_a_drain_keyword():
    """The prefilter is sound: each catalog example that yields a drainable symptom passes it."""
    from slurm_attr import drain
    from slurm_attr.rules import extract_lines, load_catalog

    catalog = load_catalog()
    kws = gate.drain_keywords(catalog)
    assert kws and "nvrm: xid" in kws
    seen = 0
    for rule in catalog.rules:
        for case in rule.cases:
            if case.kind != "match" or (case.source or rule.sources[0]) != "kernel":
                continue
            syms = extract_lines(catalog, "kernel", "n2", "k", [(1, case.text)])
            if any(drain.may_drain(s, hardware_verdict=True) for s in syms):
                seen += 1
                assert gate.holds_keyword(case.text.encode(), kws), (rule.id, case.text)
    assert seen >= 5
    assert not gate.holds_keyword(BENIGN.encode(), kws)


def test_reads_a_long_log_backwards_only_to_the_last_job(tmp_path):
    path = tmp_path / "kern.log"
    old = [stamped(f"usb 1-1: old device {i}", NOW - 86400 + i) for i in range(40000)]
    new = [stamped(f"usb 1-1: new device {i}", NOW - 50 + i) for i in range(5)]
    path.write_text("".join(f"{ln}\n" for ln in old + new))
    data = gate.read_file_since(str(path), NOW - 100, 4 << 20)
    assert len(data) <= 2 * gate.CHUNK and data.decode().endswith(new[-1] + "\n")
    assert data.startswith(b"20")  # whole lines only
    capped = gate.read_file_since(str(path), NOW - 2 * 86400, 100_000)  # near miss: the cap, not the time, stops it
    assert 90_000 < len(capped) <= 100_000


# -- the entry points never fail the job by accident --------------------------------------------------


def test_main_logs_a_bad_config_and_exits_zero(tmp_path, monkeypatch, caplog):
    bad = tmp_path / "c.toml"
    bad.write_text("[actions]\nprolog_gaet = true\n")
    monkeypatch.setenv("SLURM_ATTR_CONFIG", str(bad))
    monkeypatch.setenv("SLURMD_NODENAME", "n2")
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    with caplog.at_level("ERROR", logger="slurm_attr"):
        assert gate.main() == 0
    assert "prolog_gaet" in caplog.text


@pytest.mark.parametrize("py_rc,want", [(gate.RC_DRAINED, 1), (0, 0), (1, 0), (124, 0)])
def test_prolog_script_fails_only_on_a_deliberate_drain(tmp_path, py_rc, want):
    fake = tmp_path / "python"
    fake.write_text(f"#!/bin/sh\necho \"gate ran: $*\" >&2\nexit {py_rc}\n")
    fake.chmod(0o755)
    env = dict(os.environ, SLURM_ATTR_PYTHON=str(fake), SLURM_JOB_ID="77")
    proc = subprocess.run(["bash", str(REPO / "epilog" / "prolog.sh")], env=env, capture_output=True, timeout=30)
    assert proc.returncode == want, proc.stderr


def test_module_entry_point_runs_quietly_on_a_quiet_node(tmp_path):
    conf = tmp_path / "c.toml"
    conf.write_text(f'[paths]\nnode_state = "{tmp_path}/state"\n[collect]\nkernel_source = "file"\n'
                    f'kernel_file = "{tmp_path}/kern-%n.log"\n')
    write_log(tmp_path, stamped(BENIGN, NOW - 5000))
    env = dict(os.environ, SLURM_ATTR_CONFIG=str(conf), SLURMD_NODENAME="n2", SLURM_JOB_ID="77")
    proc = subprocess.run([sys.executable, "-m", "slurm_attr.gate"], env=env, capture_output=True, timeout=60)
    assert proc.returncode == 0 and proc.stderr == b"", proc.stderr
