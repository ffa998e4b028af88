"""Replacing a file whole: the one way slurm-attr writes a file a reader may see at any moment.

The data goes to a temporary file beside the target (same directory, so the rename cannot cross
a filesystem), then ``rename`` puts it in place: a reader, or a crash, sees the old file or the
whole new one, never half of it. The caller states the two things that differ between callers:

- ``durable``: fsync the file before the rename and the directory after it. Without it the
  rename is atomic for readers but a power cut can still lose it (or, on some filesystems,
  leave an empty file): right for files the next run rewrites anyway (a cache, a report),
  wrong for the intake, whose pending file is the only record of an ended job.
- ``dir_fd``: write relative to a directory the caller opened (O_NOFOLLOW, ownership checked),
  so a path component swapped for a symlink after the check cannot redirect the write.

The temporary is named ``.<name>.<pid>.tmp`` (a dot file: directory listings that skip dot
files never take it for the real one) and is removed on any failure before the rename. A writer
killed between write and rename (SIGKILL, power cut) leaves the old file intact and at most that
temporary; the same process id writing the same name later replaces it.
"""
from __future__ import annotations

import os

TEMP_SUFFIX = ".tmp"
_WRITE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def temp_name(name: str, pid: int | None = None) -> str:
    """The temporary a writer of ``name`` (a base name) uses: ``.<name>.<pid>.tmp``."""
    return f".{name}.{os.getpid() if pid is None else pid}{TEMP_SUFFIX}"


def is_temp(name: str) -> bool:
    """Whether a base name is a write_atomic temporary (what a clean-up may remove)."""
    head, _, pid = name[: -len(TEMP_SUFFIX)].rpartition(".")
    return name.startswith(".") and name.endswith(TEMP_SUFFIX) and len(head) > 1 and pid.isdigit()


def write_atomic(path: str, data: bytes, *, mode: int, durable: bool, dir_fd: int | None = None,
                 gid: int | None = None) -> None:
    """Replace ``path`` with ``data`` (file mode exactly ``mode``, umask aside; group ``gid`` when
    given), never following a link at the last component. With ``dir_fd``, ``path`` is a name
    inside that directory. Raises OSError as the failing call did; the temporary is gone then."""
    if dir_fd is not None:
        if "/" in path or path in ("", ".", ".."):
            raise ValueError(f"write_atomic with dir_fd takes a name, not {path!r}")
        directory, name = "", path
    else:
        directory, name = os.path.split(path)
    tmp = os.path.join(directory, temp_name(name))
    fd = _create(tmp, mode, dir_fd)
    try:
        try:
            if gid is not None:
                os.fchown(fd, -1, gid)  # before the mode: a chown clears set-id bits
            os.fchmod(fd, mode)  # exactly the caller's mode, whatever the umask
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        try:
            os.unlink(tmp, dir_fd=dir_fd)  # never leave half a file using space that may have run out
        except OSError:
            pass
        raise
    if durable:
        _sync_dir(directory, dir_fd)


def _create(tmp: str, mode: int, dir_fd: int | None) -> int:
    try:
        return os.open(tmp, _WRITE_FLAGS, mode, dir_fd=dir_fd)
    except FileExistsError:
        # A temporary of an earlier writer with this pid that was killed before its rename:
        # ours to replace (O_EXCL so that a link planted under the name is never written through).
        os.unlink(tmp, dir_fd=dir_fd)
        return os.open(tmp, _WRITE_FLAGS, mode, dir_fd=dir_fd)


def _sync_dir(directory: str, dir_fd: int | None) -> None:
    """The rename survives a crash only once its directory is on disk."""
    try:
        if dir_fd is not None:
            os.fsync(dir_fd)
            return
        dfd = os.open(directory or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:
        # The file is in place and its data on disk; some filesystems refuse fsync on a
        # directory (EINVAL), and failing the write now would only make the caller write again.
        pass
