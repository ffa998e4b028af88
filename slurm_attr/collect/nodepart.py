"""This node's part of a job's bundle on the spool: how its files are written and what
collect.json says of each source.

Every file of the part is root's alone (0600, no link followed, replaced whole: atomicfile.py);
a spool that is full or read-only raises SpoolFull, which collect_node answers by keeping the
kernel window alone (node.py). SourceResult is one source's line in collect.json.
"""
from __future__ import annotations

import errno
import os
from dataclasses import dataclass
from typing import Any

from ..atomicfile import write_atomic

# Out of space or not writable: root gets EPERM/EACCES from an immutable dir or a root-squashed NFS.
SPOOL_FULL_ERRNOS = (errno.ENOSPC, errno.EROFS, errno.EDQUOT, errno.EFBIG, errno.EPERM, errno.EACCES)


class SpoolFull(OSError):
    """Writing to the spool failed for lack of space or a read-only filesystem."""


def spool_full(err: OSError) -> bool:
    return isinstance(err, SpoolFull) or err.errno in SPOOL_FULL_ERRNOS


def write_private(path: str, data: bytes) -> None:
    """Write a file only root reads (0600, no symlink followed), replaced whole. Not fsynced:
    the node part is evidence for one analysis, and collect.json, written last, says it is whole."""
    try:
        write_atomic(path, data, mode=0o600, durable=False)
    except OSError as err:
        if err.errno in SPOOL_FULL_ERRNOS:
            raise SpoolFull(err.errno, f"spool: {os.strerror(err.errno)} writing {os.path.basename(path)}") from err
        raise


@dataclass
class SourceResult:
    status: str = "ok"
    bytes: int = 0
    ms: float = 0.0
    files: int = 0
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"status": self.status, "bytes": self.bytes, "ms": round(self.ms, 1)}
        if self.files:
            d["files"] = self.files
        if self.detail:
            d["detail"] = self.detail[:500]
        return d
