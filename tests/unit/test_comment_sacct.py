"""Reading job comments from `sacct -P` whole: multi-line, '|' and look-alike delimiters inside."""
from __future__ import annotations

import re

import pytest

from slurm_attr.slurm.cli import CliSlurm, parse_delimited_comments

D = "^a1b2c3d4e5f6^"


def test_multi_line_comment_with_pipes_is_kept_whole():
    text = f"41{D}line one | two\nthree\n42 and 41\n{D}41\n"
    assert parse_delimited_comments(text, D) == {"41": "line one | two\nthree\n42 and 41\n"}


def test_several_records_and_an_empty_comment():
    text = f"41{D}a\nb{D}41\n42{D}{D}42\n43{D}SATTR1: none - ok{D}43\n"
    assert parse_delimited_comments(text, D) == {"41": "a\nb", "42": "", "43": "SATTR1: none - ok"}


def test_a_comment_that_imitates_the_record_end_with_another_delimiter_is_text():
    # The user cannot know the per-call delimiter; a guessed one ('|', an old one) is plain text.
    text = f"41{D}x|41\n42|forged{D}41\n"
    assert parse_delimited_comments(text, D) == {"41": "x|41\n42|forged"}


def test_unterminated_record_is_not_guessed():
    # Near miss: output cut before `<d>ID` (e.g. a truncated pipe) yields nothing for that job.
    assert parse_delimited_comments(f"41{D}partial comment", D) == {}
    assert parse_delimited_comments("", D) == {}


class RecordingCli(CliSlurm):
    def __init__(self, reply):
        super().__init__()
        self.reply = reply
        self.calls = []

    def run(self, tool, *args):
        self.calls.append((tool, args))
        delim = next(a.split("=", 1)[1] for a in args if a.startswith("--delimiter="))
        return self.reply(delim)


def test_job_comment_asks_for_id_comment_id_with_a_fresh_delimiter():
    cli = RecordingCli(lambda d: f"77{d}my note\nsecond line; SATTR1: none - ok{d}77\n")
    assert cli.job_comment("77", "Comment") == "my note\nsecond line; SATTR1: none - ok"
    assert cli.job_comment("77", "AdminComment") is not None
    (tool, a1), (_t, a2) = cli.calls
    assert tool == "sacct" and "-X" in a1 and "-P" in a1 and a1[a1.index("-o") + 1] == "JobIDRaw,Comment,JobIDRaw"
    d1 = next(a for a in a1 if a.startswith("--delimiter="))
    d2 = next(a for a in a2 if a.startswith("--delimiter="))
    assert d1 != d2 and re.fullmatch(r"--delimiter=\^[0-9a-f]{12}\^", d1)


def test_job_not_in_accounting_is_none():
    cli = RecordingCli(lambda d: "")
    assert cli.job_comment("78", "Comment") is None


def test_array_task_asked_as_a_t_maps_to_its_raw_record():
    cli = RecordingCli(lambda d: f"1234{d}task note{d}1234\n")
    assert cli.job_comments(["1200_3"], "Comment") == {"1200_3": "task note"}


def test_batch_keeps_only_the_asked_ids():
    cli = RecordingCli(lambda d: f"5{d}a{d}5\n6{d}b{d}6\n99{d}c{d}99\n")
    assert cli.job_comments(["5", "6", "7"], "Comment") == {"5": "a", "6": "b", "7": None}
    assert cli.calls[0][1][cli.calls[0][1].index("-j") + 1] == "5,6,7"


def _tool(tmp_path, stderr: str, rc: int):
    """A stand-in for sattr-comment that answers like slurmdbd does."""
    tool = tmp_path / "sattr-comment"
    tool.write_text(f"#!/bin/sh\ncat >/dev/null\necho \"{stderr}\" >&2\nexit {rc}\n")
    tool.chmod(0o755)
    return str(tool)


@pytest.mark.parametrize("answer", ["sattr-comment: error: Request didn't affect anything",
                                    "sattr-comment: modify failed: Data has not changed since time specified"])
def test_unchanged_modify_is_success_when_the_value_is_there_else_not_yet(tmp_path, monkeypatch, answer):
    """Slurm 24.11/26.05 answer a modify that changed no row with an error: the value was already
    there (success) or accounting has no record yet (retry later) — never a hard failure."""
    from slurm_attr.errors import SlurmUnavailable
    from slurm_attr.slurm.cli import CliSlurm

    s = CliSlurm(comment_tool=_tool(tmp_path, answer, 1))
    monkeypatch.setattr(s, "cluster_name", lambda: "c")
    monkeypatch.setattr(s, "job_comment", lambda job, field: "mine; SATTR1: none - ok")
    s.set_job_comment("12", "Comment", "mine; SATTR1: none - ok")  # already there: no error
    with pytest.raises(SlurmUnavailable):
        s.set_job_comment("12", "Comment", "something else")
    # Near miss: any other failure stays an error.
    bad = CliSlurm(comment_tool=_tool(tmp_path, "sattr-comment: Access/permission denied", 1))
    monkeypatch.setattr(bad, "cluster_name", lambda: "c")
    with pytest.raises(Exception) as info:
        bad.set_job_comment("12", "Comment", "x")
    assert not isinstance(info.value, SlurmUnavailable)


def _batch_tool(tmp_path, body):
    """A stand-in for `sattr-comment --batch` that reads the NUL-separated records."""
    tool = tmp_path / "sattr-comment"
    tool.write_text("#!/usr/bin/python3\nimport sys\nassert sys.argv[1:] == ['--batch', 'c']\n"
                    "items = sys.stdin.buffer.read().split(b'\\0')[:-1]\n"
                    "recs = [items[i:i + 3] for i in range(0, len(items), 3)]\n" + body)
    tool.chmod(0o755)
    return str(tool)


def test_batch_write_maps_each_jobs_answer(tmp_path, monkeypatch):
    from slurm_attr.errors import SlurmUnavailable
    from slurm_attr.slurm.cli import CliSlurm

    tool = _batch_tool(tmp_path, (
        "assert [r[1] for r in recs] == [b'Comment'] * 5 and recs[4][2] == b'a; b\\nc'\n"
        "answers = {b'1': \"0 \", b'2': \"4 nothing modified\", b'3': \"5 modify failed: Request didn't affect anything\",\n"
        "           b'4': '5 modify failed: Access/permission denied'}\n"
        "for jid, _f, _t in recs[:4]:\n"
        "    print(jid.decode(), answers[jid])\n"
        "sys.stderr.write('lost slurmdbd')\n"))
    s = CliSlurm(comment_tool=tool)
    monkeypatch.setattr(s, "cluster_name", lambda: "c")
    got = s.set_job_comments([(j, "Comment", "x") for j in ("1", "2", "3", "4")] + [("5", "Comment", "a; b\nc")])
    assert got["1"] is None and got["3"] is None  # unchanged: the caller's read-back decides
    assert isinstance(got["2"], SlurmUnavailable) and "no record" in str(got["2"])
    assert not isinstance(got["4"], SlurmUnavailable) and "permission" in str(got["4"])
    assert isinstance(got["5"], SlurmUnavailable) and "stopped before job 5" in str(got["5"])


def test_batch_write_without_slurmdbd_raises(tmp_path, monkeypatch):
    from slurm_attr.errors import SlurmUnavailable
    from slurm_attr.slurm.cli import CliSlurm

    s = CliSlurm(comment_tool=_batch_tool(tmp_path, "sys.stderr.write('cannot connect to slurmdbd')\nsys.exit(3)\n"))
    monkeypatch.setattr(s, "cluster_name", lambda: "c")
    with pytest.raises(SlurmUnavailable):
        s.set_job_comments([("1", "Comment", "x")])


def test_job_text_that_is_not_utf8_is_read_not_fatal(tmp_path):
    """A job's name or comment in another encoding reaches every Slurm listing we read."""
    from slurm_attr.slurm.cli import CliSlurm

    (tmp_path / "scontrol").write_bytes(b"#!/bin/sh\nprintf 'JobId=5 JobName=caf\\351 UserId=u(1)\\n'\n")
    (tmp_path / "scontrol").chmod(0o755)
    raw = CliSlurm(slurm_bin=str(tmp_path)).show_job_raw("5")
    assert raw is not None and raw.startswith("JobId=5 JobName=caf\ufffd ")
