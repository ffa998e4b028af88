"""Watchers per node, bounded (issue 21 item 3): slots, the queue of steps beyond them and
their adoption (live/host.py), and what slurmstepd tells a watcher (live/stepd.py)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from slurm_attr.live.host import GRACE_CYCLES, Host, Slots, StepArgs
from slurm_attr.live.stepd import Stepd


class FakeWatcher:
    def __init__(self, args: StepArgs):
        self.args, self.job, self.step, self.cycles, self.alive, self.left = args, args.job, args.step, 0, True, False

    def step_alive(self) -> bool:
        return self.alive

    def cycle(self) -> None:
        self.cycles += 1

    def leave(self) -> None:
        self.left = True

    def note(self, text: str) -> None:
        pass


def _step(job: str, step: str, stepd_pid: int | None = None) -> StepArgs:
    return StepArgs(job=job, node="n1", step=step, jobdir=f"/var/tmp/slurm_attr/{job}", stepd_pid=stepd_pid)


def test_slots_are_held_per_process_and_steps_beyond_them_queue(tmp_path):
    a, b, c = (Slots(str(tmp_path), 2) for _ in range(3))
    assert (a.take(), b.take(), c.take(wait_s=0.3)) == (0, 1, None)
    c.enqueue(_step("7", "3"))
    assert [n for n, _ in c.queued()] == ["7.3.n1.json"]
    a.close()  # a watcher ends: its slot is free again
    assert c.take() == 0
    for s in (b, c):
        s.close()


def test_a_host_adopts_its_own_jobs_steps_at_once_and_others_after_the_grace(tmp_path):
    slots, other = Slots(str(tmp_path), 1), Slots(str(tmp_path), 1)
    assert slots.take() == 0 and other.take() is None
    made: list[FakeWatcher] = []

    def make(args: StepArgs) -> FakeWatcher:
        made.append(FakeWatcher(args))
        return made[-1]

    h = Host(0.05, make, slots, steps_per_watcher=3)
    h.add(make(_step("7", "0")))
    other.enqueue(_step("7", "1"))  # same job: at once
    other.enqueue(_step("8", "0"))  # another job's step: after GRACE_CYCLES intervals
    h.adopt()
    assert [(w.job, w.args.step) for _, w in h.watchers] == [("7", "0"), ("7", "1")]
    time.sleep(GRACE_CYCLES * 0.05 + 0.05)
    h.adopt()
    assert [(w.job, w.args.step) for _, w in h.watchers] == [("7", "0"), ("7", "1"), ("8", "0")]
    # full: a fourth waits in the queue
    other.enqueue(_step("7", "2"))
    time.sleep(GRACE_CYCLES * 0.05 + 0.05)
    h.adopt()
    assert len(h.watchers) == 3 and [n for n, _ in slots.queued()] == ["7.2.n1.json"]
    # a step ends: it leaves, its claim goes, and the waiting one gets its place
    made[1].alive = False
    h.cycle()
    h.adopt()
    assert made[1].left and [(w.job, w.args.step) for _, w in h.watchers] == [("7", "0"), ("8", "0"), ("7", "2")]
    assert sorted(os.listdir(slots.claimed_dir())) == ["7.2.n1.json", "8.0.n1.json"]
    # the slot file says which steps this process watches (how an admin finds a step's watcher)
    with open(os.path.join(slots.dir, f"slot.{slots.index}")) as f:
        assert json.load(f) == {"pid": os.getpid(), "steps": ["7.0", "7.2", "8.0"]}
    slots.close()


def test_the_next_holder_of_a_slot_adopts_what_a_dead_host_left(tmp_path):
    first = Slots(str(tmp_path), 1)
    assert first.take() == 0
    first.enqueue(_step("9", "4", stepd_pid=os.getpid()))
    first.enqueue(_step("9", "5", stepd_pid=2 ** 22 + 11))  # its slurmstepd is gone
    h = Host(0.05, FakeWatcher, first)
    h.adopt()
    assert [w.args.step for _, w in h.watchers] == ["4"]  # the dead step's request is removed
    assert first.queued() == [] and os.listdir(first.claimed_dir()) == ["9.4.n1.json"]
    first.close()  # the host dies without leaving its steps
    second = Slots(str(tmp_path), 1)
    assert second.take() == 0
    h2 = Host(0.05, FakeWatcher, second)
    h2.adopt()
    assert [(w.job, w.args.step) for _, w in h2.watchers] == [("9", "4")]
    second.close()


def test_a_host_runs_until_its_last_step_ends_and_takes_what_waits_before_it_goes(tmp_path):
    slots, other = Slots(str(tmp_path), 1), Slots(str(tmp_path), 1)
    assert slots.take() == 0
    made: list[FakeWatcher] = []
    h = Host(0.02, lambda a: made.append(FakeWatcher(a)) or made[-1], slots)
    h.add(FakeWatcher(_step("7", "0")))
    h.watchers[0][1].alive = False
    other.enqueue(_step("8", "0"))  # another job's, fresh: taken once this host has nothing left
    h.run(max_cycles=3)
    assert [w.job for w in made] == ["8"] and made[0].cycles >= 1 and made[0].left
    slots.close()


def test_a_queued_request_of_the_wrong_shape_is_dropped(tmp_path):
    s = Slots(str(tmp_path), 1)
    assert s.take() == 0
    with open(os.path.join(s.dir, "queue", "7.0.n1.json"), "w") as f:
        f.write('{"job": "7; rm -rf /", "node": "n1", "step": "0", "jobdir": "/x"}')
    Host(0.05, FakeWatcher, s).adopt()
    assert s.queued() == [] and os.listdir(s.claimed_dir()) == []
    s.close()


def test_stepd_owns_its_descendants_only():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert Stepd(os.getpid()).owns(child.pid) is None
        assert Stepd(os.getpid()).alive()
        other = Stepd(child.pid)  # near miss: a process that is not the server's ancestor
        assert other.owns(os.getpid()) == f"served by process {os.getpid()}, not of this step"
    finally:
        child.kill()
        child.wait()
    assert not Stepd(child.pid).alive()
