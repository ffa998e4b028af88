"""Reading a large bundle's logs on every core, a small one in this process.

Extraction is CPU-bound Python (the per-line regex work after the prefilter), so
threads would take turns on the GIL: processes do it. They are forked, so the
catalog (compiled regexes, automata, refiners) is inherited, not rebuilt or sent,
and each one reads its own files through safefs: no log bytes cross a pipe, only
the symptoms found (pickled between our own processes; nothing a job wrote is
unpickled). This process works too: with N cores it forks N-1 helpers, and all
of them take the next file from one shared counter, largest first, so a 64 MiB
stdout on one core and the kernel logs on the other finish together.

No multiprocessing.Pool: its threads and queues cost more (~30 ms) than a fork
(~3 ms). Below ``PARALLEL_MIN`` bytes of logs, and where forking is unsafe
(another thread is running, a daemonic worker, no fork on the platform),
everything runs here, in order. If a helper dies, this process redoes its files.
Results come back in the tasks' order, so a verdict never depends on who finished
first.
"""
from __future__ import annotations

import gc
import os
import threading
from typing import Any, Callable, Sequence, TypeVar

PARALLEL_MIN = 24 << 20  # bytes of logs (capped sizes) from which a second process pays
MAX_WORKERS = 8  # beyond this, start-up and memory outweigh the gain on one bundle's files

T = TypeVar("T")
R = TypeVar("R")


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def _size(root: str, rel: str, cap: int) -> int:
    """The bytes a task will read: the file's size up to its cap; 0 when it cannot be seen."""
    try:
        return min(os.lstat(os.path.join(root, rel)).st_size, cap)
    except (OSError, ValueError):
        return 0


def workers_for(sizes: Sequence[int]) -> int:
    """How many processes to use for tasks of these sizes (1: this process alone)."""
    if sum(sizes) < PARALLEL_MIN or len(sizes) < 2:
        return 1
    if threading.active_count() > 1:
        return 1  # forking a threaded process can inherit a held lock
    if not hasattr(os, "fork"):
        return 1  # pragma: no cover - not POSIX
    import multiprocessing

    if multiprocessing.current_process().daemon:
        return 1  # a pool's worker (reanalysis in bulk, say) must not leave processes behind
    return max(1, min(_cpus(), MAX_WORKERS, len(sizes)))


class _Counter:
    """The next task index, shared by forked processes (a lock and an int in shared memory)."""

    def __init__(self) -> None:
        import multiprocessing

        self._value = multiprocessing.RawValue("i", 0)
        self._lock = multiprocessing.Lock()

    def take(self) -> int:
        with self._lock:
            i = self._value.value
            self._value.value = i + 1
            return i


def _drain(counter: _Counter, order: Sequence[int], work: Callable[[int], Any]) -> list[tuple[int, Any]]:
    done = []
    while True:
        k = counter.take()
        if k >= len(order):
            return done
        done.append((order[k], work(order[k])))


def _read_all(fd: int) -> bytes:
    chunks = []
    while True:
        b = os.read(fd, 1 << 20)
        if not b:
            return b"".join(chunks)
        chunks.append(b)


def run(bundle: Any, catalog: Any, tasks: Sequence[T], fn: Callable[[Any, Any, T], R]) -> list[R]:
    """``[fn(bundle, catalog, t) for t in tasks]``, on several processes when it pays.

    Each task is ``(source, node, relpath, cap, ...)``.
    """
    sizes = [_size(bundle.root, t[2], t[3]) for t in tasks]  # type: ignore[index]
    n = workers_for(sizes)
    if n == 1:
        return [fn(bundle, catalog, t) for t in tasks]
    for source in {t[0] for t in tasks}:  # type: ignore[index]
        catalog.index(source)  # built once here, inherited by every helper
    import pickle  # between our own processes only (see above)

    order = sorted(range(len(tasks)), key=lambda i: -sizes[i])
    counter = _Counter()

    def work(i: int) -> Any:
        return fn(bundle, catalog, tasks[i])

    helpers: list[tuple[int, int]] = []  # (pid, read end of its result pipe)
    # Objects the helpers inherit stay out of their garbage collector's sweeps, so its
    # bookkeeping writes do not copy every inherited page (copy-on-write).
    gc.freeze()
    try:
        for _ in range(n - 1):
            try:
                r, w = os.pipe()
                pid = os.fork()
            except OSError:
                break  # no process to be had: fewer helpers, or none
            if pid == 0:  # a helper: work, send what it did, leave without running exit handlers
                code = 1
                try:
                    os.close(r)
                    data = pickle.dumps(_drain(counter, order, work), protocol=pickle.HIGHEST_PROTOCOL)
                    view = memoryview(data)
                    while view:
                        view = view[os.write(w, view):]
                    code = 0
                finally:
                    os._exit(code)
            os.close(w)
            helpers.append((pid, r))
        results: dict[int, Any] = {}
        try:
            results.update(_drain(counter, order, work))
        finally:  # even when a file failed here: no helper is left behind
            for pid, r in helpers:
                try:
                    data = _read_all(r)
                finally:
                    os.close(r)
                _, status = os.waitpid(pid, 0)
                if status == 0 and data:
                    results.update(pickle.loads(data))  # our own helper's output, not job data
    finally:
        gc.unfreeze()
    # A helper that died took files it never reported: do them here (an error in one
    # then surfaces in this process, as it would without helpers).
    return [results[i] if i in results else fn(bundle, catalog, tasks[i]) for i in range(len(tasks))]
