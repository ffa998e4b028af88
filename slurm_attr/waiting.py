"""Waiting for something outside our control (accounting catching up, a node's epilog, a drain
taking), the one way: ask, and ask again after a pause, until the answer is the one wanted or a
bound is reached. Every wait has a bound (seconds, tries, or both) and, when it gives up, a log
line that says what it waited for and how long.

The probe is asked first at once; the bound is checked after each answer, so the last answer is
taken at or after the deadline (a wait of 0 s asks once). What the probe raises ends the wait
and reaches the caller: only the caller knows whether an error means "stop" or "ask again".
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable, Generic, TypeVar

log = logging.getLogger("slurm_attr")

T = TypeVar("T")


@dataclass
class Waited(Generic[T]):
    value: T  # the probe's last answer: the one wanted, or the latest when the wait gave up
    ok: bool  # the answer is the one wanted (False: a bound was reached first)
    tries: int
    waited_s: float


def wait_until(probe: Callable[[], T], timeout_s: float | None, interval_s: float | Callable[[T], float],
               what: str, *, done: Callable[[T], bool] = bool, max_tries: int | None = None,
               sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic,
               level: int = logging.INFO) -> Waited[T]:
    """Ask ``probe()`` until ``done(answer)`` (by default: the answer is truthy), pausing
    ``interval_s`` between tries (or ``interval_s(answer)``, where the pause depends on the
    answer), for at most ``timeout_s`` seconds and/or ``max_tries`` tries (one bound at least).
    Gives up with a log line at ``level`` naming ``what``."""
    if timeout_s is None and max_tries is None:
        raise ValueError(f"waiting for {what}: no bound (timeout_s or max_tries)")
    start = clock()
    deadline = None if timeout_s is None else start + timeout_s
    tries = 0
    while True:
        value = probe()
        tries += 1
        if done(value):
            return Waited(value, True, tries, clock() - start)
        now = clock()
        if (deadline is not None and now >= deadline) or (max_tries is not None and tries >= max_tries):
            log.log(level, "gave up waiting for %s after %.1f s (%d tries)", what, now - start, tries)
            return Waited(value, False, tries, now - start)
        sleep(interval_s(value) if callable(interval_s) else interval_s)
