"""Outages of the pyslurm binding, logged once each (pyslurm_backend.py falls back to the CLI)."""
from __future__ import annotations

import logging
import threading
import time
from typing import Any

log = logging.getLogger("slurm_attr")


class Outages:
    """One log line when pyslurm's calls of one kind start failing and one when they work
    again, per process: with slurmdbd stopped every accounting call fails the same way (22.05:
    ``TypeError: an integer is required``), and a warning per call (99 in one run) buries the
    log. Kinds: "accounting" (slurmdbd) and "controller" (slurmctld) fail apart."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._down: dict[str, list[Any]] = {}  # kind -> [monotonic start, failures]

    def failed(self, kind: str, what: str, err: BaseException) -> None:
        with self._lock:
            state = self._down.setdefault(kind, [time.monotonic(), 0])
            state[1] += 1
            first = state[1] == 1
        if first:
            log.warning("pyslurm %s calls fail (%s: %s: %s); the Slurm CLI answers them until they work again",
                        kind, what, type(err).__name__, err)
        else:
            log.debug("pyslurm %s calls still fail (%s: %s: %s)", kind, what, type(err).__name__, err)

    def worked(self, kind: str) -> None:
        if kind not in self._down:  # the usual case, without the lock
            return
        with self._lock:
            state = self._down.pop(kind, None)
        if state is not None:
            log.info("pyslurm %s calls work again, after %d failure(s) in %.0f s",
                     kind, state[1], time.monotonic() - state[0])


OUTAGES = Outages()
