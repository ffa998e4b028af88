"""Slurm through pyslurm (libslurm/libslurmdb in-process), behind the same methods as cli.CliSlurm.

Why: one RPC instead of a process per question (sacct, sacctmgr, scontrol each start,
read slurm.conf and authenticate), and the accounting Comment written through
``slurmdb_job_modify`` with its case kept (sacctmgr 22.05 lowercases it) without the
separate ``sattr-comment`` tool.

Records come back in the CLI backend's shapes (``sacct -P`` fields, ``scontrol -o``
keys), so every caller and parser stays as it is. What pyslurm does not cover the same
way is asked of the CLI backend it wraps: ``scontrol show job`` (its raw line is what the
provenance checks read), reboots, array-task comments (pyslurm's
job filter cannot name one task), and any call where pyslurm itself breaks (an API or
ABI surprise raises something other than its RPCError).

A PySlurm release line works only with the Slurm major.minor it was built for; ``load``
checks that before anything is used, and ``select.py`` falls back to the CLI otherwise.
"""
from __future__ import annotations

import json
import logging
import os
import select
import signal
import time
from typing import Any, Callable

from ..errors import SlurmError, SlurmUnavailable
from .base import FINAL_STATES
from .cli import CliSlurm
from .outages import OUTAGES
from .pyslurm_rows import attr, node_record, sacct_row

log = logging.getLogger("slurm_attr")

# slurmdbd's answer when no job row matched (not in accounting yet): the queue retries it.
_NOTHING = "Nothing was modified"
# libslurm's own wording when a daemon did not answer (slurm_strerror texts).
_UNREACHABLE = ("Unable to contact slurm controller", "Connection refused", "Socket timed out",
                "Zero Bytes were transmitted", "Failed to open", "Unable to connect to database",
                "Communication connection failure",
                # pyslurm's own words when libslurmdb returned nothing (slurmdbd away or restarting)
                "Failed to get Jobs from slurmdbd", "Failed to open onnection to slurmdbd")

_loaded: dict[str, Any] = {}  # the one pyslurm this process initialised, and with which slurm.conf


def release_of(version: str) -> tuple[int, int] | None:
    """pyslurm's ``22.5.3`` / Slurm's ``22.05.8`` -> (22, 5); None when unreadable."""
    parts = (version or "").strip().split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return None


def slurm_release(slurm_bin: str, slurm_conf: str) -> tuple[int, int] | None:
    """The installed Slurm's release from ``sinfo -V`` (libslurm has no call that says it:
    ``slurm_api_version()`` is the library's API age, e.g. 38 for 22.05). Asked before pyslurm is
    imported: a release line built for other headers must not even be loaded."""
    import subprocess

    env = dict(os.environ, SLURM_CONF=slurm_conf)
    try:
        out = subprocess.run([os.path.join(slurm_bin, "sinfo"), "-V"], capture_output=True, text=True, timeout=10,
                             env=env, stdin=subprocess.DEVNULL).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    words = out.split()
    return release_of(words[-1]) if words else None


def load(slurm_conf: str, slurm_bin: str = "/usr/bin") -> tuple[Any, str]:
    """(the pyslurm module, "") when it is installed and its release line is the installed
    Slurm's, else (None, why). Initialises libslurm once per process, with ``slurm_conf``."""
    if "mod" in _loaded:
        if slurm_conf and _loaded["conf"] != slurm_conf:
            return None, f"pyslurm already initialised with {_loaded['conf']}"
        return _loaded["mod"], ""
    if "why" in _loaded:
        return None, _loaded["why"]
    mod, why = _import(slurm_conf, slurm_bin)
    if mod is None:
        _loaded["why"] = why
    else:
        _loaded.update(mod=mod, conf=slurm_conf)
    return mod, why


def _import(slurm_conf: str, slurm_bin: str = "/usr/bin") -> tuple[Any, str]:
    import importlib.util

    if importlib.util.find_spec("pyslurm") is None:
        return None, "pyslurm is not installed"
    try:
        from importlib.metadata import version as dist_version
        have = release_of(dist_version("pyslurm"))
    except Exception as err:  # noqa: BLE001 - any broken metadata means: do not touch it
        return None, f"pyslurm's version is unreadable: {err}"
    # libslurm's slurm_init() exits the whole process (fatal) when it cannot read its
    # config: never import pyslurm without a readable one (the node epilog must survive).
    conf = slurm_conf or os.environ.get("SLURM_CONF") or "/etc/slurm/slurm.conf"
    if not os.access(conf, os.R_OK):
        return None, f"{conf} is not readable"
    running = slurm_release(slurm_bin, conf)
    if have is None or running is None or have != running:
        show = ".".join(map(str, have or ())) or "?"
        return None, f"pyslurm {show} does not match Slurm {'.'.join(map(str, running or ())) or '?'}"
    os.environ["SLURM_CONF"] = conf  # libslurm reads it at import, as the CLI tools do
    try:
        import pyslurm  # noqa: F401 - initialises libslurm
        import pyslurm.db  # noqa: F401
    except Exception as err:  # noqa: BLE001 - ImportError (other libslurm soname), RPCError at init, ...
        return None, f"pyslurm does not import: {type(err).__name__}: {err}"[:300]
    return pyslurm, ""


class PyslurmSlurm:
    """SlurmAccess through pyslurm; ``cli`` answers what pyslurm does not (see the top)."""

    name = "pyslurm"
    # Accounting calls run in a child under the timeout (see _bounded); a test's in-process
    # stand-in for pyslurm turns it off to see the calls.
    isolate = True

    def __init__(self, mod: Any, cli: CliSlurm):
        self.ps = mod
        self.cli = cli
        self.timeout = cli.timeout

    # -- plumbing -------------------------------------------------------------------
    def _call(self, what: str, fn: Callable[[], Any], fallback: Callable[[], Any], bounded: bool = False) -> Any:
        """fn() with pyslurm's errors typed as the CLI's; anything else pyslurm raises is a
        surprise of the binding itself: logged, and the CLI answers instead. ``bounded``: run
        it in a child under the backend's timeout (accounting calls; fn's result is JSON).
        A failing binding is logged once per outage (``OUTAGES``), not once per call."""
        kind = "accounting" if bounded else "controller"
        try:
            got = self._bounded(what, fn) if bounded and self.isolate else fn()
        except self.ps.RPCError as err:
            msg = str(err)
            cls = SlurmUnavailable if any(s in msg for s in _UNREACHABLE) else SlurmError
            raise cls(f"pyslurm {what}: {msg}") from err
        except (SlurmError, MemoryError):
            raise
        except Exception as err:  # noqa: BLE001 - the binding, not Slurm, failed: use the CLI
            OUTAGES.failed(kind, what, err)
            return fallback()
        OUTAGES.worked(kind)
        return got

    def _bounded(self, what: str, fn: Callable[[], Any]) -> Any:
        """fn() in a forked child, given up after ``self.timeout``. A slurmdbd that stopped
        answering blocks libslurm inside C, where neither SIGALRM nor a thread can end the call
        (the hooks' analysis would hang past its own limit); a child can be killed."""
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # child: one answer as JSON on the pipe, then out without cleanup
            code = 0
            try:
                os.close(r)
                try:
                    out: dict[str, Any] = {"ok": fn()}
                except self.ps.RPCError as err:
                    out = {"rpc": str(err)}
                except SlurmUnavailable as err:
                    out = {"unavailable": str(err)}
                except SlurmError as err:
                    out = {"slurm": str(err)}
                except BaseException as err:  # noqa: BLE001 - reported to the parent
                    out = {"other": f"{type(err).__name__}: {err}"}
                view = memoryview(json.dumps(out).encode())
                while view:
                    view = view[os.write(w, view):]
            except BaseException:  # noqa: BLE001 - nothing may escape a forked child
                code = 1
            os._exit(code)
        os.close(w)
        buf = bytearray()
        deadline = time.monotonic() + self.timeout
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    os.kill(pid, signal.SIGKILL)
                    raise SlurmUnavailable(f"pyslurm {what}: no answer in {self.timeout:.0f}s")
                ready, _, _ = select.select([r], [], [], left)
                if ready:
                    chunk = os.read(r, 1 << 16)
                    if not chunk:
                        break
                    buf += chunk
        finally:
            os.close(r)
            os.waitpid(pid, 0)
        try:
            out = json.loads(bytes(buf))
        except ValueError:
            out = {"other": "the child gave no answer"}
        if "ok" in out:
            return out["ok"]
        if "rpc" in out:
            raise self.ps.RPCError(out["rpc"])
        if "unavailable" in out:
            raise SlurmUnavailable(out["unavailable"])
        if "slurm" in out:
            raise SlurmError(out["slurm"])
        raise RuntimeError(out.get("other", "unknown failure"))

    def run(self, tool: str, *args: str) -> str:
        return self.cli.run(tool, *args)

    # -- jobs -----------------------------------------------------------------------
    def show_job(self, job_id: str) -> dict[str, str] | None:
        return self.cli.show_job(job_id)

    def cancel_job(self, job_id: str, uid: int | None, started: float) -> str:
        # The check reads scontrol's record (show_job is the CLI's here too); one path, one test.
        return self.cli.cancel_job(job_id, uid, started)

    def submit_batch(self, command: str, opts: list[str]) -> str:
        return self.cli.submit_batch(command, opts)  # sbatch's option handling is the CLI's

    def requeue(self, job_id: str, expedite: bool = False) -> None:
        self.cli.requeue(job_id, expedite=expedite)  # rare, and judged by re-reading: one path

    def exclude_nodes(self, job_id: str, nodes: str) -> None:
        self.cli.exclude_nodes(job_id, nodes)

    def _db_jobs(self, job_ids: list[str]) -> dict[str, Any]:
        """{asked id: pyslurm.db.Job} for ids accounting knows (A_T: that array task)."""
        base = sorted({int(j.split("_")[0]) for j in job_ids})
        found = self.ps.db.Jobs.load(self.ps.db.JobFilter(ids=base))
        out: dict[str, Any] = {}
        for job in found.values():
            arr, task = attr(job, "array_id"), attr(job, "array_task_id")
            keys = [str(job.id)] + ([f"{arr}_{task}"] if arr and task is not None else [])
            for k in keys:
                if k in job_ids and k not in out:
                    out[k] = job
        return out

    @staticmethod
    def _plain(job_ids: list[str]) -> bool:
        return all(j.replace("_", "", 1).isdigit() for j in job_ids)

    def sacct_job(self, job_id: str) -> dict[str, str] | None:
        if not self._plain([job_id]):
            return self.cli.sacct_job(job_id)

        def get() -> dict[str, str] | None:
            job = self._db_jobs([job_id]).get(job_id)
            return self._with_tres({job_id: sacct_row(job)})[job_id] if job is not None else None
        return self._call("db.Jobs.load", get, lambda: self.cli.sacct_job(job_id), bounded=True)

    def sacct_jobs(self, job_ids: list[str]) -> dict[str, dict[str, str]]:
        if not job_ids or not self._plain(job_ids):
            return self.cli.sacct_jobs(job_ids)

        def get() -> dict[str, dict[str, str]]:
            out: dict[str, dict[str, str]] = {}
            for at in range(0, len(job_ids), 200):
                out.update({k: sacct_row(job) for k, job in self._db_jobs(job_ids[at:at + 200]).items()})
            return self._with_tres(out)
        return self._call("db.Jobs.load", get, lambda: self.cli.sacct_jobs(job_ids), bounded=True)

    def ended_jobs(self, start: float, end: float) -> list[dict[str, str]]:
        # Once a minute at most, and the window's filter is sacct's own: the CLI's one path.
        return self.cli.ended_jobs(start, end)

    def _with_tres(self, rows: dict[str, dict[str, str]]) -> dict[str, dict[str, str]]:
        """AllocTRES for the rows from accounting's CLI, one sacct per 200 jobs: pyslurm's
        db.Job holds it as TRES ids only. Asked only for finished jobs (what the GPU-hours
        count needs), so polling a job until it ends costs no extra call; left empty (GPUs
        unknown) when sacct fails."""
        ids = sorted({r["JobIDRaw"] for r in rows.values() if r["State"].split(" ")[0] in FINAL_STATES})
        try:
            tres = self.cli.alloc_tres(ids) if ids else {}
        except SlurmError:
            tres = {}
        for r in rows.values():
            r["AllocTRES"] = tres.get(r["JobIDRaw"], "")
        return rows

    def job_comment(self, job_id: str, field: str) -> str | None:
        return self.job_comments([job_id], field).get(job_id)

    def job_comments(self, job_ids: list[str], field: str) -> dict[str, str | None]:
        if not job_ids or not self._plain(job_ids):
            return self.cli.job_comments(job_ids, field)
        prop = "admin_comment" if field == "AdminComment" else "comment"

        def get() -> dict[str, str | None]:
            out: dict[str, str | None] = {j: None for j in job_ids}
            for at in range(0, len(job_ids), 200):
                for k, job in self._db_jobs(job_ids[at:at + 200]).items():
                    # A job in accounting with no comment reads as "", as sacct prints it.
                    out[k] = str(attr(job, prop) or "")
            return out
        return self._call("db.Jobs.load", get, lambda: self.cli.job_comments(job_ids, field), bounded=True)

    def set_job_comment(self, job_id: str, field: str, text: str) -> None:
        if not job_id.isdigit():
            # pyslurm's filter selects whole arrays only: one task's comment goes the CLI way.
            self.cli.set_job_comment(job_id, field, text)
            return
        prop = "admin_comment" if field == "AdminComment" else "comment"
        db = self.ps.db

        def put() -> None:
            try:
                db.Jobs.modify(db.JobFilter(ids=[int(job_id)]), db.Job(**{prop: text}))
            except self.ps.RPCError as err:
                if _NOTHING in str(err):
                    raise SlurmUnavailable(f"accounting has no record of job {job_id} yet") from err
                raise
        self._call("db.Jobs.modify", put, lambda: self.cli.set_job_comment(job_id, field, text), bounded=True)

    # -- nodes ----------------------------------------------------------------------
    def show_node(self, node: str) -> dict[str, str] | None:
        def get() -> dict[str, str] | None:
            try:
                return node_record(self.ps.Node.load(node))
            except self.ps.RPCError as err:
                msg = str(err).lower()
                if "does not exist" in msg or "invalid node name" in msg:
                    return None
                raise
        return self._call("Node.load", get, lambda: self.cli.show_node(node))

    def nodes(self) -> list[dict[str, Any]]:
        return self._call("Nodes.load", lambda: [node_record(n) for n in self.ps.Nodes.load().values()],
                          self.cli.nodes)

    def reasons(self) -> list[Any]:
        """``sinfo -R``'s rows (node, when the reason was set, reason) from the same node records."""
        from ..slurmstate import ReasonRow

        def get() -> list[Any]:
            return [ReasonRow(str(n.name), float(attr(n, "reason_time") or 0) or None, str(attr(n, "reason")))
                    for n in self.ps.Nodes.load().values() if attr(n, "reason")]
        return self._call("Nodes.load", get, self.cli.reasons)

    def drain(self, node: str, reason: str) -> None:
        self._call("Node.modify", lambda: self.ps.Node(node).modify(self.ps.Node(state="DRAIN", reason=reason)),
                   lambda: self.cli.drain(node, reason))

    def resume(self, node: str) -> None:
        self._call("Node.modify", lambda: self.ps.Node(node).modify(self.ps.Node(state="RESUME")),
                   lambda: self.cli.resume(node))

    def reboot(self, node: str, reason: str, nextstate: str = "DOWN") -> None:
        self.cli.reboot(node, reason, nextstate=nextstate)

    def cluster_name(self) -> str:
        return self.cli.cluster_name()
