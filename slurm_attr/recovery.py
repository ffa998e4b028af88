"""The recovery action after a drain: what the GPU's driver or the Xid catalog says the node
needs (issue: closing the loop through Slurm), carried out where the site turned it on.

A symptom's ``action`` (rules/xid.tsv, or Xid 154's own text: "GPU Reset Required", "Node
Reboot Required", "Drain and Reset") maps to:

- ``reboot`` with ``[actions] reboot``: ``scontrol reboot ASAP nextstate=RESUME reason="SATTR: ..."``;
  Slurm runs the site's RebootProgram once the node is idle and resumes it when it registers
  again (a node that never comes back goes DOWN: Slurm's ResumeTimeout);
- ``reset`` with ``[actions] reset_command``: the command, run here with the node, the GPU and
  the reason; the node stays drained (a reset GPU is proven by the diagnostic, not by us);
- ``drain`` or no site setting: nothing beyond the drain; ``none`` ("restart the application"):
  nothing at all (such symptoms never drain).

Each action follows a drain of ours for the same job and node (the breaker counted that drain),
runs at most once per job and node, and none runs while the breaker is tripped. Every decision is
returned as a row for the store (``recoveries``), carried out or not.
"""
from __future__ import annotations

import logging
import os
import re
import shlex
import signal
import subprocess
import time
from typing import Any

from .breaker import Breaker
from .config import Config
from .errors import SlurmError

log = logging.getLogger("slurm_attr")

# The command's answer is kept for the record; it is the site's own tool, but bounded all the same.
OUTPUT_MAX = 16 * 1024
_PCI = re.compile(r"(?:[0-9A-Fa-f]{4,8}:)?[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-7])?")


def wanted(cfg: Config, action: str) -> str:
    """The recovery this catalog action gets under the site's settings: reboot, reset or ""."""
    if action == "reboot" and cfg.actions.reboot:
        return "reboot"
    if action == "reset" and cfg.actions.reset_command:
        return "reset"
    return ""


def argv(template: str, node: str, gpu: str, reason: str) -> list[str] | None:
    """The site's command as an argument vector: split first, then %n/%g/%r filled per argument,
    so that no value can become a second argument or shell text. None when the command names the
    GPU (%g) and the symptom has no PCI address: an empty GPU argument may mean "every GPU"."""
    if "%g" in template and not _PCI.fullmatch(gpu or ""):
        return None
    values = {"%n": node, "%g": gpu or "", "%r": reason}
    return [re.sub(r"%[ngr]", lambda m: values[m.group(0)], part) for part in shlex.split(template)]


def run_command(args: list[str], timeout_s: float) -> tuple[int, str]:
    """(exit status, the output's tail); -9 when it ran past ``timeout_s`` (its whole process
    group is killed: a command that forks must not outlive its budget)."""
    try:
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    except OSError as err:
        return 127, f"cannot run {args[0]!r}: {err.strerror}"
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        return -9, f"killed after {timeout_s:.0f}s; " + out[-OUTPUT_MAX:].decode("utf-8", "replace")
    return proc.returncode, out[-OUTPUT_MAX:].decode("utf-8", "replace")


def _row(job_id: str, node: str, gpu: str, kind: str, command: str, rc: int, ok: bool, detail: str) -> dict[str, Any]:
    return {"job_id": job_id, "node": node, "gpu": gpu or "", "kind": kind, "command": command[:500],
            "rc": rc, "ok": int(ok), "detail": detail[-2000:]}


def carry_out(cfg: Config, slurm: Any, store: Any, job_id: str, node: str, gpu: str, kind: str,
              reason: str) -> dict[str, Any]:
    """One recovery for a node we drained for ``job_id``; the row to record (``ok`` 0 when not done)."""
    if any(r["node"] == node and r["kind"] == kind for r in store.recoveries(job_id)):
        return _row(job_id, node, gpu, kind, "", 0, False, "already done for this job")
    if Breaker(store, cfg.drain).tripped():
        return _row(job_id, node, gpu, kind, "", 0, False, "circuit breaker")
    if cfg.drain.dry_run:
        return _row(job_id, node, gpu, kind, "", 0, False, "dry-run")
    if kind == "reboot":
        cmd = f"scontrol reboot ASAP nextstate=RESUME reason={reason!r} {node}"
        try:
            slurm.reboot(node, reason, nextstate="RESUME")
        except SlurmError as err:
            # No RebootProgram, or a Slurm that refuses: the node stays drained, which is safe.
            return _row(job_id, node, gpu, kind, cmd, 1, False, f"slurm refused: {err}")
        return _row(job_id, node, gpu, kind, cmd, 0, True, "reboot requested; Slurm resumes the node when it is back")
    args = argv(cfg.actions.reset_command, node, gpu, reason)
    if args is None:
        return _row(job_id, node, gpu, kind, cfg.actions.reset_command, 0, False, "no GPU address for %g")
    t0 = time.monotonic()
    rc, out = run_command(args, cfg.actions.action_timeout_s)
    took = time.monotonic() - t0
    log.info("reset of %s %s: rc %s in %.1fs", node, gpu, rc, took)
    return _row(job_id, node, gpu, kind, shlex.join(args), rc, rc == 0, f"rc {rc} in {took:.1f}s: {out.strip()}")
