"""NCCL RAS status reports (``VERBOSE STATUS``) read into one small dict.

Built against the report as NCCL's ``src/ras/client_support.cc`` prints it (read at NVIDIA/nccl
commit 12df1a11, the 2.3x line) and as real reports quote it: 2.26.2 (NVIDIA/nccl#1911), 2.27.3
(#1762), 2.30.7 (NCCL's docs/examples/08_ras walkthrough), 2.24 (the RAS page of the user
guide). Two forms:

- **text** (every release since 2.24): "Job summary" (nodes, processes, GPUs), the
  communicator group table (``Group Comms Nodes ... Status Errors``), then per communicator
  ``#<group>-<index> (<16-hex commHash>) INCOMPLETE|ERROR|MISMATCH`` blocks naming ranks
  ("Rank 7 -- GPU 3 managed by process 1650386 on node node1"), and the job-wide
  ``INCOMPLETE`` (processes that did not answer) and ``DEAD`` (unreachable >= 60 s) blocks.
  Op counts are per collective type since 2.26.2 ("different AllReduce operation counts"),
  one counter before ("different collective operation counts").
- **json** (``SET FORMAT json``, 2.28.7+): every rank of every communicator with its
  ``collective_counts``, ``status`` (init_state, async_error, finalize/destroy/abort flags)
  and ``missing_ranks`` (``unresponsive``, ``considered_dead``).

The report comes from a socket any process on the node could answer, and NCCL's own output
has had bugs (#1762 printed rank 1057455228 of a 2-rank communicator): every number is
bounded, every list capped, a rank outside its communicator's size dropped, and anything
unreadable yields ``{"error": ...}``, never an exception.
"""
from __future__ import annotations

import re
from typing import Any, TypeVar

import msgspec

from ... import jsonshape
from . import rasshape

MAX_LINES = 20_000
MAX_LINE = 512
MAX_COMMS = 256
MAX_RANKS = 64  # ranks kept per list (the opinion names a few)
MAX_INT = rasshape.MAX_INT
IN_PROGRESS = 7  # ncclInProgress: not an error (ncclSuccess = 0)
T = TypeVar("T")

_NUM = r"(\d{1,18})"
# Group, Comms in group, Nodes per comm, Ranks per node ("3-4"), Ranks per comm, Ranks in group, Status, Errors
_GROUP_ROW = re.compile(rf"^\s*{_NUM}\s+{_NUM}\s+{_NUM}\s+(\d{{1,9}}(?:-\d{{1,9}})?)\s+{_NUM}\s+{_NUM}"
                        r"\s+([A-Z]+)\s+([A-Z,]+)\s*$")
_COMM = re.compile(r"^#(\d{1,6})-(\d{1,9}) \(([0-9a-fA-F]{1,16})\) (INCOMPLETE|ERROR|MISMATCH)\s*$")
_VERSION = re.compile(r"^NCCL version (\d+\.\d+\.\d+)")
_MISSING_PROCS = re.compile(r"^\s*Missing communicator data from (\d{1,9}) job process")
_DEAD_PROCS = re.compile(r"^\s*(\d{1,9}) job process(?:es)? (?:is|are) considered dead")
_PROCESS = re.compile(r"^\s*Process (\d{1,10}) on node (\S{1,255}) managing GPUs? (.{0,64}?)\s*$")
_MISSING_RANKS = re.compile(r"^\s*Missing communicator data from (\d{1,9}) ranks?\s*$")
_OLD_MISSING = re.compile(r"^\s*The missing ranks?: ([0-9, ]{1,400})$")  # 2.24's wording
_TIMEOUTS = re.compile(r"^\s*Encountered (\d{1,9}) communication timeouts?")
_OP_HEAD = re.compile(r"^\s*Communicator ranks have different (\w{1,32}) operation counts\s*$")
_STATUS_HEAD = re.compile(r"^\s*Communicator ranks have different status\s*$")
_ERR_HEAD = re.compile(r"^\s*(Initialization|Asynchronous) errors? on (\d{1,9}) ranks?\s*$")
_N_LAUNCHED = re.compile(rf"^\s*(\d{{1,9}}) ranks have (?:launched up to operation {_NUM}|not launched any operations)\s*$")
_N_STATUS = re.compile(r"^\s*(\d{1,9}) ranks have status ([A-Z]+)\s*$")
_N_REPORTED = re.compile(r"^\s*(\d{1,9}) ranks reported (.{1,80}?)\s*$")
_RANK = re.compile(
    rf"^\s*Rank (\d{{1,10}})(?: (?:has launched up to operation {_NUM}|(has not launched any operations)"
    r"|has status ([A-Z]+)|reported (.{1,80}?)))?"
    r"(?: -- (?:GPU (.{1,32}?) managed by process (\d{1,10}) on node (\S{1,255})|\[process information not found\]))?\s*$")


def parse(text: str, truncated: bool = False) -> dict[str, Any]:
    """The report (either form) as a dict; ``{"error": why}`` when it is not one."""
    try:
        body = text.lstrip()
        if body.startswith("{"):
            if truncated:
                return {"error": "JSON report cut at the size cap"}
            return _from_json(body)
        return _from_text(text, truncated)
    except (ValueError, TypeError, KeyError, RecursionError) as err:  # msgspec.DecodeError is a ValueError
        return {"error": f"unreadable RAS report: {type(err).__name__}: {str(err)[:120]}"}


def _new_report(form: str) -> dict[str, Any]:
    return {"form": form, "version": None, "nodes": None, "processes": None, "gpus": None,
            "groups": [], "comms": [], "missing_processes": 0, "dead_processes": 0,
            "processes_named": [], "timeouts": 0, "truncated": False, "dropped": 0}


def _new_comm(h: str, group: int | None, size: int | None) -> dict[str, Any]:
    return {"hash": h, "group": group, "size": size, "kinds": [], "missing": [], "missing_count": 0,
            "dead": [], "errors": [], "error_ranks": [], "status": {}, "ops": {}}


def _int(s: str) -> int:
    v = int(s)
    return v if v < MAX_INT else MAX_INT


def _add(lst: list[Any], v: Any) -> None:
    if len(lst) < MAX_RANKS and v not in lst:
        lst.append(v)


def op_counts(c: dict[str, Any]) -> dict[str, list[tuple[int, int]]]:
    """The communicator's count groups, comparable across two reports: op -> [(op, ranks)]."""
    return {op: sorted((g["op"], g["count"]) for g in gs) for op, gs in (c.get("ops") or {}).items()}


def norm_hash(h: Any) -> str | None:
    """``27a079b828ff1a75`` (text, %016lx), ``0x27a079b828ff1a75`` (json, 0x%lx) or the
    probe's 16 hex digits -> 16 lower-case hex digits."""
    if not isinstance(h, str):
        return None
    m = re.fullmatch(r"(?:0[xX])?([0-9a-fA-F]{1,16})", h.strip())
    return f"{int(m.group(1), 16):016x}" if m else None


# ---- the text form -------------------------------------------------------------------------
class _Text:
    """One pass over the lines; ``comm`` is the ``#x-y`` block being read, ``op``/``value``
    the count line that the following "Rank R -- ..." lines belong to."""

    def __init__(self, truncated: bool):
        self.r = _new_report("text")
        self.r["truncated"] = truncated
        self.section = ""
        self.comm: dict[str, Any] | None = None
        self.block = ""  # INCOMPLETE / DEAD (job-wide) or the comm block's kind
        self.op: str | None = None
        self.group: dict[str, Any] | None = None  # the count/status group ranks are listed under
        self.after_total = False

    def rank_ok(self, rank: int) -> bool:
        size = self.comm.get("size") if self.comm else None
        if isinstance(size, int) and rank >= size:
            self.r["dropped"] += 1  # NCCL's own bug (#1762) or a forged line: not a rank
            return False
        return True

    def line(self, ln: str) -> None:
        s = ln.strip()
        if not s:
            return
        if m := _VERSION.match(s):
            self.r["version"] = m.group(1)
        elif s in ("Job summary", "Errors", "Warnings") or s.startswith("Communicators...") or \
                (s.startswith("Group ") and "Comms" in s):  # the table's header (an excerpt may start there)
            section = "Communicators" if s.startswith("Group ") else s.split("...")[0]
            self.section, self.comm, self.block, self.op, self.group = section, None, "", None, None
        elif set(s) == {"="}:
            return
        elif self.section == "Job summary":
            self.summary(s)
        elif self.section == "Communicators" and (m := _GROUP_ROW.match(ln)):
            if len(self.r["groups"]) < MAX_COMMS:
                self.r["groups"].append({"group": _int(m.group(1)), "comms": _int(m.group(2)),
                                         "nodes": _int(m.group(3)), "ranks_per_comm": _int(m.group(5)),
                                         "ranks": _int(m.group(6)), "status": m.group(7), "errors": m.group(8)})
        elif m := _COMM.match(s):
            self.start_comm(m)
        elif s in ("INCOMPLETE", "DEAD", "TIMEOUT"):
            self.comm, self.block, self.op, self.group = None, s, None, None
        else:
            self.detail(ln)

    def summary(self, s: str) -> None:
        if s.startswith("(total)"):
            self.after_total = True
            return
        nums = s.split()
        if self.after_total and nums and all(n.isdigit() and len(n) < 12 for n in nums):
            if len(nums) == 5:  # Nodes, Processes per node, GPUs per process, Processes, GPUs
                self.r["nodes"], self.r["processes"], self.r["gpus"] = int(nums[0]), int(nums[3]), int(nums[4])
            elif len(nums) == 3:  # the inconsistent-layout summary: Nodes, Processes, GPUs (totals)
                self.r["nodes"], self.r["processes"], self.r["gpus"] = (int(n) for n in nums)
        self.after_total = False

    def start_comm(self, m: re.Match[str]) -> None:
        h = norm_hash(m.group(3))
        gi = int(m.group(1))
        size = next((g["ranks_per_comm"] for g in self.r["groups"] if g["group"] == gi), None)
        c = next((x for x in self.r["comms"] if x["hash"] == h), None)
        if c is None:
            if len(self.r["comms"]) >= MAX_COMMS:
                self.comm = None
                return
            c = _new_comm(h or "", gi, size)
            self.r["comms"].append(c)
        if m.group(4) not in c["kinds"]:
            c["kinds"].append(m.group(4))
        self.comm, self.block, self.op, self.group = c, m.group(4), None, None

    def detail(self, ln: str) -> None:
        r, c = self.r, self.comm
        if c is None:
            self.job_detail(ln)
            return
        if m := _MISSING_RANKS.match(ln):
            n, size = _int(m.group(1)), c.get("size")
            if isinstance(size, int) and n > size:
                r["dropped"] += 1  # more missing than the communicator has ranks: not a count
            else:
                c["missing_count"] = n
        elif m := _OLD_MISSING.match(ln):
            for part in m.group(1).replace(",", " ").split():
                if len(part) < 11 and self.rank_ok(int(part)):
                    _add(c["missing"], int(part))
        elif m := _OP_HEAD.match(ln):
            self.op = m.group(1)
            if len(c["ops"]) < 16:
                c["ops"].setdefault(self.op, [])
        elif _STATUS_HEAD.match(ln):
            self.op = "status"
        elif m := _ERR_HEAD.match(ln):
            _add(c["errors"], f"{m.group(1).lower()} error on {m.group(2)} rank(s)")
        elif m := _N_LAUNCHED.match(ln):
            self.group = self.count_group(int(m.group(1)), _int(m.group(2)) if m.group(2) else 0)
        elif m := _N_STATUS.match(ln):
            self.group = c["status"].setdefault(m.group(2), {"count": int(m.group(1)), "ranks": []})
        elif m := _N_REPORTED.match(ln):
            _add(c["errors"], m.group(2))
            self.group = None
        elif m := _RANK.match(ln):
            self.rank_line(m)
        elif m := _TIMEOUTS.match(ln):
            r["timeouts"] = _int(m.group(1))

    def count_group(self, count: int, value: int) -> dict[str, Any] | None:
        if self.comm is None or self.op is None or self.op == "status":
            return None
        groups = self.comm["ops"].setdefault(self.op, [])
        g = next((x for x in groups if x["op"] == value), None)
        if g is None and len(groups) < MAX_RANKS:
            g = {"op": value, "count": count, "ranks": []}
            groups.append(g)
        return g

    def rank_line(self, m: re.Match[str]) -> None:
        c = self.comm
        rank = _int(m.group(1))
        if c is None or not self.rank_ok(rank):
            return
        host = m.group(8)
        if host and len(c.setdefault("hosts", {})) < MAX_RANKS:
            c["hosts"][str(rank)] = host
        if self.block == "INCOMPLETE":
            _add(c["missing"], rank)
        elif self.block == "ERROR":
            _add(c["error_ranks"], rank)
            if m.group(5):
                _add(c["errors"], m.group(5))
        elif m.group(2) is not None or m.group(3):  # "Rank R has launched up to operation N" (one rank)
            g = self.count_group(1, _int(m.group(2)) if m.group(2) else 0)
            if g is not None:
                _add(g["ranks"], rank)
        elif m.group(4):  # "Rank R has status S"
            _add(c["status"].setdefault(m.group(4), {"count": 1, "ranks": []})["ranks"], rank)
        elif self.group is not None:  # listed under "N ranks have ..."
            _add(self.group["ranks"], rank)

    def job_detail(self, ln: str) -> None:
        r = self.r
        if m := _MISSING_PROCS.match(ln):
            r["missing_processes"] = _int(m.group(1))
        elif m := _DEAD_PROCS.match(ln):
            r["dead_processes"] = _int(m.group(1))
        elif (m := _PROCESS.match(ln)) and self.block in ("INCOMPLETE", "DEAD"):
            if len(r["processes_named"]) < MAX_RANKS:
                r["processes_named"].append({"pid": int(m.group(1)), "host": m.group(2), "gpus": m.group(3),
                                             "state": "dead" if self.block == "DEAD" else "missing"})
        elif m := _TIMEOUTS.match(ln):
            r["timeouts"] = _int(m.group(1))


def _from_text(text: str, truncated: bool) -> dict[str, Any]:
    p = _Text(truncated)
    lines = text.splitlines()
    if len(lines) > MAX_LINES:
        lines, p.r["truncated"] = lines[:MAX_LINES], True
    for ln in lines:
        p.line(ln[:MAX_LINE])
    r = p.r
    if r["version"] is None and not r["groups"] and not r["comms"]:
        return {"error": "not a RAS status report (no version line, no communicator table)"}
    return r


# ---- the JSON form -------------------------------------------------------------------------
def _entries(raw: list[Any], typ: type[T], r: dict[str, Any]) -> list[T]:
    """Each entry of a list alone (jsonshape.lenient): a bad one is counted in
    ``dropped`` and the others kept, as the hand-written checks before the shapes did."""
    out = []
    for x in raw[:1 << 16]:
        try:
            out.append(jsonshape.lenient(x, typ))
        except jsonshape.ValidationError:
            r["dropped"] += 1
    return out


def _from_json(body: str) -> dict[str, Any]:
    # decoded once to Python objects, then shaped: the lenient reading (rasshape) needs the
    # objects; a number past float range (1e999) or NaN makes the report unreadable
    try:
        doc = jsonshape.lenient(msgspec.json.decode(body), rasshape.Report)
    except jsonshape.ValidationError as err:  # not an object, or no communicators list
        return {"error": f"not a RAS JSON report: {jsonshape.why(err, 120)}"}
    r = _new_report("json")
    r["version"] = doc.nccl_version[:32] if doc.nccl_version is not None else None
    procs: set[tuple[str, int]] = set()
    dead: set[tuple[str, int]] = set()
    for jc in _entries(doc.communicators[:MAX_COMMS], rasshape.Comm, r):
        r["comms"].append(_json_comm(jc, r, procs, dead))
    r["timeouts"] = doc.ras.timeouts_count
    r["processes"] = len(procs) or None
    r["dead_processes"] = len(dead)
    return r


def _json_comm(jc: rasshape.Comm, r: dict[str, Any], procs: set[tuple[str, int]],
               dead: set[tuple[str, int]]) -> dict[str, Any]:
    size = jc.size
    c = _new_comm(norm_hash(jc.hash) or "", None, size)
    counts: dict[str, dict[int, list[int]]] = {}
    states: dict[str, list[int]] = {}
    for jr in _entries(jc.ranks, rasshape.Rank, r):
        rank = jr.rank
        if size and rank >= size:
            r["dropped"] += 1
            continue
        if jr.host is not None and jr.pid is not None:
            procs.add((jr.host[:255], jr.pid))
        st = jr.status
        for key, e in (("init_state", st.init_state), ("async_error", st.async_error)):
            if e not in (None, 0, IN_PROGRESS):
                _add(c["error_ranks"], rank)
                _add(c["errors"], f"{key} {e}")
        state = ("ABORT" if st.abort_flag else "FINALIZE" if st.finalize_called or st.destroy_flag else
                 "RUNNING" if st.init_state == 0 else "INIT")
        states.setdefault(state, []).append(rank)
        for op, n in list(jr.collective_counts.items())[:16]:
            counts.setdefault(op[:32], {}).setdefault(n, []).append(rank)
    nocomm = 0
    for jm in _entries(jc.missing_ranks, rasshape.MissingRank, r):
        rank = jm.rank
        if size and rank >= size:
            r["dropped"] += 1
            continue
        if jm.status.considered_dead:
            _add(c["dead"], rank)
            if jm.host is not None and jm.pid is not None:
                dead.add((jm.host[:255], jm.pid))
        if jm.status.unresponsive or jm.status.considered_dead:
            _add(c["missing"], rank)
            c["missing_count"] += 1
        else:
            nocomm += 1  # answered, but not (any more) a member of this communicator
    if c["missing"]:
        c["kinds"].append("INCOMPLETE")
    if c["error_ranks"]:
        c["kinds"].append("ERROR")
    if nocomm:
        states.setdefault("NOCOMM", [])
    for state, rs in states.items():
        c["status"][state] = {"count": len(rs) or nocomm, "ranks": rs[:MAX_RANKS]}
    for op, by in counts.items():
        if len(by) > 1:
            c["ops"][op] = [{"op": n, "count": len(rs), "ranks": rs[:MAX_RANKS]}
                            for n, rs in sorted(by.items(), key=lambda kv: -len(kv[1]))[:MAX_RANKS]]
    if c["ops"] or len(c["status"]) > 1:
        c["kinds"].append("MISMATCH")
    return c
