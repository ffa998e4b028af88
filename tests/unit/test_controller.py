import os

from slurm_attr.collect import controller
from slurm_attr.collect import jobstate
from slurm_attr.slurm.cli import parse_oneliner

# A real `scontrol -o show job` record from the test cluster, inside EpilogSlurmctld.
REC = ("JobId=3 JobName=wrap UserId=alice(1001) GroupId=alice(1001) MCS_label=N/A Priority=4294901757 Nice=0 "
       "Account=root QOS=normal JobState=COMPLETING Reason=NonZeroExitCode Dependency=(null) Requeue=1 Restarts=0 "
       "BatchFlag=1 Reboot=0 ExitCode=3:0 RunTime=00:00:00 TimeLimit=UNLIMITED TimeMin=N/A "
       "SubmitTime=2026-11-30T16:50:48 StartTime=2026-11-30T16:50:49 EndTime=2026-11-30T16:50:59 "
       "Partition=debug NodeList=n[1-2] BatchHost=n1 NumNodes=2 NumCPUs=2 NumTasks=2 CPUs/Task=1 "
       "Comment=my note with spaces WorkDir=/tmp StdErr=/tmp/slurm-3.out StdIn=/dev/null StdOut=/tmp/slurm-3.out Power=")


def test_parse_oneliner_keeps_values_with_spaces():
    rec = parse_oneliner(REC)
    assert rec["Comment"] == "my note with spaces"
    assert rec["CPUs/Task"] == "1"
    assert rec["Power"] == ""
    assert rec["NodeList"] == "n[1-2]"


def test_job_facts():
    facts = jobstate.job_facts(parse_oneliner(REC))
    assert facts["job_id"] == "3" and facts["user"] == "alice" and facts["uid"] == 1001
    assert facts["nodes"] == ["n1", "n2"]
    assert facts["exit_code"] == 3 and facts["signal"] == 0
    assert facts["state"] == "FAILED" and facts["state_source"] == "derived"
    assert facts["start_time"].startswith("2026-11-30T16:50:49")
    assert facts["stdout_path"] == "/tmp/slurm-3.out"


def test_array_task_id():
    rec = parse_oneliner(REC.replace("JobId=3 ", "JobId=3 ArrayJobId=2 ArrayTaskId=7 "))
    assert jobstate.job_facts(rec)["job_id"] == "2_7"


def test_derive_state():
    d = jobstate.derive_state
    assert d("COMPLETING", "TimeLimit", 0, 0, None) == ("TIMEOUT", "reason")
    assert d("COMPLETING", "None", 0, 0, "CANCELLED by 0") == ("CANCELLED", "sacct")
    assert d("COMPLETING", "None", 0, 0, "PENDING") == (None, "unknown")
    assert d("COMPLETING", "NodeDown", 0, 0, None) == ("NODE_FAIL", "reason")
    assert d("FAILED", "None", 1, 0, None) == ("FAILED", "scontrol")
    assert d("COMPLETING", "None", 0, 9, None) == ("CANCELLED", "derived")


def test_refresh_state_from_sacct():
    job = {"state": None, "state_source": "unknown"}
    jobstate.refresh_state(job, {"State": "CANCELLED by 1001", "ExitCode": "0:15"})
    assert job["state"] == "CANCELLED" and job["signal"] == 15 and job["cancelled_by_uid"] == "1001"


def test_tail_output_refuses_other_owners_and_links(tmp_path):
    out = tmp_path / "out"
    out.write_bytes(b"x" * 100 + b"\nlast line\n")
    data, status, _ = controller.tail_output(str(out), os.getuid(), 20)
    assert data.endswith(b"last line\n") and status == "truncated"
    data, status, detail = controller.tail_output(str(out), os.getuid() + 1, 20)
    assert data == b"" and status == "error" and "not owned" in detail
    os.symlink("/etc/passwd", tmp_path / "link")
    data, status, _ = controller.tail_output(str(tmp_path / "link"), None, 100)
    assert data == b"" and status == "missing"


def test_scheduler_lines_only_about_this_job(tmp_path):
    log = tmp_path / "slurmctld.log"
    log.write_text("[t] _job_complete: JobId=12 WEXITSTATUS 1\n[t] _job_complete: JobId=123 done\n"
                   "[t] [12.0] done with job\n[t] Time limit exhausted for JobId=12\n")
    lines = controller.scheduler_lines([str(log)], "12", 1 << 20)
    assert lines == ["slurmctld.log: [t] _job_complete: JobId=12 WEXITSTATUS 1",
                     "slurmctld.log: [t] [12.0] done with job",
                     "slurmctld.log: [t] Time limit exhausted for JobId=12"]


def test_refresh_fills_nodes_from_accounting():
    job = {"nodes": []}
    jobstate.refresh_state(job, {"State": "FAILED", "ExitCode": "1:0", "NodeList": "n[2-3]"})
    assert job["nodes"] == ["n2", "n3"]
