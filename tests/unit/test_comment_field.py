"""The job Comment field: our part found and replaced case-insensitively, the user's look-alikes
neutralised, multi-line user text kept, the whole bounded by max_len, our part verified and
re-applied after Slurm dropped it (slurmctld restart)."""
from __future__ import annotations

import time

import pytest

from slurm_attr import comment
from slurm_attr.errors import SlurmUnavailable
from slurm_attr.model import Verdict
from slurm_attr.store import Store

OURS = "SATTR1: user_error - Python exception in rank 0"


@pytest.mark.parametrize("user,expected", [
    ("sattr1: gpu_hardware nodes=n3 - fake", "(sattr1): gpu_hardware nodes=n3 - fake"),
    ("SATTR1: gpu_hardware nodes=n3 - fake", "(SATTR1): gpu_hardware nodes=n3 - fake"),
    ("run 7 SaTtR1:nvlink", "run 7 (SaTtR1):nvlink"),
    # U+017F (long s) folds to 's': a case-insensitive reader would take it for the marker.
    ("\u017fattr1: gpu_hardware", "(\u017fattr1): gpu_hardware"),
    ("a SATTR1: b\nSATTR1: c", "a (SATTR1): b\n(SATTR1): c"),
])
def test_marker_look_alikes_are_neutralised(user, expected):
    assert comment.neutralise(user) == expected
    assert not comment.has_marker(expected)
    assert comment.neutralise(expected) == expected  # idempotent


@pytest.mark.parametrize("user", ["sattr1 is my project", "SATTR2: next format", "sattr 1: x", "(sattr1): done"])
def test_near_misses_are_left_alone(user):
    assert comment.neutralise(user) == user
    assert not comment.has_marker(user)


def test_users_fake_at_the_end_is_not_taken_for_ours():
    fake = "my run; sattr1: gpu_hardware nodes=n3 - GPU fell off the bus"
    full = comment.merge(fake, OURS, known=[OURS])
    assert full == f"my run; (sattr1): gpu_hardware nodes=n3 - GPU fell off the bus; {OURS}"
    # Exactly one marker a reader can find, and it is ours, last.
    assert len([m for m in comment._MARKER_RE.finditer(full)]) == 1 and full.endswith(OURS)


def test_our_earlier_part_is_replaced_case_insensitively():
    old = "SATTR1: none - the job completed successfully"
    # sacctmgr on 22.05 stores the whole field lower-cased.
    for current in (f"keep ME; {old}", f"keep ME; {old}".lower()):
        full = comment.merge(current, OURS, known=[old])
        assert full.endswith(f"; {OURS}") and full.count("SATTR1:") == 1
        assert full.lower().startswith("keep me; ")
    # A near miss: a text we never wrote that merely looks like ours stays the user's.
    assert comment.merge(f"keep ME; {old}", OURS, known=["SATTR1: none - other"]).startswith("keep ME; (SATTR1): none")


def test_our_part_alone_is_replaced():
    old = "SATTR1: time_limit - the job hit its time limit"
    assert comment.merge(old, OURS, known=[old]) == OURS
    assert comment.merge("", OURS) == OURS and comment.merge(None, OURS) == OURS


def test_multi_line_user_comment_kept_whole():
    user = "line one\nline two | with pipe\n\tindented; sattr1: fake\nlast"
    full, ours = comment.compose(user, OURS, [], 400)
    assert ours == OURS
    assert full == "line one\nline two | with pipe\n\tindented; (sattr1): fake\nlast; " + OURS
    # Re-analysis over what we wrote gives the same user part back.
    assert comment.merge(full, "SATTR1: none - ok", known=[OURS]) == full[: -len(OURS)] + "SATTR1: none - ok"


@pytest.mark.parametrize("max_len", [60, 90, 120, 200, 400])
@pytest.mark.parametrize("user_len", [0, 10, 70, 150, 1000])
def test_whole_field_is_bounded_and_the_cut_is_visible(max_len, user_len):
    user = ("x" * (user_len - 1) + "Z") if user_len else ""
    v = Verdict(job_id="1", cause="gpu_hardware", culprit_nodes=["n2"], summary="GPU 0000:3b:00 on n2 fell off the bus " * 3)
    ours_in = comment.verdict_text(v, max_len)
    full, ours = comment.compose(user, ours_in, [], max_len)
    assert len(full) <= max_len
    assert ours.startswith("SATTR1: gpu_hardware nodes=n2") and full.endswith(ours)
    if user and len(user) + 2 + len(ours_in) <= max_len:
        assert full == f"{user}; {ours_in}"  # fits: nothing cut
    elif user:
        # Our summary gives way first; what is still too long of the user's is cut, visibly.
        user_part = full[: -len(ours) - 2] if full != ours else ""
        assert user_part == user or (user_part.endswith(comment.TRUNCATED) and "Z" not in user_part)
        assert user_part or max_len < len(ours) + 2 + len(comment.TRUNCATED) + 1
    # Writing again over our own result changes nothing (no second cut, no second marker).
    assert comment.compose(full, ours_in, [ours], max_len)[0] == full


def test_short_user_text_is_not_truncated_near_miss():
    full, _ = comment.compose("short note", OURS, [], len("short note; ") + len(OURS))
    assert full == f"short note; {OURS}" and comment.TRUNCATED not in full


class FakeAcct:
    """Accounting's Comment column, as the CLI backend would read and write it."""

    def __init__(self, comments, lowercase=False, drop_writes=False):
        self.comments = dict(comments)
        self.lowercase = lowercase
        self.drop_writes = drop_writes
        self.writes = []
        self.down = False

    def job_comment(self, job_id, field):
        if self.down:
            raise SlurmUnavailable("slurmdbd down")
        return self.comments.get(job_id)

    def job_comments(self, job_ids, field):
        return {j: self.job_comment(j, field) for j in job_ids}

    def set_job_comment(self, job_id, field, text):
        self.writes.append((job_id, text))
        if not self.drop_writes:
            self.comments[job_id] = text.lower() if self.lowercase else text


def _queue(st, job, text=OURS):
    st.queue_comment(job, job, "Comment", text)


@pytest.mark.parametrize("lowercase", [False, True])
def test_reanalysis_replaces_only_ours(lowercase):
    st = Store(memory=True)
    acct = FakeAcct({"5": "Keep ME\nsecond line; sattr1: gpu_hardware nodes=n3 - fake"}, lowercase=lowercase)
    _queue(st, "5", "SATTR1: none - first analysis")
    assert comment.write(acct, st, "5") == (True, "")
    _queue(st, "5", OURS)  # re-analysis
    assert comment.write(acct, st, "5") == (True, "")
    got = acct.comments["5"]
    want = f"Keep ME\nsecond line; (sattr1): gpu_hardware nodes=n3 - fake; {OURS}"
    assert got == (want.lower() if lowercase else want)
    assert len(list(comment._MARKER_RE.finditer(got))) == 1
    assert st.comment("5")["written"] == OURS and st.comment("5")["status"] == "written"


def test_write_that_accounting_does_not_keep_is_not_counted_as_written():
    st = Store(memory=True)
    acct = FakeAcct({"6": "note"}, drop_writes=True)
    _queue(st, "6")
    ok, err = comment.write(acct, st, "6")
    assert not ok and "did not keep" in err
    assert st.comment("6")["status"] == "pending"


def test_verify_reapplies_our_part_after_a_restart_reset():
    st = Store(memory=True)
    user = "my run\nsattr1: gpu_hardware nodes=n3 - fake"
    acct = FakeAcct({"7": user, "8": "other"})
    for j in ("7", "8"):
        _queue(st, j)
        assert comment.write(acct, st, j)[0]
    written8 = acct.comments["8"]
    # slurmctld restarted with job 7 still in memory: accounting has the user's text again.
    acct.comments["7"] = user
    acct.writes.clear()
    got = comment.verify_recent(acct, st, since_s=3600)
    assert got["reapplied"] == ["7"] and got["ok"] == ["8"] and not got["failed"]
    assert acct.comments["7"] == f"my run\n(sattr1): gpu_hardware nodes=n3 - fake; {OURS}"
    # Near miss: the intact comment of job 8 is not rewritten.
    assert [j for j, _ in acct.writes] == ["7"] and acct.comments["8"] == written8


def test_verify_leaves_old_and_pending_comments_to_their_own_paths():
    st = Store(memory=True)
    acct = FakeAcct({"9": "u", "10": "u"})
    _queue(st, "9")
    assert comment.write(acct, st, "9")[0]
    st.db["comments"].update(("9", "Comment"), {"updated_at": time.time() - 7200})
    _queue(st, "10")  # still pending: --retry's job, not --verify's
    acct.comments["9"] = "u"
    got = comment.verify_recent(acct, st, since_s=3600)
    assert got == {"ok": [], "reapplied": [], "failed": [], "missing": []}
    assert acct.writes == [("9", f"u; {OURS}")]


def test_verify_while_accounting_is_down_keeps_the_comment_queued():
    st = Store(memory=True)
    acct = FakeAcct({"11": "u"})
    _queue(st, "11")
    assert comment.write(acct, st, "11")[0]
    acct.comments["11"] = "u"

    class Flaky(FakeAcct):
        calls = 0

        def job_comment(self, job_id, field):
            Flaky.calls += 1
            if Flaky.calls > 1:
                raise SlurmUnavailable("slurmdbd down")
            return "u"

    got = comment.verify_recent(Flaky({}), st, since_s=3600)
    assert got["failed"] == ["11"]
    assert st.comment("11")["status"] == "pending"  # the retry timer writes it later
    assert comment.retry_pending(acct, st) == (1, 0) and acct.comments["11"] == f"u; {OURS}"


def test_comments_verify_command_reports_and_reapplies(tmp_path, monkeypatch):
    from click.testing import CliRunner

    import slurm_attr.slurm
    from slurm_attr.cli import main

    db = tmp_path / "attr" / "sattr.db"
    conf = tmp_path / "slurm_attr.toml"
    conf.write_text(f'[paths]\ndatabase = "{db}"\n')
    st = Store(str(db))
    acct = FakeAcct({"21": "mine", "22": ""})
    for j in ("21", "22"):
        _queue(st, j)
        assert comment.write(acct, st, j)[0]
    acct.comments["21"] = "mine"  # reset by a slurmctld restart
    monkeypatch.setattr(slurm_attr.slurm, "from_config", lambda cfg, *a, **k: acct)
    res = CliRunner().invoke(main, ["--config", str(conf), "comments", "--verify", "--since", "1h"])
    assert res.exit_code == 0, res.output
    assert "1 verified, 1 re-applied, 0 failed" in res.output and "re-applied 21" in res.output
    assert acct.comments["21"] == f"mine; {OURS}"
    # Near miss: nothing dropped, nothing re-applied.
    res = CliRunner().invoke(main, ["--config", str(conf), "comments", "--verify"])
    assert "2 verified, 0 re-applied" in res.output


class BatchAcct(FakeAcct):
    """A backend that writes many comments in one call (the CLI's sattr-comment --batch)."""

    def __init__(self, comments, **kw):
        super().__init__(comments, **kw)
        self.calls = []

    def job_comments(self, job_ids, field):
        self.calls.append(("read", len(job_ids)))
        return super().job_comments(job_ids, field)

    def set_job_comments(self, items):
        self.calls.append(("write", len(items)))
        out = {}
        for job_id, field, text in items:
            if job_id not in self.comments:
                out[job_id] = SlurmUnavailable(f"accounting has no record of job {job_id} yet")
                continue
            self.set_job_comment(job_id, field, text)
            out[job_id] = None
        return out


def test_a_batch_of_comments_costs_one_read_one_write_one_read_back():
    st = Store(memory=True)
    acct = BatchAcct({str(j): "" for j in range(20, 60)} | {"60": f"u; {OURS}"})
    ids = [str(j) for j in range(20, 61)]
    for j in ids:
        _queue(st, j)
    got = comment.write_many(acct, st, ids)
    assert set(got.values()) == {(True, "")}
    # job 60 already carried it: read, not rewritten
    assert acct.calls == [("read", 41), ("write", 40), ("read", 40)]
    assert all(st.comment(j)["status"] == "written" for j in ids)


def test_a_job_accounting_lacks_stays_queued_while_the_rest_of_its_batch_is_written():
    # near miss of the above: one job of the batch is not in accounting yet
    st = Store(memory=True)
    acct = BatchAcct({"70": "", "71": ""})
    for j in ("70", "71", "72"):
        _queue(st, j)
    got = comment.write_many(acct, st, ["70", "71", "72"])
    assert got["70"] == got["71"] == (True, "") and not got["72"][0] and "no record" in got["72"][1]
    assert st.comment("72")["status"] == "pending" and st.comment("70")["status"] == "written"


def test_accounting_down_fails_the_batch_without_a_call_per_job():
    st = Store(memory=True)
    acct = BatchAcct({str(j): "" for j in range(400)})
    acct.down = True
    ids = [str(j) for j in range(400)]
    for j in ids:
        _queue(st, j)
    got = comment.write_many(acct, st, ids)
    assert not any(ok for ok, _e in got.values()) and {e for _ok, e in got.values()} == {"slurmdbd down"}
    assert acct.calls == [("read", 200)]  # the second chunk of 200 was not tried


class ArrayAcct(BatchAcct):
    """Accounting's selection as slurmdbd makes it: a number N selects the job N and every task
    of the array N; A_T selects that one task (seen on the 22.05 cluster: writing the comment of
    the array's last task, whose own id is the array's, overwrote all 1,000 tasks)."""

    def __init__(self, tasks):  # {raw id: (array id, task id)}
        super().__init__({raw: "" for raw in tasks})
        self.tasks = tasks

    def set_job_comments(self, items):
        self.calls.append(("write", len(items)))
        for job_id, _field, text in items:
            if "_" in job_id:
                a, t = (int(x) for x in job_id.split("_"))
                hit = [r for r, at in self.tasks.items() if at == (a, t)]
            else:
                hit = [r for r, at in self.tasks.items() if r == job_id or str(at[0]) == job_id]
            for r in hit:
                self.comments[r] = text
        return {job_id: None for job_id, _f, _t in items}


def test_the_array_task_whose_id_is_the_arrays_is_written_alone():
    st = Store(memory=True)
    acct = ArrayAcct({"51": (50, 0), "52": (50, 1), "50": (50, 2), "60": (0, 0)})
    for task, raw in (("50_0", "51"), ("50_1", "52"), ("50_2", "50")):
        st.queue_comment(task, raw, "Comment", f"SATTR1: none - task {task}")
    st.queue_comment("60", "60", "Comment", "SATTR1: none - plain job")  # near miss: a plain job by number
    got = comment.write_many(acct, st, ["50_0", "50_1", "50_2", "60"])
    assert set(got.values()) == {(True, "")}
    assert acct.comments == {"51": "SATTR1: none - task 50_0", "52": "SATTR1: none - task 50_1",
                             "50": "SATTR1: none - task 50_2", "60": "SATTR1: none - plain job"}
