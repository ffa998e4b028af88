"""Issue 10: Slurm's own fields are trusted only where the job's text cannot imitate them."""
import os

from slurm_attr.collect import controller, provenance
from slurm_attr.collect import jobstate
from slurm_attr.slurm.cli import parse_oneliner

# A real 22.05.8 record shape (test cluster), with the user's comment placed where Slurm prints it.
REC = ("JobId=31 JobName={name} UserId=alice(1001) GroupId=alice(1001) MCS_label=N/A Priority=4294901759 Nice=0 "
       "Account=root QOS=normal JobState=COMPLETING Reason=NonZeroExitCode Dependency=(null) Requeue=1 Restarts=0 "
       "BatchFlag=1 Reboot=0 ExitCode=1:0 RunTime=00:00:05 TimeLimit=UNLIMITED TimeMin=N/A "
       "SubmitTime=2026-12-01T20:00:00 EligibleTime=2026-12-01T20:00:00 AccrueTime=Unknown "
       "StartTime=2026-12-01T20:00:01 EndTime=2026-12-01T20:00:06 Deadline=N/A Partition=debug NodeList=n2 "
       "NumNodes=1 NumCPUs=1 NumTasks=1 Comment={comment} StdErr=/home/alice/x.out StdIn=/dev/null "
       "StdOut=/home/alice/x.out Power=")


class FakeSlurm:
    def __init__(self, raw):
        self.raw = raw

    def show_job(self, job_id):
        return parse_oneliner(self.raw.splitlines()[0])

    def sacct_job(self, job_id):
        return None

    def run(self, *args):
        return self.raw


def test_a_comment_imitating_slurms_fields_is_not_read_as_them():
    raw = REC.format(name="train", comment="x UserId=root(0) Reason=NodeDown StartTime=2020-01-01T00:00:00")
    # What the generic parser alone makes of it: the user's words win.
    naive = jobstate.job_facts(parse_oneliner(raw))
    assert naive["uid"] == 0 and naive["state"] == "NODE_FAIL"
    facts = controller.fetch_job(FakeSlurm(raw), "31")
    assert "uid" not in facts and "user" not in facts  # the hook's SLURM_JOB_UID fills it
    assert "state" not in facts  # accounting decides later
    assert facts["start_time"].startswith("2026-12-01T20:00:01")
    assert set(facts["imitated_fields"]) == {"UserId", "Reason", "StartTime"}


def test_a_plain_record_is_taken_as_it_is():
    raw = REC.format(name="train", comment="my run")  # near miss: nothing imitated
    facts = controller.fetch_job(FakeSlurm(raw), "31")
    assert facts["uid"] == 1001 and facts["state"] == "FAILED" and "imitated_fields" not in facts


def test_a_newline_in_the_job_name_distrusts_every_field():
    raw = REC.format(name="a\nJobId=31 UserId=root(0)", comment="(null)")
    facts = controller.fetch_job(FakeSlurm(raw), "31")
    assert "uid" not in facts and "state" not in facts


def test_imitated_keys():
    assert provenance.imitated_keys(REC.format(name="x JobState=FAILED", comment="c")) == {"JobState"}
    assert provenance.imitated_keys(REC.format(name="JobStateish", comment="MyReason=1")) == set()


def test_output_is_not_tailed_without_a_known_uid(tmp_path):
    out = tmp_path / "x.out"
    out.write_text("secret\n")
    assert controller.tail_output(str(out), None, 100)[1] == "error"
    assert controller.tail_output(str(out), os.getuid(), 100)[0] == b"secret\n"  # near miss: the owner
