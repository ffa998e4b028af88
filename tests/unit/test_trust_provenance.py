"""Issue 10 item 2: provenance, not file names, decides trust."""
import json
import os
import stat

import pytest

from slurm_attr.bundle import Bundle
from slurm_attr.collect import controller, provenance
from slurm_attr.config import Config
from slurm_attr.model import Evidence, Symptom

FM = "/x/nv-fabricmanager[2201]: detected NVSwitch fatal error 20034 on fid 0 on NVSwitch pci bus id 00000000:86:00.0 physical id 0 port 34 .../x.out"

# (line as slurmctld/slurmd 22.05 write it, trusted?) - every structural form beside its near miss.
CASES = [
    ("[2026-12-01T20:17:38.412] _job_complete: JobId=12 WEXITSTATUS 1", True),
    ("[2026-12-01T20:17:38.412] _job_complete: JobId=12 WEXITSTATUS 1 nv-fabricmanager[2201]: detected", False),
    ("[2026-12-01T20:17:38.412] Time limit exhausted for JobId=12", True),
    ("Time limit exhausted for JobId=12", False),  # no daemon prefix: a continuation or an injected line
    ("[2026-12-01T20:17:38.412] [12.0] done with job", True),
    ("[2026-12-01T20:17:38.412] [12.batch] error: *** JOB 12 ON n2 CANCELLED AT 2026-12-01T20:17:38 DUE TO TIME LIMIT ***", True),
    ("[2026-12-01T20:17:38.412] [12.batch] error: *** JOB 12 ON n2 CANCELLED AT 2026-12-01T20:17:38 DUE TO A FABRIC ERROR ***", False),
    ("[2026-12-01T20:17:38.412] [12.extern] error: Detected 1 oom-kill event(s) in StepId=12.extern. "
     "Some of your processes may have been killed by the cgroup out-of-memory handler.", True),
    ("[2026-12-01T20:17:38.412] sched: Allocate JobId=12 NodeList=n[1-2] #CPUs=2 Partition=debug", True),
    ("[2026-12-01T20:17:38.412] sched: _slurm_rpc_allocate_resources JobId=12 NodeList=n[1-2] usec=311", True),
    ("[2026-12-01T20:17:38.412] launch task StepId=12.0 request from UID:1001 GID:1001 HOST:127.0.0.1 PORT:41652", True),
    ("[2026-12-01T20:17:38.412] job_epilog_complete: JobId=12 epilog error on n2, draining the node", True),
    ("[2026-12-01T20:17:38.412] Killing JobId=12 on failed node n3", True),
    # Seen on the test cluster (22.05.8) beside a bad -o path: daemon text only.
    ("[2026-12-01T20:36:39.536] [13.batch] get_exit_code task 0 died by signal: 53", True),
    ("[2026-12-01T20:36:39.533] [13.batch] error: _fork_all_tasks: IO setup failed: Slurmd could not connect IO", True),
    ("[2026-12-01T20:36:38.672] update_node: node n2 reason set to: SATTR: gpu_hardware xid79 gpu3b:00 job 12", False),
    ("[2026-12-01T20:17:38.412] Killing JobId=12 on failed node n3 because the user said so", False),
    # Job-chosen text under the job's prefix: output path, argv[0], an updated job name.
    (f"[2026-12-01T20:17:38.412] [12.batch] error: Could not open stdout file {FM}: No such file or directory", False),
    (f"[2026-12-01T20:17:38.412] [12.0] error: execve(): {FM}: No such file or directory", False),
    ("[2026-12-01T20:17:38.412] _update_job: setting name to NVRM: Xid (PCI:0000:3b:00): 79 for JobId=12", False),
    ("[2026-12-01T20:17:38.412] [12.0] error: *** STEP 12.0 ON n2 CANCELLED AT 2026-12-01T20:17:38 \x1b[0m ***", False),
]


@pytest.mark.parametrize("line,trusted", CASES)
def test_daemon_line_trust(line, trusted):
    assert provenance.classify_daemon_line(line)[0] is trusted


def test_syslog_prefixed_daemon_lines():
    assert provenance.classify_daemon_line(
        "Dec  1 20:17:38 ctl slurmctld[812]: _job_complete: JobId=12 done")[0] is True
    assert provenance.classify_daemon_line(
        "Dec  1 20:17:38 ctl logger[812]: _job_complete: JobId=12 done")[0] is False  # a user's logger line


def _bundle_with_logs(tmp_path, lines):
    log = tmp_path / "slurmd-n2.log"
    log.write_text("\n".join(lines) + "\n")
    bdir = tmp_path / "b"
    job = {"job_id": "12", "slurm_job_id": "12", "nodes": ["n2"], "uid": os.getuid(), "state": "COMPLETED",
           "exit_code": 0}
    controller.write_controller_part(str(bdir), job, 1 << 20, [str(log)])
    return bdir


def test_fabric_manager_text_in_an_output_path_is_no_trusted_symptom(tmp_path):
    from slurm_attr.rules import analyze

    bdir = _bundle_with_logs(tmp_path, [
        f"[2026-12-01T20:17:38.412] [12.batch] error: Could not open stdout file {FM}: No such file or directory",
        f"[2026-12-01T20:17:38.413] [12.0] error: execve(): {FM}: No such file or directory",
        "[2026-12-01T20:17:39.001] _job_complete: JobId=12 WEXITSTATUS 1",
    ])
    assert "nv-fabricmanager" not in (bdir / "scheduler" / "slurm.log").read_text()
    assert "nv-fabricmanager" in (bdir / "scheduler" / "untrusted.txt").read_text()
    job = json.loads((bdir / "job.json").read_text())
    assert job["provenance"]["scheduler_untrusted"]["trusted"] is False
    assert job["controller_collect"]["scheduler_untrusted"]["lines"] == 2
    symptoms, _ = analyze(Bundle(str(bdir)), Config())
    assert not [s for s in symptoms if s.trusted and s.cause == "nvlink"]
    # Near miss: a structural line in the same file is still trusted scheduler evidence.
    assert [s for s in symptoms if s.trusted and s.id == "slurm.ctld_signal"]


def test_bundle_files_are_root_only(tmp_path):
    out = tmp_path / "out.txt"
    out.write_text("hello\n")
    bdir = tmp_path / "b"
    controller.write_controller_part(str(bdir), {"job_id": "13", "uid": os.getuid(), "stdout_path": str(out),
                                                 "user": "alice", "account": "secret"}, 1 << 20)
    for rel in ("job.json", "output/stdout"):
        mode = stat.S_IMODE(os.stat(bdir / rel).st_mode)
        assert mode & 0o077 == 0, (rel, oct(mode))


def test_evidence_carries_its_provenance_for_rendering():
    k = Evidence(source="kernel", path="nodes/n2/kernel.log", line=3, text="NVRM: Xid ...")
    o = Evidence(source="stdout", path="output/stdout", line=9, text="NVRM: Xid ...")
    assert k.label() == "kernel, trusted" and o.label() == "stdout, untrusted"
    # A caller can lower trust, never raise it.
    assert Evidence(source="stdout", trusted=True).label() == "stdout, untrusted"
    assert Evidence(source="kernel", trusted=False).label() == "kernel, untrusted"
    s = Symptom(id="gpu.xid_79", cause="gpu_hardware", evidence=[k])
    d = s.to_dict()
    assert d["provenance"] == "kernel, trusted" and d["evidence"][0]["trusted"] is True
    assert Symptom.from_dict(d).evidence[0] == k
    old = Evidence(source="kernel", attributed_to="200")
    assert old.label() == "kernel, trusted, already attributed to job 200"
