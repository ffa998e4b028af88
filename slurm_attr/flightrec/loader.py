"""Finding Flight Recorder dumps in a bundle (or a plain directory) and loading them.

torch names a dump ``<prefix><global rank>`` with no extension (JSON twins as
``.json``); the prefix is whatever TORCH_FR_DUMP_TEMP_FILE said, so it is
detected: the name pattern that covers the most ranks wins. Files are opened
through safefs (no symlinks, no FIFOs, bounded reads). A file that cannot be
used becomes a ``DumpProblem`` (a coverage entry), never an exception.

Large jobs are loaded by two processes; each returns compact ``RankTrace``
records (integer arrays), never the raw entries.
"""
from __future__ import annotations

import contextlib
import gc
import json
import multiprocessing
import os
import posixpath
import re
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator

from .. import safefs
from ..bundle import Bundle
from ..errors import UnsafePath
from . import safepickle
from .trace import SigTable, digest
from .types import DumpError, DumpProblem, RankTrace, Sig
from .tracewire import from_wire, to_wire

DEFAULT_FILE_CAP = 64 << 20
# Newest entries read per rank on large dumps; older history is read only when needed.
# "auto": an overall budget shared by the ranks, within [TAIL_MIN, TAIL_MAX] per rank,
# so 1024 ranks compare 256 entries each and 4096 ranks 64 (about 10 training steps).
DEFAULT_TAIL_ENTRIES = "auto"
TAIL_BUDGET = 1 << 18
TAIL_MIN, TAIL_MAX = 64, 512


def tail_for(n_ranks: int) -> int:
    """Entries per rank for the automatic tail budget."""
    return max(TAIL_MIN, min(TAIL_MAX, TAIL_BUDGET // max(1, n_ranks)))
PARALLEL_MIN_FILES = 64
CHUNK_RANKS = 512
_NAME = re.compile(r"^(?P<prefix>.*?)(?P<rank>\d{1,7})(?P<ext>\.json|\.pkl|\.pickle)?$")


@dataclass
class DumpFile:
    """One candidate dump: where it is and which rank its name says it holds."""

    rel: str  # relative to the root
    node: str | None
    rank: int
    json_name: bool


@dataclass
class DumpSet:
    """All dumps of one job, validated, plus what could not be used."""

    root: str
    traces: dict[int, RankTrace] = field(default_factory=dict)
    sigs: dict[int, Sig] = field(default_factory=dict)
    members: dict[str, tuple[int, ...]] = field(default_factory=dict)
    problems: list[DumpProblem] = field(default_factory=list)
    prefix: str | None = None
    nodes: dict[str, int] = field(default_factory=dict)  # node -> dumps found there
    ignored_files: int = 0
    job_ranks: dict[int, str] = field(default_factory=dict)  # from job.json
    tail_entries: int | None = None
    files: dict[int, list[DumpFile]] = field(default_factory=dict)
    seconds: float = 0.0

    def node_of(self, rank: int | None) -> str | None:
        """The rank's node: from job.json, else the node whose fr/ held its dump."""
        if rank is None:
            return None
        if rank in self.job_ranks:
            return self.job_ranks[rank]
        tr = self.traces.get(rank)
        if tr is not None:
            return tr.node
        for f in self.files.get(rank, ()):
            return f.node
        return None


def _candidates(paths: Iterable[tuple[str, str | None]]) -> tuple[str | None, dict[int, list[DumpFile]], int]:
    """Group file names by detected prefix; keep the prefix that covers most ranks."""
    groups: dict[str, dict[int, list[DumpFile]]] = {}
    total = 0
    for rel, node in paths:
        total += 1
        m = _NAME.match(posixpath.basename(rel))
        if not m:
            continue
        rank = int(m.group("rank"))
        f = DumpFile(rel=rel, node=node, rank=rank, json_name=m.group("ext") == ".json")
        groups.setdefault(m.group("prefix"), {}).setdefault(rank, []).append(f)
    if not groups:
        return None, {}, total
    # Most ranks wins; on a tie prefer a torch-looking name, then the shorter prefix.
    prefix = max(groups, key=lambda p: (len(groups[p]), "trace" in p or p.startswith("_dump"), -len(p)))
    chosen = groups[prefix]
    used = sum(len(v) for v in chosen.values())
    for files in chosen.values():
        # Pickles carry stacks; JSON twins are the fallback.
        files.sort(key=lambda f: (f.json_name, f.rel))
    return prefix, chosen, total - used


def _pread_all(fd: int, off: int, n: int) -> bytes:
    chunks = []
    while n > 0:
        b = os.pread(fd, min(n, 1 << 24), off)
        if not b:
            break
        chunks.append(b)
        off += len(b)
        n -= len(b)
    return b"".join(chunks)


def _read_plain(root: str, f: DumpFile, cap: int, tail_entries: int | None) -> safepickle.Loaded:
    """Load one dump file as plain data (pickle or JSON, by content)."""
    try:
        fd = safefs.open_file(root, f.rel)
    except UnsafePath as err:
        raise DumpError(str(err)) from err
    try:
        size = os.fstat(fd).st_size
        if hasattr(os, "posix_fadvise"):
            # Only head and tail of a large dump are read: no readahead of the middle.
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        first = os.pread(fd, 1, 0)
        if first == b"\x80":
            return safepickle.load(lambda off, n: _pread_all(fd, off, n), size, cap, tail_entries)
        if size > cap:
            raise DumpError(f"{size} bytes, more than the {cap}-byte cap", status="truncated")
        data = _pread_all(fd, 0, size)
        if data.lstrip()[:1] == b"{":
            try:
                return safepickle.Loaded(data=json.loads(data), bytes_read=len(data), fmt="json")
            except (ValueError, RecursionError) as err:
                raise DumpError(f"bad JSON: {str(err)[:200]}") from err
        if not data:
            raise DumpError("empty file (the writer was probably killed)")
        raise DumpError("neither a pickle nor JSON")
    finally:
        os.close(fd)


def _load_rank(root: str, files: list[DumpFile], cap: int, tail_entries: int | None, table: SigTable,
               members: dict[str, tuple[int, ...]]) -> tuple[RankTrace | None, list[DumpProblem]]:
    problems: list[DumpProblem] = []
    for f in files:
        try:
            loaded = _read_plain(root, f, cap, tail_entries)
            tr = digest(loaded.data, f.rank, f.rel, f.node, loaded.fmt, table, members, loaded.history_truncated, loaded.head_entries)
        except DumpError as err:
            problems.append(DumpProblem(path=f.rel, node=f.node, rank=f.rank, status=err.status, detail=str(err)[:300]))
            continue
        if isinstance(loaded.data, dict) and "version" not in loaded.data and "entries" not in loaded.data:
            problems.append(DumpProblem(path=f.rel, node=f.node, rank=f.rank, status="error", detail="not a Flight Recorder dump (no version, no entries)"))
            continue
        return tr, problems
    return None, problems


def _load_chunk(args: tuple[str, list[tuple[int, list[DumpFile]]], int, int | None, float | None]) -> tuple[list[RankTrace], dict[int, Sig], dict[str, tuple[int, ...]], list[DumpProblem]]:
    """Worker: load some ranks; return compact traces, the signatures they use, member lists."""
    root, work, cap, tail_entries, deadline = args
    table = SigTable()
    members: dict[str, tuple[int, ...]] = {}
    traces: list[RankTrace] = []
    problems: list[DumpProblem] = []
    with paused_gc():  # millions of short-lived containers, no cycles: GC passes are pure overhead
        for rank, files in work:
            if deadline is not None and time.monotonic() > deadline:
                problems.append(DumpProblem(path=files[0].rel, node=files[0].node, rank=rank, status="truncated", detail="not read: analysis time budget spent"))
                continue
            tr, probs = _load_rank(root, files, cap, tail_entries, table, members)
            problems.extend(probs)
            if tr is not None:
                traces.append(tr)
    return traces, table.sigs, members, problems


def _load_chunk_wire(args: tuple[str, list[tuple[int, list[DumpFile]]], int, int | None, float | None]) -> tuple[list[tuple[Any, ...]], dict[int, Sig], dict[str, tuple[int, ...]], list[DumpProblem]]:
    """_load_chunk in a pool worker: the traces as plain values (tracewire.py), cheaper to send."""
    traces, sigs, members, problems = _load_chunk(args)
    return [to_wire(tr) for tr in traces], sigs, members, problems


@contextlib.contextmanager
def frozen_gc() -> Iterator[None]:
    """Every object alive now left out of the GC's passes for a while (gc.freeze), then back.
    Not where something else froze objects already (rules/parallel.py before its forks):
    unfreeze would hand those back too."""
    if gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


@contextlib.contextmanager
def paused_gc() -> Iterator[None]:
    """The cyclic GC off for a while (as it was before afterwards). Loading builds containers
    by the million and none of them in a cycle, so each pass the GC makes is wasted; in the
    parent, which unpickles the workers' traces (the pool's result thread) while they still
    load, the passes over the growing heap cost 3x the unpickling itself."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def discover(source: Bundle | str) -> tuple[str, list[tuple[str, str | None]], dict[int, str]]:
    """(root, [(relative path, node)], rank -> node from job.json) for a bundle or a directory."""
    root, paths, bundle = _find(source)
    return root, paths, bundle.ranks() if bundle is not None else {}


def _find(source: Bundle | str) -> tuple[str, list[tuple[str, str | None]], Bundle | None]:
    """(root, [(relative path, node)], the bundle when ``source`` is one) for a bundle or a directory."""
    if isinstance(source, str):
        if os.path.isdir(os.path.join(source, "nodes")) or os.path.isfile(os.path.join(source, "job.json")):
            source = Bundle(source)
        else:
            root = os.path.abspath(source)
            try:
                safefs.list_dir(root)
            except UnsafePath as err:
                raise DumpError(f"cannot read {source}: {err}") from err
            return root, [(rel, None) for rel in sorted(safefs.walk_files(root))], None
    paths: list[tuple[str, str | None]] = []
    for node in source.nodes():
        for rel in source.node_files(node, "fr"):
            paths.append((rel, node))
    return source.root, paths, source


def load_dumps(source: Bundle | str, cap: int = DEFAULT_FILE_CAP, tail_entries: int | str | None = DEFAULT_TAIL_ENTRIES,
               workers: int = 2, deadline: float | None = None, ranks: Iterable[int] | None = None) -> DumpSet:
    """Find and load every rank's dump under ``source`` (a Bundle, a bundle dir or a dump dir).

    ``tail_entries``: on large dumps read only the newest N entries per rank
    ("auto": by the number of ranks, see tail_for; None: everything). ``ranks``:
    load only these ranks. ``deadline``: a time.monotonic() value after which
    remaining files are skipped (coverage).
    """
    t0 = time.monotonic()
    root, paths, bundle = _find(source)
    prefix, chosen, ignored = _candidates(paths)
    if tail_entries == "auto":
        tail_entries = tail_for(len(chosen))
    if tail_entries is not None and not isinstance(tail_entries, int):
        raise ValueError(f"tail_entries: an int, 'auto' or None, not {tail_entries!r}")
    ds = DumpSet(root=root, prefix=prefix, ignored_files=ignored, tail_entries=tail_entries, files=chosen)
    for files in chosen.values():
        node = files[0].node
        if node is not None:
            ds.nodes[node] = ds.nodes.get(node, 0) + 1
    wanted = set(ranks) if ranks is not None else None
    work = sorted((r, fs) for r, fs in chosen.items() if wanted is None or r in wanted)

    def job_ranks() -> None:
        # Without job.json's ranks these are the node collectors' rank maps: a collect.json per
        # node (4,096 at 32,768 ranks, ~1 s), read here while the workers load the dumps.
        if bundle is not None:
            ds.job_ranks = bundle.ranks()

    _load_into(ds, work, cap, tail_entries, workers, deadline, meanwhile=job_ranks)
    ds.seconds = time.monotonic() - t0
    return ds


def reload_full(ds: DumpSet, ranks: Iterable[int], cap: int = DEFAULT_FILE_CAP, workers: int = 2) -> None:
    """Re-read some ranks with their whole history (after a tail-only read)."""
    work = sorted((r, ds.files[r]) for r in set(ranks) if r in ds.files)
    for r, _ in work:
        ds.traces.pop(r, None)
    ds.problems = [p for p in ds.problems if p.rank not in {r for r, _ in work}]
    _load_into(ds, work, cap, None, workers, None)


def _load_into(ds: DumpSet, work: list[tuple[int, list[DumpFile]]], cap: int, tail_entries: int | None, workers: int,
               deadline: float | None, meanwhile: Callable[[], None] | None = None) -> None:
    """Load ``work`` into ``ds``; ``meanwhile`` runs in this process while the workers load."""
    if workers > 1 and len(work) >= PARALLEL_MIN_FILES and "fork" in multiprocessing.get_all_start_methods():
        # Small chunks even out slow files and the end, where one worker finishes its last chunk
        # alone: at 32,768 ranks 16 chunks left ~1 s of one idle core. Each chunk also sends back
        # the member lists it saw (the world's, 32,768 ranks), so not smaller than CHUNK_RANKS.
        n_chunks = max(workers * 8, len(work) // CHUNK_RANKS)
        size = max(1, (len(work) + n_chunks - 1) // n_chunks)
        chunks = [(ds.root, work[i : i + size], cap, tail_entries, deadline) for i in range(0, len(work), size)]
        ctx = multiprocessing.get_context("fork")
        with paused_gc(), ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
            pending = pool.map(_load_chunk_wire, chunks)  # submitted (and the workers forked) now
            if meanwhile is not None:
                meanwhile()
            results = [([from_wire(w) for w in traces], *rest) for traces, *rest in pending]
    else:
        if meanwhile is not None:
            meanwhile()
        if not work:
            return
        results = [_load_chunk((ds.root, work, cap, tail_entries, deadline))]
    for traces, sigs, members, problems in results:
        for tr in traces:
            ds.traces[tr.rank] = tr
        for sid, sig in sigs.items():
            ds.sigs.setdefault(sid, sig)
        ds.members.update(members)
        ds.problems.extend(problems)


def load_entry(ds: DumpSet, rank: int, pg: str, seq: int | None = None) -> dict[str, Any] | None:
    """The full entry of ``rank`` for collective ``seq`` on ``pg`` (newest on pg if seq is None).

    Used for the few entries a verdict shows (stacks, exact sizes): reads that
    rank's dump again rather than keeping every entry of every rank in memory.
    """
    tr = ds.traces.get(rank)
    files = ds.files.get(rank) or []
    if tr is not None:
        files = sorted(files, key=lambda f: f.rel != tr.path)
    modes = [ds.tail_entries, None] if ds.tail_entries is not None else [None]
    for f, mode in ((f, m) for f in files for m in modes):
        try:
            data = _read_plain(ds.root, f, DEFAULT_FILE_CAP, mode).data
        except DumpError:
            continue
        entries = data.get("entries") if isinstance(data, dict) else None
        if not isinstance(entries, list):
            continue
        best = None
        for e in entries:
            if type(e) is not dict or e.get("is_p2p") is True:
                continue
            g = e.get("process_group")
            if not isinstance(g, (list, tuple)) or len(g) != 2 or g[0] != pg:
                continue
            if seq is None or e.get("collective_seq_id") == seq:
                best = e
        if best is not None:
            return best
    return None
