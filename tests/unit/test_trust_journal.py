"""Issue 10: journal records are trusted by journald's own fields, never by their text."""
import json
import os
import subprocess
import time

from slurm_attr.collect import journal
from slurm_attr.collect.node import NodeJob, collect_node
from slurm_attr.config import Config

UNIT = "nvidia-fabricmanager.service"
MSG = "detected NVSwitch fatal error 20034 on fid 0 on NVSwitch pci bus id 00000000:86:00.0 physical id 0 port 34"


def record(**over):
    """One `journalctl -o json` record as journald prints a root service's stdout line."""
    rec = {"__REALTIME_TIMESTAMP": "1764619805123456", "_UID": "0", "_GID": "0", "_HOSTNAME": "hgx-07",
           "_TRANSPORT": "stdout", "SYSLOG_IDENTIFIER": "nv-fabricmanager", "_PID": "2201",
           "_COMM": "nv-fabricmanage", "_EXE": "/usr/bin/nv-fabricmanager", "_SYSTEMD_UNIT": UNIT,
           "_SYSTEMD_CGROUP": f"/system.slice/{UNIT}", "PRIORITY": "3", "MESSAGE": MSG}
    rec.update(over)
    return json.dumps({k: v for k, v in rec.items() if v is not None})


def test_a_root_units_record_is_kept_in_the_rules_shape():
    text, kept, dropped = journal.render([record()], [UNIT])
    assert (kept, dropped) == (1, 0)
    assert text == f"2025-12-01T20:10:05+00:00 hgx-07 nv-fabricmanager[2201]: {MSG}\n".encode()


def test_a_users_logger_line_with_the_same_text_is_dropped():
    # `logger -t nv-fabricmanager ...` from a job: the user's uid, a session scope, syslog transport.
    forged = record(_UID="1001", _TRANSPORT="syslog", _SYSTEMD_UNIT="session-3.scope", _COMM="logger")
    user_unit = record(_UID="1001", _SYSTEMD_UNIT="user@1001.service", _SYSTEMD_USER_UNIT=UNIT)
    root_other = record(_SYSTEMD_UNIT="cron.service")  # root, but a unit the site did not name
    kernel = record(_TRANSPORT="kernel")  # the kernel log has its own source
    text, kept, dropped = journal.render([forged, user_unit, root_other, kernel, "not json"], [UNIT])
    assert text == b"" and (kept, dropped) == (0, 5)


def test_message_newlines_cannot_start_a_second_line():
    text, _, _ = journal.render([record(MESSAGE=[104, 105, 10, 88, 105, 100])], [UNIT])  # "hi\nXid" as bytes
    assert text.count(b"\n") == 1 and text.endswith(b"hi Xid\n")


def test_unit_names_are_validated():
    assert journal.parse_units(f" {UNIT}, bad unit, ../x.service,") == [UNIT]


def test_read_units_asks_journald_for_root_records_of_the_units_only():
    seen = {}

    def fake_run(cmd, **kw):
        seen["cmd"] = cmd
        return subprocess.CompletedProcess(cmd, 0, (record() + "\n").encode(), b"")

    w = journal.read_units([UNIT], 100.0, 200.0, 1 << 20, 5, run=fake_run)
    assert w.status == "ok" and b"NVSwitch fatal error" in w.text
    assert f"_SYSTEMD_UNIT={UNIT}" in seen["cmd"] and "_UID=0" in seen["cmd"] and "-o" in seen["cmd"]


def test_collector_writes_journal_log_with_its_provenance(tmp_path, monkeypatch):
    c = Config()
    c.paths.evidence_root, c.paths.spool, c.paths.node_state = (str(tmp_path / d) for d in ("ev", "spool", "st"))
    c.collect.kernel_source, c.collect.kernel_file = "file", str(tmp_path / "k-%n.log")
    c.collect.journal_units = UNIT
    os.makedirs(c.paths.evidence_root)
    (tmp_path / "k-n1.log").write_text("")
    monkeypatch.setattr(journal.subprocess, "run",
                        lambda cmd, **kw: subprocess.CompletedProcess(cmd, 0, (record() + "\n").encode(), b""))
    doc = collect_node(c, NodeJob(job_id="5", node="n1", bundle_key="5", start=time.time() - 5))
    part = tmp_path / "spool" / "bundles" / "5" / "nodes" / "n1"
    assert "nv-fabricmanager[2201]" in (part / "journal.log").read_text()
    assert doc["sources"]["journal"]["status"] == "ok" and doc["provenance"]["journal"]["trusted"] is True


def test_fabric_manager_record_in_journal_log_is_a_trusted_root_candidate(tmp_path):
    from slurm_attr.bundle import Bundle
    from slurm_attr.rules import analyze

    part = tmp_path / "b" / "nodes" / "n1"
    part.mkdir(parents=True)
    text, _, _ = journal.render([record()], [UNIT])
    (part / "journal.log").write_bytes(text)
    (part / "kernel.log").write_text("")
    symptoms, _ = analyze(Bundle(str(tmp_path / "b")), Config())
    fm = [s for s in symptoms if s.id == "nvlink.fabric_manager_fatal"]
    assert fm and fm[0].trusted and fm[0].node == "n1" and fm[0].evidence[0].label() == "journal, trusted"
    # Near miss: the same text in the job's stdout is never a trusted Fabric Manager finding.
    out = tmp_path / "b" / "output"
    out.mkdir()
    (out / "stdout").write_text(f"Dec  1 20:10:05 hgx-07 nv-fabricmanager[2201]: {MSG}\n")
    (part / "journal.log").write_bytes(b"")
    symptoms, _ = analyze(Bundle(str(tmp_path / "b")), Config())
    assert not [s for s in symptoms if s.id == "nvlink.fabric_manager_fatal" and (s.trusted or s.action != "none")]
