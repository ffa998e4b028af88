"""Reading a large bundle's logs on every core, a small one in this process.

Extraction is CPU-bound Python (the per-line regex work after the prefilter), so
threads would take turns on the GIL: processes do it. They are forked, so the
catalog (compiled regexes, automata, refiners) is inherited, not rebuilt or sent,
and each one reads its own files through safefs: no log bytes cross a pipe, only
the symptoms found, as JSON (nothing is ever unpickled, not even our own helper's
output: the analysis runs as root on what jobs wrote, DESIGN §5). A codec turns a
task's result into JSON values and back (wire.py for symptoms); a result it cannot
carry exactly is redone here. This process works too: with N cores it forks N-1
helpers, and all of them take the next file from one shared counter, largest first,
so a 64 MiB stdout on one core and the kernel logs on the other finish together.

No multiprocessing.Pool: its threads and queues cost more (~30 ms) than a fork
(~3 ms). Below ``PARALLEL_MIN`` bytes of logs, and where forking is unsafe
(another thread is running, a daemonic worker, no fork on the platform),
everything runs here, in order. If a helper dies, this process redoes its files.
Results come back in the tasks' order, so a verdict never depends on who finished
first.
"""
from __future__ import annotations

import gc
import json
import mmap
import os
import sys
import threading
from typing import Any, Callable, Optional, Protocol, Sequence, TypeVar

PARALLEL_MIN = 24 << 20  # bytes of logs (capped sizes) from which a second process pays
MAX_WORKERS = 8  # beyond this, start-up and memory outweigh the gain on one bundle's files

T = TypeVar("T")
R = TypeVar("R")


MAX_RESULT = 1 << 30  # bytes one helper may send back: far above any real result, a bound all the same


class Codec(Protocol):
    def encode(self, result: Any) -> Optional[Any]: ...  # JSON values, or None: cannot carry it exactly
    def decode(self, value: Any) -> Any: ...  # ValueError when malformed


class PlainCodec:
    """Results made of str, int, float, bool, None, lists, tuples and str-keyed dicts, exactly
    (a tuple comes back a tuple); anything else is not carried (None)."""

    @staticmethod
    def encode(result: Any) -> Optional[Any]:
        def conv(v: Any, depth: int) -> Any:
            t = type(v)
            if t in (str, int, float, bool) or v is None:
                return v
            if depth > 32:
                raise TypeError("too deep")
            if t is list:
                return [conv(x, depth + 1) for x in v]
            if t is tuple:
                return {"t": [conv(x, depth + 1) for x in v]}
            if t is dict and all(type(k) is str for k in v):
                return {"d": {k: conv(x, depth + 1) for k, x in v.items()}}
            raise TypeError(t.__name__)

        try:
            return conv(result, 0)
        except (TypeError, RecursionError):
            return None

    @staticmethod
    def decode(value: Any) -> Any:
        def back(v: Any) -> Any:
            if type(v) is list:
                return [back(x) for x in v]
            if type(v) is dict:
                if "t" in v and len(v) == 1 and type(v["t"]) is list:
                    return tuple(back(x) for x in v["t"])
                if "d" in v and len(v) == 1 and type(v["d"]) is dict:
                    return {k: back(x) for k, x in v["d"].items()}
                raise ValueError("unknown record")
            return v

        return back(value)


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
    mp = sys.modules.get("multiprocessing")  # not imported: this is no multiprocessing worker
    if mp is not None and mp.current_process().daemon:
        return 1  # a pool's worker (reanalysis in bulk, say) must not leave processes behind
    return max(1, min(_cpus(), MAX_WORKERS, len(sizes)))


class _Counter:
    """The next task index, shared by forked processes: an int in an anonymous shared
    mapping, guarded by a pipe that holds one token byte (read it to hold the lock, write it
    back to release). multiprocessing's RawValue and Lock would do the same, but importing
    multiprocessing costs more start-up time than the whole work of a small bundle."""

    def __init__(self) -> None:
        self._mem = mmap.mmap(-1, 8)  # MAP_SHARED | MAP_ANONYMOUS: one page every fork shares
        self._r, self._w = os.pipe()
        os.write(self._w, b"t")

    def take(self) -> int:
        os.read(self._r, 1)  # waits while another process holds the token
        try:
            i = int.from_bytes(self._mem[:8], "little")
            self._mem[:8] = (i + 1).to_bytes(8, "little")
            return i
        finally:
            os.write(self._w, b"t")

    def close(self) -> None:
        os.close(self._r)
        os.close(self._w)
        self._mem.close()


def _drain(counter: _Counter, order: Sequence[int], work: Callable[[int], Any]) -> list[tuple[int, Any]]:
    done = []
    while True:
        k = counter.take()
        if k >= len(order):
            return done
        done.append((order[k], work(order[k])))


def _read_all(fd: int, limit: int) -> bytes:
    chunks = []
    got = 0
    while True:
        b = os.read(fd, 1 << 20)
        if not b:
            return b"".join(chunks) if got <= limit else b""
        got += len(b)
        if got > limit:
            chunks = []  # not a result of ours: read to the end (the helper must not block), redo its files
        else:
            chunks.append(b)


def _helper_results(data: bytes, n_tasks: int, codec: Codec) -> dict[int, Any]:
    """A helper's [[task index, encoded result], ...]; what does not decode is left out (redone here)."""
    out: dict[int, Any] = {}
    try:
        doc = json.loads(data)
    except ValueError:
        return out
    if type(doc) is not list:
        return out
    for item in doc:
        if type(item) is not list or len(item) != 2 or type(item[0]) is not int or not 0 <= item[0] < n_tasks:
            continue
        try:
            out[item[0]] = codec.decode(item[1])
        except ValueError:
            continue
    return out


def run(bundle: Any, catalog: Any, tasks: Sequence[T], fn: Callable[[Any, Any, T], R],
        codec: Optional[Codec] = None) -> list[R]:
    """``[fn(bundle, catalog, t) for t in tasks]``, on several processes when it pays.

    Each task is ``(source, node, relpath, cap, ...)``. ``codec`` carries a result from a
    helper to this process as JSON (default: PlainCodec).
    """
    # Extraction makes ~100k short-lived objects, none in a cycle: the collector's sweeps
    # over them are pure cost (3% of a large bundle's extraction), so it pauses meanwhile.
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return _run(bundle, catalog, tasks, fn, codec)
    finally:
        if was_enabled:
            gc.enable()


def _run(bundle: Any, catalog: Any, tasks: Sequence[T], fn: Callable[[Any, Any, T], R],
         codec: Optional[Codec]) -> list[R]:
    sizes = [_size(bundle.root, t[2], t[3]) for t in tasks]  # type: ignore[index]
    n = workers_for(sizes)
    if n == 1:
        return [fn(bundle, catalog, t) for t in tasks]
    for source in {t[0] for t in tasks}:  # type: ignore[index]
        catalog.index(source)  # built once here, inherited by every helper
    wire: Codec = codec if codec is not None else PlainCodec()

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

                    def encoded(i: int) -> str:
                        # Encoded as each file is done, not all at the end: this cost then counts
                        # in the shared queue's balance instead of keeping this process waited for.
                        value = wire.encode(work(i))
                        if value is None:
                            return ""  # the parent redoes task i
                        # acyclic by construction (the codec refuses deep values): no cycle check
                        return json.dumps([i, value], separators=(",", ":"), check_circular=False)

                    parts = [p for _i, p in _drain(counter, order, encoded) if p]
                    data = ("[" + ",".join(parts) + "]").encode()
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
                    data = _read_all(r, MAX_RESULT)
                finally:
                    os.close(r)
                _, status = os.waitpid(pid, 0)
                if status == 0 and data:
                    results.update(_helper_results(data, len(tasks), wire))
    finally:
        gc.unfreeze()
        counter.close()
    # A helper that died took files it never reported: do them here (an error in one
    # then surfaces in this process, as it would without helpers).
    return [results[i] if i in results else fn(bundle, catalog, tasks[i]) for i in range(len(tasks))]
