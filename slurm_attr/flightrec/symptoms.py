"""Findings into the verdict's language: Symptoms (untrusted, naming ranks) and Coverage.

Flight Recorder evidence is written by the job (DESIGN.md §5): every symptom
here is ``trusted=False`` with action ``none``; it can point at ranks and nodes
but never drain one. Text that came from a dump (group descriptions, file and
function names) is stripped of control characters before it reaches a
terminal, a job comment or HTML.
"""
from __future__ import annotations

import re
from typing import Any

from .. import jobtext
from ..model import Coverage, Evidence, Symptom
from . import NO_DUMPS
from .divergences import Analysis, Finding
from .groups import Group, order_key
from .loader import DumpSet, load_entry
from .types import Sig

IDS = {
    "skip": ("fr.collective_mismatch", "collective_mismatch", 60),
    "op": ("fr.collective_mismatch", "collective_mismatch", 60),
    "size": ("fr.collective_mismatch", "collective_mismatch", 60),
    "dtype": ("fr.collective_mismatch", "collective_mismatch", 60),
    "order": ("fr.collective_mismatch", "collective_mismatch", 58),
    "not_reached": ("fr.rank_stuck", "rank_stuck", 55),
    "hang": ("fr.comm_hang", "comm_hang", 45),
}
DOWNSTREAM = ("fr.downstream_hang", 10)
MAX_LIST = 64
MAX_MEMBERS = 4096  # beyond this the list is cut (members_text and member_count stay exact)
MAX_FRAMES = 32
_CTRL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def clean(text: Any, cap: int = 200) -> str:
    """Printable text from a job-written string (no escapes, no newlines, bounded)."""
    s = _CTRL.sub("?", str(text))
    return s if len(s) <= cap else s[: cap - 1] + "…"


def ranges(ranks: Any) -> str:
    """[0,1,2,5] -> '0-2,5' (how Slurm admins read rank lists)."""
    rs = sorted(set(ranks))
    out, i = [], 0
    while i < len(rs):
        j = i
        while j + 1 < len(rs) and rs[j + 1] == rs[j] + 1:
            j += 1
        out.append(str(rs[i]) if i == j else f"{rs[i]}-{rs[j]}")
        i = j + 1
    return ",".join(out)


def _capped(ranks: Any) -> list[int]:
    return sorted(set(ranks))[:MAX_LIST]


def _frames(entry: dict[str, Any] | None) -> list[str]:
    frames = entry.get("frames") if isinstance(entry, dict) else None
    out: list[str] = []
    if not isinstance(frames, list):
        return out
    for fr in frames[:MAX_FRAMES]:
        if not isinstance(fr, dict):
            continue
        line = fr.get("line")
        out.append(f"{clean(fr.get('filename', '?'), 160)}:{line if type(line) is int else '?'} {clean(fr.get('name', '?'), 80)}")
    return out


def first_difference(culprit: list[str], majority: list[str]) -> dict[str, Any] | None:
    """The outermost frame where two stacks (innermost first, as torch lists them) part."""
    if not culprit or not majority:
        return None
    a, b = culprit[::-1], majority[::-1]
    for depth, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return {"culprit": x, "majority": y, "depth_from_outermost": depth}
    if len(a) != len(b):
        depth = min(len(a), len(b))
        return {"culprit": a[depth] if depth < len(a) else None, "majority": b[depth] if depth < len(b) else None, "depth_from_outermost": depth}
    return None


def _entry_sig(entry: dict[str, Any] | None) -> dict[str, Any]:
    if not isinstance(entry, dict):
        return {}
    def sizes(v: Any) -> Any:
        return [[d for d in s if type(d) is int][:32] for s in v[:64] if isinstance(s, list)] if isinstance(v, list) else None
    def dtypes(v: Any) -> Any:
        return [clean(d, 32) for d in v[:64]] if isinstance(v, list) else None
    pn = clean(entry.get("profiling_name", ""), 80)
    return {"op": pn.split(":", 1)[-1], "profiling_name": pn, "input_sizes": sizes(entry.get("input_sizes")),
            "output_sizes": sizes(entry.get("output_sizes")), "dtypes": dtypes(entry.get("input_dtypes")),
            "output_dtypes": dtypes(entry.get("output_dtypes"))}


def _sig_fields(prefix: str, sig: Sig | None, entry: dict[str, Any] | None) -> dict[str, Any]:
    """op/sizes/dtypes from the entry itself when read (exact sizes), else the interned signature."""
    got = _entry_sig(entry)
    if not got and sig is not None:
        got = {"op": clean(sig.op, 80), "profiling_name": clean(sig.profiling_name, 80), "input_sizes": [list(s) for s in sig.input_sizes],
               "output_sizes": [list(s) for s in sig.output_sizes], "dtypes": [clean(d, 32) for d in sig.input_dtypes],
               "output_dtypes": [clean(d, 32) for d in sig.output_dtypes]}
    return {f"{prefix}_{k}": v for k, v in got.items()}


def _op(d: dict[str, Any], key: str) -> str:
    """A collective's name from a dump (the job's): bare when a plain token, else quoted."""
    op = d.get(key)
    return jobtext.quote(op, 80) if op else "?"


def _describe(d: dict[str, Any], prefix: str) -> str:
    op = _op(d, f"{prefix}_op")
    sizes = d.get(f"{prefix}_input_sizes")
    dt = [jobtext.quote(x, 32) for x in dict.fromkeys(d.get(f"{prefix}_dtypes") or [])]
    stext = ",".join("x".join(map(str, s)) for s in sizes) if sizes is not None else "?"
    return f"{op} [{stext}] {','.join(dt)}".strip()


class _Builder:
    """Turns one analysis into symptoms; reads the few full entries it shows."""

    def __init__(self, ds: DumpSet, an: Analysis, read_stacks: bool = True):
        self.ds, self.an, self.read_stacks = ds, an, read_stacks
        self._entries: dict[tuple[int, str, int | None], dict[str, Any] | None] = {}

    def entry(self, rank: int | None, pg: str, seq: int | None) -> dict[str, Any] | None:
        if rank is None or not self.read_stacks or rank not in self.ds.traces:
            return None
        key = (rank, pg, seq)
        if key not in self._entries:
            self._entries[key] = load_entry(self.ds, rank, pg, seq)
        return self._entries[key]

    def group_fields(self, g: Group, f: Finding) -> dict[str, Any]:
        missing = [r for r in g.members if r not in self.ds.traces]
        tr_any = next((self.ds.traces[r] for r in g.members if r in self.ds.traces), None)
        return {
            "kind": f.kind,
            "pg": clean(g.name, 80),
            "pg_desc": clean(g.desc, 80),
            "members": list(g.members[:MAX_MEMBERS]),
            "member_count": len(g.members),
            "members_text": ranges(g.members),
            "members_from": g.members_from,
            "collective_seq_id": f.seq,
            "ranks_without_dump": _capped(missing),
            "pg_config": "broken (stock Gloo); members from entries" if tr_any is not None and tr_any.pg_config_broken and g.members_from != "pg_config" else "ok",
            "confidence": f.confidence,
            "ambiguous": f.ambiguous,
        }

    def symptom(self, f: Finding) -> Symptom:
        ds, g = self.ds, self.an.groups[f.pg]
        sid, cause, prio = IDS[f.kind]
        fields = self.group_fields(g, f)
        maj_rank = next((r for r in (*f.waiting, *f.majority_ranks) if r != f.rank), None)
        maj_entry = self.entry(maj_rank, f.pg, f.seq)
        fields.update(_sig_fields("majority", ds.sigs.get(f.majority_sig) if f.majority_sig else None, maj_entry))
        fields["majority_ranks"] = _capped(f.majority_ranks)
        fields["majority_rank_count"] = len(f.majority_ranks)
        fields["waiting_ranks"] = _capped(f.waiting)
        evidence: list[Evidence] = []
        cul_entry = None
        if f.kind in ("skip", "op", "size", "dtype"):
            cul_entry = self.entry(f.rank, f.pg, f.seq)
            fields.update(_sig_fields("culprit", ds.sigs.get(f.sig) if f.sig else None, cul_entry))
            seen = f"{_describe(fields, 'culprit')} at PG {g.name} #{f.seq}"
        elif f.rank is not None and f.rank in ds.traces:
            tr = ds.traces[f.rank]
            fields["culprit_entries"] = tr.n_entries
            fields["culprit_last_collective"] = None
            seen = "no collective recorded"
            if tr.newest is not None:
                cul_entry = self.entry(f.rank, tr.newest[0], tr.newest[1])
                last = {"pg": clean(tr.newest[0], 80), "collective_seq_id": tr.newest[1], **_entry_sig(cul_entry)}
                fields["culprit_last_collective"] = last
                seen = f"last collective PG {last['pg']} #{tr.newest[1]} {last.get('op', '')}".rstrip()
        else:
            seen = "no dump"
        fields["culprit_stack"] = _frames(cul_entry)
        fields["majority_stack"] = _frames(maj_entry)
        fields["first_differing_frame"] = first_difference(fields["culprit_stack"], fields["majority_stack"])
        if f.also:
            fields["also_missing_in"] = [{"pg": clean(pg, 80), "collective_seq_id": seq} for pg, seq in f.also[:MAX_LIST]]
        if f.no_dump:
            fields["no_dump"] = True
            fields["culprit_evidence"] = "no dump: the rank left no Flight Recorder file (crashed, killed, or stuck outside the collective)"
            if f.membership_inferred:
                fields["membership"] = "inferred: the dumps do not list this group's members; the rank is one without a dump"
        if f.tied_with:
            fields["tied_with"] = _capped(f.tied_with)
        if f.tie_break:
            fields["tie_break"] = f.tie_break
        if f.abstained:
            fields["abstained_ranks"] = _capped(f.abstained)
        if f.first_compared:
            fields["first_compared"] = True
        if f.kind == "order" and f.blocked_in:
            pg, seq = next(iter(f.blocked_in.values()))
            fields["waits_in"] = {"pg": clean(pg, 80), "collective_seq_id": seq}
        if f.rank is not None and f.rank in ds.traces:
            tr = ds.traces[f.rank]
            fields["history"] = "newest entries only" if tr.history_truncated else "full"
            evidence.append(Evidence(source="fr", path=tr.path, text=clean(f"rank {f.rank}: {seen}", 300)))
        elif f.no_dump and f.rank is not None:
            node = ds.node_of(f.rank)
            where = f" (node {clean(node, 80)})" if node else ""
            evidence.append(Evidence(source="fr", path=None, text=clean(f"rank {f.rank}{where}: no Flight Recorder dump", 300)))
        if maj_rank is not None and maj_rank in ds.traces:
            evidence.append(Evidence(source="fr", path=ds.traces[maj_rank].path, text=clean(f"rank {maj_rank} (majority): {_describe(fields, 'majority')} at PG {g.name} #{f.seq}", 300)))
        return Symptom(
            id=sid, cause=cause, role="root", priority=prio, trusted=False, action="none",
            node=ds.node_of(f.rank), rank=f.rank, summary=clean(self.summary(f, g, fields), 400),
            fields=fields, evidence=evidence,
        )

    def summary(self, f: Finding, g: Group, d: dict[str, Any]) -> str:
        label = f"PG {g.label}"
        n = len([r for r in f.majority_ranks if r != f.rank])
        others = f"the other {n} rank{'s' if n != 1 else ''}"
        maj = _describe(d, "majority")
        # a divergence seen at the first collective its dump shares with the others may lie further back
        earlier = f"; #{f.seq} is the first collective its dump shares with another rank's, so it diverged at or before #{f.seq}" \
            if f.first_compared else ""
        if f.kind == "skip":
            return (f"rank {f.rank} skipped {maj} (collective #{f.seq} of {label}): it called {_describe(d, 'culprit')} there, "
                    f"which {others} call next{earlier}")
        if f.kind == "op":
            return (f"rank {f.rank} called {_op(d, 'culprit_op')} where {others} of {label} called "
                    f"{_op(d, 'majority_op')} (collective #{f.seq}){earlier}")
        if f.kind in ("size", "dtype"):
            return f"rank {f.rank} passed {_describe(d, 'culprit')} where {others} of {label} passed {maj} (collective #{f.seq}){earlier}"
        if f.kind == "order":
            w = d.get("waits_in")
            there = f"waits in PG {w['pg']} #{w['collective_seq_id']}" if w else "waits in another group"
            return (f"rank {f.rank} {there} while {label} waits for it at collective #{f.seq}: it issued collectives in a different "
                    f"order than {'the other ranks' if not f.ambiguous else 'rank(s) ' + ranges(f.tied_with)}")
        if f.kind == "hang":
            return f"all {len(f.waiting)} ranks of {label} entered collective #{f.seq} ({maj}) and none completed it"
        if f.no_dump:
            return f"rank {f.rank} left no Flight Recorder dump while {others} of {label} wait in collective #{f.seq} ({maj})"
        waiting = ranges(f.waiting)
        return f"rank {f.rank} never reached collective #{f.seq} ({maj}) of {label}; rank{'s' if len(f.waiting) != 1 else ''} {waiting} wait in it"

    def downstream(self, f: Finding) -> Symptom:
        ds, g = self.ds, self.an.groups[f.pg]
        fields = self.group_fields(g, f)
        fields.update(_sig_fields("majority", ds.sigs.get(f.majority_sig) if f.majority_sig else None, None))
        fields["behind_ranks"] = _capped(f.behind)
        fields["waiting_ranks"] = _capped(f.waiting)
        fields["blocked_in"] = {str(r): {"pg": clean(pg, 80), "collective_seq_id": s} for r, (pg, s) in list(f.blocked_in.items())[:MAX_LIST]}
        fields["root_ranks"] = list(f.blocked_by)
        # A downstream hang is about a group, not one rank: its ranks are victims, listed in
        # behind_ranks/behind_nodes, and the symptom names no rank or node of its own (a
        # verdict must not count them as culprits).
        fields["behind_nodes"] = sorted({n for n in (ds.node_of(r) for r in f.behind[:MAX_LIST]) if n})
        where = sorted({f"PG {self.an.groups[pg].label if pg in self.an.groups else pg} #{s}" for pg, s in f.blocked_in.values()})
        if f.kind == "hang":
            text = f"PG {g.label} also hangs at collective #{f.seq} (all {len(f.waiting)} ranks entered it)"
        else:
            text = (f"PG {g.label}: rank{'s' if len(f.behind) != 1 else ''} {ranges(f.behind)} did not reach collective #{f.seq}; "
                    f"{'they wait' if len(f.behind) != 1 else 'it waits'} in {', '.join(where[:3])}")
            if f.blocked_by:
                text += f" (downstream of rank{'s' if len(f.blocked_by) != 1 else ''} {ranges(f.blocked_by)})"
        evidence = [Evidence(source="fr", path=ds.traces[r].path, text=clean(f"rank {r} behind in PG {g.name}", 200)) for r in f.behind[:3] if r in ds.traces]
        return Symptom(id=DOWNSTREAM[0], cause=IDS[f.kind][1] if f.kind == "hang" else "rank_stuck", role="cascade", priority=DOWNSTREAM[1],
                       trusted=False, action="none", node=None, rank=None, summary=clean(text, 400), fields=fields, evidence=evidence)


def to_symptoms(ds: DumpSet, an: Analysis, read_stacks: bool = True) -> list[Symptom]:
    """Root symptoms (one per culprit rank), then one cascade symptom per downstream group."""
    b = _Builder(ds, an, read_stacks)
    out = [b.symptom(f) for f in an.roots]
    out.extend(b.downstream(f) for f in an.cascades)
    for s in out[len(an.roots):]:
        # A downstream hang inherits the cause of the root it waits on, when there is one.
        roots = [r for r in out[: len(an.roots)] if r.rank in s.fields.get("root_ranks", ())]
        if roots:
            s.cause = roots[0].cause
    for f in an.context:
        s = b.symptom(f)
        s.role, s.priority = "context", 5
        s.summary = clean(f"rank {f.rank} left no Flight Recorder dump; the last collective of the other member(s) of PG "
                          f"{an.groups[f.pg].label} was #{f.seq}, and their dumps do not say whether it ended or failed", 400)
        out.append(s)
    return out


def coverage(ds: DumpSet, world: set[int]) -> list[Coverage]:
    """What the dumps delivered: per node ok/error/truncated, and ranks with no dump."""
    out: list[Coverage] = []
    if not ds.files and not ds.problems:
        if ds.ignored_files:
            return [Coverage(source="fr", node=None, status="error",
                             detail=f"{ds.ignored_files} file(s) where dumps belong, none named <prefix><rank> as torch names dumps")]
        return [Coverage(source="fr", node=None, status="missing", detail=NO_DUMPS)]
    by_node: dict[str | None, list[int]] = {}
    for r, tr in ds.traces.items():
        by_node.setdefault(tr.node, []).append(r)
    for node, ranks in sorted(by_node.items(), key=lambda kv: (kv[0] is None, kv[0] or "")):
        trs = [ds.traces[r] for r in ranks]
        notes = []
        if any(t.history_truncated for t in trs):
            notes.append(f"newest {ds.tail_entries} entries per rank compared")
        if any(t.pg_config_broken for t in trs):
            notes.append("pg_config broken (stock Gloo): group members taken from entries")
        bad = sum(t.bad_entries for t in trs)
        if bad:
            notes.append(f"{bad} malformed entries skipped")
        detail = f"{len(ranks)} dump{'s' if len(ranks) != 1 else ''} (ranks {ranges(ranks)})" + ("; " + "; ".join(notes) if notes else "")
        out.append(Coverage(source="fr", node=node, status="ok", detail=detail))
    for r, tr in sorted(ds.traces.items()):
        if tr.bad_pg_config:
            out.append(Coverage(source="fr", node=tr.node, status="error",
                                detail=clean(f"{tr.path}: pg_config ranks of group(s) {', '.join(tr.bad_pg_config)} are not a list of ranks; ignored", 400)))
    for p in ds.problems:
        out.append(Coverage(source="fr", node=p.node, status=p.status, detail=clean(f"{p.path}: {p.detail}", 400)))
    no_file = sorted(world - set(ds.files))
    if no_file:
        per: dict[str | None, list[int]] = {}
        for r in no_file:
            per.setdefault(ds.node_of(r), []).append(r)
        for node, ranks in sorted(per.items(), key=lambda kv: (kv[0] is None, kv[0] or "")):
            out.append(Coverage(source="fr", node=node, status="missing", detail=f"no dump for rank{'s' if len(ranks) != 1 else ''} {ranges(ranks)}"))
    return out


def window_coverage(ds: DumpSet, an: Analysis) -> list[Coverage]:
    """Where the ranks' dump windows differ at a divergence: who abstained from its vote (its ring buffer
    wrapped past it, or the dump ends before it), and whose divergence may lie before its own window."""
    abstained: dict[tuple[str, int], tuple[int, ...]] = {}
    unseen: dict[tuple[str, int, bool], list[int]] = {}
    for f in an.roots:
        if f.rank is None or f.kind not in ("skip", "op", "size", "dtype"):
            continue
        if f.abstained:
            abstained.setdefault((f.pg, f.seq), f.abstained)
        if f.first_compared:
            st = ds.traces[f.rank].streams.get(f.pg) if f.rank in ds.traces else None
            unseen.setdefault((f.pg, f.seq, st is not None and st.lo == f.seq), []).append(f.rank)
    out = []
    for (pg, seq), ranks in sorted(abstained.items(), key=lambda kv: (order_key(kv[0][0]), kv[0][1])):
        g = an.groups[pg]
        held = [r for r in g.members if r in ds.traces and r not in ranks]
        n = "s" if len(ranks) != 1 else ""
        text = (f"PG {g.label} #{seq}: rank{n} {ranges(ranks)} abstained, {'their dumps do' if n else 'its dump does'} not hold "
                f"#{seq} ({'their ring buffers' if n else 'its ring buffer'} wrapped past it, or the dump ends before it); "
                f"#{seq} is held by rank{'s' if len(held) != 1 else ''} {ranges(held)}")
        out.append(Coverage(source="fr", node=None, status="truncated", detail=clean(text, 400)))
    for (pg, seq, own), ranks in sorted(unseen.items(), key=lambda kv: (order_key(kv[0][0]), kv[0][1])):
        one = len(ranks) == 1
        who, it = (f"rank {ranges(ranks)}", "it") if one else (f"ranks {ranges(ranks)}", "they")
        if own:
            text = (f"PG {an.groups[pg].label} #{seq}: {who}'s dump{'' if one else 's'} begin{'s' if one else ''} at #{seq}, so {it} "
                    f"{'was' if one else 'were'} compared with no other rank before: {it} may have diverged earlier, where "
                    f"{'its ring buffer no longer reaches' if one else 'their ring buffers no longer reach'}")
        else:
            text = (f"PG {an.groups[pg].label} #{seq}: the other ranks' dumps begin at #{seq}, so {who} {'was' if one else 'were'} "
                    f"compared with no other rank before: {it} may have diverged earlier, where only "
                    f"{'its own dump reaches' if one else 'their own dumps reach'}")
        out.append(Coverage(source="fr", node=None, status="truncated", detail=clean(text, 400)))
    return out
