"""Reading Flight Recorder pickles without executing anything, and without reading all of them.

Dumps are written by torch's C++ Pickler (protocol 2, plain dicts, lists, tuples,
strings, ints, bools, None, floats). A job can write anything there, so:

- ``find_class`` and ``persistent_load`` always raise. Every path from a pickle
  to an import or a call (GLOBAL, STACK_GLOBAL, INST, OBJ, then REDUCE/BUILD/
  NEWOBJ) needs one of them, so nothing callable is ever produced.
- EXT1/2/4 skip ``find_class`` when the process-wide extension cache already
  holds the object (research/flight-recorder.md §3). The registry is empty by
  default; if anything in this process registered an extension, every dump is
  scanned for EXT opcodes first and refused if it has one.
- Memory and CPU: the caller caps the bytes; huge length fields fail as
  truncated data or MemoryError; the result is only walked along the known
  schema (trace.py), never recursively.

Speed: the C unpickler builds ~35 objects per entry (~4 µs), which is too slow
for 4096 ranks x 2000 entries on two cores. ``load`` can therefore read only
the head of a dump (header and the first entries, which define the memo:
strings and shared stack frames) and its newest ``tail_entries`` entries, and
stitch them into one stream for the same restricted unpickler. If the tail
refers to a memo slot defined in the skipped middle, or the cut lands on
something that is not an entry, the unpickler fails and the whole dump is
loaded instead: the shortcut can fall back, never mislead.
"""
from __future__ import annotations

import copyreg
import io
import pickle
import pickletools
import re
from dataclasses import dataclass
from typing import Any, Callable

from .types import DumpError

PROTO2 = b"\x80\x02"
_ENTRIES_KEY = b"X\x07\x00\x00\x00entries"
# Re-open the top-level dict and its 'entries' list in front of a tail cut.
_TAIL_PREFIX = PROTO2 + b"}(" + _ENTRIES_KEY + b"]("
HEAD_BYTES = 16 << 10  # first read; grown up to HEAD_MAX until HEAD_ENTRIES entries are in it
HEAD_MAX = 1 << 20
HEAD_ENTRIES = 16
_EXT_OPS = frozenset({"EXT1", "EXT2", "EXT4"})
# The head length the last dump read in this process needed (see _read_head); only a size guess.
_HEAD_HINT = [HEAD_BYTES]
# The entries key's length byte, and how many of them _find_key checks before a plain search.
_KEY_BYTE = _ENTRIES_KEY[1:2]
_KEY_PROBES = 64


class _Restricted(pickle.Unpickler):
    """An unpickler that can build only plain data."""

    def find_class(self, module: str, name: str) -> Any:  # noqa: D401 - pickle hook
        raise DumpError(f"refused: the dump asks for the global {module[:64]}.{name[:64]}")

    def persistent_load(self, pid: Any) -> Any:
        raise DumpError("refused: the dump uses a persistent id")


def extensions_registered() -> bool:
    """True when some code in this process registered a copyreg extension (EXT caveat)."""
    return bool(copyreg._inverted_registry) or bool(copyreg._extension_cache)  # type: ignore[attr-defined]


def _refuse_ext(data: bytes) -> None:
    try:
        for op, _arg, _pos in pickletools.genops(data):
            if op.name in _EXT_OPS:
                raise DumpError("refused: the dump uses a pickle extension code")
    except DumpError:
        raise
    except Exception as err:  # genops raises ValueError and friends on junk
        raise DumpError(f"not a pickle: {err}") from err


def _stream_load(stream: bytes, count: int) -> list[Any]:
    """Run the restricted unpickler ``count`` times over one stream (memo shared)."""
    u = _Restricted(io.BufferedReader(io.BytesIO(stream)))  # 4x faster than a bare BytesIO
    out = []
    try:
        for _ in range(count):
            out.append(u.load())
    except DumpError:
        raise
    except RecursionError as err:
        raise DumpError("not a usable pickle: nested too deeply") from err
    except MemoryError as err:
        raise DumpError("not a usable pickle: a length field asks for more memory than the cap") from err
    except Exception as err:  # UnpicklingError, EOFError, ValueError, KeyError, TypeError, ...
        raise DumpError(f"not a usable pickle: {type(err).__name__}: {str(err)[:200]}") from err
    return out


def loads(data: bytes) -> Any:
    """Unpickle a whole dump with the restricted unpickler."""
    if not data.startswith(b"\x80"):
        raise DumpError("not a pickle (no PROTO opcode)")
    if extensions_registered():
        _refuse_ext(data)
    return _stream_load(data, 1)[0]


@dataclass
class Loaded:
    """A dump as plain data. ``history_truncated``: only head and tail entries were read."""

    data: Any
    history_truncated: bool = False
    head_entries: list[Any] | None = None  # entries before the skipped middle (tail mode)
    bytes_read: int = 0
    fmt: str = "pickle"  # pickle | json


_PUT = rb"(?:q[\x00-\xff]|r[\x00-\xff]{4})?"  # an optional BINPUT / LONG_BINPUT after a container opcode


def _memo_ref(data: bytes, at: int) -> tuple[bytes, int] | None:
    """The BINGET bytes for a BINPUT/LONG_BINPUT at ``at`` and the position after it."""
    if data[at : at + 1] == b"q" and len(data) > at + 1:
        return b"h" + data[at + 1 : at + 2], at + 2
    if data[at : at + 1] == b"r" and len(data) > at + 4:
        idx = int.from_bytes(data[at + 1 : at + 5], "little")
        ref = b"h" + bytes([idx]) if idx < 256 else b"j" + data[at + 1 : at + 5]
        return ref, at + 5
    return None


def _find_key(head: bytes, start: int) -> int:
    """``head.find(_ENTRIES_KEY, start)``, ~20x faster on a big header (80 -> 4 µs at 32,768 ranks).

    The header is mostly rank lists as text, whose digits defeat bytes.find's skip table
    (half the key's letters share its hash bits), so it crawls through ~250 KB per dump at
    32,768 ranks. The key's length byte 0x07 is rare there: memchr jumps between its few
    occurrences. After _KEY_PROBES of them (a header full of 0x07) the plain search takes
    over from the last one, so the answer and the worst case are bytes.find's.
    """
    pos = start + 1  # the length byte sits one after where the key starts
    for _ in range(_KEY_PROBES):
        i = head.find(_KEY_BYTE, pos)
        if i < 0:
            return -1
        if head.startswith(_ENTRIES_KEY, i - 1):
            return i - 1
        pos = i + 1
    return head.find(_ENTRIES_KEY, pos - 1)


def _skip_put(data: bytes, at: int) -> int:
    ref = _memo_ref(data, at)
    return ref[1] if ref is not None else at


def _entry_marker(head: bytes, start: int = 0) -> tuple[re.Pattern[bytes], int] | None:
    """(pattern of the bytes that open every entry dict, offset of the first entry) from a dump's head.

    torch's C++ Pickler writes each entry as EMPTY_DICT MARK, then its first key:
    as BINUNICODE plus a PUT in the first entry, as a BINGET of that memo slot in
    all others. A dump that went through Python's pickler (re-written fixtures,
    the shared workload) also memoises every container: a PUT whose index differs
    per entry follows EMPTY_DICT and EMPTY_LIST. The pattern accepts either.
    ``start``: where to look for the entries key (a caller that already searched the bytes
    before it need not scan a 250 KB pg_config again).
    """
    i = _find_key(head, start)
    if i < 0:
        return None
    j = _skip_put(head, i + len(_ENTRIES_KEY))
    if head[j : j + 1] != b"]":
        return None
    j = _skip_put(head, j + 1)
    if head[j : j + 1] != b"(":
        return None
    first = j + 1
    if head[first : first + 1] != b"}":
        return None
    k = _skip_put(head, first + 1)
    if head[k : k + 1] != b"(":
        return None
    k += 1
    if head[k : k + 1] == b"X" and len(head) > k + 5:
        n = int.from_bytes(head[k + 1 : k + 5], "little")
        put = _memo_ref(head, k + 5 + n)
        if put is None:
            return None
        key = put[0]
    elif head[k : k + 1] == b"h":
        key = head[k : k + 2]
    elif head[k : k + 1] == b"j":
        key = head[k : k + 5]
    else:
        return None
    if len(key) < 2:
        return None
    return re.compile(rb"\}" + _PUT + rb"\(" + re.escape(key)), first


def load(pread: Callable[[int, int], bytes], size: int, cap: int, tail_entries: int | None) -> Loaded:
    """Load a dump through ``pread(offset, n)``; with ``tail_entries``, read only head and tail.

    Raises DumpError for anything that is not a usable, safe dump, and for a file
    over ``cap`` bytes that cannot be read in tail mode.
    """
    if tail_entries is not None and not extensions_registered() and size > 8 * HEAD_BYTES:
        got = _load_tail(pread, size, tail_entries, cap)
        if got is not None:
            return got
    if size > cap:
        raise DumpError(f"{size} bytes, more than the {cap}-byte cap", status="truncated")
    data = pread(0, size)
    return Loaded(data=loads(data), bytes_read=len(data))


def _read_head(pread: Callable[[int, int], bytes], size: int, cap: int) -> tuple[bytes, tuple[re.Pattern[bytes], int] | None, list[int]]:
    """(head bytes, entry marker, entry starts in the head): the header and the first HEAD_ENTRIES
    entries, read once. The header's size varies with the job (pg_config lists every group's
    ranks as text: ~250 KB at 32,768 ranks), so the first read is as long as the last dump's
    head needed (``_HEAD_HINT``, this process's dumps are one job's) and only the missing bytes
    are read after it, never the start again. Always bounded by HEAD_MAX, cap and size.
    """
    limit = min(HEAD_MAX, cap, size)
    want = min(max(HEAD_BYTES, _HEAD_HINT[0]), limit)
    head = pread(0, want)
    searched = 0  # the entries key is not in head[:searched]
    found: tuple[re.Pattern[bytes], int] | None = None
    starts: list[int] = []
    while True:
        if not head.startswith(PROTO2):
            return head, None, []
        if found is None:
            # The first occurrence, as a search from 0 would find it: none lies before ``searched``.
            i = _find_key(head, searched)
            if i < 0:
                searched = max(0, len(head) - len(_ENTRIES_KEY) + 1)  # it may straddle the read's end
            else:
                searched = i
                found = _entry_marker(head, i)
        if found is not None:
            marker, first = found
            starts = [first]
            for m in marker.finditer(head, first + 2):
                starts.append(m.start())
                if len(starts) > HEAD_ENTRIES:
                    break
        if len(starts) > HEAD_ENTRIES or len(head) < want or want >= limit:
            break
        want = min(want * 4, limit)  # big pg_config or deep stacks
        more = pread(len(head), want - len(head))
        if not more:
            break
        head += more
    if len(starts) > HEAD_ENTRIES:
        # What this dump needed, with room for a neighbour's slightly longer header.
        _HEAD_HINT[0] = min(HEAD_MAX, starts[-1] + starts[-1] // 4 + 4096)
    return head, found, starts


def _load_tail(pread: Callable[[int, int], bytes], size: int, tail_entries: int, cap: int) -> Loaded | None:
    """Head + newest entries, or None when the dump does not lend itself (then load it whole)."""
    head, found, starts = _read_head(pread, size, cap)
    if found is None or len(starts) < 3:
        return None
    marker, first = found
    head_cut = starts[-1]
    # Entry size from the later head entries: the first ones also define the memo (frames).
    mid = len(starts) // 2
    avg = max(1.0, (head_cut - starts[mid]) / (len(starts) - 1 - mid))
    if (size - first) / avg <= 2 * tail_entries + len(starts):
        return None  # small enough: the whole dump is cheaper than being clever
    want = int(avg * tail_entries * 1.3) + 4096
    if head_cut + want > cap:  # the stream unpickled; a hint may have read a little more head
        return None
    t0 = max(head_cut, size - want)
    tail = pread(t0, size - t0)
    # Entry starts from the end; a marker-like byte run inside a string only costs a retry.
    cands = [m.start() for m in marker.finditer(tail)][-tail_entries:][::-1]
    if not cands:
        return None
    head_part = memoryview(head)[:head_cut]  # one copy into the stream, not one per +
    for k in (cands[-1], *cands[-2:-5:-1]):
        stream = b"".join((head_part, b"eu.", _TAIL_PREFIX, memoryview(tail)[k:]))
        try:
            top, rest = _stream_load(stream, 2)
        except DumpError as err:
            if "Memo value not found" in str(err):
                return None  # the tail needs strings or frames first seen in the middle
            continue
        if not (isinstance(top, dict) and isinstance(rest, dict)):
            continue
        head_list, tail_list = top.get("entries"), rest.get("entries")
        if not (isinstance(head_list, list) and isinstance(tail_list, list) and tail_list):
            continue
        for key, value in rest.items():
            if key != "entries":
                top.setdefault(key, value)
        top["entries"] = tail_list
        return Loaded(data=top, history_truncated=True, head_entries=head_list, bytes_read=len(head) + len(tail))
    return None
