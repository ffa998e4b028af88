"""A node's diagnostic before it goes back into service: `sattr undrain --diag` and auto_undrain.

The site's command (``[actions] diag_command``, e.g. ``ssh %n dcgmi diag -r 3``) runs on the controller,
as root, once per node; exit 0 within ``diag_timeout_s`` is a pass and only a pass resumes. Every run is
in the ``diags`` table (command, rc, took_s, the output's tail), every resume or refusal in ``undrains``.
How it runs, and why:
- Without a shell. The template is split as a shell would split words (shlex), then ``%n`` is
  replaced inside each word by the node's name, which must look like a Slurm node name: a name
  can neither add words nor inject a command. A site that needs a pipe or ``&&`` says so in
  the command itself: ``sh -c 'ssh "$1" dcgmi diag -r 3 | tee -a /var/log/diag' sh %n``.
- In a session of its own (its process group), killed whole with SIGKILL at the timeout, and
  any leftovers killed when it ends: nothing it started outlives the run.
- Its output (stdout and stderr together) is untrusted text of any size: it is read as it comes
  and only the last ``OUTPUT_TAIL_BYTES`` are kept; readers show it through jobtext.

auto_undrain (``sattr undrain --auto``; the periodic path, ``sattr retry``'s timer and the workers,
starts it: ``maybe_start_auto``) resumes a node we drained when ``auto_decision`` allows it and the
diagnostic passes.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import re
import select
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from . import drain, turns
from .config import Config
from .errors import ConfigError, NotFound, SattrError, SlurmError
from .slurmstate import NodeState, SlurmView, reason_job

log = logging.getLogger("slurm_attr")

# The diagnostic's output is untrusted and unbounded: this much of its end is kept (memory, store).
OUTPUT_TAIL_BYTES = 64 * 1024
# After the command exits, children it left behind may hold its output open this long; then
# the group is killed (a backgrounded helper must not keep the run, or the timer, waiting).
EXIT_GRACE_S = 2.0
_NODE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_NOTE = "[sattr: "  # our own last line in a stored output tail (timeout, could not start)

TRIGGER_MANUAL = "manual"
TRIGGER_AUTO = "auto"
AUTO_ACTOR = "sattr auto_undrain"

# auto_undrain's policy, as data (auto_decision applies it). A drain whose verdict holds one of
# these symptoms on the node came from a GPU that failed again and again (a "lemon",
# rules/gpu_recurrence.py, rules/train_sdc.py): a passing diagnostic has already been wrong about
# it, so only a person may put it back. History evidence marks any other recurrence rule so too.
RECURRENCE_SYMPTOMS = frozenset({"gpu.xid_recurrent", "train.sdc_recurrent"})
RECURRENCE_EVIDENCE_SOURCE = "history"
# One automatic chance per node in this window (the longest recurrence window of the rules):
# a node that failed its automatic diagnostic, or came back automatically and was drained
# again, waits for a person at every drain until the window has passed.
ONE_CHANCE_WINDOW_S = 30 * 86400.0
# Jobs still run on a draining node: a diagnostic (dcgmi -r 3 stresses the GPUs) would hurt them;
# a pending reboot or power action is Slurm's to finish first.
BUSY_WORDS = frozenset({"ALLOCATED", "ALLOC", "MIXED", "MIX", "COMPLETING", "DRAINING", "REBOOT_REQUESTED",
                        "REBOOT_ISSUED", "POWERING_UP", "POWERING_DOWN", "POWER_DOWN", "POWERED_DOWN"})
# The ledger's claim is written just before scontrol sets the reason: still the same drain event.
LEDGER_SLACK_S = 300.0
# How often the periodic path starts an auto_undrain run (each run is short unless a node is due).
AUTO_EVERY_S = 300.0
AUTO_STAMP = ".auto-undrain.stamp"
AUTO_LOCK = ".auto-undrain.lock"


# -- running the diagnostic ---------------------------------------------------------------------


@dataclass
class DiagResult:
    node: str
    command: str  # as run, quoted for a shell reader
    rc: int | None  # None: timed out or never started
    ok: bool
    took_s: float
    output: str  # the tail; ends with our note when the command timed out or could not start

    def describe(self) -> str:
        return describe(self.ok, self.rc, self.took_s, self.output)

    def row(self, actor: str, trigger: str) -> dict[str, Any]:
        return {"node": self.node, "command": self.command, "rc": self.rc, "ok": int(self.ok),
                "took_s": round(self.took_s, 3), "output": self.output, "actor": actor, "trigger": trigger}


def describe(ok: bool, rc: int | None, took_s: float | None, output: str | None) -> str:
    """``passed (rc 0, 12.3 s)``, ``failed (rc 1, 0.4 s)``, ``failed: timed out after 3600 s; ...``."""
    took = f"{float(took_s or 0):.1f} s"
    last = (output or "").rstrip("\n").rsplit("\n", 1)[-1]
    if ok or rc is not None:
        return f"{'passed' if ok else 'failed'} (rc {rc}, {took})"
    return "failed: " + (last[len(_NOTE):].rstrip("]") if last.startswith(_NOTE) else f"no exit status after {took}")


def command_for(template: str, node: str) -> list[str]:
    """The argv of the site's diagnostic for ``node`` (no shell: see the module doc)."""
    if not _NODE_NAME.match(node or ""):
        raise SattrError(f"{node!r} does not look like a Slurm node name: no diagnostic run for it")
    try:
        words = shlex.split(template or "")
    except ValueError as err:
        raise ConfigError(f"[actions] diag_command {template!r}: {err}") from err
    if not words:
        raise ConfigError("[actions] diag_command is empty")
    return [w.replace("%n", node) for w in words]


def run_diag(template: str, node: str, timeout_s: float, tail_bytes: int = OUTPUT_TAIL_BYTES) -> DiagResult:
    """Run the diagnostic for one node within ``timeout_s``; never raises for the command's own failure."""
    argv = command_for(template, node)
    shown = " ".join(shlex.quote(a) for a in argv)
    start = time.monotonic()
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                start_new_session=True, close_fds=True)
    except OSError as err:
        return DiagResult(node, shown, None, False, 0.0, f"{_NOTE}could not start: {err.strerror or err}]")
    try:
        tail, timed_out = _read_tail(proc, start + timeout_s, tail_bytes)
    finally:
        _kill_group(proc)  # at the timeout, and whatever it left behind after a normal end
        proc.stdout.close()  # type: ignore[union-attr]
        rc = proc.wait()
    took = time.monotonic() - start
    text = tail.decode("utf-8", "replace")
    if timed_out:
        text += f"\n{_NOTE}timed out after {timeout_s:g} s; its process group was killed]"
        return DiagResult(node, shown, None, False, took, text)
    return DiagResult(node, shown, rc, rc == 0, took, text)


def _exited(proc: subprocess.Popen) -> bool:
    """Whether the command has ended, without reaping it: while it is a zombie its pid (the
    group's id) cannot be reused, so killing the group afterwards hits only its own."""
    try:
        return os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def _read_tail(proc: subprocess.Popen, deadline: float, tail_bytes: int) -> tuple[bytearray, bool]:
    """Everything the command writes is read (a full pipe would stall it); the last bytes kept."""
    fd = proc.stdout.fileno()  # type: ignore[union-attr]
    buf = bytearray()
    ended_at = None
    while True:
        now = time.monotonic()
        if now >= deadline:
            return buf, True
        if ended_at is None and _exited(proc):
            ended_at = now
        if ended_at is not None and now - ended_at >= EXIT_GRACE_S:
            return buf, False  # its leftovers hold the pipe; they are killed with the group
        ready, _, _ = select.select([fd], [], [], min(deadline - now, 0.5))
        if not ready:
            continue
        chunk = os.read(fd, 65536)
        if not chunk:  # output closed: its end (at once, or by the deadline) decides
            while not _exited(proc) and time.monotonic() < deadline:
                time.sleep(0.05)
            return buf, not _exited(proc)
        buf += chunk
        if len(buf) > tail_bytes:
            del buf[:-tail_bytes]


def _kill_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


# -- `sattr undrain --diag` ----------------------------------------------------------------------


def require_command(cfg: Config) -> str:
    if not cfg.actions.diag_command.strip():
        where = cfg.source or "the config file (/etc/slurm/slurm_attr.toml)"
        raise ConfigError(f"--diag needs a diagnostic: set [actions] diag_command in {where}, e.g. "
                          'diag_command = "ssh %n dcgmi diag -r 3" (%n is the node; exit 0 = passed)')
    return cfg.actions.diag_command


def diag_check(cfg: Config, store: Any, actor: str, trigger: str,
               runner: Callable[..., DiagResult] = run_diag) -> Callable[[str, NodeState], tuple[bool, str]]:
    """drain.undrain's ``check``: the diagnostic for one node we drained, recorded; (passed, what happened)."""
    template = require_command(cfg)

    def check(node: str, st: NodeState) -> tuple[bool, str]:
        busy = sorted(st.words & BUSY_WORDS)
        if busy:
            return False, (f"diag not run: {'+'.join(w.lower() for w in busy)} (jobs or Slurm still busy on it); "
                           "try again once it is drained")
        res = runner(template, node, cfg.actions.diag_timeout_s)
        store.record_diag(res.row(actor, trigger))
        log.info("diagnostic on %s: %s", node, res.describe())
        return res.ok, f"diag {res.describe()}"

    return check


def undrain_with_diag(cfg: Config, slurm: Any, store: Any, nodes: Iterable[str], why: str, actor: str,
                      runner: Callable[..., DiagResult] = run_diag, **kw: Any) -> list[drain.UndrainResult]:
    """Resume the nodes we drained whose diagnostic passes; the others stay drained."""
    check = diag_check(cfg, store, actor, TRIGGER_MANUAL, runner)
    return drain.undrain(slurm, store, nodes, why, actor, check=check, **kw)


# -- auto_undrain ---------------------------------------------------------------------------------


@dataclass
class AutoDecision:
    node: str
    due: bool  # the diagnostic runs now; why: why not, or what was checked
    why: str


def drain_jobs(store: Any, node: str, st: NodeState, drained_at: float) -> list[str]:
    """The jobs this drain event was for: the one its reason names and the ledger's around it."""
    ids = [j for j in [reason_job(st.reason)] if j]
    for r in store.db.query("select job_id from drain_ledger where node = ? and status = 'applied' and at >= ? "
                            "order by at", [node, drained_at - LEDGER_SLACK_S]):
        if r["job_id"] and r["job_id"] not in ids:
            ids.append(r["job_id"])
    return ids


def _verdict(store: Any, job_id: str) -> Any:
    try:
        return store.verdict(job_id)
    except NotFound:  # the ledger has Slurm's own id; an array task's verdict is under A_T
        rows = list(store.db.query("select job_id from jobs where slurm_job_id = ? order by updated_at desc limit 1",
                                   [job_id]))
        return store.verdict(rows[0]["job_id"]) if rows else None


def recurrence(store: Any, node: str, job_ids: list[str]) -> tuple[str | None, str | None]:
    """(the recurrence symptom and job, None) when the drain's verdict said the GPU recurs;
    (None, why) when a verdict is missing (recurrence unknown); (None, None) when clear."""
    for jid in job_ids:
        v = _verdict(store, jid)
        if v is None:
            return None, f"no stored verdict for job {jid}: whether its GPU recurs is unknown"
        for s in v.symptoms:
            if s.node not in (node, None):
                continue
            if s.id in RECURRENCE_SYMPTOMS or any(e.source == RECURRENCE_EVIDENCE_SOURCE for e in s.evidence):
                return f"{s.id} in job {jid}", None
    return None, None


def drained_since(store: Any, node: str, view: SlurmView) -> float | None:
    """When this drain began: Slurm's reason time, else our ledger's last applied drain."""
    if node in view.reason_times:
        return view.reason_times[node]
    rows = list(store.db.query("select max(at) as at from drain_ledger where node = ? and status = 'applied'", [node]))
    return rows[0]["at"] if rows and rows[0]["at"] is not None else None


def auto_decision(cfg: Config, store: Any, st: NodeState, view: SlurmView, now: float) -> AutoDecision:
    """Whether a node we drained gets its automatic diagnostic now (the rules above, in order)."""
    node = st.name
    since = drained_since(store, node, view)
    if since is None:
        return AutoDecision(node, False, "stays drained: when it was drained is unknown")
    left = since + cfg.actions.auto_undrain_after_s - now
    if left > 0:
        return AutoDecision(node, False, f"waits: {int(left) + 1} s left of auto_undrain_after_s "
                                         f"({cfg.actions.auto_undrain_after_s:g} s after the drain)")
    busy = sorted(st.words & BUSY_WORDS)
    if busy:
        return AutoDecision(node, False, f"waits: {'+'.join(w.lower() for w in busy)}")
    tried = [d for d in store.diags(node=node, since=now - ONE_CHANCE_WINDOW_S) if d["trigger"] == TRIGGER_AUTO]
    if tried:
        last = tried[-1]
        this = "this drain" if float(last["at"]) >= since else "an earlier drain"
        return AutoDecision(node, False, f"stays drained: its automatic diagnostic ran for {this} "
                                         f"({describe(bool(last['ok']), last['rc'], last['took_s'], last['output'])}); "
                                         "one automatic chance per node: a person decides")
    jobs = drain_jobs(store, node, st, since)
    if not jobs:
        return AutoDecision(node, False, "stays drained: its drain names no job, so no verdict to check")
    found, unknown = recurrence(store, node, jobs)
    if found:
        return AutoDecision(node, False, f"stays drained: recurring GPU ({found}): a person decides")
    if unknown:
        return AutoDecision(node, False, f"stays drained: {unknown}")
    return AutoDecision(node, True, f"drained {int(now - since)} s ago for job {', '.join(jobs)}, no recurrence")


def _view(slurm: Any) -> SlurmView:
    reasons: list[Any] = []
    if hasattr(slurm, "reasons"):
        try:
            reasons = slurm.reasons()
        except SlurmError as err:
            log.info("sinfo -R unavailable (%s): reason times from scontrol", err)
    return SlurmView.build(slurm.nodes(), reasons)


def auto_undrain(cfg: Config, slurm: Any, store: Any, now: float | None = None,
                 runner: Callable[..., DiagResult] = run_diag, **kw: Any) -> list[tuple[AutoDecision, Any]]:
    """One pass over the nodes we drained: (decision, drain.UndrainResult or None) per node."""
    if not cfg.actions.auto_undrain:
        raise ConfigError("auto_undrain is off: set [actions] auto_undrain = true and diag_command "
                          f"in {cfg.source or 'the config file'} (auto_undrain_after_s: how long after a drain)")
    check = diag_check(cfg, store, AUTO_ACTOR, TRIGGER_AUTO, runner)
    now = time.time() if now is None else now
    out: list[tuple[AutoDecision, Any]] = []
    view = _view(slurm)
    for st in sorted(view.ours(), key=lambda s: s.name):
        dec = auto_decision(cfg, store, st, view, now)
        res = None
        if dec.due:
            res = drain.undrain(slurm, store, [st.name], f"auto_undrain: {dec.why}", AUTO_ACTOR, check=check, **kw)[0]
        log.info("auto_undrain %s: %s", st.name, res.message if res else dec.why)
        out.append((dec, res))
    return out


def run_locked(cfg: Config, fn: Callable[[], Any]) -> Any:
    """``fn()`` while holding the auto_undrain lock; None when another run holds it (a diagnostic
    can take an hour: a second run would test the same node twice)."""
    os.makedirs(cfg.intake.queue_dir, mode=0o700, exist_ok=True)
    fd = os.open(os.path.join(cfg.intake.queue_dir, AUTO_LOCK), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            if err.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                return None
            raise
        return fn()
    finally:
        os.close(fd)


def maybe_start_auto(cfg: Config, now: float | None = None, spawn: Callable[[list[str]], Any] | None = None) -> bool:
    """From the periodic path: start a detached auto_undrain run when it is on and the last start
    is AUTO_EVERY_S old. Returns at once (the run's diagnostics take their own time); never raises."""
    if not cfg.actions.auto_undrain:
        return False
    now = time.time() if now is None else now
    try:
        if not turns.take(cfg.intake.queue_dir, AUTO_STAMP, AUTO_EVERY_S, now):
            return False
        (spawn or _spawn)([sys.executable, "-m", "slurm_attr.diag"])
    except Exception as err:  # noqa: BLE001 - housekeeping must never cost the caller its own work
        log.error("auto_undrain not started: %s", err)
        return False
    return True


def _spawn(argv: list[str]) -> None:
    keep = ("SLURM_ATTR_", "SLURM_CONF", "PATH", "LANG", "TZ", "HOME", "SSH_")  # ssh %n needs HOME and its agent
    env = {k: v for k, v in os.environ.items() if k.startswith(keep)}
    with open(os.devnull, "rb") as dn_in, open(os.devnull, "wb") as dn_out:
        subprocess.Popen(argv, stdin=dn_in, stdout=dn_out, stderr=dn_out, start_new_session=True, env=env)


def main() -> int:
    """``python -m slurm_attr.diag``: one locked auto_undrain pass (what maybe_start_auto starts)."""
    from . import config as config_mod
    from .slurm import from_config
    from .store import Store

    try:
        cfg = config_mod.load()
        run_locked(cfg, lambda: auto_undrain(cfg, from_config(cfg, timeout=15), Store(cfg.paths.database)))
    except SattrError as err:  # config changed since the start, Slurm or the store unavailable: next time
        log.error("auto_undrain: %s", err)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
