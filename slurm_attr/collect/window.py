"""The job's time window on one node, from sources the job cannot change.

The node epilog reads the kernel log of [start - slack, end + slack]. ``end`` is
when the epilog runs (slurmd starts it as the job ends). ``start`` must not be a
fixed look-back: a 24 h window re-reads an Xid that an earlier job already
reported (and an admin already handled) and drains the node again for a job that
never saw it (issue 10, item 1). Trusted starts, earliest wins:

1. ``SLURM_JOB_START_TIME`` in the epilog's environment (set by slurmd on newer
   Slurm; absent on 22.05, research/slurm.md §3).
2. The plugin's start record ``<evidence_root>/<job>.start`` (spank/plugin/jobdir.c):
   created exclusively by root in slurmstepd at the job's first step on this node
   (batch, extern or srun step, before any of the job's processes run here), 0600 in
   the root-owned evidence root; its ctime is the start. The job ran nothing on this
   node before it, so it cannot hide an event it caused, and it cannot write, replace
   or re-time the file. (A site that lets users log into their allocated nodes outside
   Slurm's steps - pam_slurm without adoption - gives a job that earlier way in; there
   PrologFlags=Contain makes the extern step, at the allocation's start on every node,
   the record's writer.) It spares 22.05 one slurmctld RPC per node per job end (a
   4096-node job: 4096). The epilog removes its own record once read; records left
   by a node that never ran the epilog go after ``STALE_RECORD_S``. With an
   evidence root shared by several nodes the first epilog takes the record and the
   others ask slurmctld.
3. ``scontrol -o show job`` from the epilog while the job still exists
   (COMPLETING): its StartTime, read structurally (see ``scontrol_start``). Asked
   only when neither of the above gave a start.
4. The ctime of the plugin's rank-map files ``<evidence_root>/<job>.ranks.*``,
   root-owned 0600 in the root-owned evidence root, created as a step's tasks
   launch (kept even for opted-out jobs). The job's own directory is NOT used:
   its owner can chmod it and move its ctime to the end of the job.

Without any, the window is the job's own elapsed time when Slurm told it
(RunTime) and otherwise only the slack before the end; the coverage says so.
"""
from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Callable, Optional

# One `scontrol -o show job` record prints these fields in this order. Job-chosen
# text (JobName before them; Comment, StdOut, WorkDir, Command after them) can
# contain " StartTime=..." too, and the generic parser keeps the LAST occurrence:
# a job could widen its own window back to an old Xid. So the start is taken only
# from the one place in the record where the daemon-written sequence occurs, and
# a record holding that sequence more than once is not used at all.
_SCTL_TIMES = re.compile(
    r"(?:^| )SubmitTime=(?P<submit>\S+) EligibleTime=\S+(?: AccrueTime=\S+)? StartTime=(?P<start>\S+) "
    r"EndTime=(?P<end>\S+) Deadline=\S+")
_SCTL_RUNTIME = re.compile(r"(?:^| )RunTime=(?P<run>(?:\d+-)?\d+:\d\d:\d\d) TimeLimit=")
_SCTL_JOBID = re.compile(r"^JobId=(\d+) ")


@dataclass
class Window:
    start: float
    end: float
    start_source: str  # env | record | scontrol | rankmap | elapsed | none
    trusted_start: bool
    detail: str = ""

    def to_dict(self) -> dict[str, object]:
        return {"start": _iso(self.start), "end": _iso(self.end), "start_source": self.start_source,
                "trusted_start": self.trusted_start, "detail": self.detail,
                "start_epoch": round(self.start, 3), "end_epoch": round(self.end, 3)}


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).isoformat(timespec="seconds")


def _slurm_local(value: str) -> Optional[float]:
    """Slurm's local 'YYYY-MM-DDTHH:MM:SS' as epoch seconds; None for Unknown/N/A."""
    try:
        return datetime.strptime(value, "%Y-%m-%dT%H:%M:%S").timestamp()
    except ValueError:
        return None


def _duration(value: str) -> Optional[float]:
    m = re.fullmatch(r"(?:(\d+)-)?(\d+):(\d\d):(\d\d)", value)
    if not m:
        return None
    d, h, mi, s = (int(x) if x else 0 for x in m.groups())
    return float(((d * 24 + h) * 60 + mi) * 60 + s)


def scontrol_times(record: str, job_id: str) -> tuple[Optional[float], Optional[float], Optional[float], str]:
    """(start, end, elapsed, why) from the raw `scontrol -o show job` output for job_id.

    Only the line whose own JobId is job_id counts; times are returned only if the
    daemon's time sequence occurs exactly once in it (job-written fields can imitate it).
    """
    lines = [ln for ln in record.splitlines() if _SCTL_JOBID.match(ln) and _SCTL_JOBID.match(ln).group(1) == job_id]
    if len(lines) != 1:
        return None, None, None, f"scontrol: {len(lines)} records for job {job_id}"
    line = lines[0]
    times = list(_SCTL_TIMES.finditer(line))
    runs = list(_SCTL_RUNTIME.finditer(line))
    elapsed = _duration(runs[0].group("run")) if len(runs) == 1 else None
    if len(times) != 1:
        return None, None, elapsed, ("scontrol: the record's time fields occur "
                                     f"{len(times)} times (job-written text imitates them); not used")
    start = _slurm_local(times[0].group("start"))
    end = _slurm_local(times[0].group("end"))
    if start is None:
        return None, end, elapsed, f"scontrol: StartTime={times[0].group('start')}"
    return start, end, elapsed, "scontrol StartTime"


def scontrol_start(record: str, job_id: str) -> tuple[Optional[float], Optional[float], str]:
    """(start, elapsed, why): scontrol_times without the end."""
    start, _end, elapsed, why = scontrol_times(record, job_id)
    return start, elapsed, why


STALE_RECORD_S = 30 * 86400  # a start record this old is no running job's: removed
_RECORD_SUFFIX = ".start"


def _trusted_root(evidence_root: str) -> bool:
    """Root-owned, and not writable by others unless sticky: files in it were put there by root."""
    try:
        st = os.lstat(evidence_root)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == 0 and not (st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX)


def _root_record(st: os.stat_result) -> bool:
    # One link only: a hard link made by someone else would carry its own ctime.
    return stat.S_ISREG(st.st_mode) and st.st_uid == 0 and st.st_nlink == 1 and not st.st_mode & 0o077


def record_start(evidence_root: str, job_id: str, take: bool = True) -> tuple[Optional[float], str]:
    """(the ctime of ``<evidence_root>/<job_id>.start``, why not) from the plugin's start record.

    ``take``: remove it once read (the node epilog is its one reader), and sweep records older
    than STALE_RECORD_S that no epilog took. Only a root-owned 0600 regular file with one link
    in a trusted evidence root counts; anything else there is left and not used."""
    if not re.fullmatch(r"\d{1,12}", job_id or ""):
        return None, "record: not a job number"
    if not _trusted_root(evidence_root):
        return None, "record: evidence root not root-owned (or writable by others)"
    path = os.path.join(evidence_root, job_id + _RECORD_SUFFIX)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None, "record: none (no step of the job ran here with the plugin)"
    except OSError as err:
        return None, f"record: {err.strerror}"
    if not _root_record(st):
        return None, "record: not the plugin's (owner, mode, type or links); not used"
    if take:
        _remove(path)
        _sweep_stale(evidence_root, st.st_ctime)
    return st.st_ctime, "start record"


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass  # read-only or already gone: the sweep or the next epilog removes it


def _sweep_stale(evidence_root: str, now: float) -> None:
    try:
        names = [n for n in os.listdir(evidence_root) if n.endswith(_RECORD_SUFFIX)]
    except OSError:
        return
    for name in names[:100_000]:
        path = os.path.join(evidence_root, name)
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if _root_record(st) and st.st_ctime < now - STALE_RECORD_S:
            _remove(path)


def rankmap_start(evidence_root: str, job_id: str) -> Optional[float]:
    """Earliest ctime of the plugin's root-owned rank-map files of this job, or None."""
    times = []
    prefix = f"{job_id}.ranks."
    try:
        names = os.listdir(evidence_root)
    except OSError:
        return None
    for name in names:
        if not name.startswith(prefix):
            continue
        try:
            st = os.lstat(os.path.join(evidence_root, name))
        except OSError:
            continue
        # Root-owned regular files only: anything else was not written by slurmstepd.
        if stat.S_ISREG(st.st_mode) and st.st_uid == 0:
            times.append(st.st_ctime)
    try:
        root_st = os.lstat(evidence_root)
    except OSError:
        return None
    if root_st.st_uid != 0 or (root_st.st_mode & 0o022 and not root_st.st_mode & stat.S_ISVTX):
        return None  # a root others can write into could hold planted files
    return min(times) if times else None


def resolve(job_id: str, end: float, slack: float, env_start: Optional[float] = None,
            show_job: Optional[Callable[[str], Optional[str]]] = None,
            evidence_root: Optional[str] = None) -> Window:
    """The job's window on this node; never a fixed look-back.

    ``show_job`` returns the raw `scontrol -o show job` output (None when the job
    is unknown or Slurm does not answer); it is only asked when neither the
    environment nor the plugin's start record has a start. ``evidence_root``: where
    the plugin's start record and rank maps are; the record is removed once read.
    """
    found: list[tuple[float, str]] = []
    notes: list[str] = []
    elapsed: Optional[float] = None
    if env_start and 0 < env_start <= end:
        found.append((env_start, "env"))
    if evidence_root:
        rec, why = record_start(evidence_root, job_id)
        if rec is not None and rec <= end + 1 and not found:
            found.append((rec, "record"))
        elif rec is None and not found:
            notes.append(why)
    if not found and show_job is not None:
        try:
            raw = show_job(job_id)
        except Exception as err:  # noqa: BLE001 - any failure means "no start from Slurm"
            raw = None
            notes.append(f"scontrol: {type(err).__name__}: {err}"[:200])
        if raw:
            start, elapsed, why = scontrol_start(raw, job_id)
            if start is not None and start <= end + 1:
                found.append((start, "scontrol"))
            else:
                notes.append(why)
        elif raw is None and not notes:
            notes.append("scontrol: job not known")
    if evidence_root:
        rm = rankmap_start(evidence_root, job_id)
        if rm is not None and rm <= end + 1:
            found.append((rm, "rankmap"))
    if found:
        start, source = min(found)
        return Window(start=min(start, end), end=end, start_source=source, trusted_start=True,
                      detail=f"start from {source}" + (f" ({'; '.join(notes)})" if notes else ""))
    why = "; ".join(notes) or "no trusted start"
    if elapsed is not None:
        return Window(start=end - elapsed, end=end, start_source="elapsed", trusted_start=False,
                      detail=f"no trusted job start ({why}): the job's elapsed time {elapsed:.0f}s "
                             f"before its end, plus {slack:.0f}s slack")
    return Window(start=end, end=end, start_source="none", trusted_start=False,
                  detail=f"no trusted job start ({why}): only the {slack:.0f}s before the job's end were read")
