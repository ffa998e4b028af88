"""SXid (NVSwitch) lookup: the data table sxid.tsv turned into a unit, a name and an action.

nvlink.sxid_fatal and nvlink.sxid_nonfatal find the line and its Fatal/Non-fatal token; this refiner
says which switch unit the code belongs to and what a *fatal* one asks for: reset the GPUs behind the
switch (most), drain for a person (link signal integrity, cabling, thermals), or nothing (benign
codes, fabric manager configuration). Non-fatal lines stay context without an action.
"""
from __future__ import annotations

from dataclasses import dataclass
from . import table_rows
from typing import Mapping, Optional

from slurm_attr.errors import RuleError
from slurm_attr.model import ACTION_KINDS, Symptom
from slurm_attr.rules.pyrule import DocTable


@dataclass(frozen=True)
class SxidRow:
    lo: int
    hi: int
    unit: str
    name: str
    action: str
    bucket: str
    meaning: str


COLUMNS = ("sxid", "unit", "name", "action", "bucket", "meaning")


def _load() -> tuple[dict[int, SxidRow], list[SxidRow]]:
    codes: dict[int, SxidRow] = {}
    ranges: list[SxidRow] = []
    for no, c in table_rows("sxid.tsv", COLUMNS):
        if c["action"] not in ACTION_KINDS:
            raise RuleError(f"rules/sxid.tsv:{no}: unknown action {c['action']!r}")
        try:
            lo, _, hi = c["sxid"].partition("-")
            row = SxidRow(int(lo), int(hi or lo), c["unit"], c["name"], c["action"], c["bucket"], c["meaning"])
        except ValueError as err:
            raise RuleError(f"rules/sxid.tsv:{no}: {err}") from err
        if row.lo == row.hi:
            if row.lo in codes:
                raise RuleError(f"rules/sxid.tsv:{no}: SXid {row.lo} listed twice")
            codes[row.lo] = row
        else:
            ranges.append(row)
    return codes, ranges


CODES, RANGES = _load()


def lookup(sxid: int) -> Optional[SxidRow]:
    """The code's own row, else its unit's range row, else None."""
    row = CODES.get(sxid)
    if row is not None:
        return row
    return next((r for r in RANGES if r.lo <= sxid <= r.hi), None)


def refine_sxid(sym: Symptom, groups: Mapping[str, str]) -> Optional[Symptom]:
    """Name the switch unit and, on a Fatal line, take the table's action."""
    sxid = sym.fields.get("sxid")
    if not isinstance(sxid, int):
        return sym
    row = lookup(sxid)
    if row is None:
        return sym  # outside the known code space: the rule's own defaults stand
    sym.fields["unit"] = row.unit
    if row.lo == row.hi:
        sym.fields["xid_name"] = row.name
    if sym.role == "root":  # the Fatal rule; Non-fatal lines are context and never act
        sym.action = row.action
        sym.fields["fault"] = row.bucket
        if row.action == "none":
            sym.role = "context"  # a fatal-tagged benign code (e.g. FM configuration) ends nothing
    return sym


REFINERS = {"sxid": refine_sxid}

DOC_TABLES = [
    DocTable(
        title="SXid (NVSwitch) table (rules/sxid.tsv)",
        intro=("`nvlink.sxid_fatal` / `nvlink.sxid_nonfatal` look the code up here: a code row wins over its unit's "
               "range. On a Fatal line the action applies (reset the GPUs behind the switch, or drain for a person); "
               "a Fatal line whose row says none becomes context. Non-fatal lines are always context."),
        header=("SXid", "unit", "name", "action on Fatal", "NVIDIA bucket", "meaning"),
        rows=[(f"{r.lo}" if r.lo == r.hi else f"{r.lo}-{r.hi}", r.unit, r.name, r.action, r.bucket, r.meaning)
              for r in sorted(list(CODES.values()) + RANGES, key=lambda r: (r.lo, r.hi))],
    )
]
