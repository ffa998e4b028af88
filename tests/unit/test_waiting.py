"""waiting.wait_until: the one poll loop (issue 27). Fake clock and sleep: no test waits for real."""
from __future__ import annotations

import logging

import pytest

from slurm_attr.waiting import wait_until


class Clock:
    """time.monotonic and time.sleep in one: sleeping moves the clock, and only that does."""

    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.now += s


def answers(*values):
    it = iter(values)
    return lambda: next(it)


def test_returns_the_wanted_answer_as_soon_as_it_comes():
    c = Clock()
    got = wait_until(answers(None, 0, "there", "later"), 10.0, 0.5, "the thing", sleep=c.sleep, clock=c)
    assert (got.value, got.ok, got.tries, got.waited_s) == ("there", True, 3, 1.0)
    assert c.slept == [0.5, 0.5]


def test_a_ready_answer_is_not_waited_for():
    c = Clock()
    got = wait_until(answers(7), 10.0, 0.5, "the thing", sleep=c.sleep, clock=c)
    assert (got.value, got.ok, got.tries) == (7, True, 1) and c.slept == []


def test_gives_up_at_the_deadline_with_the_last_answer_and_says_what_it_waited_for(caplog):
    c = Clock()
    with caplog.at_level(logging.INFO, logger="slurm_attr"):
        got = wait_until(lambda: ["n2"], 1.0, 0.3, "the node parts of job 7", done=lambda m: not m,
                         sleep=c.sleep, clock=c)
    # tries at 0, 0.3, 0.6, 0.9, 1.2: the last at or after the deadline
    assert (got.value, got.ok, got.tries) == (["n2"], False, 5)
    assert got.waited_s == pytest.approx(1.2)
    assert caplog.messages == ["gave up waiting for the node parts of job 7 after 1.2 s (5 tries)"]


def test_no_log_line_when_the_wait_succeeds(caplog):
    c = Clock()
    with caplog.at_level(logging.DEBUG, logger="slurm_attr"):
        wait_until(answers(False, True), 1.0, 0.3, "x", sleep=c.sleep, clock=c)
    assert caplog.messages == []


def test_a_zero_timeout_asks_once():
    c = Clock()
    got = wait_until(answers(False, True), 0.0, 0.3, "x", sleep=c.sleep, clock=c)
    assert (got.ok, got.tries) == (False, 1) and c.slept == []


def test_max_tries_bounds_the_wait_without_a_deadline():
    c = Clock()
    got = wait_until(lambda: 0, None, 2.0, "x", max_tries=3, sleep=c.sleep, clock=c)
    assert (got.ok, got.tries) == (False, 3) and c.slept == [2.0, 2.0]
    # near miss: the third answer is the one
    got = wait_until(answers(0, 0, 1), None, 2.0, "x", max_tries=3, sleep=c.sleep, clock=c)
    assert (got.value, got.ok, got.tries) == (1, True, 3)


def test_the_pause_can_depend_on_the_answer():
    c = Clock()
    got = wait_until(answers("down", "lagging", "down", "final"), 60.0, lambda a: 1.0 if a == "down" else 0.5,
                     "x", done=lambda a: a == "final", sleep=c.sleep, clock=c)
    assert got.ok and c.slept == [1.0, 0.5, 1.0]


def test_what_the_probe_raises_reaches_the_caller_at_once():
    c = Clock()
    calls = []

    def probe():
        calls.append(1)
        if len(calls) == 2:
            raise ConnectionError("controller down")
        return False

    with pytest.raises(ConnectionError, match="controller down"):
        wait_until(probe, 10.0, 0.5, "x", sleep=c.sleep, clock=c)
    assert len(calls) == 2 and c.slept == [0.5]


def test_a_wait_without_a_bound_is_refused():
    with pytest.raises(ValueError, match="no bound"):
        wait_until(lambda: False, None, 0.5, "forever")
