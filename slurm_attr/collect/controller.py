"""The controller side of a job's bundle: job.json, output tails, scheduler lines.

Run from EpilogSlurmctld (while slurmctld still knows the job) and again by the
analysis once accounting has the final state: on 22.05 the job is COMPLETING
inside the hook and its final state word is not visible there yet.
"""
from __future__ import annotations

import json
import os
import pwd
import re
import stat
import time
from datetime import datetime
from typing import Any

from .. import safefs, spool
from ..atomicfile import write_atomic
from ..waiting import wait_until
from . import provenance
from ..errors import SlurmError, UnsafePath
from ..slurm.base import SlurmAccess
from .jobstate import job_facts

# Daemon lines about the job that embed job-chosen text (provenance.py): kept, but apart.
UNTRUSTED_SCHEDULER = "untrusted.txt"



def tail_output(path: str, uid: int | None, cap: int) -> tuple[bytes, str, str]:
    """Tail of a job's stdout/stderr file: (data, status, detail).

    The path is the user's choice and the file the user's: open it without
    following links and only if the job's user owns it, so a job cannot make
    root copy someone else's file into a bundle it can read.
    """
    if not path or not os.path.isabs(path):
        return b"", "missing", "no path"
    try:
        fd = safefs.open_file(os.path.dirname(path), os.path.basename(path))
    except UnsafePath as err:
        return b"", "missing", str(err)
    try:
        # The owner of the very file we read (fstat, not a second lookup by name). Without a
        # known uid nothing is copied: root must not tail a file the user merely named.
        if uid is None or os.fstat(fd).st_uid != uid:
            return b"", "error", f"{path} is not owned by the job's user"
        res = safefs.read_fd(fd, cap, tail=True)
    except OSError as err:
        return b"", "error", str(err)
    finally:
        os.close(fd)
    status = "truncated" if res.truncated else "ok"
    return res.data, status, f"kept last {len(res.data)} of {res.size} bytes" if res.truncated else ""


def _write(path: str, data: bytes) -> None:
    """Root-only (0600), never through a link: job.json names the user, uid, account, job
    name and output path, which other users must not read (issue 10, item 5)."""
    write_atomic(path, data, mode=0o600, durable=False)


def scheduler_lines(log_paths: list[str], slurm_job_id: str, cap: int) -> list[str]:
    """Lines of daemon logs about this job (JobId=N, StepId=N.x, job N), bounded per file."""
    return [f"{name}: {line}" for name, line in _scheduler_raw(log_paths, slurm_job_id, cap)]


def split_scheduler_lines(log_paths: list[str], slurm_job_id: str, cap: int) -> tuple[list[str], list[str]]:
    """(trusted, untrusted) "<log name>: <line>" lines about this job.

    Trusted only when the whole message is a structural daemon form (provenance.py):
    slurmd/slurmstepd also log job-chosen text (output path, argv, names) under the
    job's [job.step] prefix, and such a line must never become a trusted symptom.
    """
    return SchedulerLogs(log_paths, cap).split(slurm_job_id)


# The tail of each daemon log read for a job's scheduler lines.
SCHEDULER_LOG_CAP = 16 << 20


def log_paths(spec: str) -> list[str]:
    """``[collect] scheduler_logs``: comma-separated paths or globs, each expanded in order."""
    import glob

    out: list[str] = []
    for item in (s.strip() for s in spec.split(",")):
        if item:
            out.extend(sorted(glob.glob(item)))
    return out


class SchedulerLogs:
    """The daemon logs' tails (``cap`` bytes each), read once and then asked for many jobs: a
    worker analysing a burst of jobs reads slurmctld.log once, not once per job."""

    def __init__(self, log_paths: list[str], cap: int):
        self.tails: list[tuple[str, bytes]] = []
        for path in log_paths:
            try:
                res = safefs.read_file(os.path.dirname(path) or "/", os.path.basename(path), cap, tail=True)
            except UnsafePath:
                continue
            self.tails.append((os.path.basename(path), res.data))

    def raw(self, slurm_job_id: str) -> list[tuple[str, str]]:
        pat = re.compile(rf"(?:JobId={slurm_job_id}\b|StepId={slurm_job_id}\.|\bjob[ _]?{slurm_job_id}\b|"
                         rf"\[{slurm_job_id}\.\w+\])", re.IGNORECASE)
        needle = slurm_job_id.encode()
        out: list[tuple[str, str]] = []
        for name, data in self.tails:
            at = data.find(needle)
            while at >= 0:  # only the lines that hold the id at all are split out and decoded
                start = data.rfind(b"\n", 0, at) + 1
                end = data.find(b"\n", at)
                end = len(data) if end < 0 else end
                line = safefs.decode(data[start:end][:4096])
                if pat.search(line):
                    out.append((name, line))
                at = data.find(needle, end)
        return out

    def split(self, slurm_job_id: str) -> tuple[list[str], list[str]]:
        """(trusted, untrusted): see split_scheduler_lines."""
        trusted: list[str] = []
        untrusted: list[str] = []
        for name, line in self.raw(slurm_job_id):
            ok, _why = provenance.classify_daemon_line(line)
            (trusted if ok else untrusted).append(f"{name}: {line}")
        return trusted, untrusted


def _scheduler_raw(log_paths: list[str], slurm_job_id: str, cap: int) -> list[tuple[str, str]]:
    return SchedulerLogs(log_paths, cap).raw(slurm_job_id)


def write_controller_part(bundle_dir: str, job: dict[str, Any], output_cap: int,
                          log_paths: list[str] | None = None, log_cap: int = SCHEDULER_LOG_CAP,
                          logs: SchedulerLogs | None = None) -> dict[str, Any]:
    """job.json, output/stdout|stderr tails and scheduler/slurm.log in bundle_dir (``logs``: the
    daemon logs already read for a batch of jobs, instead of ``log_paths``)."""
    spool.ensure_dir(bundle_dir)
    coverage: dict[str, Any] = {}
    outdir = os.path.join(bundle_dir, "output")
    paths = {"stdout": job.get("stdout_path"), "stderr": job.get("stderr_path")}
    if paths["stderr"] == paths["stdout"]:
        paths["stderr"] = None  # one file for both: keep it once
    for name, path in paths.items():
        if not path:
            continue
        data, status, detail = tail_output(path, job.get("uid"), output_cap)
        coverage[name] = {"status": status, "bytes": len(data), "detail": detail}
        # An empty output read whole is evidence too ("the program printed nothing"), unlike a
        # missing one: write it, so the analysis can tell the two apart.
        if data or status == "ok":
            spool.ensure_dir(outdir)
            _write(os.path.join(outdir, name), data)
    if (logs is not None or log_paths) and job.get("slurm_job_id"):
        logs = logs if logs is not None else SchedulerLogs(log_paths or [], log_cap)
        lines, untrusted = logs.split(str(job["slurm_job_id"]))
        spool.ensure_dir(os.path.join(bundle_dir, "scheduler"))
        _write(os.path.join(bundle_dir, "scheduler", "slurm.log"), ("\n".join(lines) + "\n").encode())
        coverage["scheduler"] = {"status": "ok", "lines": len(lines)}
        if untrusted:
            # Not *.log: the rules read scheduler/*.log as the trusted "scheduler" source.
            _write(os.path.join(bundle_dir, "scheduler", UNTRUSTED_SCHEDULER), ("\n".join(untrusted) + "\n").encode())
            coverage["scheduler_untrusted"] = {"status": "ok", "lines": len(untrusted),
                                               "detail": f"scheduler/{UNTRUSTED_SCHEDULER}"}
    job = dict(job)
    job["controller_collect"] = coverage
    # Who wrote each source (issue 10): the bundle says it itself wherever it is re-analysed.
    job["provenance"] = {k: provenance.describe(k) for k in
                         ("slurm", "scheduler", "scheduler_untrusted", "stdout", "stderr")}
    _write(os.path.join(bundle_dir, "job.json"), json.dumps(job, indent=1).encode())
    return job


def user_name(uid: int | None) -> str | None:
    if uid is None:
        return None
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return None


def fetch_job(slurm: SlurmAccess, job_id: str) -> dict[str, Any] | None:
    """job.json facts from slurmctld (+ accounting when it answers); None if unknown."""
    rec = slurm.show_job(job_id)
    if rec is None:
        return None
    try:
        sacct = slurm.sacct_job(job_id)
    except SlurmError:
        sacct = None
    facts = job_facts(rec, sacct)
    run = getattr(slurm, "run", None)
    if callable(run):
        try:
            facts = guard_imitated(facts, run("scontrol", "-o", "show", "job", job_id), job_id)
        except SlurmError:
            pass  # the record was just read; a second failure leaves the facts as they are
    return facts


# job.json fields that come from each trusted scontrol key (see provenance.imitated_keys).
_FACTS_OF_KEY = {"UserId": ("user", "uid"), "JobState": ("state", "state_source"),
                 "Reason": ("reason", "state", "state_source"), "ExitCode": ("exit_code", "signal", "state", "state_source"),
                 "StartTime": ("start_time",), "EndTime": ("end_time",), "RunTime": (),
                 "NodeList": ("nodes",), "Restarts": ("restart_count",), "BatchFlag": ("batch",),
                 "NumTasks": ("num_tasks",)}


def guard_imitated(facts: dict[str, Any], raw: str, job_id: str) -> dict[str, Any]:
    """Drop job.json fields whose scontrol key occurs more than once in the job's record.

    The job's name, comment, paths and command are printed in the same line as Slurm's
    own fields; a copy of "UserId=root(0)" or "Reason=NodeDown" in them would otherwise
    be read as Slurm's. What is dropped comes back from trusted places: uid/user from
    the hook's environment, state/exit from accounting (refresh_state), the window from
    the structural StartTime/EndTime (window.scontrol_times) when it is unambiguous.
    """
    from .window import scontrol_times

    lines = [ln for ln in raw.splitlines() if ln.startswith(f"JobId={job_id} ")]
    if not lines:
        return facts  # the record went away between the two reads
    # Two records for one job id: a newline in the job's own text started a second one.
    bad = provenance.imitated_keys(lines[0]) if len(lines) == 1 else set(provenance.SCONTROL_TRUSTED_KEYS)
    if not bad:
        return facts
    out = dict(facts)
    for key in sorted(bad):
        for name in _FACTS_OF_KEY.get(key, ()):
            out.pop(name, None)
    start, end, _elapsed, _why = scontrol_times(raw, job_id)
    if start is not None:
        out["start_time"] = datetime.fromtimestamp(start).astimezone().isoformat(timespec="seconds")
    if end is not None:
        out["end_time"] = datetime.fromtimestamp(end).astimezone().isoformat(timespec="seconds")
    out["imitated_fields"] = sorted(bad)
    return out


def wait_for_nodes(bundle_dir: str, nodes: list[str], deadline: float, poll: float = 0.2) -> list[str]:
    """Wait until every node's collect.json exists or the deadline passes; return the missing."""
    def missing() -> list[str]:
        return [n for n in nodes if not _is_file(os.path.join(bundle_dir, "nodes", n, "collect.json"))]

    return wait_until(missing, deadline - time.monotonic(), poll, f"the node parts of {bundle_dir}",
                      done=lambda left: not left).value


def wait_for_epilogs(slurm: Any, job_id: str, deadline: float, poll: float = 0.3) -> bool:
    """Without a bundle on the spool, a node's part can't say it is done; Slurm can: the job stays
    COMPLETING until every node's epilog (and so its fast path) has finished. Wait for that, or
    the deadline; True when it finished. A controller that does not answer (or no longer knows
    the job) ends the wait: there is nothing better to wait for."""
    def state() -> str:
        try:
            rec = slurm.show_job(job_id)
        except Exception:  # noqa: BLE001 - any backend error: stop waiting, analyse what there is
            return "unknown"
        if not rec or "COMPLETING" not in str(rec.get("JobState", "")).upper():
            return "finished"
        return "completing"

    got = wait_until(state, deadline - time.monotonic(), poll, f"the node epilogs of job {job_id}",
                     done=lambda s: s != "completing")
    return got.value == "finished"


def _is_file(path: str) -> bool:
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False
