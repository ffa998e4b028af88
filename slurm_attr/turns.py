"""Turns of the controller's periodic housekeeping (spool gc, the auto_undrain pass): a stamp file
in the intake dir whose mtime is the last turn, so that many short-lived workers and `sattr retry`
runs start each job at most once per interval without a daemon."""
from __future__ import annotations

import os


def take(directory: str, name: str, every_s: float, now: float) -> bool:
    """Whether the last turn is at least ``every_s`` old (or there was none); if so the stamp is
    renewed to ``now`` and the caller has the turn. An unreadable stamp is no turn; a stamp that
    cannot be written raises OSError (the caller logs it)."""
    stamp = os.path.join(directory, name)
    try:
        if now - os.lstat(stamp).st_mtime < every_s:
            return False
    except FileNotFoundError:
        pass
    except OSError:
        return False
    os.makedirs(directory, mode=0o700, exist_ok=True)
    os.close(os.open(stamp, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o600))
    os.utime(stamp, (now, now))
    return True
