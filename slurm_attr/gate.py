"""The node Prolog's gate: a GPU that failed while its node was idle drains the node before a job
lands on it (``epilog/prolog.sh`` runs ``python -m slurm_attr.gate``).

The fast path (fastpath.py) drains a node whose kernel log turned fatal during a job; a GPU
that falls off the bus between two jobs is seen by nobody until the next job fails on it. So
every node Prolog reads the kernel lines written since the node's last job and, when one is a
trusted fatal event (the same catalog rules, refiners and drain policy as the fast path,
``fastpath.find_fatal`` / ``decide_all``), drains the node with a ``SATTR: ... idle before job
N`` reason and exits non-zero: Slurm then requeues the batch job that was about to start (an
``srun`` gets "Prolog failure") and keeps our reason (research/slurm.md §3).

Since when: each node epilog leaves the time it read its window (collect/ledger.py
``write_mark``); the gate reads from that minus ``[collect] window_slack_s`` (late log delivery
and whole-second stamps; the overlap's fatal lines are the last job's, in the ledger). Without a
mark (a fresh install) it reads the last hour: long enough for a GPU that died since the node
came up, short enough that an Xid handled long ago does not drain a node on its first job.
Never before the last boot: a reboot re-initialises the GPUs, and a GPU still broken says so
again. Lines another job (or an earlier gate) owns in the ledger are skipped, so an old,
attributed Xid never drains twice; lines the gate acted on are recorded as ``prolog:<job>``.

Speed (an ordinary node, target 100 ms): the common case reads a tail of the kernel log, finds
nothing since the last job and exits, importing only config and the ledger. Lines since then
are tested against the keywords of the catalog's rules that can drain (every rule's match
holds one of its keywords, rules/prefilter.py), kept in the node state dir keyed by the rule
files' names, sizes and times; only a line holding one loads the catalog (~150 ms).

Exit codes: 0 always, but RC_DRAINED when this node is drained by us on this evidence (the
Prolog script turns that one code into exit 1). Dry-run, the breaker, a drain by someone else:
0, the job runs, and the decision is logged and left for the store (gaterecord.py).
"""
from __future__ import annotations

import logging
import os
import sys
import time
from typing import Any, Optional

from .collect import kernel, ledger
from .config import Config

log = logging.getLogger("slurm_attr")

RC_DRAINED = 100  # prolog.sh: this code alone becomes exit 1 (a crash must never drain a node)
NO_MARK_LOOKBACK_S = 3600.0
CHUNK = 64 << 10  # the file source is read backwards in these until a line is older than "since"
KEYWORDS_FILE = "gate-keywords.json"
KEYWORDS_VERSION = 1
# Lines stamped a little after "now" (a clock step, a slow stamp) still count.
FUTURE_S = 60.0


def check(cfg: Config, node: str, job_id: str, now: Optional[float] = None, slurm: Any = None) -> int:
    """The gate for one job start on this node: RC_DRAINED or 0. ``slurm`` is for tests."""
    if not cfg.actions.prolog_gate or not cfg.drain.enabled:
        return 0
    if not ledger.node_name_ok(node):
        log.error("prolog gate: bad SLURMD_NODENAME %r", node)
        return 0
    now = time.time() if now is None else now
    since, why = since_for(cfg, node, now)
    data = read_since(cfg, node, since, now)
    if not data.strip():
        return 0
    kws = cached_keywords(cfg)
    if kws is not None and not holds_keyword(data, kws):
        return 0
    others = running_jobs(cfg, node, job_id)
    if others:
        # A job still running here (a shared node) owns these lines: its epilog judges them for
        # its verdict, and its fast path drains. Taken here, its root cause would be lost.
        log.info("prolog gate on %s: job(s) %s still running here; their epilog judges the new lines",
                 node, ",".join(others[:5]))
        return 0
    return _classify(cfg, node, job_id, data, why, now, slurm)


def spool_dir(cfg: Config, node: str) -> str:
    """slurmd's SlurmdSpoolDir for this node, from slurm.conf (read bounded; Slurm's default)."""
    from .slurm.conf import conf_value

    spool = conf_value(cfg.paths.slurm_conf, "SlurmdSpoolDir", "/var/spool/slurmd")
    return spool.replace("%n", node).replace("%h", os.uname().nodename)


def running_jobs(cfg: Config, node: str, job_id: str) -> list[str]:
    """Other jobs with a step on this node now: each step's slurmstepd keeps a socket
    ``<node>_<job>.<step>`` in the spool dir while it runs (what `scontrol listpids` reads)."""
    prefix = f"{node}_"
    try:
        names = os.listdir(spool_dir(cfg, node))
    except OSError:
        return []
    jobs = {n[len(prefix):].split(".", 1)[0] for n in names if n.startswith(prefix) and "." in n}
    return sorted(j for j in jobs if j.isdigit() and j != job_id)


def since_for(cfg: Config, node: str, now: float) -> tuple[float, str]:
    """(epoch, why) from which this node's kernel lines are new to the gate."""
    slack = float(cfg.collect.window_slack_s)
    try:
        mark = ledger.read_mark(cfg.paths.node_state, node)
    except ledger.LedgerError as err:
        log.warning("prolog gate: no mark of the last job (%s)", err)
        mark = None
    if mark is not None:
        since, why = min(mark[0], now) - slack, f"since job {mark[1]}'s epilog"
    else:
        since, why = now - max(NO_MARK_LOOKBACK_S, slack), "no earlier job recorded: the last hour"
    boot = boot_time()
    if boot is not None and boot > since:
        since, why = boot, f"{why}, from the last boot"
    return since, why


def boot_time() -> Optional[float]:
    """When this machine booted (/proc/stat btime), or None."""
    try:
        with open("/proc/stat", "rb") as f:
            for raw in f.read(1 << 16).splitlines():
                if raw.startswith(b"btime "):
                    return float(raw.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def read_since(cfg: Config, node: str, since: float, now: float) -> bytes:
    """This node's kernel lines stamped in [since, now], at most kernel_cap_bytes (the newest)."""
    c = cfg.collect
    if c.kernel_source == "file":
        path = c.kernel_file.replace("%n", node)
        data = read_file_since(path, since, c.kernel_cap_bytes)
        return kernel.filter_window(data, since, now + FUTURE_S) if data else b""
    win = kernel.read_window(c.kernel_source, c.kernel_file, node, since, now + FUTURE_S, c.kernel_cap_bytes,
                             timeout=5.0)
    if win.status not in ("ok", "truncated"):
        log.warning("prolog gate: kernel log not read (%s: %s)", win.status, win.detail)
    return win.text


def read_file_since(path: str, since: float, cap: int) -> bytes:
    """The tail of a kernel log file back to its first line older than ``since`` (whole lines,
    at most ``cap`` bytes), read backwards in CHUNKs: a long history costs nothing."""
    from . import safefs
    from .errors import UnsafePath

    try:
        fd = safefs.open_file(os.path.dirname(path) or "/", os.path.basename(path))
    except UnsafePath as err:
        log.warning("prolog gate: no kernel log (%s)", err)
        return b""
    try:
        pos = os.fstat(fd).st_size
        parts: list[bytes] = []
        got = 0
        year = time.localtime().tm_year
        while pos > 0 and got < cap:
            n = min(CHUNK, pos, cap - got)
            pos -= n
            buf = os.pread(fd, n, pos)
            parts.append(buf)
            got += n
            nl = buf.find(b"\n")
            head = (buf + (parts[-2][:128] if len(parts) > 1 else b""))[nl + 1:nl + 129] if nl >= 0 else b""
            t = kernel.line_time(safefs.decode(head), year) if head else None
            if t is not None and t < since:
                break
    finally:
        os.close(fd)
    data = b"".join(reversed(parts))
    return data[data.find(b"\n") + 1:] if pos > 0 else data


def holds_keyword(data: bytes, keywords: list[str]) -> bool:
    low = data.lower()
    return any(k.encode("utf-8", errors="replace") in low for k in keywords)


# -- the keywords of the rules that can drain ------------------------------------------------------


def _fingerprint(extra_rules: str) -> str:
    """The rule files as the file system lists them (names, sizes, times), the package version
    and this module: a changed catalog is a different key. Stat only: reading ~150 files to hash
    them is what the cache saves."""
    import hashlib

    from . import __version__

    h = hashlib.sha256(f"gate/{KEYWORDS_VERSION}/{__version__}\0{extra_rules}\0".encode())
    here = os.path.dirname(os.path.abspath(__file__))
    roots = [os.path.join(here, "rulebook"), os.path.join(here, "rules")] + ([extra_rules] if extra_rules else [])
    for root in roots + [os.path.abspath(__file__)]:
        for dirpath, dirs, files in os.walk(root) if os.path.isdir(root) else [("", [], [root])]:
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            for name in sorted(files):
                try:
                    st = os.stat(os.path.join(dirpath, name))
                except OSError:
                    continue
                h.update(f"{dirpath}/{name}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
    return h.hexdigest()[:32]


def cached_keywords(cfg: Config) -> Optional[list[str]]:
    """The drain rules' keywords (lower case) from the node state cache, or None when it has
    none for this catalog (the caller then loads the catalog)."""
    import json  # here: the quiet path (nothing new since the last job) never needs it

    try:
        raw = ledger.read_state_file(cfg.paths.node_state, KEYWORDS_FILE)
        doc = json.loads(raw) if raw else None
    except (ledger.LedgerError, ValueError) as err:
        log.info("prolog gate: keyword cache not used (%s)", err)
        return None
    if not isinstance(doc, dict) or doc.get("fingerprint") != _fingerprint(cfg.analysis.extra_rules):
        return None
    kws = doc.get("keywords")
    return [k for k in kws if isinstance(k, str) and k] if isinstance(kws, list) else None


def drain_keywords(catalog: Any) -> Optional[list[str]]:
    """Keywords of the kernel rules whose symptoms may drain: a drain/reset/reboot action, or a
    refiner that sets the action per line (the Xid table). None: one lists none (no prefilter)."""
    from .drain import DRAIN_ACTIONS

    out: set[str] = set()
    for r in catalog.rules:
        if "kernel" not in r.sources or r.status == "deprecated":
            continue
        if r.action in DRAIN_ACTIONS or r.refine:
            if not r.keywords:
                return None
            out.update(k.lower() for k in r.keywords)
    return sorted(out)


def save_keywords(cfg: Config, catalog: Any) -> Optional[list[str]]:
    import json

    kws = drain_keywords(catalog)
    if kws is not None:
        doc = {"v": KEYWORDS_VERSION, "fingerprint": _fingerprint(cfg.analysis.extra_rules), "keywords": kws}
        try:
            ledger.write_state_file(cfg.paths.node_state, KEYWORDS_FILE, json.dumps(doc).encode())
        except (ledger.LedgerError, OSError) as err:
            log.info("prolog gate: keyword cache not written (%s)", err)
    return kws


# -- classification and the drain --------------------------------------------------------------------


def _classify(cfg: Config, node: str, job_id: str, data: bytes, why: str, now: float, slurm: Any) -> int:
    from . import fastpath, safefs
    from .rules import load_catalog

    t0 = time.monotonic()
    kws = save_keywords(cfg, load_catalog(cfg.analysis.extra_rules or None))  # cached in memory for find_fatal
    pseudo = f"prolog:{job_id}" if job_id else "idle"
    raws = [r for r in data.split(b"\n") if r.strip()]
    keyed = _unowned(cfg, node, raws, kws)
    if keyed is None:
        return 0
    lines, judged = keyed
    if not judged:
        _mark(cfg, node, now, pseudo)  # every line a drain rule could match is owned already
        return 0
    rel = f"nodes/{node}/kernel.log"
    numbered = [(i, safefs.decode(raw).rstrip("\r")) for i, raw in enumerate(lines, 1)]
    fatal, catalog_ms, match_ms = fastpath.find_fatal(cfg, pseudo, node, rel, numbered)
    if not fatal:
        log.info("prolog gate on %s: nothing fatal in %d new kernel line(s) (%s) in %.0f ms",
                 node, len(lines), why, (time.monotonic() - t0) * 1000)
        _mark(cfg, node, now, pseudo)
        return 0
    slurm = slurm if slurm is not None else fastpath.open_slurm(cfg)
    acts = fastpath.decide_all(cfg, fastpath.local_verdict(pseudo, node, fatal), slurm,
                               reason_of=lambda r: gate_reason(r, job_id))
    from .slurmstate import BLOCK_ALREADY

    drained = any(a.node == node and (a.applied or a.blocked_by == BLOCK_ALREADY) for a in acts)
    # Held-back decisions leave no trace in Slurm: the record brings them (and the drains) to the store.
    from . import gaterecord

    gaterecord.write(cfg.paths.spool, node, job_id, acts)
    for a in acts:
        log.warning("prolog gate on %s: %s %s (%s) in %.0f ms [catalog %.0f ms, match %.0f ms]; %s",
                    node, a.kind, "applied" if a.applied else f"blocked: {a.blocked_by}", a.reason,
                    (time.monotonic() - t0) * 1000, catalog_ms, match_ms,
                    "the job is requeued" if drained else "the job runs")
    if not drained:
        return 0  # dry-run, breaker, someone else's drain: alert only; the next job start asks again
    _record(cfg, node, pseudo, judged)
    _mark(cfg, node, now, pseudo)
    return RC_DRAINED


def _unowned(cfg: Config, node: str, raws: list[bytes],
             kws: Optional[list[str]]) -> Optional[tuple[list[bytes], list[str]]]:
    """(the lines without those another job or gate owns in the ledger, keys of the kept lines
    holding a drain keyword). None when the ledger cannot be read: the gate then stays out of
    the way (the next job's epilog still reads these lines, and its fast path decides)."""
    year = time.localtime().tm_year
    try:
        with ledger.Ledger(cfg.paths.node_state, node) as led:
            kept: list[bytes] = []
            judged: list[str] = []
            for raw in raws:
                if kws is not None and not holds_keyword(raw, kws):
                    kept.append(raw)  # context for the refiners; cannot drain, so no key needed
                    continue
                key = ledger.line_key(node, raw.decode("utf-8", errors="replace"), year)
                if led.owner(key) is None:
                    kept.append(raw)
                    judged.append(key)
    except ledger.LedgerError as err:
        log.warning("prolog gate on %s: ledger not readable (%s); not deciding", node, err)
        return None
    return kept, judged


def gate_reason(reason: str, job_id: str) -> str:
    """``SATTR: gpu_hardware xid79 gpu3b:00 idle before job 1234``: the policy's reason with the
    finished job it would name replaced by what the gate knows (the node was idle)."""
    from .drain import REASON_MAX

    head = reason.rsplit(" job ", 1)[0]
    tail = f" idle before job {job_id}" if job_id else " idle"
    return (head + tail)[:REASON_MAX]


def _record(cfg: Config, node: str, pseudo: str, keys: list[str]) -> None:
    """The lines this gate acted on belong to it: no later job's epilog or gate counts them again."""
    try:
        with ledger.Ledger(cfg.paths.node_state, node) as led:
            led.record(keys, pseudo)
    except (ledger.LedgerError, OSError) as err:
        log.error("prolog gate on %s: lines not recorded in the ledger (%s)", node, err)


def _mark(cfg: Config, node: str, now: float, pseudo: str) -> None:
    """Lines up to now were judged: the next gate starts here (not on the plain quiet path,
    which needs no write)."""
    try:
        ledger.write_mark(cfg.paths.node_state, node, now, pseudo)
    except (ledger.LedgerError, OSError) as err:
        log.info("prolog gate on %s: mark not written (%s)", node, err)


def _setup_logging(job_id: str) -> None:
    h = logging.StreamHandler(sys.stderr)
    h.setFormatter(logging.Formatter(f"slurm_attr[prolog {job_id}]: %(levelname)s %(message)s"))
    log.addHandler(h)
    log.setLevel(logging.INFO)
    path = os.environ.get("SLURM_ATTR_LOG_FILE")
    if path:
        try:
            fh = logging.FileHandler(path)
            fh.setFormatter(logging.Formatter(f"%(asctime)s slurm_attr[prolog {job_id}]: %(levelname)s %(message)s"))
            log.addHandler(fh)
        except OSError:
            pass


def main() -> int:
    """The Prolog's entry: never raises, RC_DRAINED only on a deliberate drain."""
    env = os.environ
    job_id = env.get("SLURM_JOB_ID", "")
    job_id = job_id if job_id.replace("_", "").isdigit() and len(job_id) <= 24 else ""
    _setup_logging(job_id or "?")
    t0 = time.monotonic()
    try:
        from .config import load

        return check(load(), env.get("SLURMD_NODENAME", ""), job_id)
    except BaseException as err:  # noqa: BLE001 - a Prolog failure drains the node and requeues the job
        log.exception("prolog gate failed after %.0f ms: %s", (time.monotonic() - t0) * 1000, err)
        return 0


if __name__ == "__main__":
    sys.exit(main())
