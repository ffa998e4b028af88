"""The Flight Recorder data slurm-attr keeps, after a dump has been read and checked.

A dump is hostile input (DESIGN.md §5): the loader turns it into these plain,
validated records and nothing downstream ever sees the raw pickle objects.
One ``RankTrace`` per rank holds, per process group, a ``Stream``: the
collective signatures indexed by ``collective_seq_id`` (the only safe way to
align ranks; ``record_id`` is a per-process counter). Signatures are interned
as 64-bit ids so that thousands of ranks compare as integer arrays.
"""
from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from ..errors import SattrError

# Ops whose per-rank sizes legitimately differ (as torch's own matcher knows):
# all_to_all splits are per-rank; scatter inputs and gather outputs live on the root only.
_FREE_INPUT_SIZES = frozenset({"all_to_all", "alltoall", "alltoall_base", "all_to_all_single", "scatter"})
_FREE_OUTPUT_SIZES = frozenset({"all_to_all", "alltoall", "alltoall_base", "all_to_all_single", "gather"})


class DumpError(SattrError):
    """A Flight Recorder dump cannot be used: unreadable, not a dump, or refused as unsafe.

    ``status`` is the coverage status it becomes: ``error``, or ``truncated`` for a
    file larger than the cap.
    """

    def __init__(self, message: str, status: str = "error"):
        super().__init__(message)
        self.status = status


class Sig(NamedTuple):
    """What must agree across the members of a group for one collective."""

    profiling_name: str
    input_sizes: tuple[tuple[int, ...], ...]
    output_sizes: tuple[tuple[int, ...], ...]
    input_dtypes: tuple[str, ...]
    output_dtypes: tuple[str, ...]

    @property
    def op(self) -> str:
        """``all_reduce`` from ``nccl:all_reduce`` (P2P names keep their peers: ``send 0->1``)."""
        return self.profiling_name.split(":", 1)[-1]

    @property
    def backend(self) -> str:
        return self.profiling_name.split(":", 1)[0] if ":" in self.profiling_name else ""

    def compare_key(self) -> "Sig":
        """The signature with the sizes that may legitimately differ per rank blanked out."""
        op = self.op
        ins = () if op in _FREE_INPUT_SIZES else self.input_sizes
        outs = () if op in _FREE_OUTPUT_SIZES else self.output_sizes
        if ins is self.input_sizes and outs is self.output_sizes:
            return self
        return Sig(self.profiling_name, ins, outs, self.input_dtypes, self.output_dtypes)

    def sizes_text(self) -> str:
        if not self.input_sizes and self.op in _FREE_INPUT_SIZES:
            return "[sizes per rank]"
        ins = ", ".join("x".join(map(str, s)) or "scalar" for s in self.input_sizes) or "-"
        return f"[{ins}]"

    def dtypes_text(self) -> str:
        return ",".join(dict.fromkeys(self.input_dtypes + self.output_dtypes)) or "-"

    def describe(self) -> str:
        """``all_reduce [1024] Float`` (output sizes only when they differ from the input)."""
        text = f"{self.op} {self.sizes_text()}"
        if self.output_sizes and self.output_sizes != self.input_sizes:
            outs = ", ".join("x".join(map(str, s)) or "scalar" for s in self.output_sizes)
            text += f"->[{outs}]"
        return f"{text} {self.dtypes_text()}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "profiling_name": self.profiling_name,
            "op": self.op,
            "input_sizes": [list(s) for s in self.input_sizes],
            "output_sizes": [list(s) for s in self.output_sizes],
            "input_dtypes": list(self.input_dtypes),
            "output_dtypes": list(self.output_dtypes),
        }


# Sentinel sig id for "no entry at this sequence number" inside a Stream.
NO_SIG = 0


@dataclass
class Stream:
    """One rank's collectives on one process group, indexed by ``collective_seq_id``.

    ``sigs[i]`` is the interned signature id of sequence number ``lo + i`` (NO_SIG
    where the dump has no entry), ``pos[i]`` its position in the rank's dump
    (program order on that rank), ``times[i]`` its ``time_created_ns``,
    ``pending[i]`` 1 when the entry was not known to have completed (state not
    ``completed`` and not retired) and ``completed[i]`` 1 when its state says
    ``completed`` (NCCL saw it finish; Gloo never says so).
    """

    lo: int
    sigs: array = field(default_factory=lambda: array("q"))
    pos: array = field(default_factory=lambda: array("l"))
    times: array = field(default_factory=lambda: array("q"))
    pending: bytearray = field(default_factory=bytearray)
    completed: bytearray = field(default_factory=bytearray)

    @property
    def hi(self) -> int:
        return self.lo + len(self.sigs) - 1

    def sig(self, seq: int) -> int:
        i = seq - self.lo
        if 0 <= i < len(self.sigs):
            return self.sigs[i]
        return NO_SIG

    def index(self, seq: int) -> int | None:
        i = seq - self.lo
        if 0 <= i < len(self.sigs) and self.sigs[i] != NO_SIG:
            return i
        return None


@dataclass
class P2PStream:
    """Point-to-point ops of one group on one rank, by ``p2p_seq_id`` (shown, not voted on)."""

    lo: int
    sigs: array = field(default_factory=lambda: array("q"))


@dataclass
class PgStatus:
    last_enqueued: int
    last_completed: int


@dataclass
class RankTrace:
    """Everything kept from one rank's dump."""

    rank: int
    path: str  # relative to the bundle (or directory) root
    node: str | None = None
    fmt: str = "pickle"  # pickle | json
    version: str = ""
    n_entries: int = 0
    bad_entries: int = 0
    # Only the newest entries were read (large dumps): older history was not compared.
    history_truncated: bool = False
    # pg name -> (desc, members key or None when the ranks string was unusable)
    pg_config: dict[str, tuple[str, str | None]] = field(default_factory=dict)
    pg_config_broken: bool = False
    # ranks named by a broken pg_config entry: real ranks of some group, unknown which
    stray_ranks: str | None = None
    bad_pg_config: list[str] = field(default_factory=list)  # groups whose ranks were not a rank list
    # pg name -> status, mapped from the process-local pg_id
    pg_status: dict[str, PgStatus] = field(default_factory=dict)
    # process-local pg_id -> status, for ids no entry of this rank names
    unmapped_status: dict[int, PgStatus] = field(default_factory=dict)
    pg_ids: dict[int, str] = field(default_factory=dict)
    descs: dict[str, str] = field(default_factory=dict)  # pg name -> desc seen in entries
    streams: dict[str, Stream] = field(default_factory=dict)
    p2p: dict[str, P2PStream] = field(default_factory=dict)
    # (pg name, seq) of the newest collective entry in the dump, None if no entries
    newest: tuple[str, int] | None = None


@dataclass
class DumpProblem:
    """A dump file that could not be used (becomes a Coverage entry)."""

    path: str
    node: str | None
    rank: int | None
    status: str  # error | truncated
    detail: str
