"""Finding and reading the probe records of a bundle: nodes/<node>/probe/*.probe.

Reads are bounded by construction: the header and the slots it announces (at most
40 x 2304 bytes after the 4096-byte header page), with positioned reads on a descriptor opened without following
symlinks or blocking (O_NOFOLLOW, O_NONBLOCK), regular files only. Each node's probe
directory is opened once (safefs.open_dir, no symlink on the way) and its files relative
to it, listed by d_type without a stat each: 4096 ranks must read in about 100 ms. Every bad file becomes one Coverage entry; the others still count.
"""
from __future__ import annotations

import os
import time

from .. import safefs
from ..bundle import Bundle
from ..errors import UnsafePath
from ..model import Coverage
from . import layout as L
from .record import ProbeFormatError, RankRecord, parse_header, parse_slots

SOURCE = "probe"
SUFFIX = ".probe"
MAX_FILES_PER_NODE = 1024  # a node runs at most a few dozen ranks; more is junk
READ_BUDGET_S = 30.0

_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)


def _read_record(dfd: int, name: str, relpath: str, node: str, guess: list[int]) -> RankRecord:
    """One record. ``guess`` holds how many slots the previous records used: one read then
    usually covers the header and every used slot (ranks of a job have the same
    communicators), and a second read fetches the rest when it does not."""
    try:
        fd = os.open(name, _FLAGS, dir_fd=dfd)
    except OSError as err:
        raise ProbeFormatError(f"cannot open: {os.strerror(err.errno or 0)}") from err
    try:
        # No fstat: the listing's d_type said "regular file", O_NOFOLLOW refuses a symlink
        # swapped in since, a FIFO or directory fails the pread (ESPIPE, EISDIR), and a job
        # cannot create devices. Short reads are the size check.
        data = os.pread(fd, L.HDR_SIZE + guess[0] * L.SLOT_SIZE, 0)
        rec = parse_header(data, relpath, node)
        end = L.HDR_SIZE + rec.nslots_used * L.SLOT_SIZE
        if end > len(data):
            data += os.pread(fd, end - len(data), len(data))
            if len(data) < end:
                raise ProbeFormatError(f"truncated ({len(data)} bytes for {rec.nslots_used} slots)")
        guess[0] = max(guess[0], rec.nslots_used)
        parse_slots(rec, data, L.HDR_SIZE)
        return rec
    finally:
        os.close(fd)


def _probe_files(dfd: int) -> tuple[list[str], list[str]]:
    """(probe file names, names of things that are not regular files), from d_type:
    no stat per file."""
    files, odd = [], []
    with os.scandir(dfd) as it:
        for entry in it:
            if not entry.name.endswith(SUFFIX):
                continue
            if entry.is_file(follow_symlinks=False):
                files.append(entry.name)
            elif not entry.is_dir(follow_symlinks=False):
                odd.append(entry.name)
            if len(files) + len(odd) > safefs.MAX_ENTRIES:
                break
    files.sort()
    return files, odd


def read_node(bundle: Bundle, node: str, deadline: float, guess: list[int] | None = None
              ) -> tuple[list[RankRecord], list[Coverage]]:
    """The records of one node, and what went wrong with the others."""
    rel = f"nodes/{node}/probe"
    try:
        dfd = safefs.open_dir(bundle.root, rel)
    except UnsafePath as err:
        status = "missing" if "No such file" in str(err) else "error"
        detail = "no probe files (probe off, or NCCL without profiler support)" if status == "missing" else str(err)
        return [], [Coverage(source=SOURCE, node=node, status=status, detail=detail)]
    records: list[RankRecord] = []
    cov: list[Coverage] = []
    guess = guess if guess is not None else [1]
    try:
        names, odd = _probe_files(dfd)
        for name in odd:
            cov.append(Coverage(source=SOURCE, node=node, status="error",
                                detail=f"{rel}/{name}: not a regular file (symlink?), not read"))
        if len(names) > MAX_FILES_PER_NODE:
            cov.append(Coverage(source=SOURCE, node=node, status="truncated",
                                detail=f"{len(names)} probe files, read the first {MAX_FILES_PER_NODE}"))
            names = names[:MAX_FILES_PER_NODE]
        for name in names:
            if time.monotonic() > deadline:
                cov.append(Coverage(source=SOURCE, node=node, status="truncated",
                                    detail=f"read time budget ({READ_BUDGET_S:.0f} s) spent"))
                break
            relpath = f"{rel}/{name}"
            try:
                rec = _read_record(dfd, name, relpath, node, guess)
            except ProbeFormatError as err:
                cov.append(Coverage(source=SOURCE, node=node, status="error", detail=f"{relpath}: {err}"))
                continue
            except OSError as err:
                cov.append(Coverage(source=SOURCE, node=node, status="error",
                                    detail=f"{relpath}: {os.strerror(err.errno or 0)}"))
                continue
            if rec.problems:
                cov.append(Coverage(source=SOURCE, node=node, status="error",
                                    detail=f"{relpath}: skipped {'; '.join(rec.problems[:5])}"))
            records.append(rec)
    finally:
        os.close(dfd)
    if records:
        cov.append(Coverage(source=SOURCE, node=node, status="ok", detail=f"{len(records)} rank records"))
    elif not cov:
        cov.append(Coverage(source=SOURCE, node=node, status="missing", detail="probe directory is empty"))
    return records, cov


def read_bundle(bundle: Bundle) -> tuple[list[RankRecord], list[Coverage]]:
    """Every readable record of the bundle, and coverage per node and per bad file."""
    deadline = time.monotonic() + READ_BUDGET_S
    records: list[RankRecord] = []
    cov: list[Coverage] = []
    nodes = bundle.nodes()
    if not nodes:
        return [], [Coverage(source=SOURCE, status="missing", detail="the bundle has no node parts")]
    guess = [1]
    for node in nodes:
        recs, c = read_node(bundle, node, deadline, guess)
        records.extend(recs)
        cov.extend(c)
    return records, cov
