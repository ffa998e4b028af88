"""What software the node runs, as the node itself says it: the NVIDIA kernel module's version.

`/proc/driver/nvidia/version` is the loaded module's own text (`NVRM version: NVIDIA UNIX x86_64
Kernel Module  535.104.05  ...`): root's, not the job's, so trusted like the kernel log. The
analysis compares it across the job's nodes (rules/version_skew.py): one node on another driver
than the rest is an infrastructure cause there. The driver's load banner in the kernel log says
the same, but only when the module loaded inside the job's window.
"""
from __future__ import annotations

import os

MAX_BYTES = 4096  # the file is two short lines; a bound all the same


def driver_version_text(path: str) -> bytes:
    """The version file's text (bounded, never blocking, no symlink followed); b"" without one."""
    if not path:
        return b""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return b""  # no NVIDIA driver loaded (or no GPU node): nothing to compare
    try:
        return os.read(fd, MAX_BYTES)
    except OSError:
        return b""
    finally:
        os.close(fd)
