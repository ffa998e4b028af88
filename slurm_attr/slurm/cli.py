"""Slurm through its command-line tools (scontrol, sacct, sacctmgr, sinfo).

Argument lists only (no shell), a timeout on every call, stderr captured and
carried in the typed error. Output formats are those of Slurm 22.05 and later:
``scontrol -o`` (one record per line, key=value), ``sacct -P``.
"""
from __future__ import annotations

import os
import re
import secrets
import subprocess
from typing import Any, Iterator

from ..errors import SlurmError, SlurmUnavailable
from .base import set_comments_each
from .cancel import cancel_target

# `scontrol -o show job` prints `Key=Value Key=Value ...`; values may hold spaces
# (Comment=, Command=), so split only where a new `Key=` starts.
_KEY_START = re.compile(r"(?:^|\s)([A-Z][A-Za-z0-9_:/.]*)=")

_UNAVAILABLE = (
    "Unable to contact slurm controller",
    "Connection refused",
    "Socket timed out",
    "slurmdbd: Connection",
    "Problem talking to the database",
    "Slurm accounting storage is disabled",
    "Zero Bytes were transmitted",
)

# sacct fields we read for one job.
SACCT_FIELDS = ("JobID", "JobIDRaw", "User", "Partition", "NodeList", "State", "ExitCode",
                "DerivedExitCode", "Start", "End", "Elapsed", "Timelimit", "AllocTRES")
# ... and for the jobs that ended in a window (the catch-up, pipeline/catchup.py): the hook's facts
# accounting has too. No job-chosen text (a name could hold the delimiter).
ENDED_FIELDS = SACCT_FIELDS + ("UID", "Account")
# Slurm's final states as sacct -s takes them (base.FINAL_STATES): for these, sacct selects the jobs
# whose end falls inside -S/-E.
ENDED_STATES = "BF,CA,CD,DL,F,NF,OOM,PR,TO"


def _sacct_rows(text: str, fields: tuple[str, ...] = SACCT_FIELDS) -> Iterator[dict[str, str]]:
    """``sacct -n -P -o FIELDS`` output as rows (lines of another shape skipped)."""
    for ln in text.splitlines():
        parts = ln.split("|")
        if len(parts) == len(fields):
            yield dict(zip(fields, parts))


def slurm_time(epoch: float) -> str:
    """sacct's -S/-E: local ``YYYY-MM-DDTHH:MM:SS``."""
    import time

    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(int(epoch)))


def parse_oneliner(line: str) -> dict[str, str]:
    """Parse one `scontrol -o` record into a dict."""
    out: dict[str, str] = {}
    matches = list(_KEY_START.finditer(line))
    for i, m in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(line)
        out[m.group(1)] = line[m.end():end].strip()
    return out


def parse_delimited_comments(text: str, delim: str) -> dict[str, str]:
    """Records `ID<d>comment<d>ID` (sacct -P --delimiter=<d>) -> {ID: comment}, in order;
    an id listed twice keeps its first record."""
    found: dict[str, str] = {}
    pos = 0
    while True:
        first = text.find(delim, pos)
        if first < 0:
            return found
        job = text[pos:first].strip()
        close = re.compile(re.escape(delim) + re.escape(job) + r"(?:\n|$)")
        m = close.search(text, first + len(delim))
        if m is None:
            return found
        if job not in found:
            found[job] = text[first + len(delim):m.start()]
        pos = m.end()


# slurmdbd's answers (24.11: the first; 26.05: the second) to a job modify that changed no row.
UNCHANGED_ANSWERS = ("Request didn't affect anything", "Data has not changed since time specified")

class CliSlurm:
    def __init__(self, slurm_bin: str = "/usr/bin", slurm_conf: str = "", timeout: float = 15.0,
                 comment_tool: str = ""):
        self.slurm_bin = slurm_bin
        self.slurm_conf = slurm_conf
        self.timeout = timeout
        self.comment_tool = comment_tool
        self._cluster: str | None = None

    # -- plumbing ---------------------------------------------------------------
    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["PATH"] = f"{self.slurm_bin}:{env.get('PATH', '/usr/bin:/bin')}"
        if self.slurm_conf:
            env["SLURM_CONF"] = self.slurm_conf
        return env

    def run(self, tool: str, *args: str) -> str:
        cmd = [os.path.join(self.slurm_bin, tool), *args]
        try:
            # Job-chosen text (names, comments, paths) need not be UTF-8: never fail on it.
            proc = subprocess.run(cmd, capture_output=True, encoding="utf-8", errors="replace",
                                  timeout=self.timeout, env=self._env(), stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired as err:
            raise SlurmUnavailable(f"{tool} timed out after {self.timeout:.0f}s", stderr=str(err.stderr or "")) from err
        except OSError as err:
            raise SlurmError(f"cannot run {cmd[0]}: {err.strerror}") from err
        if proc.returncode != 0:
            msg = (proc.stderr or proc.stdout).strip()
            cls = SlurmUnavailable if any(s in msg for s in _UNAVAILABLE) else SlurmError
            raise cls(f"{tool} {' '.join(args[:3])}: {msg or 'exit ' + str(proc.returncode)}",
                      stderr=proc.stderr, returncode=proc.returncode)
        return proc.stdout

    # -- jobs ---------------------------------------------------------------------
    def show_job_raw(self, job_id: str) -> str | None:
        """`scontrol -o show job` as printed (at most 1 MiB), None when unknown or Slurm does not
        answer: the node epilog reads the trusted start structurally from it (collect/window.py)."""
        try:
            return self.run("scontrol", "-o", "show", "job", job_id)[:1 << 20]
        except SlurmError:
            return None

    def show_job(self, job_id: str) -> dict[str, str] | None:
        try:
            out = self.run("scontrol", "-o", "show", "job", job_id)
        except SlurmError as err:
            if "Invalid job id" in str(err):
                return None
            raise
        lines = [ln for ln in out.splitlines() if ln.strip()]
        # An array job id lists every task; the caller asked for this exact one.
        for ln in lines:
            rec = parse_oneliner(ln)
            if rec.get("JobId") == job_id or f"{rec.get('ArrayJobId')}_{rec.get('ArrayTaskId')}" == job_id:
                return rec
        return parse_oneliner(lines[0]) if lines else None

    def requeue(self, job_id: str, expedite: bool = False) -> None:
        # No Slurm up to 25.11 has a requeue option that expedites: 25.11's expedited requeue is
        # chosen at submission (--requeue=expedite) and carried out by slurmctld itself; a job it
        # requeued and held (its epilogs all passed: our fast path drains and exits 0) waits in
        # REQUEUE_HOLD, and `release` lets it run.
        if expedite:
            self.run("scontrol", "release", job_id)
        else:
            self.run("scontrol", "requeue", job_id)

    def exclude_nodes(self, job_id: str, nodes: str) -> None:
        self.run("scontrol", "update", f"JobId={job_id}", f"ExcNodeList={nodes}")

    def submit_batch(self, command: str, opts: list[str]) -> str:
        out = self.run("sbatch", "--parsable", *opts, f"--wrap={command}").strip()
        job_id = out.split(";")[0]
        if not job_id.isdigit():
            raise SlurmError(f"sbatch: no job id in {out[:200]!r}")
        return job_id

    def cancel_job(self, job_id: str, uid: int | None, started: float) -> str:
        """SlurmAccess.cancel_job: the record re-read, checked (cancel.cancel_target), then
        scancel of exactly the task or job it names."""
        target = cancel_target(self.show_job(job_id), job_id, uid, started)
        self.run("scancel", target)
        return target

    def sacct_job(self, job_id: str) -> dict[str, str] | None:
        out = self.run("sacct", "-n", "-P", "-X", "-j", job_id, "-o", ",".join(SACCT_FIELDS))
        return next(_sacct_rows(out), None)

    def sacct_jobs(self, job_ids: list[str]) -> dict[str, dict[str, str]]:
        """sacct_job for many jobs, one sacct per 200 ids: {asked id: row} for the ids accounting has."""
        out: dict[str, dict[str, str]] = {}
        for at in range(0, len(job_ids), 200):  # bounded argument length per call
            chunk = job_ids[at:at + 200]
            text = self.run("sacct", "-n", "-P", "-X", "-j", ",".join(chunk), "-o", ",".join(SACCT_FIELDS))
            for row in _sacct_rows(text):
                for k in (row["JobID"], row["JobIDRaw"]):
                    if k in chunk and k not in out:
                        out[k] = row
        return out

    def ended_jobs(self, start: float, end: float) -> list[dict[str, str]]:
        """Every user's jobs (allocations, no steps) that ended between ``start`` and ``end``
        (epoch seconds), in one sacct: rows of ENDED_FIELDS."""
        text = self.run("sacct", "-a", "-X", "-n", "-P", "-S", slurm_time(start), "-E", slurm_time(end),
                        "-s", ENDED_STATES, "-o", ",".join(ENDED_FIELDS))
        return list(_sacct_rows(text, ENDED_FIELDS))

    def alloc_tres(self, raw_ids: list[str]) -> dict[str, str]:
        """{JobIDRaw: AllocTRES} for finished jobs (the pyslurm backend's rows lack it: its
        db.Job keeps the TRES string as ids only)."""
        out: dict[str, str] = {}
        for at in range(0, len(raw_ids), 200):  # bounded argument length per call
            chunk = raw_ids[at:at + 200]
            for ln in self.run("sacct", "-n", "-P", "-X", "-j", ",".join(chunk), "-o", "JobIDRaw,AllocTRES").splitlines():
                jid, _, tres = ln.partition("|")
                if jid in chunk:
                    out[jid] = tres
        return out

    def job_comment(self, job_id: str, field: str) -> str | None:
        return self.job_comments([job_id], field).get(job_id)

    def job_comments(self, job_ids: list[str], field: str) -> dict[str, str | None]:
        """Comment/AdminComment of several finished jobs, each whole (newlines and '|' kept).

        `sacct -P` prints a multi-line comment over several lines, and the user can type
        any delimiter into it. So each record is `ID<d>comment<d>ID` with a delimiter drawn
        at random per call (the user cannot guess it) and the job id repeated after the
        comment: a record ends only at `<d>ID` followed by the end of a line.
        """
        out: dict[str, str | None] = {j: None for j in job_ids}
        if not job_ids:
            return out
        delim = f"^{secrets.token_hex(6)}^"
        for at in range(0, len(job_ids), 200):  # bounded argument length per call
            chunk = job_ids[at:at + 200]
            text = self.run("sacct", "-n", "-P", "-X", f"--delimiter={delim}", "-j", ",".join(chunk),
                            "-o", f"JobIDRaw,{field},JobIDRaw")
            found = parse_delimited_comments(text, delim)
            if len(chunk) == 1 and found and chunk[0] not in found:
                # An array task asked for as A_T: sacct prints its own numeric JobIDRaw.
                found = {chunk[0]: next(iter(found.values()))}
            out.update({j: c for j, c in found.items() if j in out})
        return out

    def cluster_name(self) -> str:
        if self._cluster is None:
            out = self.run("scontrol", "show", "config")
            m = re.search(r"^ClusterName\s*=\s*(\S+)", out, re.MULTILINE)
            if not m:
                raise SlurmError("scontrol show config: no ClusterName")
            self._cluster = m.group(1)
        return self._cluster

    def set_job_comment(self, job_id: str, field: str, text: str) -> None:
        if self.comment_tool and os.access(self.comment_tool, os.X_OK):
            self._set_comment_api(job_id, field, text)
            return
        # Fallback: sacctmgr lowercases the value on 22.05 (quoted or not). The quotes
        # are sacctmgr's own syntax (no shell here); comment.py keeps quotes out of the text.
        out = self.run("sacctmgr", "-i", "modify", "job", "where", f"jobid={job_id}", "set",
                       f'{field}="{text}"')
        if "Nothing modified" in out or "Nothing to modify" in out:
            raise SlurmUnavailable(f"accounting has no record of job {job_id} yet")

    def set_job_comments(self, items: list[tuple[str, str, str]]) -> dict[str, SlurmError | None]:
        """set_job_comment for many (job id, field, text) over one slurmdbd connection
        (`sattr-comment --batch`): {job id: None when written, else the error}. Without the
        tool, one sacctmgr each. A job the tool never reached (slurmdbd lost mid-way) gets
        SlurmUnavailable: it stays queued. "Unchanged" (24.11+) counts as written: the caller
        reads every field back and tells an unchanged value from a job accounting lacks."""
        out: dict[str, SlurmError | None] = {}
        if not items:
            return out
        if not (self.comment_tool and os.access(self.comment_tool, os.X_OK)):
            return set_comments_each(self, items)
        asked = {job_id for job_id, _f, _t in items}
        # JOBID or A_T as given: an array task must be named A_T (see comment._write_field)
        payload = b"".join(f"{j}\0{f}\0{t}\0".encode() for j, f, t in items)
        cmd = [self.comment_tool, "--batch", self.cluster_name()]
        try:
            proc = subprocess.run(cmd, input=payload, capture_output=True, env=self._env(),
                                  timeout=min(300.0, self.timeout + 0.5 * len(items)))
        except subprocess.TimeoutExpired as err:
            raise SlurmUnavailable(f"sattr-comment --batch timed out ({len(items)} jobs)") from err
        except OSError as err:
            raise SlurmError(f"cannot run {cmd[0]}: {err.strerror}") from err
        err_text = proc.stderr.decode(errors="replace").strip()
        if proc.returncode == 3:
            raise SlurmUnavailable(f"sattr-comment: {err_text}", stderr=err_text, returncode=3)
        for line in proc.stdout.decode(errors="replace").splitlines():
            job_id, _sp, rest = line.partition(" ")
            code, _sp, msg = rest.partition(" ")
            if job_id not in asked or not code.isdigit():
                continue
            rc = int(code)
            if rc == 0 or (rc == 5 and any(u in msg for u in UNCHANGED_ANSWERS)):
                out[job_id] = None
            elif rc == 4:
                out[job_id] = SlurmUnavailable(f"accounting has no record of job {job_id} yet")
            elif rc == 3:
                out[job_id] = SlurmUnavailable(f"sattr-comment: {msg}", stderr=msg, returncode=3)
            else:
                out[job_id] = SlurmError(f"sattr-comment: {msg or 'exit ' + code}", stderr=msg, returncode=rc)
        for job_id, _f, _t in items:
            out.setdefault(job_id, SlurmUnavailable(f"sattr-comment stopped before job {job_id}"
                                                    f"{': ' + err_text[:200] if err_text else ''}"))
        return out

    def _set_comment_api(self, job_id: str, field: str, text: str) -> None:
        cmd = [self.comment_tool, self.cluster_name(), job_id, field]  # A_T names one array task
        try:
            proc = subprocess.run(cmd, input=text, capture_output=True, text=True, timeout=self.timeout,
                                  env=self._env())
        except subprocess.TimeoutExpired as err:
            raise SlurmUnavailable(f"sattr-comment timed out after {self.timeout:.0f}s") from err
        except OSError as err:
            raise SlurmError(f"cannot run {cmd[0]}: {err.strerror}") from err
        msg = (proc.stderr or "").strip()
        if proc.returncode == 4:
            raise SlurmUnavailable(f"accounting has no record of job {job_id} yet")
        if proc.returncode == 3:
            raise SlurmUnavailable(f"sattr-comment: {msg}", stderr=msg, returncode=3)
        if proc.returncode != 0 and any(u in msg for u in UNCHANGED_ANSWERS):
            # Slurm 24.11+ answers a modify that changed no row this way, where 22.05 said
            # "nothing modified" (exit 4): either the value is already there, or accounting has
            # no record of the job yet.
            if self.job_comment(job_id, field) == text:
                return
            raise SlurmUnavailable(f"accounting has no record of job {job_id} yet")
        if proc.returncode != 0:
            raise SlurmError(f"sattr-comment: {msg or 'exit ' + str(proc.returncode)}", stderr=msg,
                             returncode=proc.returncode)

    # -- nodes ----------------------------------------------------------------------
    def show_node(self, node: str) -> dict[str, str] | None:
        try:
            out = self.run("scontrol", "-o", "show", "node", node)
        except SlurmError as err:
            if "not found" in str(err).lower():
                return None
            raise
        lines = [ln for ln in out.splitlines() if ln.strip()]
        return parse_oneliner(lines[0]) if lines else None

    def nodes(self) -> list[dict[str, Any]]:
        out = self.run("scontrol", "-o", "show", "node")
        recs = []
        for ln in out.splitlines():
            if ln.strip():
                rec = parse_oneliner(ln)
                recs.append(rec)
        return recs

    def reasons(self) -> list[Any]:
        """``sinfo -R`` with when each reason was set (%H): the breaker's count (slurmstate.py)."""
        from ..slurmstate import parse_sinfo_reasons

        return parse_sinfo_reasons(self.run("sinfo", "-R", "-h", "-o", "%N|%H|%E"))

    def drain(self, node: str, reason: str) -> None:
        self.run("scontrol", "update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}")

    def resume(self, node: str) -> None:
        self.run("scontrol", "update", f"NodeName={node}", "State=RESUME")

    def reboot(self, node: str, reason: str, nextstate: str = "DOWN") -> None:
        self.run("scontrol", "reboot", "ASAP", f"nextstate={nextstate}", f"reason={reason}", node)
