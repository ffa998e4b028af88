"""jobtext: a job's text made printable (DESIGN.md §5: control characters never reach a terminal raw)."""
from __future__ import annotations

import unicodedata

import pytest

from slurm_attr import jobtext

ESC_SEQS = "\x1b[2K\x1b[1A\x1b]0;pwned\x07\x9b31m\x9d0;t\x9c\x7f\x00"
BIDI = "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f\u061c"
ZERO_WIDTH = "\u200b\u200c\u200d\u2060\ufeff\u00ad"


def raw_controls(text: str, allow: str = "") -> list[str]:
    """Every character of text a terminal would act on or hide."""
    return [c for c in text if c not in allow and unicodedata.category(c) in ("Cc", "Cf", "Cs", "Zl", "Zp")]


@pytest.mark.parametrize("text", [ESC_SEQS, BIDI, ZERO_WIDTH, "a\nb\rc\x0bd\x0ce\x85f\u2028g\u2029h", "\ud83d",
                                  "\U000e0041tag", "".join(map(chr, [*range(0x20), *range(0x7f, 0xa0)]))])
def test_line_leaves_no_control_character(text):
    out = jobtext.line(text)
    assert raw_controls(out) == []
    out.encode("utf-8")  # a lone surrogate is escaped too, so printing never raises


def test_escapes_are_visible_and_named():
    assert jobtext.line("\x1b[2K\x1b]0;t\x07") == "\\x1b[2K\\x1b]0;t\\x07"
    assert jobtext.line("\x9b1A\x7f") == "\\x9b1A\\x7f"
    assert jobtext.line("a\u202eb\u2066c\u200e") == "a\\u202eb\\u2066c\\u200e"
    assert jobtext.line("x\ny\rz") == "x\\ny\\rz"  # a job never starts a line of ours
    assert jobtext.line("\U000e0041") == "\\U000e0041"


def test_tabs_and_newlines_by_mode():
    assert jobtext.line("a\tb") == "a b"
    assert jobtext.block("a\tb\nc\x1b[2Jd\r\n") == "a\tb\nc\\x1b[2Jd\\r\n"


@pytest.mark.parametrize("text", ["/home/ü/train.py", "日本語のテスト 训练.py", "Ελληνικά — ﬁ “quoted”", "plain ASCII: 1.5%",
                                  "non\u00a0breaking\u3000ideographic space", "emoji 🙂 ok", ""])
def test_near_miss_ordinary_text_passes_unchanged(text):
    assert jobtext.line(text) == text
    assert jobtext.block(text) == text


def test_non_strings_are_shown_as_text():
    assert jobtext.line(None) == "None" and jobtext.line(7) == "7"


@pytest.mark.parametrize("token", ["gloo:all_reduce", "<module>", "/home/ü/train.py", "nccl:all_reduce_coalesced",
                                   "ValueError", "训练.py", "10.0.0.2:45678", "mlx5_0/1"])
def test_quote_keeps_a_plain_token_bare(token):
    assert jobtext.quote(token) == token


def test_quote_marks_the_jobs_words():
    xid = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus."
    assert jobtext.quote(xid) == f'"{xid}"'
    assert jobtext.quote('say "hi" \\ bye') == '"say \\"hi\\" \\\\ bye"'
    # first line only, cut visibly inside the quotes, controls escaped
    assert jobtext.quote("boom\nNVRM: Xid 79") == '"boom…"'
    assert jobtext.quote("one two\r\n") == '"one two"'  # a line end alone cuts nothing
    assert jobtext.quote("x" * 300, cap=10) == '"' + "x" * 10 + '…"'
    assert jobtext.quote("a\x1b[2Kb") == '"a\\x1b[2Kb"'
    assert jobtext.quote("all_reduce" * 20, cap=20) == '"' + ("all_reduce" * 2) + '…"'  # a long token is cut too


def test_deep_copies_every_string_and_keeps_the_rest():
    value = {"a\x1b": ["x\u202e", 3, None, {"k": "y\n"}], "n": 1.5, "t": ("z\x07",)}
    got = jobtext.deep(value)
    assert got == {"a\\x1b": ["x\\u202e", 3, None, {"k": "y\\n"}], "n": 1.5, "t": ["z\\x07"]}
    assert value["a\x1b"][0] == "x\u202e"  # the original is untouched
