"""The live findings of one job: ``<spool>/live/<job>/finding.<step>.json``, root's, group
= the job's group, 0640. Written only by the step's leading watcher; read by ``sattr``
(checked: root's, the right job) and by the post-mortem analysis (as untrusted evidence:
the records behind it are the job's).

The rendering below (``headline``, ``stack_lines``, ``dump_line``, ``lines``) shows fields
the job chose (FR names, stack frames, RAS text): each goes through jobtext, and a stack's
file and function are quoted as the job's words where they are more than a plain token.
"""
from __future__ import annotations

import re
from datetime import datetime
from typing import Any

from .. import jobtext, jsonshape, safefs
from ..errors import UnsafePath
from . import livespool
from .findingshape import StepDoc

MAX_FINDINGS = 20
MAX_STEPS = 64


def name(step: str) -> str:
    return f"finding.{step}.json"


def _read_step(spool: str, job: str, step: str) -> tuple[dict[str, Any], StepDoc] | None:
    """The document as written and its checked header (findingshape), None when there is
    none or it is not this step's."""
    try:
        doc = livespool.read_json(livespool.job_dir(spool, job), name(step), livespool.FINDING_CAP, owner=0)
        head = jsonshape.lenient(doc, StepDoc)
    except (UnsafePath, ValueError, OSError, RecursionError):  # msgspec.ValidationError is a ValueError
        return None
    if head.job != job or head.step != step:
        return None
    return doc, head


def load_step(spool: str, job: str, step: str) -> dict[str, Any] | None:
    """One step's findings document, None when there is none (or it is not trustworthy)."""
    got = _read_step(spool, job, step)
    return got[0] if got is not None else None


def load(spool: str, job: str) -> dict[str, Any] | None:
    """Every step's findings of the job merged into one document, None when none."""
    try:
        entries = safefs.list_dir(livespool.job_dir(spool, job))
    except (UnsafePath, ValueError):
        return None
    steps = sorted(n[len("finding."):-len(".json")] for n, kind in entries
                   if kind == "file" and n.startswith("finding.") and n.endswith(".json"))
    docs = [got[1] for got in (_read_step(spool, job, s) for s in steps[:MAX_STEPS] if livespool.valid_step(s)) if got]
    if not docs:
        return None
    covs = [f"step {d.step}: {d.coverage}" for d in docs if d.coverage is not None]
    dumps = [x for d in docs for x in d.dumps]
    notes = [x for d in docs for x in d.notes]
    return {"job": job, "findings": [f for d in docs for f in d.findings], "coverage": "; ".join(covs),
            "dumps": dumps, "notes": notes[-MAX_FINDINGS:]}


def save(spool: str, job: str, step: str, doc: dict[str, Any], gid: int | None) -> None:
    doc["findings"] = doc.get("findings", [])[-MAX_FINDINGS:]
    doc["job"], doc["step"] = job, step
    livespool.write_json(livespool.job_dir(spool, job), "", name(step), doc, mode=0o640, gid=gid)


def _clock(iso_time: Any) -> str:
    try:
        return datetime.fromisoformat(str(iso_time)).astimezone().strftime("%H:%M:%S")
    except ValueError:
        return "?"


def _ranks(rs: list[Any]) -> str:
    rs = [r for r in rs if isinstance(r, int)]
    if not rs:
        return "ranks"
    shown = ",".join(map(str, rs[:8])) + (",..." if len(rs) > 8 else "")
    return f"rank{'s' if len(rs) > 1 else ''} {shown}"


def headline(f: dict[str, Any]) -> str:
    """One line: "hang detected 14:02:10: rank 37 never entered all_reduce #812; ranks
    waiting since 14:01:05"."""
    f = jobtext.deep(f)  # names and summaries in it came from the job's records
    syms = [s for s in f.get("symptoms") or () if isinstance(s, dict)]
    cls = f.get("class")
    if f.get("kind") == "slow":  # S1-S3 (slow/anomalies.py): the job runs on, only slower
        return f"{f.get('title') or 'slow'} detected {_clock(f.get('detected'))}: {f.get('what')} [{cls}]"
    first = syms[0] if syms else {}
    fields = first.get("fields") or {}
    if cls == "H1" and syms:
        what = f"{_ranks(f.get('ranks') or [])} never entered {fields.get('func')} #{fields.get('seq')}"
    elif cls == "H3" and syms:
        what = (f"rank {fields.get('src_rank')} ({fields.get('src_node')}) -> rank {fields.get('dst_rank')} "
                f"({fields.get('dst_node')}): network sends never completed")
    elif cls == "H2" and syms:
        what = f"{_ranks(f.get('ranks') or [])} issued {fields.get('issued')} where others issued {fields.get('expected')}"
    elif cls == "H1":
        what = f"{_ranks(f.get('ranks') or [])} {f.get('what')}"
    else:
        what = str(f.get("what") or "no rank progresses")
    b = f.get("behind")
    if isinstance(b, dict):  # a cascade: the localised finding on another communicator is the cause
        what = f"{what}, behind {b.get('class')} on {b.get('label')} ({_ranks(b.get('ranks') or [])})"
    since = f"; ranks waiting since {_clock(f.get('waiting_since'))}" if f.get("waiting_since") else ""
    return f"hang detected {_clock(f.get('detected'))}: {what} [{cls}, {f.get('label')}]{since}"


def stack_lines(stacks: Any, culprits: Any = ()) -> list[str]:
    """"rank 1 (n2) is at /home/u/train.py:212 in step" per rank the dumps reached: the
    culprits first (the ranks the others wait for), then the waiting ones."""
    rows = [s for s in stacks if isinstance(s, dict)] if isinstance(stacks, list) else []
    first = {r for r in culprits or () if isinstance(r, int)}
    def order(s: dict[str, Any]) -> tuple[bool, int]:
        rank = s.get("rank") if isinstance(s.get("rank"), int) else None  # a list or object is no rank (nor hashable)
        return rank not in first or rank is None, rank or 0

    rows.sort(key=order)
    return [f"rank {jobtext.line(s.get('rank'))} ({jobtext.line(s.get('node'))}) is at {_where(s.get('at'))}"
            for s in rows[:16]]


_AT = re.compile(r"(?P<file>.*):(?P<line>\d{1,9}) in (?P<func>.*)", re.DOTALL)


def _where(at: Any) -> str:
    """A stack's "file:line in func" (dumps.Frame.text) with the file and the function, both
    the job's, quoted where they are more than a plain token."""
    m = _AT.fullmatch(at) if isinstance(at, str) else None
    if m is None:
        return jobtext.quote(at, 200)
    return f"{jobtext.quote(m.group('file'), 200)}:{m.group('line')} in {jobtext.quote(m.group('func'), 120)}"


def dump_line(d: Any) -> str | None:
    """What the pre-kill dumps reached: "dumps 14:02:12 (hang): 2 of 2 node(s), FR of ranks 0,1,
    1 pipe(s) written, 0.41 s after the request"."""
    if not isinstance(d, dict):
        return None
    d = jobtext.deep(d)
    fr = [r for r in d.get("fr_ranks") or () if isinstance(r, int)]
    lat = d.get("latency_s")
    return (f"dumps {_clock(d.get('requested'))} ({d.get('reason')}): {d.get('nodes_answered')} of "
            f"{d.get('nodes') or '?'} node(s), FR of {_ranks(fr) if fr else 'no rank'}, "
            f"{d.get('pipes_sent', 0)} pipe(s) written" + (f", {lat} s after the request" if lat is not None else ""))


def dropped_lines(d: Any) -> list[str]:
    """What the node's live budget for the job did not keep, or removed to make room
    (budget.py), a few lines: "n1: FR of rank 12 not kept: 16777216 bytes over ..."."""
    dropped = [x for x in (d.get("dropped") or []) if isinstance(x, str)] if isinstance(d, dict) else []
    more = [f"... and {len(dropped) - 3} more over the live budget"] if len(dropped) > 3 else []
    return [jobtext.line(x) for x in dropped[:3]] + more


def cancel_lines(c: Any) -> list[str]:
    """The cancel's outcome: what was cancelled (an array task by ARRAYJOBID_TASKID), or why not."""
    if not isinstance(c, dict):
        return []
    saved = f", {c.get('gpu_minutes_saved')} GPU-minutes saved" if c.get("gpu_minutes_saved") is not None else ""
    why = jobtext.line(c.get("why"))
    if c.get("done"):
        target = f" {jobtext.line(c['target'])}" if isinstance(c.get("target"), str) else ""
        out = [f"cancelled{target}: {why}{jobtext.line(saved)}"]
    elif c.get("refused"):
        out = [f"not cancelled: Slurm's record no longer matched ({jobtext.line(c['refused'])}); {why}"]
    elif c.get("error"):
        out = [f"not cancelled: scancel failed ({jobtext.line(c['error'])}); {why}"]
    else:
        out = [f"not cancelled: {why}"]
    if isinstance(c.get("ras"), str) and c["ras"] not in str(c.get("why")):  # what NCCL's RAS said
        out.append(f"NCCL RAS: {jobtext.line(c['ras'][:300])}")
    return out


def note_line(n: Any) -> str | None:
    """A stall judged busy, not stuck (hang/busy.py): "busy, not stuck 14:02:10: world 9e37...: rank 0:
    checkpoint at train.py:90 in save_checkpoint, counters moving (quiet 12.0 s; threshold 5.0 s)"."""
    if not isinstance(n, dict):
        return None
    n = jobtext.deep(n)  # the why quotes the rank's stack: the job's words
    return (f"busy, not stuck {_clock(n.get('noted'))}: {n.get('label')}: {n.get('why')} (quiet {n.get('quiet_s')} s; "
            f"threshold {n.get('threshold_s')} s, reported at {n.get('ceiling_s')} s if it lasts)")


def lines(doc: dict[str, Any]) -> list[str]:
    out = []
    for f in doc.get("findings", []):
        if not isinstance(f, dict):
            continue
        out.append(headline(f))
        if isinstance(f.get("busy"), str):  # reported at the ceiling although its ranks looked busy
            out.append(f"  busy when reported: {jobtext.line(f['busy'])}")
        out += [f"  {ln}" for ln in stack_lines(f.get("stacks"), f.get("ranks"))]
        if (dl := dump_line(f.get("dumps"))) is not None:
            out.append(f"  {dl}")
            out += [f"    {ln}" for ln in dropped_lines(f.get("dumps"))]
        out += [f"  {ln}" for ln in cancel_lines(f.get("cancel"))]
    for d in doc.get("dumps") or ():
        if (dl := dump_line(d)) is not None:
            out.append(dl)
            out += [f"  {ln}" for ln in dropped_lines(d)]
            out += [f"  {ln}" for ln in stack_lines(d.get("stacks"))]
    out += [ln for ln in (note_line(n) for n in (doc.get("notes") or [])[-3:]) if ln]
    cov = doc.get("coverage")
    if isinstance(cov, str) and cov:
        out.append(f"live watch: {jobtext.line(cov)}")
    return out
