"""Reading a dump's head once (safepickle._read_head).

At 32,768 ranks torch's pg_config holds the world's rank list as text (~250 KB), so the
header is many times HEAD_BYTES. The head is read in growing steps that each read only the
bytes after the previous one (never offset 0 again), starting at the size the previous dump
of this process needed. Each case checks the entries against a full restricted load, with a
near miss beside it: a dump that is cut, a hint that is wrong, a header that imitates the
entries key.
"""
from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from slurm_attr.flightrec import safepickle
from slurm_attr.flightrec.types import DumpError


@pytest.fixture(scope="module")
def big_world(gen_fr) -> tuple[dict, bytes]:
    """A 4,096-rank world's dump: a ~25 KB header (the world's rank list as text), 2,000 entries."""
    d = gen_fr.rank_dump(5, 4096, 2000, fault_rank=None)
    return d, gen_fr.TorchStylePickler().dump(d)


@pytest.fixture(autouse=True)
def fresh_hint():
    safepickle._HEAD_HINT[0] = safepickle.HEAD_BYTES
    yield
    safepickle._HEAD_HINT[0] = safepickle.HEAD_BYTES


class Reads:
    """pread over bytes, recording each (offset, length)."""

    def __init__(self, raw: bytes) -> None:
        self.raw, self.calls = raw, []

    def __call__(self, off: int, n: int) -> bytes:
        self.calls.append((off, n))
        return self.raw[off : off + n]


def _header_len(raw: bytes) -> int:
    return raw.find(safepickle._ENTRIES_KEY)


def test_a_big_header_is_read_once_and_the_tail_matches_a_full_load(big_world) -> None:
    d, raw = big_world
    assert _header_len(raw) > 16 * 1024 > safepickle.HEAD_BYTES - 1  # more than the first read
    reads = Reads(raw)
    got = safepickle.load(reads, len(raw), 1 << 30, 64)
    assert got.history_truncated is True
    assert got.data["entries"] == d["entries"][-64:]
    assert got.data["pg_config"] == d["pg_config"] and got.data["pg_status"] == d["pg_status"]
    assert got.head_entries == d["entries"][: len(got.head_entries)] and len(got.head_entries) == safepickle.HEAD_ENTRIES
    head_reads = [c for c in reads.calls if c[0] < _header_len(raw)]
    # each head read starts where the previous one ended: no byte of the head is read twice
    assert [c[0] for c in head_reads] == [0] + [sum(c[1] for c in head_reads[:i]) for i in range(1, len(head_reads))]
    assert len(head_reads) >= 2
    assert got.bytes_read < len(raw) // 2


def test_the_next_dump_starts_at_the_size_the_last_one_needed(big_world) -> None:
    d, raw = big_world
    safepickle.load(Reads(raw), len(raw), 1 << 30, 64)
    hint = safepickle._HEAD_HINT[0]
    assert _header_len(raw) < hint <= safepickle.HEAD_MAX
    again = Reads(raw)
    got = safepickle.load(again, len(raw), 1 << 30, 64)
    assert again.calls[0] == (0, hint) and sum(1 for c in again.calls if c[0] < hint) == 1  # one head read
    assert got.data["entries"] == d["entries"][-64:]


def test_a_hint_too_big_for_a_small_dump_is_bounded_and_still_right(gen_fr) -> None:
    # Near miss of the above: the last dump had a big header, this one a small one.
    d = gen_fr.rank_dump(3, 16, 2000, fault_rank=None)
    raw = gen_fr.TorchStylePickler().dump(d)
    safepickle._HEAD_HINT[0] = safepickle.HEAD_MAX
    reads = Reads(raw)
    got = safepickle.load(reads, len(raw), 1 << 30, 64)
    assert reads.calls[0] == (0, min(safepickle.HEAD_MAX, len(raw)))
    assert got.history_truncated is True and got.data["entries"] == d["entries"][-64:]
    # ... and a head read never goes past the cap: a file over it is still read by head and tail
    cap = len(raw) // 2
    safepickle._HEAD_HINT[0] = safepickle.HEAD_MAX
    capped = Reads(raw)
    got = safepickle.load(capped, len(raw), cap, 64)
    assert capped.calls[0] == (0, cap) and all(n <= cap for _off, n in capped.calls)
    assert got.history_truncated is True and got.data["entries"] == d["entries"][-64:]
    # near miss: a cap below the head it needs is a refusal, not a bigger read
    tiny = Reads(raw)
    with pytest.raises(DumpError):
        safepickle.load(tiny, len(raw), 2048, 64)
    assert all(n <= 2048 for _off, n in tiny.calls)


def test_the_entries_key_across_a_read_boundary_is_found(big_world) -> None:
    d, raw = big_world
    at = _header_len(raw)
    # the first read ends in the middle of the key: the search must look back by its length
    safepickle._HEAD_HINT[0] = at + 3
    got = safepickle.load(Reads(raw), len(raw), 1 << 30, 64)
    assert got.history_truncated is True and got.data["entries"] == d["entries"][-64:]


def test_a_dump_cut_inside_its_header_is_not_read_by_head_and_tail(big_world) -> None:
    # Near miss: the writer was killed while writing the header.
    _d, raw = big_world
    cut = raw[: _header_len(raw) - 100]
    with pytest.raises(DumpError):
        safepickle.load(Reads(cut), len(cut), 1 << 30, 64)


def test_a_header_string_imitating_the_entries_key_never_misleads(gen_fr) -> None:
    """Hostile: a group description carries the bytes that open the entries list and an entry.
    The result is what the restricted unpickler reads from the whole file, or a DumpError."""
    d = gen_fr.rank_dump(1, 16, 2000, fault_rank=None)
    fake = (safepickle._ENTRIES_KEY + b"](}(X\x06\x00\x00\x00framesq\x05").decode("latin-1")
    first = next(iter(d["pg_config"]))
    d["pg_config"][first]["desc"] = fake * 3
    raw = gen_fr.TorchStylePickler().dump(d)
    assert raw.find(safepickle._ENTRIES_KEY) < raw.rfind(safepickle._ENTRIES_KEY)  # the fake comes first
    try:
        got = safepickle.load(Reads(raw), len(raw), 1 << 30, 64)
    except DumpError:
        return
    want = pickle.loads(raw)
    assert got.data["pg_config"] == want["pg_config"]
    assert got.data["entries"] == (want["entries"][-len(got.data["entries"]):] if got.history_truncated else want["entries"])


def test_rank_lists_alternating_between_groups_parse_to_their_own_members() -> None:
    """trace._parse keeps a few recent texts (a dump's world, TP and DP groups alternate)."""
    from slurm_attr.flightrec import trace

    world = "[" + ", ".join(str(r) for r in range(64)) + "]"
    tp = "[8, 9, 10, 11, 12, 13, 14, 15]"
    same_len = "[8, 9, 10, 11, 12, 13, 14, 16]"  # near miss: same length, one rank differs
    assert len(tp) == len(same_len)
    for _ in range(3):
        assert trace.parse_ranks(world) == tuple(range(64))
        assert trace.parse_ranks(tp) == tuple(range(8, 16))
        assert trace.parse_ranks(same_len) == (8, 9, 10, 11, 12, 13, 14, 16)
        assert trace.parse_ranks("[1, 2, x]") is None  # never a cached neighbour's value
    assert len(trace._RECENT) <= trace._RECENT_MAX


def test_the_entries_key_search_finds_what_bytes_find_finds() -> None:
    """safepickle._find_key jumps between the key's length bytes; it must answer exactly as
    ``bytes.find`` does: the first key at or after ``start``, from any start, among many
    look-alikes (the length byte alone, a key cut short, more length bytes than it probes)."""
    import random

    key = safepickle._ENTRIES_KEY
    pieces = [b"\x07", b"X", b"\x00", b"entries", key, key[:5], key[:-1], b"1, 2, 3", b"X\x07\x00\x00\x00"]
    rng = random.Random(23)
    found = 0
    for _ in range(3000):
        head = b"".join(rng.choice(pieces) for _ in range(rng.randint(0, 120)))
        start = rng.randint(0, len(head) + 2)
        assert safepickle._find_key(head, start) == head.find(key, start)
        found += head.find(key, start) >= 0
    assert 300 < found < 2700  # both outcomes were tried
    many = b"\x07" * (4 * safepickle._KEY_PROBES) + b"[0, 1]" + key + b"\x07" + key
    assert safepickle._find_key(many, 0) == many.find(key) == 4 * safepickle._KEY_PROBES + 6
    assert safepickle._find_key(many, many.find(key) + 1) == many.rfind(key)  # near miss: past the first key
    assert safepickle._find_key(key[:-1] * 100, 0) == -1
