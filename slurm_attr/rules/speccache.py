"""Validated TOML rules kept on disk as JSON, keyed by what they were made from.

Parsing ~150 TOML files and validating every key is most of a catalog load, and a
load is most of a small analysis (``sattr reanalyze`` runs thousands). The key is a
SHA-256 over the rule files' paths and bytes plus the source of the code that
validates them and derives their literals (catalog.py, model.py, literals.py): any
edit to a rule, or to what counts as valid, is a different key, so a stale entry is
never read, only left behind.

The cache holds plain JSON (no pickle: nothing here executes on load). A cached rule
is trusted as validated, so the file must be as safe as the rule files: it is used
only when it and its directory belong to this user and nobody else can write them
(root's analysis must not take rules, and their drain actions, from a user), opened
with O_NOFOLLOW and read with a bound. Every failure to read or write it - no home,
a read-only disk, a foreign owner, a TOML value JSON cannot hold - means "no cache"
and the rules are parsed as usual, silently.

Where: ``$SLURM_ATTR_CACHE_DIR``; else ``/var/cache/slurm-attr`` for root;
else ``$XDG_CACHE_HOME/slurm-attr`` or ``~/.cache/slurm-attr``.
"""
from __future__ import annotations

import hashlib
import json
import os
import stat
from typing import Any, Optional, Sequence

from ..atomicfile import write_atomic

VERSION = 1  # of the spec layout below
MAX_BYTES = 16 << 20  # a catalog is ~0.5 MB; anything far larger is not ours
KEEP = 8  # cache files kept per directory (one per catalog variant: built-in, each site dir)
_PREFIX = "catalog-"


def cache_dir() -> str:
    env = os.environ.get("SLURM_ATTR_CACHE_DIR")
    if env:
        return env
    if os.geteuid() == 0:
        return "/var/cache/slurm-attr"
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "slurm-attr")


def key_for(files: Sequence[tuple[str, bytes]], code: Sequence[Optional[str]]) -> str:
    """The cache key of these rule files (display path, bytes) under the code in ``code`` (paths)."""
    h = hashlib.sha256(f"sattr-rules-spec/{VERSION}\0".encode())
    for src in code:
        try:
            with open(src or "", "rb") as f:
                h.update(f.read(1 << 20))
        except OSError:
            h.update(b"?")  # no source to hash (a zipped install): the version still keys it
    for path, raw in files:
        h.update(f"{len(path)}:{path}\0{len(raw)}\0".encode())
        h.update(raw)
    return h.hexdigest()


def _safe(st: os.stat_result, kind: int) -> bool:
    """Ours, of the expected kind, and writable by nobody else."""
    return stat.S_IFMT(st.st_mode) == kind and st.st_uid == os.geteuid() and not st.st_mode & 0o022


def _open_dir(path: str) -> Optional[int]:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if _safe(os.fstat(fd), stat.S_IFDIR):
            return fd
    except OSError:
        pass
    os.close(fd)
    return None


def load(key: str) -> Optional[list[Any]]:
    """The rule specs cached under ``key``, or None (absent, unsafe, unreadable or not ours)."""
    dfd = _open_dir(cache_dir())
    if dfd is None:
        return None
    try:
        fd = os.open(f"{_PREFIX}{key[:40]}.json", os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
        try:
            st = os.fstat(fd)
            if not _safe(st, stat.S_IFREG) or st.st_size > MAX_BYTES:
                return None
            raw = os.read(fd, MAX_BYTES + 1)  # regular file: one read returns it whole
        finally:
            os.close(fd)
        doc = json.loads(raw)
        if not isinstance(doc, dict) or doc.get("key") != key or doc.get("version") != VERSION:
            return None
        rules = doc.get("rules")
        return rules if isinstance(rules, list) else None
    except (OSError, ValueError):
        return None
    finally:
        os.close(dfd)


def save(key: str, rules: Sequence[Any]) -> None:
    """Write the rule specs (JSON values) under ``key``; any failure is silent (the next load parses again)."""
    try:
        raw = json.dumps({"version": VERSION, "key": key, "rules": list(rules)}, separators=(",", ":")).encode()
    except (TypeError, ValueError):
        return  # a TOML value JSON cannot hold (a date in an expect table): no cache for this catalog
    path = cache_dir()
    try:
        os.makedirs(path, mode=0o755, exist_ok=True)
    except OSError:
        return
    dfd = _open_dir(path)
    if dfd is None:
        return
    try:
        # Atomic: a concurrent reader sees the old entry or the whole new one. Not durable: a
        # lost entry costs one parse of the catalog.
        write_atomic(f"{_PREFIX}{key[:40]}.json", raw, mode=0o644, durable=False, dir_fd=dfd)
        _prune(dfd)
    except OSError:
        pass
    finally:
        os.close(dfd)


def _prune(dfd: int) -> None:
    """Keep the newest KEEP entries: every rule edit leaves one behind."""
    entries = []
    for name in os.listdir(dfd):
        if name.startswith(_PREFIX) and name.endswith(".json"):
            try:
                entries.append((os.stat(name, dir_fd=dfd, follow_symlinks=False).st_mtime, name))
            except OSError:
                continue
    for _, name in sorted(entries, reverse=True)[KEEP:]:
        try:
            os.unlink(name, dir_fd=dfd)
        except OSError:
            pass
