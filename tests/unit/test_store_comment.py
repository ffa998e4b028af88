import time

import pytest

from slurm_attr import comment
from slurm_attr.errors import NotFound, SlurmUnavailable
from slurm_attr.model import Evidence, Symptom, Verdict
from slurm_attr.store import SCHEMA_VERSION, Store


def _verdict(job="7", cause="gpu_hardware"):
    s = Symptom(id="gpu.xid_fatal", cause=cause, role="root", trusted=True, node="n2", gpu="3", action="drain",
                summary="Xid 79 on n2", evidence=[Evidence("kernel", "nodes/n2/kernel.log", 4, "NVRM: Xid 79")])
    return Verdict(job_id=job, cause=cause, summary="GPU 3 on n2 fell off the bus", culprit_nodes=["n2"],
                   culprit_gpus=["3"], symptoms=[s])


def test_save_and_reload_replaces_earlier_analysis(tmp_path):
    st = Store(str(tmp_path / "db" / "s.db"))
    assert st.schema_version == SCHEMA_VERSION
    st.save({"user": "alice", "nodes": ["n1", "n2"], "state": "FAILED"}, _verdict())
    st.save({"user": "alice", "nodes": ["n1", "n2"], "state": "FAILED"}, _verdict())
    v = st.verdict("7")
    assert v.cause == "gpu_hardware" and v.symptoms[0].evidence[0].line == 4
    assert st.db["symptoms"].count == 1 and st.db["evidence"].count == 1
    assert st.job("7")["nodes"] == ["n1", "n2"]
    assert st.jobs(node="n2")[0]["job_id"] == "7"
    assert st.jobs(node="n9") == []
    with pytest.raises(NotFound):
        st.verdict("8")
    # Reopening migrates nothing and keeps the data.
    assert Store(str(tmp_path / "db" / "s.db")).verdict("7").culprit_nodes == ["n2"]


def test_gpu_history(tmp_path):
    st = Store(memory=True)
    for j in ("1", "2", "3"):
        st.save({}, _verdict(job=j))
    assert st.gpu_symptom_jobs("n2", "3", "gpu.xid_fatal", time.time() - 60, exclude_job="3") == {"1", "2"}
    assert st.gpu_symptom_jobs("n2", "4", "gpu.xid_fatal", 0, exclude_job="3") == set()


def test_verdict_text_and_merge():
    v = _verdict()
    t = comment.verdict_text(v, 400)
    assert t.startswith("SATTR1: gpu_hardware nodes=n2 gpus=3 - GPU 3 on n2")
    assert len(comment.verdict_text(v, 30)) <= 30
    assert comment.merge("", t) == t
    assert comment.merge("user note", t) == f"user note; {t}"
    # Re-analysis: our old part (a text we wrote, so `known`) is replaced, the user's kept,
    # never duplicated. Changed deliberately (issue 10): without `known`, a marker in the
    # field is the user's and is neutralised, never taken for ours.
    old = "SATTR1: none - old"
    assert comment.merge(f"user note; {old}", t, known=[old]) == f"user note; {t}"
    assert comment.merge(f"user note; {old}", t) == f"user note; (SATTR1): none - old; {t}"
    v.summary = "bad | chars 'quoted'\nnewline"
    assert "|" not in comment.verdict_text(v, 400) and "'" not in comment.verdict_text(v, 400)


class FakeSlurm:
    def __init__(self, down=False):
        self.comments = {"7": "user note"}
        self.down = down

    def job_comment(self, job_id, field):
        if self.down:
            raise SlurmUnavailable("slurmdbd down")
        return self.comments.get(job_id)

    def set_job_comment(self, job_id, field, text):
        self.comments[job_id] = text


def test_comment_queue_survives_outage():
    st = Store(memory=True)
    st.queue_comment("7", "7", "Comment", "SATTR1: none")
    down = FakeSlurm(down=True)
    ok, err = comment.write(down, st, "7")
    assert not ok and "down" in err and st.comment("7")["status"] == "pending"
    up = FakeSlurm()
    assert comment.retry_pending(up, st) == (1, 0)
    assert up.comments["7"] == "user note; SATTR1: none"
    assert st.comment("7")["status"] == "written"
