"""Reading files a job could have written, without trusting them.

Everything under a job's evidence dir or a bundle may be hostile: symlinks to
/etc/shadow, FIFOs that block a reader forever, multi-GB files, devices. Every
open here walks the path one component at a time with O_NOFOLLOW relative to
the root's descriptor, accepts only regular files and directories, never
blocks on FIFOs (O_NONBLOCK), and reads at most a caller-given number of bytes.
"""
from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass
from typing import Iterator

from .errors import UnsafePath

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOCTTY", 0)

# A directory listing is bounded too: a job can create a million files.
MAX_ENTRIES = 10_000


@dataclass
class ReadResult:
    data: bytes
    size: int  # size of the file on disk when opened
    truncated: bool  # True when data is only part of the file


def _split(relpath: str) -> list[str]:
    parts = [p for p in relpath.split("/") if p not in ("", ".")]
    for p in parts:
        if p == "..":
            raise UnsafePath(f"'..' in {relpath!r}")
    return parts


def open_dir(root: str, relpath: str = "") -> int:
    """Open root/relpath as a directory fd without following any symlink below root.

    ``root`` itself is opened with O_NOFOLLOW too: a symlinked job dir is refused.
    """
    try:
        fd = os.open(root, _DIR_FLAGS)
    except OSError as err:
        raise UnsafePath(f"{root}: {os.strerror(err.errno)}") from err
    try:
        for part in _split(relpath):
            try:
                nfd = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except OSError as err:
                raise UnsafePath(f"{root}/{relpath}: {part}: {os.strerror(err.errno)}") from err
            os.close(fd)
            fd = nfd
        return fd
    except BaseException:
        os.close(fd)
        raise


def open_file(root: str, relpath: str) -> int:
    """Open a regular file below root for reading; refuses symlinks, FIFOs, devices."""
    parts = _split(relpath)
    if not parts:
        raise UnsafePath("empty path")
    dfd = open_dir(root, "/".join(parts[:-1]))
    try:
        try:
            fd = os.open(parts[-1], _FILE_FLAGS, dir_fd=dfd)
        except OSError as err:
            if err.errno == errno.ELOOP:
                raise UnsafePath(f"{relpath}: is a symlink") from err
            raise UnsafePath(f"{relpath}: {os.strerror(err.errno)}") from err
    finally:
        os.close(dfd)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise UnsafePath(f"{relpath}: not a regular file")
    return fd


def read_fd(fd: int, cap: int, tail: bool = False) -> ReadResult:
    """Read at most ``cap`` bytes from fd: the head, or the tail when ``tail``."""
    size = os.fstat(fd).st_size
    if tail and size > cap:
        os.lseek(fd, size - cap, os.SEEK_SET)
    chunks: list[bytes] = []
    left = cap
    while left > 0:
        b = os.read(fd, min(left, 1 << 20))
        if not b:
            break
        chunks.append(b)
        left -= len(b)
    data = b"".join(chunks)
    truncated = size > len(data)
    if not tail and not truncated and left == 0:
        # The file may be growing or lying about its size: one more byte says.
        truncated = bool(os.read(fd, 1))
    return ReadResult(data=data, size=size, truncated=truncated)


def read_file(root: str, relpath: str, cap: int, tail: bool = False) -> ReadResult:
    fd = open_file(root, relpath)
    try:
        return read_fd(fd, cap, tail=tail)
    finally:
        os.close(fd)


def list_dir(root: str, relpath: str = "") -> list[tuple[str, str]]:
    """(name, kind) for entries of root/relpath; kind is 'file', 'dir' or 'other'.

    Symlinks are reported as 'other' and never followed. At most MAX_ENTRIES.
    """
    dfd = open_dir(root, relpath)
    out: list[tuple[str, str]] = []
    try:
        with os.scandir(dfd) as it:
            for entry in it:
                if len(out) >= MAX_ENTRIES:
                    break
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                if stat.S_ISREG(st.st_mode):
                    kind = "file"
                elif stat.S_ISDIR(st.st_mode):
                    kind = "dir"
                else:
                    kind = "other"
                out.append((entry.name, kind))
    finally:
        os.close(dfd)
    out.sort()
    return out


def walk_files(root: str, relpath: str = "", max_depth: int = 4) -> Iterator[str]:
    """Relative paths of regular files below root/relpath, depth-bounded, no symlinks."""
    stack = [(relpath, 0)]
    seen = 0
    while stack:
        rel, depth = stack.pop()
        try:
            entries = list_dir(root, rel)
        except UnsafePath:
            continue
        for name, kind in entries:
            child = f"{rel}/{name}" if rel else name
            if kind == "file":
                seen += 1
                if seen > MAX_ENTRIES:
                    return
                yield child
            elif kind == "dir" and depth < max_depth:
                stack.append((child, depth + 1))


def decode(data: bytes) -> str:
    """Text from untrusted bytes: invalid UTF-8 replaced, NULs dropped."""
    return data.decode("utf-8", errors="replace").replace("\x00", "")
