"""Large bundles on every core, small ones in-process; the result never depends on which."""
from __future__ import annotations

import json
import os
import shutil
import threading
import time
from pathlib import Path

import pytest

from slurm_attr.bundle import Bundle
from slurm_attr.config import Config
from slurm_attr.rules import analyze, load_catalog, parallel

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "bundles" / "xid79_cascade"


def test_rules_parallel_small_bundles_stay_in_process():
    assert parallel.workers_for([1 << 20, 1 << 20]) == 1
    assert parallel.workers_for([parallel.PARALLEL_MIN]) == 1  # one file: nothing to share out


def test_rules_parallel_large_bundles_use_the_cores(monkeypatch):
    monkeypatch.setattr(parallel, "_cpus", lambda: 2)
    if threading.active_count() > 1:  # pragma: no cover - depends on the test runner
        assert parallel.workers_for([parallel.PARALLEL_MIN, 1]) == 1
        return
    assert parallel.workers_for([parallel.PARALLEL_MIN, 1]) == 2
    assert parallel.workers_for([parallel.PARALLEL_MIN // 2, parallel.PARALLEL_MIN // 2 - 1]) == 1


def test_rules_parallel_not_with_another_thread_running(monkeypatch):
    monkeypatch.setattr(parallel, "_cpus", lambda: 2)
    stop = threading.Event()
    t = threading.Thread(target=stop.wait)
    t.start()
    try:
        assert parallel.workers_for([parallel.PARALLEL_MIN, parallel.PARALLEL_MIN]) == 1
    finally:
        stop.set()
        t.join()


BARRIER = {"dir": ""}


def _where(bundle, catalog, task):  # module level: forked helpers run it too
    """(task path, pid); the first call in each process waits until two processes have
    started, so both the helper and this process are seen doing work."""
    d = BARRIER["dir"]
    if d:
        open(os.path.join(d, str(os.getpid())), "w").close()
        deadline = time.monotonic() + 20
        while len(os.listdir(d)) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
    return task[2], os.getpid()


def test_rules_parallel_results_come_back_in_task_order(monkeypatch, tmp_path):
    monkeypatch.setattr(parallel, "PARALLEL_MIN", 0)
    monkeypatch.setattr(parallel, "_cpus", lambda: 2)
    monkeypatch.setattr(threading, "active_count", lambda: 1)
    monkeypatch.setitem(BARRIER, "dir", str(tmp_path))
    tasks = [("kernel", f"gpu-00{i}", f"nodes/gpu-00{i}/kernel.log", 1 << 20) for i in (1, 2, 3, 4)]
    got = parallel.run(Bundle(str(FIXTURE)), load_catalog(), tasks, _where)
    assert [rel for rel, _pid in got] == [t[2] for t in tasks]
    pids = {pid for _rel, pid in got}
    assert os.getpid() in pids and len(pids) == 2  # this process and one forked helper
    assert sorted(os.listdir(tmp_path)) == sorted(str(p) for p in pids)


def test_rules_parallel_analysis_equals_the_sequential_one(monkeypatch, tmp_path):
    bundle_dir = tmp_path / "b"
    shutil.copytree(FIXTURE, bundle_dir)
    cfg = Config()
    seq_s, seq_c = analyze(Bundle(str(bundle_dir)), cfg)
    monkeypatch.setattr(parallel, "PARALLEL_MIN", 0)
    monkeypatch.setattr(parallel, "_cpus", lambda: 2)
    monkeypatch.setattr(threading, "active_count", lambda: 1)
    par_s, par_c = analyze(Bundle(str(bundle_dir)), cfg)
    assert [s.to_dict() for s in par_s] == [s.to_dict() for s in seq_s]
    assert [c.to_dict() for c in par_c] == [c.to_dict() for c in seq_c]
    assert any(s.id == "gpu.xid_79" for s in par_s)


def test_rules_parallel_not_inside_a_daemonic_worker(monkeypatch):
    import multiprocessing

    monkeypatch.setattr(parallel, "_cpus", lambda: 2)
    monkeypatch.setattr(threading, "active_count", lambda: 1)
    assert parallel.workers_for([parallel.PARALLEL_MIN, 1]) == 2
    monkeypatch.setattr(multiprocessing.current_process(), "daemon", True, raising=False)
    assert parallel.workers_for([parallel.PARALLEL_MIN, 1]) == 1


def test_rules_parallel_falls_back_when_no_process_can_start(monkeypatch):
    monkeypatch.setattr(parallel, "PARALLEL_MIN", 0)
    monkeypatch.setattr(parallel, "_cpus", lambda: 2)
    monkeypatch.setattr(threading, "active_count", lambda: 1)

    def no_fork():
        raise OSError(11, "Resource temporarily unavailable")

    monkeypatch.setattr(os, "fork", no_fork)
    tasks = [("kernel", "gpu-001", "nodes/gpu-001/kernel.log", 1 << 20), ("kernel", "gpu-002", "nodes/gpu-002/kernel.log", 1 << 20)]
    got = parallel.run(Bundle(str(FIXTURE)), load_catalog(), tasks, _where)
    assert got == [(t[2], os.getpid()) for t in tasks]


def _boom(bundle, catalog, task):
    if task[1] == "gpu-002":
        raise RuntimeError(f"broken on {task[1]}")
    return task[2]


def test_rules_parallel_a_failing_file_fails_the_run_without_leaving_helpers(monkeypatch):
    monkeypatch.setattr(parallel, "PARALLEL_MIN", 0)
    monkeypatch.setattr(parallel, "_cpus", lambda: 2)
    monkeypatch.setattr(threading, "active_count", lambda: 1)
    tasks = [("kernel", f"gpu-00{i}", f"nodes/gpu-00{i}/kernel.log", 1 << 20) for i in (1, 2, 3)]
    with pytest.raises(RuntimeError, match="broken on gpu-002"):
        parallel.run(Bundle(str(FIXTURE)), load_catalog(), tasks, _boom)
    with pytest.raises(ChildProcessError):
        os.waitpid(-1, os.WNOHANG)  # every helper was reaped


def test_rules_parallel_counter_gives_each_index_once_across_forks():
    counter = parallel._Counter()
    n, kids = 2000, []
    try:
        for _ in range(3):
            r, w = os.pipe()
            pid = os.fork()
            if pid == 0:  # pragma: no cover - the child
                try:
                    got = []
                    while (k := counter.take()) < n:
                        got.append(k)
                    os.write(w, json.dumps(got).encode())
                finally:
                    os._exit(0)
            os.close(w)
            kids.append((pid, r))
        mine = []
        while (k := counter.take()) < n:
            mine.append(k)
        taken = list(mine)
        for pid, r in kids:
            data = b""
            while chunk := os.read(r, 1 << 16):
                data += chunk
            os.close(r)
            os.waitpid(pid, 0)
            taken += json.loads(data)
    finally:
        counter.close()
    # none twice, none lost (a counter each process kept for itself would give every index 4 times)
    assert sorted(taken) == list(range(n))
