"""Without a bundle on the spool the controller waits for the job to leave COMPLETING (every
node epilog, and so every fast-path drain, done) before reading Slurm's reasons."""
from __future__ import annotations

import time

from slurm_attr.collect.controller import wait_for_epilogs
from slurm_attr.errors import SlurmError


class _Slurm:
    def __init__(self, states):
        self.states, self.calls = list(states), 0

    def show_job(self, job_id):
        self.calls += 1
        st = self.states.pop(0) if len(self.states) > 1 else self.states[0]
        if isinstance(st, Exception):
            raise st
        return None if st is None else {"JobId": job_id, "JobState": st}


def test_waits_while_completing_then_returns_true():
    s = _Slurm(["COMPLETING", "COMPLETING", "FAILED"])
    assert wait_for_epilogs(s, "7", time.monotonic() + 10, poll=0.01) is True
    assert s.calls == 3


def test_deadline_while_still_completing_is_false():
    s = _Slurm(["COMPLETING"])
    assert wait_for_epilogs(s, "7", time.monotonic() + 0.05, poll=0.01) is False
    assert s.calls >= 2


def test_a_finished_state_containing_no_completing_flag_does_not_wait():
    # near miss: COMPLETED is not COMPLETING
    s = _Slurm(["COMPLETED"])
    assert wait_for_epilogs(s, "7", time.monotonic() + 10, poll=0.01) is True
    assert s.calls == 1


def test_forgotten_job_or_silent_controller_ends_the_wait():
    assert wait_for_epilogs(_Slurm([None]), "7", time.monotonic() + 10, poll=0.01) is True
    assert wait_for_epilogs(_Slurm([SlurmError("down")]), "7", time.monotonic() + 10, poll=0.01) is False
