"""The rule tables (xid.tsv, sxid.tsv, xid74_bits.tsv) are read by one reader: a header row that
must name the columns, and each row's field count checked with its line number."""
from __future__ import annotations

import pytest

import rules
from slurm_attr.errors import RuleError


def _with(monkeypatch, text):
    monkeypatch.setattr(rules, "read_table", lambda name: text)


def test_rows_by_column_name_after_comments_and_the_header(monkeypatch):
    _with(monkeypatch, "# a comment\nxid\tname\tmeaning\n# between\n79\tfallen_off_bus\tthe GPU left the bus; reset it\n")
    assert list(rules.table_rows("t.tsv", ("xid", "name", "meaning"))) == [
        (4, {"xid": "79", "name": "fallen_off_bus", "meaning": "the GPU left the bus; reset it"})]


@pytest.mark.parametrize("text, says", [
    ("xid\tname\n79\tx\n", "header"),                        # the header names other columns
    ("xid\tname\tmeaning\n79\tx\n", "t.tsv:2: expected 3"),  # a row one field short
    ("xid\tname\tmeaning\n79\tx\ty\tz\n", "got 4"),          # a stray tab in a meaning
])
def test_a_malformed_table_names_its_line(monkeypatch, text, says):
    _with(monkeypatch, text)
    with pytest.raises(RuleError, match=says):
        list(rules.table_rows("t.tsv", ("xid", "name", "meaning")))


def test_the_shipped_tables_read():
    from rules import gpu_xid, nvlink_sxid, xid74

    assert len(gpu_xid._load_table()) >= 100 and 79 in gpu_xid._load_table()
    assert nvlink_sxid.lookup(11004) is not None and xid74.BITS
