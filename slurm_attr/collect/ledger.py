"""Node-local ledger of trusted kernel lines already attributed to a job.

A kernel line (node, timestamp, text) that produced one job's verdict or drain is
context for any later job that reads it again (overlapping slack, jobs sharing a
node, a window without a trusted start), never that job's root and never a second
drain; recurrence counts the event once (issue 10). Issue 11 forbids a shared
database on the node side, so each node keeps a small root-only file:

    <[paths] node_state>/attributed.<node>.json   {"v": 1, "lines": {key: [job_id, recorded_epoch]}}

The key is a hash of (node, the line's time, its message), so the same line read
by ``journalctl -k`` twice hashes alike. Bounded (MAX_ENTRIES, newest kept) and
pruned by age (MAX_AGE_S). Updates are serialised with flock on a lock file
beside it (several epilogs of one node may run at once) and written by rename.
The directory must be root-owned and not writable by others; a file or directory
that is not ours (symlink, other owner) is refused, never followed.
"""
from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import stat
import time
from typing import Iterable, Optional

from ..atomicfile import write_atomic
from .kernel import line_key  # the event's identity (kernel.py: a low module bundle.py reads too)

MAX_ENTRIES = 20000
MAX_AGE_S = 30 * 24 * 3600
MAX_FILE_BYTES = 4 << 20
# Lines recorded for one job: a flood of matches must not evict every other entry.
MAX_PER_JOB = 2000

class LedgerError(Exception):
    pass


def _safe_dir(path: str) -> int:
    """Open (creating, 0700) the root-owned state dir without following a link."""
    try:
        os.makedirs(os.path.dirname(path.rstrip("/")) or "/", mode=0o755, exist_ok=True)
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as err:
        raise LedgerError(f"{path}: {err}") from err
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as err:
        raise LedgerError(f"{path}: {err}") from err
    st = os.fstat(fd)
    if st.st_uid != os.geteuid() or st.st_mode & 0o022:
        os.close(fd)
        raise LedgerError(f"{path}: not ours or writable by others (uid {st.st_uid}, mode {st.st_mode & 0o7777:o})")
    return fd


class Ledger:
    """The ledger file of one node. Use as a context manager: holds the node's lock."""

    def __init__(self, state_dir: str, node: str, now: Optional[float] = None):
        if not node_name_ok(node):
            raise LedgerError(f"bad node name {node!r}")
        self.state_dir = state_dir
        self.node = node
        self.name = f"attributed.{node}.json"
        self.now = time.time() if now is None else now
        self.lines: dict[str, list] = {}
        self._dfd = -1
        self._lock = -1
        self.dirty = False

    def __enter__(self) -> "Ledger":
        self._dfd = _safe_dir(self.state_dir)
        try:
            self._lock = os.open(f"{self.name}.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                                 0o600, dir_fd=self._dfd)
            fcntl.flock(self._lock, fcntl.LOCK_EX)
            self.lines = self._load()
        except BaseException:
            self._close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            if self.dirty and exc[0] is None:
                self._save()
        finally:
            self._close()

    def _close(self) -> None:
        for fd in (self._lock, self._dfd):
            if fd >= 0:
                os.close(fd)
        self._lock = self._dfd = -1

    def _load(self) -> dict[str, list]:
        try:
            fd = os.open(self.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self._dfd)
        except FileNotFoundError:
            return {}
        except OSError as err:
            if err.errno == errno.ELOOP:
                raise LedgerError(f"{self.name} is a symlink; refused") from err
            raise LedgerError(f"{self.name}: {err}") from err
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
                raise LedgerError(f"{self.name}: not a regular file of ours")
            data = os.read(fd, MAX_FILE_BYTES + 1)
        finally:
            os.close(fd)
        try:
            doc = json.loads(data[:MAX_FILE_BYTES].decode("utf-8", errors="replace"))
        except ValueError:
            return {}  # a torn or foreign file: start again rather than fail the epilog
        lines = doc.get("lines") if isinstance(doc, dict) else None
        if not isinstance(lines, dict):
            return {}
        out = {}
        for k, v in lines.items():
            if (isinstance(k, str) and isinstance(v, list) and len(v) == 2 and isinstance(v[0], str)
                    and isinstance(v[1], (int, float))):
                out[k] = v
        return out

    def _save(self) -> None:
        cutoff = self.now - MAX_AGE_S
        kept = [(k, v) for k, v in self.lines.items() if v[1] >= cutoff]
        kept.sort(key=lambda kv: kv[1][1])
        kept = kept[-MAX_ENTRIES:]
        data = json.dumps({"v": 1, "lines": dict(kept)}, separators=(",", ":")).encode()
        write_atomic(self.name, data, mode=0o600, durable=False, dir_fd=self._dfd)

    def owner(self, key: str) -> Optional[str]:
        v = self.lines.get(key)
        return v[0] if v else None

    def record(self, keys: Iterable[str], job_id: str) -> int:
        """Attribute these line keys to job_id (first attribution wins). Returns how many were new."""
        n = 0
        for key in keys:
            if n >= MAX_PER_JOB:
                break
            if key not in self.lines:
                self.lines[key] = [job_id, self.now]
                n += 1
        if n:
            self.dirty = True
        return n


# The node Prolog's gate (gate.py) reads the kernel log only since the node's last job: each
# node epilog leaves, beside the ledger, when it read its window (its end), in a one-line file
# ``lastread.<node>`` ("<epoch> <job_id>"). Small state files of the gate (its keyword cache)
# live here too, under the same rules as the ledger: root-only directory, no links followed.
MARK_MAX_BYTES = 256
STATE_MAX_BYTES = 1 << 20


def node_name_ok(node: str) -> bool:
    return bool(re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}", node))


def read_state_file(state_dir: str, name: str, cap: int = STATE_MAX_BYTES) -> Optional[bytes]:
    """A root-written file of the node state dir (at most cap bytes), or None when there is none.
    Raises LedgerError for a file or directory that is not ours (a link, another owner)."""
    try:
        dfd = os.open(state_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as err:
        raise LedgerError(f"{state_dir}: {err}") from err
    try:
        st = os.fstat(dfd)
        if st.st_uid != os.geteuid() or st.st_mode & 0o022:
            raise LedgerError(f"{state_dir}: not ours or writable by others")
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
        except FileNotFoundError:
            return None
        except OSError as err:
            raise LedgerError(f"{name}: {err}") from err
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
                raise LedgerError(f"{name}: not a regular file of ours")
            return os.read(fd, cap)
        finally:
            os.close(fd)
    finally:
        os.close(dfd)


def write_state_file(state_dir: str, name: str, data: bytes) -> None:
    """Replace a file of the node state dir whole (written beside it, then renamed)."""
    dfd = _safe_dir(state_dir)
    try:
        write_atomic(name, data, mode=0o600, durable=False, dir_fd=dfd)
    finally:
        os.close(dfd)


def write_mark(state_dir: str, node: str, end: float, job_id: str) -> None:
    """Record that this node's kernel log was read up to ``end`` (epoch) for job_id.
    Several epilogs of one node may race: the last writer wins, which can only move the mark
    back (the gate then reads a little more, and the ledger keeps it from counting twice)."""
    if not node_name_ok(node):
        raise LedgerError(f"bad node name {node!r}")
    job = re.sub(r"[^A-Za-z0-9:._-]", "", job_id)[:64] or "?"
    write_state_file(state_dir, f"lastread.{node}", f"{end:.3f} {job}\n".encode())


def read_mark(state_dir: str, node: str) -> Optional[tuple[float, str]]:
    """(end epoch, job id) of the last recorded read of this node's kernel log, or None."""
    if not node_name_ok(node):
        raise LedgerError(f"bad node name {node!r}")
    raw = read_state_file(state_dir, f"lastread.{node}", MARK_MAX_BYTES)
    parts = (raw or b"").decode("ascii", errors="replace").split()
    try:
        return (float(parts[0]), parts[1] if len(parts) > 1 else "?") if parts else None
    except ValueError:
        return None  # a torn or foreign file: no mark (the gate reads its default look-back)


def matched_line_indexes(buf: bytes, extra_rules: Optional[str] = None) -> set[int]:
    """0-based indexes of the lines of buf that a kernel rule of the catalog matches.

    Only such lines can become a verdict's root or a drain, so only they are
    recorded (a quiet kernel log costs the ledger nothing). The same catalog as
    the fast path and the central analysis, without its inline cases; cached (in memory and
    in root's spec cache): rebuilt per call it was 92% of a node epilog's CPU (bench_bigjob).
    """
    from ..rules import load_catalog
    from ..rules.scan import scan

    catalog = load_catalog(extra_rules or None)
    out: set[int] = set()
    for hit in scan(catalog.index("kernel"), buf):
        out.update(range(hit.line_index, hit.line_index + max(1, len(hit.texts))))
    return out


def split_window(buf: bytes, node: str, job_id: str, ledger: Optional[Ledger],
                 matched: set[int]) -> tuple[bytes, bytes, list[dict[str, object]], list[str]]:
    """(fresh lines, lines attributed earlier, their records, keys to record for this job).

    A line another job already owns goes to the second buffer with its owner; a
    matched fresh line is recorded for this job. Without a ledger nothing moves.
    """
    fresh: list[bytes] = []
    old: list[bytes] = []
    records: list[dict[str, object]] = []
    new_keys: list[str] = []
    year = time.localtime().tm_year
    for i, raw in enumerate(buf.split(b"\n")):
        if not raw:
            continue
        if ledger is None or i not in matched:
            fresh.append(raw)
            continue
        key = line_key(node, raw.decode("utf-8", errors="replace"), year)
        owner = ledger.owner(key)
        if owner is not None and owner != job_id:
            old.append(raw)
            records.append({"line": len(old), "key": key, "job_id": owner,
                            "recorded": kernel_iso(ledger.lines[key][1])})
        else:
            fresh.append(raw)
            new_keys.append(key)
    join = (lambda xs: b"\n".join(xs) + b"\n" if xs else b"")
    return join(fresh), join(old), records, new_keys


def kernel_iso(t: float) -> str:
    from datetime import datetime, timezone

    return datetime.fromtimestamp(t, timezone.utc).isoformat(timespec="seconds")
