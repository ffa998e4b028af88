"""Whose traceback it was: torchrun's report of the worker that printed it.

A worker's traceback reaches the job's output without its global rank where torchrun's prefix is
only the local rank (`[default0]:`, `--tee` of older releases) or where there is no prefix at all.
Right after it, the worker's agent reports that worker's exit (`failed (exitcode: 1) local_rank: 0
(pid: 3034418) of binary: ...`), and its summary (`Root Cause (first observed failure)`, or a
failure entry) names the same pid with the host and the global rank. The traceback is then that
rank's, on that host: the verdict can order it against the other nodes' events and name its node.

Only a program's exit (a positive exit code: what an uncaught exception gives) is followed; a
launcher prefix that names another local rank, a second worker's report in between, or a summary
that does not name the pid leaves the traceback where it was. Where the exit report is missing,
the one summary entry of the prefix's local rank places it; two such entries leave it.
"""
from __future__ import annotations

from typing import Any, Iterable, Mapping, Optional

from slurm_attr.model import Evidence, Symptom
from slurm_attr.rules.pyrule import JobRefiner, RefinerCase
from slurm_attr.rules.scan import RANK_PREFIX

SUMMARY_IDS = ("torch.root_cause", "torch.failure_entry")
REPORT_ID = "torch.child_failed"
# a traceback and its worker's exit report are printed within this many lines of each other
# (chained exceptions make long tracebacks; other workers' lines interleave)
NEAR_LINES = 400


def _local_label(s: Symptom) -> Optional[int]:
    m = RANK_PREFIX.match(s.evidence[0].text) if s.evidence else None
    return int(m.group("local")) if m and m.group("local") is not None else None


def _report_after(s: Symptom, reports: list[Symptom]) -> Optional[Symptom]:
    """The worker's exit report that follows ``s`` in its file; None when two workers' reports
    could both be it."""
    ev = s.evidence[0]
    after = sorted((r for r in reports if r.evidence[0].path == ev.path and 0 < r.evidence[0].line - ev.line <= NEAR_LINES),
                   key=lambda r: r.evidence[0].line)
    if not after:
        return None
    label = _local_label(s)
    if label is not None:
        mine = [r for r in after if r.fields.get("local_rank") == label]
        return mine[0] if mine else None
    # no label: only one worker may have reported within reach
    return after[0] if len({r.fields.get("pid") for r in after}) == 1 else None


def _only_entry_of_label(s: Symptom, entries: Iterable[Symptom]) -> Optional[Symptom]:
    """Without the worker's exit report: the one summary entry whose local rank is the
    traceback's prefix (two nodes' workers of one local rank could both be it)."""
    label = _local_label(s)
    mine = [e for e in entries if label is not None and e.fields.get("local_rank") == label]
    return mine[0] if len(mine) == 1 else None


def place_tracebacks(syms: list[Symptom], job: Mapping[str, Any]) -> None:
    reports = [s for s in syms if s.id == REPORT_ID and s.evidence and isinstance(s.fields.get("pid"), int)
               and isinstance(s.fields.get("exitcode"), int)]
    where = {s.fields["pid"]: s for s in syms if s.id in SUMMARY_IDS and isinstance(s.fields.get("pid"), int)
             and s.node is not None and s.rank is not None}
    if not where:
        return
    for s in syms:
        if (s.role != "root" or s.trusted or s.rank is not None or s.node is not None or not s.evidence
                or s.id in SUMMARY_IDS or s.evidence[0].source not in ("stdout", "stderr")):
            continue
        rep = _report_after(s, reports)
        if rep is None:
            entry = _only_entry_of_label(s, where.values())
        else:  # a kill (a negative code) prints no traceback of its own: not this one's
            entry = where.get(rep.fields["pid"]) if rep.fields["exitcode"] > 0 else None
        if entry is not None:
            s.node, s.rank = entry.node, entry.rank


def _case(label: str = "[default0]:", local: int = 0, pid: int = 3034418, summary_pid: int = 3034418,
          exitcode: int = 1, other_report: bool = False, report: bool = True, second_entry: bool = False) -> list[Symptom]:
    exc = Symptom(id="python.exception", cause="user_error", role="root",
                  evidence=[Evidence("stdout", "output/stdout", 32, f"{label}ValueError: Expected input batch_size (32)")])

    def exit_report(p: int, lr: int, line: int) -> Symptom:
        return Symptom(id=REPORT_ID, cause="user_error", role="cascade", fields={"exitcode": exitcode, "local_rank": lr, "pid": p},
                       evidence=[Evidence("stdout", "output/stdout", line,
                                          f"E1217 04:50:38.282007 117551 torch/distributed/elastic/multiprocessing/api.py:869] "
                                          f"failed (exitcode: {exitcode}) local_rank: {lr} (pid: {p}) of binary: /usr/bin/python3")])
    root = Symptom(id="torch.root_cause", cause="user_error", role="root", node="n19", rank=0,
                   fields={"pid": summary_pid, "local_rank": 0, "exitcode": exitcode},
                   evidence=[Evidence("stdout", "output/stdout", 43, "Root Cause (first observed failure):")])
    reports = ([exit_report(pid, local, 33)] if report else []) + ([exit_report(777, 1, 34)] if other_report else [])
    other = [Symptom(id="torch.failure_entry", cause="unknown", role="context", node="n20", rank=8,
                     fields={"pid": 555, "local_rank": 0}, evidence=[Evidence("stdout", "output/stdout", 50, "[1]:")])]
    return [exc] + reports + [root] + (other if second_entry else [])


JOB_REFINERS = [
    JobRefiner(
        id="torch.worker_traceback",
        description="A traceback printed without its global rank (torchrun's local-rank prefix, or none) is the "
                    "worker's whose exit torchrun reports right after it: the summary that names that pid gives "
                    "its host and rank.",
        run=place_tracebacks,
        cases=[
            RefinerCase(lambda: _case(), ["root", "cascade", "root"], expect_places=["n19/0", "", "n19/0"]),
            RefinerCase(lambda: _case(label=""), ["root", "cascade", "root"], expect_places=["n19/0", "", "n19/0"]),
            # near misses: the prefix names another local rank; the summary names another pid; a
            # kill, not a program exit; two workers reported right after an unlabelled traceback
            RefinerCase(lambda: _case(label="[default1]:"), ["root", "cascade", "root"], expect_places=["", "", "n19/0"]),
            RefinerCase(lambda: _case(summary_pid=4242), ["root", "cascade", "root"], expect_places=["", "", "n19/0"]),
            RefinerCase(lambda: _case(exitcode=-9), ["root", "cascade", "root"], expect_places=["", "", "n19/0"]),
            RefinerCase(lambda: _case(label="", other_report=True), ["root", "cascade", "cascade", "root"],
                        expect_places=["", "", "", "n19/0"]),
            # no exit report: the summary's one entry of the prefix's local rank; near misses: two
            # entries of that local rank, or no prefix at all
            RefinerCase(lambda: _case(report=False), ["root", "root"], expect_places=["n19/0", "n19/0"]),
            RefinerCase(lambda: _case(report=False, second_entry=True), ["root", "root", "context"],
                        expect_places=["", "n19/0", "n20/8"]),
            RefinerCase(lambda: _case(label="", report=False), ["root", "root"], expect_places=["", "n19/0"]),
        ],
    ),
]
