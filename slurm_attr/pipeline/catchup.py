"""Stage: the catch-up from accounting: ended jobs the intake never got, recorded after all.

The controller hook's record is not fsynced by default (``[intake] hook_fsync``): the job's end
is durable in Slurm already (slurmctld's state, slurmdbd's accounting). So ``sattr retry`` (the
timer, every minute) and the workers (before they give their slot back, at most once a minute)
ask accounting, in ONE sacct, for the jobs that ended since the last catch-up's high-water mark
(minus MARGIN_S; at most ``[intake] catchup_window_s`` back; the first run: the last hour) and
record as pending those with no stored verdict, no pending record and none in flight, with the
facts accounting gives (settle.facts_from_row). That covers a record a crash lost or tore, a hook
that never ran (slurmctld restarted mid-burst, the hook killed by its timeout) and a record
deleted by hand.

Bounds: at most ``[intake] catchup_max_jobs`` recorded per run (the oldest first; the mark stops
at the last one recorded); never a job still running (the final states only), nor one that never
started, nor a step or an array's not-yet-split parent (``A_[1-5]``): a job is keyed as its hook
keys it, by its own raw id (an array task's too), ``.rN`` for the latest requeue attempt the spool
holds. Accounting down: logged, nothing recorded, the mark stays (the next run asks again).

No duplicates: the pending keys are listed before the stored verdicts are read. A worker removes
a pending record only after its verdict is stored, and the C front's record becomes the JSON one
before it is removed (ctldrecord.ingest): a job missing from the listing is stored by then.
"""
from __future__ import annotations

import fcntl
import json
import logging
import os
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from .. import spool, turns
from ..atomicfile import write_atomic
from ..config import Config
from ..errors import SlurmError
from ..slurm.base import FINAL_STATES
from . import intake, settle

log = logging.getLogger("slurm_attr")

MARK = ".catchup-mark"       # {"mark": epoch}: the end of the window last covered in full
LOCK = ".catchup.lock"       # one catch-up at a time (a worker's and the timer's)
TURN = ".catchup-turn"       # the workers' turns (turns.py)
EVERY_S = 60.0               # a worker's catch-up at most this often (the timer's always runs)
FIRST_S = 3600.0             # no mark yet: the last hour
# accounting may write an end a little late, and a clock may step: the next window overlaps
MARGIN_S = 600.0
_RAW = re.compile(r"\d{1,12}")
_ATTEMPT = re.compile(r"(\d{1,12})\.r(\d{1,6})")


@dataclass
class Result:
    window: tuple[float, float] = (0.0, 0.0)
    ended: int = 0                      # rows accounting gave
    recorded: list[str] = field(default_factory=list)
    skipped: Counter[str] = field(default_factory=Counter)  # why: stored, pending, running, ...
    error: str = ""

    def line(self) -> str:
        why = " ".join(f"{k}={v}" for k, v in sorted(self.skipped.items())) or "-"
        return f"catch-up from accounting: {self.ended} ended jobs, {len(self.recorded)} recorded; skipped {why}" + \
            (f"; {self.error}" if self.error else "")


def read_mark(cfg: Config) -> float | None:
    try:
        with open(os.path.join(cfg.intake.queue_dir, MARK), "rb") as f:
            mark = json.loads(f.read(4096)).get("mark")
    except (OSError, ValueError, AttributeError):
        return None
    return float(mark) if isinstance(mark, (int, float)) else None


def window(cfg: Config, now: float) -> tuple[float, float]:
    """(start, end) of the next run's question, epoch seconds. Never before the last time a hook
    found the controller side off (intake.OFF_STAMP): those jobs were meant to go unanalysed."""
    mark = read_mark(cfg)
    start = (mark - MARGIN_S) if mark is not None else now - FIRST_S
    return max(start, now - cfg.intake.catchup_window_s, intake.off_until(cfg) or 0.0), \
        now - cfg.intake.catchup_min_age_s


def maybe_run(cfg: Config, slurm: Any, now: float | None = None) -> int:
    """A worker's catch-up, at most every EVERY_S among all of them: how many jobs it recorded."""
    now = time.time() if now is None else now
    if cfg.intake.catchup_window_s <= 0 or getattr(slurm, "ended_jobs", None) is None:
        return 0
    try:
        if not turns.take(cfg.intake.queue_dir, TURN, EVERY_S, now):
            return 0
    except OSError as err:
        log.warning("catch-up skipped: %s", err)
        return 0
    return len(run(cfg, slurm, now).recorded)


def run(cfg: Config, slurm: Any, now: float | None = None, open_store: Any = None) -> Result:
    """One catch-up (see the module doc); never raises for Slurm, the store or the disk."""
    now = time.time() if now is None else now
    res = Result()
    if cfg.intake.catchup_window_s <= 0:
        res.error = "off ([intake] catchup_window_s = 0)"
        return res
    if not cfg.analysis.enabled:
        intake.stamp_off(cfg, create=True)  # as the hooks do: what ends now is not caught up later
        res.error = "the controller side is off ([analysis] enabled = false)"
        return res
    try:
        os.makedirs(cfg.intake.queue_dir, mode=0o700, exist_ok=True)
        fd = os.open(os.path.join(cfg.intake.queue_dir, LOCK), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    except OSError as err:
        res.error = f"intake not writable: {err}"
        log.warning("%s", res.line())
        return res
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        res.error = "another catch-up is running"
        return res
    try:
        _run(cfg, slurm, now, res, open_store)
    except Exception as err:  # noqa: BLE001 - a worker calls this between batches: it must go on
        log.exception("catch-up failed")
        res.error = f"failed: {type(err).__name__}: {err}"[:300]
    finally:
        os.close(fd)
    log.log(logging.WARNING if res.recorded or res.error else logging.INFO, "%s", res.line())
    return res


def _run(cfg: Config, slurm: Any, now: float, res: Result, open_store: Any) -> None:
    if intake.off_until(cfg) is None:
        intake.stamp_off(cfg, create=True, when=0.0)  # for the hooks to stamp when the side is off
    res.window = start, end = window(cfg, now)
    if end <= start:
        return
    try:
        rows = slurm.ended_jobs(start, end)
    except SlurmError as err:
        res.error = f"accounting did not answer ({str(err)[:200]}); the next run asks again"
        return
    res.ended = len(rows)
    found = _candidates(rows, start, end, res.skipped)
    if not found:
        _save_mark(cfg, end, res)
        return
    pending = {k.split(".r")[0] for k in intake.keys(cfg)}  # listed before the store is read: module doc
    stored = _stored(cfg, list(found), open_store)
    if stored is None:
        res.error = "verdict store unreadable: nothing recorded (a stored job must not be analysed twice)"
        return
    attempts = _spool_attempts(cfg, set(found))
    todo = []
    for raw, (ended, row) in found.items():
        n = attempts.get(raw, 0)
        if raw in pending:
            res.skipped["pending"] += 1
        elif raw in stored and stored[raw] >= n:
            res.skipped["stored"] += 1
        else:
            todo.append((ended, raw, n, row))
    todo.sort()
    mark = end
    if len(todo) > cfg.intake.catchup_max_jobs:
        res.skipped["over_cap"] += len(todo) - cfg.intake.catchup_max_jobs
        todo = todo[:cfg.intake.catchup_max_jobs]
        mark = todo[-1][0]  # the rest (ended at or after it) is the next run's
    for ended, raw, n, row in todo:
        if not _record(cfg, raw, n, ended, row, res):
            return  # the intake cannot be written: the mark stays, the next run asks again
    _save_mark(cfg, mark, res)


def _candidates(rows: list[dict[str, str]], start: float, end: float,
                skipped: Counter[str]) -> dict[str, tuple[float, dict[str, str]]]:
    """{raw id: (end epoch, row)} of the rows that are ended jobs the hook would have recorded."""
    out: dict[str, tuple[float, dict[str, str]]] = {}
    for row in rows:
        raw, shown = row.get("JobIDRaw") or "", row.get("JobID") or ""
        if not _RAW.fullmatch(raw) or "." in shown or "[" in shown:
            skipped["not_a_job"] += 1  # a step, an array's unsplit parent
            continue
        if (row.get("State") or "").split(" ")[0] not in FINAL_STATES:
            skipped["running"] += 1
            continue
        ended = _epoch(row.get("End"))
        if ended is None or not start <= ended <= end:
            skipped["outside_window"] += 1
            continue
        if _epoch(row.get("Start")) is None:
            skipped["never_started"] += 1  # cancelled while pending: nothing ran, no hook to stand in for
            continue
        out[raw] = (ended, row)
    return out


def _epoch(value: str | None) -> float | None:
    if not value or value in ("Unknown", "None", "N/A"):
        return None
    try:
        return time.mktime(time.strptime(value, "%Y-%m-%dT%H:%M:%S"))
    except (ValueError, OverflowError):
        return None


def _stored(cfg: Config, raws: list[str], open_store: Any) -> dict[str, int] | None:
    """{raw id: attempt of its stored verdict}; {} with no database yet; None when unreadable."""
    if open_store is None and not os.path.exists(cfg.paths.database):
        return {}
    try:
        if open_store is None:
            from ..store import Store

            store = Store(cfg.paths.database)
        else:
            store = open_store(cfg)
        return store.verdict_attempts(raws)
    except Exception as err:  # noqa: BLE001 - locked or broken store: nothing recorded this run
        log.warning("catch-up: verdict store unreadable (%s)", err)
        return None


def _spool_attempts(cfg: Config, raws: set[str]) -> dict[str, int]:
    """{raw id: highest requeue attempt with a bundle on the spool}: a requeued job's node
    parts are under ``<id>.rN``, and its record is keyed the same way."""
    try:
        names = os.listdir(spool.bundles_root(cfg.paths.spool))
    except OSError:
        return {}
    out: dict[str, int] = {}
    for name in names:
        m = _ATTEMPT.fullmatch(name)
        if m and m.group(1) in raws:
            out[m.group(1)] = max(out.get(m.group(1), 0), int(m.group(2)))
    return out


def _record(cfg: Config, raw: str, attempt: int, ended: float, row: dict[str, str], res: Result) -> bool:
    facts = settle.facts_from_row(row)
    if attempt:
        facts["restart_count"] = attempt
    key = spool.bundle_key(raw, attempt)
    try:
        # since the job's end, due now: no analyser of its own is waiting for its node parts
        intake.record(cfg, key, facts, note="recorded from accounting: the hook's record was missing",
                      since=ended, first_try=time.time())
    except OSError as err:
        res.error = f"intake not writable: {err}"
        return False
    res.recorded.append(key)
    return True


def _save_mark(cfg: Config, mark: float, res: Result) -> None:
    try:
        write_atomic(os.path.join(cfg.intake.queue_dir, MARK), json.dumps({"mark": mark}).encode(), mode=0o600,
                     durable=True)
    except OSError as err:
        res.error = f"mark not saved ({err}): the next run looks back further"
