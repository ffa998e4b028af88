"""Issue 21 item 5: a line that copies another source's format is never part of a headline.

Where a summary embeds the job's words (an exception message, an FR group's or collective's
name), they are quoted, first line only and bounded; plain tokens and trusted evidence read
as before. The Comment written into Slurm carries no control character.
"""
from __future__ import annotations

from types import SimpleNamespace

from slurm_attr import comment
from slurm_attr.flightrec.groups import Group
from slurm_attr.model import Coverage, Verdict
from slurm_attr.probe.comms import Comm
from slurm_attr.rules import extract_lines, load_catalog
from slurm_attr.verdict import decide

CAT = load_catalog()
OURS = "Xid 79 on GPU 0000:3b:00: GPU has fallen off the bus"  # how gpu.xid_79 words its own summary
KERNEL = ("[Thu May  2 10:00:03 2024] NVRM: Xid (PCI:0000:3b:00): 79, pid=48213, name=python, "
          "GPU has fallen off the bus.")


def _one(source: str, text: str):
    [s] = extract_lines(CAT, source, "n1", "out", [(1, text)])
    return s


def test_an_exception_message_is_quoted_as_the_jobs_words():
    copied = "Xid 79 on GPU 0000:3b:00: GPU is gone"  # our own summary's format, written by the job
    s = _one("stdout", f"[rank2]: ValueError: {copied}")
    assert s.id == "python.exception" and not s.trusted
    assert s.summary == f'rank 2: ValueError: "{copied}"'
    job = {"job_id": "5", "nodes": ["n1"], "state": "FAILED", "exit_code": 1}
    v = decide(job, [s], [Coverage(source="stdout", node="n1")])
    assert v.cause == "user_error" and v.summary.startswith(f'rank 2: ValueError: "{copied}"'), v.summary


def test_quoting_is_bounded_escaped_and_first_line_only():
    s = _one("stderr", '[rank0]: RuntimeError: say "hi" \x1b[2K' + "x" * 300)
    assert s.summary.startswith('rank 0: RuntimeError: "say \\"hi\\" \\x1b[2K') and s.summary.endswith('x…"')
    assert len(s.summary) < 160 and "\x1b" not in s.summary


def test_near_miss_plain_tokens_and_trusted_lines_read_as_before():
    assert _one("stdout", "[rank3]: ValueError: boom").summary == "rank 3: ValueError: boom"
    assert _one("stderr", "srun: error: n1: task 3: Exited with exit code 1").summary == \
        "srun: task 3 on n1 exited with code 1"
    assert _one("kernel", KERNEL).summary == OURS  # trusted evidence of ours is never quoted


def test_fr_group_names_are_quoted_where_more_than_a_token():
    assert Group(name="0", desc="default_pg", members=(0, 1), members_from="pg_config").label == "0 (default_pg)"
    g = Group(name="0", desc=f"x\n{KERNEL}", members=(0, 1), members_from="pg_config")
    assert g.label == '0 ("x…")'


def test_probe_communicator_names_are_quoted_where_more_than_a_token():
    """The name comes from the job's probe record (16 characters, made printable there)."""
    def label(name: str) -> str:
        return Comm(hash=0x9E3779B97F4A7C15, members={0: SimpleNamespace(name=name)}).label

    assert label("world") == "world 9e3779b97f4a7c15"  # as headlines and the README show it
    assert label("NVRM: Xid 79") == '"NVRM: Xid 79" 9e3779b97f4a7c15'
    assert label("") == "9e3779b97f4a7c15"


def test_the_comment_written_into_slurm_holds_no_control_character():
    v = Verdict(job_id="5", cause="user_error", culprit_nodes=["n1"],
                summary='rank 2: ValueError: "a\x1b[2K\x1b]0;t\x07\u202eb\x9b1A\u200bc\nd"')
    text = comment.verdict_text(v, 400)
    assert text.isprintable(), text
    assert text == "SATTR1: user_error nodes=n1 - rank 2: ValueError: a\\x1b[2K\\x1b]0;t\\x07\\u202eb\\x9b1A\\u200bc d"
    assert comment.verdict_text(Verdict(job_id="5", cause="none", summary="/home/ü/训练.py ok"), 400) == \
        "SATTR1: none - /home/ü/训练.py ok"
