"""The divergence matrix: ranks (rows, by process group) x collective sequence numbers.

Each cell is a symbol for the collective's signature (op + sizes + dtypes), so a
rank that disagrees stands out in its column. Identical rows are folded into one
("0-2047,2049-4095"), which keeps a 4096-rank group readable. The model is
built once and rendered for the terminal here and as HTML in matrixhtml.py.
"""
from __future__ import annotations

import string
from dataclasses import dataclass, field

from .divergences import Analysis, Finding
from .groups import Group, order_key
from .loader import DumpSet
from .symptoms import clean, ranges
from .types import NO_SIG

SYMBOLS = string.ascii_uppercase + string.ascii_lowercase + string.digits
NOT_REACHED = "·"
NO_DUMP = "?"
NO_DATA = " "


@dataclass
class Cell:
    sym: str
    culprit: bool = False
    pending: bool = False


@dataclass
class Row:
    ranks: list[int]
    cells: list[Cell]
    culprit: bool = False
    note: str = ""

    @property
    def label(self) -> str:
        return ranges(self.ranks)


@dataclass
class Panel:
    """One process group's slice of the matrix."""

    pg: str
    label: str
    members: int
    seqs: list[int]
    rows: list[Row]
    role: str  # root | cascade | ok
    divergent_seq: int | None = None
    title: str = ""

    @property
    def divergent_col(self) -> int | None:
        return self.seqs.index(self.divergent_seq) if self.divergent_seq in self.seqs else None


@dataclass
class Matrix:
    panels: list[Panel] = field(default_factory=list)
    legend: dict[str, str] = field(default_factory=dict)  # symbol -> signature text
    hidden_groups: int = 0


class _Symbols:
    def __init__(self, ds: DumpSet, legend: dict[str, str]):
        self.ds, self.legend, self.of = ds, legend, {}

    def __call__(self, sid: int) -> str:
        sym = self.of.get(sid)
        if sym is None:
            sym = SYMBOLS[len(self.of)] if len(self.of) < len(SYMBOLS) else "#"
            self.of[sid] = sym
            sig = self.ds.sigs.get(sid)
            text = clean(sig.describe(), 120) if sig else "?"
            self.legend[sym] = text if sym not in self.legend else self.legend[sym] + " | " + text
        return sym


def _columns(an: Analysis, g: Group, div: int | None, before: int, after: int) -> list[int]:
    lo, hi = an.windows.get(g.name, (None, None))
    top = max(g.reach.values()) if g.reach else None
    if top is not None:
        hi = top if hi is None else max(hi, top)
    if hi is None:
        return []
    if lo is None:
        lo = hi
    if div is None:
        div = hi
    start = max(min(lo, div), div - before)
    end = min(hi, div + after) if div <= hi else div
    return list(range(start, end + 1))


def _panel(ds: DumpSet, an: Analysis, g: Group, findings: list[Finding], role: str, sym: _Symbols, before: int, after: int) -> Panel:
    div = min((f.seq for f in findings), default=None)
    seqs = _columns(an, g, div, before, after)
    culprit_cells = {(f.rank, f.seq) for f in findings if f.rank is not None}
    for f in findings:
        for r in f.behind:
            culprit_cells.add((r, f.seq))
    culprit_ranks = {r for r, _ in culprit_cells}
    folded: dict[tuple, Row] = {}
    for r in g.members:
        tr = ds.traces.get(r)
        cells = []
        note = ""
        if tr is None:
            note = "no dump"
            cells = [Cell(NO_DUMP) for _ in seqs]
        else:
            st = tr.streams.get(g.name)
            reach = g.reach.get(r, -1)
            for s in seqs:
                sid = st.sig(s) if st else NO_SIG
                if sid != NO_SIG:
                    i = s - st.lo
                    cells.append(Cell(sym(sid), pending=bool(st.pending[i])))
                elif s > reach:
                    cells.append(Cell(NOT_REACHED))
                else:
                    cells.append(Cell(NO_DATA))
            for c, s in zip(cells, seqs):
                if (r, s) in culprit_cells:
                    c.culprit = True
        key = (tuple((c.sym, c.culprit) for c in cells), note, r in culprit_ranks)
        row = folded.get(key)
        if row is None:
            folded[key] = Row(ranks=[r], cells=cells, culprit=r in culprit_ranks, note=note)
        else:
            row.ranks.append(r)
    rows = sorted(folded.values(), key=lambda row: row.ranks[0])
    return Panel(pg=g.name, label=clean(g.label, 100), members=len(g.members), seqs=seqs, rows=rows, role=role, divergent_seq=div)


def build_matrix(ds: DumpSet, an: Analysis, all_groups: bool = False, before: int = 8, after: int = 3, max_panels: int = 48) -> Matrix:
    """Panels for the groups with findings (roots first); ``all_groups`` adds healthy ones."""
    m = Matrix()
    sym = _Symbols(ds, m.legend)
    by_pg: dict[str, tuple[str, list[Finding]]] = {}
    for f in an.roots:
        by_pg.setdefault(f.pg, ("root", []))[1].append(f)
    for f in an.cascades:
        by_pg.setdefault(f.pg, ("cascade", []))[1].append(f)
    names = list(by_pg)
    if all_groups:
        names += [n for n in sorted(an.groups, key=order_key) if n not in by_pg]
    for name in names:
        if len(m.panels) >= max_panels:
            m.hidden_groups += 1
            continue
        role, fs = by_pg.get(name, ("ok", []))
        p = _panel(ds, an, an.groups[name], fs, role, sym, before, after)
        if fs:
            f = fs[0]
            p.title = {"root": "root cause", "cascade": "downstream"}[role] + f": {f.kind.replace('_', ' ')} at #{p.divergent_seq}"
        m.panels.append(p)
    if not all_groups:
        m.hidden_groups += len([n for n in an.groups if n not in by_pg])
    return m


# -- terminal -------------------------------------------------------------------------

_PALETTE = [44, 42, 43, 45, 46, 47, 104, 102, 103, 105, 106, 100]


def _ansi(text: str, *codes: int) -> str:
    return f"\x1b[{';'.join(map(str, codes))}m{text}\x1b[0m"


def render_text(m: Matrix, color: bool = False) -> str:
    """The matrix for a terminal: ANSI colours only when ``color`` (stdout is a tty)."""
    if not m.panels:
        return "No divergence: every process group agrees on every collective in the dumps.\n"
    colors = {s: _PALETTE[i % len(_PALETTE)] for i, s in enumerate(m.legend)}
    out: list[str] = []
    for p in m.panels:
        head = f"PG {p.label}, {p.members} rank{'s' if p.members != 1 else ''}"
        if p.title:
            head += f": {p.title}"
        out.append(_ansi(head, 1) if color else head)
        if not p.seqs:
            out.append("  (no collectives recorded)")
            continue
        w = max(max(len(str(s)) for s in p.seqs), 2) + 1  # column width
        lw = max(len("ranks"), *(len(r.label) + (2 if r.culprit else 0) for r in p.rows))
        lw = min(lw, 40)
        col = p.divergent_col
        if col is not None:
            marker = "".join(("v" if i == col else " ").center(w) for i in range(len(p.seqs)))
            out.append(" " * (lw + 3) + (_ansi(marker, 1, 31) if color else marker))
        out.append(f" {'ranks'.ljust(lw)} |" + "".join(str(s).center(w) for s in p.seqs))
        for row in p.rows:
            label = (("> " if row.culprit else "") + row.label)
            if len(label) > lw:
                label = label[: lw - 1] + "…"
            cells = []
            for c in row.cells:
                text = (c.sym + ("!" if c.culprit and not color else "")).center(w)
                if color and c.sym in colors:
                    text = _ansi(text, 30, colors[c.sym], *((1, 4) if c.culprit else ()))
                elif color and c.culprit:
                    text = _ansi(text, 1, 41)
                cells.append(text)
            line = f" {label.ljust(lw)} |" + "".join(cells)
            if row.note:
                line += f"  ({row.note})"
            out.append(line)
        out.append("")
    out.append("legend:")
    for s, text in m.legend.items():
        sample = _ansi(f" {s} ", 30, colors[s]) if color else s
        out.append(f"  {sample} = {text}")
    out.append(f"  {NOT_REACHED} = not reached   {NO_DUMP} = no dump   blank = not in the dump's window   "
               + ("underlined = culprit" if color else "! = culprit") + "   v = first divergence")
    if m.hidden_groups:
        out.append(f"({m.hidden_groups} more group{'s' if m.hidden_groups != 1 else ''} without findings; --all shows them)")
    return "\n".join(out) + "\n"
