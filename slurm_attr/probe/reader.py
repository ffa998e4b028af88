"""Finding and reading the probe records of a bundle: nodes/<node>/probe/*.probe.

Reads are bounded by construction: the header and the slots it announces (at most
40 x 2304 bytes after the 4096-byte header page), and the lanes it announces (at most
16 x 896 bytes), with positioned reads on a descriptor opened without following
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
from . import NO_NODES, NO_PROBE_DIR
from . import layout as L
from .record import ProbeFormatError, RankRecord, parse_header, parse_lanes, parse_slots

SOURCE = "probe"
SUFFIX = ".probe"
MAX_FILES_PER_NODE = 1024  # a node runs at most a few dozen ranks; more is junk
READ_BUDGET_S = 30.0

_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


def _open_probe_dir(bundle: Bundle, node: str, nodes_fd: int | None) -> int:
    """nodes/<node>/probe as a directory fd, no symlink on the way. With ``nodes_fd`` (the
    bundle's nodes/ opened once by read_bundle) two opens per node instead of four."""
    if nodes_fd is None:
        return safefs.open_dir(bundle.root, f"nodes/{node}/probe")
    fd = nodes_fd
    try:
        for part in (node, "probe"):
            nfd = os.open(part, _DIR_FLAGS, dir_fd=fd)
            if fd != nodes_fd:
                os.close(fd)
            fd = nfd
        return fd
    except OSError as err:
        if fd != nodes_fd:
            os.close(fd)
        raise UnsafePath(f"{bundle.root}/nodes/{node}/probe: {os.strerror(err.errno or 0)}") from err


class ReadState:
    """What one bundle's reads share: the slot-count guess and a reused read buffer."""

    __slots__ = ("guess", "buf", "view")

    def __init__(self) -> None:
        self.guess = 1  # slots the records so far used: ranks of a job share communicators
        self.buf = bytearray(L.LANES_OFF)  # the largest header + slots read
        self.view = memoryview(self.buf)


def read_record(dfd: int, name: str, relpath: str, node: str, st: ReadState) -> RankRecord:
    """One record. One read usually covers the header and every used slot (``st.guess``),
    a second read fetches the rest when it does not. Reads land in a reused buffer and
    only the used slots are kept (one bytes object): 4096 x 11 KB of fresh buffers per
    analysis cost more in page faults than the reads themselves."""
    try:
        fd = os.open(name, _FLAGS, dir_fd=dfd)
    except OSError as err:
        raise ProbeFormatError(f"cannot open: {os.strerror(err.errno or 0)}") from err
    try:
        # No fstat: the listing's d_type said "regular file", O_NOFOLLOW refuses a symlink
        # swapped in since, a FIFO or directory fails the pread (ESPIPE, EISDIR), and a job
        # cannot create devices. Short reads are the size check.
        view = st.view
        got = os.preadv(fd, [view[:L.HDR_SIZE + st.guess * L.SLOT_SIZE]], 0)
        rec = parse_header(view[:got], relpath, node)
        end = L.HDR_SIZE + rec.nslots_used * L.SLOT_SIZE
        if end > got:
            got += os.preadv(fd, [view[got:end]], got)
            if got < end:
                raise ProbeFormatError(f"truncated ({got} bytes for {rec.nslots_used} slots)")
        st.guess = max(st.guess, rec.nslots_used)
        parse_slots(rec, bytes(view[L.HDR_SIZE:end]))
        if rec.lanes_used:  # other writer threads' shares (layout version 2), rare
            size = rec.lanes_used * L.LANE_SIZE
            lanes = os.pread(fd, size, L.LANES_OFF)
            if len(lanes) < size:
                raise ProbeFormatError(f"truncated ({rec.lanes_used} lanes announced)")
            parse_lanes(rec, lanes)
        return rec
    finally:
        os.close(fd)


def probe_files(dfd: int) -> tuple[list[str], list[str]]:
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


def read_node(bundle: Bundle, node: str, deadline: float, state: ReadState | None = None,
              nodes_fd: int | None = None) -> tuple[list[RankRecord], list[Coverage]]:
    """The records of one node, and what went wrong with the others."""
    rel = f"nodes/{node}/probe"
    try:
        dfd = _open_probe_dir(bundle, node, nodes_fd)
    except UnsafePath as err:
        status = "missing" if "No such file" in str(err) else "error"
        detail = NO_PROBE_DIR if status == "missing" else str(err)
        return [], [Coverage(source=SOURCE, node=node, status=status, detail=detail)]
    records: list[RankRecord] = []
    cov: list[Coverage] = []
    state = state if state is not None else ReadState()
    try:
        names, odd = probe_files(dfd)
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
                rec = read_record(dfd, name, relpath, node, state)
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
        return [], [Coverage(source=SOURCE, status="missing", detail=NO_NODES)]
    state = ReadState()
    try:
        nodes_fd: int | None = safefs.open_dir(bundle.root, "nodes")
    except UnsafePath:
        nodes_fd = None  # each node then says what is wrong
    try:
        for node in nodes:
            recs, c = read_node(bundle, node, deadline, state, nodes_fd)
            records.extend(recs)
            cov.extend(c)
    finally:
        if nodes_fd is not None:
            os.close(nodes_fd)
    return records, cov
