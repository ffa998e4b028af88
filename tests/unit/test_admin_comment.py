"""The verdict in AdminComment beside the Comment ([actions] admin_comment): one queue entry per
job and field, both written in one pass, another tool's AdminComment data never touched, and a
schema-2 store's queue carried over by the migration."""
from __future__ import annotations

import sqlite3

from slurm_attr import comment
from slurm_attr.config import from_dict
from slurm_attr.model import Verdict
from slurm_attr.store import Store

OURS = "SATTR1: gpu_hardware nodes=n3 - GPU fell off the bus"


class Accounting:
    """Accounting's Comment and AdminComment columns, per job."""

    def __init__(self, fields=None):
        self.fields = {f: dict(v) for f, v in (fields or {}).items()}
        self.writes: list[tuple[str, str, str]] = []

    def job_comments(self, job_ids, field):
        col = self.fields.setdefault(field, {})
        return {j: col.get(j, "") for j in job_ids}

    def set_job_comment(self, job_id, field, text):
        self.writes.append((job_id, field, text))
        self.fields.setdefault(field, {})[job_id] = text


def _verdict(job="40"):
    return Verdict(job_id=job, cause="gpu_hardware", summary="GPU fell off the bus",
                   culprit_nodes=["n3"])


def test_fields_follow_the_config():
    assert comment.fields(from_dict({})) == ["Comment"]
    assert comment.fields(from_dict({"actions": {"admin_comment": True}})) == ["Comment", "AdminComment"]
    # The primary field already AdminComment: not twice.
    assert comment.fields(from_dict({"comment": {"field": "AdminComment"},
                                     "actions": {"admin_comment": True}})) == ["AdminComment"]


def test_both_fields_written_and_the_user_text_kept_in_comment_only():
    cfg = from_dict({"actions": {"admin_comment": True}})
    st = Store(memory=True)
    comment.queue_verdict(cfg, st, _verdict(), "40")
    acct = Accounting({"Comment": {"40": "my run"}})
    assert comment.write_many(acct, st, ["40"]) == {"40": (True, "")}
    assert acct.fields["Comment"]["40"] == f"my run; {OURS}"
    assert acct.fields["AdminComment"]["40"] == OURS
    assert [r["status"] for r in st.job_comments("40")] == ["written", "written"]
    assert st.comment_status("40") == "written"


def test_another_tools_admin_comment_is_left_alone():
    cfg = from_dict({"actions": {"admin_comment": True}})
    st = Store(memory=True)
    comment.queue_verdict(cfg, st, _verdict("41"), "41")
    jobstats = "JS1:H4sIAAAAAAAAA6tWKkktLlGyUlAqS8wpTtVRUMpLzE0F"
    acct = Accounting({"Comment": {"41": ""}, "AdminComment": {"41": jobstats}})
    assert comment.write_many(acct, st, ["41"]) == {"41": (True, "")}
    assert acct.fields["AdminComment"]["41"] == jobstats  # untouched: its reader decodes all of it
    assert [f for _j, f, _t in acct.writes] == ["Comment"]
    row = st.comment("41", "AdminComment")
    assert row["status"] == "skipped" and row["last_error"] == comment.FOREIGN
    assert st.comment_status("41") == "written"  # nothing left to do for this job
    # A skipped entry is not re-applied by the verification either.
    assert comment.verify_recent(acct, st, since_s=3600)["reapplied"] == []


def test_our_own_earlier_admin_comment_is_replaced():
    # Near miss of the above: the field holds only a part we wrote for this job (a re-analysis).
    cfg = from_dict({"actions": {"admin_comment": True}})
    st = Store(memory=True)
    old = "SATTR1: unknown - no evidence"
    st.queue_comment("42", "42", "AdminComment", old)
    acct = Accounting({"AdminComment": {"42": ""}, "Comment": {"42": ""}})
    comment.write_many(acct, st, ["42"])
    comment.queue_verdict(cfg, st, _verdict("42"), "42")
    comment.write_many(acct, st, ["42"])
    assert acct.fields["AdminComment"]["42"] == OURS


def test_one_field_failing_keeps_the_job_pending():
    cfg = from_dict({"actions": {"admin_comment": True}})
    st = Store(memory=True)
    comment.queue_verdict(cfg, st, _verdict("43"), "43")

    class NoAdmin(Accounting):
        def job_comments(self, job_ids, field):
            if field == "AdminComment":
                return {j: None for j in job_ids}  # accounting has no record in this column yet
            return super().job_comments(job_ids, field)

    ok, err = comment.write_many(NoAdmin(), st, ["43"])["43"]
    assert not ok and "no record" in err
    assert st.comment("43", "Comment")["status"] == "written"
    assert st.comment("43", "AdminComment")["status"] == "pending"
    assert st.comment_status("43") == "pending"


def test_schema_2_queue_is_carried_over(tmp_path):
    path = str(tmp_path / "old.db")
    st = Store(path)
    st.db.conn.execute("delete from meta")
    st.db.conn.execute("drop table comments")
    st.db.conn.execute("drop table requeues")
    st.db.conn.execute("drop table recoveries")
    st.db.conn.execute("drop table diags")
    st.db.conn.execute("create table comments (job_id text primary key, slurm_job_id text, field text, text text, "
                       "status text, attempts integer, last_error text, updated_at float, written text)")
    st.db.conn.execute("insert into comments values ('7', '7', 'Comment', 'x', 'written', 1, '', 0, 'x')")
    st.db.conn.execute("insert into meta values ('schema_version', '2')")
    st.db.conn.commit()
    st.db.conn.close()
    again = Store(path)
    assert again.schema_version == 4
    assert again.comment("7")["written"] == "x"
    again.queue_comment("7", "7", "AdminComment", "y")  # a second field for the same job now fits
    assert len(again.job_comments("7")) == 2
    try:
        again.db.conn.execute("insert into comments (job_id, field) values ('7', 'Comment')")
    except sqlite3.IntegrityError:
        pass
    else:
        raise AssertionError("the key is (job_id, field)")
