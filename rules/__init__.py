"""The built-in rule catalog: TOML rules, their Python refiners and the tables they read."""
from __future__ import annotations

import csv
import os
from typing import Iterator, Sequence


def read_table(name: str) -> str:
    """A table shipped beside these modules (xid.tsv, ...), read from the package's directory
    when it is one (installed or editable) without importing importlib.resources' readers
    (a few ms of every start); through them otherwise (a zipped install)."""
    path = os.path.join(os.path.dirname(__file__), name)
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            return f.read()
    from importlib import resources

    return resources.files(__name__).joinpath(name).read_text("utf-8")


def table_rows(name: str, columns: Sequence[str]) -> Iterator[tuple[int, dict[str, str]]]:
    """(line number, {column: value}) for each row of a tab-separated table: `#` lines are
    comments, the first other line is the header and must name ``columns``, in order; a row
    with another number of fields is an error naming its line (csv's reader, no quoting: a
    meaning may hold any character but a tab)."""
    from slurm_attr.errors import RuleError

    lines = [(no, ln) for no, ln in enumerate(read_table(name).splitlines(), 1) if ln.strip() and not ln.startswith("#")]
    reader = csv.reader((ln for _no, ln in lines), delimiter="\t", quoting=csv.QUOTE_NONE)
    header = next(reader, None)
    if header != list(columns):
        raise RuleError(f"rules/{name}: header {header!r}, expected {list(columns)!r}")
    for (no, _ln), fields in zip(lines[1:], reader):
        if len(fields) != len(columns):
            raise RuleError(f"rules/{name}:{no}: expected {len(columns)} tab-separated fields, got {len(fields)}")
        yield no, dict(zip(columns, fields))
