"""Xid lookup by number: the data table xid.tsv turned into symptoms gpu.xid_<n>.

The regex rule gpu.xid finds the line; this refiner decides what the number
means. Special cases the table cannot carry alone:
- NVLink5 Xids 144-150 say Fatal or Nonfatal in the line: Nonfatal is context.
- Xid 45 names the Xid that caused it on newer drivers: kept as ``prev_xid``.
- Xid 154 carries the recovery action in its text: that becomes the action.
- Xid 13 coordinates (GPC/TPC/SM) are kept: recurrence on the same unit matters.
- Xid 74 registers are decoded bit by bit (rules/xid74.py, rules/xid74_bits.tsv).
- Xid 94/95 name the unit and whether a reset is needed (`Contained: SM ... RST: No`).
- Xid 63/64 say whether a row remap is pending (reset to activate) or failed.
- NVLink5 sub-code: intrInfo bits 20-25 as public decoders print it, kept as ``code`` (149.37: the peer).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Mapping, Optional

from . import table_rows

from slurm_attr.errors import RuleError
from slurm_attr.model import ACTION_KINDS, CAUSES, ROLES, Symptom
from slurm_attr.rules.pyrule import DocTable, JobRefiner, RefinerCase

from . import xid74


@dataclass(frozen=True)
class XidRow:
    xid: int
    name: str
    cause: str
    role: str
    action: str
    priority: int
    bucket: str
    meaning: str


COLUMNS = ("xid", "name", "cause", "role", "action", "priority", "bucket", "meaning")


def _load_table() -> dict[int, XidRow]:
    table: dict[int, XidRow] = {}
    for no, c in table_rows("xid.tsv", COLUMNS):
        try:
            row = XidRow(int(c["xid"]), c["name"], c["cause"], c["role"], c["action"], int(c["priority"]), c["bucket"],
                         c["meaning"])
        except ValueError as err:
            raise RuleError(f"rules/xid.tsv:{no}: {err}") from err
        if row.cause not in CAUSES or row.role not in ROLES or row.action not in ACTION_KINDS:
            raise RuleError(f"rules/xid.tsv:{no}: bad cause, role or action")
        if row.xid in table:
            raise RuleError(f"rules/xid.tsv:{no}: Xid {row.xid} listed twice")
        if row.action != "none" and row.cause not in ("gpu_hardware", "nvlink"):
            raise RuleError(f"rules/xid.tsv:{no}: only hardware Xids may carry an action")
        table[row.xid] = row
    # Decisions the research pins and tests rely on: never let an edit undo them silently.
    for xid in (43, 63, 92):
        if table[xid].action != "none":
            raise RuleError(f"rules/xid.tsv: Xid {xid} must never drain")
    if table[45].role != "cascade":
        raise RuleError("rules/xid.tsv: Xid 45 is always a cascade")
    return table


TABLE = _load_table()

_NVLINK5 = re.compile(
    r"(?:(?P<unit>[A-Z][A-Z0-9_]+)\s+)?(?P<severity>Fatal|Nonfatal)\s+(?P<xc>\w+)\s+(?P<inj>\w+)\s+Link\s+(?P<link>-?\d+)"
    r"\s+\((?P<intr>0x[0-9a-fA-F]+)\s+(?P<status>0x[0-9a-fA-F]+)"
)
_PREVIOUS = re.compile(r"previous\D{0,40}?\b(\d{1,3})\b", re.I)
_RECOVERY = re.compile(r"to 0x[0-9a-fA-F]+ \((?P<what>[^)]*)\)")
_CONTAINMENT = re.compile(r"(?P<kind>Uncontained|Contained):\s*(?P<unit>[\w ]{1,40}?)(?:\s*\(0x[0-9a-fA-F]+\))?\.\s*RST:\s*(?P<rst>Yes|No)")
_REMAP_WORDS = ("reset gpu to activate", "reboot to activate", "marked for remapping", "pending")
_REMAP_FAILED_WORDS = ("fail", "unable", "no spare", "no more")
_REMAP = re.compile("|".join(_REMAP_WORDS), re.I)
_REMAP_FAILED = re.compile("|".join(_REMAP_FAILED_WORDS), re.I)


def _says(rx: "re.Pattern[str]", words: tuple[str, ...], text: str) -> bool:
    """``rx.search(text)`` for rx = these words, case-insensitive. On ASCII text (every real
    line) case-folding is ``lower()``, and substring tests cost a fifth of the regex's scan,
    which has no literal to skip by: a noisy log's Xid 63 lines paid 40% of their symptom build
    here (issue 15)."""
    if text.isascii():
        low = text.lower()
        return any(w in low for w in words)
    return rx.search(text) is not None


# NVLink5 sub-code: intrInfo bits 20-25, as public decoders print it (0x025001c6 -> 149.37). NVIDIA's
# decode sheet is described with other bit positions for some driver branches, so the code is shown as
# a field and only the one sub-code with a published meaning changes anything (a hint, not an action).
_NVLINK5_SUBCODES = {(149, 37): "investigate_peer_device"}
_NVLINK5_SUBCODES = {(149, 37): "investigate_peer_device"}
_GPC = re.compile(r"GPC (?P<gpc>\d+), TPC (?P<tpc>\d+)(?:, SM (?P<sm>\d+))?")
_RECOVERY_ACTIONS = {
    "none": "none",
    "gpu reset required": "reset",
    "node reboot required": "reboot",
    "drain p2p": "drain",
    "drain and reset": "reset",
    "bus reset required": "reset",
    "system reboot required": "reboot",
    "node reboot": "reboot",
    "gpu reset": "reset",
}


def refine_xid(sym: Symptom, groups: Mapping[str, str]) -> Optional[Symptom]:
    """Give an Xid line its table meaning: id gpu.xid_<n>, cause, role, action, priority."""
    xid = sym.fields.get("xid")
    if not isinstance(xid, int):
        return None
    text = str(sym.fields.get("text", ""))
    row = TABLE.get(xid)
    if row is None:
        sym.id, sym.cause, sym.role, sym.action, sym.priority = "gpu.xid_other", "gpu_hardware", "root", "none", 70
        sym.summary = f"Xid {xid} (not in the pinned Xid catalog) on GPU {{gpu}}"
        return sym
    sym.id, sym.cause, sym.role, sym.action, sym.priority = f"gpu.xid_{xid}", row.cause, row.role, row.action, row.priority
    sym.fields["xid_name"] = row.name
    sym.summary = f"Xid {xid} on GPU {{gpu}}: {row.meaning.split(':')[0].split(';')[0]}"
    if 144 <= xid <= 150:
        m = _NVLINK5.search(text)
        if m:
            sym.fields.update(unit=m.group("unit") or "", severity=m.group("severity"), link=int(m.group("link")),
                              intr_info=m.group("intr"), error_status=m.group("status"))
            sub = int(m.group("intr"), 16) >> 20 & 0x3F
            sym.fields["code"] = sub
            if (xid, sub) in _NVLINK5_SUBCODES:
                sym.fields["fault"] = _NVLINK5_SUBCODES[(xid, sub)]
            if m.group("severity") == "Nonfatal" or xid == 147:
                sym.role, sym.action = "context", "none"
    elif xid == 74:
        decoded = xid74.decode(text)
        if decoded:
            sym.role, sym.action = str(decoded.pop("role")), str(decoded.pop("action"))
            sym.fields.update(decoded)
    elif xid in (94, 95):
        m = _CONTAINMENT.search(text)
        if m:
            sym.fields.update(unit=m.group("unit").strip(), state="reset required" if m.group("rst") == "Yes" else "no reset needed")
    elif xid in (63, 64):
        if xid == 64 or _says(_REMAP_FAILED, _REMAP_FAILED_WORDS, text):
            sym.fields["state"] = "remap failed"
        elif _says(_REMAP, _REMAP_WORDS, text):
            sym.fields["state"] = "remap pending"
    elif xid == 45:
        m = _PREVIOUS.search(text)
        if m:
            sym.fields["prev_xid"] = int(m.group(1))
    elif xid == 154:
        m = _RECOVERY.search(text)
        what = m.group("what").strip().lower() if m else ""
        sym.action = _RECOVERY_ACTIONS.get(what, "none")
        if what:
            sym.fields["state"] = what
        if sym.action == "none":
            sym.role = "context"
    elif xid == 13:
        m = _GPC.search(text)
        if m:
            sym.fields.update({k: int(v) for k, v in m.groupdict().items() if v is not None})
    return sym


REFINERS = {"xid": refine_xid}

DOC_TABLES = [
    DocTable(
        title="Xid catalog (rules/xid.tsv)",
        intro=(
            "Every `NVRM: Xid` line found by `gpu.xid` becomes symptom `gpu.xid_<n>` with this row's cause, role, "
            "action and priority (Xids not listed: `gpu.xid_other`, gpu_hardware, no action). NVLink5 144-150 lines "
            "with the `Nonfatal` token are context; Xid 154 takes its action from its text; Xid 13/31 become "
            "gpu_hardware only when they recur on the same GPU (see `gpu.xid_recurrent`)."
        ),
        header=("Xid", "id", "cause", "role", "action", "priority", "NVIDIA bucket", "meaning"),
        rows=[(str(r.xid), f"gpu.xid_{r.xid}", r.cause, r.role, r.action, str(r.priority), r.bucket, r.meaning)
              for r in sorted(TABLE.values(), key=lambda r: r.xid)],
    )
]


# ---- job-wide: a second Xid that is the first one's consequence ------------------------------
XID_CASCADE_WINDOW_S = 60.0


def _seconds(s: Symptom) -> Optional[float]:
    """The line's time: its uptime stamp, or its wall-clock time (both seconds, one node's clock)."""
    up = s.fields.get("uptime")
    if isinstance(up, (int, float)):
        return float(up)
    if s.time:
        try:
            return datetime.fromisoformat(s.time.replace("Z", "+00:00")).timestamp()
        except ValueError:
            return None
    return None


def _line(s: Symptom) -> tuple[str, int]:
    ev = s.evidence[0] if s.evidence else None
    return (ev.path or "", ev.line or 0) if ev else ("", 0)


def xid_109_after_13(syms: list[Symptom], job: Mapping[str, Any]) -> None:
    """A context-switch timeout (Xid 109) seconds after a graphics exception (Xid 13) on the same
    GPU is the same program fault, not a second (hardware) one: cascade, no action."""
    xid13 = [s for s in syms if s.id == "gpu.xid_13" and s.gpu]
    for s in syms:
        if s.id != "gpu.xid_109" or s.role != "root":
            continue
        for first in xid13:
            if first.node != s.node or first.gpu != s.gpu:
                continue
            a, b = _seconds(first), _seconds(s)
            before = _line(first)[0] == _line(s)[0] and _line(first)[1] <= _line(s)[1]
            if (a is not None and b is not None and 0 <= b - a <= XID_CASCADE_WINDOW_S) or ((a is None or b is None) and before):
                s.role, s.action, s.status.caused_by = "cascade", "none", first.id
                break


def _xid_pair(dt: float, gpu2: str = "0000:3b:00") -> list[Symptom]:
    def x(n: int, gpu: str, up: float) -> Symptom:
        return Symptom(id=f"gpu.xid_{n}", cause="user_error" if n == 13 else "gpu_hardware", role="root", trusted=True,
                       node="n1", gpu=gpu, action="none" if n == 13 else "reset", fields={"uptime": up})
    return [x(13, "0000:3b:00", 100.0), x(109, gpu2, 100.0 + dt)]


JOB_REFINERS = [
    JobRefiner(
        id="gpu.xid_109_after_13",
        description="An Xid 109 (context-switch timeout) within 60 s after an Xid 13 on the same GPU is the program's "
                    "fault seen twice: the 109 becomes the 13's cascade and drains nothing.",
        run=xid_109_after_13,
        cases=[
            RefinerCase(lambda: _xid_pair(5.0), ["root", "cascade"]),
            RefinerCase(lambda: _xid_pair(600.0), ["root", "root"]),  # near miss: ten minutes later
            RefinerCase(lambda: _xid_pair(5.0, "0000:5e:00"), ["root", "root"]),  # near miss: another GPU
        ],
    ),
]
