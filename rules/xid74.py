"""Xid 74 register decode: which NVLink error bits are set, and how bad that is.

The table is data (rules/xid74_bits.tsv); this module reads it and turns the seven registers of an
Xid 74 line into a class, a role and an action that the `xid` refiner (gpu_xid.py) applies. A line
without registers (older drivers) keeps the Xid table's row.
"""
from __future__ import annotations

import re
from . import table_rows
from typing import Optional

from slurm_attr.errors import RuleError
from slurm_attr.rules.pyrule import DocTable

# Most severe first. (role, action) each class gives the Xid 74 symptom.
CLASSES = {
    "hardware": ("root", "drain"),
    "signal_integrity": ("root", "drain"),
    "unlisted": ("root", "none"),
    "ecc_parity": ("root", "none"),
    "recurring": ("root", "none"),
    "field_diag": ("root", "none"),
    "secondary": ("context", "none"),
    "ignore": ("context", "none"),
}
_ORDER = list(CLASSES)
REGISTERS = re.compile(r"link\s*(?P<link>\d+)\s*\((?P<regs>0x[0-9a-fA-F]+(?:,\s*0x[0-9a-fA-F]+){6})\)")


COLUMNS = ("register", "bits", "class", "meaning")


def _load() -> tuple[dict[tuple[int, int], str], list[tuple[str, str, str, str]]]:
    bits: dict[tuple[int, int], str] = {}
    rows = []
    for no, c in table_rows("xid74_bits.tsv", COLUMNS):
        if c["class"] not in CLASSES:
            raise RuleError(f"rules/xid74_bits.tsv:{no}: unknown class {c['class']!r}")
        try:
            reg = int(c["register"])
            for b in c["bits"].split(","):
                bits[(reg, int(b))] = c["class"]
        except ValueError as err:
            raise RuleError(f"rules/xid74_bits.tsv:{no}: {err}") from err
        rows.append((c["register"], c["bits"], c["class"], c["meaning"]))
    return bits, rows


BITS, _ROWS = _load()


def decode(text: str) -> Optional[dict[str, object]]:
    """{link, bits, fault, role, action} of an Xid 74 line with registers, else None."""
    m = REGISTERS.search(text)
    if not m:
        return None
    regs = [int(v, 16) for v in re.split(r",\s*", m.group("regs"))]
    found: list[str] = []
    worst = None
    for reg in (0, 2, 3, 4):  # the registers Hopper fills
        for bit in range(32):
            if regs[reg] >> bit & 1:
                found.append(f"r{reg}:{bit}")
                cls = BITS.get((reg, bit), "unlisted")
                if worst is None or _ORDER.index(cls) < _ORDER.index(worst):
                    worst = cls
    if worst is None:
        return {"link": int(m.group("link")), "bits": "", "fault": "none", "role": "context", "action": "none"}
    role, action = CLASSES[worst]
    return {"link": int(m.group("link")), "bits": " ".join(found), "fault": worst, "role": role, "action": action}


DOC_TABLES = [
    DocTable(
        title="Xid 74 register bits (rules/xid74_bits.tsv)",
        intro=("An Xid 74 line with its seven registers (`link N(0x.., ...)`) is decoded bit by bit; the most "
               "severe class decides: hardware and signal_integrity drain, ecc_parity/recurring/field_diag stay "
               "roots without a drain (a repeat is what makes them hardware), secondary and ignore are context. "
               "Bits not listed are `unlisted` (root, no drain). Lines without registers keep the Xid table row."),
        header=("register", "bits", "class", "meaning"),
        rows=_ROWS,
    )
]
