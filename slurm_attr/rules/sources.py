"""Running the catalog over an evidence bundle: which file is which source.

Every read is bounded (the tail of a file, at most the configured bytes) and
goes through safefs: a symlinked kernel.log, a FIFO or an unreadable file is a
coverage entry, never an exception. Job-written output is untrusted: its
symptoms can name ranks and nodes but never carry an action.
"""
from __future__ import annotations

from typing import Optional

from ..bundle import Bundle
from ..config import Config
from ..errors import UnsafePath
from ..model import Coverage, Symptom
from .catalog import Catalog, load_catalog
from . import parallel, wire
from .extract import extract_buffer, merge

SCHEDULER_CAP = 4 << 20  # per scheduler log file
SOFTWARE_CAP = 4096  # the node's software versions (collect/software.py)
MAX_SCHEDULER_FILES = 64
MAX_NCCL_FILES = 256


def _read(bundle: Bundle, catalog: Catalog, source: str, node: Optional[str], rel: str, cap: int,
          optional: bool = False) -> tuple[list[Symptom], list[Coverage]]:
    try:
        res = bundle.read(rel, cap, tail=True)
    except UnsafePath as err:
        missing = "No such file" in str(err)
        if missing and optional:
            return [], []
        return [], [Coverage(source=source, node=node, status="missing" if missing else "error", detail=str(err)[:300])]
    data = res.data
    cov = Coverage(source=source, node=node, status="ok", detail=f"{rel}: {len(data)} bytes")
    if res.truncated:
        nl = data.find(b"\n")
        data = data[nl + 1:] if nl >= 0 else b""  # the first line of a tail is partial
        cov = Coverage(source=source, node=node, status="truncated",
                       detail=f"{rel}: read the last {len(res.data)} of {res.size} bytes")
    try:
        found = extract_buffer(catalog, source, node, rel, data)
    except RecursionError as err:  # a pathological line must not stop the other files
        return [], [Coverage(source=source, node=node, status="error", detail=f"{rel}: {err}")]
    return found, [cov]


def _match_node(host: str, nodes: list[str]) -> Optional[str]:
    """The job node a host name in a log line means (FQDN or short name)."""
    if host in nodes:
        return host
    short = host.split(".")[0]
    for n in nodes:
        if n.split(".")[0] == short:
            return n
    return None


def _attribute(sym: Symptom, ranks: dict[int, str], nodes: list[str]) -> None:
    """Give job-output symptoms a node: from the rank's placement or the host in the line."""
    if sym.node is None and sym.rank is not None:
        sym.node = ranks.get(sym.rank)
    host = sym.fields.get("host")
    if sym.node is None and isinstance(host, str):
        sym.node = _match_node(host, nodes)
    elif sym.node is not None and sym.node not in nodes and nodes:
        sym.node = _match_node(sym.node, nodes) or sym.node


# One read-and-extract job: (source, node, bundle-relative path, byte cap, optional).
Task = tuple[str, Optional[str], str, int, bool]


def _tasks(bundle: Bundle, cfg: Config, nodes: list[str]) -> list[Task]:
    """Every file of the bundle the rules read, in the order their symptoms are reported."""
    tasks: list[Task] = [("kernel", n, f"nodes/{n}/kernel.log", cfg.collect.kernel_cap_bytes, False) for n in nodes]
    # Root system units' journal records (collect/journal.py), present only when the site names units.
    tasks += [("journal", n, f"nodes/{n}/journal.log", cfg.collect.kernel_cap_bytes, True) for n in nodes]
    # The NVIDIA kernel module's own version text (collect/software.py): the kernel's word too.
    tasks += [("kernel", n, f"nodes/{n}/software.log", SOFTWARE_CAP, True) for n in nodes]
    sched = [p for p in bundle.files("scheduler") if p.endswith(".log")][:MAX_SCHEDULER_FILES]
    tasks += [("scheduler", None, rel, SCHEDULER_CAP, False) for rel in sched]
    for name in ("stdout", "stderr"):
        # A job run with stderr merged into stdout has no stderr file: that loses nothing.
        tasks.append((name, None, f"output/{name}", cfg.collect.output_tail_bytes, name == "stderr"))
    for node in nodes:
        files = bundle.node_files(node, "nccl")[:MAX_NCCL_FILES]
        cap = max(cfg.collect.nccl_cap_bytes // max(len(files), 1), 64 << 10)
        tasks += [("nccl", node, rel, cap, False) for rel in files]
    return tasks


def analyze(bundle: Bundle, cfg: Config) -> tuple[list[Symptom], list[Coverage]]:
    """Symptoms and coverage of every source in the bundle, with the site's extra rules."""
    catalog = load_catalog(cfg.analysis.extra_rules or None)
    symptoms: list[Symptom] = []
    coverage: list[Coverage] = []
    nodes = bundle.nodes()
    ranks = bundle.ranks()
    tasks = _tasks(bundle, cfg, nodes)
    for found, cov in parallel.run(bundle, catalog, tasks, _read_task, codec=wire):
        symptoms.extend(found)
        coverage.extend(cov)
    for rule in catalog.job_rules:
        sym = rule.run(bundle.job)
        if sym is not None:
            symptoms.append(sym)
    for sym in symptoms:
        if not sym.trusted:
            _attribute(sym, ranks, nodes)
        elif sym.node is not None and nodes and sym.node not in nodes:
            # a daemon line or log file may say the short name of an FQDN node (or the reverse)
            sym.node = _match_node(sym.node, nodes) or sym.node
    return merge(symptoms), coverage


def _read_task(bundle: Bundle, catalog: Catalog, task: Task) -> tuple[list[Symptom], list[Coverage]]:
    source, node, rel, cap, optional = task
    return _read(bundle, catalog, source, node, rel, cap, optional=optional)
