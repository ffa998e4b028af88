"""The evidence bundle (DESIGN.md §3): one directory per job attempt.

Layout (every file optional but job.json's ``job_id``)::

    job.json                   scheduler facts
    scheduler/*.log            controller/slurmd lines about the job
    output/stdout, stderr      tails of the job's output
    nodes/<node>/kernel.log    kernel messages of the job's window
    nodes/<node>/fr/           Flight Recorder dumps
    nodes/<node>/probe/        native probe files
    nodes/<node>/nccl/         NCCL debug files
    nodes/<node>/collect.json  what the node collector did

Reading goes through safefs: a bundle is built from job-written files and is
re-analysed anywhere, so it is hostile input too.
"""
from __future__ import annotations

import os
import re
from typing import Any, Iterator

import msgspec

from . import jsonshape, safefs
from .bundleshape import MAX_ATTRIBUTED, Attributed, CollectDoc, JobDoc
from .errors import BundleError, UnsafePath
from .model import Coverage

JOB_JSON_CAP = 1 << 20
COLLECT_JSON_CAP = 1 << 20
# Lines longer than this are cut: a 1 MB line of base64 must not make every regex slow.
MAX_LINE = 16 << 10

NODE_KINDS = ("fr", "probe", "nccl")
# Kernel lines an earlier job already owns (collect/ledger.py), beside kernel.log.
ATTRIBUTED_KERNEL_LOG = "kernel.attributed.log"
_NODE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def parse_ranks(raw: Any) -> dict[int, str]:
    """job.json's ``ranks`` ({"0": "n1", ...}) as {0: "n1"}, ignoring malformed entries."""
    out: dict[int, str] = {}
    if isinstance(raw, dict):  # also the merged job dict in memory (verdict.py), whose keys may be ints
        for k, v in raw.items():
            try:
                out[int(k)] = str(v)
            except (TypeError, ValueError):
                continue
    return out


def valid_node_name(name: str) -> bool:
    return bool(_NODE_NAME.match(name))


class Bundle:
    """Read-only access to one bundle directory."""

    def __init__(self, root: str):
        self.root = os.path.abspath(root)
        try:
            fd = safefs.open_dir(self.root)
        except UnsafePath as err:
            raise BundleError(f"cannot open bundle {root}: {err}") from err
        os.close(fd)
        self.coverage: list[Coverage] = []
        self._ranks: dict[int, str] | None = None
        self.job: dict[str, Any] = self._load_job()

    # -- job.json -----------------------------------------------------------------
    def _load_job(self) -> dict[str, Any]:
        try:
            data: dict[str, Any] = jsonshape.strict(self.read_json("job.json", JOB_JSON_CAP, source="job"),
                                                    dict[str, Any])
        except jsonshape.ValidationError:  # not an object (or none): as if there were no job.json
            data = {}
        if "job_id" not in data:
            # A bundle without job.json is still analysable; name it after its directory.
            data["job_id"] = os.path.basename(self.root.rstrip("/")) or "unknown"
        data["job_id"] = str(data["job_id"])
        return data

    @property
    def job_id(self) -> str:
        return self.job["job_id"]

    def ranks(self) -> dict[int, str]:
        """Global rank -> node name: job.json's ``ranks``, else the rank maps the node
        collectors recorded (the step with the most ranks: the training step)."""
        if self._ranks is None:
            self._ranks = self._job_ranks() or self._collected_ranks()
        return self._ranks

    def _collected_ranks(self) -> dict[int, str]:
        per_step: dict[str, dict[int, str]] = {}
        for node in self.nodes():
            rel = f"nodes/{node}/collect.json"
            if not self.exists(rel):
                continue
            for step, ranks in self._collect(node).ranks.items():
                for r in ranks:
                    per_step.setdefault(step, {})[r] = node
        if not per_step:
            return {}
        best = max(per_step, key=lambda s: (len(per_step[s]), int(s) if s.isdigit() else -1))
        return per_step[best]

    def _job_ranks(self) -> dict[int, str]:
        return parse_ranks(self.job.get("ranks"))

    def node_of_rank(self, rank: int | None) -> str | None:
        if rank is None:
            return None
        return self.ranks().get(rank)

    # -- files ----------------------------------------------------------------------
    def exists(self, relpath: str) -> bool:
        try:
            os.close(safefs.open_file(self.root, relpath))
            return True
        except UnsafePath:
            return False

    def read(self, relpath: str, cap: int, tail: bool = False) -> safefs.ReadResult:
        """Bounded read of a regular file in the bundle; raises UnsafePath."""
        return safefs.read_file(self.root, relpath, cap, tail=tail)

    def read_json(self, relpath: str, cap: int, source: str, node: str | None = None) -> Any:
        """Parse a small JSON file; on any problem add coverage and return None."""
        try:
            res = self.read(relpath, cap)
        except UnsafePath as err:
            status = "missing" if "No such file" in str(err) else "error"
            self.coverage.append(Coverage(source=source, node=node, status=status, detail=str(err)))
            return None
        if res.truncated:
            self.coverage.append(Coverage(source=source, node=node, status="error", detail=f"{relpath} larger than {cap} bytes"))
            return None
        try:
            return msgspec.json.decode(res.data.decode("utf-8", errors="replace"))
        except (msgspec.DecodeError, RecursionError) as err:  # a number out of range is a DecodeError too
            self.coverage.append(Coverage(source=source, node=node, status="error", detail=f"{relpath}: bad JSON: {err}"))
            return None

    def lines(self, relpath: str, cap: int, tail: bool = True) -> Iterator[tuple[int, str]]:
        """(1-based line number, text) of a text file, bounded; long lines are cut.

        With ``tail`` the last ``cap`` bytes are read and the first, partial line
        dropped; line numbers then count from the start of what was read.
        """
        res = self.read(relpath, cap, tail=tail)
        data = res.data
        if tail and res.truncated:
            nl = data.find(b"\n")
            data = data[nl + 1 :] if nl >= 0 else b""
        for i, raw in enumerate(data.split(b"\n"), 1):
            if len(raw) > MAX_LINE:
                raw = raw[:MAX_LINE]
            yield i, safefs.decode(raw).rstrip("\r")

    def nodes(self) -> list[str]:
        """Node names: those with a part under nodes/, plus those job.json names."""
        names: set[str] = set()
        try:
            for name, kind in safefs.list_dir(self.root, "nodes"):
                if kind == "dir" and valid_node_name(name):
                    names.add(name)
        except UnsafePath:
            pass
        for n in self._job_doc().nodes:
            if valid_node_name(n):
                names.add(n)
        return sorted(names)

    def node_files(self, node: str, kind: str) -> list[str]:
        """Relative paths of regular files under nodes/<node>/<kind>/ (no symlinks)."""
        if not valid_node_name(node):
            return []
        return sorted(safefs.walk_files(self.root, f"nodes/{node}/{kind}"))

    def files(self, relpath: str) -> list[str]:
        return sorted(safefs.walk_files(self.root, relpath))

    # -- coverage recorded by the collectors ---------------------------------------------
    def collector_coverage(self) -> list[Coverage]:
        """Coverage from each node's collect.json; a node with no part is 'missing'."""
        out: list[Coverage] = []
        for node in self.nodes():
            rel = f"nodes/{node}/collect.json"
            if not self.exists(rel):
                out.append(Coverage(source="node", node=node, status="missing", detail="no collect.json: the node epilog did not finish or did not run"))
                continue
            for src, info in sorted(self._collect(node).sources.items()):
                status = info.status if info.status in ("ok", "missing", "error", "truncated") else "error"
                out.append(Coverage(source=src, node=node, status=status, detail=str(info.detail)[:500]))
        return out

    # -- provenance and attribution (issue 10) --------------------------------------------
    def collect_doc(self, node: str) -> dict[str, Any]:
        """A node's collect.json (empty when missing or bad; coverage records why)."""
        if not valid_node_name(node):
            return {}
        rel = f"nodes/{node}/collect.json"
        if not self.exists(rel):
            return {}
        try:
            return jsonshape.strict(self.read_json(rel, COLLECT_JSON_CAP, source="node", node=node), dict[str, Any])
        except jsonshape.ValidationError:  # not an object
            return {}

    def _collect(self, node: str) -> CollectDoc:
        """A node's collect.json as its shape (bundleshape); empty when missing or bad."""
        return jsonshape.lenient(self.collect_doc(node), CollectDoc)

    def _job_doc(self) -> JobDoc:
        # self.job, not job.json: the analysis merges the controller's facts into it
        return jsonshape.lenient(self.job, JobDoc)

    def attributed_lines(self, node: str) -> dict[int, str]:
        """{line number in nodes/<node>/kernel.attributed.log: the job it was attributed to}.

        Trusted kernel lines that an earlier job already turned into a verdict or drain
        (node ledger): context for this job, never its root, never a second drain."""
        out: dict[int, str] = {}
        for rec in (self._collect(node).attributed or Attributed()).lines[:MAX_ATTRIBUTED]:
            if rec.line is not None and rec.job_id is not None:
                out[rec.line] = rec.job_id
        return out

    def attributed_keys(self) -> dict[str, str]:
        """{ledger line key: owning job} over every node (see collect/kernel.line_key)."""
        cached = self.__dict__.get("_attributed_keys")
        if cached is not None:  # asked once per trusted symptom: 2,000 of them cost 0.3 s uncached
            return cached
        out: dict[str, str] = {}
        for node in self.nodes():
            for rec in (self._collect(node).attributed or Attributed()).lines[:MAX_ATTRIBUTED]:
                if rec.key is not None and rec.job_id is not None:
                    out[rec.key] = rec.job_id
        self.__dict__["_attributed_keys"] = out
        return out

    def already_attributed(self, symptom: Any) -> str | None:
        """The earlier job a symptom's kernel line was already attributed to, or None.

        For the verdict: such a symptom is context (never root, never a drain) and counts
        once in recurrence."""
        keys: dict[str, str] | None = None
        for e in getattr(symptom, "evidence", None) or []:
            if getattr(e, "attributed_to", None):
                return str(e.attributed_to)
            path = e.path or ""
            parts = path.split("/")
            if len(parts) == 3 and parts[0] == "nodes" and parts[2] == ATTRIBUTED_KERNEL_LOG and e.line:
                owner = self.attributed_lines(parts[1]).get(int(e.line))
                if owner:
                    return owner
            if e.source == "kernel" and symptom.node and e.text:
                if keys is None:
                    keys = self.attributed_keys()
                if not keys:
                    continue  # no ledger lines at all: no line key to compute (nor its import, per line)
                from .collect.kernel import line_key

                owner = keys.get(line_key(symptom.node, e.text))
                if owner:
                    return owner
        return None

    def provenance(self) -> dict[str, Any]:
        """Who wrote each source: job.json's (controller side) and each node's collect.json."""
        out: dict[str, Any] = {}
        out.update(self._job_doc().provenance or {})
        for node in self.nodes():
            out.update(self._collect(node).provenance or {})
        return out
