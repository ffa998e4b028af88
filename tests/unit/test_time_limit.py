"""The analysis' hard limit (retry.time_limit) holds even when its first alarm is swallowed."""
from __future__ import annotations

import gc
import time

import pytest

from slurm_attr.pipeline.attempt import AnalysisTimeout, time_limit


class _Swallower:
    """Its finaliser spins until the alarm lands in it: Python prints "Exception ignored in"
    and drops the exception raised by the handler there."""
    hit = False

    def __del__(self):
        end = time.monotonic() + 0.5
        try:
            while time.monotonic() < end:
                pass
        except BaseException:  # noqa: BLE001 - what a finaliser does with it in practice
            _Swallower.hit = True


def test_a_swallowed_first_alarm_is_followed_by_another():
    # the spin is bounded by CPU time (a starved process must not run out of wall time first)
    t0 = time.thread_time()
    with pytest.raises(AnalysisTimeout):
        with time_limit(0.01):
            obj = _Swallower()
            del obj  # the finaliser runs now, and the first alarm fires inside it
            gc.collect()
            while time.thread_time() - t0 < 5:
                pass
    assert _Swallower.hit
    assert time.thread_time() - t0 < 5


def test_no_alarm_after_the_block():
    with time_limit(0.05):
        pass
    time.sleep(0.2)  # an alarm left armed would raise here


def test_work_within_the_limit_is_untouched():
    with time_limit(2.0):
        assert sum(range(1000)) == 499500
