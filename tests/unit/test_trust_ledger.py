"""Issue 10 item 3: each trusted kernel line is attributed once (node-local ledger)."""
import json
import os
import time

import pytest

from slurm_attr.bundle import Bundle
from slurm_attr.collect import ledger
from slurm_attr.collect.node import NodeJob, collect_node, read_kernel

# Real journalctl -k (short-iso) shapes of an Xid 79 and of a benign line.
XID79 = "2026-12-01T20:10:05+00:00 hgx-07 kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=2331, GPU has fallen off the bus."
BENIGN = "2026-12-01T20:10:06+00:00 hgx-07 kernel: IPv6: ADDRCONF(NETDEV_CHANGE): ib0: link becomes ready"


def test_line_key_is_the_event_not_the_rendering():
    assert ledger.line_key("n2", XID79) == ledger.line_key("n2", XID79.replace("kernel: ", "kernel:   "))
    # Near misses: another node, another second, another message are other events.
    assert ledger.line_key("n3", XID79) != ledger.line_key("n2", XID79)
    assert ledger.line_key("n2", XID79.replace("20:10:05", "20:10:06")) != ledger.line_key("n2", XID79)
    assert ledger.line_key("n2", XID79.replace(": 79,", ": 48,")) != ledger.line_key("n2", XID79)


def test_ledger_is_root_only_bounded_and_first_owner_wins(tmp_path):
    state = tmp_path / "state"
    with ledger.Ledger(str(state), "n2") as led:
        assert led.record(["a", "b"], "100") == 2
    with ledger.Ledger(str(state), "n2") as led:
        assert led.owner("a") == "100" and led.record(["a"], "101") == 0 and led.owner("a") == "100"
        assert led.owner("zz") is None
    path = state / "attributed.n2.json"
    assert oct(os.stat(path).st_mode & 0o777) == "0o600" and oct(os.stat(state).st_mode & 0o777) == "0o700"
    # Pruned by age on the next write.
    with ledger.Ledger(str(state), "n2", now=time.time() + ledger.MAX_AGE_S + 10) as led:
        led.record(["c"], "102")
    assert set(json.loads(path.read_text())["lines"]) == {"c"}


def test_ledger_refuses_a_symlinked_file_and_a_foreign_node_name(tmp_path):
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    os.chmod(state, 0o700)
    (tmp_path / "elsewhere").write_text("{}")
    os.symlink(tmp_path / "elsewhere", state / "attributed.n2.json")
    with pytest.raises(ledger.LedgerError):
        with ledger.Ledger(str(state), "n2"):
            pass
    with pytest.raises(ledger.LedgerError):
        ledger.Ledger(str(state), "../n2")
    os.chmod(state, 0o777)  # near miss of a good dir: writable by others
    with pytest.raises(ledger.LedgerError):
        with ledger.Ledger(str(state), "n3"):
            pass


def _now_line(msg: str, t: float) -> str:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(t))
    return f"{stamp[:-2]}:{stamp[-2:]} hgx-07 kernel: {msg}"


def test_second_job_reading_the_same_xid_gets_it_as_context_only(cfg, tmp_path):
    now = time.time()
    xid = _now_line("NVRM: Xid (PCI:0000:3b:00): 79, pid=2331, GPU has fallen off the bus.", now - 30)
    benign = _now_line("IPv6: ADDRCONF(NETDEV_CHANGE): ib0: link becomes ready", now - 29)
    (tmp_path / "kern-n2.log").write_text(f"{xid}\n{benign}\n")
    first = NodeJob(job_id="200", node="n2", bundle_key="200", start=now - 60, end=now)
    win, _ = read_kernel(cfg, first, time.monotonic() + 10)
    assert b"Xid" in win.text and win.attributed == b""  # the first reader owns it

    # Job 201 started right after (its slack covers the line): it must not see the Xid as its own.
    second = NodeJob(job_id="201", node="n2", bundle_key="201", start=now - 20, end=now + 5)
    doc = collect_node(cfg, second)
    part = os.path.join(cfg.paths.spool, "bundles", "201", "nodes", "n2")
    fresh = open(os.path.join(part, "kernel.log")).read()
    assert "Xid" not in fresh and "ADDRCONF" in fresh  # near miss: an unmatched line stays
    assert "Xid" in open(os.path.join(part, "kernel.attributed.log")).read()
    assert doc["attributed"]["lines"][0]["job_id"] == "200"

    b = Bundle(os.path.join(cfg.paths.spool, "bundles", "201"))
    owners = b.attributed_lines("n2")
    assert list(owners.values()) == ["200"]
    assert ledger.line_key("n2", xid) in b.attributed_keys()

    # The same job collected again (a retry) still owns its line.
    again, _ = read_kernel(cfg, NodeJob(job_id="200", node="n2", bundle_key="200", start=now - 60, end=now),
                           time.monotonic() + 10)
    assert b"Xid" in again.text


def test_a_broken_ledger_ships_every_line(cfg, tmp_path):
    now = time.time()
    (tmp_path / "kern-n2.log").write_text(_now_line("NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.", now) + "\n")
    os.makedirs(cfg.paths.node_state)
    os.chmod(cfg.paths.node_state, 0o777)  # refused: the line must still reach the fast path
    win, _ = read_kernel(cfg, NodeJob(job_id="300", node="n2", bundle_key="300", start=now - 10, end=now),
                         time.monotonic() + 10)
    assert b"Xid" in win.text and win.ledger["status"] == "error"
