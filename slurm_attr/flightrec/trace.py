"""From one loaded dump (plain data from safepickle or JSON) to a validated ``RankTrace``.

Only the known schema is walked (research/flight-recorder.md §2), every value is
type-checked, and anything else is counted as a bad entry: a memo DAG or a
self-referencing list in a hostile dump is never traversed beyond the two
levels a size list has. ``pg_config`` rank lists are parsed with a strict regex
(never eval, never literal_eval).
"""
from __future__ import annotations

import hashlib
import re
from array import array
from operator import itemgetter
from typing import Any

from .types import NO_SIG, P2PStream, PgStatus, RankTrace, Sig, Stream

MAX_TENSORS = 4096  # tensors per collective (coalesced ops carry many)
MAX_DIMS = 32
MAX_NAME = 512
MAX_RANKS_TEXT = 4 << 20  # "[0, 1, ..., 99999]" is ~0.6 MiB
_RANKS = re.compile(r"\[(?:\d{1,9}(?:, ?\d{1,9})*)?\]")
# ranks text -> (members, key); every rank of a 4096-rank job repeats the same 24 KB world list
_MEMBERS_CACHE: dict[str, tuple[tuple[int, ...], str] | None] = {}
# (text, value) of the latest _parse calls, newest last: see there. A dump holds a few groups
# (world, tensor-parallel, data-parallel...), so the last one alone missed every other call.
_RECENT: list[tuple[str, Any]] = []
_RECENT_MAX = 8


def parse_ranks(text: Any) -> tuple[int, ...] | None:
    """``'[0, 1, 2]'`` -> (0, 1, 2); None for anything else (also a list of non-ints)."""
    got = _parse(text)
    return got[0] if got is not None else None


def _parse(text: Any) -> tuple[tuple[int, ...], str] | None:
    if isinstance(text, list):
        if len(text) <= 1 << 20 and all(type(r) is int and 0 <= r < 1 << 30 for r in text):
            members = tuple(sorted(set(text)))
            return members, members_key(members)
        return None
    if not isinstance(text, str) or len(text) > MAX_RANKS_TEXT:
        return None
    for seen, value in reversed(_RECENT):
        # Every dump of a job repeats its groups' rank lists (the world's ~220 KB at 32,768
        # ranks), each a new str: == is a length check then a memcmp, where the dict lookup
        # hashes the whole text.
        if text == seen:
            return value
    if text in _MEMBERS_CACHE:
        value = _MEMBERS_CACHE[text]
        _remember(text, value)
        return value
    value = None
    if _RANKS.fullmatch(text):
        body = text[1:-1]
        members = tuple(sorted({int(x) for x in body.split(",")})) if body else ()
        value = (members, members_key(members))
    if len(_MEMBERS_CACHE) > 4096:
        _MEMBERS_CACHE.clear()
    _MEMBERS_CACHE[text] = value
    _remember(text, value)
    return value


def _remember(text: str, value: Any) -> None:
    if len(_RECENT) >= _RECENT_MAX:
        del _RECENT[0]
    _RECENT.append((text, value))


def members_key(members: tuple[int, ...]) -> str:
    """A short stable name for a member list, so thousands of traces need not carry it."""
    h = hashlib.blake2b(repr(members).encode(), digest_size=12).hexdigest()
    return f"m{len(members)}-{h}"


def _dims(s: Any) -> tuple[int, ...]:
    if (type(s) is not list and type(s) is not tuple) or len(s) > MAX_DIMS:
        raise ValueError("bad size")
    for d in s:
        if type(d) is not int:
            raise ValueError("bad size")
    return tuple(s)


def _sizes(v: Any) -> tuple[tuple[int, ...], ...]:
    """[[4096, 1024]] -> ((4096, 1024),), checked to be exactly two levels of ints."""
    if type(v) is list and len(v) == 1:  # the common case: one tensor
        s = v[0]
        if type(s) is list and len(s) <= MAX_DIMS:
            for d in s:
                if type(d) is not int:
                    raise ValueError("bad size")
            return (tuple(s),)
    if (type(v) is not list and type(v) is not tuple) or len(v) > MAX_TENSORS:
        raise ValueError("bad sizes")
    return tuple([_dims(s) for s in v])


def _dtypes(v: Any) -> tuple[str, ...]:
    if (type(v) is not list and type(v) is not tuple) or len(v) > MAX_TENSORS:
        raise ValueError("bad dtypes")
    for d in v:
        if type(d) is not str or len(d) > 64:
            raise ValueError("bad dtype")
    return tuple(v)


def _int(v: Any, default: int = -1) -> int:
    if type(v) is int:
        return v
    if isinstance(v, str) and v.lstrip("-").isdigit() and len(v) < 20:
        return int(v)
    return default


def sig_id(sig: Sig) -> int:
    """A stable 63-bit id of a compare-key signature (same in every process)."""
    d = hashlib.blake2b(repr(tuple(sig)).encode(), digest_size=8).digest()
    return (int.from_bytes(d, "little") >> 1) or 1


class SigTable:
    """Interns signatures: raw (profiling name, sizes, dtypes) -> compare-key id."""

    def __init__(self) -> None:
        self._ids: dict[tuple[Any, ...], int] = {}
        self.sigs: dict[int, Sig] = {}

    def intern(self, key: tuple[Any, ...]) -> int:
        sid = self._ids.get(key)
        if sid is None:
            ck = Sig(*key).compare_key()
            sid = sig_id(ck)
            self.sigs.setdefault(sid, ck)
            self._ids[key] = sid
        return sid

    def combine(self, a: int, b: int) -> int:
        """Several entries with one seq id (coalesced ops): one combined signature."""
        sa, sb = self.sigs[a], self.sigs[b]
        key = (
            "coalesced:" + "+".join(dict.fromkeys([sa.op, sb.op])),
            sa.input_sizes + sb.input_sizes,
            sa.output_sizes + sb.output_sizes,
            sa.input_dtypes + sb.input_dtypes,
            sa.output_dtypes + sb.output_dtypes,
        )
        return self.intern(key)


def _text(v: Any, cap: int = MAX_NAME) -> str:
    return v[:cap] if isinstance(v, str) else ""


def digest(
    data: Any,
    rank: int,
    path: str,
    node: str | None,
    fmt: str,
    table: SigTable,
    members: dict[str, tuple[int, ...]],
    history_truncated: bool = False,
    head_entries: list[Any] | None = None,
) -> RankTrace:
    """Validate a dump's plain data into a RankTrace; fills ``table`` and ``members``."""
    tr = RankTrace(rank=rank, path=path, node=node, fmt=fmt, history_truncated=history_truncated)
    if not isinstance(data, dict):
        tr.bad_entries = 1
        return tr
    tr.version = _text(data.get("version"), 32)
    _pg_config(tr, data.get("pg_config"), members)
    entries = data.get("entries")
    if not isinstance(entries, list):
        entries = []
    # Old entries outside the tail only name local pg ids (for pg_status).
    for e in head_entries or ():
        if type(e) is dict:
            pg, pid = e.get("process_group"), e.get("pg_id")
            if isinstance(pg, (list, tuple)) and len(pg) == 2 and type(pid) is int and isinstance(pg[0], str):
                tr.pg_ids.setdefault(pid, pg[0][:MAX_NAME])
    _entries(tr, entries, table)
    _pg_status(tr, data.get("pg_status"))
    return tr


def _pg_config(tr: RankTrace, cfg: Any, members: dict[str, tuple[int, ...]]) -> None:
    if not isinstance(cfg, dict):
        tr.pg_config_broken = True
        return
    for name, info in list(cfg.items())[:100_000]:
        if not isinstance(name, str) or not isinstance(info, dict):
            continue
        parsed = _parse(info.get("ranks"))
        if name == "":
            # Stock torch 2.13 Gloo: every group overwrites key '' (research §4); its
            # ranks are those of some group (real ranks), not of a group we can name.
            tr.pg_config_broken = True
            if parsed and parsed[0]:
                tr.stray_ranks = parsed[1]
                members.setdefault(parsed[1], parsed[0])
            continue
        key = None
        if parsed is not None:
            key = parsed[1]
            members.setdefault(key, parsed[0])
        elif len(tr.bad_pg_config) < 16:
            tr.bad_pg_config.append(name[:80])
        tr.pg_config[name[:MAX_NAME]] = (_text(info.get("desc")), key)


def _pg_status(tr: RankTrace, status: Any) -> None:
    if not isinstance(status, dict):
        return
    for k, v in list(status.items())[:100_000]:
        pid = _int(k)
        if pid < 0 or not isinstance(v, dict):
            continue
        st = PgStatus(_int(v.get("last_enqueued_collective")), _int(v.get("last_completed_collective")))
        name = tr.pg_ids.get(pid)
        if name is None:
            tr.unmapped_status[pid] = st
        else:
            tr.pg_status[name] = st


_REQUIRED = itemgetter("process_group", "collective_seq_id", "profiling_name", "input_sizes", "output_sizes",
                       "input_dtypes", "output_dtypes")
_ALL = itemgetter("process_group", "collective_seq_id", "profiling_name", "input_sizes", "output_sizes",
                  "input_dtypes", "output_dtypes", "pg_id", "is_p2p", "p2p_seq_id", "time_created_ns", "state", "retired")


def _fields(e: dict[str, Any]) -> tuple[Any, ...]:
    """The 13 fields an entry is read for; optional ones default when an older torch left them out."""
    try:
        return _ALL(e)
    except KeyError:
        return (*_REQUIRED(e), e.get("pg_id"), e.get("is_p2p"), e.get("p2p_seq_id"), e.get("time_created_ns"),
                e.get("state"), e.get("retired"))


def _entries(tr: RankTrace, entries: list[Any], table: SigTable) -> None:
    # The hot loop of the whole analysis (millions of entries on large jobs): one
    # C-level itemgetter per entry, validation before anything is hashed (a hostile
    # size "list" could be a memo DAG), and outputs compared to inputs before being
    # validated again (all_reduce: the same sizes).
    per_pg: dict[str, list[tuple[int, int, int, int, bool, bool]]] = {}
    p2p: dict[str, list[tuple[int, int]]] = {}
    bad = 0
    newest: str | None = None  # the group of the newest collective entry (its row is the last in per_pg[newest])
    ids = table._ids
    intern = table.intern
    pg_ids, descs = tr.pg_ids, tr.descs
    # (group, op) -> the raw sizes/dtypes of its previous entry, already validated, and their
    # signature id: a training loop repeats itself, so most entries equal their predecessor
    # and skip validation and hashing. Comparing a hostile value with a validated one is
    # bounded by the validated one's size.
    last: dict[tuple[str, str], tuple[Any, Any, Any, Any, int]] = {}
    for pos, e in enumerate(entries):
        if type(e) is not dict:
            bad += 1
            continue
        try:
            try:  # _fields inline: a call per entry is a tenth of this loop
                pg, seq, pn, ins, outs, idt, odt, pid, is_p2p, pseq, t, state, retired = _ALL(e)
            except KeyError:
                pg, seq, pn, ins, outs, idt, odt, pid, is_p2p, pseq, t, state, retired = _fields(e)
            name, desc = pg
            if type(name) is not str or type(desc) is not str or type(seq) is not int or type(pn) is not str:
                raise TypeError
            if len(name) > MAX_NAME or len(pn) > MAX_NAME or not 0 <= seq < 1 << 62:
                raise ValueError
            prev = last.get((name, pn))
            if prev is not None and ins == prev[0] and outs == prev[1] and idt == prev[2] and odt == prev[3]:
                sid = prev[4]
            else:
                ins_t = _sizes(ins)
                outs_t = ins_t if outs == ins else _sizes(outs)
                idt_t = _dtypes(idt)
                odt_t = idt_t if odt == idt else _dtypes(odt)
                key = (pn, ins_t, outs_t, idt_t, odt_t)
                sid = ids.get(key)
                if sid is None:
                    sid = intern(key)
                last[(name, pn)] = (ins, outs, idt, odt, sid)
        except (KeyError, TypeError, ValueError, IndexError):
            bad += 1
            continue
        if type(pid) is int and pid not in pg_ids:
            pg_ids[pid] = name
        if name not in descs:
            descs[name] = desc[:MAX_NAME]
        if is_p2p is True:
            if type(pseq) is int and 0 <= pseq < 1 << 62:
                p2p.setdefault(name, []).append((pseq, sid))
            continue
        acc = per_pg.get(name)
        if acc is None:
            acc = per_pg[name] = []
        done = state == "completed"
        # one row per entry, split into columns once at the end (one append, not six)
        acc.append((seq, sid, pos, t if type(t) is int and 0 <= t < 1 << 63 else 0, not done and retired is not True, done))
        newest = name
    tr.n_entries = len(entries)
    tr.bad_entries = bad
    tr.newest = (newest, per_pg[newest][-1][0]) if newest is not None else None
    for name, rows in per_pg.items():
        seqs, sids, poss, times, pend, done_ = zip(*rows)
        tr.streams[name] = _stream(list(seqs), list(sids), list(poss), list(times), bytearray(pend), bytearray(done_), table)
    for name, items in p2p.items():
        lo = min(s for s, _ in items)
        hi = max(s for s, _ in items)
        if hi - lo > 4 * len(items) + 64:
            lo = hi - 4 * len(items) - 64
        ps = P2PStream(lo=lo, sigs=array("q", [NO_SIG]) * (hi - lo + 1))
        for s, sid in items:
            if s >= lo:
                ps.sigs[s - lo] = sid
        tr.p2p[name] = ps


def _stream(seqs: list[int], sids: list[int], poss: list[int], times: list[int], pend: bytearray, done: bytearray,
            table: SigTable) -> Stream:
    lo, hi = seqs[0], seqs[-1]
    if hi - lo + 1 == len(seqs) and (len(seqs) < 2 or all(b - a == 1 for a, b in zip(seqs, seqs[1:]))):
        # The common case: one entry per seq, in order.
        return Stream(lo=lo, sigs=array("q", sids), pos=array("l", poss), times=array("q", times), pending=pend, completed=done)
    lo, hi = min(seqs), max(seqs)
    if hi - lo > 4 * len(seqs) + 64:
        # Wild seq ids (hostile or corrupt): keep the newest plausible window, bounded.
        lo = hi - 4 * len(seqs) - 64
    n = hi - lo + 1
    st = Stream(lo=lo, sigs=array("q", [NO_SIG]) * n, pos=array("l", [-1]) * n, times=array("q", [0]) * n,
                pending=bytearray(n), completed=bytearray(n))
    for seq, sid, p, t, pd, dn in zip(seqs, sids, poss, times, pend, done):
        i = seq - lo
        if i < 0:
            continue
        if st.sigs[i] != NO_SIG and st.sigs[i] != sid:
            sid = table.combine(st.sigs[i], sid)
        st.sigs[i], st.pos[i], st.times[i], st.pending[i], st.completed[i] = sid, p, t, pd, dn
    return st
