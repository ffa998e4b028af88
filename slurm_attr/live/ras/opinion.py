"""NCCL's own RAS as a second opinion on a hang, before ``on_hang = cancel`` acts.

NCCL >= 2.24 runs a RAS thread in every process; the processes of a job on a node share one
client socket, ``NCCL_RAS_ADDR`` (default ``localhost:28028``), that answers a line protocol
(NCCL's ``src/ras/client.cc`` and ``client_support.cc``, protocol 2, unchanged from 2.24 to
the 2.3x line): the client sends ``CLIENT PROTOCOL 2`` and reads ``SERVER PROTOCOL 2``; then
``TIMEOUT <s>`` (how long RAS waits for the other processes; ``OK``), optionally ``SET
FORMAT json`` (2.28.7+; older releases answer ``ERROR: Unknown command``), and ``VERBOSE
STATUS``, whose report streams until NCCL closes the connection. We speak it directly, so
nothing depends on the ``ncclras`` binary (the PyPI wheel does not ship one).
Built against: the text report of 2.24-2.30.7 (what the leader asks for) and the JSON report
of 2.28.7+ (parsed when asked for); rasreport.py says which lines. The text form grows with
the problems (it lists only communicators in trouble, outliers only), the JSON form with
ranks x communicators (~540 bytes per rank entry: 1 MiB holds ~1900), so a large job's JSON
would not fit the cap. No NCCL runs here: the tests replay that protocol and those reports.

The leader asks once, when it is about to cancel: every step is bounded (connect, each
read, the whole exchange by ``[live] ras_timeout_s``; the report by ``CAP``) and nothing
raises into the watcher. No listener, a timeout or garbage -> no opinion, said as such.

RAS only agrees about the communicator the probe saw hang, found by its commHash (the probe
records the same ``comm->commHash`` RAS prints): a report that does not name it may be
another job's (jobs on one node can share the port), so it never counts. What counts: ranks
of that communicator missing or dead, ranks reporting NCCL errors or aborted, ranks in
different states, or ranks whose launched-operation counts differ (some ranks behind) and
stay the same in a second report ``CONFIRM_S`` later (one report's spread is normal on a
healthy job; NCCL's guide says to re-query). A forger on the port would need the hash, which
only the job (its processes and files) and root hold. No thread of its own: the
leader's cycle waits for RAS, at most ``ras_timeout_s``, once per hang it would cancel.
"""
from __future__ import annotations

import socket
import time
from dataclasses import dataclass
from typing import Any

from ...configcheck import host_port
from .. import livespool
from . import rasreport

PROTOCOL = 2
CAP = 1 << 20  # the report; a 4096-rank verbose text report is far below
LINE_CAP = 1024  # a reply line (NCCL's own client reads them into 1 KiB)
MAX_ONE_LINE = 300
CONFIRM_S = 2.0  # between two reports when only op counts differ


@dataclass
class Answer:
    text: str | None  # the report; None: no report (``note`` says why)
    form: str | None  # "json" | "text"
    note: str
    truncated: bool = False


class _Conn:
    """Reads and writes against one deadline: a server that stalls anywhere costs at most
    the time left, never more."""

    def __init__(self, sock: socket.socket, deadline: float):
        self.sock, self.deadline, self.buf = sock, deadline, b""

    def _left(self) -> float:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("deadline")
        return left

    def send(self, text: str) -> None:
        self.sock.settimeout(self._left())
        self.sock.sendall(text.encode())

    def _more(self, limit: int) -> bool:
        self.sock.settimeout(self._left())
        data = self.sock.recv(min(65536, limit))
        self.buf += data
        return bool(data)

    def line(self) -> str:
        while b"\n" not in self.buf:
            if len(self.buf) > LINE_CAP:
                raise ValueError("reply line too long")
            if not self._more(LINE_CAP):
                raise EOFError("closed")
        ln, _, self.buf = self.buf.partition(b"\n")
        return ln.decode("utf-8", "replace").rstrip("\r")

    def rest(self, cap: int) -> tuple[bytes, bool]:
        """Everything until the server closes, at most ``cap`` bytes (True: cut there)."""
        while len(self.buf) <= cap:
            if not self._more(cap + 1 - len(self.buf)):
                return self.buf, False
        return self.buf[:cap], True


def query(host: str, port: int, timeout_s: float, cap: int = CAP, want_json: bool = False) -> Answer:
    """One ``VERBOSE STATUS`` report from the RAS socket at host:port, or why there is none."""
    deadline = time.monotonic() + timeout_s
    where = f"{host}:{port}"
    try:
        sock = socket.create_connection((host, port), timeout=max(0.05, timeout_s))
    except ConnectionRefusedError:
        return Answer(None, None, f"no NCCL RAS at {where} (connection refused)")
    except (OSError, ValueError) as err:
        return Answer(None, None, f"no NCCL RAS at {where} ({type(err).__name__}: {str(err)[:80]})")
    with sock:
        conn = _Conn(sock, deadline)
        try:
            conn.send(f"CLIENT PROTOCOL {PROTOCOL}\n")
            hello = conn.line()
            if not hello.upper().startswith("SERVER PROTOCOL "):
                return Answer(None, None, f"{where} is not NCCL RAS (answered {hello[:60]!r})")
            # RAS waits this long for unresponsive processes; half our budget leaves it time to report
            conn.send(f"TIMEOUT {max(1, int(timeout_s / 2))}\n")
            conn.line()  # "OK" (an older or odd server's error changes nothing below)
            form = "text"
            if want_json:
                conn.send("SET FORMAT json\n")
                form = "json" if conn.line().strip().upper() == "OK" else "text"
            conn.send("VERBOSE STATUS\n")
            data, cut = conn.rest(cap)
        except (TimeoutError, socket.timeout):
            return Answer(None, None, f"NCCL RAS at {where} did not answer within {timeout_s:g} s")
        except (OSError, EOFError, ValueError) as err:
            return Answer(None, None, f"NCCL RAS at {where}: {type(err).__name__}: {str(err)[:80]}")
    if not data.strip():
        return Answer(None, None, f"NCCL RAS at {where} sent an empty report")
    return Answer(data.decode("utf-8", "replace"), form, f"{len(data)} bytes ({form})", cut)


# ---- the opinion ---------------------------------------------------------------------------
def _ranks(rs: list[Any], n: int = 8) -> str:
    rs = [r for r in rs if isinstance(r, int)]
    shown = ",".join(map(str, rs[:n])) + (",..." if len(rs) > n else "")
    return f"rank{'s' if len(rs) != 1 else ''} {shown}" if rs else "ranks"


def _group(g: dict[str, Any]) -> str:
    """The ranks of a count group when RAS listed them all, else how many."""
    return _ranks(g["ranks"]) if g["ranks"] and len(g["ranks"]) == g["count"] else f"{g['count']} rank(s)"


def _ops_line(c: dict[str, Any]) -> str | None:
    """"AllReduce: rank 7 at operation 60, 7 rank(s) at 64" for the first op that differs."""
    for op, groups in c.get("ops", {}).items():
        if not isinstance(groups, list) or len(groups) < 2:
            continue
        top = max(g["op"] for g in groups)
        behind = sorted((g for g in groups if g["op"] < top), key=lambda g: g["op"])
        ahead = [g for g in groups if g["op"] == top]
        parts = [f"{_group(g)} at operation {g['op']}" for g in behind[:3]]
        n_top = sum(g["count"] for g in ahead)
        return f"{op}: {', '.join(parts)} while {n_top} rank(s) launched up to {top}"
    return None


def _comm(report: Any, finding: Any) -> dict[str, Any] | None:
    """The report's entry for the finding's communicator (by commHash), None when absent."""
    if not isinstance(report, dict) or report.get("error") or not isinstance(finding, dict):
        return None
    h = rasreport.norm_hash(finding.get("comm"))
    return next((x for x in report.get("comms") or () if isinstance(x, dict) and x.get("hash") == h), None) \
        if h else None


def _judge(c: dict[str, Any]) -> tuple[str | None, bool]:
    """(why RAS sees the communicator stuck or None, True when only op counts say so)."""
    status = c.get("status") or {}
    if c.get("dead"):
        return f"{_ranks(c['dead'])} dead (unreachable for 60 s)", False
    if c.get("missing") or c.get("missing_count"):
        who = _ranks(c["missing"]) if c.get("missing") else f"{c['missing_count']} rank(s)"
        return f"{who} not answering", False
    if c.get("error_ranks") or c.get("errors"):
        return f"NCCL errors ({'; '.join(map(str, c['errors'][:2])) or 'reported'}) on {_ranks(c['error_ranks'])}", False
    if "ABORT" in status:
        return f"{_ranks(status['ABORT'].get('ranks') or [])} aborted", False
    if len(status) > 1:
        states = ", ".join(f"{v.get('count')} {k}" for k, v in list(status.items())[:4])
        return f"ranks in different states ({states})", False
    return _ops_line(c), True


def opinion(report: dict[str, Any] | None, finding: dict[str, Any]) -> str | None:
    """One line when RAS agrees that the finding's communicator is stuck; None when RAS sees
    it healthy, does not name it, or has no report."""
    c = _comm(report, finding)
    why = _judge(c)[0] if c is not None else None
    if why is None or c is None:
        return None
    ver = f" {report['version']}" if report.get("version") else ""  # type: ignore[union-attr]
    return f"NCCL RAS{ver}: communicator {c['hash']} {'/'.join(c.get('kinds') or ['?'])}: {why}"[:MAX_ONE_LINE]


def describe(report: dict[str, Any]) -> str:
    """What RAS said when it did not agree (for the record in the finding)."""
    if report.get("error"):
        return str(report["error"])[:MAX_ONE_LINE]
    groups = report.get("groups") or []
    table = "; ".join(f"{g['comms']} comm(s) of {g['ranks_per_comm']} {g['status']} {g['errors']}" for g in groups[:3])
    job = ", ".join(f"{report[k]} {k}" for k in ("nodes", "processes") if report.get(k))
    problems = [f"{report[k]} job process(es) {k.split('_')[0]}" for k in ("missing_processes", "dead_processes")
                if report.get(k)]
    ver = f" {report['version']}" if report.get("version") else ""
    said = "; ".join(x for x in (job, table, ", ".join(problems)) if x) or "nothing about communicators"
    return f"NCCL RAS{ver} ({report.get('form')}): {said}"[:MAX_ONE_LINE]


def _ask(host: str, port: int, live_dir: str, step: str, deadline: float,
         name: str) -> tuple[dict[str, Any] | None, str]:
    """One text report, parsed, its raw text kept as ``ras/<step>.<name>.text``; (None, why) if none."""
    ans = query(host, port, max(0.1, deadline - time.monotonic()), want_json=False)
    if ans.text is None:
        return None, ans.note
    try:
        livespool.write_atomic(live_dir, "ras", f"{step}.{name}.{ans.form}", ans.text.encode())
    except OSError:
        pass  # the opinion does not depend on the copy
    return rasreport.parse(ans.text, ans.truncated), ans.note


def second_opinion(live: Any, live_dir: str, step: str, finding: dict[str, Any]) -> tuple[str | None, str]:
    """(RAS's one-line agreement or None, what RAS said) for the leader's cancel decision;
    ``live`` is the ``[live]`` config. Asks only with ``ras = "auto"``, all within
    ``ras_timeout_s``; keeps the raw reports under ``<live>/<job>/ras/`` (RAS is gone once
    the job is). When only op counts differ, asks again CONFIRM_S later: counts that moved
    are a job still launching collectives (NCCL's own guide: one snapshot's spread is
    normal), so RAS then does not agree. Never raises."""
    if getattr(live, "ras", "off") != "auto":
        return None, "not asked ([live] ras = off)"
    try:
        host, port = host_port(live.ras_addr)
        deadline = time.monotonic() + float(live.ras_timeout_s)
        report, note = _ask(host, port, live_dir, step, deadline, "1")
        if report is None:
            return None, note
        c = _comm(report, finding)
        why, counts_only = _judge(c) if c is not None else (None, False)
        if why is not None and counts_only:
            pause = min(CONFIRM_S, max(0.0, (deadline - time.monotonic()) / 3))
            time.sleep(pause)
            again, note2 = _ask(host, port, live_dir, step, deadline, "2")
            c2 = _comm(again, finding)
            if c2 is None:
                return None, f"no agreement: RAS op counts differ, a second query did not confirm ({note2})"[:300]
            if rasreport.op_counts(c2) != rasreport.op_counts(c):
                return None, (f"no agreement: RAS op counts of communicator {c['hash']} moved within {pause:.1f} s "
                              "(the job progresses)")
        agree = opinion(report, finding)
        if agree is not None:
            return agree, agree
        h = rasreport.norm_hash(finding.get("comm"))
        # the text form lists only communicators with problems: a healthy one is not named
        why = ("could not read its report on" if report.get("error") else
               "sees no problem in" if c is not None else "does not name")
        return None, f"no agreement: RAS {why} communicator {h or '?'}; {describe(report)}"[:MAX_ONE_LINE]
    except Exception as err:  # noqa: BLE001 - a second opinion never stops the watcher
        return None, f"RAS query failed: {type(err).__name__}: {str(err)[:100]}"
